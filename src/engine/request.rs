//! What goes into the engine and what comes out: a [`Request`], the [`Event`]s its stream
//! carries (tokens, finish with [`Usage`], errors), and why a request is refused
//! ([`SubmitError`]).

use super::sampler::SamplingParams;
use crate::model::Pooling;

/// One generation request.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// Most tokens to generate (the context may end it sooner); 0 evaluates the prompt and
    /// generates nothing: with `prompt_logprobs` to score it, or to warm the prefix cache
    /// (llama-server's `n_predict: 0`).
    pub max_tokens: usize,
    /// Completions to produce from the one prompt (copy-on-write forks after the prompt).
    pub n: usize,
    /// Strings that end generation; they are not part of the output.
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Report the sampled token's log-probability and this many top alternatives.
    pub logprobs: Option<usize>,
    /// Score the prompt too: every prompt token's log-probability given the tokens before it,
    /// with this many top alternatives, in one [`Event::Prompt`] before the first token.
    /// Cached prompt blocks are reused only where their scores were kept.
    pub prompt_logprobs: Option<usize>,
    /// Whether the engine may speculate for this request when speculation is on (it never
    /// changes the output; off only to compare).
    pub speculate: bool,
    /// Salts the prompt's prefix-cache blocks (a tenant's API key): requests with another key
    /// never reuse them. None shares the one cache.
    pub cache_key: Option<u64>,
    /// Start from the longest cached prefix of the prompt (true), or compute the whole prompt
    /// (llama-server's `cache_prompt: false`); the blocks computed enter the cache either way.
    pub cache_prompt: bool,
    /// Compute the prompt and pin its full blocks (never evicted) instead of generating: the
    /// request finishes with no tokens.
    pub pin: bool,
    /// Compute the prompt's embedding instead of generating, pooled this way: one
    /// [`Event::Embedding`], then `Finished` with no tokens. The whole prompt is computed (no
    /// cached block is reused: pooling needs every wanted row's hidden state).
    pub embed: Option<Pooling>,
}

impl Request {
    pub fn new(prompt: Vec<u32>, sampling: SamplingParams, max_tokens: usize) -> Self {
        Request {
            prompt,
            sampling,
            max_tokens,
            n: 1,
            stop: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            prompt_logprobs: None,
            speculate: true,
            cache_key: None,
            cache_prompt: true,
            pin: false,
            embed: None,
        }
    }

    /// A request for the embedding of `prompt`, pooled by `pooling`.
    pub fn embedding(prompt: Vec<u32>, pooling: Pooling) -> Self {
        Request {
            cache_prompt: false,
            speculate: false,
            embed: Some(pooling),
            ..Request::new(prompt, SamplingParams::default(), 0)
        }
    }
}

/// Why a completion ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
    /// Aborted by the client.
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// Log-probabilities of one sampled token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, best first.
    pub top: Vec<(u32, f32)>,
}

/// Token counts of one finished completion.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// Of those, the ones loaded from the disk tier for this request, and the ones held by
    /// pinned prompts (the rest were in memory).
    pub cached_disk_tokens: usize,
    pub cached_pinned_tokens: usize,
    /// Time from submission to the first token.
    pub ttft_ms: u64,
    /// Which of the request's `stop` strings ended the completion (its index), if one did.
    pub stop_sequence: Option<usize>,
}

/// What a client hears about its request. `index` is the completion (0..n).
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The prompt's scores (requests with `prompt_logprobs`), sent once before any token: one
    /// entry per prompt token, the first `None` (nothing precedes it).
    Prompt {
        tokens: Vec<u32>,
        logprobs: Vec<Option<TokenLogprobs>>,
    },
    /// A sampled token and the text it completes (may be empty while UTF-8 or a possible
    /// stop string is incomplete).
    Token {
        index: usize,
        token: u32,
        text: String,
        logprobs: Option<TokenLogprobs>,
    },
    /// Completion `index` ended; its last text is flushed in `text`.
    Finished {
        index: usize,
        reason: FinishReason,
        text: String,
        usage: Usage,
    },
    /// The prompt's embedding (requests with `embed`), sent once before `Finished`: one
    /// vector of `n_embd` floats, or one per prompt token for `Pooling::None`; not normalized.
    Embedding { vectors: Vec<Vec<f32>> },
    /// The request failed; no more events follow.
    Error(String),
}

/// Why a request was not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens, but the context holds {max} (prompt and completion together)")]
    PromptTooLong { prompt: usize, max: usize },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("too many requests: {0} are already queued")]
    QueueFull(usize),
    #[error("the engine has stopped")]
    Stopped,
}
