//! Constrained decoding in the engine, on the real default model: JSON-schema, regex and grammar
//! outputs always match; greedy output under a constraint is the same alone, among 16 sessions,
//! chunked and cached; where the unconstrained argmax is allowed the constrained greedy token is
//! it; a grammar that cannot compile is refused at submission; every block comes back.

mod support;

use edge_llm::constraint::{Constraint, ConstraintSpec};
use edge_llm::engine::sampler::SamplingParams;
use edge_llm::engine::{EngineConfig, EngineHandle, EngineParts, Event, FinishReason, Request};
use serde_json::json;
use support::shared_model;

fn engine(max_batched_tokens: usize) -> EngineHandle {
    let config = EngineConfig {
        block_size: 16,
        num_blocks: 1024,
        max_seq_len: 1024,
        max_batched_tokens,
        max_seqs: 64,
        max_queue: 64,
        max_step_ms: None,
        mask_budget_ms: EngineConfig::DEFAULT_MASK_BUDGET_MS,
        kv_types: edge_llm::kernels::KvTypes::F16,
        num_state_slots: 0,
    };
    EngineHandle::start(shared_model(), config, EngineParts::default()).unwrap()
}

fn chat_prompt(question: &str) -> Vec<u32> {
    let text = format!(
        "<|im_start|>system\nYou answer in JSON.<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    );
    shared_model().tokenizer.encode(&text, false, true).unwrap()
}

fn request(prompt: Vec<u32>, constraint: Option<Constraint>, max_tokens: usize) -> Request {
    let sampling = SamplingParams {
        constraint,
        ..SamplingParams::greedy()
    };
    Request::new(prompt, sampling, max_tokens)
}

fn run(stream: &mut edge_llm::engine::RequestStream) -> (Vec<u32>, String, FinishReason) {
    let mut tokens = Vec::new();
    let mut text = String::new();
    while let Some(e) = stream.next_blocking() {
        match e {
            Event::Token { token, text: t, .. } => {
                tokens.push(token);
                text.push_str(&t);
            }
            Event::Finished {
                reason, text: t, ..
            } => {
                text.push_str(&t);
                return (tokens, text, reason);
            }
            Event::Error(e) => panic!("engine error: {e}"),
            Event::Prompt { .. } | Event::Embedding { .. } => {}
        }
    }
    panic!("stream ended without finishing")
}

fn wait_blocks_back(e: &EngineHandle) {
    for _ in 0..200 {
        let m = e.metrics().unwrap();
        if m.num_running == 0 && m.num_waiting == 0 && m.blocks_used == 0 {
            assert_eq!(m.blocks_free, m.blocks_total);
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("blocks did not come back: {:?}", e.metrics());
}

fn person_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"enum": ["Paris", "London", "Tokyo"]}
        },
        "required": ["name", "age", "city"],
        "additionalProperties": false
    })
}

#[test]
fn schema_output_validates_and_ends_the_request() {
    let e = engine(512);
    let c = e
        .grammars
        .compile(&ConstraintSpec::JsonSchema(person_schema()), None)
        .unwrap();
    let (_, text, reason) = run(&mut e
        .submit(request(chat_prompt("Describe a person."), Some(c), 200))
        .unwrap());
    assert_eq!(reason, FinishReason::Stop, "{text}");
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(v["name"].is_string() && v["age"].is_i64(), "{text}");
    assert!(
        ["Paris", "London", "Tokyo"].contains(&v["city"].as_str().unwrap()),
        "{text}"
    );
    assert_eq!(v.as_object().unwrap().len(), 3);
    // A regex, and a Lark grammar.
    let c = e
        .grammars
        .compile(&ConstraintSpec::Regex("[0-9]{3}-[a-z]{2,4}".into()), None)
        .unwrap();
    let (_, text, _) = run(&mut e
        .submit(request(chat_prompt("A code?"), Some(c), 50))
        .unwrap());
    let ok = text.len() >= 6
        && text[..3].chars().all(|c| c.is_ascii_digit())
        && &text[3..4] == "-"
        && text[4..].chars().all(|c| c.is_ascii_lowercase());
    assert!(ok, "{text:?}");
    let lark = "start: \"yes\" | \"no\" | \"maybe: \" NUM\nNUM: /[0-9]+/\n";
    let c = e
        .grammars
        .compile(&ConstraintSpec::Lark(lark.into()), None)
        .unwrap();
    let (_, text, _) = run(&mut e
        .submit(request(chat_prompt("Is it raining?"), Some(c), 20))
        .unwrap());
    assert!(
        text == "yes" || text == "no" || text.starts_with("maybe: "),
        "{text:?}"
    );
    wait_blocks_back(&e);
    let m = e.metrics().unwrap();
    assert_eq!(m.requests_constrained, 3);
    assert!(m.masks_computed > 5, "{m:?}");
}

#[test]
fn bad_grammars_are_refused_at_compile_time() {
    let e = engine(512);
    let g = &e.grammars;
    let err = g
        .compile(&ConstraintSpec::Regex("[a-".into()), None)
        .unwrap_err();
    assert!(!err.is_empty());
    let err = g
        .compile(&ConstraintSpec::Lark("start: foo(".into()), None)
        .unwrap_err();
    assert!(!err.is_empty());
    let err = g
        .compile(
            &ConstraintSpec::JsonSchema(json!({"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format-xyz"}}, "unknownKeywordX": 1})),
            None,
        )
        .unwrap_err();
    assert!(
        err.contains("unknownKeywordX") || err.contains("no-such-format"),
        "{err}"
    );
    // The cache: the same schema compiles once.
    let spec = ConstraintSpec::JsonSchema(person_schema());
    assert!(!g.is_cached(&spec, None));
    let t = std::time::Instant::now();
    g.compile(&spec, None).unwrap();
    let first = t.elapsed();
    assert!(g.is_cached(&spec, None));
    let t = std::time::Instant::now();
    g.compile(&spec, None).unwrap();
    assert!(
        t.elapsed() <= first,
        "a cached schema is no slower than compiling it"
    );
}

/// Greedy under a constraint: 16 sessions at once (chunked prefill of 24 tokens a step, shared
/// cached prompt prefix) give the outputs of one-at-a-time runs on fresh engines.
#[test]
fn constrained_greedy_is_batch_chunk_and_cache_invariant() {
    let questions: Vec<String> = (0..16)
        .map(|i| format!("Describe person number {i} who lives in a big city."))
        .collect();
    let spec = ConstraintSpec::JsonSchema(person_schema());
    let alone: Vec<Vec<u32>> = questions
        .iter()
        .take(4)
        .map(|q| {
            let e = engine(512);
            let c = e.grammars.compile(&spec, None).unwrap();
            run(&mut e.submit(request(chat_prompt(q), Some(c), 60)).unwrap()).0
        })
        .collect();
    let e = engine(24);
    let c = e.grammars.compile(&spec, None).unwrap();
    for round in 0..2 {
        // Round 1 finds the prompts' shared prefix cached.
        let mut streams: Vec<_> = questions
            .iter()
            .map(|q| {
                e.submit(request(chat_prompt(q), Some(c.clone()), 60))
                    .unwrap()
            })
            .collect();
        let outs: Vec<Vec<u32>> = streams.iter_mut().map(|s| run(s).0).collect();
        for (i, want) in alone.iter().enumerate() {
            assert_eq!(&outs[i], want, "session {i}, round {round}");
        }
    }
    wait_blocks_back(&e);
}

/// At every step of a constrained greedy run, when the unconstrained greedy next token is allowed
/// by the constraint, it is the token chosen.
#[test]
fn the_unconstrained_argmax_is_kept_when_allowed() {
    let e = engine(512);
    let spec = ConstraintSpec::JsonObject;
    let c = e.grammars.compile(&spec, None).unwrap();
    let prompt = chat_prompt("Give me a JSON object about a cat.");
    let (tokens, _, _) = run(&mut e
        .submit(request(prompt.clone(), Some(c.clone()), 24))
        .unwrap());
    let mut state = c.new_state();
    let mut kept = 0;
    for (i, &t) in tokens.iter().enumerate() {
        let mut p = prompt.clone();
        p.extend_from_slice(&tokens[..i]);
        let (free, _, _) = run(&mut e.submit(request(p, None, 1)).unwrap());
        let mask = state.compute_mask().unwrap();
        if let Some(&f) = free.first() {
            if mask.is_allowed(f) {
                assert_eq!(f, t, "step {i}");
                kept += 1;
            }
        }
        state.consume(t).unwrap();
    }
    assert!(kept > 0, "no step had its unconstrained argmax allowed");
    wait_blocks_back(&e);
}

/// The rows that need the masked logits themselves (temperature, logprobs) see them: a sampled
/// constrained output is valid JSON for its schema, and every logprob a constrained greedy row
/// reports is of a token its mask allows; asking for logprobs changes no token (the greedy fast
/// path and the masked-logits path pick the same).
#[test]
fn sampled_and_logprob_rows_see_the_masked_logits() {
    let e = engine(512);
    let c = e
        .grammars
        .compile(&ConstraintSpec::JsonSchema(person_schema()), None)
        .unwrap();
    let prompt = chat_prompt("Describe a person.");
    for seed in 0..3 {
        let sampling = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
            constraint: Some(c.clone()),
            ..SamplingParams::default()
        };
        let (_, text, reason) = run(&mut e
            .submit(Request::new(prompt.clone(), sampling, 200))
            .unwrap());
        assert_eq!(reason, FinishReason::Stop, "{text}");
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(v["name"].is_string() && v["age"].is_i64(), "{text}");
    }
    let (plain, _, _) = run(&mut e
        .submit(request(prompt.clone(), Some(c.clone()), 200))
        .unwrap());
    let mut with_logprobs = request(prompt, Some(c.clone()), 200);
    with_logprobs.logprobs = Some(5);
    let mut s = e.submit(with_logprobs).unwrap();
    let mut state = c.new_state();
    let mut tokens = Vec::new();
    while let Some(ev) = s.next_blocking() {
        match ev {
            Event::Token {
                token, logprobs, ..
            } => {
                let mask = state.compute_mask().unwrap();
                let lp = logprobs.expect("logprobs asked for");
                assert!(!lp.top.is_empty());
                let tok = &shared_model().tokenizer;
                let end = tok.eos_id().is_some_and(|e| mask.is_allowed(e));
                for &(t, l) in &lp.top {
                    let allowed = mask.is_allowed(t) || (end && tok.is_eog(t));
                    assert!(allowed && l.is_finite(), "token {t} ({l}) not allowed");
                }
                assert_eq!(lp.top[0].0, token, "greedy takes the best allowed token");
                state.consume(token).unwrap();
                tokens.push(token);
            }
            Event::Finished { .. } => break,
            Event::Error(err) => panic!("{err}"),
            Event::Prompt { .. } | Event::Embedding { .. } => {}
        }
    }
    assert_eq!(tokens, plain);
    wait_blocks_back(&e);
}

/// Fifty tools: the call grammar compiles (in well under a second: a hang guard; the issue asks
/// for 100 ms and the figure is printed), a required call follows it, and the decode speed under
/// it against free decoding is printed (the README's figure comes from here, run alone).
#[test]
fn fifty_tools_compile_and_constrain_a_call() {
    use edge_llm::api::tools::{self, ToolFormat};
    let e = engine(512);
    // The token trie is built once per model, at the first constraint: not part of the figure.
    e.grammars
        .compile(&ConstraintSpec::JsonObject, None)
        .unwrap();
    let defs: Vec<serde_json::Value> = (0..50)
        .map(|i| {
            json!({"type": "function", "function": {"name": format!("tool_{i}"), "description": format!("Tool number {i}"),
                "parameters": {"type": "object", "properties": {
                    "query": {"type": "string", "maxLength": 40},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 100},
                    "mode": {"enum": ["fast", "slow", format!("m{i}")]}},
                    "required": ["query", "mode"]}}})
        })
        .collect();
    let body = json!({"tools": defs, "tool_choice": "required", "parallel_tool_calls": false});
    let req = tools::parse(body.as_object().unwrap()).unwrap().unwrap();
    let (spec, trigger) =
        tools::grammar(&req, ToolFormat::Hermes, &shared_model().tokenizer).unwrap();
    let t = std::time::Instant::now();
    let c = e.grammars.compile(&spec, trigger).unwrap();
    let compile_ms = t.elapsed().as_secs_f64() * 1000.0;
    eprintln!("50 tools: grammar compiled in {compile_ms:.1} ms");
    assert!(compile_ms < 1000.0, "{compile_ms} ms");

    // Decode speed: the call under the grammar against free text of the same length, interleaved.
    let prompt = chat_prompt("Search for cats with tool_7.");
    let timed = |constraint: Option<Constraint>, n: usize| {
        let mut s = e.submit(request(prompt.clone(), constraint, n)).unwrap();
        let mut times = Vec::new();
        let mut text = String::new();
        while let Some(ev) = s.next_blocking() {
            match ev {
                Event::Token { text: t, .. } => {
                    times.push(std::time::Instant::now());
                    text.push_str(&t);
                }
                Event::Finished { text: t, .. } => text.push_str(&t),
                Event::Error(err) => panic!("{err}"),
                Event::Prompt { .. } | Event::Embedding { .. } => {}
            }
        }
        let per_token =
            (times[times.len() - 1] - times[0]).as_secs_f64() / (times.len() - 1) as f64;
        (per_token, times.len(), text)
    };
    let (_, n, text) = timed(Some(c.clone()), 120);
    assert!(
        text.starts_with("<tool_call>\n{\"name\": \"tool_"),
        "{text}"
    );
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        with.push(timed(Some(c.clone()), 120).0);
        let mut free = request(prompt.clone(), None, n);
        free.ignore_eos = true;
        let mut s = e.submit(free).unwrap();
        let mut times = Vec::new();
        while let Some(ev) = s.next_blocking() {
            if let Event::Token { .. } = ev {
                times.push(std::time::Instant::now());
            }
        }
        without.push((times[times.len() - 1] - times[0]).as_secs_f64() / (times.len() - 1) as f64);
    }
    with.sort_by(f64::total_cmp);
    without.sort_by(f64::total_cmp);
    let ratio = without[1] / with[1];
    let m = e.metrics().unwrap();
    eprintln!(
        "50 tools: {n} tokens, {:.2} ms/token constrained, {:.2} ms/token free: {ratio:.2}x the free speed; \
         masks {:.0} us each on average",
        with[1] * 1000.0,
        without[1] * 1000.0,
        m.mask_time_us as f64 / m.masks_computed.max(1) as f64
    );
    // Printed, not asserted: speed is a benchmark's claim, and this test shares the machine with
    // the rest of the suite (a CI run measured 0.69x here while other tests ran beside it).
    wait_blocks_back(&e);
}

/// `api::reasoning`'s wrapping on the real vocabulary, token by token: the thoughts before
/// `</think>` are free text (braces, quotes, a partial tag), the schema holds after it, and
/// without a forced-open block the reply may skip thinking and start with the JSON at once.
#[test]
fn a_constraint_after_thinking_leaves_the_thoughts_free() {
    use edge_llm::api::reasoning::constraint_after_thinking;
    let model = shared_model();
    let tok = &model.tokenizer;
    let e = engine(512);
    let ids = |s: &str| tok.encode(s, false, false).unwrap();
    let word = ids(" hello")[0];
    let brace = ids("{")[0];
    for forced_open in [false, true] {
        let spec = constraint_after_thinking(
            ConstraintSpec::JsonSchema(person_schema()),
            forced_open,
            tok,
        );
        let c = e.grammars.compile(&spec, None).unwrap();
        let mut state = c.new_state();
        let start = state.compute_mask().unwrap();
        // Both may open with the JSON (forced: as thoughts); only the forced block may open
        // with free text.
        assert!(start.is_allowed(brace));
        assert_eq!(
            start.is_allowed(word),
            forced_open,
            "free text at the start"
        );
        let head = if forced_open {
            "I could"
        } else {
            "<think>\nI could"
        };
        let tail = " write anything: x = {1, \"a\"} or </thin.\n</think>\n\n";
        for (k, id) in ids(head).into_iter().chain(ids(tail)).enumerate() {
            let mask = state.compute_mask().unwrap();
            assert!(
                mask.is_allowed(id),
                "token {k} ({id}) refused in the thoughts"
            );
            state.consume(id).unwrap();
            if k + 1 == ids(head).len() {
                let free = state.compute_mask().unwrap();
                assert!(free.is_allowed(word) && free.is_allowed(brace));
            }
        }
        let after = state.compute_mask().unwrap();
        assert!(
            after.is_allowed(brace),
            "the schema's `{{` refused after </think>"
        );
        assert!(!after.is_allowed(word), "free text allowed after </think>");
    }
}
