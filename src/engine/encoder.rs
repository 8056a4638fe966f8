//! The encoder's worker: one thread owns an [`Encoder`] (bert, nomic-bert; embeddings and
//! reranking only) and answers jobs from a queue, as the engine thread answers requests for a
//! decoder. Each wake-up takes every job queued and runs them side by side (one whole sequence
//! each; an encoder has no KV cache, so there is nothing to schedule), so a job's result never
//! depends on what else was queued. Callers: [`super::Embedder`] (embeddings for every face)
//! and the server's rerank route, through a cloneable [`EncoderHandle`].

use std::sync::{mpsc, Arc};

use rayon::prelude::*;
use tokio::sync::oneshot;

use super::SubmitError;
use crate::model::encoder::{Encoder, EncoderConfig};
use crate::model::pooling::Pooling;
use crate::tokenizer::Tokenizer;

/// What a job computes.
enum Work {
    /// The pooled vectors, not normalized (`[1][n_embd]`, or every token's with pooling none).
    Embed(Pooling),
    /// A reranker's score of a pair's tokens.
    Score,
}

/// What a job answers.
#[derive(Debug)]
pub enum EncoderOutput {
    Vectors(Vec<Vec<f32>>),
    Score(f32),
}

/// A job's answer, once the worker has run it.
pub type EncoderTicket = oneshot::Receiver<Result<EncoderOutput, String>>;

struct Job {
    tokens: Vec<u32>,
    work: Work,
    reply: oneshot::Sender<Result<EncoderOutput, String>>,
}

/// The client side of the encoder's worker; cheap to clone.
#[derive(Clone)]
pub struct EncoderHandle {
    tx: mpsc::Sender<Job>,
    encoder: Arc<Encoder>,
}

impl EncoderHandle {
    /// Starts the worker thread on `encoder`.
    pub fn start(encoder: Encoder) -> anyhow::Result<EncoderHandle> {
        let encoder = Arc::new(encoder);
        let (tx, rx) = mpsc::channel::<Job>();
        let owned = encoder.clone();
        std::thread::Builder::new()
            .name("edge-llm-encoder".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut jobs = vec![first];
                    jobs.extend(rx.try_iter());
                    jobs.into_par_iter().for_each(|job| run(&owned, job));
                }
            })?;
        Ok(EncoderHandle { tx, encoder })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.encoder.tokenizer
    }

    pub fn config(&self) -> &EncoderConfig {
        &self.encoder.config
    }

    /// The model (for [`Encoder::pair_tokens`]); its forward pass runs on the worker only.
    pub fn encoder(&self) -> &Encoder {
        &self.encoder
    }

    /// Whether the model is a reranker (it answers [`EncoderHandle::score`]).
    pub fn is_reranker(&self) -> bool {
        self.encoder.head.is_some()
    }

    /// Queues the embedding of `tokens` pooled by `pooling`.
    pub fn embed(&self, tokens: Vec<u32>, pooling: Pooling) -> Result<EncoderTicket, SubmitError> {
        self.submit(tokens, Work::Embed(pooling))
    }

    /// Queues the relevance score of a pair's tokens (a reranker only).
    pub fn score(&self, tokens: Vec<u32>) -> Result<EncoderTicket, SubmitError> {
        if !self.is_reranker() {
            return Err(SubmitError::Invalid("this model is not a reranker".into()));
        }
        self.submit(tokens, Work::Score)
    }

    fn submit(&self, tokens: Vec<u32>, work: Work) -> Result<EncoderTicket, SubmitError> {
        let max = self.encoder.config.n_ctx_train;
        if tokens.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        if tokens.len() > max {
            return Err(SubmitError::PromptTooLong {
                prompt: tokens.len(),
                max,
            });
        }
        let (reply, ticket) = oneshot::channel();
        self.tx
            .send(Job {
                tokens,
                work,
                reply,
            })
            .map_err(|_| SubmitError::Stopped)?;
        Ok(ticket)
    }
}

fn run(encoder: &Encoder, job: Job) {
    let n_embd = encoder.config.n_embd;
    let out = match job.work {
        Work::Embed(pooling) => encoder
            .embed(&job.tokens, pooling, -1)
            .map(|v| EncoderOutput::Vectors(v.chunks_exact(n_embd).map(<[f32]>::to_vec).collect())),
        Work::Score => encoder.score(&job.tokens).map(EncoderOutput::Score),
    };
    // The caller may have gone (its client hung up): nothing to answer then.
    let _ = job.reply.send(out.map_err(|e| format!("{e:#}")));
}
