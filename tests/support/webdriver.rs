//! A small WebDriver client for tests/webui.rs: starts Debian's `chromedriver` on a free
//! port, opens one headless Chromium session, and speaks the W3C WebDriver protocol as JSON
//! over the hand-written HTTP/1.1 client of the server harness (no client dependency).
//! Under `CI=true` a missing browser or driver is a failure; elsewhere the test is skipped.

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::harness::{connect, parse_response, write_request, Response};
use super::skip_or_fail;

/// The key W3C WebDriver uses for element references.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A headless Chromium driven through chromedriver; both end on drop.
pub struct Browser {
    driver: Child,
    addr: String,
    session: String,
}

fn find_program(names: &[&str]) -> Option<String> {
    for name in names {
        for dir in std::env::var("PATH").unwrap_or_default().split(':') {
            let p = Path::new(dir).join(name);
            if p.is_file() {
                return Some(p.display().to_string());
            }
        }
    }
    None
}

impl Browser {
    /// Starts chromedriver and a browser window of `width` x `height`; None (with the reason
    /// printed) when the browser is missing outside CI.
    pub fn start(width: u32, height: u32) -> Option<Browser> {
        let browser = find_program(&["chromium", "chromium-browser", "google-chrome"]);
        let driver = find_program(&["chromedriver"]);
        let (Some(browser), Some(driver)) = (browser, driver) else {
            skip_or_fail("chromium and chromedriver are needed (Debian: apt-get install chromium chromium-driver; scripts/test.sh installs them)");
            return None;
        };
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("picking a free port")
            .port();
        let child = Command::new(&driver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {driver}: {e}"));
        let mut b = Browser {
            driver: child,
            addr: format!("127.0.0.1:{port}"),
            session: String::new(),
        };
        let start = Instant::now();
        loop {
            if std::net::TcpStream::connect(&b.addr).is_ok() {
                let r = http(&b.addr, "GET", "/status", &[], b"");
                let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                if v["value"]["ready"] == json!(true) {
                    break;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "chromedriver did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": browser,
                "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                         "--no-first-run", "--disable-extensions", "--force-color-profile=srgb",
                         "--hide-scrollbars", format!("--window-size={width},{height}")],
            },
            "unhandledPromptBehavior": "ignore",
        }}});
        let v = b.raw("POST", "/session", &caps);
        b.session = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {v}"))
            .to_string();
        Some(b)
    }

    /// One command; the reply's `value`, or a panic naming the WebDriver error.
    fn raw(&self, method: &str, path: &str, body: &Value) -> Value {
        let bytes = if method == "GET" || method == "DELETE" {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        };
        let r = http(
            &self.addr,
            method,
            path,
            &[("Content-Type", "application/json; charset=utf-8")],
            &bytes,
        );
        let v: Value = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {}", r.text()));
        if r.status != 200 {
            panic!(
                "{method} {path} failed ({}): {} {}",
                r.status, v["value"]["error"], v["value"]["message"]
            );
        }
        v["value"].clone()
    }

    fn cmd(&self, method: &str, path: &str, body: Value) -> Value {
        self.raw(method, &format!("/session/{}{path}", self.session), &body)
    }

    pub fn goto(&self, url: &str) {
        self.cmd("POST", "/url", json!({"url": url}));
    }

    /// The element for a CSS selector (panics if there is none).
    pub fn find(&self, css: &str) -> String {
        let v = self.cmd(
            "POST",
            "/element",
            json!({"using": "css selector", "value": css}),
        );
        v[ELEMENT].as_str().unwrap().to_string()
    }

    pub fn count(&self, css: &str) -> usize {
        self.cmd(
            "POST",
            "/elements",
            json!({"using": "css selector", "value": css}),
        )
        .as_array()
        .map_or(0, |a| a.len())
    }

    /// A real click (scrolled into view, hit-tested) on the element.
    pub fn click(&self, css: &str) {
        let id = self.find(css);
        self.cmd("POST", &format!("/element/{id}/click"), json!({}));
    }

    /// Empties a text field, then types `text` into it key by key.
    pub fn fill(&self, css: &str, text: &str) {
        let id = self.find(css);
        self.cmd("POST", &format!("/element/{id}/clear"), json!({}));
        if text.is_empty() {
            return;
        }
        self.cmd(
            "POST",
            &format!("/element/{id}/value"),
            json!({"text": text}),
        );
    }

    /// Types keys into an element without clearing it (e.g. "\u{E007}" is Enter).
    pub fn keys(&self, css: &str, text: &str) {
        let id = self.find(css);
        self.cmd(
            "POST",
            &format!("/element/{id}/value"),
            json!({"text": text}),
        );
    }

    /// The rendered text of the element.
    pub fn text(&self, css: &str) -> String {
        let id = self.find(css);
        self.cmd("GET", &format!("/element/{id}/text"), json!({}))
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// Runs `script` (a function body; arguments as `arguments[i]`) in the page.
    pub fn js(&self, script: &str, args: Value) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            json!({"script": script, "args": args}),
        )
    }

    pub fn accept_alert(&self) {
        self.cmd("POST", "/alert/accept", json!({}));
    }

    pub fn set_window(&self, width: u32, height: u32) {
        self.cmd(
            "POST",
            "/window/rect",
            json!({"width": width, "height": height}),
        );
    }

    /// Waits up to `secs` for `cond`, polling; panics naming `what` (and the page's text).
    pub fn wait(&self, what: &str, secs: u64, mut cond: impl FnMut(&Browser) -> bool) {
        let start = Instant::now();
        while !cond(self) {
            if start.elapsed() > Duration::from_secs(secs) {
                let body = self.js("return document.body.innerText", json!([]));
                panic!(
                    "timed out after {secs}s waiting for {what}; the page says:\n{}",
                    body.as_str().unwrap_or("")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Saves a PNG of the viewport.
    pub fn screenshot(&self, path: &Path) {
        let v = self.cmd("GET", "/screenshot", json!({}));
        let png = base64_decode(v.as_str().expect("screenshot data"));
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        eprintln!("screenshot: {}", path.display());
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            let _ = http(&self.addr, "DELETE", &path, &[], b"");
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// One exchange with chromedriver, which answers `Connection: close` yet keeps the socket
/// open: the body is read up to its Content-Length.
fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
    let mut s = connect(addr);
    write_request(&mut s, method, path, headers, body);
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let n = s.read(&mut buf).expect("reading chromedriver's answer");
        raw.extend_from_slice(&buf[..n]);
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            if length.is_some_and(|len| raw.len() >= end + 4 + len) {
                break;
            }
        }
        if n == 0 {
            break;
        }
    }
    parse_response(&raw)
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=' && c != b'\n').collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c) << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}
