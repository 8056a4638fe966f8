//! The slash commands of `chat`: sessions (`/new`, `/list`, `/switch`, `/close`, `/fork`), the
//! conversation (`/system`, `/clear`, `/regen`, `/save`, `/load`), settings (`/set`), numbers
//! (`/stats`), the prefix cache (`/pin`), `/help` and `/exit`. Called by `Chat::handle_input`; notes go through `say`.

use std::path::Path;

use anyhow::{anyhow, bail, Result};

use super::session::ConversationFile;
use super::{Action, Chat};

pub const HELP: &str = "\
Type a message and press Enter to send it. A line ending in \\ continues on the next line;
\"\"\" starts and ends a multi-line block. //text sends /text as a message.
While a reply streams: Ctrl+C stops it; typing anything sends it to the background (it keeps
generating; Enter on an empty line, or /switch N, shows it again).

  /new                 start a new session (keeps this session's settings)
  /list                list the sessions
  /switch N            go to session N and show what it produced meanwhile
  /close [N]           close session N (default: this one), stopping its reply
  /fork                copy this conversation into a new session (shares the cached prompt)
  /system [TEXT]       set the system prompt (no TEXT: show it; /system - clears it)
  /clear               forget this session's messages (keeps the system prompt)
  /regen               replace the last reply with a new one
  /save FILE           write the conversation and settings as JSON
  /load FILE           replace this session's conversation and settings with FILE's
  /schema [FILE|off]   constrain replies to the JSON schema in FILE (no FILE: show it)
  /set [KEY VALUE]     change a setting: temp, top_p, top_k, min_p, seed (or random), max_tokens,
                       or a llama-server sampling field (dry_multiplier 0.8, mirostat 2, samplers kpt, ...)
  /stats               numbers of the last reply and of the engine
  /pin                 keep this conversation's prompt cached for good (shared by every session)
  /help                this text
  /exit                quit (also Ctrl+D)";

/// Pins the current conversation's prompt (system prompt and messages, without a generation
/// prompt): its full blocks stay cached while the program runs.
fn pin(chat: &mut Chat) -> Result<()> {
    let conversation = chat.current().conversation();
    if conversation.is_empty() {
        bail!("nothing to pin: this session has no system prompt or messages");
    }
    let text = chat.template.render(&conversation, false)?;
    let tokens = crate::chat_template::encode_prompt(chat.engine.tokenizer(), &text)?;
    let done = crate::flags::cache::pin_blocking(&chat.engine, tokens)?;
    chat.say(format!(
        "pinned {} tokens ({} were cached)",
        done.prompt_tokens, done.cached_tokens
    ));
    Ok(())
}

/// Runs one command line (starting with `/`).
pub fn run(chat: &mut Chat, line: &str) -> Result<Action> {
    let line = line.trim();
    let (name, arg) = match line.split_once(char::is_whitespace) {
        Some((n, a)) => (n, a.trim()),
        None => (line, ""),
    };
    match name {
        "/help" | "/?" => chat.say(HELP),
        "/exit" | "/quit" => return Ok(Action::Exit),
        "/new" => {
            let id = chat.new_session(None);
            chat.switch(id);
            chat.say(format!("session {id}"));
        }
        "/list" => {
            let lines: Vec<String> = chat
                .sessions
                .iter()
                .map(|s| {
                    format!(
                        "{} {}: {}",
                        if s.id == chat.current { "*" } else { " " },
                        s.id,
                        s.summary()
                    )
                })
                .collect();
            chat.say(lines.join("\n"));
        }
        "/switch" => {
            let id = session_number(chat, arg)?;
            chat.switch(id);
            chat.say(format!("session {id}: {}", chat.current().summary()));
            return Ok(Action::Show(id));
        }
        "/close" => {
            let id = if arg.is_empty() {
                chat.current
            } else {
                session_number(chat, arg)?
            };
            let pos = chat
                .sessions
                .iter()
                .position(|s| s.id == id)
                .expect("session_number checked it");
            let mut closed = chat.sessions.remove(pos);
            closed.abort(&chat.engine);
            if chat.sessions.is_empty() {
                let new = chat.new_session(None);
                chat.switch(new);
                chat.current_mut().settings = closed.settings;
            } else if id == chat.current {
                let next = chat.sessions[pos.min(chat.sessions.len() - 1)].id;
                chat.switch(next);
            }
            chat.say(format!(
                "closed session {id}; now in session {}",
                chat.current
            ));
        }
        "/fork" => {
            let from = chat.current;
            let id = chat.new_session(Some(from));
            chat.switch(id);
            let n = chat.current().messages.len();
            chat.say(format!(
                "session {id}: a fork of session {from} ({n} messages)"
            ));
        }
        "/system" => match arg {
            "" => match &chat.current().system {
                Some(s) => chat.say(format!("system: {s}")),
                None => chat.say("no system prompt"),
            },
            "-" => {
                chat.current_mut().system = None;
                chat.say("system prompt cleared");
            }
            text => {
                chat.current_mut().system = Some(text.to_string());
                chat.say("system prompt set");
            }
        },
        "/clear" => {
            let engine = chat.engine.clone();
            let s = chat.current_mut();
            s.abort(&engine);
            s.messages.clear();
            s.reply = None;
            chat.say("conversation cleared");
        }
        "/regen" => return regen(chat),
        "/save" => {
            let path = file_arg(arg)?;
            ConversationFile::of(chat.current()).save(path)?;
            let n = chat.current().messages.len();
            chat.say(format!("saved {n} messages to {}", path.display()));
        }
        "/load" => {
            let path = file_arg(arg)?;
            let file = ConversationFile::load(path)?;
            let engine = chat.engine.clone();
            let s = chat.current_mut();
            s.abort(&engine);
            s.reply = None;
            s.last_stats = None;
            s.system = file.system;
            s.messages = file.messages;
            if let Some(settings) = file.sampling {
                s.settings = settings;
            }
            let n = s.messages.len();
            chat.say(format!("loaded {n} messages from {}", path.display()));
        }
        "/set" => {
            if !arg.is_empty() {
                let (key, value) = arg
                    .split_once(char::is_whitespace)
                    .ok_or_else(|| anyhow!("usage: /set KEY VALUE"))?;
                chat.current_mut().settings.set(key, value.trim())?;
            }
            chat.say(chat.current().settings.to_string());
        }
        "/schema" => schema(chat, arg)?,
        "/stats" => stats(chat),
        "/pin" => pin(chat)?,
        _ => bail!("unknown command {name}; /help lists them"),
    }
    Ok(Action::Nothing)
}

/// Drops the last reply (stopping it if it is still generating) and asks again: the prompt is
/// the same as last time, so the engine serves it from the prefix cache.
fn regen(chat: &mut Chat) -> Result<Action> {
    let engine = chat.engine.clone();
    let id = chat.current;
    let s = chat.current_mut();
    if s.is_generating() {
        s.abort(&engine);
        if let Some(r) = &s.reply {
            while !r.is_done() {
                r.wait_for_more(std::time::Duration::from_millis(50));
            }
        }
        s.collect();
    }
    s.reply = None;
    if s.messages.last().is_some_and(|m| m.role == "assistant") {
        s.messages.pop();
    }
    if s.messages.last().is_none_or(|m| m.role != "user") {
        bail!("nothing to regenerate: send a message first");
    }
    chat.start_reply(id)?;
    Ok(Action::Reply(id))
}

/// `/schema FILE` constrains this session's replies to a JSON schema; `/schema off` frees them.
fn schema(chat: &mut Chat, arg: &str) -> Result<()> {
    match arg {
        "" => match &chat.current().schema {
            Some((path, _)) => chat.say(format!(
                "replies follow the JSON schema in {}",
                path.display()
            )),
            None => chat.say("replies are free (no /schema)"),
        },
        "off" => {
            chat.current_mut().schema = None;
            chat.say("replies are free again");
        }
        path => {
            let path = Path::new(path);
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow!("reading {}: {e}", path.display()))?;
            let schema: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| anyhow!("{} is not JSON: {e}", path.display()))?;
            let c = chat
                .engine
                .grammars
                .compile(&crate::constraint::ConstraintSpec::JsonSchema(schema), None)
                .map_err(|e| anyhow!("{}: {e}", path.display()))?;
            chat.current_mut().schema = Some((path.to_path_buf(), c));
            chat.say(format!(
                "replies follow the JSON schema in {}",
                path.display()
            ));
        }
    }
    Ok(())
}

fn session_number(chat: &Chat, arg: &str) -> Result<usize> {
    let id: usize = arg
        .parse()
        .map_err(|_| anyhow!("expected a session number, got {arg:?}"))?;
    if chat.session(id).is_none() {
        let ids: Vec<String> = chat.sessions.iter().map(|s| s.id.to_string()).collect();
        bail!("no session {id}; sessions: {}", ids.join(", "));
    }
    Ok(id)
}

fn file_arg(arg: &str) -> Result<&Path> {
    if arg.is_empty() {
        bail!("usage: /save FILE or /load FILE");
    }
    Ok(Path::new(arg))
}

/// `/stats`: the current session's last reply and the engine's counters.
fn stats(chat: &Chat) {
    let s = chat.current();
    match &s.last_stats {
        Some(r) => chat.say(format!(
            "session {}: last reply {} tokens ({}) in {:.2} s, {:.1} tokens/s after the first; \
             prompt {} tokens, {} cached; first token after {} ms",
            s.id,
            r.num_tokens,
            r.reason,
            r.total_secs,
            r.decode_tps,
            r.usage.prompt_tokens,
            r.usage.cached_tokens,
            r.usage.ttft_ms
        )),
        None => chat.say(format!("session {}: no finished reply yet", s.id)),
    }
    match chat.engine.metrics() {
        Some(m) => chat.say(format!(
            "engine: blocks {} used, {} free ({} of them holding cached prefixes) of {} ({} tokens each); \
             {} running, {} waiting; {} preemptions; prefix cache {:.1}% of prompt tokens ({} of {}); \
             {} tokens generated",
            m.blocks_used,
            m.blocks_free,
            m.blocks_cached,
            m.blocks_total,
            chat.engine.config.block_size,
            m.num_running,
            m.num_waiting,
            m.preemptions,
            100.0 * m.prefix_cache_hit_rate(),
            m.prefix_cache.hit_tokens,
            m.prefix_cache.lookup_tokens,
            m.tokens_generated
        )),
        None => chat.say("engine: no answer"),
    }
}
