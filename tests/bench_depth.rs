//! `edge-llm bench --depth N` (like llama-bench -d N) on the real default model: the context is
//! served from the prefix cache, the figures are those after it, and misuse is a one-line error.

mod support;

use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    let m = support::model_path();
    Command::new(env!("CARGO_BIN_EXE_edge-llm"))
        .args([
            "bench",
            "-m",
            &m.to_string_lossy(),
            "-t",
            "2",
            "-r",
            "1",
            "--json",
        ])
        .args(args)
        .output()
        .expect("binary starts")
}

fn last_json(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().expect("a JSON line")).expect("JSON")
}

#[test]
fn decode_and_prompt_are_measured_after_the_context() {
    // -p 0: decode alone after 100 tokens; the context's full blocks (96 tokens of 16) are cached.
    let out = bench(&["-p", "0", "-n", "4", "--depth", "100"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("| tg4 @ d100 |"));
    let j = last_json(&out);
    assert_eq!(j["depth"], 100);
    assert!(j["prompt_tokens_per_s"].is_null(), "{j}");
    assert!(j["gen_tokens_per_s"].as_f64().unwrap() > 0.0, "{j}");
    assert!(
        err.contains("--depth 100: 96 tokens of context from the prefix cache, 4 computed"),
        "{err}"
    );

    // -p 8: the 8 prompt tokens (and the context's last partial block) timed after the context.
    let out = bench(&["-p", "8", "-n", "1", "--depth", "100"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("| pp8 @ d100 |"));
    assert!(last_json(&out)["prompt_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(
        err.contains("--depth 100: 96 tokens of context from the prefix cache, 12 computed"),
        "{err}"
    );
}

#[test]
fn misuse_is_a_one_line_error() {
    for (args, needle) in [
        (&["-p", "0", "-n", "4"][..], "-p may be 0 with --depth"),
        (
            &["--depth", "10", "--sessions", "2", "--shared-prefix", "4"][..],
            "--depth applies to the single-sequence benchmark",
        ),
    ] {
        let out = bench(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}
