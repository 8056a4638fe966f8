//! Cross-site requests and DNS rebinding, for a server without `--api-key` (with keys, a page on
//! another site cannot send the `Authorization` header, so the key guard covers it). A browser
//! lets any page send a "simple" POST (`text/plain`, `no-cors`) to 127.0.0.1, and a rebound
//! domain name lets a page read the answers. So, as llama.cpp's and Jupyter's servers do:
//!
//! - every `POST` must say `Content-Type: application/json` (a cross-site page cannot send that
//!   without a CORS preflight, which this server never grants): else 415;
//! - the `Host` must be an IP address, `localhost` (or a name under it), the `--host` name, or an
//!   `--allowed-host` (`*` allows any): a rebound name is none of these, so 403;
//! - an `Origin`, where the browser sends one, must be this very server (`scheme://` + `Host`)
//!   or an allowed host's: else 403. The chat page's own requests pass.
//!
//! `/health` is exempt (it tells nothing). Runs before the body is read.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::AppState;

/// Which hosts a server without keys answers (`--host` and `--allowed-host`).
#[derive(Clone, Debug, Default)]
pub struct AllowedHosts {
    /// Names (lower case, no port) besides IP addresses and `localhost`: `--host`'s and the
    /// `--allowed-host` ones.
    pub names: Vec<String>,
    /// The `--allowed-host` names alone: pages there may send requests (`Origin`).
    pub origins: Vec<String>,
    /// `--allowed-host '*'`: any host and origin.
    pub any: bool,
}

impl AllowedHosts {
    /// From `--host` and the `--allowed-host` values.
    pub fn new(bind_host: &str, extra: &[String]) -> Self {
        let origins: Vec<String> = extra.iter().map(|h| h.to_ascii_lowercase()).collect();
        let mut names = origins.clone();
        names.push(bind_host.to_ascii_lowercase());
        AllowedHosts {
            any: origins.iter().any(|n| n == "*"),
            names,
            origins,
        }
    }

    /// Whether a `Host` value (`name[:port]`) is one this server answers.
    pub fn host_allowed(&self, host: &str) -> bool {
        if self.any {
            return true;
        }
        let name = host_name(host).to_ascii_lowercase();
        let bare = name.trim_start_matches('[').trim_end_matches(']');
        bare.parse::<IpAddr>().is_ok()
            || name == "localhost"
            || name.ends_with(".localhost")
            || self.names.contains(&name)
    }

    /// Whether an `Origin` (`scheme://host[:port]`) may send requests here, given the request's
    /// `Host`.
    pub fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        if self.any {
            return true;
        }
        let Some((_, authority)) = origin.split_once("://") else {
            return false; // `null` (a sandboxed frame, a file) or garbage
        };
        if host.is_some_and(|h| h.eq_ignore_ascii_case(authority)) {
            return true;
        }
        let name = host_name(authority).to_ascii_lowercase();
        self.origins.contains(&name)
    }
}

/// The name of a `host[:port]` (IPv6 literals keep their brackets).
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

/// Whether a `Content-Type` is JSON's (`application/json`, parameters allowed).
fn is_json(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// The guard, for servers without API keys.
pub async fn same_site_only(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    check_same_site(!state.api_keys.is_empty(), &state.allowed_hosts, req, next).await
}

/// [`same_site_only`] for a server with or without keys (the encoder server's guard too).
pub(super) async fn check_same_site(
    has_keys: bool,
    allowed_hosts: &AllowedHosts,
    req: Request,
    next: Next,
) -> Response {
    if has_keys || req.uri().path() == "/health" {
        return next.run(req).await;
    }
    match refusal(allowed_hosts, &req) {
        Some(e) => e.into_response(),
        None => next.run(req).await,
    }
}

/// Why a request to a server with `api_keys` is refused by this guard, if it is (the front
/// router of several models).
pub fn refusal_without_keys(
    api_keys: &[(String, u64)],
    allowed: &AllowedHosts,
    req: &Request,
) -> Option<ApiError> {
    if !api_keys.is_empty() || req.uri().path() == "/health" {
        return None;
    }
    refusal(allowed, req)
}

/// Why a request is refused, if it is.
fn refusal(allowed: &AllowedHosts, req: &Request) -> Option<ApiError> {
    let headers = req.headers();
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let host = text(header::HOST).or_else(|| req.uri().authority().map(|a| a.as_str()));
    let forbidden = |message: String| {
        Some(
            ApiError::new(StatusCode::FORBIDDEN, "permission_error", message)
                .with_code("forbidden"),
        )
    };
    match host {
        Some(h) if allowed.host_allowed(h) => {}
        Some(h) => {
            return forbidden(format!(
                "this server does not answer for host `{h}` (a request through another name may be \
                 a DNS-rebinding page); use its address or localhost, or start it with \
                 --allowed-host NAME or --api-key"
            ))
        }
        None => return forbidden("the request has no Host header".into()),
    }
    if let Some(origin) = text(header::ORIGIN) {
        if !allowed.origin_allowed(origin, host) {
            return forbidden(format!(
                "requests from pages on `{origin}` are refused (cross-site); start the server \
                 with --allowed-host NAME for that site, or --api-key"
            ));
        }
    }
    if req.method() == Method::POST && !text(header::CONTENT_TYPE).is_some_and(is_json) {
        return Some(
            ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                "send the body as JSON with `Content-Type: application/json` \
                 (curl: -H 'Content-Type: application/json')",
            )
            .with_code("unsupported_media_type"),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_origins() {
        let a = AllowedHosts::new("127.0.0.1", &["box.lan".into()]);
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "[::1]:8080",
            "10.0.0.5",
            "box.lan:80",
            "app.localhost:1",
        ] {
            assert!(a.host_allowed(ok), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "x",
        ] {
            assert!(!a.host_allowed(bad), "{bad}");
        }
        let host = Some("127.0.0.1:8080");
        assert!(a.origin_allowed("http://127.0.0.1:8080", host));
        assert!(a.origin_allowed("http://box.lan:3000", host));
        assert!(!a.origin_allowed("http://127.0.0.1:3000", host));
        assert!(!a.origin_allowed("https://evil.example", host));
        assert!(!a.origin_allowed("null", host));
        assert!(AllowedHosts::new("127.0.0.1", &["*".into()]).origin_allowed("null", host));
        assert!(is_json("application/json; charset=utf-8") && !is_json("text/plain"));
    }
}
