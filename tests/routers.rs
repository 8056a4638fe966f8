//! edge-llm as a worker behind the routers the ecosystem runs (issue 17):
//!
//! - `/v1/chat/completions/render` and `/v1/completions/render` give the token ids the request
//!   runs: the `BlockStored` events of the real request carry the same ids.
//! - `--kv-events`: vLLM-format KV events over ZMQ (three frames, msgpack maps), read here by a
//!   real ZMQ subscriber; the replay socket returns `AllBlocksCleared` at sequence 0; evictions
//!   come back as `BlockRemoved` of stored hashes; `/metrics` has vLLM's gauges; `/get_load`
//!   answers in either router's shape (`--load-format`).
//! - Two workers (one thread each) behind vllm-router 0.1.17 with `kv_aware`, `cache_aware` and
//!   `round_robin`: 8 concurrent chats over 4 distinct 400-token system prompts, then 8
//!   follow-ups; hit rates and tokens/s printed; a worker restart; sglang-router `cache_aware`.
//!
//! The routers come from PyPI into `.routers/` (scripts/test.sh); under CI=true a missing router
//! is a failure. Every process is killed on drop (its whole process group).

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use support::cluster::*;
use support::harness::{self, Server};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// One decoded KV event message: (sequence number, timestamp, events).
type KvMessage = (i64, f64, Vec<Value>);

fn decode(frames: &[Bytes]) -> KvMessage {
    let seq = i64::from_be_bytes(frames[frames.len() - 2][..].try_into().expect("8-byte seq"));
    let mut payload = &frames[frames.len() - 1][..];
    let v = rmpv::decode::read_value(&mut payload).expect("msgpack payload");
    assert!(payload.is_empty(), "trailing bytes after the payload");
    let batch = v.as_array().expect("payload is an array");
    assert_eq!(batch.len(), 3, "[ts, events, dp_rank]: {v}");
    assert_eq!(batch[2].as_u64(), Some(0), "dp_rank 0");
    let events = batch[1]
        .as_array()
        .expect("events array")
        .iter()
        .map(|e| {
            assert!(e.is_map(), "events are tagged maps: {e}");
            rmpv_to_json(e)
        })
        .collect();
    (seq, batch[0].as_f64().expect("timestamp"), events)
}

fn rmpv_to_json(v: &rmpv::Value) -> Value {
    use rmpv::Value as M;
    match v {
        M::Nil => Value::Null,
        M::Boolean(b) => json!(b),
        M::Integer(i) => i.as_u64().map(|u| json!(u)).unwrap_or(json!(i.as_i64())),
        M::F64(f) => json!(f),
        M::String(s) => json!(s.as_str()),
        M::Array(items) => Value::Array(items.iter().map(rmpv_to_json).collect()),
        M::Map(pairs) => Value::Object(
            pairs
                .iter()
                .map(|(k, v)| (k.as_str().unwrap_or("?").to_string(), rmpv_to_json(v)))
                .collect(),
        ),
        other => panic!("unexpected msgpack value {other}"),
    }
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn kv_events_carry_the_rendered_tokens_and_replay_from_zero() {
    let events_port = free_port();
    let replay_port = free_port();
    // A small pool (32 blocks of 16 tokens) so that a few prompts evict.
    let Some(server) = Server::start(&[
        "-c",
        "512",
        "--parallel",
        "1",
        "--kv-events",
        &format!("tcp://127.0.0.1:{events_port}"),
        "--kv-events-replay",
        &format!("tcp://127.0.0.1:{replay_port}"),
    ]) else {
        return;
    };
    let rt = runtime();
    let mut sub = zeromq::SubSocket::new();
    let mut dealer = zeromq::DealerSocket::new();
    rt.block_on(async {
        sub.connect(&format!("tcp://127.0.0.1:{events_port}"))
            .await
            .unwrap();
        sub.subscribe("").await.unwrap();
        dealer
            .connect(&format!("tcp://127.0.0.1:{replay_port}"))
            .await
            .unwrap();
    });
    // The subscriber joined after start: the replay socket has what it missed.
    let replayed: Vec<KvMessage> = rt.block_on(async {
        let mut req = ZmqMessage::from(Bytes::new());
        req.push_back(Bytes::copy_from_slice(&0u64.to_be_bytes()));
        dealer.send(req).await.unwrap();
        let mut out = Vec::new();
        loop {
            let m = tokio::time::timeout(Duration::from_secs(10), dealer.recv())
                .await
                .expect("replay answers within 10 s")
                .unwrap();
            let frames = m.into_vec();
            assert_eq!(frames.len(), 3, "[\"\", seq, payload]");
            assert!(frames[0].is_empty());
            let seq = i64::from_be_bytes(frames[1][..].try_into().unwrap());
            if seq == -1 {
                break;
            }
            out.push(decode(&frames));
        }
        out
    });
    assert!(!replayed.is_empty(), "replay returned nothing");
    assert_eq!(replayed[0].0, 0, "the first message has sequence number 0");
    assert_eq!(replayed[0].2, vec![json!({"type": "AllBlocksCleared"})]);
    // Let the subscription reach the publisher before the first event.
    std::thread::sleep(Duration::from_millis(300));

    let body = json!({
        "messages": [
            {"role": "system", "content": system_prompt(0)},
            {"role": "user", "content": "Say hi."}
        ],
        "max_tokens": 1, "temperature": 0,
        // Fields routers add (vllm-router rewrites bodies): ignored.
        "no_stop_trim": true, "separate_reasoning": false
    });
    let (status, render) = server.post("/v1/chat/completions/render", &body);
    assert_eq!(status, 200, "{render}");
    let ids: Vec<u64> = u64s(&render["token_ids"]);
    let (status, tokenized) = server.post("/tokenize", &json!({"messages": body["messages"]}));
    assert_eq!(status, 200);
    assert_eq!(
        u64s(&tokenized["tokens"]),
        ids,
        "/render and /tokenize differ"
    );
    let (status, reply) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply["usage"]["prompt_tokens"].as_u64(),
        Some(ids.len() as u64)
    );

    // The request's blocks, as the subscriber hears them.
    let stored: Vec<KvMessage> = rt.block_on(async {
        let m = tokio::time::timeout(Duration::from_secs(10), sub.recv())
            .await
            .expect("a BlockStored within 10 s")
            .unwrap();
        vec![decode(&m.into_vec())]
    });
    let (seq, ts, events) = &stored[0];
    assert!(*seq >= 1, "after AllBlocksCleared");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - ts).abs() < 60.0, "timestamp {ts} is not now ({now})");
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e["type"], "BlockStored");
    assert_eq!(e["parent_block_hash"], Value::Null);
    assert_eq!(e["block_size"], 16);
    assert_eq!(e["medium"], "GPU");
    assert_eq!(e["lora_id"], Value::Null);
    assert_eq!(e["lora_name"], Value::Null);
    let hashes = u64s(&e["block_hashes"]);
    let tokens = u64s(&e["token_ids"]);
    assert_eq!(tokens.len(), hashes.len() * 16);
    assert_eq!(hashes.len(), ids.len() / 16, "every full prompt block");
    assert_eq!(
        tokens[..],
        ids[..tokens.len()],
        "the stored tokens are the rendered ones"
    );

    // Completions render the same way: the prompt text of a completions request.
    let (status, rendered) = server.post(
        "/v1/completions/render",
        &json!({"prompt": "The capital of France is", "ignore_eos": false}),
    );
    assert_eq!(status, 200, "{rendered}");
    let cids = u64s(&rendered[0]["token_ids"]);
    let (_, done) = server.post(
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 1}),
    );
    assert_eq!(
        done["usage"]["prompt_tokens"].as_u64(),
        Some(cids.len() as u64)
    );
    // Bad bodies: a 400 naming the field, and the server goes on.
    let (status, err) = server.post("/v1/chat/completions/render", &json!({"messages": 3}));
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["param"], "messages", "{err}");
    let (status, err) = server.post("/v1/completions/render", &json!({}));
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["param"], "prompt", "{err}");

    // Evictions: distinct prompts through a 32-block pool remove stored hashes.
    let mut all_stored: Vec<u64> = hashes.clone();
    let mut removed: Vec<u64> = Vec::new();
    for i in 1..4 {
        let body = json!({"messages": [{"role": "user", "content": system_prompt(i)[..600].to_string()}],
                          "max_tokens": 1});
        let (status, _) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200);
    }
    rt.block_on(async {
        while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(2), sub.recv()).await {
            for e in decode(&m.into_vec()).2 {
                match e["type"].as_str().unwrap() {
                    "BlockStored" => all_stored.extend(u64s(&e["block_hashes"])),
                    "BlockRemoved" => {
                        assert_eq!(e["medium"], "GPU");
                        removed.extend(u64s(&e["block_hashes"]))
                    }
                    other => panic!("unexpected {other}"),
                }
            }
        }
    });
    assert!(
        !removed.is_empty(),
        "32 blocks held four prompts without an eviction"
    );
    for h in &removed {
        assert!(all_stored.contains(h), "removed hash {h} was never stored");
    }
    let (status, text) = server.get("/metrics");
    assert_eq!(status, 200);
    for needle in [
        "vllm:num_requests_running{",
        "vllm:num_requests_waiting{",
        "vllm:kv_cache_usage_perc{",
        "block_size=\"16\",num_gpu_blocks=\"32\"",
    ] {
        assert!(text.contains(needle), "no {needle} in /metrics:\n{text}");
    }
    assert!(server.metric("edge_llm_kv_events_published_total") >= 3.0);
    assert_eq!(server.metric("edge_llm_kv_events_dropped_total"), 0.0);
    let (status, load) = server.get("/get_load");
    assert_eq!(status, 200);
    let load: Value = serde_json::from_str(&load).unwrap();
    assert_eq!(load["load"], 0, "{load}");
    assert_eq!(load["num_reqs"], 0, "{load}");
    assert_eq!(load["dp_rank"], 0, "{load}");
}

/// What one run of the workload measured.
struct Outcome {
    /// Follow-ups answered by the worker that answered their first turn.
    follow_ups_on_their_worker: usize,
    /// Follow-ups whose cached tokens cover their first turn's prompt (less one block).
    follow_ups_hit: usize,
    hit_rate_all: f64,
    hit_rate_follow_ups: f64,
    tokens_per_s: f64,
    /// Follow-ups served from the cache, as the workers' counters say.
    worker_hit_tokens_follow_ups: f64,
}

fn concurrently(bodies: Vec<Value>, addr: &str) -> Vec<Value> {
    let handles: Vec<_> = bodies
        .into_iter()
        .map(|b| {
            let addr = addr.to_string();
            std::thread::spawn(move || {
                let (status, v) = post(&addr, "/v1/chat/completions", &b);
                assert_eq!(status, 200, "{v}");
                v
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn sum_metric(workers: &[&Worker], name: &str) -> f64 {
    workers.iter().map(|w| w.metric(name)).sum()
}

/// 8 concurrent chats over 4 system prompts, then their 8 follow-ups (one at a time).
fn workload(label: &str, router: &str, workers: &[&Worker], round: usize) -> Outcome {
    workload_for(MODEL_ID, label, router, workers, round)
}

/// `workload` on workers serving the model of id `model_id`.
fn workload_for(
    model_id: &str,
    label: &str,
    router: &str,
    workers: &[&Worker],
    round: usize,
) -> Outcome {
    let chat_body = |m: Value| chat_body_for(model_id, m);
    let lookups = "edge_llm_prefix_cache_lookup_tokens_total";
    let hits = "edge_llm_prefix_cache_hit_tokens_total";
    let (l0, h0) = (sum_metric(workers, lookups), sum_metric(workers, hits));
    let start = Instant::now();
    let first: Vec<Value> = (0..8)
        .map(|i| {
            json!([
                {"role": "system", "content": system_prompt(i % 4)},
                {"role": "user", "content": question(round, i)}
            ])
        })
        .collect();
    let answers = concurrently(first.iter().map(|m| chat_body(m.clone())).collect(), router);
    let (l1, h1) = (sum_metric(workers, lookups), sum_metric(workers, hits));
    let follow: Vec<Value> = first
        .iter()
        .zip(&answers)
        .map(|(m, a)| {
            let mut m = m.as_array().unwrap().clone();
            m.push(json!({"role": "assistant", "content": a["choices"][0]["message"]["content"]}));
            m.push(json!({"role": "user", "content": "And another one?"}));
            Value::Array(m)
        })
        .collect();
    // The follow-ups go one at a time, after a short pause for the first wave's KV events to
    // reach the router: with both workers idle, a router that routes on prefixes has only the
    // prefix to go by. (Sent all at once, kv_aware's load term moved 2 of 8 follow-ups to the
    // worker holding only their system prompt in one CI run.)
    std::thread::sleep(Duration::from_millis(500));
    let replies: Vec<Value> = follow
        .iter()
        .map(|m| {
            let (status, v) = post(router, "/v1/chat/completions", &chat_body(m.clone()));
            assert_eq!(status, 200, "{v}");
            v
        })
        .collect();
    let elapsed = start.elapsed().as_secs_f64();
    let (l2, h2) = (sum_metric(workers, lookups), sum_metric(workers, hits));
    let mut on_their_worker = 0;
    let mut hit = 0;
    let mut tokens = 0u64;
    for (i, (a, r)) in answers.iter().zip(&replies).enumerate() {
        let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        let first_prompt = a["usage"]["prompt_tokens"].as_u64().unwrap();
        let same = instance_of(a) == instance_of(r);
        on_their_worker += same as usize;
        hit += (cached + 16 >= first_prompt) as usize;
        eprintln!(
            "  {label} chat {i}: first turn on {} ({} cached of {first_prompt}), follow-up on {} ({cached} cached of {})",
            instance_of(a),
            a["usage"]["prompt_tokens_details"]["cached_tokens"],
            instance_of(r),
            r["usage"]["prompt_tokens"]
        );
        for v in [a, r] {
            tokens += v["usage"]["total_tokens"].as_u64().unwrap();
        }
    }
    let outcome = Outcome {
        follow_ups_on_their_worker: on_their_worker,
        follow_ups_hit: hit,
        hit_rate_all: (h2 - h0) / (l2 - l0),
        hit_rate_follow_ups: (h2 - h1) / (l2 - l1),
        tokens_per_s: tokens as f64 / elapsed,
        worker_hit_tokens_follow_ups: h2 - h1,
    };
    eprintln!(
        "{label}: follow-ups on their worker {on_their_worker}/8, with their prefix cached {hit}/8; \
         prefix hit rate {:.3} (follow-ups {:.3}); {tokens} tokens in {elapsed:.1} s = {:.0} tokens/s",
        outcome.hit_rate_all, outcome.hit_rate_follow_ups, outcome.tokens_per_s
    );
    outcome
}

/// A router process on 127.0.0.1 (HTTP and Prometheus ports), ready once it answers.
struct Router {
    proc: Proc,
    addr: String,
    metrics_addr: String,
}

fn start_vllm_router(bin: &std::path::Path, policy: &str, workers: &[&Worker]) -> Router {
    start_vllm_router_for(bin, policy, workers, MODEL_ID)
}

/// `start_vllm_router` for workers serving the model of id `model_id`.
fn start_vllm_router_for(
    bin: &std::path::Path,
    policy: &str,
    workers: &[&Worker],
    model_id: &str,
) -> Router {
    let port = free_port();
    let prom = free_port();
    let mut cmd = std::process::Command::new(bin);
    cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args([
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            &prom.to_string(),
        ])
        .args(["--policy", policy, "--worker-startup-check-interval", "1"])
        .arg("--worker-urls")
        .args(workers.iter().map(|w| w.url()));
    if policy == "kv_aware" {
        cmd.args(["--kv-event-block-size", "16", "--kv-event-model", model_id]);
        for w in workers {
            cmd.arg("--kv-event-source").arg(format!(
                "{}=tcp://127.0.0.1:{}",
                w.url(),
                w.events_port
            ));
        }
    }
    let router = Router {
        proc: Proc::spawn(&format!("vllm-router-{policy}"), &mut cmd),
        addr: format!("127.0.0.1:{port}"),
        metrics_addr: format!("127.0.0.1:{prom}"),
    };
    wait_router(&router);
    router
}

fn wait_router(router: &Router) {
    let start = Instant::now();
    while get(&router.addr, "/v1/models").0 != 200 {
        if start.elapsed() > Duration::from_secs(60) {
            panic!(
                "the router did not answer /v1/models within 60 s; its log:\n{}",
                router.proc.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn two_workers() -> (Worker, Worker) {
    (
        Worker::start(free_port(), free_port()),
        Worker::start(free_port(), free_port()),
    )
}

/// A tenant's prompt must not reach whoever subscribes to the events (issue 30, item 8: an
/// unauthenticated subscriber read key A's `token_ids` and `/detokenize` gave back its text).
/// With API keys the events name blocks by their (per-key salted) hashes only, unless
/// `--kv-events-token-ids on` asks for the ids.
#[test]
fn kv_events_carry_no_token_ids_with_api_keys_unless_asked() {
    for (mode, expect_ids) in [("auto", false), ("on", true)] {
        let events_port = free_port();
        let Some(server) = Server::start(&[
            "--api-key",
            "tenant-a",
            "--kv-events",
            &format!("tcp://127.0.0.1:{events_port}"),
            "--kv-events-token-ids",
            mode,
        ]) else {
            return;
        };
        let rt = runtime();
        let mut sub = zeromq::SubSocket::new();
        rt.block_on(async {
            sub.connect(&format!("tcp://127.0.0.1:{events_port}"))
                .await
                .unwrap();
            sub.subscribe("").await.unwrap();
        });
        // Let the subscription reach the publisher before the first event.
        std::thread::sleep(Duration::from_millis(300));
        let body = json!({
            "messages": [
                {"role": "system", "content": system_prompt(1)},
                {"role": "user", "content": "Say hi."}
            ],
            "max_tokens": 1, "temperature": 0
        });
        let r = server.request(
            "POST",
            "/v1/chat/completions",
            &[
                ("Content-Type", "application/json"),
                ("Authorization", "Bearer tenant-a"),
            ],
            body.to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let (_, _, events) = rt.block_on(async {
            let m = tokio::time::timeout(Duration::from_secs(10), sub.recv())
                .await
                .expect("a BlockStored within 10 s")
                .unwrap();
            decode(&m.into_vec())
        });
        let stored = events
            .iter()
            .find(|e| e["type"] == "BlockStored")
            .unwrap_or_else(|| panic!("no BlockStored in {events:?}"));
        let hashes = u64s(&stored["block_hashes"]);
        let tokens = u64s(&stored["token_ids"]);
        assert!(!hashes.is_empty(), "{mode}: {stored}");
        if expect_ids {
            assert_eq!(tokens.len(), hashes.len() * 16, "{mode}: {stored}");
        } else {
            assert!(
                tokens.is_empty(),
                "{mode}: the prompt's token ids leaked: {stored}"
            );
        }
    }
}

#[test]
fn vllm_router_keeps_follow_ups_on_the_worker_holding_their_prefix() {
    let Some(bin) = router_bin("vllm-router") else {
        return;
    };
    let _lock = harness::ONE_SERVER_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let mut results = Vec::new();
    for policy in ["kv_aware", "cache_aware", "round_robin"] {
        let (mut w1, w2) = two_workers();
        let router = start_vllm_router(&bin, policy, &[&w1, &w2]);
        let m = &router.metrics_addr;
        let kv_hits = || metric_matching(m, "vllm_router_kv_placement_lookups_total", "\"hit\"");
        let missing = || {
            metric_matching(
                m,
                "vllm_router_prefix_routing_decisions_total",
                "missing_tokens",
            )
        };
        let kv_hits0 = kv_hits();
        let outcome = workload(policy, &router.addr, &[&w1, &w2], 0);
        let (_, text) = get(m, "/metrics");
        let decisions: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.starts_with("vllm_router_prefix_routing_decisions_total")
                    || l.starts_with("vllm_router_kv_placement_lookups_total")
            })
            .collect();
        eprintln!("{policy}: router metrics {decisions:?}");
        if policy != "round_robin" {
            assert_eq!(
                outcome.follow_ups_on_their_worker, 8,
                "{policy}: a follow-up left the worker holding its prefix"
            );
            assert_eq!(
                outcome.follow_ups_hit, 8,
                "{policy}: a follow-up missed its prefix"
            );
            assert!(
                outcome.hit_rate_follow_ups >= 0.8,
                "{policy}: follow-up prefix hit rate {:.3} < 0.8",
                outcome.hit_rate_follow_ups
            );
        }
        if policy == "kv_aware" {
            // The router's index agrees with the workers: at least the 8 follow-ups were
            // placement hits, and the workers served them from cache.
            assert!(kv_hits() - kv_hits0 >= 8.0, "{decisions:?}");
            assert!(outcome.worker_hit_tokens_follow_ups >= 8.0 * 400.0);
            // A restart: sequence numbers start again at 0 and the router rebuilds its view.
            let (port, events) = (w1.port, w1.events_port);
            w1.proc.stop();
            w1 = Worker::start(port, events);
            let again = workload("kv_aware after a restart", &router.addr, &[&w1, &w2], 1);
            let log = router.proc.log_text();
            assert!(
                log.contains(&format!("{}: restart seq", w1.url())),
                "the router did not see the restart:\n{log}"
            );
            assert_eq!(again.follow_ups_on_their_worker, 8, "after a restart");
            assert_eq!(again.follow_ups_hit, 8, "after a restart");
        }
        if policy == "cache_aware" {
            // It asked every worker's /render for the token ids and got them each time.
            assert_eq!(
                missing(),
                0.0,
                "cache_aware lacked token ids: {decisions:?}"
            );
            assert!(
                metric_matching(
                    m,
                    "vllm_router_prefix_routing_decisions_total",
                    "prefix_hit"
                ) >= 8.0,
                "{decisions:?}"
            );
        }
        results.push((policy, outcome));
    }
    eprintln!("summary (2 workers, 1 thread each):");
    for (policy, o) in &results {
        eprintln!(
            "  {policy:12} follow-ups on their worker {}/8, prefix hit rate {:.3} (follow-ups {:.3}), {:.0} tokens/s",
            o.follow_ups_on_their_worker, o.hit_rate_all, o.hit_rate_follow_ups, o.tokens_per_s
        );
    }
}

/// A hybrid model (the synthetic LFM2, issue 29): a worker announces its blocks only as far as
/// a recurrent state snapshot reaches (a prompt resumes no further), and kv_aware keeps every
/// follow-up on the worker holding its first turn's snapshot, which it resumes from.
#[test]
fn vllm_router_kv_aware_keeps_a_hybrid_models_follow_ups_on_the_worker_holding_their_snapshot() {
    let Some(bin) = router_bin("vllm-router") else {
        return;
    };
    let r = support::synth::json("tests/synth/lfm2.json");
    let Some(model) = support::synth::model_file(&r, "scripts/synth/synth.py models target/synth")
    else {
        return;
    };
    let _lock = harness::ONE_SERVER_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let w1 = Worker::start_with(free_port(), free_port(), &model);
    let w2 = Worker::start_with(free_port(), free_port(), &model);
    let router = start_vllm_router_for(&bin, "kv_aware", &[&w1, &w2], "lfm2");
    let outcome = workload_for("lfm2", "kv_aware (lfm2)", &router.addr, &[&w1, &w2], 0);
    assert_eq!(
        outcome.follow_ups_on_their_worker, 8,
        "a follow-up left its snapshot"
    );
    assert_eq!(outcome.follow_ups_hit, 8, "a follow-up did not resume");
    let snapshots = sum_metric(&[&w1, &w2], "edge_llm_state_snapshots");
    assert!(snapshots >= 4.0, "{snapshots} snapshots held");
}

#[test]
fn sglang_router_cache_aware_smoke() {
    let Some(bin) = router_bin("smg") else {
        return;
    };
    let _lock = harness::ONE_SERVER_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let (w1, w2) = two_workers();
    let port = free_port();
    let prom = free_port();
    let mut cmd = std::process::Command::new(bin);
    cmd.arg("launch")
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args([
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            &prom.to_string(),
        ])
        .args([
            "--policy",
            "cache_aware",
            "--worker-startup-check-interval",
            "1",
        ])
        .arg("--worker-urls")
        .args([w1.url(), w2.url()]);
    let router = Router {
        proc: Proc::spawn("sglang-router", &mut cmd),
        addr: format!("127.0.0.1:{port}"),
        metrics_addr: format!("127.0.0.1:{prom}"),
    };
    wait_router(&router);
    let outcome = workload("sglang cache_aware", &router.addr, &[&w1, &w2], 0);
    assert_eq!(outcome.follow_ups_on_their_worker, 8);
    assert_eq!(outcome.follow_ups_hit, 8);
    assert!(outcome.hit_rate_follow_ups >= 0.8);
}

#[test]
fn get_load_answers_in_the_shape_asked_for() {
    let Some(server) = Server::start(&["--load-format", "sglang"]) else {
        return;
    };
    let (status, text) = server.get("/get_load");
    assert_eq!(status, 200, "{text}");
    let load: Value = serde_json::from_str(&text).unwrap();
    let ranks = load
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {load}"));
    assert_eq!(ranks.len(), 1);
    for field in [
        "num_reqs",
        "num_waiting_reqs",
        "num_tokens",
        "num_pending_tokens",
    ] {
        assert!(ranks[0][field].is_u64(), "no {field} in {load}");
    }
    assert_eq!(ranks[0]["dp_rank"], 0);
    assert!(
        ranks[0]["num_pending_tokens"].as_u64().unwrap() > 0,
        "{load}"
    );
}
