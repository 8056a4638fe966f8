//! Issue 30, item 1: request planning (reading the body, rendering the template, tokenizing,
//! compiling a grammar) held the HTTP runtime's two threads. Four clients looping 2 MB prompts,
//! each refused after about 4 s of tokenizing, made `/health` take up to 9.4 s and froze other
//! clients' token streams for as long. Now planning runs on its own pool: `/health` and the
//! streams keep going while clients flood it; a prompt whose bytes cannot fit the context is
//! refused before tokenizing; a full planning queue answers 503 with `Retry-After`.

mod support;

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::harness::*;

/// The trial's prompt: 2 MB of random words (no two alike, so no tokenizer cache helps), just
/// under the default `--max-body-bytes` once in JSON.
fn two_mb_prompt() -> String {
    let mut rng = support::splitmix::Rng(30);
    let mut text = String::with_capacity(2_000_000);
    while text.len() < 2_000_000 - 16 {
        for _ in 0..2 + rng.below(8) {
            text.push((b'a' + rng.below(26) as u8) as char);
        }
        text.push(' ');
    }
    text
}

/// `/health` on a fresh connection: its status and how long it took.
fn timed_health(addr: &str) -> (u16, Duration) {
    let started = Instant::now();
    let r = http(addr, "GET", "/health", &[], b"");
    (r.status, started.elapsed())
}

/// Streams a completion of `max_tokens` tokens; the largest gap between two chunks of it, and
/// how many chunks came.
fn largest_token_gap(addr: &str, max_tokens: usize) -> (Duration, usize) {
    let body = completion_body(
        "Once upon a time",
        json!({"max_tokens": max_tokens, "ignore_eos": true, "stream": true}),
    );
    let mut s = post_json(addr, "/v1/completions", &body);
    let (mut largest, mut chunks) = (Duration::ZERO, 0);
    let mut last: Option<Instant> = None;
    let mut buf = [0u8; 16384];
    loop {
        let n = s.read(&mut buf).expect("reading the stream");
        if n == 0 {
            break;
        }
        let now = Instant::now();
        chunks += String::from_utf8_lossy(&buf[..n]).matches("data: ").count();
        if let Some(before) = last {
            largest = largest.max(now - before);
        }
        last = Some(now);
    }
    (largest, chunks)
}

/// `n` clients posting `body` to `path` until `stop` (at most 200 times each); the statuses seen.
fn flood(
    addr: &str,
    path: &'static str,
    body: Value,
    n: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<Vec<u16>>> {
    let body = Arc::new(body.to_string());
    (0..n)
        .map(|_| {
            let (addr, body, stop) = (addr.to_string(), body.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                while !stop.load(Ordering::Relaxed) && statuses.len() < 200 {
                    let r = http(
                        &addr,
                        "POST",
                        path,
                        &[("Content-Type", "application/json")],
                        body.as_bytes(),
                    );
                    statuses.push(r.status);
                }
                statuses
            })
        })
        .collect()
}

#[test]
fn planning_stall_2mb_prompts_leave_health_and_token_streams_answering() {
    let Some(server) = Server::start(&[]) else {
        return support::skip_or_fail("the default model is missing");
    };
    let stop = Arc::new(AtomicBool::new(false));
    // Two clients whose prompts the byte bound refuses at once, two whose 2 MB `/tokenize`
    // (which has no context to check against) take seconds on the planner pool each.
    let prompt = two_mb_prompt();
    let refused = flood(
        &server.addr,
        "/v1/completions",
        completion_body(&prompt, json!({})),
        2,
        &stop,
    );
    let tokenized = flood(
        &server.addr,
        "/tokenize",
        json!({"content": prompt}),
        2,
        &stop,
    );
    std::thread::sleep(Duration::from_millis(500));
    let stream = {
        let addr = server.addr.clone();
        std::thread::spawn(move || largest_token_gap(&addr, 200))
    };
    let mut health = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(8) {
        let (status, took) = timed_health(&server.addr);
        assert_eq!(status, 200);
        health.push(took);
        std::thread::sleep(Duration::from_millis(100));
    }
    let (gap, chunks) = stream.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let answered = |clients: Vec<std::thread::JoinHandle<Vec<u16>>>| -> Vec<u16> {
        clients
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect()
    };
    let (refused, tokenized) = (answered(refused), answered(tokenized));
    health.sort();
    let (median, slowest) = (health[health.len() / 2], *health.last().unwrap());
    eprintln!(
        "/health over {} probes: median {median:?}, slowest {slowest:?}; largest token gap {gap:?} \
         over {chunks} chunks; 2 MB prompts answered: {} completions, {} /tokenize",
        health.len(),
        refused.len(),
        tokenized.len()
    );
    assert!(chunks >= 200, "the stream sent {chunks} chunks");
    assert!(
        refused.iter().all(|&s| s == 400),
        "the 2 MB prompts were answered {refused:?}"
    );
    assert!(
        !tokenized.is_empty() && tokenized.iter().all(|&s| s == 200),
        "the 2 MB /tokenize were answered {tokenized:?}"
    );
    // Before the planner pool: /health up to 9 s, token streams frozen as long.
    assert!(slowest < Duration::from_secs(1), "/health took {slowest:?}");
    assert!(
        gap < Duration::from_millis(1500),
        "a token stream stalled {gap:?}"
    );
}

#[test]
fn a_2mb_prompt_is_refused_before_tokenizing() {
    let Some(server) = Server::start(&[]) else {
        return support::skip_or_fail("the default model is missing");
    };
    let prompt = two_mb_prompt();
    for (path, body, param) in [
        (
            "/v1/completions",
            completion_body(&prompt, json!({})),
            "prompt",
        ),
        (
            "/v1/chat/completions",
            chat_body(&prompt, json!({})),
            "messages",
        ),
    ] {
        let started = Instant::now();
        let (status, v) = server.post(path, &body);
        let took = started.elapsed();
        eprintln!("{path}: 2 MB prompt answered {status} in {took:?}");
        assert_eq!(status, 400, "{v}");
        let error = &v["error"];
        assert_eq!(error["code"], "context_length_exceeded", "{v}");
        assert_eq!(error["param"], param, "{v}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.starts_with(
                "This model's maximum context length is 1024 tokens, but the prompt has at least"
            ),
            "{message}"
        );
        assert!(message.contains(&format!("bytes)")), "{message}");
        // Tokenizing 2 MB took about 4 s.
        assert!(took < Duration::from_secs(1), "{path} took {took:?}");
    }
    // Nothing that fits is refused: a prompt of many short words under the context still runs.
    let fits = "a ".repeat(900);
    let (status, v) = server.post(
        "/v1/completions",
        &completion_body(&fits, json!({"max_tokens": 2})),
    );
    assert_eq!(status, 200, "{v}");
}

#[test]
fn a_full_planning_queue_answers_503_with_retry_after() {
    let Some(server) = Server::start(&["--max-planning", "1"]) else {
        return support::skip_or_fail("the default model is missing");
    };
    // `/tokenize` has no context to check against: its 2 MB take seconds on the one slot.
    let slow = {
        let addr = server.addr.clone();
        let body = json!({"content": two_mb_prompt()}).to_string();
        std::thread::spawn(move || {
            http(
                &addr,
                "POST",
                "/tokenize",
                &[("Content-Type", "application/json")],
                body.as_bytes(),
            )
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let r = server.request(
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json")],
        completion_body("Hello", json!({})).to_string().as_bytes(),
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "planning_queue_full", "{v}");
    assert_eq!(v["error"]["type"], "server_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-planning"),
        "{v}"
    );
    let (status, took) = timed_health(&server.addr);
    assert_eq!(status, 200);
    assert!(took < Duration::from_secs(1), "/health took {took:?}");
    let tokenized = slow.join().unwrap();
    assert_eq!(tokenized.status, 200, "{}", tokenized.text());
    // The slot is free again.
    let (status, v) = server.post("/v1/completions", &completion_body("Hello", json!({})));
    assert_eq!(status, 200, "{v}");
}

/// The byte precheck refuses nothing that fits: for texts that spell the most bytes per token
/// (runs of one char, spaces, newlines, code, special tokens), the bound never exceeds the real
/// count.
#[test]
fn the_byte_bound_never_exceeds_the_real_token_count() {
    if support::fetched(support::model_path(), support::FETCH_MODEL).is_none() {
        return;
    }
    let tok = &support::model().tokenizer;
    let mut texts: Vec<String> = [" ", "\n", "\t", "-", "=", "a", "0", "é", "🎉", "▁", "\u{4}"]
        .iter()
        .flat_map(|c| [1, 7, 64, 300, 5000].map(|n| c.repeat(n)))
        .collect();
    texts.push("<|im_start|>user\nhi<|im_end|>\n".repeat(200));
    texts.push("    fn main() {\n        println!(\"hello\");\n    }\n".repeat(100));
    texts.push(two_mb_prompt()[..50_000].to_string());
    for id in 0..tok.vocab_size() as u32 {
        texts.push(tok.token_text(id).to_string());
        texts.push(String::from_utf8_lossy(&tok.token_bytes(id)).repeat(3));
    }
    for text in &texts {
        let count = tok.encode(text, false, true).unwrap().len();
        let bound = tok.min_tokens(text);
        assert!(
            bound <= count,
            "{} bytes of {:?}...: bound {bound} over {count} tokens",
            text.len(),
            text.chars().take(40).collect::<String>()
        );
    }
}
