//! The CPU backend on the real default model (Q4_1): the interleaved copies of its matrices are
//! made when the weights are loaded, not by the first step, and shared by every CPU executor of
//! the model; a batch whose indices point outside the vocabulary, the KV pool or itself is an
//! error from the forward pass (validated once, before any kernel runs), never a panic.

mod support;

use std::sync::Arc;

use edge_llm::device::Executor;
use edge_llm::model::kv_cache::BlockId;
use edge_llm::model::weights::FeedForward;
use edge_llm::model::Batch;

/// One sequence of `tokens` at positions 0.. in blocks 0.. of 16 tokens, last row's logits.
fn batch(tokens: &[u32]) -> Batch {
    let mut b = Batch {
        max_blocks_per_seq: tokens.len().div_ceil(16),
        ..Default::default()
    };
    let table: Vec<BlockId> = (0..b.max_blocks_per_seq as u32).map(BlockId).collect();
    let seq = b.push_block_table(&table);
    for (p, &t) in tokens.iter().enumerate() {
        b.push_token(t, p, p, seq, p + 1 == tokens.len());
    }
    b
}

#[test]
fn interleaved_copies_are_made_at_load_and_shared() {
    let model = support::model();
    let w = model.cpu_weights();
    // SmolLM2's Q4_1 matrices all have a multiple of 8 rows; its embedding is tied, so it is
    // multiplied by too.
    let interleaved = |m: &edge_llm::model::cpu::CpuMatrix| m.is_interleaved();
    for (l, lw) in w.layers.iter().enumerate() {
        let FeedForward::Dense(mlp) = &lw.ffn else {
            panic!("layer {l}: SmolLM2 has a dense feed-forward block");
        };
        let a = lw.attention().expect("SmolLM2's layers all attend");
        for m in [
            &a.wq.weight,
            &a.wk.weight,
            &a.wv.weight,
            &a.wo.weight,
            &mlp.gate,
            &mlp.up,
            &mlp.down,
        ] {
            assert!(interleaved(m), "layer {l}: a matrix without its copy");
        }
    }
    assert!(w.output.is_none(), "tied output");
    assert!(interleaved(&w.token_embd));
    let exec = Executor::cpu(model, 16, 4);
    match &exec {
        Executor::Cpu(loaded) => assert!(Arc::ptr_eq(&loaded.weights, &w), "one copy per model"),
        #[allow(unreachable_patterns)]
        _ => panic!("a CPU executor"),
    }
}

#[test]
fn bad_batches_are_errors_before_any_kernel_runs() {
    let model = support::model();
    let mut exec = Executor::cpu(model, 16, 4);
    let good = batch(&[1, 2, 3]);
    let want = exec.forward(model, &good).expect("a good batch runs");
    assert_eq!(want.len(), model.config.vocab_size);

    type Spoil = Box<dyn Fn(&mut Batch)>;
    let cases: Vec<(&str, Spoil, &str)> = vec![
        (
            "token",
            Box::new(|b| b.tokens[1] = 1 << 30),
            "outside the vocabulary",
        ),
        (
            "slot",
            Box::new(|b| b.slot_mapping[2] = 64),
            "outside the pool",
        ),
        ("block", Box::new(|b| b.block_tables[0] = 4), "block id"),
        ("context", Box::new(|b| b.positions[2] = 16), "out of range"),
        (
            "sequence row",
            Box::new(|b| b.token_seq[0] = 1),
            "out of range",
        ),
        (
            "logits row",
            Box::new(|b| b.logits_rows[0] = 3),
            "logits row",
        ),
        (
            "lengths",
            Box::new(|b| {
                b.positions.pop();
            }),
            "different lengths",
        ),
    ];
    for (what, spoil, says) in cases {
        let mut b = good.clone();
        spoil(&mut b);
        let err = exec.forward(model, &b).expect_err(what).to_string();
        assert!(err.contains(says), "{what}: {err}");
    }
    // Nothing was written by the bad batches: the good one gives the same logits again.
    assert_eq!(exec.forward(model, &good).unwrap(), want);
}
