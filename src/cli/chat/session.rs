//! One chat session: its conversation, its sampling settings, and the reply being generated,
//! which a background thread reads from the engine into a shared buffer so the session keeps
//! generating while the user is elsewhere. Also the conversation file of `/save` and `/load`.
//!
//! Used by the chat front end (`super`); knows nothing about terminals.

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use serde_json::{Map, Value};

use crate::api::request::Fields;
use crate::api::sampling_fields::{llama_sampling_fields, FIELDS};
use crate::chat_template::ChatMessage;
use crate::engine::sampler::SamplingParams;
use crate::engine::{Event, FinishReason, RequestStream, Usage};

/// The sampling settings of a session (`/set`), saved with its conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub min_p: f32,
    /// None: a new seed from the clock for every reply.
    pub seed: Option<u64>,
    pub max_tokens: usize,
    /// llama-server's other sampling fields set with `/set` (DRY, XTC, Mirostat, ...), by
    /// name, each value as JSON (or plain text).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub llama: Vec<(String, Value)>,
}

impl Settings {
    /// The names `/set` accepts.
    pub const KEYS: &'static str = "temp, top_p, top_k, min_p, seed, max_tokens, or one of \
        llama-server's sampling fields (dry_multiplier, xtc_probability, typical_p, top_n_sigma, \
        mirostat, mirostat_tau, mirostat_eta, dynatemp_range, min_keep, samplers, ...)";

    /// Sets one value from its text; the error says what was expected.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let mut next = self.clone();
        match key {
            "temp" | "temperature" => next.temperature = parse(key, value)?,
            "top_p" => next.top_p = parse(key, value)?,
            "top_k" => next.top_k = parse(key, value)?,
            "min_p" => next.min_p = parse(key, value)?,
            "seed" => {
                next.seed = if value == "random" {
                    None
                } else {
                    Some(parse(key, value)?)
                }
            }
            "max_tokens" => {
                next.max_tokens = parse(key, value)?;
                if next.max_tokens == 0 {
                    bail!("max_tokens must be at least 1");
                }
            }
            _ if FIELDS.contains(&key) => {
                next.llama.retain(|(k, _)| k != key);
                next.llama.push((key.to_string(), llama_value(key, value)));
            }
            _ => bail!("unknown setting {key:?}; one of {}", Self::KEYS),
        }
        next.params(&SamplingParams::default())
            .map_err(anyhow::Error::msg)?;
        *self = next;
        Ok(())
    }

    /// The engine's sampling parameters: these settings over `base` (the command line's
    /// penalties), with a seed from the clock if none is set.
    pub fn params(&self, base: &SamplingParams) -> std::result::Result<SamplingParams, String> {
        let mut p = SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            seed: self.seed.unwrap_or_else(crate::cli::commands::clock_seed),
            ..base.clone()
        };
        let fields: Map<String, Value> = self.llama.iter().cloned().collect();
        llama_sampling_fields(&Fields(&fields), &mut p).map_err(|e| e.message)?;
        p.validate()?;
        Ok(p)
    }
}

impl std::fmt::Display for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let seed = self.seed.map_or("random".to_string(), |s| s.to_string());
        write!(
            f,
            "temp {} top_p {} top_k {} min_p {} seed {seed} max_tokens {}",
            self.temperature, self.top_p, self.top_k, self.min_p, self.max_tokens
        )?;
        for (k, v) in &self.llama {
            write!(f, " {k} {v}")?;
        }
        Ok(())
    }
}

/// A `/set` value of a llama-server field: JSON where it reads as JSON, else the text; for
/// `samplers`, names separated by `;` become an array.
fn llama_value(key: &str, value: &str) -> Value {
    if key == "samplers" && value.contains(';') {
        return Value::Array(
            value
                .split(';')
                .filter(|n| !n.is_empty())
                .map(|n| Value::String(n.trim().to_string()))
                .collect(),
        );
    }
    serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()))
}

fn parse<T: std::str::FromStr>(key: &str, value: &str) -> Result<T> {
    value
        .parse()
        .map_err(|_| anyhow::anyhow!("{key}: {value:?} is not a valid value"))
}

/// What the reader thread has heard about one reply so far.
#[derive(Debug)]
pub struct ReplyState {
    pub text: String,
    pub num_tokens: usize,
    /// Set once the engine has finished the request (or failed it).
    pub done: bool,
    pub reason: Option<FinishReason>,
    pub usage: Option<Usage>,
    pub error: Option<String>,
    pub submitted: Instant,
    pub first_token: Option<Instant>,
    pub finished: Option<Instant>,
}

type Shared = Arc<(Mutex<ReplyState>, Condvar)>;

/// A reply being generated (or generated) for a session.
pub struct Reply {
    pub request_id: u64,
    shared: Shared,
    /// Bytes of the text already printed.
    pub shown: usize,
    /// Whether the finished text has been added to the conversation.
    pub collected: bool,
}

impl Reply {
    /// Starts the thread that reads `stream` into the reply's buffer; `on_done` runs on that
    /// thread once the request has ended, with why (None: it failed) and the tokens generated.
    pub fn spawn(
        mut stream: RequestStream,
        on_done: impl FnOnce(Option<FinishReason>, usize) + Send + 'static,
    ) -> Reply {
        let shared: Shared = Arc::new((
            Mutex::new(ReplyState {
                text: String::new(),
                num_tokens: 0,
                done: false,
                reason: None,
                usage: None,
                error: None,
                submitted: Instant::now(),
                first_token: None,
                finished: None,
            }),
            Condvar::new(),
        ));
        let request_id = stream.id;
        let reader = shared.clone();
        std::thread::Builder::new()
            .name(format!("edge-llm-chat-{request_id}"))
            .spawn(move || {
                let (lock, cond) = &*reader;
                loop {
                    let event = stream.next_blocking();
                    let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
                    match event {
                        Some(Event::Prompt { .. } | Event::Embedding { .. }) => {}
                        Some(Event::Token { text, .. }) => {
                            st.num_tokens += 1;
                            st.first_token.get_or_insert_with(Instant::now);
                            st.text.push_str(&text);
                        }
                        Some(Event::Finished {
                            reason,
                            text,
                            usage,
                            ..
                        }) => {
                            st.text.push_str(&text);
                            st.reason = Some(reason);
                            st.usage = Some(usage);
                        }
                        Some(Event::Error(e)) => st.error = Some(e),
                        None => {
                            if st.reason.is_none() && st.error.is_none() {
                                st.error = Some("the engine stopped".into());
                            }
                            st.done = true;
                            st.finished = Some(Instant::now());
                        }
                    }
                    cond.notify_all();
                    if st.done {
                        let end = (
                            st.error.is_none().then_some(st.reason).flatten(),
                            st.num_tokens,
                        );
                        drop(st);
                        on_done(end.0, end.1);
                        break;
                    }
                }
            })
            .expect("spawning a reply reader thread");
        Reply {
            request_id,
            shared,
            shown: 0,
            collected: false,
        }
    }

    pub fn state(&self) -> MutexGuard<'_, ReplyState> {
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_done(&self) -> bool {
        self.state().done
    }

    /// The text not yet printed (marked printed now), and whether the reply has ended.
    pub fn take_unshown(&mut self) -> (String, bool) {
        let st = self.shared.0.lock().unwrap_or_else(|e| e.into_inner());
        let text = st.text[self.shown..].to_string();
        let done = st.done;
        drop(st);
        self.shown += text.len();
        (text, done)
    }

    /// Waits up to `timeout` for text past what was printed, or the end.
    pub fn wait_for_more(&self, timeout: Duration) {
        let (lock, cond) = &*self.shared;
        let st = lock.lock().unwrap_or_else(|e| e.into_inner());
        if st.done || st.text.len() > self.shown {
            return;
        }
        let _ = cond.wait_timeout(st, timeout);
    }
}

/// Numbers about the last finished reply of a session (`/stats`).
#[derive(Clone, Debug)]
pub struct ReplyStats {
    pub usage: Usage,
    pub reason: &'static str,
    pub num_tokens: usize,
    /// Tokens per second after the first token (decode speed).
    pub decode_tps: f64,
    pub total_secs: f64,
}

impl ReplyStats {
    fn of(st: &ReplyState) -> ReplyStats {
        let end = st.finished.unwrap_or_else(Instant::now);
        let decode_tps = match st.first_token {
            Some(first) if st.num_tokens > 1 => {
                (st.num_tokens - 1) as f64 / end.duration_since(first).as_secs_f64().max(1e-9)
            }
            _ => 0.0,
        };
        ReplyStats {
            usage: st.usage.unwrap_or_default(),
            reason: match (&st.error, st.reason) {
                (Some(_), _) => "error",
                (None, Some(r)) => r.as_str(),
                (None, None) => "none",
            },
            num_tokens: st.num_tokens,
            decode_tps,
            total_secs: end.duration_since(st.submitted).as_secs_f64(),
        }
    }
}

/// One conversation with its settings and its latest reply.
pub struct Session {
    /// The number the user names it by (`/switch N`); never reused.
    pub id: usize,
    pub system: Option<String>,
    /// User and assistant turns, oldest first.
    pub messages: Vec<ChatMessage>,
    pub settings: Settings,
    pub reply: Option<Reply>,
    pub last_stats: Option<ReplyStats>,
    /// `/schema FILE`: replies are constrained to this JSON schema (the file, compiled).
    pub schema: Option<(std::path::PathBuf, crate::constraint::Constraint)>,
}

impl Session {
    pub fn new(id: usize, system: Option<String>, settings: Settings) -> Session {
        Session {
            id,
            system,
            messages: Vec::new(),
            settings,
            reply: None,
            last_stats: None,
            schema: None,
        }
    }

    /// Whether a reply is still being generated.
    pub fn is_generating(&self) -> bool {
        self.reply.as_ref().is_some_and(|r| !r.is_done())
    }

    /// Adds a finished reply to the conversation (once) and keeps its numbers. An aborted
    /// reply keeps the text it had; a failed or empty one adds nothing.
    pub fn collect(&mut self) {
        let Some(reply) = &mut self.reply else { return };
        if reply.collected {
            return;
        }
        let st = reply.state();
        if !st.done {
            return;
        }
        let stats = ReplyStats::of(&st);
        let text = st.text.trim_end().to_string();
        let failed = st.error.is_some();
        drop(st);
        reply.collected = true;
        self.last_stats = Some(stats);
        if !failed && !text.is_empty() {
            self.messages.push(ChatMessage::new("assistant", text));
        }
    }

    /// Stops the reply being generated, if any (the engine frees its blocks at once).
    pub fn abort(&mut self, engine: &crate::engine::EngineHandle) {
        if let Some(reply) = &self.reply {
            if !reply.is_done() {
                engine.abort(reply.request_id);
            }
        }
    }

    /// The messages the template renders: the system prompt, then the turns.
    pub fn conversation(&self) -> Vec<ChatMessage> {
        let mut all = Vec::with_capacity(self.messages.len() + 1);
        if let Some(s) = &self.system {
            all.push(ChatMessage::new("system", s.clone()));
        }
        all.extend(self.messages.iter().cloned());
        all
    }

    /// A copy of the conversation and settings as session `id` (no reply: it is generated
    /// anew, and the engine's prefix cache shares the KV of the common prompt).
    pub fn fork(&self, id: usize) -> Session {
        Session {
            id,
            system: self.system.clone(),
            messages: self.messages.clone(),
            settings: self.settings.clone(),
            reply: None,
            last_stats: None,
            schema: self.schema.clone(),
        }
    }

    /// A one-line summary for `/list`.
    pub fn summary(&self) -> String {
        let state = match &self.reply {
            Some(r) if !r.is_done() => format!("replying ({} tokens so far)", r.state().num_tokens),
            Some(r) if r.shown < r.state().text.len() => "reply ready, not yet shown".to_string(),
            _ => "idle".to_string(),
        };
        let first = self
            .messages
            .iter()
            .find(|m| m.role == "user")
            .map(|m| preview(&m.content, 40));
        let first = first.map(|f| format!(", {f:?}")).unwrap_or_default();
        let n = self.messages.len();
        format!(
            "{n} message{}, {state}{first}",
            if n == 1 { "" } else { "s" }
        )
    }
}

fn preview(s: &str, max_chars: usize) -> String {
    let one_line = s.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(max_chars) {
        Some((i, _)) => format!("{}...", &one_line[..i]),
        None => one_line,
    }
}

/// The JSON file of `/save` and `/load`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ConversationFile {
    #[serde(default)]
    pub system: Option<String>,
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub sampling: Option<Settings>,
}

impl ConversationFile {
    pub fn of(session: &Session) -> ConversationFile {
        ConversationFile {
            system: session.system.clone(),
            messages: session.messages.clone(),
            sampling: Some(session.settings.clone()),
        }
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))
    }

    /// Reads and checks a conversation: roles are `user` and `assistant` (a leading `system`
    /// message becomes the system prompt), and the settings are valid.
    pub fn load(path: &Path) -> Result<ConversationFile> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut file: ConversationFile = serde_json::from_str(&text)
            .with_context(|| format!("parsing {} as a conversation", path.display()))?;
        if file.messages.first().is_some_and(|m| m.role == "system") {
            let system = file.messages.remove(0);
            file.system.get_or_insert(system.content);
        }
        if let Some(bad) = file
            .messages
            .iter()
            .position(|m| m.role != "user" && m.role != "assistant")
        {
            bail!(
                "{}: message {bad} has role {:?}; expected user or assistant",
                path.display(),
                file.messages[bad].role
            );
        }
        if let Some(s) = &file.sampling {
            s.params(&SamplingParams::default())
                .map_err(|e| anyhow::anyhow!("{}: sampling: {e}", path.display()))?;
        }
        Ok(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            temperature: 0.8,
            top_p: 0.95,
            top_k: 40,
            min_p: 0.05,
            seed: None,
            max_tokens: 64,
            llama: Vec::new(),
        }
    }

    #[test]
    fn set_takes_llama_server_sampling_fields() {
        let mut s = settings();
        s.set("dry_multiplier", "0.8").unwrap();
        s.set("samplers", "top_k;typ_p;temperature").unwrap();
        s.set("mirostat", "2").unwrap();
        s.set("dry_sequence_breakers", r#"["\n", "%%"]"#).unwrap();
        let p = s.params(&SamplingParams::default()).unwrap();
        assert_eq!(
            (p.dry_multiplier, p.mirostat, p.samplers.len()),
            (0.8, 2, 3)
        );
        assert_eq!(p.dry_sequence_breakers, vec!["\n".to_string(), "%%".into()]);
        let e = s.set("xtc_probability", "2").unwrap_err().to_string();
        assert!(e.contains("xtc_probability"), "{e}");
        assert!(s.set("samplers", "top_k;bogus").is_err());
        assert!(s.to_string().contains("mirostat 2"), "{s}");
        let p = s.params(&SamplingParams::default()).unwrap();
        assert_eq!(p.xtc_probability, 0.0, "a refused value is not kept");
    }

    #[test]
    fn set_parses_and_validates() {
        let mut s = settings();
        s.set("temp", "0").unwrap();
        s.set("seed", "7").unwrap();
        s.set("max_tokens", "16").unwrap();
        assert_eq!((s.temperature, s.seed, s.max_tokens), (0.0, Some(7), 16));
        assert!(s.set("top_p", "2").is_err());
        assert!(s.set("top_k", "-1").is_err());
        assert!(s.set("max_tokens", "0").is_err());
        assert!(s.set("colour", "1").is_err());
        assert_eq!(
            s.top_p, 0.95,
            "a rejected value leaves the settings as they were"
        );
        s.set("seed", "random").unwrap();
        assert_eq!(s.seed, None);
    }

    #[test]
    fn preview_cuts_on_chars() {
        assert_eq!(preview("héllo\n wörld", 7), "héllo w...");
        assert_eq!(preview("short", 40), "short");
    }
}
