//! The chat page at `GET /`: plain HTML, CSS and JavaScript under `src/server/webui/`,
//! compiled into the binary with `include_str!`. The page only calls the server's own
//! OpenAI routes (`/v1/models`, `/v1/chat/completions`) and `/metrics`, so it works with no
//! network. Nothing here reads the file system: a path that is not in [`ASSETS`] is a 404,
//! whatever `--host` the server binds.
//!
//! The page and its assets are public (like `/health`): with `--api-key` the page asks for the
//! key and sends it as `Authorization: Bearer` on the routes it calls. Installed by
//! `server::router`; the API-key guard asks [`is_public`].

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// One embedded file: its name under `/webui/`, its content type and its bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const INDEX_HTML: &str = include_str!("webui/index.html");

/// Every file the page loads besides `index.html`, served at `/webui/NAME`.
const ASSETS: &[Asset] = &[
    Asset {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("webui/app.css"),
    },
    Asset {
        name: "markdown.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("webui/markdown.js"),
    },
    Asset {
        name: "store.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("webui/store.js"),
    },
    Asset {
        name: "api.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("webui/api.js"),
    },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("webui/app.js"),
    },
    Asset {
        name: "icon.svg",
        content_type: "image/svg+xml",
        body: include_str!("webui/icon.svg"),
    },
];

/// Scripts and styles only from this server, no inline script, no plugins, no framing:
/// even markup that slipped into the page could not run.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Whether `path` is the page or one of its assets (served without the API key).
pub fn is_public(path: &str) -> bool {
    path == "/" || path == "/index.html" || path.starts_with("/webui/")
}

/// `GET /`: the page.
pub async fn index() -> Response {
    embedded("text/html; charset=utf-8", INDEX_HTML)
}

/// `GET /webui/{name}`: one of [`ASSETS`], or a 404 naming what exists.
pub async fn asset(Path(name): Path<String>) -> Result<Response, ApiError> {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => Ok(embedded(a.content_type, a.body)),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "no page asset `{name}`; the page has {}",
                ASSETS.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
            ),
        )
        .with_code("not_found")),
    }
}

fn embedded(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // The assets change with the binary: a browser asks again after a restart.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_only_embedded_assets() {
        for line in INDEX_HTML.lines() {
            for attr in ["src=\"", "href=\""] {
                if let Some(rest) = line.split(attr).nth(1) {
                    let target = rest.split('"').next().unwrap();
                    if target.starts_with('#') {
                        continue; // a link within the page
                    }
                    let name = target.strip_prefix("/webui/").unwrap_or_else(|| {
                        panic!("{target} is not an embedded asset (line {line:?})")
                    });
                    assert!(
                        ASSETS.iter().any(|a| a.name == name),
                        "{name} is not in ASSETS"
                    );
                }
            }
        }
    }

    #[test]
    fn public_paths_are_the_page_only() {
        assert!(is_public("/"));
        assert!(is_public("/webui/app.js"));
        assert!(!is_public("/metrics"));
        assert!(!is_public("/v1/models"));
    }
}
