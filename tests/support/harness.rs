//! The harness of the server tests (tests/server*.rs, disk_cache.rs, request_rules.rs, webui.rs,
//! routers.rs): starts the real `edge-llm serve` on the default model (`--port 0`, the port read
//! back from its log), a hand-written HTTP/1.1 client (plain and chunked bodies, server-sent
//! events), request builders, and error assertions. Servers run one at a time (a lock), as the
//! CPU path is slow.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{fetched, model_path, FETCH_MODEL};

pub static ONE_SERVER_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A running `edge-llm serve`, killed on drop.
/// The header a JSON body goes with (a server without keys refuses a POST without it).
pub const JSON: &[(&str, &str)] = &[("Content-Type", "application/json")];

pub struct Server {
    child: Child,
    pub addr: String,
    log: Arc<Mutex<Vec<String>>>,
    _lock: MutexGuard<'static, ()>,
}

impl Server {
    /// Starts the server with `extra` flags; None when the default model is missing (see
    /// [`super::skip_or_fail`]).
    pub fn start(extra: &[&str]) -> Option<Server> {
        Server::start_with_env(extra, &[])
    }

    /// Starts the server with `extra` flags and `env` set (and no inherited API key).
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Option<Server> {
        let model = fetched(model_path(), FETCH_MODEL)?;
        let lock = ONE_SERVER_AT_A_TIME
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // `-m FILE` among `extra` serves another model.
        let model_args = if extra.contains(&"-m") {
            Vec::new()
        } else {
            vec!["-m".into(), model.into_os_string()]
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
            .arg("serve")
            .args(model_args)
            .args(["--port", "0"])
            .args(if extra.contains(&"-c") {
                &[][..]
            } else {
                &["-c", "1024"][..]
            })
            .args(extra)
            // No test shares (or leaves) a disk cache: those about it pass --cache-dir.
            .args(if extra.contains(&"--cache-dir") {
                &[][..]
            } else {
                &["--no-disk-cache"][..]
            })
            .env_remove("EDGE_LLM_API_KEY")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting edge-llm serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(addr.split_whitespace().next().unwrap_or("").to_string());
                }
                log2.lock().unwrap().push(line);
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "the server did not start; its log:\n{}",
                    log.lock().unwrap().join("\n")
                );
            }
        };
        let server = Server {
            child,
            addr,
            log,
            _lock: lock,
        };
        let (status, body) = server.get("/health");
        assert_eq!(status, 200, "{body}");
        Some(server)
    }

    /// The server's process id (for /proc/PID/fd).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        http(&self.addr, method, path, headers, body)
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        let r = self.request("GET", path, &[], b"");
        (r.status, r.text())
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self.request(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        );
        let v = serde_json::from_slice(&r.body).unwrap_or_else(|e| {
            panic!("{path} answered {} non-JSON ({e}): {}", r.status, r.text())
        });
        (r.status, v)
    }

    /// `method path` with `header` (an API key) and a JSON `body` (none when null): the status
    /// and the JSON answer (null when it is not JSON).
    pub fn send(
        &self,
        method: &str,
        path: &str,
        header: (&str, &str),
        body: &Value,
    ) -> (u16, Value) {
        let body = if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        };
        let r = self.request(
            method,
            path,
            &[("Content-Type", "application/json"), header],
            &body,
        );
        (
            r.status,
            serde_json::from_slice(&r.body).unwrap_or(Value::Null),
        )
    }

    /// The body of a streamed POST of `body`, checked to be a 200 event stream.
    fn stream_text(&self, path: &str, body: &Value) -> String {
        let r = self.request(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r
            .header("content-type")
            .is_some_and(|v| v.starts_with("text/event-stream")));
        r.text()
    }

    /// A streamed request: the JSON of every `data:` event, and whether `[DONE]` ended it.
    pub fn post_stream(&self, path: &str, body: &Value) -> (Vec<Value>, bool) {
        let text = self.stream_text(path, body);
        let mut events = Vec::new();
        let mut done = false;
        for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
            let data = block
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an SSE data line: {block:?}"));
            if data == "[DONE]" {
                done = true;
            } else {
                assert!(!done, "events after [DONE]");
                events.push(
                    serde_json::from_str(data).unwrap_or_else(|e| panic!("bad chunk {data}: {e}")),
                );
            }
        }
        (events, done)
    }

    /// A streamed request answered with named events (the Responses and Messages APIs):
    /// each `event: NAME` block's name and `data:` JSON, in order.
    pub fn post_events(&self, path: &str, body: &Value) -> Vec<(String, Value)> {
        self.stream_text(path, body)
            .split("\n\n")
            .filter(|b| !b.trim().is_empty())
            .map(|block| {
                let (name, data) = block
                    .strip_prefix("event: ")
                    .and_then(|b| b.split_once("\ndata: "))
                    .unwrap_or_else(|| panic!("not an `event:`/`data:` block: {block:?}"));
                let v = serde_json::from_str(data)
                    .unwrap_or_else(|e| panic!("bad event data {data}: {e}"));
                (name.to_string(), v)
            })
            .collect()
    }

    /// One sample of the Prometheus text, e.g. `edge_llm_kv_blocks{state="used"}`.
    pub fn metric(&self, name: &str) -> f64 {
        let (status, text) = self.get("/metrics");
        assert_eq!(status, 200, "{text}");
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
            .parse()
            .unwrap()
    }

    /// Waits until `cond` holds on the metrics (the engine frees blocks asynchronously).
    pub fn wait_for_metrics(&self, what: &str, cond: impl Fn(&Server) -> bool) {
        let start = Instant::now();
        while !cond(self) {
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "timed out waiting for {what}; /metrics:\n{}",
                self.get("/metrics").1
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the server's log satisfies `cond` and returns it. Another thread reads the
    /// server's stderr into the log, so a line the server wrote before its reply or a metric
    /// changed may not be here yet when the test goes on (a hang guard, not a timing assumption).
    pub fn wait_for_log(&self, what: &str, cond: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let log = self.log_text();
            if cond(&log) {
                return log;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "timed out waiting for {what} in the server's log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- server log ---\n{}\n--- end of server log ---",
                self.log_text()
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connecting to the server");
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    s
}

/// A connection with a JSON POST of `body` to `path` written, for reading the answer as it comes
/// (streams, slow answers).
pub fn post_json(addr: &str, path: &str, body: &Value) -> TcpStream {
    let mut s = connect(addr);
    write_request(
        &mut s,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    s
}

pub fn write_request(
    s: &mut TcpStream,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) {
    // `Host: localhost` unless `headers` name another.
    let host = if headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        ""
    } else {
        "Host: localhost\r\n"
    };
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\n{host}Connection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // The server may answer (413) before reading all of a large body.
    let _ = s.write_all(body);
}

/// One HTTP/1.1 exchange on a fresh connection.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut s = connect(addr);
    write_request(&mut s, method, path, headers, body);
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("reading the response");
    parse_response(&raw)
}

pub fn parse_response(raw: &[u8]) -> Response {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Response {
        status,
        headers,
        body,
    }
}

pub fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = data.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&data[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = eol + 2;
        out.extend_from_slice(&data[start..(start + size).min(data.len())]);
        data = &data[(start + size + 2).min(data.len())..];
    }
    out
}

pub fn chat_body(user: &str, extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": user}], "max_tokens": 12, "temperature": 0});
    merge(&mut body, extra);
    body
}

pub fn completion_body(prompt: &str, extra: Value) -> Value {
    let mut body = json!({"prompt": prompt, "max_tokens": 12, "temperature": 0});
    merge(&mut body, extra);
    body
}

pub fn merge(body: &mut Value, extra: Value) {
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            body[k] = v;
        }
    }
}

/// The generated text of a request, streamed or not, and the path it went to.
pub fn run_request(server: &Server, path: &str, body: &Value) -> String {
    if body["stream"] == json!(true) {
        let (events, done) = server.post_stream(path, body);
        assert!(done, "stream did not end with [DONE]");
        events
            .iter()
            .flat_map(|e| e["choices"].as_array().cloned().unwrap_or_default())
            .map(|c| {
                c["text"]
                    .as_str()
                    .or(c["delta"]["content"].as_str())
                    .unwrap_or("")
                    .to_string()
            })
            .collect()
    } else {
        let (status, v) = server.post(path, body);
        assert_eq!(status, 200, "{v}");
        let c = &v["choices"][0];
        c["text"]
            .as_str()
            .or(c["message"]["content"].as_str())
            .unwrap()
            .to_string()
    }
}

pub fn assert_error(
    server: &Server,
    path: &str,
    raw_body: &[u8],
    status: u16,
    param: Option<&str>,
    needle: &str,
) {
    let r = server.request(
        "POST",
        path,
        &[("Content-Type", "application/json")],
        raw_body,
    );
    let body = r.text();
    assert_eq!(
        r.status,
        status,
        "{path} {}: {body}",
        String::from_utf8_lossy(&raw_body[..raw_body.len().min(200)])
    );
    let v: Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("error body is not JSON ({e}): {body}"));
    let err = &v["error"];
    assert!(
        err["message"].as_str().is_some_and(|m| m.contains(needle)),
        "message should mention {needle:?}: {body}"
    );
    assert!(err["type"].is_string(), "{body}");
    assert!(
        err.get("code").is_some() && err.get("param").is_some(),
        "{body}"
    );
    if let Some(p) = param {
        assert_eq!(err["param"], json!(p), "{body}");
    }
    assert_eq!(
        server.get("/health").0,
        200,
        "the server stopped answering after {body}"
    );
}
