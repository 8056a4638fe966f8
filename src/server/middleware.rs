//! What wraps every route: the one log line per request on stderr, the `--api-key` guard
//! (every route but `/health` and the chat page's static files), and OpenAI-style JSON for requests no route takes (404, 405).
//! Installed by `server::router`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::AppState;

/// Who asked for what, and when; handlers that stream read it to log when the stream ends.
#[derive(Clone, Debug)]
pub struct RequestInfo {
    pub remote: SocketAddr,
    pub method: Method,
    pub path: String,
    pub started: Instant,
    /// The prefix-cache salt of the API key the request came with (set by the key guard).
    pub cache_key: Option<u64>,
}

impl RequestInfo {
    /// Writes the request's log line: who, what, status, time, and what happened.
    pub fn log(&self, status: StatusCode, note: &str) {
        let ms = self.started.elapsed().as_secs_f64() * 1000.0;
        let sep = if note.is_empty() { "" } else { " " };
        eprintln!(
            "{} {} {} {} {ms:.0}ms{sep}{note}",
            self.remote,
            self.method,
            self.path,
            status.as_u16()
        );
    }
}

/// Details a handler adds to its request's log line (token counts, the error message).
#[derive(Clone, Debug)]
pub struct LogNote(pub String);

/// Marks a response whose body writes the log line itself when it ends (streams).
#[derive(Clone, Copy, Debug)]
pub struct LoggedByBody;

/// Logs every request once; gives a 405 a JSON body.
pub async fn log_requests(
    ConnectInfo(remote): ConnectInfo<SocketAddr>,
    mut req: Request,
    next: Next,
) -> Response {
    let info = RequestInfo {
        remote,
        method: req.method().clone(),
        path: req.uri().path().to_string(),
        started: Instant::now(),
        cache_key: None,
    };
    req.extensions_mut().insert(info.clone());
    // If the client hangs up first, hyper drops this future (and the handler's, which
    // aborts its request): the guard still writes the line.
    let mut guard = HangUpGuard(Some(info.clone()));
    let mut response = next.run(req).await;
    guard.0 = None;
    if response.status() == StatusCode::METHOD_NOT_ALLOWED
        && response.extensions().get::<LogNote>().is_none()
    {
        let message = format!("{} is not allowed on {}", info.method, info.path);
        let allow = response.headers().get(header::ALLOW).cloned();
        response = ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            message,
        )
        .into_response();
        if let Some(allow) = allow {
            response.headers_mut().insert(header::ALLOW, allow);
        }
    }
    if response.extensions().get::<LoggedByBody>().is_none() {
        let note = response
            .extensions()
            .get::<LogNote>()
            .map(|n| n.0.as_str())
            .unwrap_or("");
        info.log(response.status(), note);
    }
    response
}

/// Logs a request whose client left before the response was ready.
struct HangUpGuard(Option<RequestInfo>);

impl Drop for HangUpGuard {
    fn drop(&mut self) {
        if let Some(info) = &self.0 {
            // 499: nginx's "client closed request".
            let status = StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST);
            info.log(status, "client disconnected before the response; aborted");
        }
    }
}

/// With `--api-key`, every route but `/health` and the page needs `Authorization: Bearer KEY`
/// (or Anthropic's `x-api-key: KEY`)
/// (a browser cannot send the header when it opens the page; the page then asks for the key).
pub async fn require_api_key(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    check_api_key(&state.api_keys, req, next).await
}

/// [`require_api_key`] against `api_keys` (the encoder server's guard too).
pub(super) async fn check_api_key(
    api_keys: &[(String, u64)],
    mut req: Request,
    next: Next,
) -> Response {
    match key_salt(api_keys, &req) {
        Ok(salt) => {
            if let (Some(salt), Some(info)) = (salt, req.extensions_mut().get_mut::<RequestInfo>())
            {
                info.cache_key = Some(salt);
            }
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

/// Why `req` is refused by the key guard, if it is (the front router of several models).
pub fn key_refusal(api_keys: &[(String, u64)], req: &Request) -> Option<ApiError> {
    key_salt(api_keys, req).err()
}

/// The salt of the key `req` carries (None: no key needed), or why it is refused.
fn key_salt(api_keys: &[(String, u64)], req: &Request) -> Result<Option<u64>, ApiError> {
    if api_keys.is_empty()
        || req.uri().path() == "/health"
        || super::webui::is_public(req.uri().path())
    {
        return Ok(None);
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .or_else(|| {
            // Anthropic's clients send the key in `x-api-key`.
            req.headers().get("x-api-key").and_then(|v| v.to_str().ok())
        })
        .map(str::trim);
    // Every key is compared, so the time taken does not tell which one matched.
    let matched = given.and_then(|given| {
        api_keys.iter().fold(None, |found, (key, salt)| {
            let same = same_secret(given.as_bytes(), key.as_bytes());
            found.or(same.then_some(*salt))
        })
    });
    match (given, matched) {
        (_, Some(salt)) => Ok(Some(salt)),
        (Some(_), None) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid API key",
        )
        .with_code("invalid_api_key")),
        (None, None) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "this server needs an API key: send the header `Authorization: Bearer KEY` or `x-api-key: KEY`",
        )
        .with_code("invalid_api_key")),
    }
}

/// Compares without stopping at the first difference.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The answer for a path no route serves.
pub async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("no route for {} {}", req.method(), req.uri().path()),
    )
    .with_code("not_found")
}
