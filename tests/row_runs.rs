//! The row operations split over the kernels' pool (`kernels::rows`): RMSNorm (alone and after
//! the residual add), RoPE (plain and YaRN), the gated activations and the element-wise adds give, for every batch of 1 to 70 rows,
//! exactly the bits of the same call on one thread (`kernels::serial`), on every ISA. The
//! buffers are filled so that a row skipped (NaN or the unchanged input left behind) or done
//! twice (rotated, normed or added a second time) shows up as a difference. And the default
//! model's logits of a 70-token prompt, every row, equal one thread's; steps reusing the CPU
//! backend's buffers (longer, then shorter) give the same logits as a fresh backend.

mod support;

use edge_llm::device::Executor;
use edge_llm::kernels::{
    add_rms_norm, available_isas, glu_inplace, init_threads, num_threads, rms_norm,
    rms_norm_inplace, rope, rows, serial, set_isa, Activation, Rope, RopeStyle, Yarn,
};
use edge_llm::model::kv_cache::BlockId;
use edge_llm::model::Batch;
use support::isa_lock::lock_isa;
use support::splitmix::Rng;

/// The pool with several threads (4 unless something started it before): the runs are spread.
fn threaded_pool() {
    let _ = init_threads(4);
    assert!(
        num_threads() > 1,
        "the pool runs one thread: nothing would be split"
    );
}

/// Deterministic values in about [-2, 2), never zero.
fn data(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..n)
        .map(|_| ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0 + 1e-3)
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `op` on a copy of `x`, pooled and on one thread: the same bits, for every ISA, and the
/// operation changed every row (so a skipped row cannot pass as done).
fn same_as_one_thread(what: &str, x: &[f32], row_len: usize, op: &dyn Fn(&mut Vec<f32>)) {
    let _guard = lock_isa();
    for isa in available_isas() {
        set_isa(isa).expect("available ISA");
        let mut pooled = x.to_vec();
        op(&mut pooled);
        let mut alone = x.to_vec();
        serial(|| op(&mut alone));
        if let Some(i) = (0..x.len()).find(|&i| pooled[i].to_bits() != alone[i].to_bits()) {
            panic!(
                "{isa} {what}, {} rows: element {i} (row {}) is {}, one thread's {}",
                x.len() / row_len,
                i / row_len,
                pooled[i],
                alone[i]
            );
        }
        for (r, (a, b)) in alone.chunks(row_len).zip(x.chunks(row_len)).enumerate() {
            assert_ne!(bits(a), bits(b), "{isa} {what}: row {r} unchanged");
        }
    }
}

/// Row lengths large enough that batches from a few rows on are split (rows::PAR_MIN_ELEMENTS).
const WIDTH: usize = 1152;

#[test]
fn rms_norm_runs_equal_one_thread() {
    threaded_pool();
    let w = data(1, WIDTH);
    for n_rows in 1..=70 {
        let x = data(n_rows as u64, n_rows * WIDTH);
        same_as_one_thread("rms_norm_inplace", &x, WIDTH, &|y| {
            rms_norm_inplace(y, &w, 1e-5)
        });
        // The residual add and the norm in one pass: the sum (in place) and the normed rows.
        let y = data(500 + n_rows as u64, x.len());
        same_as_one_thread("add_rms_norm (sum)", &x, WIDTH, &|v| {
            let mut out = vec![f32::NAN; v.len()];
            add_rms_norm(v, &y, &w, 1e-5, &mut out);
        });
        same_as_one_thread("add_rms_norm (norm)", &x, WIDTH, &|v| {
            let mut out = vec![f32::NAN; v.len()];
            add_rms_norm(v, &y, &w, 1e-5, &mut out);
            *v = out;
        });
        // ... and equals the add, then the norm.
        let (mut sum, mut fused) = (x.clone(), vec![f32::NAN; x.len()]);
        add_rms_norm(&mut sum, &y, &w, 1e-5, &mut fused);
        let mut apart = x.clone();
        rows::add_inplace(&mut apart, &y);
        let mut normed = vec![0.0; x.len()];
        rms_norm(&apart, &w, &mut normed, 1e-5);
        assert_eq!(
            bits(&sum),
            bits(&apart),
            "add_rms_norm's sum, {n_rows} rows"
        );
        assert_eq!(
            bits(&fused),
            bits(&normed),
            "add_rms_norm's norm, {n_rows} rows"
        );
        // Into another buffer, filled with NaN: a skipped row stays NaN.
        same_as_one_thread("rms_norm", &x, WIDTH, &|y| {
            let mut out = vec![f32::NAN; y.len()];
            rms_norm(y, &w, &mut out, 1e-5);
            *y = out;
        });
    }
}

#[test]
fn glu_runs_equal_one_thread() {
    threaded_pool();
    for act in [Activation::SwiGlu, Activation::GeGlu] {
        for n_rows in 1..=70 {
            // 1,539 per row: runs start on whole vectors even when rows do not.
            let n = n_rows * 1539;
            let (gate, up) = (data(n_rows as u64, n), data(1000 + n_rows as u64, n));
            same_as_one_thread(&format!("{act:?}"), &gate, 1539, &|g| {
                glu_inplace(g, &up, act)
            });
        }
    }
}

#[test]
fn rope_runs_equal_one_thread() {
    threaded_pool();
    let yarn = Yarn::new(64, 4096, 10000.0, 0.25);
    for style in [RopeStyle::Normal, RopeStyle::Neox] {
        for yarn in [None, Some(yarn)] {
            let r = Rope {
                head_dim: 64,
                rope_dim: 64,
                freq_base: 10000.0,
                freq_scale: if yarn.is_some() { 0.25 } else { 1.0 },
                style,
                freq_factors: None,
                yarn,
            };
            let n_heads = 9;
            for n_rows in 1..=70 {
                let pos: Vec<i32> = (0..n_rows as i32).map(|p| 3 * p + 1).collect();
                let x = data(n_rows as u64, n_rows * n_heads * 64);
                same_as_one_thread(
                    &format!("rope {style:?} yarn {}", yarn.is_some()),
                    &x,
                    n_heads * 64,
                    &|y| rope(y, &pos, n_heads, &r),
                );
            }
        }
    }
}

#[test]
fn element_wise_runs_equal_one_thread() {
    threaded_pool();
    for n_rows in 1..=70 {
        let x = data(n_rows as u64, n_rows * WIDTH);
        let y = data(7 + n_rows as u64, x.len());
        let bias = data(3, WIDTH);
        same_as_one_thread("add", &x, WIDTH, &|v| rows::add_inplace(v, &y));
        same_as_one_thread("add_bias", &x, WIDTH, &|v| rows::add_bias(v, &bias));
        same_as_one_thread("scale", &x, WIDTH, &|v| rows::scale(v, 1.37));
    }
}

/// One sequence of `tokens` at positions 0.. in blocks 0.. of 16 tokens, logits for every row.
fn batch(tokens: &[u32]) -> Batch {
    let mut b = Batch {
        max_blocks_per_seq: tokens.len().div_ceil(16),
        ..Default::default()
    };
    let table: Vec<BlockId> = (0..b.max_blocks_per_seq as u32).map(BlockId).collect();
    let seq = b.push_block_table(&table);
    for (p, &t) in tokens.iter().enumerate() {
        b.push_token(t, p, p, seq, true);
    }
    b
}

#[test]
fn model_prefill_rows_equal_one_thread_and_reused_buffers_equal_fresh_ones() {
    threaded_pool();
    let model = support::model();
    let vocab = model.config.vocab_size;
    let tokens: Vec<u32> = (0..70u32).map(|i| 1 + (i * 7919) % 4000).collect();
    let long = batch(&tokens);
    let mut exec = Executor::cpu(model, 16, 8);
    let pooled = exec.forward(model, &long).expect("forward");
    assert_eq!(pooled.len(), 70 * vocab);
    // The same step on one thread (it rewrites the same KV slots with the same values).
    let alone = serial(|| exec.forward(model, &long)).expect("forward");
    if let Some(i) = (0..pooled.len()).find(|&i| pooled[i].to_bits() != alone[i].to_bits()) {
        panic!(
            "row {} of 70: logit {} differs from one thread's",
            i / vocab,
            i % vocab
        );
    }
    // A shorter step on the reused (longer) buffers equals the same step on a fresh backend,
    // and the first rows of the long one (a prefix sees only itself).
    let short = batch(&tokens[..5]);
    let reused = exec.forward(model, &short).expect("forward");
    let fresh = Executor::cpu(model, 16, 8)
        .forward(model, &short)
        .expect("forward");
    assert_eq!(bits(&reused), bits(&fresh), "reused buffers change a step");
    assert_eq!(bits(&reused), bits(&pooled[..5 * vocab]), "a prefix's rows");
}
