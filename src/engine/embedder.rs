//! One interface for embeddings whatever the model: [`Embedder`] sends a prompt to the engine
//! thread (a decoder: `Request::embedding`, batched with whatever else runs) or to the
//! encoder's worker (bert, nomic-bert: `super::encoder`), and [`Embedding`] waits for its
//! pooled, not yet normalized, vectors. Callers: the server's embeddings routes, `edge-llm
//! embed` and `bench --embed`.

use super::encoder::{EncoderHandle, EncoderOutput, EncoderTicket};
use super::{EngineHandle, Event, Pooling, Request, RequestStream, SubmitError};
use crate::tokenizer::Tokenizer;

/// Where embeddings are computed.
#[derive(Clone)]
pub enum Embedder {
    Decoder(EngineHandle),
    Encoder(EncoderHandle),
}

/// One submitted input's embedding, to wait for.
pub enum Embedding {
    Decoder(RequestStream),
    Encoder {
        ticket: EncoderTicket,
        num_tokens: usize,
    },
}

/// Pooled vectors (`[1][n_embd]`, or every token's with pooling none) and the prompt's tokens.
pub type Vectors = (Vec<Vec<f32>>, usize);

impl Embedder {
    pub fn tokenizer(&self) -> &Tokenizer {
        match self {
            Embedder::Decoder(e) => e.tokenizer(),
            Embedder::Encoder(e) => e.tokenizer(),
        }
    }

    pub fn n_embd(&self) -> usize {
        match self {
            Embedder::Decoder(e) => e.model_config().n_embd,
            Embedder::Encoder(e) => e.config().n_embd,
        }
    }

    /// The most tokens one input may have.
    pub fn max_seq_len(&self) -> usize {
        match self {
            Embedder::Decoder(e) => e.max_seq_len(),
            Embedder::Encoder(e) => e.config().n_ctx_train,
        }
    }

    /// Submits one input; `cache_key` salts a decoder's prefix cache (an API key's).
    pub fn submit(
        &self,
        prompt: Vec<u32>,
        pooling: Pooling,
        cache_key: Option<u64>,
    ) -> Result<Embedding, SubmitError> {
        match self {
            Embedder::Decoder(e) => {
                let mut request = Request::embedding(prompt, pooling);
                request.cache_key = cache_key;
                Ok(Embedding::Decoder(e.submit(request)?))
            }
            Embedder::Encoder(e) => {
                let num_tokens = prompt.len();
                let ticket = e.embed(prompt, pooling)?;
                Ok(Embedding::Encoder { ticket, num_tokens })
            }
        }
    }
}

impl Embedding {
    /// The vectors, once computed; Err says why there are none.
    pub async fn wait(self) -> Result<Vectors, String> {
        match self {
            Embedding::Decoder(mut stream) => {
                let mut vectors = None;
                while let Some(event) = stream.next().await {
                    if let Some(done) = decoder_event(event, &mut vectors) {
                        return done;
                    }
                }
                Err("the engine ended the request early".into())
            }
            Embedding::Encoder { ticket, num_tokens } => vectors_of(
                ticket
                    .await
                    .map_err(|_| "the encoder stopped".to_string())?,
                num_tokens,
            ),
        }
    }

    /// [`Embedding::wait`], blocking the thread.
    pub fn wait_blocking(self) -> Result<Vectors, String> {
        match self {
            Embedding::Decoder(mut stream) => {
                let mut vectors = None;
                while let Some(event) = stream.next_blocking() {
                    if let Some(done) = decoder_event(event, &mut vectors) {
                        return done;
                    }
                }
                Err("the engine ended the request early".into())
            }
            Embedding::Encoder { ticket, num_tokens } => vectors_of(
                ticket
                    .blocking_recv()
                    .map_err(|_| "the encoder stopped".to_string())?,
                num_tokens,
            ),
        }
    }
}

/// Keeps a decoder request's vectors; Some once it is over.
fn decoder_event(
    event: Event,
    vectors: &mut Option<Vec<Vec<f32>>>,
) -> Option<Result<Vectors, String>> {
    match event {
        Event::Embedding { vectors: v } => {
            *vectors = Some(v);
            None
        }
        Event::Finished { usage, .. } => Some(
            vectors
                .take()
                .map(|v| (v, usage.prompt_tokens))
                .ok_or_else(|| "the engine sent no embedding".to_string()),
        ),
        Event::Error(e) => Some(Err(format!("embedding failed: {e}"))),
        Event::Prompt { .. } | Event::Token { .. } => None,
    }
}

fn vectors_of(out: Result<EncoderOutput, String>, num_tokens: usize) -> Result<Vectors, String> {
    match out? {
        EncoderOutput::Vectors(v) => Ok((v, num_tokens)),
        EncoderOutput::Score(_) => Err("the encoder answered a score".into()),
    }
}
