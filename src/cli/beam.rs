//! `edge-llm run --beams N`: the beam search of `crate::api::beam` driven over the engine from
//! the terminal, each step's beams submitted at once; prints the best beam's text (and a
//! summary on a terminal's stderr). Called by `commands::run`.

use std::io::{IsTerminal, Write};

use anyhow::{bail, Result};

use crate::api::beam::{BeamParams, BeamSearch, EarlyStopping};
use crate::engine::{EngineHandle, Event};

/// Searches `width` beams from `prompt` for at most `max_tokens` tokens and prints the best.
pub fn run(
    engine: &EngineHandle,
    prompt: Vec<u32>,
    width: usize,
    max_tokens: usize,
    ignore_eos: bool,
) -> Result<()> {
    let room = engine.max_seq_len().saturating_sub(prompt.len() + 1);
    let params = BeamParams {
        width,
        length_penalty: 1.0,
        early_stopping: EarlyStopping::Heuristic,
        max_tokens: max_tokens.min(room).max(1),
        stop: Vec::new(),
        ignore_eos,
    };
    let num_prompt = prompt.len();
    let started = std::time::Instant::now();
    let mut search = BeamSearch::new(prompt, params);
    while !search.is_done() {
        let mut streams = Vec::new();
        for beam in search.live() {
            streams.push(engine.submit(search.step_request(beam, None))?);
        }
        let mut tops = Vec::with_capacity(streams.len());
        for stream in &mut streams {
            let mut top = None;
            while let Some(event) = stream.next_blocking() {
                match event {
                    Event::Token { logprobs, .. } => top = logprobs.map(|l| l.top),
                    Event::Error(e) => bail!("{e}"),
                    _ => {}
                }
            }
            match top {
                Some(top) => tops.push(top),
                None => bail!("a beam step produced no token"),
            }
        }
        search.advance(&tops, engine.tokenizer());
    }
    let num_steps = search.num_steps();
    let Some(best) = search.best(1).pop() else {
        bail!("the beam search finished no beam");
    };
    let mut out = std::io::stdout().lock();
    out.write_all(best.text(engine.tokenizer()).as_bytes())?;
    if out.is_terminal() {
        out.write_all(b"\n")?;
    }
    out.flush()?;
    if std::io::stderr().is_terminal() {
        eprintln!(
            "[{num_prompt} prompt tokens, {width} beams, {num_steps} steps in {:.2} s, best: {} tokens, \
             cumulative logprob {:.3}, finish: {}]",
            started.elapsed().as_secs_f64(),
            best.tokens.len(),
            best.cum_logprob,
            best.finish.map_or("none", |f| f.as_str())
        );
    }
    Ok(())
}
