//! The harness of tests/routers.rs: local `edge-llm serve` workers (one compute thread each,
//! KV events on) behind a real router from PyPI (vllm-router or sglang-router, installed into
//! `.routers/` by scripts/test.sh), every port bound to 127.0.0.1. Every process runs in its own
//! process group, killed on drop; every wait is bounded.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::harness::http;
use super::{fetched, model_path, root, FETCH_MODEL};

/// The id of the model every worker serves (the default model's file stem).
pub const MODEL_ID: &str = "SmolLM2-135M-Instruct.Q4_1";

/// A router's executable in `.routers/bin`, or None (a failure under CI=true) with why.
pub fn router_bin(name: &str) -> Option<PathBuf> {
    let p = fetched(
        root().join(".routers/bin").join(name),
        "scripts/test.sh installs the routers from PyPI",
    )?;
    fetched(model_path(), FETCH_MODEL)?;
    Some(p)
}

/// A free TCP port on 127.0.0.1 (released for the process that binds it next).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("finding a free port")
}

/// A process in its own group, with its output in a log file; the group is killed on drop.
pub struct Proc {
    child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(name: &str, cmd: &mut Command) -> Proc {
        let log = std::env::temp_dir().join(format!(
            "edge-llm-routers-{}-{name}-{}.log",
            std::process::id(),
            free_port()
        ));
        let file = std::fs::File::create(&log).expect("creating a log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        Proc { child, log }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops the whole group: SIGTERM, then SIGKILL after 3 s.
    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-TERM", "--", &group])
            .stderr(Stdio::null())
            .status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(3) {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// One `edge-llm serve` worker with KV events on.
pub struct Worker {
    pub port: u16,
    pub events_port: u16,
    pub proc: Proc,
}

impl Worker {
    pub fn start(port: u16, events_port: u16) -> Worker {
        Worker::start_with(port, events_port, &model_path())
    }

    /// A worker serving `model` (its id is the file's stem).
    pub fn start_with(port: u16, events_port: u16, model: &std::path::Path) -> Worker {
        let proc = Proc::spawn(
            &format!("worker-{port}"),
            Command::new(env!("CARGO_BIN_EXE_edge-llm"))
                .arg("serve")
                .arg("-m")
                .arg(model)
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["-t", "1", "-c", "2048", "--parallel", "8"])
                .args(["--kv-events", &format!("tcp://127.0.0.1:{events_port}")])
                .arg("--no-disk-cache")
                .env_remove("EDGE_LLM_API_KEY"),
        );
        let w = Worker {
            port,
            events_port,
            proc,
        };
        wait_until(&format!("worker {port} healthy"), 60, || {
            get(&w.addr(), "/health").0 == 200
        });
        w
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn metric(&self, name: &str) -> f64 {
        metric(&self.addr(), name)
    }
}

/// GET on a fresh connection; (0, why) when nothing answers.
pub fn get(addr: &str, path: &str) -> (u16, String) {
    match std::net::TcpStream::connect(addr) {
        Ok(_) => {
            let r = http(addr, "GET", path, &[], b"");
            (r.status, String::from_utf8_lossy(&r.body).into_owned())
        }
        Err(e) => (0, e.to_string()),
    }
}

pub fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = http(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    let v = serde_json::from_slice(&r.body).unwrap_or_else(|e| {
        panic!(
            "{addr}{path} answered {} non-JSON ({e}): {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        )
    });
    (r.status, v)
}

/// The sum of every sample of `name` (any labels) in a Prometheus text at `addr`.
pub fn metric(addr: &str, name: &str) -> f64 {
    metric_matching(addr, name, "")
}

/// The sum of the samples of `name` whose labels contain `label`.
pub fn metric_matching(addr: &str, name: &str, label: &str) -> f64 {
    let (status, text) = get(addr, "/metrics");
    assert_eq!(status, 200, "{addr}/metrics: {text}");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let rest = series.strip_prefix(name)?;
            (rest.is_empty() || rest.starts_with('{') && rest.contains(label))
                .then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// Polls `cond` every 200 ms for at most `secs` seconds; panics naming `what` after that.
pub fn wait_until(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "timed out after {secs} s waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `n` words drawn from a small list by a generator seeded with `seed`: an xorshift64, not the
/// tests' splitmix64 (`support::splitmix`), because scripts/cluster_bench.py reproduces this
/// stream to send the same prompts to a cluster outside the tests; change both or neither.
fn words(seed: u64, n: usize) -> String {
    const WORDS: [&str; 16] = [
        "alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "maple", "orbit", "pixel",
        "harbor", "lantern", "velvet", "quartz", "meadow", "ember",
    ];
    let mut x = 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(seed + 1);
    let out: Vec<&str> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            WORDS[(x % 16) as usize]
        })
        .collect();
    out.join(" ")
}

/// A 400-token system prompt, one of four distinct ones (`i` in 0..4).
pub fn system_prompt(i: usize) -> String {
    format!(
        "You are assistant number {i}. Keep these words in mind: {}",
        words(i as u64, 380)
    )
}

/// A user question of about 100 tokens, distinct for each (`round`, `i`): what a follow-up
/// shares only with its own first turn.
pub fn question(round: usize, i: usize) -> String {
    format!(
        "Round {round}, question {i}. Here are my notes: {}. Which word comes first?",
        words(1000 + 100 * round as u64 + i as u64, 90)
    )
}

pub fn chat_body(messages: Value) -> Value {
    chat_body_for(MODEL_ID, messages)
}

/// `chat_body` for the model of id `model_id`.
pub fn chat_body_for(model_id: &str, messages: Value) -> Value {
    json!({"model": model_id, "messages": messages, "max_tokens": 8, "temperature": 0})
}

/// The worker instance that answered, from the response id (`chatcmpl-{instance}{id:06x}`).
pub fn instance_of(response: &Value) -> String {
    let id = response["id"].as_str().unwrap_or_default();
    let hex = id.rsplit('-').next().unwrap_or_default();
    hex[..hex.len().saturating_sub(6)].to_string()
}
