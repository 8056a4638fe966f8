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

/// The one `error:` line a refused run printed.
fn error_line(out: &Output) -> String {
    stderr(out)
        .lines()
        .find(|l| l.starts_with("error:"))
        .expect("an error line")
        .to_string()
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
        &[
            "chat",
            "-m",
            &m,
            "-n",
            "40",
            "--json",
            "--no-history",
            "--no-disk-cache",
        ],
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

/// A copy of the default model with `bytes` written at `offset`, in a scratch file.
fn patched_model(name: &str, offset: u64, bytes: &[u8]) -> std::path::PathBuf {
    use std::io::{Seek, SeekFrom};
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("regression-{name}.gguf"));
    std::fs::copy(support::model_path(), &path).unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(bytes).unwrap();
    path
}

/// Item 3: a token string whose length field says 30,000,000 (byte 1107 of the default model)
/// made `info` print the whole invalid string: 92,711,538 bytes of "one-line" error.
#[test]
fn info_on_a_token_length_patched_to_30_million_prints_one_short_line() {
    let path = patched_model("token-length-30m", 1107, &30_000_000u64.to_le_bytes());
    let out = edge_llm(&["info", "-m", path.to_str().unwrap()], b"");
    std::fs::remove_file(&path).ok();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.len() < 1000, "{} bytes of error", err.len());
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("invalid UTF-8") && err.contains("tokenizer.ggml.tokens"),
        "{err}"
    );
    assert!(err.contains("30000000 bytes in all"), "{err}");
}

/// Item 6: a directory given as `-m` said "No such device (os error 19): No such device (os
/// error 19)", and a missing file repeated its cause too.
#[test]
fn a_directory_or_missing_file_as_model_is_named_once_with_its_cause() {
    let dir = env!("CARGO_TARGET_TMPDIR");
    let out = edge_llm(&["run", "-m", dir, "-p", "hi"], b"");
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("is a directory, not a GGUF file"), "{err}");
    assert!(!err.contains("os error 19"), "{err}");

    let missing = format!("{dir}/no-such-model.gguf");
    let out = edge_llm(&["run", "-m", &missing, "-p", "hi"], b"");
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}

/// Item 2: `run -c 100000000` and `--kv-mem 100000000` printed "memory allocation of
/// 38400000000 bytes failed" and aborted (exit 134); now one line names the size, the limit
/// and the flag, before anything is allocated, and the exit status is 1.
#[test]
fn oversized_kv_pool_is_refused_in_one_line_instead_of_aborting() {
    let m = model();
    for (args, flag) in [
        (&["-c", "100000000"][..], "-c/--ctx-size"),
        (&["--kv-mem", "100000000"][..], "--kv-mem"),
    ] {
        let mut all = vec!["run", "-m", &m, "-p", "hi", "-n", "4"];
        all.extend_from_slice(args);
        let out = edge_llm(&all, b"");
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let line = error_line(&out);
        assert!(
            line.contains("not enough memory") && line.contains("GiB") && line.contains(flag),
            "{line}"
        );
        assert!(
            line.contains("MemAvailable") || line.contains("cgroup"),
            "{line}"
        );
    }
    // Under `ulimit -v` the address-space limit is the one named.
    let script = format!(
        "ulimit -v 1500000 && exec '{}' run -m '{m}' -p hi -n 4 -c 3000000",
        env!("CARGO_BIN_EXE_edge-llm")
    );
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("RLIMIT_AS"), "{}", stderr(&out));
}

/// The draft model's KV pool and weights were not in the start-up memory check:
/// `--spec draft --draft-kv-mem 100000000` panicked allocating the draft's pool (exit 134).
/// Now the target's and the draft's footprints are checked together, and the line names the
/// draft's flag.
#[test]
fn oversized_draft_kv_pool_is_refused_in_one_line_instead_of_aborting() {
    let m = model();
    let draft = ["--spec", "draft", "--draft-model", &m];
    let mut args = vec!["run", "-m", &m, "-p", "hi", "-n", "4"];
    args.extend_from_slice(&draft);
    args.extend_from_slice(&["--draft-kv-mem", "100000000"]);
    let out = edge_llm(&args, b"");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let line = error_line(&out);
    assert!(
        line.contains("not enough memory") && line.contains("--draft-kv-mem"),
        "{line}"
    );
    // Each pool fits alone under this address-space limit (about 2.9 GiB); both do not.
    let script = format!(
        "ulimit -v 3000000 && exec '{}' run -m '{m}' -p hi -n 4 --kv-mem 1000 {} --draft-kv-mem 1500",
        env!("CARGO_BIN_EXE_edge-llm"),
        draft.join(" ")
    );
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("RLIMIT_AS") && err.contains("--draft-kv-mem"),
        "{err}"
    );
}

/// Item 2: `-c 20000` on a model trained for 8192 was accepted silently; as in llama.cpp it
/// runs, with a warning naming both sizes.
#[test]
fn ctx_size_above_the_training_context_is_warned() {
    let m = model();
    let out = edge_llm(
        &["run", "-m", &m, "-p", "hi", "-n", "2", "-c", "20000"],
        b"",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("-c 20000") && err.contains("8192"), "{err}");
}

/// Where metadata key `key`'s value starts in the default model (after its u32 type).
fn metadata_value_offset(key: &str) -> u64 {
    let bytes = std::fs::read(support::model_path()).unwrap();
    let head = &bytes[..bytes.len().min(4 << 20)];
    let mut needle = (key.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(key.as_bytes());
    let at = head
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .unwrap_or_else(|| panic!("{key} is not in the default model"));
    (at + needle.len() + 4) as u64
}

/// Item 6: a NaN or negative `rms_epsilon`, or BOS/EOS ids outside the vocabulary, loaded
/// without complaint (then `run` printed nothing and exited 0).
#[test]
fn nan_or_negative_rms_epsilon_and_eos_outside_the_vocabulary_are_refused_at_load() {
    let key = "llama.attention.layer_norm_rms_epsilon";
    let at = metadata_value_offset(key);
    for (name, value) in [("nan", f32::NAN), ("negative", -1e-5f32)] {
        let path = patched_model(&format!("rms-eps-{name}"), at, &value.to_le_bytes());
        let out = edge_llm(
            &["run", "-m", path.to_str().unwrap(), "-p", "hi", "-n", "2"],
            b"",
        );
        std::fs::remove_file(&path).ok();
        assert_eq!(out.status.code(), Some(1), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains(key), "{name}: {}", stderr(&out));
    }
    for key in ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"] {
        let at = metadata_value_offset(key);
        let path = patched_model(key, at, &99_999_999u32.to_le_bytes());
        let out = edge_llm(
            &["run", "-m", path.to_str().unwrap(), "-p", "hi", "-n", "2"],
            b"",
        );
        std::fs::remove_file(&path).ok();
        assert_eq!(out.status.code(), Some(1), "{key}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(key) && err.contains("outside the vocabulary"),
            "{err}"
        );
    }
}

/// Item 6: `perplexity --chunks 0` printed `PPL = NaN` with exit 0, and a large file was
/// tokenized whole (63 MB) before `--chunks` was looked at.
#[test]
fn perplexity_chunks_zero_is_refused_and_chunks_bound_the_text_tokenized() {
    let m = model();
    let out = edge_llm(
        &[
            "perplexity",
            "-m",
            &m,
            "-f",
            "/no/such/file",
            "--chunks",
            "0",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("--chunks must be at least 1"),
        "{}",
        stderr(&out)
    );
    // The model file itself (98 MB of binary) as the text: one chunk of 64 tokens.
    let started = std::time::Instant::now();
    let out = edge_llm(
        &[
            "perplexity",
            "-m",
            &m,
            "-f",
            &m,
            "-c",
            "64",
            "--chunks",
            "1",
        ],
        b"",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("PPL = "));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
}

/// Item 6: streamed text cut inside a multi-byte char by `-n`/`max_tokens` ended in U+FFFD.
/// " \"晨" takes tokens 2-4 here: cut at 2 or 3, the char is left out, not replaced.
#[test]
fn text_cut_mid_character_by_max_tokens_has_no_replacement_char() {
    let m = model();
    let prompt = "The Chinese characters for hello are";
    let input: String = (1..=6)
        .map(|n| {
            format!(
                "{}\n",
                serde_json::json!({"prompt": prompt, "max_tokens": n, "temperature": 0})
            )
        })
        .collect();
    let out = edge_llm(&["run", "--jsonl", "-m", &m], input.as_bytes());
    assert!(out.status.success(), "{}", stderr(&out));
    let texts: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let full = &texts[5];
    assert!(
        full.contains('晨'),
        "the model's greedy text changed: {full:?}"
    );
    for (i, t) in texts.iter().enumerate() {
        assert!(!t.contains('\u{FFFD}'), "max_tokens {}: {t:?}", i + 1);
        assert!(
            full.starts_with(t.as_str()),
            "max_tokens {}: {t:?} vs {full:?}",
            i + 1
        );
    }
    assert!(texts[1] == texts[0], "a cut inside the char: {texts:?}");
    // The streaming face: `run -n 2` prints the same as --jsonl's text.
    let out = edge_llm(
        &["run", "-m", &m, "-p", prompt, "-n", "2", "--temp", "0"],
        b"",
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), texts[1]);
}
