//! The chat page at `GET /`, driven in a real headless Chromium (Debian's `chromium` and
//! `chromedriver`, installed by scripts/test.sh) against the real `edge-llm serve` on the
//! default model: streaming, stop, two conversations at once, fork, regenerate,
//! edit-and-resend, the cached-token count of a repeated system prompt, HTML in a reply shown
//! as text, rename/delete/reload, the engine panel, the API key; and, without a browser,
//! that the page is embedded and nothing else is served. Screenshots go to
//! `target/webui-screenshots/` (or `$EDGE_LLM_SCREENSHOTS`).

mod support;

use std::path::PathBuf;

use serde_json::{json, Value};
use support::harness::*;
use support::webdriver::Browser;

const ENTER: &str = "\u{E007}";

fn screenshot_dir() -> PathBuf {
    std::env::var_os("EDGE_LLM_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/webui-screenshots")
        })
}

/// The conversations as the page keeps them in localStorage.
fn stored(b: &Browser) -> Vec<Value> {
    let v = b.js(
        "return JSON.parse(localStorage.getItem('edge-llm.conversations') || '[]')",
        json!([]),
    );
    v.as_array().cloned().unwrap_or_default()
}

/// The stored conversation titled `title`, or else the first whose title starts with it.
fn stored_conv(b: &Browser, title: &str) -> Value {
    let all = stored(b);
    let title_of = |c: &Value| c["title"].as_str().unwrap_or("").to_string();
    all.iter()
        .find(|c| title_of(c) == title)
        .or_else(|| all.iter().find(|c| title_of(c).starts_with(title)))
        .cloned()
        .unwrap_or_else(|| panic!("no conversation titled {title:?}: {all:?}"))
}

fn streaming(b: &Browser) -> bool {
    b.count("#messages .msg.assistant.streaming") > 0
}

/// Text of the reply being streamed in the active conversation.
fn streaming_text(b: &Browser) -> String {
    b.js(
        "const m = document.querySelector('#messages .msg.streaming .msg-body'); return m ? m.textContent : ''",
        json!([]),
    )
    .as_str()
    .unwrap_or("")
    .to_string()
}

/// The `data-value` of a figure under the last reply (`stat-cached`, `stat-tps`, ...).
fn last_stat(b: &Browser, class: &str) -> Option<f64> {
    let v = b.js(
        "const all = document.querySelectorAll('#messages .msg.assistant');
         const s = all.length ? all[all.length - 1].querySelector('.' + arguments[0]) : null;
         return s ? Number(s.dataset.value) : null",
        json!([class]),
    );
    v.as_f64()
}

/// Types into the message box and sends with Enter.
fn send(b: &Browser, text: &str) {
    b.fill("#input", text);
    b.keys("#input", ENTER);
}

fn wait_reply_done(b: &Browser) {
    b.wait("the reply to finish", 180, |b| {
        !streaming(b) && b.count("#messages .msg.assistant .stats") > 0
    });
}

fn settings(b: &Browser, fields: &[(&str, &str)]) {
    b.click("#settings-toggle");
    for (id, value) in fields {
        b.fill(&format!("#{id}"), value);
    }
    b.click("#settings-toggle");
}

/// Tokens the two chats' prompts share, counted in full KV blocks: what a prefix cache can
/// hand the second one.
fn shared_full_blocks(server: &Server, a: &Value, b: &Value, block_size: usize) -> usize {
    let ids = |messages: &Value| -> Vec<u64> {
        let (status, v) = server.post("/tokenize", &json!({"messages": messages}));
        assert_eq!(status, 200, "{v}");
        v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect()
    };
    let (a, b) = (ids(a), ids(b));
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    common / block_size * block_size
}

#[test]
fn page_streams_stops_runs_two_chats_at_once_forks_and_shows_cached_tokens() {
    let Some(server) = Server::start(&["-c", "2048"]) else {
        return;
    };
    let Some(b) = Browser::start(1200, 800) else {
        return;
    };
    let url = format!("http://{}/", server.addr);
    b.goto(&url);
    b.wait("the model's name", 30, |b| {
        b.text("#model-name") == "SmolLM2-135M-Instruct.Q4_1"
    });
    b.wait("the engine panel", 30, |b| {
        b.text("#engine-kv-free").parse::<u32>().is_ok()
    });

    // A unique system prompt, so the first chat finds nothing cached.
    let system = format!(
        // Eight digits whatever the process id (each digit is a token): the prompt's length,
        // and so its full blocks, must not depend on the id.
        "Session {:08}. You are a concise assistant running on a small computer. Answer in one or two \
         short sentences, plainly, without lists, and never invent facts you do not know.",
        std::process::id()
    );
    settings(
        &b,
        &[
            ("system", &system),
            ("temperature", "0"),
            ("max-tokens", "40"),
        ],
    );

    // 1. Send a message: the reply streams in (seen while still streaming), then its figures.
    let question = "What is the capital of France?";
    send(&b, question);
    b.wait("the reply to start streaming", 60, |b| {
        streaming(b) && !streaming_text(b).is_empty()
    });
    wait_reply_done(&b);
    let first = stored_conv(&b, "What is the capital");
    let reply = first["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!reply.is_empty());
    // The page sent the system prompt, the message and the settings: the server gives the
    // same text to the same request.
    let messages =
        json!([{"role": "system", "content": system}, {"role": "user", "content": question}]);
    let (status, direct) = server.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 40, "temperature": 0}),
    );
    assert_eq!(status, 200, "{direct}");
    assert_eq!(direct["choices"][0]["message"]["content"], json!(reply));
    assert!(last_stat(&b, "stat-tps").is_some_and(|v| v > 0.0));
    assert!(last_stat(&b, "stat-ttft").is_some_and(|v| v > 0.0));
    assert_eq!(
        last_stat(&b, "stat-cached"),
        Some(0.0),
        "a new system prompt"
    );

    // 2. A second chat with the same system prompt: its prompt comes from the cache, and the
    // page shows as many cached tokens as the two prompts share in full blocks.
    b.click("#new-chat");
    let question2 = "Name one large animal.";
    send(&b, question2);
    wait_reply_done(&b);
    let messages2 =
        json!([{"role": "system", "content": system}, {"role": "user", "content": question2}]);
    let expected = shared_full_blocks(&server, &messages, &messages2, 16);
    assert!(expected >= 48, "the system prompt spans {expected} tokens");
    assert_eq!(
        last_stat(&b, "stat-cached"),
        Some(expected as f64),
        "cached tokens of the repeated system prompt"
    );
    let shown = b.text("#messages .msg.assistant .stat-cached");
    assert!(shown.starts_with(&format!("{expected} of ")), "{shown}");

    // 3. Stop a reply mid-way: the text stops growing, the server aborts the request and
    // its blocks come back.
    settings(&b, &[("max-tokens", "400")]);
    b.click("#new-chat");
    let aborted_before = server.metric("edge_llm_requests_aborted_total");
    send(
        &b,
        "Write a long story about a dragon who learns to fly, with many details.",
    );
    b.wait("some of the story", 120, |b| streaming_text(b).len() > 60);
    b.click("#stop");
    b.wait("the stop", 30, |b| !streaming(b));
    assert_eq!(last_stat(&b, "stat-stopped"), Some(1.0));
    let stopped = stored_conv(&b, "Write a long story");
    let stopped_text = stopped["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(stopped_text.len() > 60);
    server.wait_for_metrics("the abort", |s| {
        s.metric("edge_llm_requests_aborted_total") > aborted_before
            && s.metric("edge_llm_requests_running") == 0.0
            && s.metric("edge_llm_kv_blocks{state=\"used\"}") == 0.0
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    let after = stored_conv(&b, "Write a long story");
    assert_eq!(after["messages"][1]["content"], json!(stopped_text));
    let tokens_at_stop = stopped_text.split_whitespace().count();
    assert!(tokens_at_stop < 300, "stopped after {tokens_at_stop} words");

    // 4. Two conversations at once: both marked generating in the list, and the engine panel
    // shows two sessions running.
    // A fixed system prompt under which both poems run to the token limit (greedy), so the
    // two generations overlap for seconds on any machine.
    settings(
        &b,
        &[
            (
                "system",
                "You are a poet. You write long, detailed poems with many stanzas.",
            ),
            ("max-tokens", "400"),
        ],
    );
    b.click("#new-chat");
    send(&b, "Describe the sea in a long poem.");
    b.wait("the first to stream", 60, |b| !streaming_text(b).is_empty());
    b.click("#new-chat");
    send(&b, "Describe the mountains in a long poem.");
    b.wait("both conversations generating", 60, |b| {
        b.count("#conversation-list .conv-item.generating") == 2
    });
    b.wait("the engine panel to show two sessions", 60, |b| {
        b.text("#engine-running") == "2"
    });
    b.wait("both to finish", 240, |b| {
        b.count("#conversation-list .conv-item.generating") == 0
    });
    for title in ["Describe the sea", "Describe the mountains"] {
        let c = stored_conv(&b, title);
        assert_eq!(c["messages"].as_array().unwrap().len(), 2, "{c}");
        assert!(!c["messages"][1]["content"].as_str().unwrap().is_empty());
    }
    settings(&b, &[("system", &system)]);

    // 5. Fork the first chat at its reply: the fork has the two messages, goes on from the
    // cache, and the original stays as it was.
    b.click("#conversation-list .conv-item:last-child .conv-open");
    b.wait("the first chat", 10, |b| {
        b.text("#conv-title").starts_with("What is the capital")
    });
    b.click("#messages .msg.assistant[data-index='1'] button.fork");
    b.wait("the fork", 10, |b| {
        b.text("#conv-title").ends_with("(fork)")
    });
    assert_eq!(b.count("#messages .msg"), 2);
    settings(&b, &[("max-tokens", "24")]);
    send(&b, "And the capital of Germany?");
    wait_reply_done(&b);
    let fork = stored_conv(&b, "What is the capital of France? (fork)");
    assert_eq!(fork["messages"].as_array().unwrap().len(), 4, "{fork}");
    assert_eq!(fork["messages"][1]["content"], json!(reply));
    let fork_cached = last_stat(&b, "stat-cached").unwrap();
    assert!(
        fork_cached >= expected as f64 + 16.0,
        "the fork's prompt should come from the cache past the system prompt: {fork_cached} cached"
    );
    let original = stored_conv(&b, "What is the capital of France?");
    assert_eq!(original["messages"].as_array().unwrap().len(), 2);

    // 6. Regenerate (greedy: the same text again), then edit-and-resend.
    let fork_reply = fork["messages"][3]["content"].clone();
    b.click("#messages .msg.assistant[data-index='3'] button.regenerate");
    b.wait("the regenerated reply", 120, |b| {
        !streaming(b) && b.count("#messages .msg.assistant[data-index='3'] .stats") > 0
    });
    let fork = stored_conv(&b, "What is the capital of France? (fork)");
    assert_eq!(fork["messages"][3]["content"], fork_reply);
    // Sampling with a seed: the settings reach the server, and the same seed regenerates the
    // same text.
    settings(&b, &[("temperature", "1.2"), ("seed", "7")]);
    let mut sampled = Vec::new();
    for _ in 0..2 {
        b.click("#messages .msg.assistant[data-index='3'] button.regenerate");
        b.wait("the sampled reply", 120, |b| {
            !streaming(b) && b.count("#messages .msg.assistant[data-index='3'] .stats") > 0
        });
        let fork = stored_conv(&b, "What is the capital of France? (fork)");
        sampled.push(fork["messages"][3]["content"].clone());
    }
    assert_eq!(sampled[0], sampled[1], "the same seed");
    settings(&b, &[("temperature", "0"), ("seed", "")]);
    b.click("#messages .msg.user[data-index='2'] button.edit");
    b.fill("#edit-area", "And the capital of Italy?");
    b.click("#messages .save-edit");
    b.wait("the edited message's reply", 120, |b| {
        !streaming(b) && b.count("#messages .msg.assistant[data-index='3'] .stats") > 0
    });
    let fork = stored_conv(&b, "What is the capital of France? (fork)");
    assert_eq!(fork["messages"].as_array().unwrap().len(), 4);
    assert_eq!(
        fork["messages"][2]["content"],
        json!("And the capital of Italy?")
    );

    // 7. HTML in a reply is shown as text: the model echoes a tag, and an edited reply holds
    // more; no element is made from either and no handler runs.
    settings(&b, &[("max-tokens", "40"), ("system", "")]);
    b.click("#new-chat");
    send(
        &b,
        "Say the following HTML tag back to me verbatim: <img src=x onerror=window.__xss=1>",
    );
    wait_reply_done(&b);
    let made = b.js(
        "return {tags: document.querySelectorAll('#messages img').length, xss: window.__xss === undefined ? null : window.__xss}",
        json!([]),
    );
    assert_eq!(
        made,
        json!({"tags": 0, "xss": null}),
        "the reply's HTML became elements"
    );
    let body = b.text("#messages .msg.assistant .msg-body");
    assert!(
        body.contains("<img src=\"x\" onerror=\"window.__xss=1\""),
        "the model's reply should show the tag as text: {body:?}"
    );
    b.screenshot(&screenshot_dir().join("html-echo.png"));
    let injected =
        "<script>window.__xss=2</script><img src=x onerror=window.__xss=3>\n\n**bold** and \
                    <b>not bold</b>\n\n```html\n<iframe src=\"/\"></iframe>\n```";
    b.click("#messages .msg.assistant button.edit");
    b.fill("#edit-area", injected);
    b.click("#messages .save-edit");
    b.wait("the edited reply", 10, |b| b.count("#edit-area") == 0);
    let found = b.js(
        "const m = document.getElementById('messages');
         return {tags: m.querySelectorAll('img, script, iframe, b').length, strong: m.querySelectorAll('strong').length,
                 xss: window.__xss === undefined ? null : window.__xss, text: m.textContent}",
        json!([]),
    );
    assert_eq!(found["tags"], json!(0), "{found}");
    assert_eq!(found["xss"], Value::Null, "a handler ran: {found}");
    assert_eq!(found["strong"], json!(1), "Markdown still renders: {found}");
    let text = found["text"].as_str().unwrap();
    for shown in [
        "<script>window.__xss=2</script>",
        "<b>not bold</b>",
        "<iframe src=\"/\"></iframe>",
    ] {
        assert!(text.contains(shown), "{shown} should show as text: {text}");
    }
    assert!(b.count("#messages .code-block .copy") >= 1);
    b.screenshot(&screenshot_dir().join("html-as-text.png"));

    // 8. Rename, delete, and a reload keeps the conversations.
    let before = b.count("#conversation-list .conv-item");
    b.click("#conversation-list .conv-item.active .conv-rename");
    // The old name is selected: typing replaces it (a WebDriver clear would blur, which saves).
    b.keys(
        "#conversation-list .rename-input",
        &format!("Safety check{ENTER}"),
    );
    b.wait("the new name", 10, |b| {
        b.text("#conv-title") == "Safety check"
    });
    b.click("#conversation-list .conv-item:nth-child(2) .conv-delete");
    b.accept_alert();
    b.wait("one conversation fewer", 10, |b| {
        b.count("#conversation-list .conv-item") == before - 1
    });
    b.goto(&url);
    b.wait("the list after a reload", 30, |b| {
        b.count("#conversation-list .conv-item") == before - 1
    });
    assert_eq!(b.text("#conv-title"), "Safety check");

    // Screenshots: a code reply on a desktop, and the same page at phone width.
    settings(&b, &[("max-tokens", "120")]);
    b.click("#new-chat");
    send(
        &b,
        "Write a Python function that adds two numbers, in a code block.",
    );
    wait_reply_done(&b);
    assert!(
        b.count("#messages .code-block") >= 1,
        "the reply has no code block"
    );
    b.set_window(1100, 720);
    b.screenshot(&screenshot_dir().join("desktop.png"));
    b.set_window(400, 860);
    b.wait("the phone layout", 10, |b| {
        b.js(
            "return getComputedStyle(document.getElementById('menu-toggle')).display",
            json!([]),
        ) != json!("none")
    });
    let overflow = b.js(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth",
        json!([]),
    );
    assert_eq!(
        overflow,
        json!(0),
        "the page scrolls sideways at phone width"
    );
    b.screenshot(&screenshot_dir().join("phone.png"));
    b.click("#menu-toggle");
    b.wait("the drawer", 10, |b| {
        b.js(
            "return document.getElementById('sidebar').classList.contains('open')",
            json!([]),
        ) == json!(true)
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    b.screenshot(&screenshot_dir().join("phone-drawer.png"));
    b.click("#menu-toggle");
    b.click("#settings-toggle");
    b.wait("the settings at phone width", 10, |b| {
        b.js(
            "const r = document.getElementById('settings').getBoundingClientRect(); return r.width > 200 && r.right <= innerWidth",
            json!([]),
        ) == json!(true)
    });
    b.screenshot(&screenshot_dir().join("phone-settings.png"));

    server.wait_for_metrics("every block back", |s| {
        s.metric("edge_llm_kv_blocks{state=\"used\"}") == 0.0
    });
}

#[test]
fn page_asks_for_the_api_key_and_sends_it() {
    let Some(server) = Server::start(&["--api-key", "page-secret"]) else {
        return;
    };
    let Some(b) = Browser::start(1000, 760) else {
        return;
    };
    b.goto(&format!("http://{}/", server.addr));
    b.wait("the key dialog", 30, |b| b.count("#key-dialog[open]") == 1);
    assert_eq!(b.text("#model-name"), "not connected");
    b.screenshot(&screenshot_dir().join("api-key.png"));
    b.fill("#api-key", "wrong");
    b.click("#key-submit");
    b.wait("the refusal", 30, |b| {
        b.text("#key-error").contains("invalid API key")
    });
    assert_eq!(b.count("#key-dialog[open]"), 1);
    b.fill("#api-key", "page-secret");
    b.click("#key-submit");
    b.wait("the model's name", 30, |b| {
        b.text("#model-name") == "SmolLM2-135M-Instruct.Q4_1"
    });
    assert_eq!(b.count("#key-dialog[open]"), 0);
    b.wait("the engine panel", 30, |b| {
        b.text("#engine-kv-free").parse::<u32>().is_ok()
    });
    settings(&b, &[("temperature", "0"), ("max-tokens", "16")]);
    send(&b, "Hello!");
    wait_reply_done(&b);
    let v = stored(&b);
    let reply = &v[0]["messages"][1];
    assert!(reply.get("error").is_none(), "{reply}");
    assert!(!reply["content"].as_str().unwrap().is_empty(), "{reply}");
    // The key went to the server: a request without it is refused.
    assert_eq!(server.get("/v1/models").0, 401);
}

#[test]
fn the_page_is_embedded_and_nothing_else_is_served_on_all_interfaces() {
    let Some(server) = Server::start(&["--host", "0.0.0.0", "--api-key", "k"]) else {
        return;
    };
    let auth = [("Authorization", "Bearer k")];
    // The page and its files need no key; their bytes are the files in the source tree.
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/server/webui");
    for (path, file, kind) in [
        ("/", "index.html", "text/html"),
        ("/webui/app.js", "app.js", "text/javascript"),
        ("/webui/app.css", "app.css", "text/css"),
        ("/webui/markdown.js", "markdown.js", "text/javascript"),
        ("/webui/icon.svg", "icon.svg", "image/svg+xml"),
    ] {
        let r = server.request("GET", path, &[], b"");
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert!(
            r.header("content-type")
                .is_some_and(|t| t.starts_with(kind)),
            "{path}: {:?}",
            r.header("content-type")
        );
        assert!(r
            .header("content-security-policy")
            .is_some_and(|c| c.contains("script-src 'self'")));
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(r.body, std::fs::read(dir.join(file)).unwrap(), "{path}");
    }
    // Everything else still needs the key, and no path reaches the file system.
    assert_eq!(server.get("/metrics").0, 401);
    assert_eq!(server.get("/v1/models").0, 401);
    for path in [
        "/Cargo.toml",
        "/webui/",
        "/webui/../Cargo.toml",
        "/webui/..%2fCargo.toml",
        "/webui/%2e%2e%2f%2e%2e%2fCargo.toml",
        "/webui/index.html/../../Cargo.toml",
        "/src/server/webui/app.js",
        "/webui/app.js/x",
        "/etc/passwd",
        "/webui/%2fetc%2fpasswd",
        "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    ] {
        let r = server.request("GET", path, &auth, b"");
        assert_eq!(r.status, 404, "{path}: {}", r.text());
        assert!(!r.text().contains("[package]") && !r.text().contains("root:"));
    }
    let r = server.request("POST", "/", &auth, b"{}");
    assert_eq!(r.status, 405, "{}", r.text());
}
