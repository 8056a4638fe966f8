//! Embeddings end to end: edge-llm's vectors against llama.cpp's (tests/reference/embeddings.json,
//! made by scripts/synth/embed_ref.py with llama-embedding), `POST /v1/embeddings` and
//! `/embedding` through the real server (batched equals single, base64 equals float,
//! `dimensions`, token-id inputs, errors, KV blocks back), the real `openai` client, and the
//! `edge-llm embed` pipe against the server.

mod support;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use support::harness::{assert_error, Server, JSON};

/// Strings of the server tests (the reference has its own).
const TEXTS: [&str; 3] = [
    "The quick brown fox jumps over the lazy dog.",
    "fn main() { println!(\"{}\", 1 + 2); }",
    "Paged attention keeps the KV cache in fixed-size blocks.",
];

fn reference() -> Value {
    let path = support::root().join("tests/reference/embeddings.json");
    serde_json::from_str(&std::fs::read_to_string(&path).expect("tests/reference/embeddings.json"))
        .expect("embeddings.json is JSON")
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a vector: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn cos_distance(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "vectors of different lengths");
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum();
    let nb: f64 = b.iter().map(|&x| (x as f64).powi(2)).sum();
    1.0 - dot / (na * nb).sqrt()
}

fn sha256(path: &PathBuf) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// `edge-llm embed` over `lines` with `flags`: one JSON value per output line.
fn embed_pipe(model: &PathBuf, flags: &[&str], lines: &[&str]) -> Vec<Value> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
        .arg("embed")
        .arg("-m")
        .arg(model)
        .args(flags)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting edge-llm embed");
    let mut stdin = child.stdin.take().unwrap();
    for l in lines {
        writeln!(stdin, "{l}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "edge-llm embed failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Each case's vectors from `edge-llm embed` against llama-embedding's, by cosine distance.
/// The budget is 1e-4, or twice llama.cpp's own spread between its two attention paths
/// (flash attention with an f16 KV cache, and none with f32) where that is larger: on the Q4_1
/// model llama.cpp differs from itself by up to 6e-4, so a closer match is not a meaningful ask.
/// Each vector must also be far from the other pooling's (the check tells poolings apart).
#[test]
fn vectors_match_llama_cpp_embedding_for_mean_last_cls_qwen25_and_qwen3() {
    let r = reference();
    let strings: Vec<&str> = r["strings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let cases = r["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 5, "the reference's cases");
    for case in cases {
        let name = case["case"].as_str().unwrap();
        let file = case["file"].as_str().unwrap();
        let path = if file.starts_with("qwen3") {
            let dir = std::env::var_os("EDGE_LLM_SYNTH_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| support::root().join("target/synth"));
            dir.join(file)
        } else {
            support::model_file(file)
        };
        if !path.is_file() {
            support::skip_or_fail(&format!(
                "{} is missing (scripts/fetch-model.sh; target/synth-venv/bin/python scripts/synth/synth.py models target/synth)",
                path.display()
            ));
            continue;
        }
        assert_eq!(
            sha256(&path),
            case["sha256"].as_str().unwrap(),
            "{name}: {} is not the file the reference was made on",
            path.display()
        );
        let pooling = case["pooling"].as_str().unwrap();
        let out = embed_pipe(&path, &["--pooling", pooling, "-t", "2"], &strings);
        assert_eq!(out.len(), strings.len(), "{name}: {out:?}");
        let spread = case["llama_cpp_spread"].as_f64().unwrap();
        let budget = (2.0 * spread).max(1e-4);
        let mut worst = 0.0f64;
        for (i, (got, want)) in out
            .iter()
            .zip(case["embeddings"].as_array().unwrap())
            .enumerate()
        {
            assert_eq!(got["index"], i, "{name}: {got}");
            let (got, want) = (floats(&got["embedding"]), floats(want));
            let d = cos_distance(&got, &want);
            assert!(
                d < budget,
                "{name}, string {i}: cosine distance {d:.3e} over {budget:.1e}"
            );
            let norm: f64 = got.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "{name}: not normalized ({norm})");
            worst = worst.max(d);
        }
        // Against another pooling's reference, the same strings are far apart.
        if let Some(other) = cases
            .iter()
            .find(|c| c["file"] == case["file"] && c["pooling"] != case["pooling"])
        {
            let got = floats(&out[1]["embedding"]);
            let d = cos_distance(&got, &floats(&other["embeddings"][1]));
            assert!(
                d > 10.0 * budget,
                "{name}: as close to {} ({d:.2e})",
                other["case"]
            );
        }
        eprintln!("{name}: max cosine distance {worst:.3e} (budget {budget:.1e}, llama.cpp spread {spread:.2e})");
    }
}

fn used_blocks(server: &Server) -> f64 {
    server.metric("edge_llm_kv_blocks{state=\"used\"}")
}

fn embeddings_of(server: &Server, input: Value, extra: Value) -> (Vec<Vec<f32>>, Value) {
    let mut body = json!({ "input": input, "model": "m" });
    support::harness::merge(&mut body, extra);
    let (status, v) = server.post("/v1/embeddings", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "list", "{v}");
    let vectors = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["index"], i);
            assert_eq!(d["object"], "embedding");
            floats(&d["embedding"])
        })
        .collect();
    (vectors, v)
}

fn from_base64(s: &str) -> Vec<f32> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = Vec::new();
    for c in s.bytes().filter(|&c| c != b'=') {
        bits.push(ALPHABET.iter().position(|&a| a == c).expect("base64") as u8);
    }
    let mut bytes = Vec::new();
    for q in bits.chunks(4) {
        let n = q
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (b as u32) << (18 - 6 * i));
        bytes.extend(&n.to_be_bytes()[1..q.len()]);
    }
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// `/v1/embeddings` with mean pooling: a batch (sharing its steps with a completion) equals
/// each input alone, bit for bit; base64 decodes to the floats; `dimensions` cuts and
/// renormalizes; token ids equal their text; llama-server's `/embedding` gives the same vector
/// in its shape; bad bodies get one-line 400s naming the field; every KV block comes back.
#[test]
fn v1_embeddings_batched_equals_single_base64_dimensions_tokens_errors_and_blocks_back() {
    let Some(server) = Server::start(&["--pooling", "mean", "--embeddings"]) else {
        return;
    };
    let singles: Vec<Vec<f32>> = TEXTS
        .iter()
        .map(|t| embeddings_of(&server, json!(t), json!({})).0.remove(0))
        .collect();
    assert_eq!(singles[0].len(), 576);
    // The batch, while a completion decodes beside it.
    let addr = server.addr.clone();
    let completion = std::thread::spawn(move || {
        let body = json!({"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0});
        let raw = body.to_string();
        let r = support::harness::http(&addr, "POST", "/v1/completions", JSON, raw.as_bytes());
        assert_eq!(r.status, 200, "{}", r.text());
    });
    let (batch, v) = embeddings_of(&server, json!(TEXTS), json!({}));
    completion.join().unwrap();
    assert_eq!(
        batch, singles,
        "a batched input differs from the same input alone"
    );
    assert_eq!(v["model"], "m");
    let num_tokens: u64 = TEXTS
        .iter()
        .map(|t| {
            let (_, tok) = server.post("/tokenize", &json!({ "content": t }));
            tok["tokens"].as_array().unwrap().len() as u64
        })
        .sum();
    assert_eq!(v["usage"]["prompt_tokens"], num_tokens, "{}", v["usage"]);
    assert_eq!(v["usage"]["total_tokens"], num_tokens);

    // base64: the little-endian f32 bytes of the same vector.
    let (status, b) = server.post(
        "/v1/embeddings",
        &json!({"input": TEXTS[0], "encoding_format": "base64"}),
    );
    assert_eq!(status, 200, "{b}");
    assert_eq!(
        from_base64(b["data"][0]["embedding"].as_str().unwrap()),
        singles[0]
    );

    // dimensions: the first 64 values, normalized again.
    let (cut, _) = embeddings_of(&server, json!(TEXTS[0]), json!({"dimensions": 64}));
    assert_eq!(cut[0].len(), 64);
    let norm: f32 = cut[0].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    assert!(cos_distance(&cut[0], &singles[0][..64]) < 1e-6);

    // Token ids, one list and a list of lists, equal their text.
    let (_, tok) = server.post("/tokenize", &json!({ "content": TEXTS[1] }));
    let ids = tok["tokens"].clone();
    let (from_ids, _) = embeddings_of(&server, ids.clone(), json!({}));
    assert_eq!(from_ids[0], singles[1]);
    let (from_lists, _) = embeddings_of(&server, json!([ids, TEXTS[2]]), json!({}));
    assert_eq!(from_lists, vec![singles[1].clone(), singles[2].clone()]);

    // llama-server's /embedding: [{index, embedding: [[...]]}].
    let (status, l) = server.post("/embedding", &json!({ "content": TEXTS[0] }));
    assert_eq!(status, 200, "{l}");
    assert_eq!(l[0]["index"], 0);
    assert_eq!(floats(&l[0]["embedding"][0]), singles[0]);
    assert_eq!(l[0]["embedding"].as_array().unwrap().len(), 1);

    let long = "word ".repeat(1500);
    let bad: [(Value, &str, &str); 10] = [
        (json!({}), "input", "must be provided"),
        (json!({"input": ""}), "input", "cannot be empty"),
        (json!({"input": []}), "input", "must not be empty"),
        (json!({"input": ["ok", ""]}), "input[1]", "cannot be empty"),
        (
            json!({"input": {"a": 1}}),
            "input",
            "string or a list of token ids",
        ),
        (json!({"input": [1, 99999999]}), "input", "vocabulary size"),
        (
            json!({"input": long}),
            "input",
            "more than the context holds",
        ),
        (
            json!({"input": "x", "encoding_format": "int8"}),
            "encoding_format",
            "base64",
        ),
        (
            json!({"input": "x", "dimensions": 577}),
            "dimensions",
            "larger than the model's 576",
        ),
        (
            json!({"input": "x", "dimensions": 0}),
            "dimensions",
            "positive integer",
        ),
    ];
    for (body, param, needle) in bad {
        let raw = body.to_string();
        assert_error(
            &server,
            "/v1/embeddings",
            raw.as_bytes(),
            400,
            Some(param),
            needle,
        );
    }
    assert_error(
        &server,
        "/v1/embeddings",
        b"{not json",
        400,
        None,
        "not valid JSON",
    );
    // Still serving, and every block back.
    assert_eq!(
        embeddings_of(&server, json!(TEXTS[0]), json!({})).0[0],
        singles[0]
    );
    server.wait_for_metrics("KV blocks back", |s| used_blocks(s) == 0.0);
}

/// `--pooling none`: /v1/embeddings refuses (as llama-server), /embedding gives every token's
/// vector unnormalized; their mean, normalized, is llama.cpp's mean-pooled vector.
#[test]
fn pooling_none_gives_every_tokens_vector_on_embedding_only() {
    let Some(server) = Server::start(&["--pooling", "none"]) else {
        return;
    };
    assert_error(
        &server,
        "/v1/embeddings",
        br#"{"input": "Hello world"}"#,
        400,
        Some("input"),
        "not OAI compatible",
    );
    let r = reference();
    let case = r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["case"] == "smollm2-mean")
        .unwrap();
    let text = r["strings"][1].as_str().unwrap();
    let (status, v) = server.post("/embeddings", &json!({ "content": text }));
    assert_eq!(status, 200, "{v}");
    let rows: Vec<Vec<f32>> = v[0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(floats)
        .collect();
    assert_eq!(rows.len(), case["tokens"][1].as_array().unwrap().len());
    let mut mean = vec![0.0f32; rows[0].len()];
    for row in &rows {
        for (m, x) in mean.iter_mut().zip(row) {
            *m += x / rows.len() as f32;
        }
    }
    let budget = (2.0 * case["llama_cpp_spread"].as_f64().unwrap()).max(1e-4);
    let d = cos_distance(&mean, &floats(&case["embeddings"][1]));
    assert!(d < budget, "mean of the rows vs llama.cpp's mean: {d:.3e}");
    // The pipe writes the same rows, a list of them even for a one-token line.
    let pipe = embed_pipe(&support::model_path(), &["--pooling", "none"], &[text, "a"]);
    let piped: Vec<Vec<f32>> = pipe[0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(floats)
        .collect();
    assert_eq!(
        piped, rows,
        "edge-llm embed --pooling none differs from /embeddings"
    );
    assert_eq!(
        pipe[1]["embedding"].as_array().map(Vec::len),
        Some(1),
        "{}",
        pipe[1]
    );
    assert!(pipe[1]["embedding"][0].is_array(), "{}", pipe[1]);
    server.wait_for_metrics("KV blocks back", |s| used_blocks(s) == 0.0);
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

/// The real `openai` client's embeddings.create, one input and a batch (base64 on the wire,
/// decoded by the client) and with "float", equal the server's raw floats; and `edge-llm embed`
/// writes the same vectors for the same lines.
#[test]
fn openai_client_and_embed_pipe_equal_the_server() {
    let Some(python) = openai_python() else {
        return;
    };
    let Some(server) = Server::start(&["--pooling", "mean"]) else {
        return;
    };
    let (raw, _) = embeddings_of(&server, json!(TEXTS), json!({}));
    let out = Command::new(python)
        .arg(support::root().join("tests/openai_embeddings.py"))
        .arg(format!("http://{}", server.addr))
        .args(TEXTS)
        .output()
        .expect("running tests/openai_embeddings.py");
    assert!(
        out.status.success(),
        "openai client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("the script's JSON");
    assert_eq!(floats(&v["single"]), raw[0]);
    assert_eq!(floats(&v["float"]), raw[0]);
    let batch: Vec<Vec<f32>> = v["batch"].as_array().unwrap().iter().map(floats).collect();
    assert_eq!(batch, raw);
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);

    let pipe = embed_pipe(&support::model_path(), &["--pooling", "mean"], &TEXTS);
    let piped: Vec<Vec<f32>> = pipe.iter().map(|l| floats(&l["embedding"])).collect();
    assert_eq!(piped, raw, "edge-llm embed differs from the server");
    // A line that cannot be embedded gets an error line; the others go on.
    let pipe = embed_pipe(
        &support::model_path(),
        &["--pooling", "mean"],
        &["", TEXTS[0]],
    );
    assert!(
        pipe[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("empty")),
        "{pipe:?}"
    );
    assert_eq!(floats(&pipe[1]["embedding"]), raw[0]);
    server.wait_for_metrics("KV blocks back", |s| used_blocks(s) == 0.0);
}

/// `edge-llm bench --embed N`: the figures of N sentences, as a table and a JSON line.
#[test]
fn bench_embed_reports_sentences_per_second() {
    let Some(model) = support::fetched(support::model_path(), support::FETCH_MODEL) else {
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
        .args([
            "bench", "--embed", "40", "-r", "1", "-t", "2", "--json", "-m",
        ])
        .arg(model)
        .output()
        .expect("running edge-llm bench --embed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("| sentences | tokens | batch | sentences/s |"),
        "{stdout}"
    );
    let v: Value = serde_json::from_str(stdout.lines().last().unwrap()).expect("the JSON line");
    assert_eq!(v["embed"]["sentences"], 40, "{v}");
    assert!(v["embed"]["sentences_per_s"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["embed"]["tokens"].as_u64().unwrap() >= 40 * 24, "{v}");
}

/// An engine of `num_blocks` blocks of 16 tokens, `max_batched_tokens` a step, 8 sequences.
fn small_engine(num_blocks: usize, max_batched_tokens: usize) -> edge_llm::engine::EngineHandle {
    use edge_llm::engine::{EngineConfig, EngineHandle, EngineParts};
    let config = EngineConfig {
        block_size: 16,
        num_blocks,
        max_seq_len: 256,
        max_batched_tokens,
        max_seqs: 8,
        max_queue: 64,
        max_step_ms: None,
        mask_budget_ms: EngineConfig::DEFAULT_MASK_BUDGET_MS,
        kv_types: edge_llm::kernels::KvTypes::F16,
        num_state_slots: 0,
    };
    EngineHandle::start(support::shared_model(), config, EngineParts::default())
        .expect("the engine starts")
}

fn engine_embedding(stream: &mut edge_llm::engine::RequestStream) -> Vec<Vec<f32>> {
    use edge_llm::engine::Event;
    let mut vectors = None;
    while let Some(e) = stream.next_blocking() {
        match e {
            Event::Embedding { vectors: v } => vectors = Some(v),
            Event::Error(e) => panic!("{e}"),
            _ => {}
        }
    }
    vectors.expect("an embedding")
}

/// In the engine: embedding requests chunked over many steps, batched with decoding requests in
/// a pool too small for all of them (so sequences are preempted and computed again) give the
/// same vectors, bit for bit, as each alone in a roomy engine, and every block comes back.
#[test]
fn engine_embeddings_equal_alone_through_chunking_batching_and_preemption() {
    use edge_llm::engine::sampler::SamplingParams;
    use edge_llm::engine::{Pooling, Request};
    if support::fetched(support::model_path(), support::FETCH_MODEL).is_none() {
        return;
    }
    let mut rng = support::splitmix::Rng(7);
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|i| {
            (0..40 + 16 * i)
                .map(|_| 100 + (rng.next_u64() % 49000) as u32)
                .collect()
        })
        .collect();
    let poolings = [Pooling::Mean, Pooling::Last, Pooling::Cls, Pooling::None];
    let roomy = small_engine(128, 512);
    let alone: Vec<Vec<Vec<f32>>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let r = Request::embedding(p.clone(), poolings[i % 4]);
            engine_embedding(&mut roomy.submit(r).unwrap())
        })
        .collect();
    assert_eq!(
        alone[3].len(),
        prompts[3].len(),
        "pooling none: every token's vector"
    );

    let tight = small_engine(20, 48);
    let mut decoding = Vec::new();
    for seed in 0..2 {
        let mut r = Request::new(prompts[0][..16].to_vec(), SamplingParams::greedy(), 150);
        r.ignore_eos = true;
        r.sampling.seed = seed;
        decoding.push(tight.submit(r).unwrap());
    }
    let mut streams: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            tight
                .submit(Request::embedding(p.clone(), poolings[i % 4]))
                .unwrap()
        })
        .collect();
    for (i, s) in streams.iter_mut().enumerate() {
        assert_eq!(
            engine_embedding(s),
            alone[i],
            "prompt {i} differs when batched"
        );
    }
    for mut d in decoding {
        let (tokens, _) = support::collect(&mut d);
        assert_eq!(tokens.len(), 150);
    }
    let m = tight.metrics().unwrap();
    assert!(
        m.preemptions > 0,
        "the pool was meant to be too small: no preemption"
    );
    assert_eq!(m.blocks_used, 0, "blocks still in use");
}

/// The model layer on both backends: `forward_rows` on the CUDA backend (its CPU emulator)
/// returns the embedding rows the CPU backend returns, and asking for them leaves the logits
/// exactly as `forward` gives them. On the synthetic qwen3 file (f32, 64 wide).
#[cfg(feature = "cuda")]
#[test]
fn cuda_backend_returns_the_cpu_embedding_rows_and_logits_stay_the_same() {
    use edge_llm::cuda::Emu;
    use edge_llm::device::Executor;
    use edge_llm::model::kv_cache::BlockId;
    use edge_llm::model::{Batch, Model};
    let dir = std::env::var_os("EDGE_LLM_SYNTH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| support::root().join("target/synth"));
    let path = dir.join("qwen3.gguf");
    if !path.is_file() {
        support::skip_or_fail(&format!(
            "{} is missing (target/synth-venv/bin/python scripts/synth/synth.py models target/synth)",
            path.display()
        ));
        return;
    }
    let model = Model::load(&path).unwrap();
    let tokens: Vec<u32> = (0..20).map(|i| 1000 + 37 * i).collect();
    let table: Vec<BlockId> = (0..2).map(BlockId).collect();
    let make_batch = |embd: bool| {
        let mut b = Batch::with_max_blocks(2);
        b.push_sequence(&table, 16, 0..tokens.len(), |p| tokens[p], tokens.len() - 1);
        if embd {
            b.embd_rows = vec![0, 7, 19];
        }
        b
    };
    let mut cpu = Executor::cpu(&model, 16, 4);
    let plain = cpu.forward(&model, &make_batch(false)).unwrap();
    let mut cpu = Executor::cpu(&model, 16, 4);
    let with = cpu.forward_rows(&model, &make_batch(true)).unwrap();
    assert_eq!(
        with.logits, plain,
        "asking for embeddings changed the logits"
    );
    let n_embd = model.config.n_embd;
    assert_eq!(with.embd.len(), 3 * n_embd);
    let mut emu = Executor::cuda_emulated(&model, Emu::new(), 16, 4).unwrap();
    let on_emu = emu.forward_rows(&model, &make_batch(true)).unwrap();
    assert_eq!(on_emu.embd.len(), with.embd.len());
    for (r, (a, b)) in with
        .embd
        .chunks(n_embd)
        .zip(on_emu.embd.chunks(n_embd))
        .enumerate()
    {
        let d = cos_distance(a, b);
        assert!(d < 1e-6, "row {r}: CPU and CUDA emulator differ by {d:.2e}");
    }
}
