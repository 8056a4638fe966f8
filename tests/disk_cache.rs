//! The prefix cache's disk tier, pinned prompts and per-key isolation, end to end: the real
//! `edge-llm serve` on the real models, each test with its own temporary `--cache-dir` (never
//! the user's cache). Servers are stopped with SIGKILL, as a crash would.
//!
//! - A restart serves a long system prompt from disk with the same output (and reports it).
//! - Truncated, bit-flipped and other-model files are rejected with a warning, deleted and
//!   recomputed, with the same output and no crash.
//! - The byte budget is never exceeded.
//! - Two API keys never share cached blocks; pinned prompts are shared and survive eviction.

mod support;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use support::harness::*;
use support::{fetched, model_path, qwen_path, FETCH_EXTRA_MODELS, FETCH_MODEL};

/// A fresh temporary folder, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("edge-llm-disk-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A system prompt of about `rules` * 18 tokens.
fn system_prompt(rules: usize) -> String {
    (1..=rules)
        .map(|i| {
            format!(
                "Rule {i}: always answer politely and mention the number {} when relevant.",
                i * 7
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn body(system: &str, user: &str) -> Value {
    json!({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 16,
        "temperature": 0,
    })
}

/// (text, usage) of one chat request.
fn chat(server: &Server, body: &Value, headers: &[(&str, &str)]) -> (String, Value) {
    let mut h = vec![("Content-Type", "application/json")];
    h.extend_from_slice(headers);
    let r = server.request(
        "POST",
        "/v1/chat/completions",
        &h,
        body.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    (
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string(),
        v["usage"].clone(),
    )
}

fn cached(usage: &Value) -> u64 {
    usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

fn source(usage: &Value, s: &str) -> u64 {
    usage["prompt_tokens_details"]["cached_tokens_sources"][s]
        .as_u64()
        .unwrap()
}

/// The block files under a cache root (every model's folder).
fn block_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for d in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
            if f.path().extension().is_some_and(|e| e == "kv") {
                out.push(f.path());
            }
        }
    }
    out.sort();
    out
}

/// Waits until the write-behind has put `n` blocks on disk.
fn wait_written(server: &Server, n: f64) {
    server.wait_for_metrics("blocks written behind", |s| {
        s.metric("edge_llm_disk_cache_blocks") >= n
    });
}

fn ttft_ms(usage_log: &str) -> u64 {
    usage_log
        .split("ttft=")
        .nth(1)
        .and_then(|t| t.split("ms").next())
        .and_then(|t| t.parse().ok())
        .expect("a ttft in the log line")
}

/// The ttft of the server's last chat request. The server writes a request's log line after the
/// reply has gone out, so the line may land a moment after the client has read the reply: wait for it
/// (a hang guard, not a timing assumption).
fn last_ttft(server: &Server) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let log = server.log_text();
        let line = log
            .lines()
            .rfind(|l| l.contains("POST /v1/chat/completions"))
            .map(str::to_string);
        match line {
            Some(line) => return ttft_ms(&line),
            None if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            None => panic!("no request log line within 30 s:\n{log}"),
        }
    }
}

#[test]
fn a_restart_serves_the_system_prompt_from_disk_with_the_same_output() {
    let dir = TempDir::new("restart");
    let b = body(&system_prompt(24), "What is the capital of France?");
    let (cold_text, cold_usage, cold_ttft, full_blocks) = {
        let Some(server) = Server::start(&["--cache-dir", dir.arg()]) else {
            return;
        };
        let (text, usage) = chat(&server, &b, &[]);
        assert_eq!(
            cached(&usage),
            0,
            "a fresh cache dir holds nothing: {usage}"
        );
        let prompt = usage["prompt_tokens"].as_u64().unwrap();
        assert!(prompt >= 400, "the system prompt is long: {usage}");
        let full_blocks = (prompt - 1) / 16;
        wait_written(&server, full_blocks as f64);
        (text, usage, last_ttft(&server), full_blocks)
    }; // SIGKILL
    assert!(block_files(&dir.0).len() as u64 >= full_blocks);

    let Some(server) = Server::start(&["--cache-dir", dir.arg()]) else {
        return;
    };
    let (text, usage) = chat(&server, &b, &[]);
    let warm_ttft = last_ttft(&server);
    assert_eq!(
        text, cold_text,
        "the restart's output equals the cold run's"
    );
    assert_eq!(cached(&usage), full_blocks * 16, "{usage}");
    assert_eq!(source(&usage, "disk"), full_blocks * 16, "{usage}");
    assert_eq!(source(&usage, "memory"), 0, "{usage}");
    assert_eq!(
        server.metric("edge_llm_disk_cache_hit_blocks_total"),
        full_blocks as f64
    );
    assert_eq!(
        server.metric("edge_llm_disk_cache_rejected_files_total"),
        0.0
    );
    // Only the prompt's tail was computed.
    let computed = server.metric("edge_llm_prompt_tokens_total");
    assert!(
        computed <= 16.0,
        "{computed} prompt tokens computed after the restart"
    );
    // The repeat is a memory hit now.
    let (text2, usage2) = chat(&server, &b, &[]);
    assert_eq!(text2, cold_text);
    assert_eq!(source(&usage2, "memory"), full_blocks * 16, "{usage2}");
    eprintln!(
        "TTFT cold {cold_ttft} ms, after restart {warm_ttft} ms ({:.2}x); cold usage {cold_usage}",
        warm_ttft as f64 / cold_ttft.max(1) as f64
    );
}

/// Fills a cache dir with `model`'s blocks of `b`; returns the cold output.
fn fill(dir: &TempDir, model: &[&str], b: &Value) -> String {
    let mut args = vec!["--cache-dir", dir.arg()];
    args.extend_from_slice(model);
    let server = Server::start(&args).expect("model present");
    let (text, usage) = chat(&server, b, &[]);
    let blocks = (usage["prompt_tokens"].as_u64().unwrap() - 1) / 16;
    wait_written(&server, blocks as f64);
    text
}

/// Restarts on `dir` after damage: the output must equal `cold`, with `warnings` or more
/// warnings logged and as many files rejected, and the server still serving.
fn restart_after_damage(dir: &TempDir, model: &[&str], b: &Value, cold: &str, what: &str) {
    let mut args = vec!["--cache-dir", dir.arg()];
    args.extend_from_slice(model);
    let server = Server::start(&args).expect("model present");
    let (text, usage) = chat(&server, b, &[]);
    assert_eq!(
        text, cold,
        "{what}: the output after recomputation equals the cold run's"
    );
    assert_eq!(
        source(&usage, "disk"),
        0,
        "{what}: nothing damaged is served: {usage}"
    );
    let rejected = server.metric("edge_llm_disk_cache_rejected_files_total");
    assert!(rejected >= 1.0, "{what}: a rejected file is counted");
    // The server prints each warning before counting it, but the harness reads its stderr on
    // another thread, which may not have read the line yet: waited for, then they must match
    // the count exactly.
    let warnings = |log: &str| {
        log.lines()
            .filter(|l| l.contains("warning: disk cache:"))
            .count() as f64
    };
    let log = server.wait_for_log("a warning per rejected file", |log| {
        warnings(log) >= rejected
    });
    assert_eq!(
        warnings(&log),
        rejected,
        "{what}: one warning per rejected file:\n{log}"
    );
    // Still serving, and the same again.
    let (again, _) = chat(&server, b, &[]);
    assert_eq!(again, cold, "{what}");
}

#[test]
fn truncated_and_bit_flipped_files_are_rejected_deleted_and_recomputed() {
    if fetched(model_path(), FETCH_MODEL).is_none() {
        return;
    }
    let b = body(&system_prompt(6), "Name a color.");
    for (what, damage) in [
        ("truncation", 0usize),
        ("bit flip", 1),
        ("torn write (half a file)", 2),
    ] {
        let dir = TempDir::new(&format!("damage-{damage}"));
        let cold = fill(&dir, &[], &b);
        let files = block_files(&dir.0);
        assert!(!files.is_empty());
        for f in &files {
            let mut bytes = std::fs::read(f).unwrap();
            match damage {
                0 => bytes.truncate(bytes.len() - 100),
                1 => {
                    let i = bytes.len() / 2;
                    bytes[i] ^= 0x10;
                }
                _ => bytes.truncate(bytes.len() / 2),
            }
            std::fs::write(f, bytes).unwrap();
        }
        restart_after_damage(&dir, &[], &b, &cold, what);
    }
}

#[test]
fn files_swapped_between_two_models_are_rejected_and_recomputed() {
    if fetched(model_path(), FETCH_MODEL).is_none() {
        return;
    }
    let Some(qwen) = fetched(qwen_path(), FETCH_EXTRA_MODELS) else {
        return;
    };
    let qwen_args = ["-m", qwen.to_str().unwrap()];
    let b = body(&system_prompt(6), "Name a color.");
    let small = TempDir::new("swap-small");
    let big = TempDir::new("swap-big");
    let cold_small = fill(&small, &[], &b);
    let cold_big = fill(&big, &qwen_args, &b);
    let (fs, fb) = (block_files(&small.0), block_files(&big.0));
    assert!(!fs.is_empty() && !fb.is_empty());
    // Each model's file names now hold the other model's blocks.
    let (cs, cb): (Vec<_>, Vec<_>) = (
        fs.iter().map(|f| std::fs::read(f).unwrap()).collect(),
        fb.iter().map(|f| std::fs::read(f).unwrap()).collect(),
    );
    for (i, f) in fs.iter().enumerate() {
        std::fs::write(f, &cb[i % cb.len()]).unwrap();
    }
    for (i, f) in fb.iter().enumerate() {
        std::fs::write(f, &cs[i % cs.len()]).unwrap();
    }
    restart_after_damage(
        &small,
        &[],
        &b,
        &cold_small,
        "default model with qwen's files",
    );
    restart_after_damage(
        &big,
        &qwen_args,
        &b,
        &cold_big,
        "qwen with the default model's files",
    );
}

#[test]
fn the_disk_budget_is_never_exceeded() {
    let dir = TempDir::new("budget");
    let Some(server) = Server::start(&["--cache-dir", dir.arg(), "--cache-disk-mib", "2"]) else {
        return;
    };
    let budget = 2u64 << 20;
    let dir_bytes = || -> u64 {
        block_files(&dir.0)
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len())
            .sum()
    };
    for i in 0..6 {
        let b = body(
            &system_prompt(4 + i),
            &format!("Question {i}: name a fruit."),
        );
        chat(&server, &b, &[]);
        for _ in 0..20 {
            assert!(
                dir_bytes() <= budget,
                "{} bytes on disk, budget {budget}",
                dir_bytes()
            );
            assert!(server.metric("edge_llm_disk_cache_bytes") <= budget as f64);
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
    }
    server.wait_for_metrics("writes to settle", |s| {
        s.metric("edge_llm_disk_cache_written_blocks_total")
            > s.metric("edge_llm_disk_cache_blocks")
    });
    assert!(dir_bytes() <= budget);
    assert!(
        dir_bytes() > budget / 2,
        "the budget is used: {}",
        dir_bytes()
    );
}

#[test]
fn two_api_keys_never_share_cached_blocks() {
    let Some(server) = Server::start(&["--api-key", "key-a", "--api-key", "key-b"]) else {
        return;
    };
    let b = body(&system_prompt(5), "Name a planet.");
    let (a, b_) = (
        [("Authorization", "Bearer key-a")],
        [("Authorization", "Bearer key-b")],
    );
    let (text_a, first) = chat(&server, &b, &a);
    assert_eq!(cached(&first), 0, "{first}");
    let blocks = (first["prompt_tokens"].as_u64().unwrap() - 1) / 16;
    let (text_b, usage_b) = chat(&server, &b, &b_);
    assert_eq!(
        cached(&usage_b),
        0,
        "key B must not hit key A's blocks: {usage_b}"
    );
    let (again_a, usage_a) = chat(&server, &b, &a);
    assert_eq!(
        cached(&usage_a),
        blocks * 16,
        "key A's repeat is cached: {usage_a}"
    );
    let (again_b, usage_b2) = chat(&server, &b, &b_);
    assert_eq!(
        cached(&usage_b2),
        blocks * 16,
        "key B's repeat is cached: {usage_b2}"
    );
    assert!(text_a == text_b && text_a == again_a && again_a == again_b);
    // A wrong key is still refused.
    let r = server.request(
        "POST",
        "/v1/chat/completions",
        &[("Authorization", "Bearer key-c")],
        b.to_string().as_bytes(),
    );
    assert_eq!(r.status, 401, "{}", r.text());
}

/// A tenant never gets, nor can time, another tenant's compiled grammar (issue 30, item 8: the
/// grammar cache was shared across keys, so key B could tell whether key A had used a schema,
/// 0.02 s against 0.6 s). Each key compiles its own; a key's repeat is a hit.
#[test]
fn two_api_keys_never_share_compiled_grammars() {
    let Some(server) = Server::start(&[
        "--api-key",
        "key-a",
        "--api-key",
        "key-b",
        "--admin-api-key",
        "admin",
    ]) else {
        return;
    };
    let schema = json!({
        "type": "object",
        "properties": {"planet": {"enum": ["Mercury", "Venus", "Earth", "Mars"]}},
        "required": ["planet"]
    });
    let mut b = body(&system_prompt(6), "Name a planet as JSON.");
    b["response_format"] =
        json!({"type": "json_schema", "json_schema": {"name": "p", "schema": schema}});
    // The server-wide counters: an admin's view (a key sees only its own).
    let counters = || {
        let r = server.request("GET", "/metrics", &[("Authorization", "Bearer admin")], b"");
        assert_eq!(r.status, 200, "{}", r.text());
        let text = r.text();
        let sample = |name: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in /metrics"))
        };
        (
            sample("edge_llm_grammars_compiled_total"),
            sample("edge_llm_grammar_cache_hits_total"),
        )
    };
    let (a, b_) = (
        [("Authorization", "Bearer key-a")],
        [("Authorization", "Bearer key-b")],
    );
    assert_eq!(counters(), (0, 0));
    let (text_a, _) = chat(&server, &b, &a);
    let (again_a, _) = chat(&server, &b, &a);
    assert_eq!(counters(), (1, 1), "key A's repeat is a hit");
    let (text_b, _) = chat(&server, &b, &b_);
    assert_eq!(
        counters(),
        (2, 1),
        "key B compiles its own, never served from key A's"
    );
    assert!(
        text_a == again_a && text_a == text_b,
        "the same constrained reply"
    );
}

#[test]
fn pinned_prompts_survive_a_workload_that_evicts_everything_else() {
    if fetched(model_path(), FETCH_MODEL).is_none() {
        return;
    }
    let dir = TempDir::new("pins");
    let system = system_prompt(6);
    let pin_file = dir.0.join("system.json");
    std::fs::write(
        &pin_file,
        json!([{"role": "system", "content": system}]).to_string(),
    )
    .unwrap();
    // 12 MiB of KV: 34 blocks of 16 tokens.
    let server = Server::start(&[
        "--kv-mem",
        "12",
        "-c",
        "512",
        "--pin-prompt",
        pin_file.to_str().unwrap(),
        "--admin-api-key",
        "key-a",
        "--api-key",
        "key-b",
    ])
    .unwrap();
    let auth = [("Authorization", "Bearer key-a")];
    let get = server.request("GET", "/v1/cache", &auth, b"");
    assert_eq!(get.status, 200, "{}", get.text());
    let info: Value = serde_json::from_slice(&get.body).unwrap();
    let pinned_blocks = info["memory"]["blocks_pinned"].as_u64().unwrap();
    assert!(pinned_blocks >= 5, "{info}");
    assert_eq!(
        info["pinned"][0]["prompt_tokens"].as_u64().unwrap() / 16,
        pinned_blocks
    );
    // A workload of distinct long prompts that cycles the whole pool several times.
    let evictions = || -> f64 {
        let text = server.request("GET", "/metrics", &auth, b"").text();
        text.lines()
            .find_map(|l| l.strip_prefix("edge_llm_prefix_cache_evictions_total "))
            .expect("evictions in /metrics")
            .parse()
            .unwrap()
    };
    let before = evictions();
    for i in 0..6 {
        let filler =
            format!("Story {i}: ") + &"the quick brown fox jumps over the lazy dog ".repeat(30);
        let r = server.request(
            "POST",
            "/v1/completions",
            &[("Content-Type", "application/json"), auth[0]],
            completion_body(&filler, json!({"max_tokens": 4}))
                .to_string()
                .as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let evicted = evictions() - before;
    assert!(evicted >= 34.0, "the workload evicted {evicted} blocks");
    // Both keys still get the pinned system prompt.
    for key in ["Bearer key-a", "Bearer key-b"] {
        let (_, usage) = chat(
            &server,
            &body(&system, "Name a color."),
            &[("Authorization", key)],
        );
        assert_eq!(
            source(&usage, "pinned"),
            pinned_blocks * 16,
            "{key}: {usage}"
        );
    }
    // POST /v1/cache/pin pins another prompt; GET lists it.
    let r = server.request(
        "POST",
        "/v1/cache/pin",
        &[("Content-Type", "application/json"), auth[0]],
        json!({"prompt": system_prompt(2)}).to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let info: Value =
        serde_json::from_slice(&server.request("GET", "/v1/cache", &auth, b"").body).unwrap();
    assert_eq!(info["pinned"].as_array().unwrap().len(), 2, "{info}");
    assert!(info["memory"]["blocks_pinned"].as_u64().unwrap() > pinned_blocks);
    // Bad bodies: a 400 naming the field; no key: 401.
    let r = server.request(
        "POST",
        "/v1/cache/pin",
        &[("Content-Type", "application/json"), auth[0]],
        json!({"prompt": 5}).to_string().as_bytes(),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("prompt"), "{}", r.text());
    assert_eq!(server.request("GET", "/v1/cache", &[], b"").status, 401);
}

// ---- issue 30: the model's identity, and what a shared cache folder may hold ----

/// A prompt whose first block differs from every other tag's (a chain of its own).
fn tagged(tag: &str) -> Value {
    body(
        &format!("{tag} {}", system_prompt(6)),
        "Name a color, please.",
    )
}

/// Serves each prompt once on `dir`, waiting for its blocks to be written; returns each
/// prompt's cold output and the block files it added.
fn fill_each(dir: &TempDir, prompts: &[Value]) -> Vec<(String, Vec<PathBuf>)> {
    let server = Server::start(&["--cache-dir", dir.arg()]).expect("model present");
    let mut out = Vec::new();
    let mut blocks = 0;
    for b in prompts {
        let before = block_files(&dir.0);
        let (text, usage) = chat(&server, b, &[]);
        blocks += (usage["prompt_tokens"].as_u64().unwrap() - 1) / 16;
        wait_written(&server, blocks as f64);
        let added = block_files(&dir.0)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        out.push((text, added));
    }
    out
}

fn disk_warnings(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("warning: disk cache:"))
        .collect()
}

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

#[test]
fn a_copy_of_the_model_with_8_mib_zeroed_in_the_middle_gets_no_block_from_the_originals_files() {
    let Some(original) = fetched(model_path(), FETCH_MODEL) else {
        return;
    };
    let dir = TempDir::new("zeroed-copy");
    let b = body(&system_prompt(12), "Name a color.");
    fill(&dir, &[], &b);
    // Same name, same size, same first and last MiB.
    let copies = TempDir::new("zeroed-copy-model");
    let copy = copies.0.join(original.file_name().unwrap());
    let mut bytes = std::fs::read(&original).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid - (4 << 20)..mid + (4 << 20)].fill(0);
    std::fs::write(&copy, &bytes).unwrap();
    drop(bytes);
    let server = Server::start(&["--cache-dir", dir.arg(), "-m", copy.to_str().unwrap()])
        .expect("model present");
    let (_, usage) = chat(&server, &b, &[]);
    assert_eq!(
        cached(&usage),
        0,
        "the zeroed copy must not load the original's blocks: {usage}"
    );
    assert_eq!(server.metric("edge_llm_disk_cache_hit_blocks_total"), 0.0);
}

#[test]
fn a_planted_symlink_named_like_a_temporary_file_never_makes_the_server_write_outside_the_folder() {
    if fetched(model_path(), FETCH_MODEL).is_none() {
        return;
    }
    let dir = TempDir::new("tmp-link");
    let outside = TempDir::new("tmp-link-outside");
    let victim = outside.0.join("victim");
    let precious = b"precious: not the disk cache's".to_vec();
    std::fs::write(&victim, &precious).unwrap();
    let b = tagged("Apples.");
    let filled = fill_each(&dir, std::slice::from_ref(&b));
    let (cold, files) = &filled[0];
    assert!(!files.is_empty());
    // The blocks are gone, so the next server writes them again: under every name an old
    // server would have used for its temporary files, a link to the victim waits.
    for f in files {
        std::fs::remove_file(f).unwrap();
    }
    let server = Server::start(&["--cache-dir", dir.arg()]).expect("model present");
    for f in files {
        let hash = f.file_stem().unwrap().to_str().unwrap();
        let tmp = f.with_file_name(format!("{hash}.{}.tmp", server.pid()));
        std::os::unix::fs::symlink(&victim, tmp).unwrap();
    }
    let (text, usage) = chat(&server, &b, &[]);
    assert_eq!(&text, cold);
    let blocks = (usage["prompt_tokens"].as_u64().unwrap() - 1) / 16;
    wait_written(&server, blocks as f64);
    // The gauge counts a block when its space is reserved, before its file is renamed into
    // place: the restart below needs every file there.
    server.wait_for_metrics("block files renamed into place", |s| {
        s.metric("edge_llm_disk_cache_written_blocks_total") >= blocks as f64
    });
    let now = std::fs::read(&victim).unwrap();
    assert!(
        now == precious,
        "a file outside the cache folder was written ({} bytes now)",
        now.len()
    );
    for f in files {
        // A block being rewritten at this moment (temporary file, then rename) may be absent;
        // what is there is never a link.
        if let Ok(meta) = std::fs::symlink_metadata(f) {
            assert!(meta.is_file(), "{} is a regular file", f.display());
        }
    }
    // Still serving, from the blocks written.
    drop(server);
    let server = Server::start(&["--cache-dir", dir.arg()]).expect("model present");
    let (text, usage) = chat(&server, &b, &[]);
    assert_eq!(&text, cold);
    assert_eq!(source(&usage, "disk"), blocks * 16, "{usage}");
}

#[test]
fn a_fifo_and_symlinks_named_like_block_files_are_refused_and_other_blocks_still_load() {
    if fetched(model_path(), FETCH_MODEL).is_none() {
        return;
    }
    let dir = TempDir::new("planted");
    let outside = TempDir::new("planted-outside");
    // A large file the server must not read, and must not change.
    let large = outside.0.join("large");
    let large_bytes: Vec<u8> = (0..16u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&large, &large_bytes).unwrap();
    let prompts = [
        tagged("Link."),
        tagged("Fifo."),
        tagged("Zero."),
        tagged("Plain."),
    ];
    let filled = fill_each(&dir, &prompts);
    let plant = |which: usize| {
        for f in &filled[which].1 {
            // The block, or what the last plant left (deleted once refused, else still there).
            let _ = std::fs::remove_file(f);
            match which {
                0 => std::os::unix::fs::symlink(&large, f).unwrap(),
                1 => mkfifo(f),
                _ => std::os::unix::fs::symlink("/dev/zero", f).unwrap(),
            }
        }
    };

    // Planted while the server runs: the index lists them, the loads meet them.
    let server = Server::start(&["--cache-dir", dir.arg()]).expect("model present");
    for which in 0..3 {
        plant(which);
    }
    for (which, (cold, _)) in filled.iter().enumerate().take(3) {
        let (text, usage) = chat(&server, &prompts[which], &[]);
        assert_eq!(&text, cold, "prompt {which}");
        assert_eq!(source(&usage, "disk"), 0, "prompt {which}: {usage}");
    }
    let (text, usage) = chat(&server, &prompts[3], &[]);
    assert_eq!(&text, &filled[3].0);
    assert!(
        source(&usage, "disk") > 0,
        "the untouched prompt still loads: {usage}"
    );
    let log = server.wait_for_log("a warning per refused file", |log| {
        disk_warnings(log).len() >= 3
    });
    for what in ["symbolic link", "not a regular file"] {
        assert!(
            disk_warnings(&log).iter().any(|l| l.contains(what)),
            "a warning says {what:?}:\n{log}"
        );
    }
    assert!(server.metric("edge_llm_disk_cache_rejected_files_total") >= 3.0);
    drop(server);

    // Planted before a start: the index skips them with one warning.
    for which in 0..3 {
        plant(which);
    }
    let server = Server::start(&["--cache-dir", dir.arg()]).expect("model present");
    let (text, usage) = chat(&server, &prompts[3], &[]);
    assert_eq!(&text, &filled[3].0);
    assert!(source(&usage, "disk") > 0, "{usage}");
    let (text, usage) = chat(&server, &prompts[1], &[]);
    assert_eq!(&text, &filled[1].0);
    assert_eq!(source(&usage, "disk"), 0, "{usage}");
    let log = server.log_text();
    let skipped: Vec<_> = disk_warnings(&log)
        .into_iter()
        .filter(|l| l.contains("not regular files"))
        .collect();
    assert_eq!(
        skipped.len(),
        1,
        "one warning for the skipped entries:\n{log}"
    );
    assert!(
        std::fs::read(&large).unwrap() == large_bytes,
        "the linked file outside the folder is unchanged"
    );
}

/// Issue 30, item 9: two servers on one folder used twice its budget, and a new server deleted
/// the other's in-flight temporary files. Now the first takes the model's folder; a second on
/// the same folder runs without the disk tier, saying which process holds it, and still serves;
/// once the first is gone, the folder is free again.
#[test]
fn a_second_server_on_the_same_folder_runs_without_the_disk_tier_and_says_why() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let Some(model) = fetched(model_path(), FETCH_MODEL) else {
        return;
    };
    let dir = TempDir::new("two-servers");
    let b = body(&system_prompt(6), "Name a color.");
    let first = Server::start(&["--cache-dir", dir.arg()]).expect("model present");
    let (cold, usage) = chat(&first, &b, &[]);
    wait_written(
        &first,
        ((usage["prompt_tokens"].as_u64().unwrap() - 1) / 16) as f64,
    );
    // The harness runs one server at a time: the second is started here, up to its
    // "listening" line.
    let mut second = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
        .args([
            "serve",
            "--port",
            "0",
            "-c",
            "1024",
            "--cache-dir",
            dir.arg(),
            "-m",
        ])
        .arg(&model)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = Vec::new();
    for line in BufReader::new(second.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        let listening = line.contains("listening on");
        log.push(line);
        if listening {
            break;
        }
    }
    let _ = second.kill();
    let _ = second.wait();
    let refusal = log
        .iter()
        .find(|l| l.contains("the disk cache is off"))
        .unwrap_or_else(|| panic!("no refusal in the second server's log:\n{}", log.join("\n")));
    assert!(
        refusal.contains("in use by another edge-llm process")
            && refusal.contains(&format!("pid {}", first.pid())),
        "{refusal}"
    );
    assert!(
        log.iter().any(|l| l.contains("listening on")),
        "{}",
        log.join("\n")
    );
    // The first keeps its tier.
    let info: Value =
        serde_json::from_slice(&first.request("GET", "/v1/cache", &[], b"").body).unwrap();
    assert_eq!(info["disk"]["enabled"], true, "{info}");
    drop(first);
    let third = Server::start(&["--cache-dir", dir.arg()]).expect("model present");
    let (text, usage) = chat(&third, &b, &[]);
    assert_eq!(text, cold);
    assert!(
        source(&usage, "disk") > 0,
        "the folder is free again: {usage}"
    );
}

#[test]
fn a_tier_written_with_f16_is_not_read_back_with_q8_0() {
    // The KV cache types are part of the tier's identity: a q8_0 server on a folder an f16
    // server filled loads nothing (reading f16 bytes as q8_0 blocks would be garbage), computes
    // and writes its own blocks, which its restart reads back with the same output; the f16
    // blocks are still there for an f16 server.
    let dir = TempDir::new("kv-types");
    let b = body(&system_prompt(24), "What is the capital of France?");
    let q8: [&str; 6] = ["--cache-dir", dir.arg(), "-ctk", "q8_0", "-ctv", "q8_0"];
    let (f16_text, full_blocks) = {
        let Some(server) = Server::start(&["--cache-dir", dir.arg()]) else {
            return;
        };
        let (text, usage) = chat(&server, &b, &[]);
        let full_blocks = (usage["prompt_tokens"].as_u64().unwrap() - 1) / 16;
        wait_written(&server, full_blocks as f64);
        (text, full_blocks)
    }; // SIGKILL
    let f16_files = block_files(&dir.0);
    assert!(f16_files.len() as u64 >= full_blocks);

    let q8_text = {
        let Some(server) = Server::start(&q8) else {
            return;
        };
        let (text, usage) = chat(&server, &b, &[]);
        assert_eq!(cached(&usage), 0, "f16 blocks read as q8_0: {usage}");
        assert_eq!(server.metric("edge_llm_disk_cache_hit_blocks_total"), 0.0);
        let (_, metrics) = server.get("/metrics");
        assert!(
            metrics.contains("edge_llm_kv_pool_bytes{cache_type_k=\"q8_0\",cache_type_v=\"q8_0\"}"),
            "{metrics}"
        );
        wait_written(&server, full_blocks as f64);
        text
    };
    assert!(block_files(&dir.0).len() >= 2 * f16_files.len());

    let Some(server) = Server::start(&q8) else {
        return;
    };
    let (text, usage) = chat(&server, &b, &[]);
    assert_eq!(text, q8_text, "q8_0's own blocks from disk give its output");
    assert_eq!(source(&usage, "disk"), full_blocks * 16, "{usage}");
    drop(server);

    let Some(server) = Server::start(&["--cache-dir", dir.arg()]) else {
        return;
    };
    let (text, usage) = chat(&server, &b, &[]);
    assert_eq!(text, f16_text);
    assert_eq!(source(&usage, "disk"), full_blocks * 16, "{usage}");
}
