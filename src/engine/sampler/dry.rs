//! DRY ("don't repeat yourself"), a port of llama.cpp's `llama_sampler_dry` (itself from
//! koboldcpp): a token that would extend a repeat of the recent context longer than the allowed
//! length loses `multiplier * base^(length - allowed)` from its logit; a sequence breaker (a
//! string such as "\n", tokenized every way the vocabulary can spell it) stops a repeat.
//! `breakers` turns the strings into token sequences once per vocabulary (cached); `apply` runs
//! per step. Called by `Sampler`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::chain::Candidates;
use crate::tokenizer::Tokenizer;

/// A breaker string is cut to this many bytes, and its tail to this many tokens (llama.cpp's
/// `MAX_CHAR_LEN`, `MAX_SEQ_LEN`).
const MAX_CHAR_LEN: usize = 40;
const MAX_SEQ_LEN: usize = 20;

/// The breakers as token sequences: head token to the tails that follow it (an empty tail: the
/// head alone is a breaker).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Breakers(pub HashMap<u32, Vec<Vec<u32>>>);

impl Breakers {
    /// From whole token sequences (head first), as llama.cpp's `llama_sampler_init_dry_testing`.
    pub fn from_sequences(seqs: &[Vec<u32>]) -> Self {
        let mut map: HashMap<u32, Vec<Vec<u32>>> = HashMap::new();
        for s in seqs.iter().filter(|s| !s.is_empty()) {
            map.entry(s[0]).or_default().push(s[1..].to_vec());
        }
        Breakers(map)
    }
}

/// `get_overlapping_token_sequences` for each string: every token whose text holds the string
/// is a breaker alone; a token whose text ends with a prefix of it is a head followed by the
/// tokenization of the rest.
pub fn breakers(tok: &Tokenizer, strings: &[String]) -> Arc<Breakers> {
    static CACHE: OnceLock<Mutex<HashMap<(usize, Vec<String>), Arc<Breakers>>>> = OnceLock::new();
    let key = (tok.vocab_size(), strings.to_vec());
    let cache = CACHE.get_or_init(Default::default);
    if let Some(b) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return b.clone();
    }
    let words: Vec<Vec<u8>> = (0..tok.vocab_size() as u32)
        .map(|id| tok.token_bytes(id))
        .collect();
    let mut map: HashMap<u32, Vec<Vec<u32>>> = HashMap::new();
    for s in strings {
        let mut s = s.as_bytes().to_vec();
        if s.is_empty() {
            continue;
        }
        s.truncate(MAX_CHAR_LEN);
        for (id, word) in words.iter().enumerate() {
            let id = id as u32;
            if contains(word, &s) {
                // As llama.cpp: not deduplicated (a token holding two breakers is listed twice).
                map.entry(id).or_default().push(Vec::new());
                continue;
            }
            for pos in (0..word.len()).filter(|&p| word[p] == s[0]) {
                let mut i = 1;
                let mut matched = true;
                while i < s.len() && pos + i < word.len() {
                    if word[pos + i] != s[i] {
                        matched = false;
                        break;
                    }
                    i += 1;
                }
                if matched {
                    let rest = String::from_utf8_lossy(&s[i..]);
                    let mut tail = tok.encode(&rest, false, false).unwrap_or_default();
                    tail.truncate(MAX_SEQ_LEN);
                    push_unique(&mut map, id, tail);
                }
            }
        }
    }
    let b = Arc::new(Breakers(map));
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, b.clone());
    b
}

fn contains(word: &[u8], s: &[u8]) -> bool {
    word.windows(s.len()).any(|w| w == s)
}

fn push_unique(map: &mut HashMap<u32, Vec<Vec<u32>>>, id: u32, tail: Vec<u32>) {
    let tails = map.entry(id).or_default();
    if !tails.contains(&tail) {
        tails.push(tail);
    }
}

/// DRY's settings for one step.
pub struct Dry<'a> {
    pub multiplier: f32,
    pub base: f32,
    pub allowed_length: usize,
    pub penalty_last_n: usize,
    pub breakers: &'a Breakers,
}

impl Dry<'_> {
    /// `llama_sampler_dry_apply` over `history` (the prompt then the generated tokens; only the
    /// last `penalty_last_n` are read).
    pub fn apply(&self, cand: &mut Candidates, history: &[u32]) {
        if self.multiplier == 0.0 || self.base < 1.0 || self.penalty_last_n == 0 {
            return;
        }
        let last_n = history.len().min(self.penalty_last_n);
        let allowed = self.allowed_length;
        if last_n <= allowed {
            return;
        }
        // rat(i): the i-th token from the end (0: the newest).
        let tail = &history[history.len() - last_n..];
        let rat = |i: usize| tail[last_n - 1 - i];

        // Step 1: the nearest breaker bounds how far back a repeat may reach.
        let mut rep_limit = last_n;
        for i in 0..last_n {
            let Some(tails) = self.breakers.0.get(&rat(i)) else {
                continue;
            };
            let mut longest: Option<usize> = None;
            for t in tails {
                let len = t.len();
                if longest.is_none_or(|l| len > l) && len <= i {
                    if (0..len).all(|o| t[o] == rat(i - o - 1)) {
                        longest = Some(len);
                    }
                }
            }
            if let Some(len) = longest {
                rep_limit = i - len;
                break;
            }
        }
        if rep_limit < allowed {
            return;
        }

        // Step 2: the Z-algorithm, backwards: repeat[last - k] is how many tokens before
        // position k from the end match the newest ones (capped at rep_limit).
        let mut repeat = vec![0usize; last_n];
        let last = last_n - 1;
        let (mut lt, mut rt) = (0usize, 0usize);
        for k in 1..last_n {
            if k > rt {
                let mut n = 0;
                while n + k < last_n && rat(n) == rat(n + k) {
                    n += 1;
                }
                repeat[last - k] = n.min(rep_limit);
                if n > 0 {
                    lt = k;
                    rt = k + n - 1;
                }
            } else {
                let p = k - lt;
                let right_part_len = rt - k + 1;
                if repeat[last - p] < right_part_len {
                    repeat[last - k] = repeat[last - p].min(rep_limit);
                } else {
                    let mut i = rt + 1;
                    while i < last_n && rat(i) == rat(i - k) {
                        i += 1;
                    }
                    repeat[last - k] = (i - k).min(rep_limit);
                    lt = k;
                    rt = i - 1;
                }
            }
        }

        // Step 3: the token after each repeat would extend it; keep the longest per token.
        let mut max_repeat: HashMap<u32, usize> = HashMap::new();
        for (i, &len) in repeat.iter().enumerate().take(last_n - 1) {
            if len >= allowed {
                let token = rat(last_n - 2 - i);
                let e = max_repeat.entry(token).or_insert(len);
                *e = (*e).max(len);
            }
        }

        // Step 4: the penalty, its exponent capped so base^exp stays finite.
        const FLOAT_MAX_LOG: f32 = 88.722_84;
        let max_exponent = if self.base > 1.000001 {
            (FLOAT_MAX_LOG / self.base.ln()) as i32
        } else {
            0
        };
        for c in &mut cand.data {
            let Some(&len) = max_repeat.get(&c.id) else {
                continue;
            };
            let single_breaker = self
                .breakers
                .0
                .get(&c.id)
                .is_some_and(|tails| tails.iter().any(Vec::is_empty));
            if single_breaker {
                continue;
            }
            let mut exp = len as i32 - allowed as i32;
            if max_exponent > 0 && exp > max_exponent {
                exp = max_exponent;
            }
            let penalty = (self.multiplier as f64 * (self.base as f64).powi(exp)) as f32;
            c.logit -= penalty;
        }
        cand.sorted = false;
    }
}
