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

#[test]
fn greedy_matches_llama_cpp() {
    let model = support::model();
    let reference = support::reference();
    let mut failures = Vec::new();
    for case in reference["greedy"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let prompt_ids = model.tokenizer.encode(prompt, false, true).unwrap();
        assert_eq!(prompt_ids, support::ids(&case["prompt_ids"]), "prompt ids of {prompt:?}");
        let expected = support::ids(&case["ids"]);
        let got = greedy(16, 512, &prompt_ids, expected.len());
        if got != expected {
            let first = got.iter().zip(&expected).position(|(a, b)| a != b).unwrap();
            failures.push(format!("{prompt:?}: first difference at token {first}: got {} expected {}", got[first], expected[first]));
        } else {
            assert_eq!(model.tokenizer.decode(&got), case["text"].as_str().unwrap(), "text of {prompt:?}");
        }
    }
    assert!(failures.is_empty(), "greedy mismatches:\n{}", failures.join("\n"));
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
