//! Issue 30, item 7: without `--api-key`, a page on another site could drive the server (a
//! `no-cors` `text/plain` POST from headless Chromium ran completions and pinned blocks), and a
//! DNS-rebound name was served. Now a POST must be `application/json` (415), the `Host` must be
//! an address, localhost, the --host name or an --allowed-host (403), and an `Origin` must be
//! the server itself or an allowed host (403); `/health` answers whatever the host. The same
//! requests with the right headers, and everything with an API key, are served as before.

mod support;

use serde_json::json;
use support::harness::*;

fn completion(server: &Server, headers: &[(&str, &str)]) -> Response {
    let body = completion_body("Hi", json!({"max_tokens": 1})).to_string();
    server.request("POST", "/v1/completions", headers, body.as_bytes())
}

#[test]
fn cross_site_posts_and_foreign_hosts_are_refused_without_a_key() {
    let Some(server) = Server::start(&["--allowed-host", "box.lan"]) else {
        return;
    };
    let own_origin = format!("http://{}", server.addr);
    // What a cross-site page can send without a preflight: text/plain, a foreign Origin.
    let r = completion(&server, &[("Content-Type", "text/plain;charset=UTF-8")]);
    assert_eq!(r.status, 415, "{}", r.text());
    assert!(r.text().contains("application/json"), "{}", r.text());
    let r = completion(&server, &[]);
    assert_eq!(r.status, 415, "{}", r.text());
    let r = completion(
        &server,
        &[
            ("Content-Type", "application/json"),
            ("Origin", "https://evil.example"),
        ],
    );
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("cross-site"), "{}", r.text());
    let r = completion(
        &server,
        &[("Content-Type", "application/json"), ("Origin", "null")],
    );
    assert_eq!(r.status, 403, "{}", r.text());
    // A rebound name: refused on every route but /health, GET included.
    let rebound = [("Host", "evil.example:8080")];
    let r = completion(&server, &[("Content-Type", "application/json"), rebound[0]]);
    assert_eq!(r.status, 403, "{}", r.text());
    let r = server.request("GET", "/v1/models", &rebound, b"");
    assert_eq!(r.status, 403, "{}", r.text());
    let r = server.request("GET", "/health", &rebound, b"");
    assert_eq!(r.status, 200, "{}", r.text());
    // Served: JSON from the server's own page, through localhost or an allowed name.
    for headers in [
        vec![("Content-Type", "application/json")],
        // What the server's own page sends: its Host, and itself as the Origin.
        vec![
            ("Content-Type", "application/json; charset=utf-8"),
            ("Host", server.addr.as_str()),
            ("Origin", own_origin.as_str()),
        ],
        vec![
            ("Content-Type", "application/json"),
            ("Host", "localhost:1"),
        ],
        vec![
            ("Content-Type", "application/json"),
            ("Host", "box.lan"),
            ("Origin", "http://box.lan:3000"),
        ],
    ] {
        let r = completion(&server, &headers);
        assert_eq!(r.status, 200, "{headers:?}: {}", r.text());
    }
    // Nothing refused ran.
    assert_eq!(server.metric("edge_llm_requests_submitted_total"), 4.0);
}

#[test]
fn with_an_api_key_the_key_guards_instead() {
    let Some(server) = Server::start(&["--api-key", "sesame"]) else {
        return;
    };
    let r = completion(
        &server,
        &[
            ("Authorization", "Bearer sesame"),
            ("Host", "llm.internal:8080"),
        ],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = completion(
        &server,
        &[
            ("Content-Type", "text/plain"),
            ("Origin", "https://evil.example"),
        ],
    );
    assert_eq!(r.status, 401, "{}", r.text());
}
