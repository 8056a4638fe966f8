//! Constrained decoding: what a request may generate (a JSON schema, any JSON object, a regular
//! expression or a Lark grammar), compiled once by llguidance into a token-level matcher.
//!
//! - [`ConstraintSpec`] is what a face asks for; [`Grammars::compile`] turns it into a
//!   [`Constraint`] (or an error naming what llguidance rejected) at submission, on the client's
//!   thread, so a bad grammar never reaches the engine. Compiled grammars are cached by a hash of
//!   their source: a repeated schema costs one clone.
//! - A [`Constraint`] rides in the sequence's `SamplingParams`; the engine gives every sequence its
//!   own [`ConstraintState`] and asks it for a token mask before sampling (`engine::masks`).
//! - `tokenv` builds llguidance's token trie from our own vocabulary's bytes.
//! - A lazy constraint ([`Trigger`]) leaves the text free until a trigger token, or until the
//!   text shows a tool call written without markup (`trigger`): then its grammar takes over,
//!   fed the call's text from its `{`.
//!
//! Callers: the server and CLI faces (compile), the engine worker (masks, consume).

pub mod cache;
pub mod gbnf;
mod tokenv;
pub mod trigger;

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cache::GrammarCache;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use toktrie::SimpleVob;

use crate::model::Model;

/// What a request asks its output to match.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    /// Any JSON object.
    JsonObject,
    /// A JSON schema (the subset llguidance supports).
    JsonSchema(Value),
    /// A regular expression the whole output matches.
    Regex(String),
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
    /// `inner` after a reasoning block (`api::reasoning`): free thoughts up to the first
    /// `close` tag, the whitespace after it, then `inner`. `open`/`close` are Lark atoms (a
    /// quoted string or a `<[id]>` token); `forced_open`: the prompt already opened the block,
    /// else the block is optional and starts with `open`.
    AfterThinking {
        inner: Box<ConstraintSpec>,
        open: String,
        close: String,
        forced_open: bool,
    },
}

impl ConstraintSpec {
    /// The kind, for messages and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            ConstraintSpec::JsonObject => "json_object",
            ConstraintSpec::JsonSchema(_) => "json_schema",
            ConstraintSpec::Regex(_) => "regex",
            ConstraintSpec::Lark(_) => "grammar",
            ConstraintSpec::AfterThinking { inner, .. } => inner.kind(),
        }
    }

    /// llguidance's grammar for this constraint. JSON is written compactly with `", "` and
    /// `": "` separators and no other whitespace (a small model can loop on whitespace that a
    /// flexible grammar allows); a schema's own `x-guidance` options win.
    fn grammar(&self) -> TopLevelGrammar {
        match self {
            ConstraintSpec::JsonObject => TopLevelGrammar::from_json_schema(with_json_options(
                &serde_json::json!({"type": "object"}),
            )),
            ConstraintSpec::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(with_json_options(schema))
            }
            ConstraintSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            ConstraintSpec::Lark(src) => TopLevelGrammar::from_lark(src.clone()),
            ConstraintSpec::AfterThinking {
                inner,
                open,
                close,
                forced_open,
            } => {
                // The thoughts are one lazy lexeme: the shortest text that ends with `close`
                // (a special token cannot occur in text: then plain text and the token).
                let thoughts = if close.starts_with("<[") {
                    format!("thoughts: {close} | THOUGHT {close}\nTHOUGHT: /(.|\\n)+/")
                } else {
                    format!("thoughts[lazy]: /(.|\\n)*/ {close}")
                };
                let start = if *forced_open {
                    "start: thoughts ws? @answer".to_string()
                } else {
                    format!("start: ({open} thoughts ws?)? @answer")
                };
                let wrapper = format!("{start}\n{thoughts}\nws: /[ \\t\\r\\n]+/\n");
                let mut top = TopLevelGrammar::from_lark(wrapper);
                let mut answer = inner.grammar();
                let mut body = answer.grammars.remove(0);
                body.name = Some("answer".into());
                top.grammars.push(body);
                top.grammars.extend(answer.grammars);
                top
            }
        }
    }

    /// The length of the grammar's source (what the cache charges it for).
    fn source_len(&self) -> usize {
        match self {
            ConstraintSpec::JsonObject => 0,
            ConstraintSpec::JsonSchema(v) => v.to_string().len(),
            ConstraintSpec::Regex(s) | ConstraintSpec::Lark(s) => s.len(),
            ConstraintSpec::AfterThinking { inner, .. } => inner.source_len(),
        }
    }

    fn source_hash(&self, trigger: Option<&Trigger>) -> u64 {
        let mut h = DefaultHasher::new();
        self.kind().hash(&mut h);
        match self {
            ConstraintSpec::JsonObject => {}
            ConstraintSpec::JsonSchema(v) => v.to_string().hash(&mut h),
            ConstraintSpec::Regex(s) | ConstraintSpec::Lark(s) => s.hash(&mut h),
            ConstraintSpec::AfterThinking {
                inner,
                open,
                close,
                forced_open,
            } => {
                inner.source_hash(None).hash(&mut h);
                (open, close, forced_open).hash(&mut h);
            }
        }
        trigger.hash(&mut h);
        h.finish()
    }
}

/// What starts a lazy constraint: a token (the grammar starts after it; the token itself is
/// free), or a call to one of `names` written without markup (see [`trigger::call_start`]; the
/// grammar starts at the call's `{`, fed the text from there).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Trigger {
    pub token: Option<u32>,
    pub names: Vec<String>,
}

/// Generated bytes a waiting lazy constraint keeps to find a call's start in.
const TRIGGER_WINDOW: usize = 1024;

/// The JSON options we decode with, unless the schema sets its own.
fn with_json_options(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            })
        });
    }
    schema
}

/// A compiled constraint, ready to hand to the engine in `SamplingParams`. Cheap to clone.
#[derive(Clone)]
pub struct Constraint {
    /// Hash of the grammar source (and trigger): the cache key and the identity.
    pub hash: u64,
    pub kind: &'static str,
    /// What starts a lazy constraint (None: active from the first token).
    pub trigger: Option<Arc<Trigger>>,
    /// The matcher at the grammar's start; every sequence deep-clones its own.
    start: Arc<Mutex<Matcher>>,
}

impl PartialEq for Constraint {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Constraint({}, {:016x})", self.kind, self.hash)
    }
}

impl Constraint {
    /// A fresh state for one sequence.
    pub fn new_state(&self) -> ConstraintState {
        let matcher = self.start.lock().map(|m| m.deep_clone()).ok();
        ConstraintState {
            matcher: if self.trigger.is_some() {
                None
            } else {
                matcher.clone()
            },
            pending: if self.trigger.is_some() {
                matcher
            } else {
                None
            },
            trigger: self.trigger.clone(),
            recent: Vec::new(),
        }
    }
}

/// One sequence's place in its grammar.
pub struct ConstraintState {
    /// The live matcher; None while a lazy constraint waits for its trigger.
    matcher: Option<Matcher>,
    /// A lazy constraint's matcher before the trigger.
    pending: Option<Matcher>,
    trigger: Option<Arc<Trigger>>,
    /// The text generated while waiting (the last [`TRIGGER_WINDOW`] bytes), where a call
    /// written without markup is looked for.
    recent: Vec<u8>,
}

/// What consuming a token did.
#[derive(Debug, PartialEq, Eq)]
pub enum Consumed {
    /// Generation goes on.
    Continue,
    /// The grammar is complete and allows nothing more.
    Done,
}

impl ConstraintState {
    /// Whether the next token is constrained (a lazy constraint is active once triggered).
    pub fn is_active(&self) -> bool {
        self.matcher.is_some()
    }

    /// The tokens allowed next, or an error (llguidance's step budget exhausted, or no token
    /// allowed). Only for active states.
    pub fn compute_mask(&mut self) -> Result<SimpleVob, String> {
        let m = self
            .matcher
            .as_mut()
            .ok_or("the constraint is not active")?;
        let mask = m
            .compute_mask()
            .map_err(|e| format!("the constraint failed: {}", first_line(&e.to_string())))?;
        if mask.is_zero() {
            return Err("the constraint allows no further token".into());
        }
        Ok(mask)
    }

    /// Advances past a sampled token.
    pub fn consume(&mut self, token: u32) -> Result<Consumed, String> {
        match &mut self.matcher {
            Some(m) => {
                m.consume_token(token).map_err(|e| {
                    format!(
                        "the constraint rejected token {token}: {}",
                        first_line(&e.to_string())
                    )
                })?;
                Ok(if m.is_stopped() {
                    Consumed::Done
                } else {
                    Consumed::Continue
                })
            }
            None => {
                let Some(trigger) = self.trigger.clone() else {
                    return Ok(Consumed::Continue);
                };
                if Some(token) == trigger.token {
                    self.matcher = self.pending.take();
                } else if !trigger.names.is_empty() {
                    self.watch(token, &trigger.names);
                }
                Ok(Consumed::Continue)
            }
        }
    }

    /// Looks for a call written without markup in the text so far (with `token`'s bytes):
    /// found, the grammar starts at its `{`, fed the text from there. A call the grammar
    /// refuses leaves the constraint waiting, and the text before it behind.
    fn watch(&mut self, token: u32, names: &[String]) {
        let Some(env) = self.pending.as_ref().and_then(|m| m.tok_env().ok()) else {
            return;
        };
        self.recent.extend_from_slice(env.tok_trie().token(token));
        if self.recent.len() > TRIGGER_WINDOW {
            self.recent.drain(..self.recent.len() - TRIGGER_WINDOW);
        }
        let text = String::from_utf8_lossy(&self.recent).into_owned();
        let Some((at, trigger::CallStart::At { brace, .. })) = trigger::find_call(&text, names)
        else {
            return;
        };
        let call = &text[at + brace..];
        let Some(pending) = self.pending.as_ref() else {
            return;
        };
        let mut m = pending.deep_clone();
        let tokens = env.tokenize_bytes(call.as_bytes());
        if m.consume_tokens(&tokens).is_ok() && !m.is_error() {
            self.matcher = Some(m);
            self.pending = None;
            self.recent.clear();
        } else {
            // Not a call this grammar allows: look past its start.
            let skip = text[..at + brace + 1].len();
            self.recent.drain(..skip.min(self.recent.len()));
        }
    }

    /// Whether the grammar could end here (then end-of-generation tokens are allowed).
    pub fn is_accepting(&mut self) -> bool {
        match &mut self.matcher {
            Some(m) => m.is_accepting().unwrap_or(false),
            None => true,
        }
    }
}

/// Compiles constraints for one model and caches them. Built lazily (the token trie of a large
/// vocabulary takes a moment), shared by every face through the engine handle.
pub struct Grammars {
    factory: OnceLock<Result<ParserFactory, String>>,
    /// Compiled grammars by source hash and tenant (an API key's salt): one tenant never times
    /// another's cache. Bounded by an estimate of their memory (`cache`).
    cache: Mutex<GrammarCache<Constraint>>,
    model: Arc<Model>,
    /// Compilations and cache hits, for `/metrics`.
    num_compiled: AtomicU64,
    num_hits: AtomicU64,
}

impl Grammars {
    /// For `model`'s vocabulary; nothing is built until the first constraint.
    pub fn new(model: Arc<Model>) -> Self {
        Grammars {
            factory: OnceLock::new(),
            cache: Mutex::new(GrammarCache::new(cache::DEFAULT_BUDGET)),
            model,
            num_compiled: AtomicU64::new(0),
            num_hits: AtomicU64::new(0),
        }
    }

    fn factory(&self) -> Result<&ParserFactory, String> {
        self.factory
            .get_or_init(|| {
                let env = tokenv::tok_env(&self.model.tokenizer, self.model.config.vocab_size);
                let mut f = ParserFactory::new_simple(&env)
                    .map_err(|e| format!("building the token trie: {e}"))?;
                f.quiet();
                Ok(f)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Compiles `spec` (from the cache when seen before). `trigger` makes it lazy (see
    /// [`Trigger`]). The error is llguidance's message.
    pub fn compile(
        &self,
        spec: &ConstraintSpec,
        trigger: Option<Trigger>,
    ) -> Result<Constraint, String> {
        self.compile_for(spec, trigger, None)
    }

    /// As [`Grammars::compile`], in the cache of `tenant` (an API key's salt; None shares the
    /// one cache): a tenant never gets, nor times, another's compiled grammar.
    pub fn compile_for(
        &self,
        spec: &ConstraintSpec,
        trigger: Option<Trigger>,
        tenant: Option<u64>,
    ) -> Result<Constraint, String> {
        let hash = spec.source_hash(trigger.as_ref());
        if let Some(c) = self
            .cache
            .lock()
            .ok()
            .and_then(|mut c| c.get(&(hash, tenant)))
        {
            self.num_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(c);
        }
        self.num_compiled.fetch_add(1, Ordering::Relaxed);
        let factory = self.factory()?;
        let parser = factory
            .create_parser(spec.grammar())
            .map_err(|e| first_line(&e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        let c = Constraint {
            hash,
            kind: spec.kind(),
            trigger: trigger.map(Arc::new),
            start: Arc::new(Mutex::new(matcher)),
        };
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert((hash, tenant), c.clone(), spec.source_len());
        }
        Ok(c)
    }

    /// Whether `spec` is compiled and cached.
    pub fn is_cached(&self, spec: &ConstraintSpec, trigger: Option<&Trigger>) -> bool {
        let hash = spec.source_hash(trigger);
        self.cache.lock().is_ok_and(|c| c.contains(&(hash, None)))
    }

    /// Bounds the compiled grammars kept to about `bytes` of memory (`--grammar-cache-mib`).
    pub fn set_budget(&self, bytes: usize) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.set_budget(bytes);
        }
    }

    /// Bytes charged for the compiled grammars kept, and how many there are.
    pub fn usage(&self) -> (usize, usize) {
        self.cache.lock().map_or((0, 0), |c| c.usage())
    }

    /// Grammars compiled and requests served from the cache since start.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.num_compiled.load(Ordering::Relaxed),
            self.num_hits.load(Ordering::Relaxed),
        )
    }
}

/// Whether an engine error message is a constraint's failure (every message of
/// [`ConstraintState`] starts so): the request's grammar, not the server, is at fault.
pub fn is_constraint_error(message: &str) -> bool {
    message.starts_with("the constraint ")
}

/// llguidance errors can run over many lines and carry the whole grammar and parser state (after
/// `<state>`); one line of at most 300 characters is what a client needs.
fn first_line(s: &str) -> String {
    let s = s.split("<state>").next().unwrap_or(s);
    let line = s
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let mut out: String = line.chars().take(300).collect();
    if out.len() < line.len() {
        out.push_str("...");
    }
    out
}
