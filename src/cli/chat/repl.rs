//! The terminal face of `chat`: a rustyline prompt with history, and replies printed as their
//! tokens arrive. While a reply streams the terminal is in key mode: Ctrl+C stops the reply,
//! and any other key sends the reply to the background (it keeps generating into its session)
//! and becomes the start of the next input, so the user can go on in another session at once.
//! Called by `chat::run` when stdin is a terminal.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use rustyline::error::ReadlineError;
use rustyline::history::FileHistory;
use rustyline::{Config, Editor};

use super::input::{history_path, LineAssembler, TypeAhead};
use super::terminal::{catch_interrupts, take_interrupt, KeyMode};
use super::{Action, Chat, TextOut};
use crate::engine::FinishReason;

pub fn run(chat: &mut Chat, use_history: bool) -> Result<()> {
    catch_interrupts()?;
    let config = Config::builder()
        .max_history_size(2000)?
        .auto_add_history(false)
        .history_ignore_dups(true)?
        .build();
    let mut editor: Editor<(), FileHistory> =
        Editor::with_config(config).context("starting the line editor")?;
    let history = if use_history { history_path() } else { None };
    if let Some(path) = &history {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if path.is_file() {
            if let Err(e) = editor.load_history(path) {
                eprintln!("warning: cannot read the history {}: {e}", path.display());
            }
        }
    }
    if let Ok(printer) = editor.create_external_printer() {
        *chat.ui.printer.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(printer));
    }
    println!("edge-llm chat: /help lists the commands; Ctrl+C stops a reply, Ctrl+D quits.");
    let mut assembler = LineAssembler::default();
    let mut typeahead = TypeAhead::default();
    loop {
        for notice in chat.ui.take_pending() {
            println!("{notice}");
        }
        let prompt = if assembler.in_progress() {
            "... ".to_string()
        } else {
            chat.prompt()
        };
        let line = match typeahead.take_line() {
            Some(line) => {
                println!("{prompt}{line}");
                Ok(line)
            }
            None => {
                // A Ctrl+C from before the prompt was up is stale.
                take_interrupt();
                let initial = typeahead.take_partial();
                chat.ui.at_prompt.store(true, Ordering::SeqCst);
                let line = editor.readline_with_initial(&prompt, (&initial, ""));
                chat.ui.at_prompt.store(false, Ordering::SeqCst);
                line
            }
        };
        let line = match line {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => {
                if assembler.in_progress() {
                    assembler.reset();
                } else if chat.current().is_generating() {
                    let engine = chat.engine.clone();
                    chat.current_mut().abort(&engine);
                    println!("[stopped session {}'s reply]", chat.current);
                } else {
                    println!("(Ctrl+D or /exit quits)");
                }
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e).context("reading the terminal"),
        };
        let Some(input) = assembler.push(&line) else {
            continue;
        };
        if !input.trim().is_empty() {
            let _ = editor.add_history_entry(input.as_str());
            if let Some(path) = &history {
                let _ = editor.append_history(path);
            }
        }
        let action = if input.trim().is_empty() {
            // Enter on an empty line shows the current session's reply, if there is more.
            Action::Show(chat.current)
        } else {
            if !input.trim_start().starts_with('/') && !chat.current().is_generating() {
                // A finished reply not yet read is shown before the next message goes out.
                show(chat, chat.current, &mut typeahead)?;
            }
            chat.handle_input(&input)
        };
        match action {
            Action::Nothing | Action::NoReply => {}
            Action::Reply(id) | Action::Show(id) => show(chat, id, &mut typeahead)?,
            Action::Exit => break,
        }
    }
    chat.shutdown();
    Ok(())
}

/// Prints session `id`'s reply from where it was left and follows it while it streams, until
/// it ends, Ctrl+C stops it, or a key sends it to the background.
fn show(chat: &mut Chat, id: usize, typeahead: &mut TypeAhead) -> Result<()> {
    let engine = chat.engine.clone();
    let ui = chat.ui.clone();
    let Some(session) = chat.session_mut(id) else {
        return Ok(());
    };
    let Some(reply) = session.reply.as_mut() else {
        return Ok(());
    };
    if reply.collected && reply.shown >= reply.state().text.len() {
        return Ok(());
    }
    // Other output came since this reply was last on screen: start again at its line's start.
    let line_start = {
        let st = reply.state();
        st.text[..reply.shown].rfind('\n').map_or(0, |i| i + 1)
    };
    reply.shown = line_start;
    ui.following.store(id, Ordering::SeqCst);
    let keys = KeyMode::enter()?;
    let mut out = std::io::stdout().lock();
    let mut text_out = TextOut::default();
    let mut stopping = false;
    let mut printed = false;
    let detached = loop {
        let (text, done) = reply.take_unshown();
        printed |= !text.trim().is_empty();
        text_out.write(&mut out, &text)?;
        if done {
            break false;
        }
        let keys_typed = keys.read_keys(30)?;
        let interrupted = take_interrupt() || keys_typed.contains(&3);
        if interrupted && !stopping {
            engine.abort(reply.request_id);
            stopping = true;
        } else if !keys_typed.is_empty() && !stopping {
            // Ctrl+D only sends the reply to the background.
            let keys_typed: Vec<u8> = keys_typed.into_iter().filter(|&b| b != 4).collect();
            typeahead.push_keys(&keys_typed);
            break true;
        }
        if stopping {
            reply.wait_for_more(Duration::from_millis(10));
        }
    };
    drop(keys);
    ui.following.store(0, Ordering::SeqCst);
    // Held whitespace is printed when the reply is shown again.
    reply.shown -= text_out.finish();
    if printed {
        writeln!(out)?;
    }
    if detached {
        writeln!(
            out,
            "[session {id} keeps replying in the background: Enter shows it, Ctrl+C stops it]"
        )?;
        return Ok(());
    }
    session.collect();
    let st = session.reply.as_ref().expect("shown above").state();
    if let Some(e) = &st.error {
        writeln!(out, "[error: {e}]")?;
    } else if st.reason == Some(FinishReason::Abort) {
        writeln!(out, "[stopped]")?;
    }
    drop(st);
    // The reply is on screen in full: nothing more to show.
    if let Some(reply) = session.reply.as_mut() {
        let len = reply.state().text.len();
        reply.shown = len;
    }
    out.flush()?;
    Ok(())
}
