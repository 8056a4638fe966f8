//! `edge-llm chat`: a chat with several sessions at once, all clients of one engine, so replies
//! of different sessions are batched together and share cached prefixes.
//!
//! - `session`: a conversation, its settings, and the reply a background thread reads from the
//!   engine while the user is elsewhere; the `/save` file.
//! - `commands`: the slash commands.
//! - `repl`: the terminal face (rustyline prompt, replies streamed as tokens arrive, Ctrl+C
//!   stops a reply, typing while a reply streams sends it to the background).
//! - `pipe`: stdin not a terminal: one message per line in, one reply per message out.
//! - `input`: multi-line input and type-ahead; `terminal`: key mode and the SIGINT flag.
//!
//! Called by `main.rs` through `cli::chat`.

mod commands;
mod input;
mod pipe;
mod repl;
mod session;
mod terminal;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, Context, Result};
use clap::Args;

use super::commands::SamplingArgs;
use crate::chat_template::{ChatMessage, ChatTemplate};
use crate::engine::sampler::SamplingParams;
use crate::engine::{EngineHandle, EngineParts, FinishReason, Request, SubmitError};
use crate::flags::{EngineArgs, ModelArgs, ThreadArgs};
use session::{Reply, Session, Settings};

/// Flags of `chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub threads: ThreadArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub cache: crate::flags::cache::CacheArgs,
    /// Most tokens per reply (`/set max_tokens` changes it per session).
    /// -1: no limit but the context.
    #[arg(
        short = 'n',
        long = "max-tokens",
        default_value_t = 512,
        allow_negative_numbers = true
    )]
    pub max_tokens: i64,
    /// A Jinja chat template file [default: the model's tokenizer.chat_template]
    #[arg(long = "chat-template")]
    pub chat_template: Option<PathBuf>,
    /// The system prompt of new sessions.
    #[arg(long = "system")]
    pub system: Option<String>,
    /// Neither read nor write the history file ($XDG_DATA_HOME/edge-llm/history).
    #[arg(long)]
    pub no_history: bool,
    /// With stdin not a terminal: one JSON object per reply, on one line
    /// ({"session", "text", "finish_reason", "usage"} or {"session", "error"}).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &ChatArgs) -> Result<()> {
    args.threads.init()?;
    let base = args.sampling.params()?;
    let max_tokens = super::commands::max_tokens_flag(args.max_tokens, "-n/--max-tokens")?;
    let settings = Settings {
        temperature: base.temperature,
        top_p: base.top_p,
        top_k: base.top_k,
        min_p: base.min_p,
        seed: args.sampling.seed,
        max_tokens,
        llama: Vec::new(),
    };
    let model = args.model.load()?;
    let template =
        ChatTemplate::load(&model.file, &model.tokenizer, args.chat_template.as_deref())?;
    // A template that cannot render even a one-line conversation is reported now.
    template
        .render(&[ChatMessage::new("user", "hello")], true)
        .with_context(|| match &args.chat_template {
            Some(path) => format!("checking --chat-template {}", path.display()),
            None => {
                "checking the model's chat template (--chat-template FILE overrides it)".to_string()
            }
        })?;
    let terminal = std::io::stdin().is_terminal();
    if terminal && args.json {
        anyhow::bail!(
            "--json is for a pipe (stdin not a terminal); on a terminal replies stream as text"
        );
    }
    let disk = args.cache.disk_config()?;
    let engine = args.engine.start(
        model,
        false,
        EngineParts {
            disk,
            no_prefix_cache: args.cache.no_prefix_cache,
            state_snapshot_every: args.cache.state_snapshot_every,
            ..Default::default()
        },
    )?;
    args.cache.pin_all(&engine, Some(&template))?;
    let mut chat = Chat::new(
        engine,
        template,
        base,
        settings,
        args.system.clone(),
        terminal,
    );
    if terminal {
        repl::run(&mut chat, !args.no_history)
    } else {
        pipe::run(&mut chat, args.json)
    }
}

/// What the front end should do after an input.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Action {
    Nothing,
    /// A reply was started in this session: print it as it streams.
    Reply(usize),
    /// A message got no reply (the error is already told).
    NoReply,
    /// Show what this session produced meanwhile, and follow it if it is still replying.
    Show(usize),
    Exit,
}

/// State the reply threads share with the terminal, for "reply finished" notices.
#[derive(Default)]
pub(crate) struct Ui {
    terminal: bool,
    /// The session whose reply is printed as it streams (0: none).
    following: AtomicUsize,
    current: AtomicUsize,
    /// The prompt is up: notices go through the line editor's printer.
    at_prompt: AtomicBool,
    printer: Mutex<Option<Box<dyn rustyline::ExternalPrinter + Send>>>,
    /// Notices to print before the next prompt.
    pending: Mutex<Vec<String>>,
}

impl Ui {
    /// Called on a reply's thread when it ends: tells the user unless they watched it end.
    fn reply_done(&self, id: usize, reason: Option<FinishReason>, num_tokens: usize) {
        if !self.terminal
            || self.following.load(Ordering::SeqCst) == id
            || reason == Some(FinishReason::Abort)
        {
            return;
        }
        let how = if self.current.load(Ordering::SeqCst) == id {
            "Enter".to_string()
        } else {
            format!("/switch {id}")
        };
        let what = match reason {
            Some(_) => format!("reply finished, {num_tokens} tokens"),
            None => "reply failed".to_string(),
        };
        let notice = format!("[session {id}: {what}; {how} shows it]");
        if self.at_prompt.load(Ordering::SeqCst) {
            if let Some(p) = self
                .printer
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
            {
                if p.print(notice.clone()).is_ok() {
                    return;
                }
            }
        }
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(notice);
    }

    fn take_pending(&self) -> Vec<String> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The sessions and what they share: the engine, the template, the defaults.
pub(crate) struct Chat {
    engine: EngineHandle,
    template: ChatTemplate,
    /// The command line's sampling parameters (penalties are not per session).
    base: SamplingParams,
    default_settings: Settings,
    default_system: Option<String>,
    sessions: Vec<Session>,
    /// The id of the current session.
    current: usize,
    next_id: usize,
    ui: Arc<Ui>,
}

impl Chat {
    fn new(
        engine: EngineHandle,
        template: ChatTemplate,
        base: SamplingParams,
        settings: Settings,
        system: Option<String>,
        terminal: bool,
    ) -> Chat {
        let ui = Arc::new(Ui {
            terminal,
            ..Default::default()
        });
        let mut chat = Chat {
            engine,
            template,
            base,
            default_settings: settings,
            default_system: system,
            sessions: Vec::new(),
            current: 0,
            next_id: 1,
            ui,
        };
        let id = chat.new_session(None);
        chat.switch(id);
        chat
    }

    /// Adds a session (a fresh one, or a fork of `from`) and returns its id.
    fn new_session(&mut self, from: Option<usize>) -> usize {
        let id = self.next_id;
        self.next_id += 1;
        let session = match from.and_then(|f| self.session(f)) {
            Some(parent) => parent.fork(id),
            None => {
                // A new session keeps the current one's settings.
                let settings = self
                    .session(self.current)
                    .map_or(self.default_settings.clone(), |s| s.settings.clone());
                Session::new(id, self.default_system.clone(), settings)
            }
        };
        self.sessions.push(session);
        id
    }

    fn switch(&mut self, id: usize) {
        self.current = id;
        self.ui.current.store(id, Ordering::SeqCst);
    }

    fn session(&self, id: usize) -> Option<&Session> {
        self.sessions.iter().find(|s| s.id == id)
    }

    fn session_mut(&mut self, id: usize) -> Option<&mut Session> {
        self.sessions.iter_mut().find(|s| s.id == id)
    }

    fn current(&self) -> &Session {
        self.session(self.current)
            .expect("the current session exists")
    }

    fn current_mut(&mut self) -> &mut Session {
        let id = self.current;
        self.session_mut(id).expect("the current session exists")
    }

    /// Prints a note for the user: on stdout at a terminal, on stderr in a pipe (where stdout
    /// carries only replies).
    fn say(&self, msg: impl std::fmt::Display) {
        if self.ui.terminal {
            println!("{msg}");
        } else {
            eprintln!("{msg}");
        }
    }

    /// The prompt: the current session's number.
    fn prompt(&self) -> String {
        format!("[{}]> ", self.current)
    }

    /// Handles one complete input: a slash command, or a message to the current session.
    fn handle_input(&mut self, input: &str) -> Action {
        for s in &mut self.sessions {
            s.collect();
        }
        let trimmed = input.trim();
        if trimmed.starts_with('/') && !trimmed.starts_with("//") {
            return match commands::run(self, trimmed) {
                Ok(action) => action,
                Err(e) => {
                    self.say(format!("error: {e:#}"));
                    Action::Nothing
                }
            };
        }
        // `//text` sends `/text` as a message.
        let text = input
            .strip_prefix('/')
            .filter(|t| t.starts_with('/'))
            .unwrap_or(input);
        match self.send(text) {
            Ok(id) => Action::Reply(id),
            Err(e) => {
                self.say(format!("error: {e:#}"));
                Action::NoReply
            }
        }
    }

    /// Adds a user message to the current session and starts its reply.
    fn send(&mut self, text: &str) -> Result<usize> {
        let id = self.current;
        if self.current().is_generating() {
            anyhow::bail!(
                "session {id} is still replying: Enter follows it, Ctrl+C stops it, /new starts another session"
            );
        }
        self.current_mut()
            .messages
            .push(ChatMessage::new("user", text));
        if let Err(e) = self.start_reply(id) {
            self.current_mut().messages.pop();
            return Err(e);
        }
        Ok(id)
    }

    /// Submits session `id`'s conversation; a thread reads the reply into the session.
    fn start_reply(&mut self, id: usize) -> Result<()> {
        let session = self.session(id).ok_or_else(|| anyhow!("no session {id}"))?;
        let tokenizer = &self.engine.tokenizer();
        let prompt = self
            .template
            .encode(tokenizer, &session.conversation(), true)?;
        let params = session
            .settings
            .params(&self.base)
            .map_err(anyhow::Error::msg)?;
        let mut params = params;
        params.constraint = session.schema.as_ref().map(|(_, c)| c.clone());
        let request = Request::new(prompt, params, session.settings.max_tokens);
        let stream = self.engine.submit(request).map_err(|e| match e {
            SubmitError::PromptTooLong { .. } => anyhow!("{e}: /clear this session, or /new"),
            e => anyhow!(e),
        })?;
        // Set before the reply can end, so the user who watches it is not also told.
        self.ui.following.store(id, Ordering::SeqCst);
        let ui = self.ui.clone();
        let reply = Reply::spawn(stream, move |reason, num_tokens| {
            ui.reply_done(id, reason, num_tokens)
        });
        self.session_mut(id).expect("checked above").reply = Some(reply);
        Ok(())
    }

    /// Stops every reply (on exit).
    fn shutdown(&mut self) {
        for s in &mut self.sessions {
            s.abort(&self.engine);
        }
    }
}

/// Writes streamed text, holding back trailing whitespace until more text follows, so a reply
/// ends exactly where its last visible character does.
#[derive(Default)]
struct TextOut {
    held: String,
}

impl TextOut {
    fn write(&mut self, out: &mut impl std::io::Write, text: &str) -> std::io::Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        self.held.push_str(text);
        let keep = self.held.trim_end().len();
        if keep > 0 {
            out.write_all(&self.held.as_bytes()[..keep])?;
            self.held.replace_range(..keep, "");
            out.flush()?;
        }
        Ok(())
    }

    /// Drops the held whitespace; returns how many bytes it was.
    fn finish(&mut self) -> usize {
        std::mem::take(&mut self.held).len()
    }
}
