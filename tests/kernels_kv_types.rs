//! The KV cache types (`--cache-type-k`, `--cache-type-v`: f16, bf16, q8_0, q4_0, q4_1, q5_0,
//! q5_1, iq4_nl) in the kernels, on random data, on every instruction set this machine has:
//! - the KV write stores each row exactly as the type's quantizer makes it, on every ISA;
//! - paged attention on every type (and K and V of different types) is bit-identical to the
//!   scalar reference on every ISA, over windows, GQA groups and shared-prefix block tables;
//! - the reference equals attention from the definition (in f64) over the dequantized cache
//!   within the f16 cache's budget, so the types change only what is stored;
//! - a (token, head) alone equals the same item in a batch;
//! - against the f16 cache, q8_0 and q4_0 stay within named error budgets.
//!
//! The ISA is process-wide, so every test that switches it holds the ISA lock.

mod support;

use edge_llm::kernels::tensor_type::TensorType;
use edge_llm::kernels::{
    available_isas, dequantize_row, kv_row_words, kv_write_as, paged_attention_as, quantize_row,
    set_isa, AttentionBatch, AttentionShape, Isa, KvTypes, KV_TYPES,
};
use support::isa_lock::lock_isa;
use support::splitmix::Rng;

use TensorType::{BF16, F16, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};

fn on<T>(isa: Isa, f: impl FnOnce() -> T) -> T {
    set_isa(isa).expect("available ISA");
    f()
}

fn types(k: TensorType, v: TensorType) -> KvTypes {
    KvTypes { k, v }
}

/// `n` values ~N(0, sigma), one in 64 scaled by 8 (outliers) when sigma > 0; ~N(0, -sigma)
/// without outliers when sigma < 0.
fn data(rng: &mut Rng, n: usize, sigma: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let x = rng.normal() * sigma.abs();
            if sigma > 0.0 && rng.below(64) == 0 {
                8.0 * x
            } else {
                x
            }
        })
        .collect()
}

fn words_to_bytes(w: &[u16]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn kv_write_stores_each_row_as_its_quantizer_on_every_isa() {
    let _guard = lock_isa();
    let mut rng = Rng(31);
    for t in KV_TYPES {
        for kv_dim in [64usize, 192, 576] {
            let n_tokens = 5;
            let k = data(&mut rng, n_tokens * kv_dim, 1.5);
            let v = data(&mut rng, n_tokens * kv_dim, 1.0);
            let slots: Vec<i64> = vec![3, -1, 0, 7, 5];
            let kt = types(t, if t == F16 { Q8_0 } else { t });
            let run = |isa| {
                on(isa, || {
                    let mut kc = vec![0u16; 8 * kv_row_words(kt.k, kv_dim)];
                    let mut vc = vec![0u16; 8 * kv_row_words(kt.v, kv_dim)];
                    kv_write_as(kt, &k, &v, &mut kc, &mut vc, &slots, kv_dim);
                    (kc, vc)
                })
            };
            let want = run(Isa::Scalar);
            for isa in available_isas() {
                assert!(run(isa) == want, "{isa} kv_write of {kt} over {kv_dim}");
            }
            // Slot 3 holds token 0's rows, as the quantizer makes them.
            for (cache, ttype, x) in [(&want.0, kt.k, &k), (&want.1, kt.v, &v)] {
                let words = kv_row_words(ttype, kv_dim);
                let mut row = vec![0u8; 2 * words];
                quantize_row(ttype, &x[..kv_dim], &mut row);
                assert_eq!(
                    words_to_bytes(&cache[3 * words..4 * words]),
                    row,
                    "{ttype:?} row"
                );
            }
        }
    }
}

/// A batch over a typed cache: float keys and values written through `kv_write_as`.
struct Case {
    types: KvTypes,
    shape: AttentionShape,
    k_cache: Vec<u16>,
    v_cache: Vec<u16>,
    /// The same keys and values in f16, for the error budgets.
    k_f16: Vec<u16>,
    v_f16: Vec<u16>,
    q: Vec<f32>,
    block_tables: Vec<i32>,
    max_blocks_per_seq: usize,
    token_seq: Vec<i32>,
    context_lens: Vec<i32>,
}

/// Three sequences of random lengths over shuffled blocks, four tokens each attending to a
/// random prefix; with `shared`, the sequences' first three blocks are the same physical blocks
/// (a cached prefix, which the SIMD kernel reads once for all of them).
fn case(
    rng: &mut Rng,
    types: KvTypes,
    (n_heads, n_kv_heads, head_dim, block_size): (usize, usize, usize, usize),
    shared: bool,
) -> Case {
    case_with(
        rng,
        types,
        (n_heads, n_kv_heads, head_dim, block_size),
        shared,
        1.0,
    )
}

/// [`case`] with keys of spread 1.5 * `sigma` and values of `sigma` ([`data`]'s convention).
fn case_with(
    rng: &mut Rng,
    types: KvTypes,
    (n_heads, n_kv_heads, head_dim, block_size): (usize, usize, usize, usize),
    shared: bool,
    sigma: f32,
) -> Case {
    let (n_seqs, max_blocks_per_seq) = (3, 6);
    let num_blocks = n_seqs * max_blocks_per_seq + 2;
    let mut ids: Vec<i32> = (0..num_blocks as i32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.below(i + 1));
    }
    let mut block_tables: Vec<i32> = ids[..n_seqs * max_blocks_per_seq].to_vec();
    if shared {
        for s in 1..n_seqs {
            for b in 0..3 {
                block_tables[s * max_blocks_per_seq + b] = block_tables[b];
            }
        }
    }
    let kv_dim = n_kv_heads * head_dim;
    let num_slots = num_blocks * block_size;
    let k = data(rng, num_slots * kv_dim, 1.5 * sigma);
    let v = data(rng, num_slots * kv_dim, sigma);
    let slots: Vec<i64> = (0..num_slots as i64).collect();
    let write = |t: KvTypes| {
        let mut kc = vec![0u16; num_slots * kv_row_words(t.k, kv_dim)];
        let mut vc = vec![0u16; num_slots * kv_row_words(t.v, kv_dim)];
        kv_write_as(t, &k, &v, &mut kc, &mut vc, &slots, kv_dim);
        (kc, vc)
    };
    let (k_cache, v_cache) = write(types);
    let (k_f16, v_f16) = write(KvTypes::F16);
    let (mut token_seq, mut context_lens) = (Vec::new(), Vec::new());
    for s in 0..n_seqs {
        for _ in 0..4 {
            token_seq.push(s as i32);
            context_lens.push(1 + rng.below(max_blocks_per_seq * block_size) as i32);
        }
    }
    let q = data(rng, token_seq.len() * n_heads * head_dim, 1.0);
    Case {
        types,
        shape: AttentionShape {
            n_heads,
            n_kv_heads,
            head_dim,
            block_size,
            num_blocks,
        },
        k_cache,
        v_cache,
        k_f16,
        v_f16,
        q,
        block_tables,
        max_blocks_per_seq,
        token_seq,
        context_lens,
    }
}

fn scale(c: &Case) -> f32 {
    1.0 / (c.shape.head_dim as f32).sqrt()
}

fn run(c: &Case, window: Option<usize>) -> Vec<f32> {
    run_on(c, c.types, &c.k_cache, &c.v_cache, window)
}

fn run_on(c: &Case, t: KvTypes, kc: &[u16], vc: &[u16], window: Option<usize>) -> Vec<f32> {
    let mut out = vec![f32::NAN; c.q.len()];
    let batch = AttentionBatch {
        block_tables: &c.block_tables,
        max_blocks_per_seq: c.max_blocks_per_seq,
        token_seq: &c.token_seq,
        context_lens: &c.context_lens,
    };
    paged_attention_as(
        t,
        &mut out,
        &c.q,
        kc,
        vc,
        &c.shape,
        &batch,
        scale(c),
        window,
    );
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const TYPE_PAIRS: [(TensorType, TensorType); 8] = [
    (Q8_0, Q8_0),
    (Q4_0, Q4_0),
    (F16, Q8_0),
    (Q8_0, F16),
    (Q4_1, Q5_0),
    (Q5_1, IQ4_NL),
    (BF16, Q4_0),
    (IQ4_NL, BF16),
];

const SHAPES: [(usize, usize, usize, usize); 6] = [
    (9, 3, 64, 16),
    (4, 4, 128, 32),
    (8, 1, 256, 16),
    (14, 2, 64, 16),
    (9, 1, 64, 16),  // four tokens of a 9-head group: 36 queries share one pass
    (66, 1, 32, 16), // a GQA group wider than the AVX2 kernel's 64 queries at once
];

#[test]
fn paged_attention_on_every_kv_type_is_bit_identical_to_the_reference() {
    let _guard = lock_isa();
    let mut rng = Rng(32);
    for (k, v) in TYPE_PAIRS {
        for shape in SHAPES {
            for shared in [false, true] {
                let c = case(&mut rng, types(k, v), shape, shared);
                for window in [None, Some(5), Some(40)] {
                    let want = on(Isa::Scalar, || run(&c, window));
                    assert!(want.iter().all(|x| x.is_finite()));
                    for isa in available_isas() {
                        let got = on(isa, || run(&c, window));
                        if let Some(i) = got
                            .iter()
                            .zip(&want)
                            .position(|(g, w)| g.to_bits() != w.to_bits())
                        {
                            panic!(
                                "{isa} attention on {} {shape:?} shared {shared} window {window:?}: \
                                 element {i} is {}, the reference's {}",
                                c.types, got[i], want[i]
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Attention in f64 from the definition over the cache's rows as `dequantize_row` gives them.
fn naive(c: &Case, window: Option<usize>) -> Vec<f64> {
    let s = &c.shape;
    let (hd, kv_dim, group) = (
        s.head_dim,
        s.n_kv_heads * s.head_dim,
        s.n_heads / s.n_kv_heads,
    );
    let rows = |t: TensorType, cache: &[u16]| -> Vec<f32> {
        let words = kv_row_words(t, kv_dim);
        cache
            .chunks_exact(words)
            .flat_map(|r| {
                let mut out = vec![0f32; kv_dim];
                dequantize_row(t, &words_to_bytes(r), &mut out);
                out
            })
            .collect()
    };
    let (kf, vf) = (rows(c.types.k, &c.k_cache), rows(c.types.v, &c.v_cache));
    let sc = scale(c) as f64;
    let mut out = vec![0.0; c.q.len()];
    for (t, (&seq, &len)) in c.token_seq.iter().zip(&c.context_lens).enumerate() {
        let len = len as usize;
        let first = window.map_or(0, |w| len.saturating_sub(w));
        let table = &c.block_tables[seq as usize * c.max_blocks_per_seq..];
        for h in 0..s.n_heads {
            let q = &c.q[(t * s.n_heads + h) * hd..][..hd];
            let at = |j: usize| {
                (table[j / s.block_size] as usize * s.block_size + j % s.block_size) * kv_dim
                    + (h / group) * hd
            };
            let scores: Vec<f64> = (first..len)
                .map(|j| {
                    (0..hd)
                        .map(|d| q[d] as f64 * kf[at(j) + d] as f64)
                        .sum::<f64>()
                        * sc
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            let o = &mut out[(t * s.n_heads + h) * hd..][..hd];
            for (j, w) in (first..len).zip(&weights) {
                for d in 0..hd {
                    o[d] += w / total * vf[at(j) + d] as f64;
                }
            }
        }
    }
    out
}

#[test]
fn paged_attention_on_every_kv_type_matches_the_definition() {
    // The f16 cache's budget (tests/kernels_simd.rs: chunked online softmax and its own exp cost
    // a few f32 roundings): the cache type changes what is stored, not the arithmetic.
    let _guard = lock_isa();
    let mut rng = Rng(33);
    for (k, v) in TYPE_PAIRS {
        let c = case(&mut rng, types(k, v), (9, 3, 64, 16), false);
        for window in [None, Some(5)] {
            let want = naive(&c, window);
            for isa in available_isas() {
                let got = on(isa, || run(&c, window));
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(&g, &w)| (g as f64 - w).abs())
                    .fold(0.0, f64::max);
                assert!(
                    worst < 1e-5,
                    "{isa} attention on {}: worst error {worst:e}",
                    c.types
                );
            }
        }
    }
}

#[test]
fn a_token_alone_equals_the_same_token_in_a_batch() {
    let _guard = lock_isa();
    let mut rng = Rng(34);
    for isa in available_isas() {
        set_isa(isa).unwrap();
        for shared in [false, true] {
            let c = case(&mut rng, types(Q8_0, Q4_0), (6, 2, 64, 16), shared);
            let full = run(&c, None);
            let per_token = c.shape.n_heads * c.shape.head_dim;
            for t in [0usize, 5, 11] {
                let one = Case {
                    q: c.q[t * per_token..][..per_token].to_vec(),
                    token_seq: vec![c.token_seq[t]],
                    context_lens: vec![c.context_lens[t]],
                    k_cache: c.k_cache.clone(),
                    v_cache: c.v_cache.clone(),
                    k_f16: Vec::new(),
                    v_f16: Vec::new(),
                    block_tables: c.block_tables.clone(),
                    types: c.types,
                    shape: c.shape,
                    max_blocks_per_seq: c.max_blocks_per_seq,
                };
                let alone = run(&one, None);
                assert!(
                    bits(&alone) == bits(&full[t * per_token..][..per_token]),
                    "{isa}: token {t} alone differs from the batch (shared {shared})"
                );
            }
        }
    }
}

#[test]
fn quantized_caches_stay_within_their_error_budgets_against_f16() {
    // Keys and values ~N(0, 1) without outliers (an outlier widens its block's scale, and a
    // peaked softmax then moves with it); outputs are averages of the values (about 1 in size).
    // The budgets are the worst error over the batch against the f16 cache of the same keys and
    // values, with a margin over what was measured (q8_0: 0.027, q4_0: 0.44: sixteen times, as the step).
    let mut rng = Rng(35);
    for (t, budget) in [(Q8_0, 0.05), (Q4_0, 0.8)] {
        let c = case_with(&mut rng, types(t, t), (9, 3, 64, 16), false, -1.0);
        let got = run(&c, None);
        let want = run_on(&c, KvTypes::F16, &c.k_f16, &c.v_f16, None);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs())
            .fold(0.0, f32::max);
        eprintln!("{t:?}: worst error against f16 {worst}");
        assert!(worst < budget, "{t:?}: worst error {worst} against f16");
        assert!(worst > 0.0, "{t:?}: the cache was not quantized");
    }
}

/// This thread's CPU time in seconds (steadier than wall time on a shared machine; Linux).
fn thread_cpu_seconds() -> f64 {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut t = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write into.
    unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + 1e-9 * t.tv_nsec as f64
}

#[test]
#[ignore = "a measurement: cargo test --release --test kernels_kv_types -- --ignored --nocapture"]
fn decode_attention_at_4000_keys_per_cache_type() {
    // One token's attention over 4000 keys at the default model's shapes (9 heads, 3 KV heads of
    // 64, blocks of 16), on one thread, in thread CPU time per layer, best of 5 sweeps.
    let (hd, kvh, h, bs, keys) = (64, 3, 9, 16, 4000usize);
    let num_blocks = keys.div_ceil(bs) + 1;
    let mut rng = Rng(36);
    let kv_dim = kvh * hd;
    let num_slots = num_blocks * bs;
    let k = data(&mut rng, num_slots * kv_dim, 1.0);
    let v = data(&mut rng, num_slots * kv_dim, 1.0);
    let slots: Vec<i64> = (0..num_slots as i64).collect();
    let q = data(&mut rng, h * hd, 1.0);
    let table: Vec<i32> = (0..num_blocks as i32).collect();
    let shape = AttentionShape {
        n_heads: h,
        n_kv_heads: kvh,
        head_dim: hd,
        block_size: bs,
        num_blocks,
    };
    // As in the model's forward pass, one call per layer over 30 layers' caches (about 90 MB
    // in f16), so the keys and values come from memory, not from the last call's cache lines.
    let layers = 30;
    for t in [F16, Q8_0, Q4_0] {
        let kt = types(t, t);
        let caches: Vec<(Vec<u16>, Vec<u16>)> = (0..layers)
            .map(|_| {
                let mut kc = vec![0u16; num_slots * kv_row_words(t, kv_dim)];
                let mut vc = vec![0u16; num_slots * kv_row_words(t, kv_dim)];
                kv_write_as(kt, &k, &v, &mut kc, &mut vc, &slots, kv_dim);
                (kc, vc)
            })
            .collect();
        let batch = AttentionBatch {
            block_tables: &table,
            max_blocks_per_seq: num_blocks,
            token_seq: &[0],
            context_lens: &[keys as i32],
        };
        let mut out = vec![0f32; h * hd];
        let best = (0..5)
            .map(|_| {
                let t0 = thread_cpu_seconds();
                edge_llm::kernels::serial(|| {
                    for (kc, vc) in &caches {
                        paged_attention_as(kt, &mut out, &q, kc, vc, &shape, &batch, 0.125, None)
                    }
                });
                (thread_cpu_seconds() - t0) / layers as f64
            })
            .fold(f64::INFINITY, f64::min);
        eprintln!("{kt}: {:.3} ms per layer", best * 1e3);
    }
}
