//! `chat` with stdin not a terminal, for scripts: one message per line (multi-line input as on
//! the terminal), each reply printed as it streams and ended by a newline (the reply's own
//! newlines kept, so a reply may span lines), nothing else on stdout (command output and errors
//! go to stderr). With `--json`, each reply is instead one JSON object on one line, written
//! when it ends: `{"session", "text", "finish_reason", "usage"}` or `{"session", "error"}`.
//! Slash commands work; replies are waited for one at a time. Called by `chat::run`.

use std::io::{BufRead, Write};
use std::time::Duration;

use anyhow::{Context, Result};

use super::input::LineAssembler;
use super::{Action, Chat, TextOut};

pub fn run(chat: &mut Chat, json: bool) -> Result<()> {
    let stdin = std::io::stdin().lock();
    let mut assembler = LineAssembler::default();
    let mut lines = stdin.lines();
    loop {
        let input = match lines.next() {
            Some(line) => match assembler.push(&line.context("reading stdin")?) {
                Some(input) => input,
                None => continue,
            },
            None => match assembler.finish() {
                Some(input) => input,
                None => break,
            },
        };
        if input.trim().is_empty() {
            continue;
        }
        match chat.handle_input(&input) {
            Action::Nothing => {}
            Action::Exit => break,
            // One line per message, even when it got no reply.
            Action::NoReply if json => println!(
                "{}",
                serde_json::json!({"session": chat.current().id, "error": "the message got no reply (the reason is on stderr)"})
            ),
            Action::NoReply => println!(),
            Action::Reply(id) | Action::Show(id) if json => print_reply_json(chat, id)?,
            Action::Reply(id) | Action::Show(id) => print_reply(chat, id)?,
        }
    }
    chat.shutdown();
    Ok(())
}

/// Prints session `id`'s reply as it streams, then a newline; errors go to stderr.
fn print_reply(chat: &mut Chat, id: usize) -> Result<()> {
    let Some(session) = chat.session_mut(id) else {
        return Ok(());
    };
    let Some(reply) = session.reply.as_mut() else {
        return Ok(());
    };
    if reply.collected && reply.shown >= reply.state().text.len() {
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    let mut text_out = TextOut::default();
    loop {
        let (text, done) = reply.take_unshown();
        text_out.write(&mut out, &text)?;
        if done {
            break;
        }
        reply.wait_for_more(Duration::from_millis(200));
    }
    text_out.finish();
    writeln!(out)?;
    out.flush()?;
    session.collect();
    if let Some(e) = &session.reply.as_ref().expect("printed above").state().error {
        eprintln!("error: {e}");
    }
    Ok(())
}

/// Waits for session `id`'s reply to end, then prints it as one JSON line.
fn print_reply_json(chat: &mut Chat, id: usize) -> Result<()> {
    let Some(session) = chat.session_mut(id) else {
        return Ok(());
    };
    let Some(reply) = session.reply.as_mut() else {
        return Ok(());
    };
    if reply.collected && reply.shown >= reply.state().text.len() {
        return Ok(());
    }
    while !reply.take_unshown().1 {
        reply.wait_for_more(Duration::from_millis(200));
    }
    let line = {
        let state = reply.state();
        match &state.error {
            Some(e) => serde_json::json!({"session": id, "error": e}),
            None => {
                let usage = state.usage.map(|u| {
                    serde_json::json!({
                        "prompt_tokens": u.prompt_tokens,
                        "completion_tokens": u.completion_tokens,
                        "total_tokens": u.prompt_tokens + u.completion_tokens,
                        "cached_tokens": u.cached_tokens,
                    })
                });
                serde_json::json!({
                    "session": id,
                    "text": state.text.trim_end(),
                    "finish_reason": state.reason.map(|r| r.as_str()),
                    "usage": usage,
                })
            }
        }
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    session.collect();
    Ok(())
}
