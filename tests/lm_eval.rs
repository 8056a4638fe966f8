//! lm-evaluation-harness (PyPI `lm-eval`, installed by scripts/test.sh into target/lmeval-venv)
//! runs `--model local-completions` against `edge-llm serve` on the repository's own tasks
//! (tests/lm_eval/: a multiple-choice task of 215 questions with four choices each, and a short
//! generation task; no dataset hub is reachable). It scores each choice with `echo: true`,
//! `logprobs: 1`, `max_tokens: 1` and the prompt as token ids from the server's own `/tokenize`
//! (its `remote` tokenizer backend, which also reads `/tokenizer_info`).
//!
//! Checks: the harness's accuracy is far from chance; every per-choice log-likelihood it
//! recorded equals a direct computation (the `perplexity` path, `SequenceRunner`, over the same
//! tokens) within 1e-4; and the choices' shared context blocks were reused with their kept
//! scores (`cached_tokens` and the kept-scores gauge), the scores identical to a server that
//! reuses nothing (`--no-prefix-cache`).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use edge_llm::scoring::runner::SequenceRunner;
use serde_json::{json, Value};
use support::harness::Server;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `lm_eval` command (scripts/test.sh installs `lm-eval[api]`).
fn lm_eval_bin() -> Option<PathBuf> {
    let bin = root().join("target/lmeval-venv/bin/lm_eval");
    let ok = Command::new(&bin)
        .arg("--help")
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Some(bin)
    } else {
        support::skip_or_fail(
            "lm-eval is not installed in target/lmeval-venv (scripts/test.sh installs it)",
        );
        None
    }
}

/// The task folder with its YAML files pointing at the repository's data.
fn task_dir(out: &Path) -> PathBuf {
    let data = root().join("tests/lm_eval");
    let dir = out.join("tasks");
    std::fs::create_dir_all(&dir).unwrap();
    for t in ["edge_mc", "edge_gen"] {
        let text = std::fs::read_to_string(data.join(format!("{t}.yaml.in"))).unwrap();
        let text = text.replace("@DATA@", data.to_str().unwrap());
        std::fs::write(dir.join(format!("{t}.yaml")), text).unwrap();
    }
    dir
}

/// Runs the harness against `server`; returns (results JSON, samples of edge_mc, seconds).
fn run_harness(bin: &Path, server: &Server, out: &Path, tasks: &str) -> (Value, Vec<Value>, f64) {
    let tasks_dir = task_dir(out);
    let model_args = format!(
        "base_url=http://{}/v1/completions,tokenizer_backend=remote,model=edge,num_concurrent=1,max_retries=1",
        server.addr
    );
    let started = std::time::Instant::now();
    let output = Command::new(bin)
        .args(["--model", "local-completions", "--model_args", &model_args])
        .args(["--tasks", tasks, "--include_path"])
        .arg(&tasks_dir)
        .arg("--output_path")
        .arg(out.join("results"))
        .arg("--log_samples")
        .env("HF_DATASETS_OFFLINE", "1")
        .env("HF_HUB_OFFLINE", "1")
        .env("TQDM_DISABLE", "1")
        .env("HF_DATASETS_CACHE", out.join("hf-datasets"))
        .current_dir(out)
        .output()
        .expect("running lm_eval");
    let secs = started.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "lm_eval failed:\n{}\n{stderr}\nserver log:\n{}",
        String::from_utf8_lossy(&output.stdout),
        server.log_text()
    );
    let (mut results, mut samples) = (None, Vec::new());
    for entry in walk(&out.join("results")) {
        let name = entry.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&entry).unwrap();
        if name.starts_with("results_") && name.ends_with(".json") {
            results = Some(serde_json::from_str(&text).unwrap());
        } else if name.starts_with("samples_edge_mc") {
            samples.extend(
                text.lines()
                    .map(|l| serde_json::from_str::<Value>(l).unwrap()),
            );
        }
    }
    (results.expect("lm_eval wrote its results"), samples, secs)
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The server's tokens for `text`, as lm-eval's remote tokenizer asks for them.
fn tokenize(server: &Server, text: &str) -> Vec<u32> {
    let (status, v) = server.post(
        "/tokenize",
        &json!({"prompt": text, "add_special_tokens": false}),
    );
    assert_eq!(status, 200, "{v}");
    v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// Sum of the log-probabilities of `tokens[ctx..]`, each given the tokens before it: the
/// perplexity command's path (one sequence straight through the paged cache), in f64.
fn direct_loglik(runner: &mut SequenceRunner, tokens: &[u32], ctx: usize) -> f64 {
    runner.reset();
    let vocab = runner_vocab();
    let logits = runner.eval(tokens, true).unwrap();
    (ctx..tokens.len())
        .map(|i| {
            let row = &logits[(i - 1) * vocab..i * vocab];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let sum: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
            row[tokens[i] as usize] as f64 - max - sum.ln()
        })
        .sum()
}

fn runner_vocab() -> usize {
    support::model().config.vocab_size
}

/// lm-eval's `(context, continuation)` split: the context's trailing spaces move to the
/// continuation; the whole is tokenized at once and the context's token count splits it.
fn encode_pair(server: &Server, context: &str, continuation: &str) -> (Vec<u32>, usize) {
    let trimmed = context.trim_end();
    let moved = &context[trimmed.len()..];
    let whole = tokenize(server, &format!("{trimmed}{moved}{continuation}"));
    let ctx = tokenize(server, trimmed).len();
    (whole, ctx)
}

/// Per sample: each choice's (context, continuation) and the log-likelihood lm-eval recorded.
fn recorded(samples: &[Value]) -> Vec<(String, String, f64)> {
    let mut out = Vec::new();
    for s in samples {
        let args = s["arguments"]
            .as_object()
            .map(|m| m.values().cloned().collect::<Vec<_>>());
        let args = args.unwrap_or_else(|| s["arguments"].as_array().cloned().unwrap_or_default());
        let resps = s["resps"].as_array().expect("resps");
        assert_eq!(args.len(), resps.len(), "{s}");
        for (a, r) in args.iter().zip(resps) {
            let (ctx, cont) = match a {
                Value::Array(v) => (v[0].as_str().unwrap(), v[1].as_str().unwrap()),
                Value::Object(m) => (m["arg_0"].as_str().unwrap(), m["arg_1"].as_str().unwrap()),
                other => panic!("unexpected arguments {other}"),
            };
            let ll = &r[0][0];
            let ll = ll
                .as_f64()
                .or_else(|| ll.as_str().and_then(|s| s.parse().ok()))
                .unwrap_or_else(|| panic!("unexpected response {r}"));
            out.push((ctx.to_string(), cont.to_string(), ll));
        }
    }
    out
}

#[test]
fn lm_eval_local_completions() {
    let Some(bin) = lm_eval_bin() else {
        return;
    };
    let out = std::env::temp_dir().join(format!("edge-llm-lm-eval-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let server = Server::start(&["-c", "4096"]).expect("the server starts");
    let (results, samples, secs) = run_harness(&bin, &server, &out, "edge_mc,edge_gen");
    let acc = results["results"]["edge_mc"]["acc,none"].as_f64().unwrap();
    let em = results["results"]["edge_gen"]["exact_match,none"]
        .as_f64()
        .unwrap();
    eprintln!("lm-eval: edge_mc acc {acc:.3}, edge_gen exact_match {em:.3}, {secs:.1} s");
    assert!(acc > 0.7, "accuracy {acc} is near chance (0.25): {results}");
    assert!(em > 0.5, "exact match {em}: {results}");
    assert_eq!(samples.len(), 215, "one sample per question");

    // The choices shared their context's blocks and its kept scores.
    let kept = server.metric("edge_llm_prompt_scores_kept_blocks");
    let hits = server.metric("edge_llm_prefix_cache_hit_tokens_total");
    eprintln!("kept scored blocks {kept}, prefix-cache hit tokens {hits}");
    assert!(kept >= 30.0 && hits > 5000.0, "kept {kept}, hits {hits}");

    // Every recorded log-likelihood equals the direct computation.
    let model = support::model();
    let mut runner = SequenceRunner::new(model, 512, 16);
    let choices = recorded(&samples);
    assert_eq!(choices.len(), 215 * 4);
    let mut worst = 0.0f64;
    for (ctx, cont, ll) in &choices {
        let (tokens, n_ctx) = encode_pair(&server, ctx, cont);
        let direct = direct_loglik(&mut runner, &tokens, n_ctx);
        worst = worst.max((direct - ll).abs());
        assert!(
            (direct - ll).abs() < 1e-4,
            "{ctx:?} + {cont:?}: lm-eval {ll}, direct {direct}"
        );
    }
    eprintln!("largest difference from the direct computation: {worst:.2e}");
    let _ = std::fs::remove_dir_all(&out);
}

/// The same scores with and without reuse: one question's choices through a server that reuses
/// cached blocks (and their kept scores) and one that reuses nothing answer byte-identical
/// `logprobs`, and the second and later choices report their shared context as cached.
#[test]
fn echo_scores_do_not_depend_on_the_cache() {
    let context = "The capital of Chile is Santiago.\nThe capital of Nepal is Kathmandu.\nThe capital of Mali is Bamako.\nThe capital of Norway is";
    let choices = [" Oslo", " Lima", " Rome", " Vienna and more"];
    // One server at a time (the harness's rule): the reusing one first, then the other.
    let answers = |server: &Server| -> Vec<(Vec<u32>, Value)> {
        choices
            .iter()
            .map(|choice| {
                let tokens = tokenize(server, &format!("{context}{choice}"));
                let body = json!({"prompt": [tokens], "max_tokens": 1, "logprobs": 3, "echo": true, "temperature": 0});
                let (status, v) = server.post("/v1/completions", &body);
                assert_eq!(status, 200, "{v}");
                (tokens, v)
            })
            .collect()
    };
    let fresh = Server::start(&["--no-prefix-cache"]).expect("the server starts");
    let without = answers(&fresh);
    drop(fresh);
    let cached = Server::start(&[]).expect("the server starts");
    let with = answers(&cached);
    for (i, ((tokens, a), (_, b))) in with.iter().zip(&without).enumerate() {
        assert_eq!(a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]);
        assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
        let lp = &a["choices"][0]["logprobs"];
        assert_eq!(lp["tokens"].as_array().unwrap().len(), tokens.len() + 1);
        assert_eq!(lp["token_logprobs"][0], Value::Null);
        let hit = a["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        let none = b["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert_eq!(none, 0);
        if i > 0 {
            assert!(hit >= 32, "choice {i} reused {hit} tokens");
        }
    }
    // Scoring only (max_tokens 0) returns the prompt and nothing more; without echo 0 is refused.
    let (status, v) = cached.post(
        "/v1/completions",
        &json!({"prompt": "One two three", "max_tokens": 0, "echo": true, "logprobs": 1}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], "One two three");
    assert_eq!(v["usage"]["completion_tokens"], 0);
    let (status, v) = cached.post(
        "/v1/completions",
        &json!({"prompt": "One two three", "max_tokens": 0}),
    );
    assert_eq!(status, 400, "{v}");
    // Every block came back.
    cached.wait_for_metrics("blocks back", |s| {
        s.metric("edge_llm_kv_blocks{state=\"used\"}") == 0.0
    });
}
