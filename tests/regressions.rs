//! Regression tests for the bugs of issue 12 ("What broke"), each named after its bug and
//! run through the real binary on the default model (or on a copy of it, patched).

mod support;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn edge_llm(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary starts");
    let mut stdin_pipe = child.stdin.take().unwrap();
    // A command that fails early closes its stdin: that is not this test's failure.
    let _ = stdin_pipe.write_all(stdin);
    drop(stdin_pipe);
    child.wait_with_output().unwrap()
}

fn model() -> String {
    support::model_path().to_str().unwrap().to_string()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Item 4: a line that is not UTF-8 stopped `run --jsonl` (exit 1) before the next line ran.
#[test]
fn jsonl_line_that_is_not_utf8_gets_an_error_line_and_the_next_line_runs() {
    let m = model();
    let out = edge_llm(
        &["run", "--jsonl", "-m", &m],
        b"\xff\xfe\n{\"id\":\"after\",\"prompt\":\"Hi\",\"max_tokens\":3}\n",
    );
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        stderr(&out)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    let error = lines[0]["error"].as_str().expect("an error line");
    assert!(
        error.contains("line 1") && error.contains("UTF-8"),
        "{error}"
    );
    assert_eq!(lines[1]["id"], "after");
    assert_eq!(lines[1]["usage"]["completion_tokens"], 3, "{}", lines[1]);
}

/// Item 6: `run -n 0` printed a token while the server and `--jsonl` refuse `max_tokens: 0`.
#[test]
fn run_n_zero_is_refused_like_max_tokens_zero() {
    let m = model();
    let out = edge_llm(
        &["run", "-m", &m, "-p", "Hi", "-n", "0", "--temp", "0"],
        b"",
    );
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = stderr(&out);
    assert!(err.contains("-n") && err.contains("at least 1"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// Item 6: `--temp -1` and `-n -1` were refused by clap as unexpected arguments; now `--temp -1`
/// gets the sampler's own message and `-n -1` means "until the context ends" (llama.cpp's -1).
#[test]
fn negative_temp_and_n_reach_their_own_checks_instead_of_clap() {
    let m = model();
    let out = edge_llm(&["run", "-m", &m, "-p", "Hi", "--temp", "-1"], b"");
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("temperature must be >= 0"), "{err}");
    assert!(!err.contains("unexpected argument"), "{err}");

    let out = edge_llm(
        &[
            "run",
            "-m",
            &m,
            "-p",
            "Hi",
            "-n",
            "-1",
            "-c",
            "32",
            "--temp",
            "0",
            "--ignore-eos",
        ],
        b"",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!out.stdout.is_empty());
    let out = edge_llm(&["run", "-m", &m, "-p", "Hi", "-n", "-2"], b"");
    assert!(!out.status.success());
    assert!(stderr(&out).contains("-1 for no limit"), "{}", stderr(&out));
}

/// Item 5: pipe chat printed a reply holding newlines as several lines, while the README said
/// one line per reply. `chat --json` writes exactly one JSON line per message.
#[test]
fn pipe_chat_reply_with_newlines_is_one_json_line_under_json() {
    let m = model();
    let out = edge_llm(
        &["chat", "-m", &m, "-n", "40", "--json", "--no-history"],
        b"/set temp 0\nList three fruits as a numbered list.\nSay hi.\n",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert_eq!(lines.len(), 2, "one line per message:\n{stdout}");
    let first = lines[0]["text"].as_str().expect("a reply");
    assert!(
        first.contains('\n'),
        "the reply's own newlines stay inside its line: {first:?}"
    );
    for line in &lines {
        assert_eq!(line["session"], 1, "{line}");
        assert!(line["finish_reason"].is_string(), "{line}");
        assert!(
            line["usage"]["completion_tokens"].as_u64().unwrap() > 0,
            "{line}"
        );
    }
}
