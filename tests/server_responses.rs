//! The OpenAI Responses API through the real server on Qwen2.5 Coder 0.5B: plain and streamed
//! responses (events in OpenAI's order, `sequence_number` increasing, deltas joining to the
//! whole response), a function tool round trip, a `custom` tool, `previous_response_id` and the
//! store (another API key gets 404), `text.format`, bad input naming the field, a hang-up
//! freeing its blocks, `input_tokens`; then the official `openai` client and the openai-agents
//! SDK (tests/openai_responses.py) and Codex CLI (`codex exec`, from npm) against the server.

mod support;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::harness::*;
use support::{
    fetched, qwen_1_5b_path, qwen_path, skip_or_fail, FETCH_EXTRA_MODELS, FETCH_SPEC_MODELS,
};

fn qwen_server(extra: &[&str]) -> Option<Server> {
    let path = fetched(qwen_path(), FETCH_EXTRA_MODELS)?;
    let mut args = vec!["-m", path.to_str().unwrap()];
    if !extra.contains(&"-c") {
        args.extend(["-c", "4096"]);
    }
    args.extend(extra);
    let args: Vec<String> = args.into_iter().map(String::from).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(&args)
}

fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})
}

/// The text of a whole response's message items.
fn output_text(r: &Value) -> String {
    r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().clone())
        .map(|p| p["text"].as_str().unwrap().to_string())
        .collect()
}

/// The events of a streamed response, each event's name checked against its `type`.
fn stream_events(server: &Server, body: &Value) -> Vec<Value> {
    server
        .post_events("/v1/responses", body)
        .into_iter()
        .map(|(name, v)| {
            assert_eq!(v["type"], json!(name), "{v}");
            v
        })
        .collect()
}

#[test]
fn responses_whole_streamed_tools_store_and_errors() {
    let Some(server) = qwen_server(&[]) else {
        return;
    };
    // Plain.
    let body =
        json!({"model": "any", "input": "Say hello.", "max_output_tokens": 16, "temperature": 0});
    let (status, whole) = server.post("/v1/responses", &body);
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "response");
    assert!(whole["id"].as_str().unwrap().starts_with("resp_"));
    assert!(!output_text(&whole).is_empty(), "{whole}");
    let usage = &whole["usage"];
    assert!(usage["input_tokens"].as_u64().unwrap() > 0, "{whole}");
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap()
    );
    // `input_tokens` counts what the same body runs.
    let (status, counted) = server.post("/v1/responses/input_tokens", &body);
    assert_eq!(status, 200, "{counted}");
    assert_eq!(counted["object"], "response.input_tokens");
    assert_eq!(counted["input_tokens"], usage["input_tokens"], "{counted}");

    // Streamed: OpenAI's order, numbered, joining to the whole response.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = stream_events(&server, &streamed);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let expected_start = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ];
    assert_eq!(kinds[..5], expected_start, "{kinds:?}");
    let tail = &kinds[kinds.len() - 4..];
    assert_eq!(
        tail[..3],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done"
        ],
        "{kinds:?}"
    );
    assert!(
        ["response.completed", "response.incomplete"].contains(&tail[3]),
        "{kinds:?}"
    );
    for (n, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], json!(n), "{e}");
    }
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    let done = events
        .iter()
        .find(|e| e["type"] == "response.output_text.done")
        .unwrap();
    assert_eq!(done["text"], json!(deltas));
    assert_eq!(deltas, output_text(&whole), "streamed and whole differ");
    let last = &events.last().unwrap()["response"];
    assert!(last["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(last["usage"]["output_tokens"], usage["output_tokens"]);

    // A function tool round trip.
    let question = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let (status, r) = server.post(
        "/v1/responses",
        &json!({"input": question, "tools": [weather_tool()], "tool_choice": "required",
                "parallel_tool_calls": false, "temperature": 0}),
    );
    assert_eq!(status, 200, "{r}");
    let call = &r["output"][0];
    assert_eq!(call["type"], "function_call", "{r}");
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["status"], "completed");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string(), "{args}");
    let mut follow = question.as_array().unwrap().clone();
    follow.push(call.clone());
    follow.push(json!({"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny, 21 C"}));
    let (status, r2) = server.post(
        "/v1/responses",
        &json!({"input": follow, "tools": [weather_tool()], "tool_choice": "none",
                "temperature": 0, "max_output_tokens": 30}),
    );
    assert_eq!(status, 200, "{r2}");
    assert!(!output_text(&r2).is_empty(), "{r2}");

    // A custom tool's call comes back as a `custom_tool_call` with its input as a string.
    let (status, r) = server.post(
        "/v1/responses",
        &json!({"input": "Shout the word hello.", "temperature": 0, "max_output_tokens": 40,
                "tools": [{"type": "custom", "name": "shout", "description": "Shouts its input."},
                          {"type": "web_search"}],
                "tool_choice": {"type": "custom", "name": "shout"}}),
    );
    assert_eq!(status, 200, "{r}");
    let call = &r["output"][0];
    assert_eq!(call["type"], "custom_tool_call", "{r}");
    assert_eq!(call["name"], "shout");
    assert!(
        call["input"].is_string() && call["call_id"].is_string(),
        "{r}"
    );
    assert_eq!(
        r["tools"].as_array().unwrap().len(),
        1,
        "web_search is left out: {r}"
    );
    assert!(server.log_text().contains("tools left out"));

    // Named by `tool_choice`, a custom tool with a Lark grammar gets its input under that
    // grammar (Codex's `apply_patch` is one): whole and streamed, the same valid input.
    let patch_tool = json!({"type": "custom", "name": "apply_patch", "description": "Edits files.",
        "format": {"type": "grammar", "syntax": "lark",
                   "definition": "start: \"*** Begin Patch\\n*** Add File: \" NAME \"\\n+\" LINE \"\\n*** End Patch\"\nNAME: /[a-z]+\\.txt/\nLINE: /[A-Za-z ]{1,30}/"}});
    let body = json!({"input": "Create hello.txt saying Hello world.", "temperature": 0,
        "max_output_tokens": 60, "tools": [patch_tool],
        "tool_choice": {"type": "custom", "name": "apply_patch"}});
    let (status, r) = server.post("/v1/responses", &body);
    assert_eq!(status, 200, "{r}");
    let call = &r["output"][0];
    assert_eq!(
        (call["type"].as_str(), call["name"].as_str()),
        (Some("custom_tool_call"), Some("apply_patch")),
        "{r}"
    );
    let input = call["input"].as_str().unwrap();
    assert!(
        input.starts_with("*** Begin Patch\n*** Add File: ") && input.ends_with("\n*** End Patch"),
        "{input:?}"
    );
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let done: Vec<Value> = stream_events(&server, &streamed)
        .into_iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .map(|e| e["item"].clone())
        .collect();
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(done[0]["input"].as_str(), Some(input));

    // previous_response_id continues the stored conversation; GET and DELETE find it.
    let (_, first) = server.post(
        "/v1/responses",
        &json!({"input": "My name is Alice. Reply OK.", "max_output_tokens": 6, "temperature": 0}),
    );
    let id = first["id"].as_str().unwrap();
    let (status, second) = server.post(
        "/v1/responses",
        &json!({"input": "What is my name?", "previous_response_id": id, "max_output_tokens": 8, "temperature": 0}),
    );
    assert_eq!(status, 200, "{second}");
    assert!(
        second["usage"]["input_tokens"].as_u64().unwrap()
            > first["usage"]["input_tokens"].as_u64().unwrap()
                + first["usage"]["output_tokens"].as_u64().unwrap(),
        "the first turn was not prepended: {first} {second}"
    );
    let (status, got) = server.get(&format!("/v1/responses/{id}"));
    assert_eq!(status, 200, "{got}");
    let deleted = server.request("DELETE", &format!("/v1/responses/{id}"), &[], b"");
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    assert!(deleted.text().contains("\"deleted\":true"));
    assert_eq!(server.get(&format!("/v1/responses/{id}")).0, 404);
    let (status, r) = server.post(
        "/v1/responses",
        &json!({"input": "hi", "previous_response_id": "resp_unknown"}),
    );
    assert_eq!(status, 404, "{r}");
    assert_eq!(r["error"]["param"], "previous_response_id", "{r}");
    // `store: false` keeps nothing.
    let (_, unstored) = server.post(
        "/v1/responses",
        &json!({"input": "hi", "store": false, "max_output_tokens": 2}),
    );
    let path = format!("/v1/responses/{}", unstored["id"].as_str().unwrap());
    assert_eq!(server.get(&path).0, 404);

    // text.format json_schema.
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                        "country": {"type": "string", "maxLength": 20}},
                        "required": ["name", "country"], "additionalProperties": false});
    let (status, r) = server.post(
        "/v1/responses",
        &json!({"input": "Name a city.", "temperature": 0, "max_output_tokens": 60,
                "text": {"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": true}}}),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["status"], "completed", "{r}");
    let v: Value = serde_json::from_str(&output_text(&r)).unwrap();
    assert!(v["name"].is_string() && v["country"].is_string(), "{v}");
    assert_eq!(v.as_object().unwrap().len(), 2, "{v}");

    // Bad input: a 400 (404 for an unknown stored response) naming the Responses field.
    for (body, status, param, needle) in [
        (json!({"input": 5}), 400, "input", "must be a string"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            400,
            "input[0].content[0]",
            "input_image",
        ),
        (
            json!({"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": 3}]}]}),
            400,
            "input[0].content[0].text",
            "must be a string",
        ),
        (
            json!({"input": "x", "background": true}),
            400,
            "background",
            "background",
        ),
        (
            json!({"input": "x", "temperature": "hot"}),
            400,
            "temperature",
            "temperature",
        ),
        (
            json!({"input": "x", "max_output_tokens": 0}),
            400,
            "max_output_tokens",
            "max_output_tokens",
        ),
        (
            json!({"input": "x", "tools": [{"type": "web_search"}, {"type": "function", "name": "f", "parameters": {"type": "array"}}]}),
            400,
            "tools[1].parameters",
            "object schema",
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "json_schema", "name": "x"}}}),
            400,
            "text.format.schema",
            "required",
        ),
    ] {
        assert_error(
            &server,
            "/v1/responses",
            body.to_string().as_bytes(),
            status,
            Some(param),
            needle,
        );
    }
    assert_error(
        &server,
        "/v1/responses",
        b"{not json",
        400,
        None,
        "not valid JSON",
    );

    // A client that hangs up mid-stream: the request is aborted and its blocks come back.
    let aborted_before = server.metric("edge_llm_requests_aborted_total");
    let body = json!({"input": "Tell me a very long story about a dragon.", "max_output_tokens": 400,
                      "ignore_eos": true, "stream": true});
    let mut s = post_json(&server.addr, "/v1/responses", &body);
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("response.output_text.delta") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    drop(s);
    server.wait_for_metrics("the hung-up response's abort", |s| {
        s.metric("edge_llm_requests_aborted_total") >= aborted_before + 1.0
            && s.metric("edge_llm_kv_blocks{state=\"used\"}") == 0.0
    });
    server.wait_for_log("the hang-up's line", |log| {
        log.contains("POST /v1/responses 200") && log.contains("client disconnected after")
    });
    assert_eq!(server.get("/health").0, 200);
}

#[test]
fn stored_responses_are_kept_per_api_key() {
    let Some(server) = qwen_server(&["--api-key", "key-a", "--api-key", "key-b"]) else {
        return;
    };
    let post = |key: &str, body: &Value| {
        let r = server.request(
            "POST",
            "/v1/responses",
            &[
                ("Content-Type", "application/json"),
                ("Authorization", &format!("Bearer {key}")),
            ],
            body.to_string().as_bytes(),
        );
        (r.status, serde_json::from_slice::<Value>(&r.body).unwrap())
    };
    let (status, r) = post(
        "key-a",
        &json!({"input": "hi", "max_output_tokens": 2, "temperature": 0}),
    );
    assert_eq!(status, 200, "{r}");
    let id = r["id"].as_str().unwrap();
    let get = |key: &str| {
        server
            .request(
                "GET",
                &format!("/v1/responses/{id}"),
                &[("Authorization", &format!("Bearer {key}"))],
                b"",
            )
            .status
    };
    assert_eq!(get("key-a"), 200);
    assert_eq!(get("key-b"), 404);
    let (status, r) = post(
        "key-b",
        &json!({"input": "hi", "previous_response_id": id, "max_output_tokens": 2}),
    );
    assert_eq!(status, 404, "{r}");
    let (status, r) = post(
        "key-a",
        &json!({"input": "hi", "previous_response_id": id, "max_output_tokens": 2}),
    );
    assert_eq!(status, 200, "{r}");
}

/// The virtual environment with `openai`, `openai-agents` and `jsonschema` that scripts/test.sh
/// makes; None (a skip) outside CI when it is missing, a failure in CI.
fn responses_python() -> Option<PathBuf> {
    let python =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/structured-venv/bin/python");
    let ready = Command::new(&python)
        .args(["-c", "import openai, agents, jsonschema"])
        .status()
        .is_ok_and(|s| s.success());
    if ready {
        return Some(python);
    }
    skip_or_fail(&format!(
        "the Responses API client checks: openai, openai-agents and jsonschema are not installed in {} (scripts/test.sh installs them)",
        python.display()
    ));
    None
}

/// Runs tests/openai_responses.py in `mode` against `server`.
fn run_responses_script(python: &PathBuf, server: &Server, mode: &str) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_responses.py");
    let out = Command::new(python)
        .arg(script)
        .arg(format!("http://{}", server.addr))
        .arg(mode)
        .output()
        .expect("running tests/openai_responses.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("all responses checks passed"),
        "openai responses checks ({mode}) failed:\n{stdout}\n{stderr}\nserver log:\n{}",
        server.log_text()
    );
}

#[test]
fn openai_client_and_agents_sdk_use_responses() {
    let Some(python) = responses_python() else {
        return;
    };
    if let Some(server) = qwen_server(&[]) {
        run_responses_script(&python, &server, "client");
    }
    // The SDK's default agent loop on the 1.5B (the 0.5B calls its tool again after every
    // result, to the turn limit).
    let Some(path) = fetched(qwen_1_5b_path(), FETCH_SPEC_MODELS) else {
        return;
    };
    let server = Server::start(&["-m", path.to_str().unwrap(), "-c", "4096"]).expect("server");
    run_responses_script(&python, &server, "agent");
}

/// Codex CLI (`@openai/codex` from npm, installed by scripts/test.sh under target/codex) runs
/// one prompt against the server with `wire_api = "responses"`.
#[test]
fn codex_cli_says_hello() {
    let codex =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/codex/node_modules/.bin/codex");
    if !codex.exists() {
        skip_or_fail(&format!(
            "Codex CLI is not installed at {} (scripts/test.sh installs it from npm)",
            codex.display()
        ));
        return;
    }
    // Codex's first request is about 8.6k tokens. Codex sends no temperature: at OpenAI's
    // default of 1 the 0.5B's reply varies (in one run of four codex printed nothing), so the
    // server's default is greedy here (`--temp 0`, as llama-server's).
    let Some(server) = qwen_server(&["-c", "16384", "--temp", "0"]) else {
        return;
    };
    let home = std::env::temp_dir().join(format!("edge-llm-codex-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            "model = \"qwen2.5-coder-0.5b-instruct-q4_k_m\"\nmodel_provider = \"edge\"\n\n\
             [model_providers.edge]\nname = \"edge-llm\"\nbase_url = \"http://{}/v1\"\n\
             env_key = \"EDGE_KEY\"\nwire_api = \"responses\"\n",
            server.addr
        ),
    )
    .unwrap();
    let started = Instant::now();
    let mut child = Command::new(&codex)
        .args(["exec", "--skip-git-repo-check", "Say hello"])
        .current_dir(&home)
        .env("CODEX_HOME", &home)
        .env("EDGE_KEY", "unused")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting codex");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(480) {
            let _ = child.kill();
            panic!(
                "codex exec ran past 480 s; server log:\n{}",
                server.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stdout = out_thread.join().unwrap();
    let stderr = err_thread.join().unwrap();
    let _ = std::fs::remove_dir_all(&home);
    let log = server.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("POST /v1/responses 200"))
        .unwrap_or_else(|| panic!("codex sent no successful request:\n{stderr}\n{log}"));
    eprintln!(
        "codex exec took {:.0} s; the server's line: {line}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        status.success(),
        "codex exec failed ({status}):\n{stdout}\n{stderr}\n{log}"
    );
    assert!(
        !stdout.trim().is_empty(),
        "codex printed no reply:\n{stderr}"
    );
    // What codex printed is the reply the server sent.
    assert!(
        stderr.contains(stdout.trim()),
        "stdout {stdout:?} is not the reply shown in the transcript:\n{stderr}"
    );
}
