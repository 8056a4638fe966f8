//! llama.cpp's samplers in edge-llm. Against llama.cpp itself: tests/reference/samplers.json
//! (written by scripts/synth/sampler_ref.sh, which runs llama.cpp's own sampler chains) holds
//! rows of logits, a token history and sampler configurations (each sampler alone, and chains
//! in several `samplers` orders); edge-llm's chain, built from the same fields through the
//! request parser, must leave the same tokens with the same probabilities (within 1e-5), track
//! Mirostat's mu step by step, and tokenize DRY's default breakers against the default model's
//! vocabulary as llama.cpp does. Then: seeds reproduce, greedy ignores every new sampler, the
//! server, `run --jsonl` and `run`'s flags give the same seeded sampled text, and bad values
//! are refused naming the field.

mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use edge_llm::api::request::{gen_params_over, Endpoint, Fields};
use edge_llm::engine::sampler::dry::{self, Breakers};
use edge_llm::engine::sampler::{Candidates, Sampler, SamplingParams};
use edge_llm::gguf::GgufFile;
use edge_llm::tokenizer::Tokenizer;
use serde_json::{json, Value};

/// The budget on each kept token's probability against llama.cpp's.
const PROB_BUDGET: f32 = 1e-5;
/// The budget on Mirostat's mu (in bits) after each step.
const MU_BUDGET: f32 = 1e-4;

fn reference() -> Value {
    let path = support::root().join("tests/reference/samplers.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/synth/sampler_ref.sh)", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Sampling params from a configuration's fields, read by the server's own parser.
fn params(fields: &Value) -> SamplingParams {
    let map = fields.as_object().unwrap();
    gen_params_over(
        &Fields(map),
        Endpoint::Completions,
        SamplingParams::default(),
    )
    .unwrap_or_else(|e| panic!("{fields}: {}", e.message))
    .sampling
}

/// `[[id, p], ...]` as a map.
fn kept_map(v: &Value) -> BTreeMap<u32, f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| (e[0].as_u64().unwrap() as u32, e[1].as_f64().unwrap() as f32))
        .collect()
}

/// The candidates a chain left (a token merged away or cut has probability 0), as a map.
fn kept_of(cand: &Candidates) -> BTreeMap<u32, f32> {
    cand.data
        .iter()
        .filter(|c| c.p > 0.0)
        .map(|c| (c.id, c.p))
        .collect()
}

fn assert_same_kept(what: &str, ours: &BTreeMap<u32, f32>, theirs: &BTreeMap<u32, f32>) {
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "{what}: kept set differs"
    );
    for (id, p) in theirs {
        let q = ours[id];
        assert!(
            (q - p).abs() <= PROB_BUDGET,
            "{what}: token {id}: edge-llm {q}, llama.cpp {p}"
        );
    }
}

#[test]
fn every_chain_leaves_llama_cpps_tokens_and_probabilities() {
    let r = reference();
    let rows: Vec<Vec<f32>> = r["logits"].as_array().unwrap().iter().map(floats).collect();
    let history = ids(&r["history"]);
    let breakers: Vec<Vec<u32>> = r["dry_breaker_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(ids)
        .collect();
    let chains = r["chains"].as_array().unwrap();
    assert!(chains.len() >= 20, "{} chains", chains.len());
    for chain in chains {
        let name = chain["name"].as_str().unwrap();
        let mut s = Sampler::new(params(&chain["fields"]));
        s.set_breakers(Breakers::from_sequences(&breakers));
        for (i, (row, kept)) in rows
            .iter()
            .zip(chain["kept"].as_array().unwrap())
            .enumerate()
        {
            let cand = s.candidates(row, &history, &[]);
            assert_same_kept(
                &format!("{name}, row {i}"),
                &kept_of(&cand),
                &kept_map(kept),
            );
        }
    }
}

#[test]
fn mirostat_cuts_and_mu_follow_llama_cpp_step_by_step() {
    let r = reference();
    let rows: Vec<Vec<f32>> = r["logits"].as_array().unwrap().iter().map(floats).collect();
    for m in r["mirostat"].as_array().unwrap() {
        let p = params(&m["fields"]);
        let version = p.mirostat;
        let mut s = Sampler::new(p);
        for (step, st) in m["steps"].as_array().unwrap().iter().enumerate() {
            let what = format!("mirostat {version}, step {step}");
            let cand = s.mirostat_candidates(&rows[step % rows.len()]);
            let ours: BTreeMap<u32, f32> = cand.data.iter().map(|c| (c.id, c.p)).collect();
            assert_same_kept(&what, &ours, &kept_map(&st["kept"]));
            // llama.cpp drew this token; edge-llm updates mu by it.
            let chosen = st["chosen"].as_u64().unwrap() as u32;
            s.mirostat_accept(ours[&chosen]);
            let mu = st["mu"].as_f64().unwrap() as f32;
            assert!(
                (s.mu - mu).abs() <= MU_BUDGET,
                "{what}: mu {} vs {mu}",
                s.mu
            );
        }
    }
}

#[test]
fn dry_breakers_tokenize_as_llama_cpp_on_the_default_model() {
    let r = reference();
    let Some(path) = support::fetched(support::model_path(), support::FETCH_MODEL) else {
        return;
    };
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    let strings: Vec<String> = edge_llm::engine::sampler::DRY_DEFAULT_BREAKERS
        .map(String::from)
        .to_vec();
    let b = dry::breakers(&tok, &strings);
    let mut ours: Vec<Vec<u32>> =
        b.0.iter()
            .flat_map(|(head, tails)| {
                tails.iter().map(move |t| {
                    let mut s = vec![*head];
                    s.extend(t);
                    s
                })
            })
            .collect();
    ours.sort();
    let theirs: Vec<Vec<u32>> = r["dry_default_breakers"]["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .map(ids)
        .collect();
    assert!(theirs.len() > 100, "{} breaker sequences", theirs.len());
    assert_eq!(ours, theirs);
}

/// Every new sampler on at once (and the default chain order).
fn everything(seed: u64, temperature: f32) -> SamplingParams {
    let mut p = params(&json!({
        "temperature": temperature, "top_k": 60, "top_p": 0.97, "min_p": 0.01,
        "dry_multiplier": 0.8, "xtc_probability": 0.5, "xtc_threshold": 0.05,
        "typical_p": 0.95, "top_n_sigma": 2.5, "dynatemp_range": 0.3, "min_keep": 2,
        "repeat_penalty": 1.1
    }));
    p.seed = seed;
    p
}

#[test]
fn seeds_reproduce_and_greedy_ignores_every_new_sampler() {
    let r = reference();
    let rows: Vec<Vec<f32>> = r["logits"].as_array().unwrap().iter().map(floats).collect();
    let history = ids(&r["history"]);
    let draw = |p: SamplingParams| {
        let mut s = Sampler::new(p);
        s.set_breakers(Breakers::from_sequences(&[vec![10]]));
        let mut out = Vec::new();
        for i in 0..40 {
            out.push(s.sample(&rows[i % rows.len()], &history, &out.clone()));
        }
        out
    };
    let mut runs = Vec::new();
    for seed in [1u64, 2, 3, 99] {
        let a = draw(everything(seed, 0.9));
        assert_eq!(a, draw(everything(seed, 0.9)), "seed {seed}");
        runs.push(a);
        for mirostat in [1, 2] {
            let p = SamplingParams {
                mirostat,
                ..everything(seed, 0.9)
            };
            assert_eq!(draw(p.clone()), draw(p), "seed {seed}, mirostat {mirostat}");
        }
    }
    runs.dedup();
    assert!(runs.len() > 1, "every seed drew the same tokens");
    for mirostat in [0, 1, 2] {
        let plain = SamplingParams {
            repeat_penalty: 1.1,
            ..SamplingParams::greedy()
        };
        let all = SamplingParams {
            mirostat,
            ..everything(5, 0.0)
        };
        assert_eq!(draw(all), draw(plain), "greedy, mirostat {mirostat}");
    }
}

// ---- the faces ----

const PROMPT: &str = "Once upon a time, in a small village by the sea, there lived";

/// A seeded sampled body with llama-server's sampling fields (all the chain's fields given, as
/// the server's defaults are OpenAI's and `--jsonl`'s the command line's).
fn sampled_body(extra: Value) -> Value {
    let mut body = json!({
        "prompt": PROMPT, "max_tokens": 24, "seed": 11, "temperature": 0.9,
        "top_k": 40, "top_p": 0.95, "min_p": 0.05,
        "dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2,
        "dry_penalty_last_n": 64, "dry_sequence_breakers": ["\n", ":"],
        "xtc_probability": 0.5, "xtc_threshold": 0.1, "typical_p": 0.95,
        "top_n_sigma": 3.0, "dynatemp_range": 0.2, "dynatemp_exponent": 1.5, "min_keep": 1,
        "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn jsonl(lines: &[Value]) -> Vec<Value> {
    let m = support::model_path();
    let mut child = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
        .args(["run", "--jsonl", "-m", m.to_str().unwrap(), "-c", "1024"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary starts");
    let input: Vec<String> = lines.iter().map(Value::to_string).collect();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.join("\n").as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn server_jsonl_and_run_flags_sample_the_same_seeded_text() {
    let Some(server) = support::harness::Server::start(&[]) else {
        return;
    };
    let bodies = [
        sampled_body(json!({})),
        sampled_body(json!({"samplers": "dkypmxt", "seed": 3})),
        sampled_body(json!({"mirostat": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.2})),
        sampled_body(json!({"mirostat": 1, "mirostat_tau": 5.0, "mirostat_eta": 0.1, "seed": 5})),
    ];
    let mut served = Vec::new();
    for body in &bodies {
        let (status, v) = server.post("/v1/completions", body);
        assert_eq!(status, 200, "{v}");
        served.push(v["choices"][0]["text"].as_str().unwrap().to_string());
    }
    // Greedy ignores them all.
    let greedy = |extra: Value| {
        let mut body = json!({"prompt": PROMPT, "max_tokens": 24, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, v) = server.post("/v1/completions", &body);
        assert_eq!(status, 200, "{v}");
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let plain = greedy(json!({}));
    // The new samplers do something: without them the same seed draws another text.
    let (status, v) = server.post(
        "/v1/completions",
        &sampled_body(
            json!({"dry_multiplier": 0, "xtc_probability": 0, "typical_p": 1,
            "top_n_sigma": -1, "dynatemp_range": 0}),
        ),
    );
    assert_eq!(status, 200, "{v}");
    assert_ne!(v["choices"][0]["text"].as_str(), Some(served[0].as_str()));
    let mut all = sampled_body(json!({"temperature": 0, "mirostat": 2}));
    all.as_object_mut().unwrap().remove("prompt");
    assert_eq!(greedy(all), plain);
    drop(server);

    let lines = jsonl(&bodies);
    for (i, (line, text)) in lines.iter().zip(&served).enumerate() {
        assert_eq!(
            line["text"].as_str(),
            Some(text.as_str()),
            "body {i}: {line}"
        );
    }
    assert_ne!(
        served[0], served[1],
        "another order and seed drew the same text"
    );

    // `run`'s flags (llama.cpp's names) give the first body's text.
    let m = support::model_path();
    let out = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
        .args([
            "run",
            "-m",
            m.to_str().unwrap(),
            "-c",
            "1024",
            "-p",
            PROMPT,
            "-n",
            "24",
        ])
        .args([
            "--seed", "11", "--temp", "0.9", "--top-k", "40", "--top-p", "0.95",
        ])
        .args([
            "--min-p",
            "0.05",
            "--dry-multiplier",
            "0.8",
            "--dry-base",
            "1.75",
        ])
        .args(["--dry-allowed-length", "2", "--dry-penalty-last-n", "64"])
        .args([
            "--dry-sequence-breaker",
            "\n",
            "--dry-sequence-breaker",
            ":",
        ])
        .args([
            "--xtc-probability",
            "0.5",
            "--xtc-threshold",
            "0.1",
            "--typical",
            "0.95",
        ])
        .args([
            "--top-nsigma",
            "3",
            "--dynatemp-range",
            "0.2",
            "--dynatemp-exp",
            "1.5",
        ])
        .args([
            "--min-keep",
            "1",
            "--samplers",
            "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), served[0]);
    let out = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
        .args([
            "run",
            "-m",
            m.to_str().unwrap(),
            "-c",
            "1024",
            "-p",
            PROMPT,
            "-n",
            "24",
        ])
        .args([
            "--seed",
            "5",
            "--temp",
            "0.9",
            "--mirostat",
            "1",
            "--mirostat-lr",
            "0.1",
        ])
        .args(["--mirostat-ent", "5", "--dry-multiplier", "0.8"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), served[3]);
}

#[test]
fn bad_sampler_values_are_refused_naming_the_field() {
    let Some(server) = support::harness::Server::start(&[]) else {
        return;
    };
    for (field, value) in [
        ("xtc_probability", json!(2)),
        ("dry_base", json!(0.5)),
        ("dry_sequence_breakers", json!([])),
        ("mirostat", json!(3)),
        ("typical_p", json!("high")),
        ("min_keep", json!(-1)),
        ("samplers", json!(["top_k", "bogus"])),
        ("dynatemp_range", json!(-0.5)),
        ("adaptive_target", json!(0.5)),
    ] {
        for path in ["/v1/completions", "/v1/chat/completions", "/v1/responses"] {
            let mut body = match path {
                "/v1/completions" => json!({"prompt": "hi", "max_tokens": 2}),
                "/v1/chat/completions" => {
                    json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
                }
                _ => json!({"input": "hi", "max_output_tokens": 2}),
            };
            body[field] = value.clone();
            let (status, v) = server.post(path, &body);
            assert_eq!(status, 400, "{path} {field}={value}: {v}");
            let msg = v["error"]["message"].as_str().unwrap_or_default();
            assert!(
                msg.contains(field) && !msg.contains('\n'),
                "{path} {field}: {v}"
            );
        }
    }
    drop(server);
    let m = support::model_path();
    for flag in [
        ["--xtc-probability", "2"],
        ["--mirostat", "3"],
        ["--samplers", "top_k;bogus"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
            .args(["run", "-m", m.to_str().unwrap(), "-p", "hi", "-n", "2"])
            .args(flag)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag:?} was taken");
        let err = String::from_utf8_lossy(&out.stderr);
        let name = flag[0].trim_start_matches("--").replace('-', "_");
        assert!(
            err.contains(flag[0]) || err.contains(&name),
            "{flag:?}: {err}"
        );
    }
}

/// Not a check: the time of one draw on the default model's vocabulary and Qwen's, with the
/// default chain and with every sampler on (`cargo test --release --test samplers -- --ignored
/// --nocapture`).
#[test]
#[ignore]
fn time_per_draw() {
    let history: Vec<u32> = (0..512u32).map(|i| (i * 7919) % 4096).collect();
    for vocab in [49_152usize, 151_936] {
        let row: Vec<f32> = (0..vocab)
            .map(|i| ((i as u64 * 2_654_435_761) % 10_007) as f32 / 1000.0 - 5.0)
            .collect();
        for (name, p) in [
            ("default chain", SamplingParams::default()),
            (
                "top_k 0, top_p 0.9",
                SamplingParams {
                    top_k: 0,
                    top_p: 0.9,
                    ..Default::default()
                },
            ),
            ("everything", everything(1, 0.8)),
            (
                "mirostat 2",
                SamplingParams {
                    mirostat: 2,
                    ..Default::default()
                },
            ),
        ] {
            let mut s = Sampler::new(p);
            s.set_breakers(Breakers::from_sequences(&[vec![10]]));
            let n = 200;
            let t = std::time::Instant::now();
            for _ in 0..n {
                std::hint::black_box(s.sample(&row, &history, &[]));
            }
            let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
            eprintln!("vocab {vocab}: {name}: {us:.0} us per draw");
        }
        let t = std::time::Instant::now();
        for _ in 0..200 {
            std::hint::black_box(before(&row, 40));
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / 200.0;
        eprintln!("vocab {vocab}: the chain before (top-k 40, top-p, min-p): {us:.0} us per draw");
    }
}

/// The sampler's work before llama.cpp's chain came in (for the timing above): top-k by
/// selection, a sort of the k, softmax, top-p and min-p cuts, softmax.
fn before(logits: &[f32], k: usize) -> u32 {
    let mut cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l))
        .collect();
    cand.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    cand.truncate(k);
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let max = cand[0].1;
    let e: Vec<f32> = cand.iter().map(|c| (c.1 - max).exp()).collect();
    let sum: f32 = e.iter().sum();
    let keep = e
        .iter()
        .take_while(|&&x| x / sum >= 0.05 * e[0] / sum)
        .count()
        .max(1);
    cand[keep / 2].0
}

fn chat_pipe(args: &[&str], stdin: &str) -> (String, String) {
    let dir = std::env::temp_dir().join(format!("edge-llm-samplers-chat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let m = support::model_path();
    let mut child = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
        .args(["chat", "-m", m.to_str().unwrap(), "-c", "1024"])
        .args(args)
        .env("XDG_DATA_HOME", &dir)
        .env("XDG_CACHE_HOME", &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn chat_set_takes_the_fields_as_the_flags_do() {
    if support::fetched(support::model_path(), support::FETCH_MODEL).is_none() {
        return;
    }
    let message = "Tell me a story about a cat.\n";
    let set = "/set seed 9\n/set temp 0.9\n/set max_tokens 16\n/set dry_multiplier 0.8\n\
               /set xtc_probability 0.5\n/set samplers dry;top_k;min_p;xtc;temperature\n\
               /set xtc_probability 2\n";
    let (by_set, log) = chat_pipe(&[], &format!("{set}{message}"));
    assert!(
        log.contains("xtc_probability") && log.contains("dry_multiplier 0.8"),
        "{log}"
    );
    let (by_flags, _) = chat_pipe(
        &[
            "--seed",
            "9",
            "--temp",
            "0.9",
            "-n",
            "16",
            "--dry-multiplier",
            "0.8",
        ]
        .iter()
        .chain(&[
            "--xtc-probability",
            "0.5",
            "--samplers",
            "dry;top_k;min_p;xtc;temperature",
        ])
        .copied()
        .collect::<Vec<_>>(),
        message,
    );
    assert!(!by_set.trim().is_empty());
    assert_eq!(by_set, by_flags);
    let (plain, _) = chat_pipe(&["--seed", "9", "--temp", "0.9", "-n", "16"], message);
    assert_ne!(plain, by_set, "the samplers changed nothing");
}

/// llama.cpp's infill stage (llama.vscode's `samplers: [..., "infill"]`) with the default
/// model's vocabulary: after top-k (and top-p), the same tokens and probabilities as
/// `llama_sampler_infill`, on the reference rows and on rows whose end-of-generation tokens
/// lead (they take over).
#[test]
fn the_infill_stage_keeps_llama_cpps_tokens() {
    let r = reference();
    let rows: Vec<Vec<f32>> = r["logits"].as_array().unwrap().iter().map(floats).collect();
    let infill = &r["infill"];
    let eog = ids(&infill["eog_ids"]);
    let tok = &support::model().tokenizer;
    for &id in &eog {
        assert!(
            tok.is_eog(id),
            "token {id} ends generation in llama.cpp's vocabulary"
        );
    }
    let cases = infill["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 3);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let mut s = Sampler::new(params(&case["fields"]));
        assert!(
            s.needs_breakers(),
            "{name}: the infill stage needs the vocabulary"
        );
        s.bind_breakers(tok);
        let lift = case["eog_lift"].as_f64().unwrap() as f32;
        for (i, (row, kept)) in rows
            .iter()
            .zip(case["kept"].as_array().unwrap())
            .enumerate()
        {
            let mut row = row.clone();
            if lift > 0.0 {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                for &id in &eog {
                    row[id as usize] = max + lift;
                }
            }
            let cand = s.candidates(&row, &[], &[]);
            assert_same_kept(
                &format!("{name}, row {i}"),
                &kept_of(&cand),
                &kept_map(kept),
            );
        }
    }
}
