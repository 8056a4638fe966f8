//! Encoder models (bert, nomic-bert) served whole: `edge-llm serve -m ENCODER.gguf` answers
//! `/v1/embeddings` and `/embedding` with llama.cpp's pooled, normalized vectors
//! (tests/synth/encoder-<case>.json, scripts/synth/encoder_refs.sh), batched equal to single bit
//! for bit, to the real `openai` client too; `edge-llm embed` and `bench --embed` run on them;
//! rerankers (the synthetic bert_rerank.gguf and qwen3_rerank.gguf of scripts/synth/reranker.py)
//! answer `/v1/rerank` and its aliases with llama-server's scores and order
//! (tests/synth/rerank-{bert,qwen3}.json, scripts/synth/reranker_refs.sh); bad rerank bodies are
//! one-line 400s naming the field; a model that is not a reranker refuses the route, an
//! encoder refuses the generation routes, and `--rerank` on a non-reranker refuses to start.

mod support;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use support::harness::{assert_error, Server};

/// 1 - cos(ours, llama.cpp's) of a pooled vector (tests/encoder_models.rs measures 7e-9).
const COSINE_BUDGET: f64 = 1e-4;
/// |ours - llama-server's| of a relevance score (measured: 3e-5, the F16 GELU and summation
/// order of the encoder under the f32 classifier head).
const SCORE_BUDGET: f64 = 1e-4;

fn json_file(name: &str) -> Value {
    support::synth::json(name)
}

/// The synthetic file a reference was computed on, checked by its sha256.
fn synth_file(r: &Value) -> Option<PathBuf> {
    support::synth::model_file(r, "scripts/synth/encoder_refs.sh or reranker_refs.sh")
}

fn serve(path: &PathBuf, extra: &[&str]) -> Option<Server> {
    let mut args = vec!["-m", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    Server::start(&args)
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a vector: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn cos_distance(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum();
    let nb: f64 = b.iter().map(|&x| (x as f64).powi(2)).sum();
    1.0 - dot / (na * nb).sqrt()
}

fn vectors(server: &Server, input: Value) -> (Vec<Vec<f32>>, Value) {
    let (status, v) = server.post("/v1/embeddings", &json!({"input": input}));
    assert_eq!(status, 200, "{v}");
    let data = v["data"].as_array().unwrap();
    (data.iter().map(|d| floats(&d["embedding"])).collect(), v)
}

/// Through the server, each case's pooled normalized vectors equal llama.cpp's; one batch
/// equals one request each, bit for bit, and llama-server's `/embedding` shape carries them too.
#[test]
fn encoder_embeddings_equal_llama_cpp_through_the_server() {
    for case in ["bert", "nomic_bert"] {
        let r = json_file(&format!("tests/synth/encoder-{case}.json"));
        let Some(path) = synth_file(&r) else {
            return;
        };
        let Some(server) = serve(&path, &[]) else {
            return;
        };
        let texts: Vec<&str> = r["embeddings"]["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        let (batch, body) = vectors(&server, json!(texts));
        let num_tokens: usize = r["embeddings"]["texts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["tokens"].as_array().unwrap().len())
            .sum();
        assert_eq!(body["usage"]["prompt_tokens"], num_tokens, "{case}");
        for (i, t) in r["embeddings"]["texts"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            let want = floats(&t["pooled_normalized"]);
            let d = cos_distance(&batch[i], &want);
            eprintln!("{case} text {i}: 1 - cos = {d:e}");
            assert!(d < COSINE_BUDGET, "{case} text {i}: 1 - cos = {d:e}");
            let (single, _) = vectors(&server, json!(texts[i]));
            assert_eq!(
                single[0], batch[i],
                "{case} text {i}: batched differs from single"
            );
            let (status, v) = server.post("/embedding", &json!({"content": texts[i]}));
            assert_eq!(status, 200, "{v}");
            assert_eq!(
                floats(&v[0]["embedding"][0]),
                batch[i],
                "{case}: /embedding"
            );
        }
        // Requests racing each other get the same vectors as alone.
        let threads: Vec<_> = (0..6)
            .map(|k| {
                let addr = server.addr.clone();
                let text = texts[k % texts.len()].to_string();
                std::thread::spawn(move || {
                    let (s, v) = support::cluster::post(
                        &addr,
                        "/v1/embeddings",
                        &json!({"input": [text.clone(), text]}),
                    );
                    assert_eq!(s, 200, "{v}");
                    floats(&v["data"][1]["embedding"])
                })
            })
            .collect();
        for (k, t) in threads.into_iter().enumerate() {
            assert_eq!(
                t.join().unwrap(),
                batch[k % texts.len()],
                "{case}: concurrent"
            );
        }
        // The generation routes answer one line; the discovery ones still work.
        assert_error(
            &server,
            "/v1/chat/completions",
            br#"{"messages":[]}"#,
            400,
            None,
            "is an embedding model",
        );
        assert_error(
            &server,
            "/v1/completions",
            br#"{"prompt":"x"}"#,
            400,
            None,
            "is an embedding model",
        );
        assert_error(
            &server,
            "/v1/rerank",
            br#"{"query":"q","documents":["d"]}"#,
            400,
            None,
            "is not a reranker",
        );
        let (status, models) = server.get("/v1/models");
        assert_eq!(status, 200);
        let arch = if case == "bert" { "bert" } else { "nomic-bert" };
        assert!(
            models.contains(&format!("\"architecture\":\"{arch}\"")),
            "{models}"
        );
        assert_eq!(server.get("/health").0, 200);
    }
}

/// The real `openai` client gets the server's vectors; `edge-llm embed` writes the same; `bench
/// --embed` runs on an encoder.
#[test]
fn openai_client_embed_pipe_and_bench_on_an_encoder() {
    let r = json_file("tests/synth/encoder-bert.json");
    let Some(path) = synth_file(&r) else {
        return;
    };
    let python = support::root().join("target/structured-venv/bin/python");
    if !Command::new(&python)
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success())
    {
        support::skip_or_fail(
            "target/structured-venv with the openai package is missing (scripts/test.sh makes it)",
        );
        return;
    }
    let texts = ["Hello world", "the quick brown fox", "café naïve résumé"];
    let Some(server) = serve(&path, &[]) else {
        return;
    };
    let (raw, _) = vectors(&server, json!(texts));
    let out = Command::new(&python)
        .arg(support::root().join("tests/openai_embeddings.py"))
        .arg(format!("http://{}", server.addr))
        .args(texts)
        .output()
        .expect("running tests/openai_embeddings.py");
    assert!(
        out.status.success(),
        "openai client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("the script's JSON");
    assert_eq!(floats(&v["single"]), raw[0]);
    let batch: Vec<Vec<f32>> = v["batch"].as_array().unwrap().iter().map(floats).collect();
    assert_eq!(batch, raw);

    let mut child = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
        .args(["embed", "-m", path.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("edge-llm embed");
    child
        .stdin
        .take()
        .unwrap()
        .write_all((texts.join("\n") + "\n\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4);
    for (i, want) in raw.iter().enumerate() {
        assert_eq!(&floats(&lines[i]["embedding"]), want, "embed line {i}");
    }
    assert!(
        lines[3]["error"]
            .as_str()
            .is_some_and(|e| e.contains("empty")),
        "{}",
        lines[3]
    );

    let out = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
        .args([
            "bench",
            "-m",
            path.to_str().unwrap(),
            "--embed",
            "64",
            "-r",
            "1",
        ])
        .output()
        .expect("edge-llm bench");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("| 64 |"), "{text}");
}

/// Each case of a rerank reference through `server`: llama-server's scores within
/// SCORE_BUDGET, its order and usage, on every alias; one document alone scores as in the
/// batch, bit for bit. Returns the worst score difference.
fn check_rerank_reference(server: &Server, r: &Value) -> f64 {
    let mut worst = 0.0f64;
    for case in r["cases"].as_array().unwrap() {
        let (status, got) = server.post("/v1/rerank", &case["request"]);
        assert_eq!(status, 200, "{got}");
        let want = &case["response"];
        assert_eq!(got["object"], "list");
        assert_eq!(got["usage"], want["usage"], "{}", case["request"]);
        let (g, w) = (
            got["results"].as_array().unwrap(),
            want["results"].as_array().unwrap(),
        );
        assert_eq!(g.len(), w.len(), "{got}");
        for (a, b) in g.iter().zip(w) {
            assert_eq!(a["index"], b["index"], "order differs: {got} vs {want}");
            let d = (a["relevance_score"].as_f64().unwrap()
                - b["relevance_score"].as_f64().unwrap())
            .abs();
            worst = worst.max(d);
            assert!(d < SCORE_BUDGET, "score {d:e} off: {got} vs {want}");
            assert!(a.get("document").is_none());
        }
        for alias in ["/rerank", "/v1/reranking", "/reranking"] {
            assert_eq!(server.post(alias, &case["request"]).1, got, "{alias}");
        }
        let best = &g[0];
        let i = best["index"].as_u64().unwrap() as usize;
        let alone = json!({"query": case["request"]["query"], "documents": [case["request"]["documents"][i]]});
        let (_, one) = server.post("/v1/rerank", &alone);
        assert_eq!(
            one["results"][0]["relevance_score"], best["relevance_score"],
            "a document alone scores differently than in a batch"
        );
    }
    worst
}

/// A decoder reranker (Qwen3-Reranker's layout: the rerank prompt, `cls.output` from the yes/no
/// rows, softmax) through the engine: llama-server's scores and order.
#[test]
fn decoder_rerank_equals_llama_server() {
    let r = json_file("tests/synth/rerank-qwen3.json");
    let Some(path) = synth_file(&r) else {
        return;
    };
    let Some(server) = serve(&path, &["--rerank"]) else {
        return;
    };
    let worst = check_rerank_reference(&server, &r);
    eprintln!("qwen3 rerank: worst |score - llama-server's| = {worst:e}");
    assert_error(
        &server,
        "/v1/rerank",
        br#"{"query":"q","documents":[]}"#,
        400,
        Some("documents"),
        "non-empty",
    );
}

/// `/v1/rerank` (and its aliases) on the synthetic bert reranker: llama-server's scores within
/// SCORE_BUDGET, its order, its usage; `top_n`, `return_documents`, TEI's `texts`; errors.
#[test]
fn rerank_equals_llama_server() {
    let r = json_file("tests/synth/rerank-bert.json");
    let Some(path) = synth_file(&r) else {
        return;
    };
    let Some(server) = serve(&path, &["--rerank"]) else {
        return;
    };
    let worst = check_rerank_reference(&server, &r);
    eprintln!("rerank: worst |score - llama-server's| = {worst:e}");
    let req = &r["cases"][0]["request"];
    let mut body = req.clone();
    body["top_n"] = json!(2);
    body["return_documents"] = json!(true);
    body["model"] = json!("asked");
    let (_, top) = server.post("/v1/rerank", &body);
    let all = server.post("/v1/rerank", req).1;
    assert_eq!(top["model"], "asked");
    assert_eq!(top["results"].as_array().unwrap().len(), 2);
    for k in 0..2 {
        let i = top["results"][k]["index"].as_u64().unwrap() as usize;
        assert_eq!(top["results"][k]["index"], all["results"][k]["index"]);
        assert_eq!(top["results"][k]["document"]["text"], req["documents"][i]);
    }
    let (_, tei) = server.post(
        "/rerank",
        &json!({"query": req["query"], "texts": req["documents"], "return_text": true}),
    );
    assert_eq!(tei[0]["index"], all["results"][0]["index"]);
    assert_eq!(tei[0]["score"], all["results"][0]["relevance_score"]);
    assert!(tei[0]["text"].is_string(), "{tei}");
    // A pair's vector is the model's embedding too (CLS pooling), and bad bodies are 400s.
    assert_eq!(vectors(&server, json!("hello")).0[0].len(), 64);
    for (body, field, needle) in [
        (
            &br#"{"documents":["a"]}"#[..],
            "query",
            "\"query\" must be provided",
        ),
        (
            br#"{"query":3,"documents":["a"]}"#,
            "query",
            "must be a string",
        ),
        (
            br#"{"query":"q","documents":[]}"#,
            "documents",
            "non-empty string array",
        ),
        (br#"{"query":"q"}"#, "documents", "non-empty string array"),
        (
            br#"{"query":"q","documents":["a",{"text":"b"}]}"#,
            "documents",
            "documents[1]",
        ),
        (
            br#"{"query":"q","documents":["a"],"top_n":"two"}"#,
            "top_n",
            "non-negative integer",
        ),
        (
            br#"{"query":"q","documents":["a"],"return_documents":1}"#,
            "return_documents",
            "boolean",
        ),
        (br#"{"query":"q","documents":"a"#, "", ""),
    ] {
        let r = server.request(
            "POST",
            "/v1/rerank",
            &[("Content-Type", "application/json")],
            body,
        );
        assert_eq!(r.status, 400, "{}", r.text());
        let v: Value = serde_json::from_str(&r.text()).unwrap();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(!msg.contains('\n') && msg.contains(needle), "{msg}");
        if !field.is_empty() {
            assert_eq!(v["error"]["param"], field, "{msg}");
        }
    }
    let long = "word ".repeat(200);
    assert_error(
        &server,
        "/v1/rerank",
        json!({"query": "q", "documents": [long]})
            .to_string()
            .as_bytes(),
        400,
        Some("documents"),
        "more than the 128",
    );
    // Still serving.
    assert_eq!(server.post("/v1/rerank", req).1, all);
}

/// A decoder server refuses the rerank routes in one line; `--rerank` on a model that is not a
/// reranker refuses to start.
#[test]
fn non_rerankers_refuse() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    for path in ["/v1/rerank", "/rerank", "/v1/reranking", "/reranking"] {
        assert_error(
            &server,
            path,
            br#"{"query":"q","documents":["d"]}"#,
            400,
            None,
            "is not a reranker",
        );
    }
    drop(server);
    let r = json_file("tests/synth/encoder-bert.json");
    let mut models = vec![support::model_path()];
    models.extend(synth_file(&r));
    for model in models {
        if !model.is_file() {
            continue;
        }
        let out = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
            .args([
                "serve",
                "--port",
                "0",
                "--rerank",
                "-m",
                model.to_str().unwrap(),
            ])
            .output()
            .expect("edge-llm serve");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("is not a reranker"),
            "{err}"
        );
    }
}
