//! The kernels gpt-oss adds (csrc/ops.c, ops_avx2.c): paged attention with attention sinks and
//! the clamped SwiGLU, on random data, on every instruction set this machine has.
//! - Attention with sinks: every ISA bit-identical to the scalar reference; the reference within
//!   1e-5 of f64 softmax attention whose softmax has one more logit per head (the sink) with a
//!   zero value row, for sinks below, among and far above the scores; sinks of -inf give the
//!   output without sinks bit for bit.
//! - `swiglu_oai` against its definition in f64 (ggml's `swiglu_oai`: min(x, 7) sigmoid(1.702
//!   min(x, 7)) (clamp(y, -7, 7) + 1)), on values inside and past the limits.

mod support;

use edge_llm::kernels::{
    available_isas, glu_inplace, paged_attention_sinks, set_isa, Activation, AttentionBatch,
    AttentionShape, Isa, KvTypes,
};

use support::isa_lock::lock_isa;
use support::splitmix::Rng;

fn on<R>(isa: Isa, f: impl FnOnce() -> R) -> R {
    set_isa(isa).expect("available ISA");
    f()
}

fn f16_bits(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

/// Two sequences over shuffled blocks, four tokens each at random context lengths.
struct Case {
    shape: AttentionShape,
    k: Vec<u16>,
    v: Vec<u16>,
    q: Vec<f32>,
    tables: Vec<i32>,
    max_blocks: usize,
    token_seq: Vec<i32>,
    context_lens: Vec<i32>,
}

fn case(rng: &mut Rng, n_heads: usize, n_kv_heads: usize, head_dim: usize) -> Case {
    let (block_size, max_blocks, n_seqs) = (16, 5, 2);
    let num_blocks = n_seqs * max_blocks;
    let mut tables: Vec<i32> = (0..num_blocks as i32).collect();
    for i in (1..tables.len()).rev() {
        tables.swap(i, rng.below(i + 1));
    }
    let len = num_blocks * block_size * n_kv_heads * head_dim;
    let k = (0..len).map(|_| f16_bits(rng.normal() * 1.5)).collect();
    let v = (0..len).map(|_| f16_bits(rng.normal())).collect();
    let (mut token_seq, mut context_lens) = (Vec::new(), Vec::new());
    for s in 0..n_seqs {
        for _ in 0..4 {
            token_seq.push(s as i32);
            context_lens.push(1 + rng.below(max_blocks * block_size) as i32);
        }
    }
    let q = (0..token_seq.len() * n_heads * head_dim)
        .map(|_| rng.normal())
        .collect();
    Case {
        shape: AttentionShape {
            n_heads,
            n_kv_heads,
            head_dim,
            block_size,
            num_blocks,
        },
        k,
        v,
        q,
        tables,
        max_blocks,
        token_seq,
        context_lens,
    }
}

fn scale(c: &Case) -> f32 {
    1.0 / (c.shape.head_dim as f32).sqrt()
}

fn run(c: &Case, window: Option<usize>, sinks: Option<&[f32]>) -> Vec<f32> {
    let mut out = vec![f32::NAN; c.q.len()];
    let batch = AttentionBatch {
        block_tables: &c.tables,
        max_blocks_per_seq: c.max_blocks,
        token_seq: &c.token_seq,
        context_lens: &c.context_lens,
    };
    paged_attention_sinks(
        KvTypes::F16,
        &mut out,
        &c.q,
        &c.k,
        &c.v,
        &c.shape,
        &batch,
        scale(c),
        window,
        sinks,
    );
    out
}

/// f64 softmax attention with one more logit per head, `sinks[h]`, whose value row is zero.
fn naive(c: &Case, window: Option<usize>, sinks: &[f32]) -> Vec<f64> {
    let s = &c.shape;
    let (hd, kv_dim, group) = (
        s.head_dim,
        s.n_kv_heads * s.head_dim,
        s.n_heads / s.n_kv_heads,
    );
    let f = |bits: u16| half::f16::from_bits(bits).to_f64();
    let mut out = vec![0.0; c.q.len()];
    for (t, (&seq, &len)) in c.token_seq.iter().zip(&c.context_lens).enumerate() {
        let len = len as usize;
        let first = window.map_or(0, |w| len.saturating_sub(w));
        let table = &c.tables[seq as usize * c.max_blocks..];
        for h in 0..s.n_heads {
            let q = &c.q[(t * s.n_heads + h) * hd..][..hd];
            let at = |j: usize| {
                (table[j / s.block_size] as usize * s.block_size + j % s.block_size) * kv_dim
                    + (h / group) * hd
            };
            let scores: Vec<f64> = (first..len)
                .map(|j| {
                    (0..hd)
                        .map(|d| q[d] as f64 * f(c.k[at(j) + d]))
                        .sum::<f64>()
                        * scale(c) as f64
                })
                .collect();
            let sink = sinks[h] as f64;
            let max = scores.iter().cloned().fold(sink, f64::max);
            let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let total: f64 = weights.iter().sum::<f64>() + (sink - max).exp();
            let o = &mut out[(t * s.n_heads + h) * hd..][..hd];
            for (j, w) in (first..len).zip(&weights) {
                for d in 0..hd {
                    o[d] += w / total * f(c.v[at(j) + d]);
                }
            }
        }
    }
    out
}

/// Sinks for `n_heads` heads: below the scores, among them, and far above them in turn.
fn sinks(rng: &mut Rng, n_heads: usize) -> Vec<f32> {
    (0..n_heads)
        .map(|h| match h % 3 {
            0 => -5.0 + rng.normal(),
            1 => rng.normal() * 2.0,
            _ => 12.0 + rng.normal(),
        })
        .collect()
}

#[test]
fn attention_with_sinks_is_bit_identical_on_every_isa_and_matches_the_definition() {
    let _guard = lock_isa();
    let mut rng = Rng(64);
    for (n_heads, n_kv_heads, head_dim) in [(8, 2, 64), (9, 3, 64), (6, 1, 128), (3, 3, 6)] {
        let c = case(&mut rng, n_heads, n_kv_heads, head_dim);
        let s = sinks(&mut rng, n_heads);
        for window in [None, Some(7), Some(40)] {
            let want = on(Isa::Scalar, || run(&c, window, Some(&s)));
            let exact = naive(&c, window, &s);
            let worst = want
                .iter()
                .zip(&exact)
                .map(|(&g, &w)| (g as f64 - w).abs())
                .fold(0.0, f64::max);
            assert!(
                worst < 1e-5,
                "{n_heads}/{n_kv_heads} heads of {head_dim}, window {window:?}: error {worst:e}"
            );
            // The sink changed something: outputs without it differ.
            let plain = on(Isa::Scalar, || run(&c, window, None));
            assert_ne!(plain, want, "sinks had no effect");
            for isa in available_isas() {
                let got = on(isa, || run(&c, window, Some(&s)));
                let diff = got
                    .iter()
                    .zip(&want)
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                assert_eq!(
                    diff, None,
                    "{isa}: {n_heads}/{n_kv_heads} heads of {head_dim}, window {window:?}"
                );
            }
            eprintln!("{n_heads}/{n_kv_heads} heads of {head_dim}, window {window:?}: error {worst:.1e}, every ISA equal");
        }
    }
}

#[test]
fn sinks_of_minus_infinity_change_nothing() {
    let _guard = lock_isa();
    let mut rng = Rng(65);
    let c = case(&mut rng, 8, 2, 64);
    let none = vec![f32::NEG_INFINITY; 8];
    for isa in available_isas() {
        let plain = on(isa, || run(&c, Some(9), None));
        let with = on(isa, || run(&c, Some(9), Some(&none)));
        assert!(
            plain
                .iter()
                .zip(&with)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{isa}"
        );
    }
}

/// ggml's swiglu_oai in f64: min(x, 7) * sigmoid(1.702 min(x, 7)) * (clamp(y, -7, 7) + 1).
fn swiglu_oai(x: f32, y: f32) -> f64 {
    let x = (x as f64).min(7.0);
    let y = (y as f64).clamp(-7.0, 7.0);
    x / (1.0 + (-1.702 * x).exp()) * (y + 1.0)
}

#[test]
fn swiglu_oai_matches_its_definition() {
    let mut rng = Rng(66);
    let mut gate: Vec<f32> = (0..4096).map(|_| rng.normal() * 6.0).collect();
    let mut up: Vec<f32> = (0..4096).map(|_| rng.normal() * 6.0).collect();
    gate.extend([7.0, 7.5, 100.0, -100.0, -7.5, 0.0]);
    up.extend([7.0, -7.5, 100.0, -100.0, 9.0, 3.0]);
    let want: Vec<f64> = gate
        .iter()
        .zip(&up)
        .map(|(&x, &y)| swiglu_oai(x, y))
        .collect();
    glu_inplace(&mut gate, &up, Activation::SwiGluOai);
    for (i, (&g, &w)) in gate.iter().zip(&want).enumerate() {
        let err = (g as f64 - w).abs() / w.abs().max(1.0);
        assert!(err < 1e-6, "element {i}: {g} vs {w}");
    }
    // Past the limits: the gate stops at 7 (its sigmoid almost 1), the up at +-7.
    let n = gate.len();
    assert!((gate[n - 4] as f64 - 7.0 * 8.0 / (1.0 + (-1.702f64 * 7.0).exp())).abs() < 1e-4);
    assert!(gate[n - 3].abs() < 1e-30); // -100 * sigmoid(-170): 0
}
