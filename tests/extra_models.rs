//! The qwen2 and gemma3 architectures on their real Q4_K_M files (fetched by
//! scripts/fetch-extra-models.sh; a test skips when its file is absent): greedy continuations
//! against llama.cpp's (../shared/reference/llamacpp-{qwen2,gemma3}.json) and perplexity on
//! the GPL-3 text against llama.cpp's running values on a machine of this kind; gemma3's
//! sliding window past 512 tokens, alone and through the engine's prefix cache.

mod support;

use std::path::PathBuf;
use std::sync::Arc;

use edge_llm::chat_template::{ChatMessage, ChatTemplate};
use edge_llm::engine::sampler::SamplingParams;
use edge_llm::engine::{EngineConfig, EngineHandle, EngineParts, Event, Request};
use edge_llm::model::Model;
use edge_llm::scoring::runner::SequenceRunner;

struct Case {
    /// The name scripts/fetch-extra-models.sh takes.
    name: &'static str,
    path: fn() -> PathBuf,
    reference: &'static str,
    /// llama.cpp's greedy continuations on this machine, from `llama-simple` and `llama-server`
    /// (token ids and each step's top two log-probabilities), in tests/extra_models/: the
    /// reference's texts (made on an AVX-512 machine) pass near-ties that llama.cpp itself
    /// resolves differently with another SIMD path or batch shape, so each of these texts is
    /// llama.cpp's answer too. The file says how it was made.
    here: &'static str,
    /// Running perplexity after chunks 1 and 2 from llama.cpp 0c1e57098 built for this machine
    /// (AVX2, 2 threads): `.llama.cpp/build/bin/llama-perplexity -m models/FILE
    /// -f /usr/share/common-licenses/GPL-3 -c 512 -t 2`.
    ppl_running: [f64; 2],
    /// Largest gap between our top logit and llama.cpp's token at which a divergence is
    /// accepted as a numerical tie.
    tie_margin: f32,
}

const QWEN2: Case = Case {
    name: "qwen2",
    path: support::qwen_path,
    reference: "llamacpp-qwen2.json",
    here: "llamacpp-here-qwen2.json",
    // All 14 chunks: final 5.3158 +/- 0.18635 (the AVX-512 reference: 5.3184).
    ppl_running: [4.8351, 4.6871],
    // llama.cpp's own flash-attention switch moves qwen2's log-probabilities by up to 0.32.
    tie_margin: 0.25,
};

const GEMMA3: Case = Case {
    name: "gemma3",
    path: support::gemma3_path,
    reference: "llamacpp-gemma3.json",
    here: "llamacpp-here-gemma3.json",
    // All 14 chunks: final 13.8844 +/- 0.64716 (the AVX-512 reference: 13.9062).
    ppl_running: [12.9953, 13.9358],
    // Wider than qwen2's: gemma3's log-probabilities move by up to 0.76 (0.073 on average)
    // when llama.cpp itself only switches flash attention on or off.
    tie_margin: 0.5,
};

/// gemma3's running perplexity after chunk 1 at context 1024, where its local layers see only
/// the last 512 keys: llama.cpp here gives 15.9178 (`llama-perplexity ... -c 1024 -t 2
/// --chunks 1`; 15.9558 with `-fa off`). Attending to everything instead gives about 234.
const GEMMA3_PPL_CTX_1024: f64 = 15.9178;

/// First token index at which a late divergence may be accepted.
const MIN_DIVERGENCE: usize = 10;

fn load(case: &Case) -> Option<Model> {
    let path = (case.path)();
    if !path.is_file() {
        // Under CI=true a missing prerequisite is a failure, never a silent pass.
        support::skip_or_fail(&format!(
            "model not fetched (scripts/fetch-extra-models.sh {})",
            case.name
        ));
        return None;
    }
    Some(Model::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display())))
}

fn read_json(p: PathBuf) -> serde_json::Value {
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn reference(case: &Case) -> serde_json::Value {
    read_json(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/reference")
            .join(case.reference),
    )
}

/// llama.cpp here: one entry per reference prompt, in the same order.
fn here(case: &Case) -> Vec<serde_json::Value> {
    let v = read_json(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/extra_models")
            .join(case.here),
    );
    v["greedy"].as_array().unwrap().clone()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// llama.cpp-here's margin between its top two at `step` of its continuation:
/// [step][2][id, logprob].
fn their_margin(here: &serde_json::Value, step: usize) -> f32 {
    let top = &here["server_top2"][step];
    (top[0][1].as_f64().unwrap() - top[1][1].as_f64().unwrap()) as f32
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Where our greedy continuation left llama.cpp's text.
struct Divergence {
    token: usize,
    /// Our tokens before it.
    before: Vec<u32>,
    ours: u32,
    /// llama.cpp's token: the most likely one (for us) whose text continues the reference.
    theirs: u32,
    gap: f32,
    /// How many tokens we rank above llama.cpp's.
    rank: usize,
}

/// The token llama.cpp most likely took at a step where ours is `ours`: the one we rank
/// highest among those, other than ours, whose text continues `rest` and passes `keep`.
fn their_token(
    model: &Model,
    before: &[u32],
    logits: &[f32],
    ours: u32,
    rest: &[u8],
    keep: impl Fn(&[u8]) -> bool,
) -> Option<Divergence> {
    let tok = &model.tokenizer;
    let theirs = (0..logits.len() as u32)
        .filter(|&t| t != ours)
        .filter(|&t| {
            let b = tok.token_bytes(t);
            !b.is_empty() && rest.starts_with(&b) && keep(&b)
        })
        .max_by(|&a, &b| logits[a as usize].total_cmp(&logits[b as usize]))?;
    let l = logits[theirs as usize];
    let rank = logits.iter().filter(|&&x| x > l).count();
    Some(Divergence {
        token: before.len(),
        before: before.to_vec(),
        ours,
        theirs,
        gap: logits[ours as usize] - l,
        rank,
    })
}

/// Greedy decoding of `n` tokens after `prompt`, compared byte for byte with `expected`, the
/// text llama.cpp generated. Stops at the first token whose text leaves `expected`. The text
/// does not say how llama.cpp split it into tokens: where our token leaves it, llama.cpp
/// either took another token there, or took a longer one than ours at an earlier step (".C"
/// where we took "." then " C"); the divergence reported is the likelier (smaller gap).
fn greedy_against(
    model: &Model,
    prompt: &[u32],
    n: usize,
    expected: &[u8],
) -> Result<Vec<u32>, Divergence> {
    let tok = &model.tokenizer;
    let mut runner = SequenceRunner::new(model, prompt.len() + n, 16);
    let mut logits = runner.eval(prompt, false).expect("prompt runs");
    // Each step's logits and where its token starts in `expected`.
    let mut steps: Vec<(Vec<f32>, usize)> = Vec::new();
    let (mut out, mut at) = (Vec::new(), 0);
    for _ in 0..n {
        if at == expected.len() {
            break;
        }
        let ours = argmax(&logits);
        let bytes = tok.token_bytes(ours);
        if bytes.is_empty() || !expected[at..].starts_with(&bytes) {
            let here = their_token(model, &out, &logits, ours, &expected[at..], |_| true);
            let earlier = steps.iter().enumerate().rev().find_map(|(j, (l, start))| {
                let ours_len = tok.token_bytes(out[j]).len();
                their_token(model, &out[..j], l, out[j], &expected[*start..], |b| {
                    b.len() > ours_len
                })
            });
            return Err([here, earlier]
                .into_iter()
                .flatten()
                .min_by(|a, b| a.gap.total_cmp(&b.gap))
                .expect("some token continues llama.cpp's text"));
        }
        steps.push((logits, at));
        at += bytes.len();
        out.push(ours);
        logits = runner.eval(&[ours], false).expect("decode step runs");
    }
    Ok(out)
}

/// Free-running greedy against llama.cpp's texts. Each prompt's continuation must equal one of
/// them, or leave one only at a near-tie: llama.cpp's token is our runner-up by less than the
/// margin, late in the text or (early) where llama.cpp's own top two there are as close.
fn greedy_matches_llama_cpp(case: &Case) {
    let Some(model) = load(case) else { return };
    let tok = &model.tokenizer;
    let mut exact = 0;
    for (c, h) in reference(case)["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .zip(here(case))
    {
        let prompt = c["prompt"].as_str().unwrap();
        assert_eq!(h["prompt"], c["prompt"]);
        let n = c["n_predict"].as_u64().unwrap() as usize;
        let prompt_ids = tok.encode(prompt, tok.add_bos_default(), true).unwrap();
        let mut texts = vec![("reference", c["text"].as_str().unwrap())];
        for (tool, key) in [
            ("llama-simple here", "simple_text"),
            ("llama-server here", "server_text"),
        ] {
            let t = h[key].as_str().unwrap();
            if texts.iter().all(|&(_, u)| u != t) {
                texts.push((tool, t));
            }
        }
        let server_ids = ids(&h["server_ids"]);
        let mut verdict = Err(String::new());
        for &(source, text) in &texts {
            match greedy_against(&model, &prompt_ids, n, text.as_bytes()) {
                Ok(got) => {
                    assert_eq!(tok.decode(&got), text, "{}: text of {prompt:?}", case.name);
                    eprintln!(
                        "{}: {prompt:?}: all {n} tokens match the {source} text",
                        case.name
                    );
                    verdict = Ok(true);
                    break;
                }
                Err(d) => {
                    // llama.cpp's own margin, where its server run had the same context.
                    let theirs = (server_ids.get(..d.token) == Some(&d.before[..]))
                        .then(|| their_margin(&h, d.token));
                    eprintln!(
                        "{}: {prompt:?}: leaves the {source} text at token {}: ours {} {:?} vs llama.cpp {} {:?}, gap {:.4}, rank {}{}",
                        case.name,
                        d.token,
                        d.ours,
                        tok.decode(&[d.ours]),
                        d.theirs,
                        tok.decode(&[d.theirs]),
                        d.gap,
                        d.rank + 1,
                        theirs.map(|m| format!(" (llama.cpp's own top-two margin there: {m:.4})")).unwrap_or_default()
                    );
                    let tie = d.rank == 1 && d.gap < case.tie_margin;
                    if tie
                        && (d.token >= MIN_DIVERGENCE
                            || theirs.is_some_and(|m| m < case.tie_margin))
                    {
                        verdict = verdict.or(Ok(false));
                    } else if let Err(why) = &mut verdict {
                        why.push_str(&format!(
                            "\n  leaves the {source} text at token {}: llama.cpp's token is our number {} by {:.4}",
                            d.token,
                            d.rank + 1,
                            d.gap
                        ));
                    }
                }
            }
        }
        match verdict {
            Ok(true) => exact += 1,
            Ok(false) => {}
            Err(why) => panic!(
                "{}: {prompt:?} diverges from llama.cpp at no tie:{why}",
                case.name
            ),
        }
    }
    // gemma3 passes ties narrower than 0.002 in llama.cpp itself; two exact of five is what
    // stays true whichever way such ties fall.
    assert!(
        exact >= 2,
        "{}: only {exact} of 5 continuations match llama.cpp exactly",
        case.name
    );
}

/// Teacher-forced: along llama.cpp's own greedy tokens (llama-server here), every token it took
/// is our top one or within the tie margin of it, and our log-probabilities of its top two
/// stay close to its own. Unlike free-running greedy, this checks every one of the 240 steps.
fn logits_follow_llama_cpp(case: &Case) {
    let Some(model) = load(case) else { return };
    let tok = &model.tokenizer;
    let vocab = model.config.vocab_size;
    let (mut not_top, mut worst_gap, mut sum_dlp, mut num_lp) = (0, 0.0f32, 0.0f64, 0);
    for h in here(case) {
        let prompt = h["prompt"].as_str().unwrap();
        let mut input = tok.encode(prompt, tok.add_bos_default(), true).unwrap();
        let np = input.len();
        let theirs = ids(&h["server_ids"]);
        input.extend_from_slice(&theirs);
        let mut runner = SequenceRunner::new(&model, input.len(), 16);
        let logits = runner.eval(&input, true).unwrap();
        for (k, &t) in theirs.iter().enumerate() {
            let row = &logits[(np - 1 + k) * vocab..(np + k) * vocab];
            let gap = row[argmax(row) as usize] - row[t as usize];
            if gap > 0.0 {
                not_top += 1;
                eprintln!(
                    "{}: {prompt:?} step {k}: llama.cpp's {t} {:?} is {gap:.4} below our top (its own margin {:.4})",
                    case.name,
                    tok.decode(&[t]),
                    their_margin(&h, k)
                );
            }
            worst_gap = worst_gap.max(gap);
            assert!(
                gap < case.tie_margin,
                "{}: {prompt:?} step {k}: llama.cpp's token {t} is {gap} below our top",
                case.name
            );
            for e in h["server_top2"][k].as_array().unwrap() {
                let ours =
                    edge_llm::engine::sampler::log_softmax_at(row, e[0].as_u64().unwrap() as usize);
                sum_dlp += (ours - e[1].as_f64().unwrap()).abs();
                num_lp += 1;
            }
        }
    }
    let mean_dlp = sum_dlp / num_lp as f64;
    eprintln!(
        "{}: llama.cpp's token is not our top at {not_top} of 240 steps (worst gap {worst_gap:.4}); mean |log-prob difference| of its top two {mean_dlp:.4}",
        case.name
    );
    // Measured: qwen2 0.035, gemma3 0.07; llama.cpp's own flash-attention switch moves these
    // log-probabilities by 0.040 and 0.073 on average.
    assert!(
        mean_dlp < 0.15,
        "{}: mean |log-prob difference| {mean_dlp}",
        case.name
    );
}

fn perplexity_matches_llama_cpp(case: &Case) {
    let Some(model) = load(case) else { return };
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3")
        .expect("GPL-3 text (Debian base-files)");
    let mut seen = Vec::new();
    edge_llm::scoring::perplexity::perplexity(
        &model,
        &text,
        512,
        Some(case.ppl_running.len()),
        |s| seen.push(s.ppl()),
    )
    .unwrap();
    assert_eq!(seen.len(), case.ppl_running.len());
    for (i, (&got, &want)) in seen.iter().zip(&case.ppl_running).enumerate() {
        let rel = (got - want).abs() / want;
        eprintln!(
            "{}: chunk {}: PPL {got:.4} vs llama.cpp {want:.4} ({:.2}% off)",
            case.name,
            i + 1,
            rel * 100.0
        );
        assert!(
            rel < 0.01,
            "{}: chunk {}: PPL {got:.4} vs llama.cpp {want:.4}",
            case.name,
            i + 1
        );
    }
}

fn text_tokens(model: &Model) -> Vec<u32> {
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3")
        .expect("GPL-3 text (Debian base-files)");
    model
        .tokenizer
        .encode(&text, model.tokenizer.add_bos_default(), false)
        .unwrap()
}

/// Greedy tokens after `prompt`, one sequence straight through the paged KV cache.
fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut runner = SequenceRunner::new(model, prompt.len() + n, 16);
    let mut logits = runner.eval(prompt, false).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(argmax(&logits));
        logits = runner.eval(&out[out.len() - 1..], false).unwrap();
    }
    out
}

#[test]
fn qwen2_greedy_matches_llama_cpp() {
    greedy_matches_llama_cpp(&QWEN2);
}

#[test]
fn gemma3_greedy_matches_llama_cpp() {
    greedy_matches_llama_cpp(&GEMMA3);
}

#[test]
fn qwen2_logits_follow_llama_cpp() {
    logits_follow_llama_cpp(&QWEN2);
}

#[test]
fn gemma3_logits_follow_llama_cpp() {
    logits_follow_llama_cpp(&GEMMA3);
}

#[test]
fn qwen2_perplexity_within_one_percent_of_llama_cpp() {
    perplexity_matches_llama_cpp(&QWEN2);
}

#[test]
fn gemma3_perplexity_within_one_percent_of_llama_cpp() {
    perplexity_matches_llama_cpp(&GEMMA3);
}

#[test]
fn gemma3_sliding_window_perplexity_at_context_1024() {
    let Some(model) = load(&GEMMA3) else { return };
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3")
        .expect("GPL-3 text (Debian base-files)");
    let stats =
        edge_llm::scoring::perplexity::perplexity(&model, &text, 1024, Some(1), |_| {}).unwrap();
    let rel = (stats.ppl() - GEMMA3_PPL_CTX_1024).abs() / GEMMA3_PPL_CTX_1024;
    eprintln!(
        "gemma3: ctx 1024, chunk 1: PPL {:.4} vs llama.cpp {GEMMA3_PPL_CTX_1024} ({:.2}% off)",
        stats.ppl(),
        rel * 100.0
    );
    // 2%: llama.cpp's own flash-attention switch moves this value by 0.24%, and gemma3's
    // chunk values move by about 1% with any f16 rounding; a wrong window moves it 15-fold.
    assert!(
        rel < 0.02,
        "gemma3: ctx 1024: PPL {:.4} vs llama.cpp {GEMMA3_PPL_CTX_1024}",
        stats.ppl()
    );
}

/// A prompt sharing 608 tokens with one run before (past the 512-token window of gemma3's
/// local layers) takes them from the engine's prefix cache and generates what a fresh run does.
#[test]
fn gemma3_prefix_cache_past_the_window() {
    let Some(model) = load(&GEMMA3) else { return };
    let model = Arc::new(model);
    let tok = &model.tokenizer;
    let prefix = &text_tokens(&model)[..608];
    let prompt = |suffix: &str| [prefix, &tok.encode(suffix, false, false).unwrap()].concat();
    let (first, second) = (
        prompt("\nQuestion: what is this text?\nAnswer:"),
        prompt("\nIn short, this license"),
    );
    let expected = greedy(&model, &second, 8);

    let config = EngineConfig {
        block_size: 16,
        num_blocks: 96,
        max_seq_len: 1024,
        max_batched_tokens: 512,
        max_seqs: 4,
        max_queue: 4,
        max_step_ms: None,
        mask_budget_ms: EngineConfig::DEFAULT_MASK_BUDGET_MS,
        kv_types: edge_llm::kernels::KvTypes::F16,
        num_state_slots: 0,
    };
    let engine = EngineHandle::start(model.clone(), config, EngineParts::default()).unwrap();
    let run = |p: &[u32]| {
        let mut stream = engine
            .submit(Request::new(p.to_vec(), SamplingParams::greedy(), 8))
            .unwrap();
        let mut tokens = Vec::new();
        while let Some(e) = stream.next_blocking() {
            match e {
                Event::Token { token, .. } => tokens.push(token),
                Event::Finished { usage, .. } => return (tokens, usage.cached_tokens),
                Event::Error(e) => panic!("engine error: {e}"),
                Event::Prompt { .. } | Event::Embedding { .. } => {}
            }
        }
        panic!("stream ended without finishing")
    };
    run(&first);
    let (tokens, cached) = run(&second);
    assert_eq!(cached, 608, "the shared prefix comes from the cache");
    assert_eq!(
        tokens,
        expected,
        "cached prefix past the window: {:?} vs {:?}",
        tok.decode(&tokens),
        tok.decode(&expected)
    );
}

/// qwen2's GGUF carries its own template (ChatML with Qwen's default system prompt); it renders
/// through the same Jinja path as the default model's, and its turn markers are single tokens.
#[test]
fn qwen2_chat_template_renders() {
    let Some(model) = load(&QWEN2) else { return };
    let t = ChatTemplate::from_gguf(&model.file, &model.tokenizer).unwrap();
    let text = t.render(&[ChatMessage::new("user", "Hi")], true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = t
        .encode(&model.tokenizer, &[ChatMessage::new("user", "Hi")], true)
        .unwrap();
    let im_start = model.tokenizer.find_token("<|im_start|>").unwrap();
    let im_end = model.tokenizer.find_token("<|im_end|>").unwrap();
    assert_eq!(ids.iter().filter(|&&id| id == im_start).count(), 3);
    assert_eq!(ids.iter().filter(|&&id| id == im_end).count(), 2);
    assert!(model.tokenizer.is_eog(im_end), "<|im_end|> ends a reply");
}

/// gemma3's GGUF has no template: the built-in Gemma one is chosen from its vocabulary's
/// `<start_of_turn>`, folds a system message into the first user turn, starts with one BOS,
/// and `<end_of_turn>` ends a reply.
#[test]
fn gemma3_builtin_chat_template_renders() {
    let Some(model) = load(&GEMMA3) else { return };
    let t = ChatTemplate::from_gguf(&model.file, &model.tokenizer).unwrap();
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi "),
        ChatMessage::new("assistant", "Hello!"),
        ChatMessage::new("user", "Name a colour."),
    ];
    let text = t.render(&messages, true).unwrap();
    assert_eq!(
        text,
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n\
         <start_of_turn>user\nName a colour.<end_of_turn>\n<start_of_turn>model\n"
    );
    let ids = t.encode(&model.tokenizer, &messages, true).unwrap();
    let bos = model.tokenizer.bos_id().unwrap();
    assert_eq!(ids[0], bos);
    assert_eq!(
        ids.iter().filter(|&&id| id == bos).count(),
        1,
        "BOS is not doubled"
    );
    let sot = model.tokenizer.find_token("<start_of_turn>").unwrap();
    let eot = model.tokenizer.find_token("<end_of_turn>").unwrap();
    assert_eq!(ids.iter().filter(|&&id| id == sot).count(), 4);
    assert!(model.tokenizer.is_eog(eot), "<end_of_turn> ends a reply");
    let err = t
        .render(&[ChatMessage::new("assistant", "first")], true)
        .unwrap_err();
    assert!(format!("{err:#}").contains("must alternate"), "{err:#}");
}
