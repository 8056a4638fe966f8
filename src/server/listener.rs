//! The accept loop and the connection limits, so that slow or idle clients cannot hold the
//! server: hyper's HTTP/1 connections with a header-read timeout (`--header-timeout`), a
//! keep-alive idle timeout (`--keep-alive-timeout`: a connection with no request in flight is
//! closed after that long), and a cap on open connections (`--max-connections`, kept well
//! under the open-file limit). A connection counts against the cap from accept until it is
//! closed. At the cap the oldest idle connection (one that sent no whole request yet, or waits
//! between requests) is closed to make room, so a slowloris flood cannot lock out new clients;
//! a connection whose request has been parsed is never closed to make room (its response or
//! stream runs to the end), and one chosen while idle that has begun a request by the time it
//! would close is kept. With none idle, a new connection is refused: its request head is read
//! (briefly), then it gets a 503 with `Retry-After: 1` and an OpenAI-style error, and is closed
//! gracefully (write side shut, unread request bytes drained, so the client reads the 503
//! rather than a reset). `GET /health` on a refused connection gets its usual 200 instead.
//! Refusals in progress are bounded by the open-file room left over by the cap; past that a
//! connection is closed at once. Reaching the cap is logged once. The body-read timeout and
//! the early 413 are `read_body`, a middleware. Called by `serve`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use clap::Args;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, Semaphore};
use tower_service::Service;

use super::error::ApiError;

/// Flags of `serve` that bound what one client can hold.
#[derive(Args, Debug, Clone)]
pub struct LimitArgs {
    /// Seconds a client has to send a request's headers once the server waits for them.
    #[arg(long = "header-timeout", default_value_t = 10.0)]
    pub header_timeout: f64,
    /// Seconds a client has to send a request's whole body once its headers arrived.
    #[arg(long = "body-timeout", default_value_t = 30.0)]
    pub body_timeout: f64,
    /// Seconds a connection with no request in flight is kept open (keep-alive).
    #[arg(long = "keep-alive-timeout", default_value_t = 5.0)]
    pub keep_alive_timeout: f64,
    /// Most open connections [default: 1024, or less under a low open-file limit].
    #[arg(long = "max-connections")]
    pub max_connections: Option<usize>,
}

/// File descriptors kept for everything but connections (model file, engine, logs).
const FD_RESERVE: u64 = 64;

/// The limits, checked.
#[derive(Clone, Debug)]
pub struct Limits {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub keep_alive_timeout: Duration,
    pub max_connections: usize,
    /// Most refused connections answered at once (reading a head, writing the 503): the
    /// open-file room the cap leaves.
    pub max_refusing: usize,
}

impl LimitArgs {
    pub fn limits(&self) -> anyhow::Result<Limits> {
        let secs = |v: f64, flag: &str| -> anyhow::Result<Duration> {
            if v.is_finite() && v > 0.0 && v <= 86_400.0 {
                Ok(Duration::from_secs_f64(v))
            } else {
                anyhow::bail!("{flag} must be between 0 and 86400 seconds, got {v}")
            }
        };
        let files = open_file_limit();
        let room = files.map(|f| f.saturating_sub(FD_RESERVE) / 2);
        let max_connections = match (self.max_connections, room) {
            (Some(0), _) => anyhow::bail!("--max-connections must be at least 1"),
            (Some(n), Some(room)) if n as u64 > room => anyhow::bail!(
                "--max-connections {n} is more than half the open-file limit ({} files, `ulimit -n`) allows; use at most {room} or raise the limit",
                files.unwrap_or(0)
            ),
            (Some(n), _) => n,
            (None, Some(room)) => (room as usize).clamp(1, 1024),
            (None, None) => 1024,
        };
        Ok(Limits {
            header_timeout: secs(self.header_timeout, "--header-timeout")?,
            body_timeout: secs(self.body_timeout, "--body-timeout")?,
            keep_alive_timeout: secs(self.keep_alive_timeout, "--keep-alive-timeout")?,
            max_connections,
            max_refusing: room
                .map_or(1024, |r| r as usize)
                .clamp(max_connections, 65_536),
        })
    }
}

/// The soft open-file limit (`ulimit -n`).
fn open_file_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// One open connection, as the accept loop and its own task see it.
struct Conn {
    /// Requests whose response is not yet fully sent.
    in_flight: AtomicUsize,
    /// Milliseconds since `Shared::epoch` when the last request ended (or it connected).
    idle_since_ms: AtomicU64,
    close: Notify,
    closing: AtomicBool,
}

/// What the accept loop and the connections share.
struct Shared {
    epoch: Instant,
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
    permits: Arc<Semaphore>,
    /// Refusals in progress (`refuse`), at most `Limits::max_refusing`.
    refusing: Arc<Semaphore>,
    cap_logged: AtomicBool,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Asks the oldest idle connection to close; false if none is idle.
    fn evict_oldest_idle(&self) -> bool {
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let victim = conns
            .values()
            .find(|c| c.in_flight.load(Ordering::SeqCst) == 0 && !c.closing.load(Ordering::SeqCst));
        match victim {
            Some(c) => {
                c.closing.store(true, Ordering::SeqCst);
                c.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Counts a request in flight until its response body is dropped.
struct InFlight {
    conn: Arc<Conn>,
    shared: Arc<Shared>,
}

impl InFlight {
    fn begin(conn: Arc<Conn>, shared: Arc<Shared>) -> Self {
        conn.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight { conn, shared }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.conn
            .idle_since_ms
            .store(self.shared.now_ms(), Ordering::SeqCst);
        self.conn.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that holds its request's `InFlight` until it is sent or dropped.
struct GuardedBody {
    inner: Body,
    _guard: InFlight,
}

impl http_body::Body for GuardedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then waits for open connections to
/// finish their requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let shared = Arc::new(Shared {
        epoch: Instant::now(),
        conns: Mutex::new(BTreeMap::new()),
        permits: Arc::new(Semaphore::new(limits.max_connections)),
        refusing: Arc::new(Semaphore::new(limits.max_refusing)),
        cap_logged: AtomicBool::new(false),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut next_id = 0u64;
    tokio::pin!(shutdown);
    loop {
        let (stream, remote) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, most likely: wait instead of spinning.
                    eprintln!("edge-llm serve: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let permit = match shared.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if !shared.cap_logged.swap(true, Ordering::SeqCst) {
                    eprintln!(
                        "edge-llm serve: {} connections open (--max-connections); closing idle ones to make room, refusing new ones when none is idle (logged once)",
                        limits.max_connections
                    );
                }
                let evicted = shared.evict_oldest_idle();
                let waited = if evicted {
                    tokio::time::timeout(
                        Duration::from_secs(1),
                        shared.permits.clone().acquire_owned(),
                    )
                    .await
                    .ok()
                    .and_then(Result::ok)
                } else {
                    None
                };
                match waited {
                    Some(p) => p,
                    None => {
                        // Past the refusals' room too: closed unanswered (a reset).
                        if let Ok(turn) = shared.refusing.clone().try_acquire_owned() {
                            tokio::spawn(async move {
                                refuse(stream).await;
                                drop(turn);
                            });
                        }
                        continue;
                    }
                }
            }
        };
        next_id += 1;
        let id = next_id;
        let conn = Arc::new(Conn {
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(shared.now_ms()),
            close: Notify::new(),
            closing: AtomicBool::new(false),
        });
        shared
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, conn.clone());
        let task_shared = shared.clone();
        let app = app.clone();
        let limits = limits.clone();
        let stop = stop_rx.clone();
        tokio::spawn(async move {
            serve_connection(
                stream,
                remote,
                app,
                &limits,
                conn,
                task_shared.clone(),
                stop,
            )
            .await;
            task_shared
                .conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            drop(permit);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a permit until its task ends.
    let _ = shared
        .permits
        .acquire_many(limits.max_connections as u32)
        .await;
}

/// Longest request head a refused connection reads before answering.
const REFUSAL_HEAD_BYTES: usize = 16 * 1024;
/// How long a refused connection has to send its request head.
const REFUSAL_HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// How long, and how many bytes, a refused connection is drained after its answer.
const REFUSAL_DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
const REFUSAL_DRAIN_BYTES: usize = 256 * 1024;

/// A connection over the cap with none idle to close: reads the request head, answers a 503
/// with `Retry-After` (or `/health`'s 200), shuts the write side and drains what the client
/// still sends, so that it reads the answer instead of a reset.
async fn refuse(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let read_head = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < REFUSAL_HEAD_BYTES {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(REFUSAL_HEAD_TIMEOUT, read_head).await;
    let request_line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut words = request_line.split(|&b| b == b' ');
    let is_health = words.next() == Some(b"GET")
        && words
            .next()
            .is_some_and(|target| target.split(|&b| b == b'?').next() == Some(b"/health"));
    let reply = if is_health {
        let body = super::routes::health().await.0.to_string();
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    } else {
        let body = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "too many open connections (--max-connections); retry later",
        )
        .with_code("too_many_connections")
        .body()
        .to_string();
        format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let answered = tokio::time::timeout(REFUSAL_HEAD_TIMEOUT, async {
        stream.write_all(reply.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
    if !matches!(answered, Ok(Ok(()))) {
        return;
    }
    // Closing with unread bytes would send a reset that can destroy the answer in flight.
    let drain = async {
        let mut drained = 0;
        while drained < REFUSAL_DRAIN_BYTES {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    };
    let _ = tokio::time::timeout(REFUSAL_DRAIN_TIMEOUT, drain).await;
}

/// How long an evicted connection's hyper may finish writing before it is dropped.
const EVICTION_GRACE: Duration = Duration::from_millis(50);

async fn serve_connection(
    stream: TcpStream,
    remote: SocketAddr,
    app: Router,
    limits: &Limits,
    conn: Arc<Conn>,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let svc_conn = conn.clone();
    let svc_shared = shared.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let mut app = app.clone();
        let guard = InFlight::begin(svc_conn.clone(), svc_shared.clone());
        let mut req = req.map(Body::new);
        req.extensions_mut().insert(ConnectInfo(remote));
        async move {
            let response: Response = match app.call(req).await {
                Ok(r) => r,
                Err(e) => match e {},
            };
            Ok::<_, Infallible>(response.map(|inner| {
                Body::new(GuardedBody {
                    inner,
                    _guard: guard,
                })
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let http = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(http);
    let idle = idle_expired(&conn, &shared, limits.keep_alive_timeout);
    tokio::pin!(idle);
    let mut stopping = false;
    loop {
        tokio::select! {
            _ = http.as_mut() => return,
            _ = &mut idle => return,
            _ = conn.close.notified() => {
                // Chosen while idle; a request parsed since is served, not cut. Hyper gets a
                // moment to flush the last bytes of a response that just ended.
                if conn.in_flight.load(Ordering::SeqCst) == 0 {
                    http.as_mut().graceful_shutdown();
                    match tokio::time::timeout(EVICTION_GRACE, http.as_mut()).await {
                        Ok(_) => return,
                        Err(_) if conn.in_flight.load(Ordering::SeqCst) == 0 => return,
                        Err(_) => {}
                    }
                }
                conn.closing.store(false, Ordering::SeqCst);
            }
            changed = stop.changed(), if !stopping => {
                stopping = true;
                if changed.is_ok() {
                    http.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// Resolves once the connection has had no request in flight for `timeout`.
async fn idle_expired(conn: &Conn, shared: &Shared, timeout: Duration) {
    let timeout_ms = timeout.as_millis() as u64;
    loop {
        let wait_ms = if conn.in_flight.load(Ordering::SeqCst) > 0 {
            timeout_ms
        } else {
            let since = conn.idle_since_ms.load(Ordering::SeqCst);
            let idle_for = shared.now_ms().saturating_sub(since);
            if idle_for >= timeout_ms && conn.in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            timeout_ms - idle_for.min(timeout_ms)
        };
        tokio::time::sleep(Duration::from_millis(wait_ms.max(10))).await;
    }
}

/// Middleware: refuses a body whose `Content-Length` is over the limit before reading it
/// (413), and reads the body within `--body-timeout` (408 when it does not arrive in time).
pub async fn read_body(
    max_body_bytes: usize,
    body_timeout: Duration,
    req: Request,
    next: Next,
) -> Response {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than {max_body_bytes} bytes (--max-body-bytes)"),
        )
        .with_code("body_too_large")
        .into_response()
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body_bytes as u64) {
        let mut r = too_large();
        r.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        return r;
    }
    let (parts, body) = req.into_parts();
    let bytes = match tokio::time::timeout(
        body_timeout,
        axum::body::to_bytes(body, max_body_bytes.saturating_add(1)),
    )
    .await
    {
        Err(_) => {
            let mut r = ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!(
                    "the request body did not arrive within {} s (--body-timeout)",
                    body_timeout.as_secs_f64()
                ),
            )
            .with_code("body_timeout")
            .into_response();
            r.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            return r;
        }
        // The limit (a chunked body that grew past it), or a client that stopped sending.
        Ok(Err(e)) if e.to_string().contains("length limit exceeded") => return too_large(),
        Ok(Err(e)) => {
            return ApiError::bad_request(format!("the request body could not be read: {e}"))
                .with_code("body_unreadable")
                .into_response()
        }
        Ok(Ok(b)) if b.len() > max_body_bytes => return too_large(),
        Ok(Ok(b)) => b,
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}
