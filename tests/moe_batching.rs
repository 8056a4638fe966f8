//! Batch invariance of the mixture-of-experts path, on the synthetic qwen3moe model
//! (`target/synth-venv/bin/python scripts/synth/synth.py models target/synth` writes it): a
//! sequence's logits are the same, bit for bit, alone and in a step with other sequences (whose
//! rows choose other experts, so every expert's group of rows differs), in prefill and in
//! decode, on the CPU backend and the emulated CUDA one; and 16 concurrent greedy sessions give
//! what each gives alone, with every KV block back after. Also `edge-llm info`'s count of the
//! parameters a token uses.

mod support;

use std::path::PathBuf;
use std::sync::Arc;

use edge_llm::device::Executor;
use edge_llm::engine::{EngineConfig, EngineHandle, EngineParts};
use edge_llm::model::kv_cache::BlockId;
use edge_llm::model::{Batch, Model};
use support::{assert_greedy_among_sessions, collect, request, root, skip_or_fail, wait_idle};

const BLOCK: usize = 16;

fn model() -> Option<Model> {
    let dir = std::env::var_os("EDGE_LLM_SYNTH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/synth"));
    let path = dir.join("qwen3moe.gguf");
    if !path.is_file() {
        skip_or_fail(&format!(
            "{} not made (target/synth-venv/bin/python scripts/synth/synth.py models target/synth)",
            path.display()
        ));
        return None;
    }
    Some(Model::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display())))
}

/// Sequence `i`'s tokens: ordinary text ids, a different run for each sequence.
fn tokens(i: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|p| 200 + (i * 7919 + p * 104_729) % 30_000)
        .collect()
}

/// A sequence of a step: its blocks, its tokens at `positions`, logits wanted for its last two
/// (the earlier rows reach them through the KV cache; the emulated GPU is slow at the output
/// product of a 151,936-token vocabulary).
struct Part<'a> {
    blocks: &'a [BlockId],
    tokens: &'a [u32],
    positions: std::ops::Range<usize>,
}

fn batch(parts: &[Part]) -> Batch {
    let mut b = Batch::with_max_blocks(4);
    for p in parts {
        let first = p.positions.start.max(p.positions.end.saturating_sub(2));
        b.push_sequence(
            p.blocks,
            BLOCK,
            p.positions.clone(),
            |pos| p.tokens[pos],
            first,
        );
    }
    b
}

fn blocks(first: u32) -> Vec<BlockId> {
    (first..first + 4).map(BlockId).collect()
}

/// Sequence 0 alone and between two others, prefill of 40 tokens then one decode step, on
/// `make`'s backend: its logits must not change by a bit.
fn check_invariance(model: &Model, make: &dyn Fn() -> Executor, what: &str) {
    let vocab = model.config.vocab_size;
    let (a, b, c) = (tokens(0, 41), tokens(1, 41), tokens(2, 41));
    let (ba, bb, bc) = (blocks(0), blocks(4), blocks(8));
    let part = |blocks, tokens, positions| Part {
        blocks,
        tokens,
        positions,
    };

    let mut alone = make();
    let prefill = alone
        .forward(model, &batch(&[part(&ba, &a, 0..40)]))
        .unwrap();
    let decode = alone
        .forward(model, &batch(&[part(&ba, &a, 40..41)]))
        .unwrap();

    let mut together = make();
    let three = [
        part(&bb, &b, 0..40),
        part(&ba, &a, 0..40),
        part(&bc, &c, 0..40),
    ];
    let logits = together.forward(model, &batch(&three)).unwrap();
    let mine = &logits[2 * vocab..4 * vocab];
    assert_eq!((prefill.len(), logits.len()), (2 * vocab, 6 * vocab));
    assert!(
        mine.iter()
            .zip(&prefill)
            .all(|(x, y)| x.to_bits() == y.to_bits()),
        "{what}: a prefill's logits changed with the other sequences in its step"
    );
    // Decode: the other two prefill further in the same step.
    let mixed = [
        part(&bc, &c, 40..41),
        part(&ba, &a, 40..41),
        part(&bb, &b, 40..41),
    ];
    let logits = together.forward(model, &batch(&mixed)).unwrap();
    assert_eq!((decode.len(), logits.len()), (vocab, 3 * vocab));
    assert!(
        logits[vocab..2 * vocab]
            .iter()
            .zip(&decode)
            .all(|(x, y)| x.to_bits() == y.to_bits()),
        "{what}: a decode step's logits changed with the other sequences in its step"
    );
}

#[test]
fn a_sequences_logits_do_not_depend_on_the_rest_of_the_step() {
    let Some(model) = model() else { return };
    check_invariance(&model, &|| Executor::cpu(&model, BLOCK, 12), "CPU");
}

#[cfg(feature = "cuda")]
#[test]
fn a_sequences_logits_do_not_depend_on_the_rest_of_the_step_on_emulated_cuda() {
    use edge_llm::cuda::Emu;
    let Some(model) = model() else { return };
    let make = || Executor::cuda_emulated(&model, Emu::new(), BLOCK, 12).unwrap();
    check_invariance(&model, &make, "emulated CUDA");
}

#[test]
fn sixteen_greedy_sessions_give_what_each_gives_alone() {
    let Some(model) = model() else { return };
    let config = EngineConfig {
        block_size: BLOCK,
        num_blocks: 64,
        max_seq_len: 128,
        max_batched_tokens: 256,
        max_seqs: 16,
        max_queue: 16,
        max_step_ms: None,
        mask_budget_ms: EngineConfig::DEFAULT_MASK_BUDGET_MS,
        kv_types: edge_llm::kernels::KvTypes::F16,
        num_state_slots: 0,
    };
    let e = EngineHandle::start(Arc::new(model), config, EngineParts::default()).unwrap();
    // Four prompts sharing a 20-token prefix, each then its own.
    let prompts: Vec<(Vec<u32>, usize)> = (0..4)
        .map(|i| {
            let mut p = tokens(9, 20);
            p.extend(tokens(i, 6 + i as usize));
            (p, 8)
        })
        .collect();
    let greedy = edge_llm::engine::sampler::SamplingParams::greedy;
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|(p, n)| collect(&mut e.submit(request(p, *n, greedy())).unwrap()).0)
        .collect();
    assert_greedy_among_sessions(&e, &prompts, &alone, 16, "batching with other sessions");
    let m = wait_idle(&e);
    assert_eq!(m.blocks_used, 0, "every KV block back");
}

#[test]
fn info_counts_the_parameters_a_token_uses() {
    let Some(model) = model() else { return };
    let f = &model.file;
    // 3 layers of 3 stacked [8][128][256] expert tensors, 2 of the 8 used.
    let experts: u64 = 3 * 3 * 8 * 128 * 256;
    let total = f.num_parameters();
    assert_eq!(f.experts_used(), Some((2, 8, total - experts / 8 * 6)));
    let mut out = Vec::new();
    f.write_info(&mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("parameters: 41.85 M total, 40.08 M active per token (2 of 8 experts)"),
        "{text}"
    );
}
