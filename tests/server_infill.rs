//! Issue 33's editor routes in llama-server's shapes: `POST /infill` as llama.vscode sends it
//! (its request bodies replayed from `src/llama-server.ts`, `createRequestPayload`) on Qwen2.5
//! Coder 0.5B, whose prompt must be the one llama-server builds (tests/reference/
//! infill-qwen2.5-coder-0.5b.json, made by scripts/synth/infill_reference.py with a real
//! llama-server), a repeated request served from the prefix cache, `n_predict: 0` warming it;
//! and `POST /completion`: the fields llama.vscode and llama-server's web UI read, `n_probs`,
//! `return_tokens`, streaming, stops, `cache_prompt: false`, and bad fields refused by name.

mod support;

use serde_json::{json, Map, Value};
use support::harness::*;
use support::{fetched, qwen_path, root, FETCH_EXTRA_MODELS};

const NONE: (&str, &str) = ("X-None", "");

fn reference() -> Value {
    let path = root().join("tests/reference/infill-qwen2.5-coder-0.5b.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (scripts/synth/infill_reference.py)",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap()
}

/// `path` with `body`, answered 200: its JSON.
fn ok(server: &Server, path: &str, body: &Value) -> Value {
    let (status, v) = server.send("POST", path, NONE, body);
    assert_eq!(status, 200, "{path} {body}: {v}");
    v
}

/// `body` answered 400 naming `param`.
fn refused(server: &Server, path: &str, body: Value, param: &str) {
    let (status, v) = server.send("POST", path, NONE, &body);
    assert_eq!(status, 400, "{path} {body}: {v}");
    assert_eq!(v["error"]["param"], param, "{path} {body}: {v}");
}

/// The prompt edge-llm builds for each reference request equals llama-server's, token for
/// token (text and length where the reference could keep only those).
#[test]
fn infill_prompt_is_llama_servers() {
    let Some(path) = fetched(qwen_path(), FETCH_EXTRA_MODELS) else {
        return;
    };
    let gguf = edge_llm::gguf::GgufFile::open(&path).unwrap();
    let tok = edge_llm::tokenizer::Tokenizer::from_gguf(&gguf).unwrap();
    let fim = tok.fim_tokens();
    assert_eq!(tok.token_text(fim.pre.unwrap()), "<|fim_prefix|>");
    assert_eq!(tok.token_text(fim.suf.unwrap()), "<|fim_suffix|>");
    assert_eq!(tok.token_text(fim.mid.unwrap()), "<|fim_middle|>");
    assert_eq!(tok.token_text(fim.rep.unwrap()), "<|repo_name|>");
    assert_eq!(tok.token_text(fim.sep.unwrap()), "<|file_sep|>");
    let r = reference();
    let (n_batch, n_ctx) = (r["n_batch"].as_u64().unwrap(), r["n_ctx"].as_u64().unwrap());
    let cases = r["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 4);
    for (name, case) in cases {
        let body: &Map<String, Value> = case["request"].as_object().unwrap();
        let ids =
            edge_llm::api::infill::prompt(&tok, body, n_batch as usize, n_ctx as usize).unwrap();
        assert_eq!(tok.decode(&ids), case["prompt"], "{name}");
        assert_eq!(ids.len() as u64, case["tokens_evaluated"], "{name}");
        if !case["tokens"].is_null() {
            assert_eq!(json!(ids), case["tokens"], "{name}");
        }
    }
    // The long suffix was cut to n_batch / 4 - 2 tokens.
    assert!(cases["long_suffix"]["tokens_evaluated"].as_u64().unwrap() < 530);

    // Below a context of n_batch - 2 tokens llama-server keeps no extra context: the prompt
    // starts at the prefix token.
    let body = cases["completion"]["request"].as_object().unwrap();
    let small = edge_llm::api::infill::prompt(&tok, body, 2048, 1024).unwrap();
    assert_eq!(small[0], fim.pre.unwrap());
    // `input_prefix` as a list of texts and token ids, as tokenize_mixed reads it.
    let full = edge_llm::api::infill::prompt(&tok, body, 2048, 4096).unwrap();
    let mut mixed = body.clone();
    let prefix = body["input_prefix"].as_str().unwrap();
    let (head, tail) = prefix.split_at(prefix.find("class").unwrap());
    let tail_ids = tok.encode(tail, false, false).unwrap();
    mixed.insert("input_prefix".into(), json!([head, tail_ids[0]]));
    let rest = tok.decode(&tail_ids[1..]);
    mixed["input_prefix"]
        .as_array_mut()
        .unwrap()
        .push(json!(rest));
    assert_eq!(
        edge_llm::api::infill::prompt(&tok, &mixed, 2048, 4096).unwrap(),
        full
    );
}

#[test]
fn infill_answers_llama_vscode() {
    let Some(qwen) = fetched(qwen_path(), FETCH_EXTRA_MODELS) else {
        return;
    };
    let r = reference();
    let n_ctx = r["n_ctx"].to_string();
    let Some(server) = Server::start(&["-m", qwen.to_str().unwrap(), "-c", &n_ctx]) else {
        return;
    };
    let case = |name: &str| r["cases"][name].clone();

    // llama.vscode's `updateExtraContext`: `n_predict: 0` evaluates the chunks, makes nothing.
    let warm = case("warm_up");
    let v = ok(&server, "/infill", &warm["request"]);
    assert_eq!(v["content"], "", "{v}");
    assert_eq!(v["tokens_predicted"], 0, "{v}");
    assert_eq!(v["tokens_evaluated"], warm["tokens_evaluated"], "{v}");
    assert_eq!(v["prompt"], warm["prompt"], "{v}");
    assert_eq!(v["timings"]["predicted_n"], 0, "{v}");
    assert_eq!(v["stop"], true);
    // Warming again finds it cached (all but the block holding the last token).
    let again = ok(&server, "/infill", &warm["request"]);
    assert!(again["tokens_cached"].as_u64().unwrap() > 0, "{again}");
    assert_eq!(
        again["timings"]["cache_n"], again["tokens_cached"],
        "{again}"
    );
    assert_eq!(again["content"], "");

    // llama.vscode's completion request: the prompt llama-server builds; the fields it reads.
    let completion = case("completion");
    let body = &completion["request"];
    let first = ok(&server, "/infill", body);
    assert_eq!(first["prompt"], completion["prompt"], "{first}");
    assert_eq!(first["tokens_evaluated"], completion["tokens_evaluated"]);
    for field in [
        "content",
        "tokens_cached",
        "truncated",
        "timings",
        "generation_settings",
    ] {
        assert!(!first[field].is_null(), "{field}: {first}");
    }
    for field in [
        "prompt_n",
        "prompt_ms",
        "prompt_per_second",
        "predicted_n",
        "predicted_ms",
        "predicted_per_second",
        "cache_n",
    ] {
        assert!(first["timings"][field].is_number(), "{field}: {first}");
    }
    assert_eq!(first["generation_settings"]["n_indent"], 8);
    let repeat = ok(&server, "/infill", body);
    assert!(repeat["tokens_cached"].as_u64().unwrap() >= 96, "{repeat}");
    assert_eq!(
        repeat["timings"]["prompt_n"].as_u64().unwrap() + repeat["tokens_cached"].as_u64().unwrap(),
        111,
        "{repeat}"
    );

    // Greedy, the middle of the method is filled from the FIM tokens' context.
    // With n_indent 8 (llama.vscode's: the cursor line's), the first line indented less ends
    // it and is cut.
    let mut greedy = body.clone();
    merge(
        &mut greedy,
        json!({"temperature": 0, "t_max_prompt_ms": -1, "t_max_predict_ms": -1, "n_predict": 24}),
    );
    let v = ok(&server, "/infill", &greedy);
    let content = v["content"].as_str().unwrap();
    assert!(content.contains("self.r"), "{v}");
    assert_eq!(v["stop_type"], "limit", "{v}");
    assert!(
        v["tokens_predicted"].as_u64().unwrap() < 24,
        "cut by n_indent: {v}"
    );
    // Stopped here, the request was aborted; its prompt's counts still came back.
    assert!(v["tokens_cached"].as_u64().unwrap() >= 96, "{v}");
    assert_eq!(v["tokens_evaluated"], 111, "{v}");
    for line in content.split('\n').skip(1) {
        let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
        assert!(indent >= 8 || line.trim().is_empty(), "{content:?}");
    }

    // t_max_prompt_ms: a prompt slower than that makes nothing, but is evaluated and cached.
    let mut cold = greedy.clone();
    merge(
        &mut cold,
        json!({"input_suffix": "\n# cold\n", "t_max_prompt_ms": 1}),
    );
    let v = ok(&server, "/infill", &cold);
    assert_eq!(
        (v["content"].as_str(), v["tokens_predicted"].as_u64()),
        (Some(""), Some(0)),
        "{v}"
    );
    assert_eq!(v["stop_type"], "limit", "{v}");
    merge(&mut cold, json!({"t_max_prompt_ms": -1}));
    let v = ok(&server, "/infill", &cold);
    let n = v["tokens_evaluated"].as_u64().unwrap();
    assert!(
        v["tokens_cached"].as_u64().unwrap() >= (n - 1) / 16 * 16,
        "{v}"
    );
    assert!(v["tokens_predicted"].as_u64().unwrap() > 0, "{v}");

    // cache_prompt: false computes the whole prompt again.
    merge(&mut greedy, json!({"cache_prompt": false}));
    let v = ok(&server, "/infill", &greedy);
    assert_eq!(v["tokens_cached"], 0, "{v}");
    assert_eq!(v["timings"]["prompt_n"], 111, "{v}");
    assert_eq!(
        v["content"], content,
        "the same greedy completion without the cache"
    );

    // Bad fields are refused by name; llama-server's checks.
    refused(
        &server,
        "/infill",
        json!({"input_prefix": 5, "input_suffix": ""}),
        "input_prefix",
    );
    refused(
        &server,
        "/infill",
        json!({"input_suffix": ""}),
        "input_prefix",
    );
    refused(
        &server,
        "/infill",
        json!({"input_prefix": "", "input_suffix": {}}),
        "input_suffix",
    );
    refused(
        &server,
        "/infill",
        json!({"input_prefix": "", "input_suffix": "", "input_extra": "x"}),
        "input_extra",
    );
    refused(
        &server,
        "/infill",
        json!({"input_prefix": "", "input_suffix": "", "input_extra": [{"text": 1}]}),
        "input_extra[0].text",
    );
    refused(
        &server,
        "/infill",
        json!({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a"}]}),
        "input_extra[0].text",
    );
    refused(
        &server,
        "/infill",
        json!({"input_prefix": "", "input_suffix": "", "prompt": 3}),
        "prompt",
    );
    refused(
        &server,
        "/infill",
        json!({"input_prefix": "", "input_suffix": "", "id_slot": 3}),
        "id_slot",
    );
}

#[test]
fn infill_needs_fim_tokens() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    let (status, v) = server.send(
        "POST",
        "/infill",
        NONE,
        &json!({"input_prefix": "a", "input_suffix": "b"}),
    );
    assert_eq!(status, 400, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("infill is not supported by this model"),
        "{v}"
    );
}

#[test]
fn completion_answers_in_llama_servers_shape() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    let greedy = |extra: Value| {
        let mut body =
            json!({"prompt": "The capital of France is", "temperature": 0, "n_predict": 6});
        merge(&mut body, extra);
        body
    };
    // What llama.vscode and the web UI read, and return_tokens.
    let v = ok(
        &server,
        "/completion",
        &greedy(json!({"return_tokens": true})),
    );
    let content = v["content"].as_str().unwrap().to_string();
    assert!(!content.is_empty(), "{v}");
    assert_eq!(v["stop"], true);
    assert_eq!(v["model"], "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(v["tokens_predicted"], 6, "{v}");
    assert_eq!(v["stop_type"], "limit");
    assert_eq!(v["stopped_limit"], true);
    assert_eq!(v["truncated"], false);
    assert_eq!(v["generation_settings"]["n_predict"], 6);
    assert_eq!(v["generation_settings"]["temperature"], 0.0);
    assert!(
        v["prompt"]
            .as_str()
            .unwrap()
            .ends_with("The capital of France is"),
        "{v}"
    );
    assert_eq!(v["timings"]["predicted_n"], 6);
    let tokens = v["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 6);
    let detok = ok(&server, "/detokenize", &json!({"tokens": tokens}));
    assert_eq!(detok["content"], content.as_str());
    // A repeated prompt is served from the prefix cache (whole blocks of 16, never the one
    // holding the last token).
    let long = "One two three four five six seven eight nine ten eleven twelve thirteen fourteen \
                fifteen sixteen seventeen eighteen nineteen twenty.";
    let body = json!({"prompt": long, "n_predict": 2, "temperature": 0});
    ok(&server, "/completion", &body);
    let v = ok(&server, "/completion", &body);
    assert!(v["tokens_cached"].as_u64().unwrap() >= 16, "{v}");
    assert_eq!(v["timings"]["cache_n"], v["tokens_cached"]);
    // n_predict 0: evaluated, nothing made.
    let v = ok(
        &server,
        "/completion",
        &json!({"prompt": long, "n_predict": 0}),
    );
    assert_eq!(
        (v["content"].as_str(), v["tokens_predicted"].as_u64()),
        (Some(""), Some(0)),
        "{v}"
    );
    assert!(v["tokens_cached"].as_u64().unwrap() >= 16, "{v}");

    // n_probs: the sampled token, its alternatives; under greedy the best one is the token.
    let v = ok(&server, "/completion", &greedy(json!({"n_probs": 3})));
    assert_eq!(v["content"], content.as_str());
    let probs = v["completion_probabilities"].as_array().unwrap();
    assert_eq!(probs.len(), 6, "{v}");
    for p in probs {
        let top = p["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{p}");
        assert_eq!(top[0]["id"], p["id"], "{p}");
        assert_eq!(top[0]["logprob"], p["logprob"], "{p}");
        assert!(p["logprob"].as_f64().unwrap() <= 0.0);
        let lps: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "{p}");
        let bytes: Vec<u8> = serde_json::from_value(p["bytes"].clone()).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            p["token"].as_str().unwrap()
        );
        assert!(top
            .iter()
            .all(|t| t["token"].is_string() && t["bytes"].is_array()));
    }

    // Streaming as llama-server streams: chunks with content, the last with stop and timings,
    // no [DONE]; the text is the whole reply's.
    let (events, done) = server.post_stream("/completion", &greedy(json!({"stream": true})));
    assert!(!done, "llama-server's native stream has no [DONE]");
    let (last, chunks) = events.split_last().unwrap();
    assert!(chunks.iter().all(|c| c["stop"] == false), "{events:?}");
    let streamed: String = chunks
        .iter()
        .map(|c| c["content"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, content);
    assert_eq!(last["stop"], true);
    assert_eq!(last["content"], "");
    assert_eq!(last["timings"]["predicted_n"], 6, "{last}");

    // A prompt mixing text and token ids, as llama-server's tokenize_mixed reads it.
    let ids = ok(&server, "/tokenize", &json!({"content": " France is"}))["tokens"].clone();
    let mut mixed = vec![json!("The capital of")];
    mixed.extend(ids.as_array().unwrap().iter().cloned());
    let v = ok(&server, "/completion", &greedy(json!({"prompt": mixed})));
    assert_eq!(v["content"], content.as_str(), "{v}");

    // llama-server's aliases and sentinels: `max_tokens` for `n_predict`, `seed: -1` (random),
    // `id_slot: -1` (any), an `n_predict` past the context (it stops at the context's end).
    let v = ok(
        &server,
        "/completion",
        &json!({"prompt": "Hello", "max_tokens": 3, "seed": -1, "id_slot": -1}),
    );
    assert_eq!(v["tokens_predicted"], 3, "{v}");
    let v = ok(
        &server,
        "/completion",
        &json!({"prompt": "1, 2, 3,", "temperature": 0, "n_predict": 100000, "stop": [","]}),
    );
    assert_eq!(v["generation_settings"]["n_predict"], 100000, "{v}");

    // A stop word.
    let v = ok(
        &server,
        "/completion",
        &json!({"prompt": "1, 2, 3, 4, 5,", "temperature": 0, "n_predict": 20, "stop": [","]}),
    );
    assert_eq!(v["stop_type"], "word", "{v}");
    assert_eq!(v["stopping_word"], ",");
    assert_eq!(v["stopped_word"], true);
    assert!(!v["content"].as_str().unwrap().contains(','), "{v}");

    // t_max_predict_ms: past it, generation ends at the next newline.
    let v = ok(
        &server,
        "/completion",
        &json!({"prompt": "def a():\n    return 1\n\n\ndef b():\n", "temperature": 0,
                "n_predict": 200, "t_max_predict_ms": 1}),
    );
    assert_eq!(v["stop_type"], "limit", "{v}");
    assert!(v["tokens_predicted"].as_u64().unwrap() < 200, "{v}");
    assert!(v["content"].as_str().unwrap().contains('\n'), "{v}");
    assert_eq!(v["has_new_line"], true);

    // response_fields, as llama.vim sends it.
    let v = ok(
        &server,
        "/completion",
        &greedy(json!({"response_fields": ["content", "timings/prompt_n"]})),
    );
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["content", "timings/prompt_n"], "{v}");

    // Bad fields by name.
    refused(
        &server,
        "/completion",
        greedy(json!({"id_slot": 0})),
        "id_slot",
    );
    refused(
        &server,
        "/completion",
        greedy(json!({"n_probs": 50})),
        "n_probs",
    );
    refused(
        &server,
        "/completion",
        greedy(json!({"n_predict": -5})),
        "n_predict",
    );
    refused(
        &server,
        "/completion",
        greedy(json!({"post_sampling_probs": true})),
        "post_sampling_probs",
    );
    refused(
        &server,
        "/completion",
        greedy(json!({"cache_prompt": 1})),
        "cache_prompt",
    );
    refused(
        &server,
        "/completion",
        greedy(json!({"temperature": "hot"})),
        "temperature",
    );
    refused(&server, "/completion", json!({"n_predict": 3}), "prompt");
    // /completions stays OpenAI's.
    let v = ok(
        &server,
        "/completions",
        &json!({"prompt": "Hi", "max_tokens": 2}),
    );
    assert_eq!(v["object"], "text_completion");
}
