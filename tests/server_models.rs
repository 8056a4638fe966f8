//! Issue 33: several models in one server (`serve --models-dir DIR`, or `-m` more than once),
//! each loaded when a request first names it in `model`. Through the real binary: the `openai`
//! client alternating among three models gets what each model answers alone; `--models-max`
//! evicts the least recently used idle model; `--keep-alive` (and a request's `keep_alive`)
//! unload an idle one and its memory comes back; requests for a model being loaded wait for it;
//! 16 concurrent requests over two models leave no KV block held; a corrupt file is listed as
//! unavailable with its error while the others serve; an unknown model is a 404 naming the others.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::harness::Server;

const FETCH_EXTRA: &str = "run scripts/fetch-extra-models.sh";
const SMOL: &str = "SmolLM2-135M-Instruct.Q4_1";
const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";
const GEMMA: &str = "gemma-3-270m-q4_k_m";

/// The default model, Qwen2.5 Coder 0.5B and Gemma 3 270M; None (after `skip_or_fail`) when
/// one is missing.
fn three_models() -> Option<[PathBuf; 3]> {
    Some([
        support::fetched(support::model_path(), support::FETCH_MODEL)?,
        support::fetched(support::qwen_path(), FETCH_EXTRA)?,
        support::fetched(support::gemma3_path(), FETCH_EXTRA)?,
    ])
}

/// A temporary folder of links to `models`, plus the files of `junk` (name, bytes); removed on drop.
struct ModelsDir(PathBuf);

impl ModelsDir {
    fn new(tag: &str, models: &[PathBuf], junk: &[(&str, &[u8])]) -> ModelsDir {
        let dir =
            std::env::temp_dir().join(format!("edge-llm-models-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for m in models {
            std::os::unix::fs::symlink(m, dir.join(m.file_name().unwrap())).unwrap();
        }
        for (name, bytes) in junk {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        ModelsDir(dir)
    }

    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for ModelsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn chat_body(model: &str, prompt: &str) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 16,
        "temperature": 0,
    })
}

/// A greedy chat answer of `model` (checked to be a 200 from that model).
fn answer(server: &Server, model: &str, prompt: &str) -> String {
    let (status, v) = server.post("/v1/chat/completions", &chat_body(model, prompt));
    assert_eq!(status, 200, "{model}: {v}");
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Each model's `status` object in `GET /models`.
fn statuses(server: &Server) -> Vec<(String, Value)> {
    let (status, text) = server.get("/models");
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap().to_string(), m["status"].clone()))
        .collect()
}

fn state_of(server: &Server, id: &str) -> String {
    statuses(server)
        .into_iter()
        .find(|(m, _)| m == id)
        .map(|(_, s)| s["value"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("{id} is not listed"))
}

fn model_metric(server: &Server, name: &str, model: &str) -> f64 {
    server.metric(&format!("{name}{{model=\"{model}\"}}"))
}

/// The server process's resident memory in bytes.
fn rss_bytes(server: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

fn wait_until(what: &str, secs: u64, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "timed out after {secs} s waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    start.elapsed()
}

/// The python `openai` package (target/structured-venv, made by scripts/test.sh).
fn openai_python() -> Option<PathBuf> {
    let python = support::root().join("target/structured-venv/bin/python");
    let ok = Command::new(&python)
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        support::skip_or_fail(
            "target/structured-venv with the openai package is missing (scripts/test.sh makes it)",
        );
        return None;
    }
    Some(python)
}

#[test]
fn openai_client_alternating_three_models_gets_what_each_answers_alone() {
    let Some(models) = three_models() else { return };
    let Some(python) = openai_python() else {
        return;
    };
    const PROMPTS: [&str; 2] = ["Name one colour.", "Write a haiku about the sea."];
    let ids = [SMOL, QWEN, GEMMA];
    // Each model alone, in a one-model server (whose `model` field is ignored).
    let mut alone = serde_json::Map::new();
    for (path, id) in models.iter().zip(ids) {
        let server = Server::start(&["-m", path.to_str().unwrap()]).unwrap();
        let texts: Vec<String> = PROMPTS.iter().map(|p| answer(&server, "any", p)).collect();
        alone.insert(id.to_string(), json!(texts));
    }
    // All three behind one server, named by repeated -m.
    let mut args = Vec::new();
    for m in &models {
        args.extend(["-m", m.to_str().unwrap()]);
    }
    let server = Server::start(&args).unwrap();
    for (id, s) in statuses(&server) {
        assert_eq!(s["value"], "unloaded", "{id} loaded before any request");
    }
    let out = Command::new(python)
        .arg(support::root().join("tests/openai_models.py"))
        .arg(format!("http://{}", server.addr))
        .args(ids)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["listed"], json!(ids));
    assert_eq!(
        got["answers"],
        Value::Object(alone),
        "greedy answers differ from each model alone"
    );
    for id in ids {
        assert_eq!(state_of(&server, id), "loaded");
    }
}

#[test]
fn models_max_evicts_the_least_recently_used_idle_model() {
    let Some(models) = three_models() else { return };
    let dir = ModelsDir::new("max", &models, &[]);
    let server = Server::start(&["--models-dir", dir.arg(), "--models-max", "2"]).unwrap();
    answer(&server, GEMMA, "Hi.");
    answer(&server, QWEN, "Hi.");
    assert_eq!(state_of(&server, GEMMA), "loaded");
    // A third model: Gemma, used least recently, goes.
    answer(&server, SMOL, "Hi.");
    assert_eq!(state_of(&server, GEMMA), "unloaded");
    assert_eq!(state_of(&server, QWEN), "loaded");
    assert_eq!(state_of(&server, SMOL), "loaded");
    assert_eq!(
        model_metric(&server, "edge_llm_model_weights_bytes", GEMMA),
        0.0
    );
    assert_eq!(server.metric("edge_llm_models_loaded"), 2.0);
    // Qwen used again, then Gemma loaded by POST /models/load: now SmolLM2 goes.
    answer(&server, QWEN, "Hi.");
    let (status, v) = server.post("/models/load", &json!({"model": GEMMA}));
    assert_eq!((status, &v), (200, &json!({"success": true})));
    assert_eq!(state_of(&server, SMOL), "unloaded");
    assert_eq!(state_of(&server, QWEN), "loaded");
    assert_eq!(state_of(&server, GEMMA), "loaded");
    // POST /models/unload, and its errors.
    let (status, v) = server.post("/models/unload", &json!({"model": QWEN}));
    assert_eq!((status, &v), (200, &json!({"success": true})));
    assert_eq!(state_of(&server, QWEN), "unloaded");
    let (status, v) = server.post("/models/unload", &json!({"model": QWEN}));
    assert_eq!(status, 400, "{v}");
    let (status, v) = server.post("/models/load", &json!({"modell": QWEN}));
    assert_eq!(status, 400, "{v}");
    assert!(server.log_text().contains("least recently used"));
}

#[test]
fn keep_alive_unloads_an_idle_model_and_its_memory_comes_back() {
    let Some(models) = three_models() else { return };
    let dir = ModelsDir::new("keep", &models, &[]);
    let server = Server::start(&["--models-dir", dir.arg(), "--keep-alive", "5"]).unwrap();
    let before = rss_bytes(&server);
    let started = Instant::now();
    answer(&server, QWEN, "Write a haiku about the sea.");
    let loaded = rss_bytes(&server);
    assert_eq!(state_of(&server, QWEN), "loaded");
    let weights = model_metric(&server, "edge_llm_model_weights_bytes", QWEN);
    let kv = model_metric(&server, "edge_llm_model_kv_bytes", QWEN);
    assert!(weights > 4e8 && kv > 0.0, "weights {weights}, kv {kv}");
    let waited = wait_until("Qwen to unload", 30, || {
        state_of(&server, QWEN) == "unloaded"
    });
    let idle = started.elapsed();
    assert!(
        idle >= Duration::from_secs(5) && waited < Duration::from_secs(15),
        "unloaded after {idle:?}"
    );
    assert_eq!(
        model_metric(&server, "edge_llm_model_weights_bytes", QWEN),
        0.0
    );
    assert_eq!(model_metric(&server, "edge_llm_model_kv_bytes", QWEN), 0.0);
    assert_eq!(model_metric(&server, "edge_llm_model_loaded", QWEN), 0.0);
    // The process gives the weights and the KV pool back (the engine thread ends).
    let mut after = 0;
    wait_until("the memory to come back", 10, || {
        after = rss_bytes(&server);
        after + (weights as u64) / 2 < loaded
    });
    eprintln!(
        "RSS: {} MiB before, {} MiB with Qwen, {} MiB after it unloaded",
        before >> 20,
        loaded >> 20,
        after >> 20
    );
    // A request's `keep_alive` (ollama's) overrides the flag for its model: 0 unloads at once.
    let mut body = chat_body(GEMMA, "Hi.");
    body["keep_alive"] = json!(0);
    let (status, v) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    let waited = wait_until("Gemma to unload", 10, || {
        state_of(&server, GEMMA) == "unloaded"
    });
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    body["keep_alive"] = json!("later");
    let (status, v) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 400, "{v}");
}

#[test]
fn requests_for_a_model_being_loaded_wait_and_load_it_once() {
    let Some(models) = three_models() else { return };
    let dir = ModelsDir::new("wait", &models, &[]);
    let server = Server::start(&["--models-dir", dir.arg()]).unwrap();
    let alone = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| answer(&server, QWEN, "Name one colour.")))
            .collect();
        // While it loads, /models says so.
        let mut seen_loading = false;
        wait_until("Qwen to load", 60, || {
            let st = state_of(&server, QWEN);
            seen_loading |= st == "loading";
            st == "loaded"
        });
        let texts: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (seen_loading, texts)
    });
    let (seen_loading, texts) = alone;
    assert!(texts.iter().all(|t| t == &texts[0]), "{texts:?}");
    assert!(seen_loading, "GET /models never said `loading`");
    let log = server.log_text();
    assert_eq!(
        log.matches(&format!("loading `{QWEN}`")).count(),
        1,
        "{log}"
    );
}

#[test]
fn sixteen_concurrent_requests_over_two_models_leave_no_block_held() {
    let Some(models) = three_models() else { return };
    let dir = ModelsDir::new("conc", &models, &[]);
    let server = Server::start(&["--models-dir", dir.arg()]).unwrap();
    let answers: Vec<(String, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let server = &server;
                s.spawn(move || {
                    let model = if i % 2 == 0 { SMOL } else { GEMMA };
                    let prompt = format!("Count to {}.", i / 2 + 1);
                    (model.to_string(), answer(server, model, &prompt))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(answers.len(), 16);
    for model in [SMOL, GEMMA] {
        server.wait_for_metrics("KV blocks back", |s| {
            model_metric(s, "edge_llm_model_kv_blocks_used", model) == 0.0
                && model_metric(s, "edge_llm_model_requests_in_flight", model) == 0.0
        });
        // The model's own figures, through ?model=.
        let (status, text) = server.get(&format!("/metrics?model={model}"));
        assert_eq!(status, 200);
        assert!(
            text.contains("edge_llm_kv_blocks{state=\"used\"} 0"),
            "{text}"
        );
    }
    // Batched with each other, each answers as it does one at a time.
    for (i, (model, text)) in answers.iter().enumerate().take(4) {
        assert_eq!(
            text,
            &answer(&server, model, &format!("Count to {}.", i / 2 + 1))
        );
    }
}

#[test]
fn a_corrupt_file_is_listed_unavailable_and_unknown_models_are_404() {
    let Some(models) = three_models() else { return };
    let dir = ModelsDir::new("bad", &models[..2], &[("x.gguf", b"not a model")]);
    let server = Server::start(&["--models-dir", dir.arg()]).unwrap();
    let listed = statuses(&server);
    let ids: Vec<&str> = listed.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(ids, [SMOL, QWEN, "x"]);
    let x = &listed[2].1;
    assert_eq!(x["failed"], true, "{x}");
    assert!(x["error"].as_str().unwrap().contains("GGUF"), "{x}");
    assert_eq!(model_metric(&server, "edge_llm_model_failed", "x"), 1.0);
    let (status, v) = server.post("/v1/chat/completions", &chat_body("x", "Hi."));
    assert_eq!(status, 503, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("GGUF"),
        "{v}"
    );
    // The others serve.
    answer(&server, QWEN, "Hi.");
    answer(&server, SMOL, "Hi.");
    // No model field: the first listed.
    let (status, v) = server.post(
        "/v1/completions",
        &json!({"prompt": "The sky is", "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["model"], SMOL);
    // An unknown model: 404 naming the models there are.
    let (status, v) = server.post("/v1/chat/completions", &chat_body("llama-70b", "Hi."));
    assert_eq!(status, 404, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    for id in [SMOL, QWEN, "x"] {
        assert!(message.contains(id), "{message}");
    }
    assert_eq!(v["error"]["code"], "model_not_found");
    let (status, _) = server.get("/v1/models/llama-70b");
    assert_eq!(status, 404);
    let (status, text) = server.get(&format!("/v1/models/{QWEN}"));
    assert_eq!(status, 200, "{text}");
    assert!(Path::new(dir.arg()).is_dir());
}

#[test]
fn the_chat_page_picks_among_the_models() {
    let Some(models) = three_models() else { return };
    let dir = ModelsDir::new("page", &[models[0].clone(), models[2].clone()], &[]);
    let server = Server::start(&["--models-dir", dir.arg()]).unwrap();
    let Some(b) = support::webdriver::Browser::start(1000, 760) else {
        return;
    };
    b.goto(&format!("http://{}/", server.addr));
    b.wait("the model picker", 30, |b| {
        b.count("#model-picker:not([hidden]) option") == 2
    });
    b.js(
        "const p = document.getElementById('model-picker');
         p.value = arguments[0];
         p.dispatchEvent(new Event('change'));",
        json!([GEMMA]),
    );
    b.wait("the engine panel", 30, |b| {
        b.text("#engine-state").contains("not loaded")
    });
    b.fill("#input", "Hi.");
    b.keys("#input", "\u{E007}");
    b.wait("the reply", 120, |b| {
        b.count("#messages .msg.assistant .stats") > 0
    });
    let reply = b.text("#messages .msg.assistant");
    assert!(
        !reply.trim().is_empty() && !reply.contains("rror"),
        "{reply}"
    );
    // The reply came from Gemma; the page's looks at the figures loaded nothing else.
    assert_eq!(state_of(&server, GEMMA), "loaded");
    assert_eq!(state_of(&server, SMOL), "unloaded");
    b.wait("Gemma's own figures", 30, |b| {
        b.text("#engine-kv-free").parse::<u32>().is_ok()
    });
}

#[test]
fn a_model_streaming_a_reply_is_not_evicted_the_next_load_waits() {
    let Some(models) = three_models() else { return };
    let dir = ModelsDir::new("busy", &[models[0].clone(), models[2].clone()], &[]);
    let server = Server::start(&["--models-dir", dir.arg(), "--models-max", "1"]).unwrap();
    answer(&server, SMOL, "Hi.");
    let mut body = chat_body(SMOL, "Tell me a long story about the sea.");
    body["max_tokens"] = json!(400);
    body["stream"] = json!(true);
    body["ignore_eos"] = json!(true);
    std::thread::scope(|s| {
        let streamed = s.spawn(|| server.post_stream("/v1/chat/completions", &body));
        wait_until("the stream to start", 30, || {
            model_metric(&server, "edge_llm_model_requests_in_flight", SMOL) == 1.0
        });
        let gemma = s.spawn(|| answer(&server, GEMMA, "Hi."));
        // While SmolLM2 streams, Gemma's load waits: the one resident model is busy.
        let mut smol_busy_while_gemma_waits = 0;
        loop {
            // One snapshot: both states under the registry's one lock.
            let listed = statuses(&server);
            let of = |id: &str| listed.iter().find(|(m, _)| m == id).unwrap().1.clone();
            if of(SMOL)["requests_in_flight"] != 1 {
                break;
            }
            assert_eq!(of(GEMMA)["value"], "unloaded", "{listed:?}");
            smol_busy_while_gemma_waits += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        let (events, done) = streamed.join().unwrap();
        assert!(done && events.len() > 100, "{} events", events.len());
        assert!(!gemma.join().unwrap().is_empty());
        assert!(smol_busy_while_gemma_waits > 0);
    });
    assert_eq!(state_of(&server, SMOL), "unloaded");
    assert_eq!(state_of(&server, GEMMA), "loaded");
}

/// `--models-preset`: each model's flags from an INI file as llama-server reads one (`[*]` for
/// all, a section per model id, `model = PATH` adding one under a new name), the command line
/// winning over both (the harness passes `-c 1024`).
#[test]
fn a_preset_gives_each_model_its_flags_and_the_command_line_wins() {
    let Some(models) = three_models() else { return };
    let dir = ModelsDir::new("preset", &models[..2], &[]);
    let preset = dir.0.join("models.ini");
    std::fs::write(
        &preset,
        format!(
            "version = 1\n; every model\n[*]\nblock-size = 32\n\n[{QWEN}]\nblock-size = 16\nctk = q8_0\nctv = q8_0\nc = 768\n\n[tiny]\nmodel = {}\n",
            models[0].display()
        ),
    )
    .unwrap();
    let n_ctx = |server: &Server, model: &str| -> u64 {
        let (status, body) = server.get(&format!("/props?model={model}"));
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["default_generation_settings"]["n_ctx"].as_u64().unwrap()
    };
    let server = Server::start(&[
        "--models-dir",
        dir.arg(),
        "--models-preset",
        preset.to_str().unwrap(),
    ])
    .unwrap();
    let ids: Vec<String> = statuses(&server).into_iter().map(|(id, _)| id).collect();
    assert!(ids.contains(&"tiny".to_string()), "{ids:?}");
    // SmolLM2 from [*]: blocks of 32; Qwen from its section: q8_0 blocks of 16; the command
    // line's -c 1024 over Qwen's `c = 768`.
    assert_eq!(n_ctx(&server, SMOL), 1024);
    assert_eq!(n_ctx(&server, QWEN), 1024);
    let log = server.log_text();
    let kv_lines: Vec<&str> = log.lines().filter(|l| l.contains("KV cache on")).collect();
    assert!(
        kv_lines
            .iter()
            .any(|l| l.contains("(K f16, V f16)") && l.contains("blocks of 32 tokens")),
        "{kv_lines:?}"
    );
    assert!(
        kv_lines
            .iter()
            .any(|l| l.contains("(K q8_0, V q8_0)") && l.contains("blocks of 16 tokens")),
        "{kv_lines:?}"
    );
    assert_eq!(answer(&server, "tiny", "Hi."), answer(&server, SMOL, "Hi."));
    drop(server);
    // A preset naming a server flag, or no flag at all, is refused at start-up in one line.
    for (text, says) in [
        ("[tiny]\nport = 9\n", "`port` is the server's"),
        ("[tiny]\nno-such-flag = 1\n", "not a flag of edge-llm serve"),
    ] {
        std::fs::write(&preset, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
            .args(["serve", "--models-dir", dir.arg(), "--models-preset"])
            .arg(&preset)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{err}");
    }
}

/// The text after `name ` on its own line of a Prometheus page.
fn metric_in(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in the metrics"))
}

/// A draft model for speculation (a preset's `spec = draft`, `model-draft = PATH`) and an
/// encoder (the synthetic bert) resident beside chat models: the drafted model answers as it
/// does alone without speculation, with drafted tokens accepted; the encoder's vectors are the
/// ones a one-model server of it gives; the encoder refuses chat in one line.
#[test]
fn a_draft_model_and_an_encoder_are_resident_beside_the_chat_models() {
    let Some(models) = three_models() else { return };
    let r = support::synth::json("tests/synth/encoder-bert.json");
    let Some(bert) = support::synth::model_file(&r, "scripts/synth/encoder_refs.sh") else {
        return;
    };
    let dir = ModelsDir::new(
        "draft",
        &[models[0].clone(), models[1].clone(), bert.clone()],
        &[],
    );
    let bert_id = bert.file_stem().unwrap().to_str().unwrap().to_string();
    let preset = dir.0.join("models.ini");
    std::fs::write(
        &preset,
        // A fixed window: the adaptive one turns speculation off with a draft as slow as the
        // target (here the target itself).
        format!(
            "[{QWEN}]\nspec = draft\nspec-fixed = true\nmodel-draft = {}\n",
            models[1].display()
        ),
    )
    .unwrap();
    const PROMPT: &str = "Write a Python function that adds two numbers.";
    let body = |model: &str| {
        json!({"model": model, "messages": [{"role": "user", "content": PROMPT}],
               "max_tokens": 48, "temperature": 0})
    };
    let embed = json!({"model": bert_id, "input": ["edge machines", "a paged KV cache"]});
    // Each alone: Qwen with no draft, the encoder in its own server.
    let alone = Server::start(&["-m", models[1].to_str().unwrap()]).unwrap();
    let (status, want) = alone.post("/v1/chat/completions", &body("any"));
    assert_eq!(status, 200, "{want}");
    drop(alone);
    let alone = Server::start(&["-m", bert.to_str().unwrap()]).unwrap();
    let (status, want_vectors) = alone.post("/v1/embeddings", &embed);
    assert_eq!(status, 200, "{want_vectors}");
    drop(alone);

    let server = Server::start(&[
        "--models-dir",
        dir.arg(),
        "--models-preset",
        preset.to_str().unwrap(),
        "--models-max",
        "3",
    ])
    .unwrap();
    let (status, got) = server.post("/v1/chat/completions", &body(QWEN));
    assert_eq!(status, 200, "{got}");
    assert_eq!(
        got["choices"][0]["message"]["content"], want["choices"][0]["message"]["content"],
        "speculation changed the greedy answer"
    );
    let (status, page) = server.get(&format!("/metrics?model={QWEN}"));
    assert_eq!(status, 200, "{page}");
    let accepted = metric_in(&page, "edge_llm_spec_accepted_tokens_total");
    assert!(accepted > 0.0, "no drafted token accepted:\n{page}");
    // The default model beside it, without a draft.
    assert_eq!(answer(&server, SMOL, "Hi."), answer(&server, SMOL, "Hi."));
    let (status, page) = server.get(&format!("/metrics?model={SMOL}"));
    assert_eq!(status, 200);
    assert_eq!(metric_in(&page, "edge_llm_spec_proposed_tokens_total"), 0.0);
    assert!(!page.contains("edge_llm_draft_kv_blocks"), "{page}");
    // The encoder.
    let (status, vectors) = server.post("/v1/embeddings", &embed);
    assert_eq!(status, 200, "{vectors}");
    assert_eq!(vectors["data"], want_vectors["data"]);
    let (status, refusal) = server.post("/v1/chat/completions", &chat_body(&bert_id, "Hi."));
    assert!((400..500).contains(&status), "{status} {refusal}");
    for id in [QWEN, SMOL, bert_id.as_str()] {
        assert_eq!(state_of(&server, id), "loaded", "{id}");
    }
    let (status, _) = server.post("/models/unload", &json!({"model": bert_id}));
    assert_eq!(status, 200);
    assert_eq!(state_of(&server, &bert_id), "unloaded");
}
