//! Recurrent-state snapshots as cached blocks (issue 29), through the engine on the synthetic
//! `lfm2` file (`scripts/synth/synth.py models target/synth` writes it):
//!
//! - The disk tier keeps a snapshot beside the block it ends (`<hash>.state`): after a restart
//!   the first request resumes from it (`cached_tokens` says so) with the same greedy output;
//!   a bit-flipped, truncated or another model's snapshot file is rejected, deleted and the
//!   prompt recomputed, same output.
//! - A snapshot goes with its block (evicted from the pool, it is dropped), is isolated per
//!   cache key (an API key) like blocks, and `cached_tokens` and the prefix-cache counters
//!   count only what was skipped: KV blocks matched past the deepest snapshot are not.
//! - The real `edge-llm serve`, killed and started again on its `--cache-dir`: the same chat
//!   resumes from the snapshot read back (`cached_tokens`, all from disk), and `/metrics` shows
//!   the state slots, the snapshots held and their bytes, and the snapshots on disk.
//! - Memory: the state slots and snapshots in the metrics, a budget too small for the states
//!   refused at start-up in one line, and a dense `state_snapshot_every` never holds more
//!   snapshots than the budget's snapshot slots.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edge_llm::engine::disk_cache::DiskCacheConfig;
use edge_llm::engine::kv_events::{KvCacheEvent, KvEventSink};
use edge_llm::engine::sampler::SamplingParams;
use edge_llm::engine::{EngineConfig, EngineHandle, EngineParts, Event, Metrics};
use edge_llm::model::Model;
use support::{request, wait_idle};

fn load() -> Option<(Arc<Model>, Vec<u32>)> {
    let r = support::synth::json("tests/synth/lfm2.json");
    let path = support::synth::model_file(&r, "LLAMA_CPP=newest scripts/synth/refs.sh lfm2")?;
    let model = Model::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    let tokens = r["tokens"].as_array().unwrap();
    let tokens = tokens.iter().map(|x| x.as_u64().unwrap() as u32).collect();
    Some((Arc::new(model), tokens))
}

fn config(num_blocks: usize, slots: usize) -> EngineConfig {
    EngineConfig {
        block_size: 16,
        num_blocks,
        max_seq_len: 256.min(num_blocks * 16),
        max_batched_tokens: 512,
        max_seqs: 8,
        max_queue: 8,
        max_step_ms: None,
        mask_budget_ms: EngineConfig::DEFAULT_MASK_BUDGET_MS,
        kv_types: edge_llm::kernels::KvTypes::F16,
        num_state_slots: slots,
    }
}

/// A fresh temporary folder, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("edge-llm-snap-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn disk_parts(dir: &Path) -> EngineParts {
    EngineParts {
        disk: Some(DiskCacheConfig {
            root: dir.to_path_buf(),
            budget_bytes: 64 << 20,
        }),
        ..EngineParts::default()
    }
}

/// Starts an engine on the disk tier under `dir`; a restart waits for the engine before it
/// (its thread ends soon after its handle is dropped) to let go of the folder's lock.
fn start_on_disk(model: &Arc<Model>, dir: &Path) -> EngineHandle {
    start_on_disk_with(model, dir, None)
}

/// As `start_on_disk`, publishing KV events to `sink`.
fn start_on_disk_with(model: &Arc<Model>, dir: &Path, sink: Option<KvEventSink>) -> EngineHandle {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let parts = EngineParts {
            kv_events: sink.clone(),
            ..disk_parts(dir)
        };
        let e = EngineHandle::start(Arc::clone(model), config(64, 4), parts).unwrap();
        if e.metrics().unwrap().disk_cache.is_some() {
            return e;
        }
        assert!(Instant::now() < deadline, "the disk tier never came on");
        drop(e);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A greedy completion of `prompt` under cache key `key` and its `cached_tokens`.
fn run(e: &EngineHandle, prompt: &[u32], cache: bool, key: Option<u64>) -> (Vec<u32>, usize) {
    let mut req = request(prompt, 12, SamplingParams::greedy());
    req.cache_prompt = cache;
    req.cache_key = key;
    let mut stream = e.submit(req).unwrap();
    let mut out = Vec::new();
    while let Some(ev) = stream.next_blocking() {
        match ev {
            Event::Token { token, .. } => out.push(token),
            Event::Finished { usage, .. } => return (out, usage.cached_tokens),
            Event::Error(err) => panic!("{err}"),
            _ => {}
        }
    }
    panic!("no Finished event")
}

/// Waits until the disk tier holds at least `blocks` blocks and `states` snapshots.
fn wait_on_disk(e: &EngineHandle, blocks: u64, states: u64) -> Metrics {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = wait_idle(e);
        let d = m.disk_cache.expect("the disk tier is on");
        if d.blocks >= blocks && d.states >= states {
            return m;
        }
        assert!(Instant::now() < deadline, "never written: {d:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The files of `kind` (extension) under the cache root (every model's folder).
fn files(root: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for d in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
            if f.path().extension().is_some_and(|e| e == ext) {
                out.push(f.path());
            }
        }
    }
    out
}

#[test]
fn a_restart_resumes_from_the_snapshot_on_disk_with_the_same_output() {
    let Some((model, t)) = load() else { return };
    let dir = TempDir::new("restart");
    let (prompt, longer) = (t[..50].to_vec(), t[..90].to_vec());
    let e = start_on_disk(&model, &dir.0);
    let want = run(&e, &prompt, false, None);
    let want_longer = run(&e, &longer, false, None);
    // Computed, its state kept at token 48 (the prompt's last full block) and written beside
    // that block; the prompt's three blocks written behind when it ends.
    assert_eq!(run(&e, &prompt, true, None), (want.0.clone(), 0));
    let m = wait_on_disk(&e, 3, 1);
    let d = m.disk_cache.unwrap();
    println!(
        "before the restart: {d:?}, {} snapshot held",
        m.state_snapshots
    );
    assert_eq!((d.states, d.written_states), (1, 1), "one snapshot on disk");
    assert_eq!(files(&dir.0, "state").len(), 1);
    drop(e);

    let (sink, mut events) = KvEventSink::new(64);
    let e = start_on_disk_with(&model, &dir.0, Some(sink));
    let m = e.metrics().unwrap();
    assert_eq!((m.disk_cache.unwrap().states, m.state_snapshots), (1, 0));
    // The first request after the restart loads the chain and the snapshot, and skips 48.
    assert_eq!(run(&e, &prompt, true, None), (want.0.clone(), 48));
    let m = wait_idle(&e);
    let d = m.disk_cache.unwrap();
    println!(
        "after the restart: {d:?}, {} snapshot held",
        m.state_snapshots
    );
    assert_eq!((d.hit_states, d.hit_blocks), (1, 3));
    assert_eq!(m.prefix_cache.hit_tokens, 48);
    // A router hears of the chain read back, as far as its snapshot: 3 blocks, tokens 0..48.
    let mut stored = || {
        let mut out = Vec::new();
        while let Ok(batch) = events.try_recv() {
            for e in batch {
                if let KvCacheEvent::BlockStored {
                    block_hashes,
                    token_ids,
                    ..
                } = e
                {
                    out.push((block_hashes.len(), token_ids));
                }
            }
        }
        out
    };
    assert_eq!(stored(), [(3, prompt[..48].to_vec())]);
    // A longer prompt continuing it resumes there too, the same as computed whole; its own
    // snapshot at 80 announces the two blocks after 48.
    assert_eq!(run(&e, &longer, true, None), (want_longer.0, 48));
    wait_idle(&e);
    assert_eq!(stored(), [(2, longer[48..80].to_vec())]);
    // Another cache key (API key) never resumes from it.
    assert_eq!(run(&e, &prompt, true, Some(7)), (want.0, 0));
}

#[test]
fn a_damaged_or_foreign_snapshot_file_is_rejected_and_the_prompt_recomputed() {
    let Some((model, t)) = load() else { return };
    let dir = TempDir::new("damage");
    let prompt = t[..50].to_vec();
    let e = start_on_disk(&model, &dir.0);
    let want = run(&e, &prompt, false, None).0;
    assert_eq!(run(&e, &prompt, true, None), (want.clone(), 0));
    wait_on_disk(&e, 3, 1);
    drop(e);
    let damages: [(&str, fn(&mut Vec<u8>)); 3] = [
        ("a flipped bit", |b| {
            let n = b.len() / 2;
            b[n] ^= 0x10
        }),
        ("truncated", |b| b.truncate(b.len() - 100)),
        // Another model's tier: its identity (bytes 12..20) differs.
        ("another model's", |b| b[12] ^= 0xff),
    ];
    for (what, damage) in damages {
        let state = files(&dir.0, "state");
        assert_eq!(state.len(), 1, "{what}: one snapshot file");
        let mut bytes = std::fs::read(&state[0]).unwrap();
        damage(&mut bytes);
        std::fs::write(&state[0], &bytes).unwrap();
        let e = start_on_disk(&model, &dir.0);
        // The blocks load, the snapshot does not: the prompt is computed from token 0, the
        // same, and its new snapshot written again.
        assert_eq!(run(&e, &prompt, true, None), (want.clone(), 0), "{what}");
        let m = wait_on_disk(&e, 3, 1);
        let d = m.disk_cache.unwrap();
        assert_eq!((d.rejected_files, d.hit_states), (1, 0), "{what}: {d:?}");
        assert_eq!(d.written_states, 1, "{what}: written again");
        drop(e);
    }
    // And read back once whole.
    let e = start_on_disk(&model, &dir.0);
    assert_eq!(run(&e, &prompt, true, None), (want, 48));
}

#[test]
fn a_snapshot_stays_with_its_cache_key() {
    let Some((model, t)) = load() else { return };
    let e = EngineHandle::start(Arc::clone(&model), config(64, 4), EngineParts::default()).unwrap();
    let a = t[..50].to_vec();
    let want = run(&e, &a, false, None).0;
    assert_eq!(run(&e, &a, true, Some(1)), (want.clone(), 0));
    assert_eq!(
        run(&e, &a, true, Some(1)),
        (want.clone(), 48),
        "key 1 resumes"
    );
    assert_eq!(
        run(&e, &a, true, Some(2)),
        (want.clone(), 0),
        "key 2 does not"
    );
    assert_eq!(
        run(&e, &a, true, None),
        (want.clone(), 0),
        "no key does not"
    );
    assert_eq!(run(&e, &a, true, Some(2)), (want, 48), "key 2 from its own");
    let m = wait_idle(&e);
    assert_eq!(m.state_snapshots, 3, "one per key");
    assert_eq!(
        m.prefix_cache.hit_tokens,
        2 * 48,
        "only the resumed tokens count"
    );
}

#[test]
fn snapshots_are_evicted_with_their_blocks() {
    let Some((model, t)) = load() else { return };
    // 8 blocks of 16: two prompts of 50 (4 blocks each with their answers) fill the pool.
    let e = EngineHandle::start(Arc::clone(&model), config(8, 4), EngineParts::default()).unwrap();
    let (a, b, c) = (t[..50].to_vec(), t[100..150].to_vec(), t[150..200].to_vec());
    let want = run(&e, &a, true, None).0;
    assert_eq!(run(&e, &a, true, None), (want.clone(), 48));
    // b takes the pool's other blocks, c then evicts a's (the least recently used): a's
    // snapshot goes with them (a free snapshot slot was left), and a is computed again.
    run(&e, &b, true, None);
    assert_eq!(wait_idle(&e).state_snapshots, 2);
    run(&e, &c, true, None);
    let m = wait_idle(&e);
    assert_eq!(
        m.state_snapshots, 2,
        "b's and c's; a's went with its blocks"
    );
    assert_eq!(run(&e, &a, true, None), (want, 0));
}

#[test]
fn kv_blocks_matched_past_the_deepest_snapshot_are_not_counted_as_cached() {
    let Some((model, t)) = load() else { return };
    let parts = EngineParts {
        state_snapshot_every: 0, // only at a prompt's last full block
        ..EngineParts::default()
    };
    let e = EngineHandle::start(Arc::clone(&model), config(64, 4), parts).unwrap();
    let long = t[..90].to_vec();
    // Shares 70 tokens (4 full blocks) with `long`, whose only snapshot is at 80.
    let short: Vec<u32> = t[..70].iter().chain(&t[200..210]).copied().collect();
    let want = run(&e, &short, false, None);
    assert_eq!(run(&e, &long, true, None).1, 0);
    let before = wait_idle(&e).prefix_cache;
    assert_eq!(
        run(&e, &short, true, None),
        (want.0, 0),
        "4 KV blocks match, no snapshot"
    );
    let after = wait_idle(&e).prefix_cache;
    assert_eq!(
        after.hit_tokens, before.hit_tokens,
        "nothing skipped, nothing counted"
    );
    assert_eq!(after.hit_blocks, before.hit_blocks);
}

#[test]
fn state_slots_and_snapshots_are_in_the_metrics_and_out_of_the_kv_budget() {
    let Some((model, t)) = load() else { return };
    let slot_bytes = 4 * model.config.state_floats() as u64;
    // Snapshots at every block: a 90-token prompt has 5 points, the pool 4 snapshot slots.
    let parts = EngineParts {
        state_snapshot_every: 1,
        ..EngineParts::default()
    };
    let cfg =
        EngineConfig::sized(&model, edge_llm::kernels::KvTypes::F16, 16, Some(1), 256, 4).unwrap();
    assert_eq!(cfg.num_state_slots, 4);
    let state_bytes = cfg.state_bytes(&model) as u64;
    assert_eq!(
        state_bytes,
        8 * slot_bytes,
        "4 running and 4 snapshot slots"
    );
    let per_block = (cfg.kv_bytes(&model) as u64 - state_bytes) / cfg.num_blocks as u64;
    assert!(cfg.kv_bytes(&model) as u64 <= 1 << 20, "inside --kv-mem 1");
    assert!(
        (1 << 20) - (cfg.kv_bytes(&model) as u64) < per_block,
        "the rest is blocks"
    );
    let e = EngineHandle::start(Arc::clone(&model), cfg, parts).unwrap();
    run(&e, &t[..90], true, None);
    let m = wait_idle(&e);
    assert_eq!((m.state_slots_total, m.state_slots_free), (4, 4));
    assert_eq!(m.state_snapshots, 4, "no more than the snapshot slots");
    assert_eq!(
        (m.state_snapshot_bytes, m.state_slot_bytes),
        (4 * slot_bytes, slot_bytes)
    );
    // A budget that cannot hold the states of --parallel sequences: one line at start-up.
    let err = EngineConfig::sized(
        &model,
        edge_llm::kernels::KvTypes::F16,
        16,
        Some(1),
        256,
        100,
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(
        err.contains("does not hold the recurrent state of 100 sequences") && !err.contains('\n'),
        "{err}"
    );
}

/// The binary's start-up memory line names the state slots, the snapshot slots and their bytes;
/// a `--kv-mem` too small for the states of `--parallel` sequences is one error line.
#[test]
fn the_start_up_line_counts_the_state_slots_and_a_pool_too_small_is_one_line() {
    let Some((model, _)) = load() else { return };
    let m = model.file.path().to_string_lossy().into_owned();
    let bench = |parallel: &str| {
        let args = [
            "bench",
            "-m",
            &m,
            "--kv-mem",
            "1",
            "-c",
            "256",
            "--parallel",
            parallel,
            "-p",
            "8",
            "-n",
            "2",
            "-r",
            "1",
        ];
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_edge-llm"))
            .args(args)
            .output()
            .expect("binary starts");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, err) = bench("4");
    assert!(ok, "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("KV cache on cpu"))
        .unwrap_or_else(|| panic!("no KV cache line: {err}"));
    let slot_kib = model.config.state_floats() as f64 * 4.0 / 1024.0;
    let want = format!(
        "4 recurrent state slots and 4 snapshot slots (0.1 MiB, {slot_kib:.1} KiB each) in it"
    );
    assert!(line.contains(&want), "{line}");
    let (ok, err) = bench("100");
    assert!(!ok, "a pool too small for the states ran");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("does not hold the recurrent state of 100 sequences"),
        "{err}"
    );
}

/// (reply text, prompt tokens, cached tokens, of which from disk) of one chat.
fn chat(server: &support::harness::Server, body: &serde_json::Value) -> (String, u64, u64, u64) {
    let (status, v) = server.post("/v1/chat/completions", body);
    assert_eq!(status, 200, "{v}");
    let u = &v["usage"];
    let d = &u["prompt_tokens_details"];
    (
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string(),
        u["prompt_tokens"].as_u64().unwrap(),
        d["cached_tokens"].as_u64().unwrap(),
        d["cached_tokens_sources"]["disk"].as_u64().unwrap(),
    )
}

#[test]
fn serve_resumes_from_the_snapshot_on_disk_after_a_kill_and_shows_it_in_metrics() {
    use support::harness::Server;
    let Some((model, _)) = load() else { return };
    let m = model.file.path().to_string_lossy().into_owned();
    let dir = TempDir::new("serve");
    let d = dir.0.to_string_lossy().into_owned();
    let system: Vec<String> = (1..=25)
        .map(|i| {
            format!(
                "Rule {i}: always answer politely and mention the number {} when relevant.",
                i * 7
            )
        })
        .collect();
    let body = serde_json::json!({
        "messages": [
            {"role": "system", "content": system.join(" ")},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        "max_tokens": 12,
        "temperature": 0,
    });
    let args = ["-m", &m, "--cache-dir", &d];
    let Some(server) = Server::start(&args) else {
        return;
    };
    let (text, prompt_tokens, cached, _) = chat(&server, &body);
    assert_eq!(cached, 0);
    // The snapshot at the prompt's last full block is what a restart resumes from.
    let full = (prompt_tokens - 1) / 16;
    server.wait_for_metrics("the prompt's blocks and snapshot on disk", |s| {
        s.metric("edge_llm_disk_cache_state_snapshots") >= 1.0
            && s.metric("edge_llm_disk_cache_blocks") >= full as f64
    });
    let slot_bytes = 4.0 * model.config.state_floats() as f64;
    let snapshots = server.metric("edge_llm_state_snapshots");
    assert!(snapshots >= 1.0);
    assert_eq!(
        server.metric("edge_llm_state_slots_total"),
        4.0,
        "--parallel 4"
    );
    assert_eq!(server.metric("edge_llm_state_slot_bytes"), slot_bytes);
    assert_eq!(
        server.metric("edge_llm_state_snapshot_bytes"),
        snapshots * slot_bytes
    );
    drop(server); // SIGKILL, as a crash

    let Some(server) = Server::start(&args) else {
        return;
    };
    let (again, _, cached, from_disk) = chat(&server, &body);
    assert_eq!(again, text, "the same output after the restart");
    assert_eq!(
        (cached, from_disk),
        (16 * full, 16 * full),
        "resumed from disk"
    );
    assert_eq!(
        server.metric("edge_llm_disk_cache_hit_state_snapshots_total"),
        1.0
    );
    let (status, cache) = server.get("/v1/cache");
    assert_eq!(status, 200, "{cache}");
    let cache: serde_json::Value = serde_json::from_str(&cache).unwrap();
    assert_eq!(cache["disk"]["hit_state_snapshots"], 1, "{cache}");
    assert!(
        cache["disk"]["state_snapshots"].as_u64().unwrap() >= 1,
        "{cache}"
    );
    assert_eq!(
        server.metric("edge_llm_prefix_cache_hit_tokens_total"),
        (16 * full) as f64
    );
}
