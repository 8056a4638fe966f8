//! Greedy continuations of the real default model against llama.cpp's, token for token, and
//! the paged KV path: the same output whatever the block size and however the prompt is
//! chunked into steps.

mod support;

use edge_llm::generate::{generate, FinishReason, GenerateOptions, SequenceRunner};
use edge_llm::sampler::SamplingParams;

fn greedy(block_size: usize, batch_tokens: usize, prompt: &[u32], n: usize) -> Vec<u32> {
    let model = support::model();
    let mut runner = SequenceRunner::new(model, 256, block_size);
    runner.batch_tokens = batch_tokens;
    let opts = GenerateOptions { n_predict: n, ignore_eos: false, sampling: SamplingParams::greedy() };
    let mut out = Vec::new();
    let reason = generate(&mut runner, prompt, &opts, |t| {
        out.push(t);
        true
    })
    .expect("generation runs");
    assert_eq!(reason, FinishReason::Length);
    runner.reset();
    assert_eq!(runner.num_free_blocks(), 256usize.div_ceil(block_size), "every block comes back");
    out
}

/// Largest gap between the top two logits (about 2% of their size) at which a divergence from
/// llama.cpp is accepted as a numerical tie. llama.cpp's own output on this model changes with
/// the machine's SIMD path: built for AVX2 on this machine it leaves the reference texts of
/// "Once upon a time..." and "def fibonacci(n):" earlier than edge-llm does (the reference was
/// made on an AVX-512 machine), and its perplexity differs from the reference by 1.4% at chunk 1.
const TIE_MARGIN: f32 = 0.25;

/// Logits after `prompt` followed by `prefix`.
fn logits_after(prompt: &[u32], prefix: &[u32]) -> Vec<f32> {
    let mut runner = SequenceRunner::new(support::model(), 256, 16);
    let mut all = prompt.to_vec();
    all.extend_from_slice(prefix);
    runner.eval(&all, false).unwrap()
}

#[test]
fn greedy_matches_llama_cpp() {
    let model = support::model();
    let reference = support::reference();
    let mut exact = 0;
    for case in reference["greedy"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let prompt_ids = model.tokenizer.encode(prompt, false, true).unwrap();
        assert_eq!(prompt_ids, support::ids(&case["prompt_ids"]), "prompt ids of {prompt:?}");
        let expected = support::ids(&case["ids"]);
        let got = greedy(16, 512, &prompt_ids, expected.len());
        match got.iter().zip(&expected).position(|(a, b)| a != b) {
            None => {
                assert_eq!(model.tokenizer.decode(&got), case["text"].as_str().unwrap(), "text of {prompt:?}");
                exact += 1;
            }
            Some(first) => {
                // Accept only a late divergence at a near-tie: llama.cpp's token is our runner-up
                // by less than TIE_MARGIN.
                let logits = logits_after(&prompt_ids, &expected[..first]);
                let (ours, theirs) = (logits[got[first] as usize], logits[expected[first] as usize]);
                let better = logits.iter().filter(|&&l| l > theirs).count();
                eprintln!(
                    "{prompt:?}: diverges at token {first}: ours {} ({ours:.4}) vs llama.cpp {} ({theirs:.4}), gap {:.4}",
                    got[first],
                    expected[first],
                    ours - theirs
                );
                assert!(first >= 20, "{prompt:?}: diverges from llama.cpp at token {first}");
                assert!(better == 1 && ours - theirs < TIE_MARGIN, "{prompt:?}: token {first} is no tie: gap {}", ours - theirs);
            }
        }
    }
    assert!(exact >= 3, "only {exact} of 5 continuations match llama.cpp exactly");
}

#[test]
fn paged_kv_is_independent_of_block_size_and_chunking() {
    let model = support::model();
    let prompt = model.tokenizer.encode("Once upon a time, there was a little", false, true).unwrap();
    let baseline = greedy(16, 512, &prompt, 24);
    // Blocks of 3 tokens: the 9-token prompt spans 3 blocks and generation walks 8 more.
    assert_eq!(greedy(3, 512, &prompt, 24), baseline, "block size 3");
    // Prompt fed 2 tokens per step: attention reads earlier chunks from the cache.
    assert_eq!(greedy(3, 2, &prompt, 24), baseline, "chunked prefill");
    assert_eq!(greedy(1, 1, &prompt, 24), baseline, "one token per block and per step");
}
