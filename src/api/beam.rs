//! Beam search over the engine, the way vLLM v1 does it: no engine change, only requests. Each
//! step, every live beam becomes one engine request ([`BeamSearch::step_request`]: the prompt
//! and the beam's tokens so far, one greedy token, the top `2 * width` log-probabilities of
//! the next token). The faces submit a step's requests together, so the engine batches them
//! and the prefix cache shares their common blocks; each step computes only each beam's tail.
//! [`BeamSearch::advance`] then expands every beam by its top tokens, finishes candidates that
//! end (an end-of-generation token or a stop string), keeps the best `width` others and stops
//! as `early_stopping` says. This file is the bookkeeping alone (no engine, no I/O): the
//! server's `beam` module and `run --beams` drive it.
//!
//! Scores are vLLM's: `cum_logprob / len ** length_penalty`, where `len` counts the prompt and
//! the generated tokens (an end token not counted). Ties rank by token id, then beam index.

use crate::engine::sampler::SamplingParams;
use crate::engine::{FinishReason, Request};
use crate::tokenizer::Tokenizer;

/// The most beams: the engine reports at most 20 alternatives per token, and a step asks for
/// `2 * width`.
pub const MAX_WIDTH: usize = 10;

/// When the search may stop before every beam has ended (vLLM's and Hugging Face's
/// `early_stopping`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EarlyStopping {
    /// `false`: once `width` beams finished, stop when the best live beam's score now cannot
    /// beat the worst of them.
    #[default]
    Heuristic,
    /// `true`: stop as soon as `width` beams finished.
    Always,
    /// `"never"`: stop only when no live beam could still beat them at its longest.
    Never,
}

/// What a search is asked.
#[derive(Clone, Debug)]
pub struct BeamParams {
    pub width: usize,
    pub length_penalty: f64,
    pub early_stopping: EarlyStopping,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// End tokens are tokens like any other (the beam goes on past them).
    pub ignore_eos: bool,
}

/// One beam: the tokens generated (an end token left out) and their summed log-probability.
#[derive(Clone, Debug, PartialEq)]
pub struct Beam {
    pub tokens: Vec<u32>,
    pub cum_logprob: f64,
    /// Set once the beam finished: `Stop` (end token or stop string) or `Length`.
    pub finish: Option<FinishReason>,
    /// The text, cut before the stop string, once a stop string ended the beam.
    pub stopped_text: Option<String>,
}

impl Beam {
    /// The beam's text: up to its stop string, or its tokens decoded.
    pub fn text(&self, tok: &Tokenizer) -> String {
        self.stopped_text
            .clone()
            .unwrap_or_else(|| tok.decode(&self.tokens))
    }
}

/// vLLM's `get_beam_search_score`: `cum_logprob / len ** length_penalty`.
pub fn score(cum_logprob: f64, len: usize, length_penalty: f64) -> f64 {
    cum_logprob / (len.max(1) as f64).powf(length_penalty)
}

/// A search in progress.
pub struct BeamSearch {
    prompt: Vec<u32>,
    params: BeamParams,
    live: Vec<Beam>,
    finished: Vec<Beam>,
    num_steps: usize,
}

impl BeamSearch {
    /// A search from `prompt` (one empty live beam); `params.max_tokens` 0 ends it at once.
    pub fn new(prompt: Vec<u32>, params: BeamParams) -> Self {
        let start = Beam {
            tokens: Vec::new(),
            cum_logprob: 0.0,
            finish: None,
            stopped_text: None,
        };
        let live = if params.max_tokens == 0 {
            Vec::new()
        } else {
            vec![start]
        };
        BeamSearch {
            prompt,
            params,
            live,
            finished: Vec::new(),
            num_steps: 0,
        }
    }

    /// The beams to expand next; empty once the search is over.
    pub fn live(&self) -> &[Beam] {
        &self.live
    }

    pub fn is_done(&self) -> bool {
        self.live.is_empty()
    }

    pub fn prompt_len(&self) -> usize {
        self.prompt.len()
    }

    /// Steps taken (engine requests per live beam).
    pub fn num_steps(&self) -> usize {
        self.num_steps
    }

    /// The engine request that scores `beam`'s next token: its whole sequence as the prompt
    /// (the prefix cache supplies what earlier steps computed), one greedy token, end tokens
    /// allowed (so their log-probabilities come back too), the top `2 * width` alternatives.
    pub fn step_request(&self, beam: &Beam, cache_key: Option<u64>) -> Request {
        let mut prompt = self.prompt.clone();
        prompt.extend_from_slice(&beam.tokens);
        let sampling = SamplingParams {
            temperature: 0.0,
            ..super::request::openai_sampling(0)
        };
        let mut request = Request::new(prompt, sampling, 1);
        request.ignore_eos = true;
        request.logprobs = Some(2 * self.params.width);
        request.speculate = false;
        request.cache_key = cache_key;
        request
    }

    fn score_of(&self, beam: &Beam) -> f64 {
        let len = self.prompt.len() + beam.tokens.len();
        score(beam.cum_logprob, len, self.params.length_penalty)
    }

    /// One step: `tops[i]` is live beam `i`'s top next tokens and their log-probabilities.
    pub fn advance(&mut self, tops: &[Vec<(u32, f32)>], tok: &Tokenizer) {
        let mut candidates: Vec<(usize, u32, Beam)> = Vec::new();
        for (index, (beam, top)) in self.live.iter().zip(tops).enumerate() {
            for &(token, logprob) in top {
                let cum_logprob = beam.cum_logprob + f64::from(logprob);
                let mut next = Beam {
                    tokens: beam.tokens.clone(),
                    cum_logprob,
                    finish: None,
                    stopped_text: None,
                };
                if !self.params.ignore_eos && tok.is_eog(token) {
                    next.finish = Some(FinishReason::Stop);
                    self.finished.push(next);
                    continue;
                }
                next.tokens.push(token);
                let text = (!self.params.stop.is_empty()).then(|| tok.decode(&next.tokens));
                if let Some(text) = text.and_then(|t| stopped(&t, &self.params.stop)) {
                    next.finish = Some(FinishReason::Stop);
                    next.stopped_text = Some(text);
                    self.finished.push(next);
                    continue;
                }
                candidates.push((index, token, next));
            }
        }
        // One length for all: the score orders as the sum does.
        candidates.sort_by(|a, b| {
            b.2.cum_logprob
                .total_cmp(&a.2.cum_logprob)
                .then(a.1.cmp(&b.1))
                .then(a.0.cmp(&b.0))
        });
        candidates.truncate(self.params.width);
        self.live = candidates.into_iter().map(|(_, _, beam)| beam).collect();
        self.num_steps += 1;
        if self.num_steps >= self.params.max_tokens {
            for mut beam in self.live.drain(..) {
                beam.finish = Some(FinishReason::Length);
                self.finished.push(beam);
            }
        }
        self.sort_finished();
        if self.can_stop() {
            self.live.clear();
        }
    }

    /// Best first; a stable sort, so equal scores keep the order they finished in.
    fn sort_finished(&mut self) {
        let (prompt_len, lp) = (self.prompt.len(), self.params.length_penalty);
        let key = |b: &Beam| score(b.cum_logprob, prompt_len + b.tokens.len(), lp);
        self.finished.sort_by(|a, b| key(b).total_cmp(&key(a)));
    }

    /// vLLM's `_check_beam_search_early_stopping`, once `width` beams finished.
    fn can_stop(&self) -> bool {
        let width = self.params.width;
        if self.live.is_empty() || self.finished.len() < width {
            return false;
        }
        let worst = self.score_of(&self.finished[width - 1]);
        let lp = self.params.length_penalty;
        let best_now = |len_of: &dyn Fn(&Beam) -> usize| {
            self.live
                .iter()
                .map(|b| score(b.cum_logprob, len_of(b), lp))
                .fold(f64::NEG_INFINITY, f64::max)
        };
        let now = |b: &Beam| self.prompt.len() + b.tokens.len();
        match self.params.early_stopping {
            EarlyStopping::Always => true,
            EarlyStopping::Heuristic => worst >= best_now(&now),
            EarlyStopping::Never if lp > 0.0 => {
                // Longer is better under a positive penalty: the longest a beam can get.
                let longest = |_: &Beam| self.prompt.len() + self.params.max_tokens;
                worst >= best_now(&longest)
            }
            EarlyStopping::Never => worst >= best_now(&now),
        }
    }

    /// The `n` best finished beams, best first (the search must be over).
    pub fn best(mut self, n: usize) -> Vec<Beam> {
        self.sort_finished();
        self.finished.truncate(n);
        self.finished
    }
}

/// `text` cut before the first of `stop` it holds, if any.
fn stopped(text: &str, stop: &[String]) -> Option<String> {
    stop.iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
        .map(|pos| text[..pos].to_string())
}
