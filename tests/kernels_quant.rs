//! Tests of the tensor-type kernels (`src/kernels/quant.rs` over `csrc/quants.c` and
//! `csrc/quants_k.c`) through the public crate API:
//! - the C geometry table against `TensorType`;
//! - quantize/dequantize and dot-product error on random data, within named per-type budgets;
//! - known-answer blocks whose bytes are written here from ggml-common.h's layout description,
//!   so a layout mistake cannot pass by self-consistency;
//! - the activation quantizers (Q8_0, Q8_1, Q8_K) byte for byte against ggml's reference formulas;
//! - matmul against vec_dot, bit for bit, and its batch invariance;
//! - the kernels' own argument checks.
//!
//! Every test that runs quantize, vec_dot or matmul does so once per instruction set this machine
//! has (`on_every_isa`): the SIMD variants must meet the same budgets and answers as the scalar
//! references. tests/kernels_simd.rs compares the variants with the references directly.

mod support;

use std::sync::Mutex;

use edge_llm::kernels::tensor_type::TensorType;
use edge_llm::kernels::{
    available_isas, c_block_bytes, c_block_size, c_vec_dot_type, current_isa, dequantize_row,
    kernel_statuses, matmul, quantize_rows, set_isa, vec_dot,
};
use half::f16;

// ---- Deterministic data ---------------------------------------------------------------------

use support::splitmix::Rng;

/// `n` values ~N(0, 1), one in 64 of them scaled by 8: the outliers real weights and
/// activations have, which cost their block resolution.
fn test_data(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let x = rng.normal();
            if rng.next_u64().is_multiple_of(64) {
                8.0 * x
            } else {
                x
            }
        })
        .collect()
}

fn dequantize(t: TensorType, bytes: &[u8]) -> Vec<f32> {
    let n = bytes.len() / t.block_bytes() * t.block_size();
    let mut y = vec![0.0; n];
    dequantize_row(t, bytes, &mut y);
    y
}

fn norm(x: &[f32]) -> f64 {
    x.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt()
}

fn dot_f64(x: &[f32], y: &[f32]) -> f64 {
    x.iter().zip(y).map(|(&a, &b)| a as f64 * b as f64).sum()
}

// ---- Every instruction set -------------------------------------------------------------------

/// The kernels' instruction set is process-wide: tests that switch it hold this lock.
static ISA_LOCK: Mutex<()> = Mutex::new(());

/// Runs `body` once per instruction set this machine has, then restores the one that was current.
fn on_every_isa(body: fn()) {
    let _lock = ISA_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let before = current_isa();
    struct Restore(edge_llm::kernels::Isa);
    impl Drop for Restore {
        fn drop(&mut self) {
            set_isa(self.0).expect("the ISA that was current is available");
        }
    }
    let _restore = Restore(before);
    for isa in available_isas() {
        eprintln!("-- on {isa}");
        set_isa(isa).expect("available ISA");
        body();
    }
}

// ---- Geometry -------------------------------------------------------------------------------

#[test]
fn c_geometry_matches_tensor_type() {
    for t in TensorType::ALL {
        assert_eq!(c_block_size(t), t.block_size(), "{t} block size");
        assert_eq!(c_block_bytes(t), t.block_bytes(), "{t} block bytes");
        assert_eq!(
            c_vec_dot_type(t),
            Some(t.vec_dot_type()),
            "{t} vec_dot type"
        );
    }
}

// ---- Error budgets on random data -----------------------------------------------------------

/// Error budgets of one type, both relative:
/// - `roundtrip`: RMSE of dequantize(quantize(x)) over the RMS of x;
/// - `dot`: |vec_dot(quantize(w), quantize(a)) - w.a| over |w| |a|, the activation quantized to
///   the vec_dot type, worst row of `ROWS`.
///
/// Rounding to a grid of step s costs s / sqrt(12) RMS and a block's step is its range over its
/// levels, so the round-trip error halves with each extra bit, and grows with the outliers in
/// `test_data` (an 8-sigma element stretches its whole block's step). The dot error of n random
/// elements is about the combined round-trip errors over sqrt(n). Each budget sits about 1.5x
/// above what these kernels measure on this data (the test prints the measurements).
struct Budget {
    t: TensorType,
    roundtrip: f64,
    dot: f64,
}

const fn budget(t: TensorType, roundtrip: f64, dot: f64) -> Budget {
    Budget { t, roundtrip, dot }
}

const BUDGETS: [Budget; 18] = [
    // Exact; the dot then only rounds its f32 products.
    budget(TensorType::F32, 0.0, 1e-6),
    // 11-bit significand: half an ulp is 2^-12 relative (RMS about 2^-12 / sqrt(3)).
    budget(TensorType::F16, 3e-4, 5e-5),
    // 8-bit significand: 2^-9 relative.
    budget(TensorType::BF16, 2.5e-3, 3e-4),
    // 16 levels with the largest magnitude at -8: the other side gets only 7.
    budget(TensorType::Q4_0, 0.20, 0.010),
    // 16 levels spanning the block's min to max.
    budget(TensorType::Q4_1, 0.15, 0.010),
    // One bit more than Q4_0 / Q4_1.
    budget(TensorType::Q5_0, 0.10, 0.007),
    budget(TensorType::Q5_1, 0.07, 0.005),
    // 255 levels from -amax to amax per 32 elements.
    budget(TensorType::Q8_0, 0.014, 0.0012),
    budget(TensorType::Q8_1, 0.014, 0.0012),
    // 4 levels per 16 elements, 4-bit scales and mins; our plain min/max fit is coarser than
    // ggml's searching quantizer, but only tests quantize weights.
    budget(TensorType::Q2_K, 0.55, 0.025),
    // 8 signed levels per 16 elements, 6-bit scales.
    budget(TensorType::Q3_K, 0.30, 0.016),
    // 16 / 32 levels per 32 elements, 6-bit scales and mins.
    budget(TensorType::Q4_K, 0.15, 0.008),
    budget(TensorType::Q5_K, 0.07, 0.004),
    // 64 signed levels per 16 elements, 8-bit scales.
    budget(TensorType::Q6_K, 0.04, 0.002),
    // 255 levels over 256 elements: one outlier sets the step for all of them.
    budget(TensorType::Q8_K, 0.027, 0.0017),
    // 16 non-linear levels (denser near zero) per 32 elements, f16 scale searched as ggml does.
    budget(TensorType::IQ4_NL, 0.15, 0.008),
    // The same levels with 6-bit sub-scales of one f16 scale per 256.
    budget(TensorType::IQ4_XS, 0.15, 0.008),
    // E2M1's 15 levels (0, +-0.5 .. +-6) per 32 elements under a power-of-two scale that puts
    // the block's largest magnitude in [4, 8): steps of 2 at the top, rounding up to 1/6 of it.
    budget(TensorType::MXFP4, 0.25, 0.016),
];

/// vec_dot against the f64 dot of the dequantized rows: both see the same quantized values, so
/// only float rounding (block scales multiplied in f32) separates them.
const CONSISTENCY_BUDGET: f64 = 1e-5;

/// The same for Q4_1 and Q5_1, whose min term reads Q8_1's s = d * sum(q) stored as f16 (as ggml
/// does) rather than the activation's sum: 2^-12 relative error on that term.
const CONSISTENCY_BUDGET_Q8_1_SUM: f64 = 1e-4;

fn consistency_budget(t: TensorType) -> f64 {
    match t {
        TensorType::Q4_1 | TensorType::Q5_1 => CONSISTENCY_BUDGET_Q8_1_SUM,
        _ => CONSISTENCY_BUDGET,
    }
}

const N_IN: usize = 1024; // four K super-blocks
const ROWS: usize = 8;

struct Measured {
    roundtrip: f64,
    dot: f64,
    consistency: f64,
}

fn measure(t: TensorType, rng: &mut Rng) -> Measured {
    let w = test_data(rng, ROWS * N_IN); // [ROWS][N_IN]
    let a = test_data(rng, ROWS * N_IN); // [ROWS][N_IN]
    let wq = quantize_rows(t, &w, N_IN);
    let aq = quantize_rows(t.vec_dot_type(), &a, N_IN);
    let w_deq = dequantize(t, &wq);
    let a_deq = dequantize(t.vec_dot_type(), &aq);

    let err: Vec<f32> = w.iter().zip(&w_deq).map(|(x, y)| x - y).collect();
    let roundtrip = norm(&err) / norm(&w);

    let (w_rb, a_rb) = (
        t.row_bytes(N_IN).unwrap(),
        t.vec_dot_type().row_bytes(N_IN).unwrap(),
    );
    let (mut dot, mut consistency) = (0.0f64, 0.0f64);
    for r in 0..ROWS {
        let rows = r * N_IN..(r + 1) * N_IN;
        let got = vec_dot(t, N_IN, &wq[r * w_rb..][..w_rb], &aq[r * a_rb..][..a_rb]) as f64;
        let exact = dot_f64(&w[rows.clone()], &a[rows.clone()]);
        dot = dot.max((got - exact).abs() / (norm(&w[rows.clone()]) * norm(&a[rows.clone()])));
        let deq = dot_f64(&w_deq[rows.clone()], &a_deq[rows.clone()]);
        let scale = norm(&w_deq[rows.clone()]) * norm(&a_deq[rows]);
        consistency = consistency.max((got - deq).abs() / scale);
    }
    Measured {
        roundtrip,
        dot,
        consistency,
    }
}

#[test]
fn quantization_error_within_budget() {
    on_every_isa(quantization_error_within_budget_on_this_isa);
}

fn quantization_error_within_budget_on_this_isa() {
    let mut failures = Vec::new();
    for (i, budget) in BUDGETS.iter().enumerate() {
        let t = budget.t;
        let m = measure(t, &mut Rng(1000 + i as u64));
        eprintln!(
            "{t:>5}: roundtrip {:.2e} (budget {:.1e})  dot {:.2e} (budget {:.1e})  consistency {:.2e}",
            m.roundtrip, budget.roundtrip, m.dot, budget.dot, m.consistency
        );
        if m.roundtrip > budget.roundtrip {
            failures.push(format!(
                "{t} roundtrip {:.3e} > {:.1e}",
                m.roundtrip, budget.roundtrip
            ));
        }
        if m.dot > budget.dot {
            failures.push(format!("{t} dot {:.3e} > {:.1e}", m.dot, budget.dot));
        }
        if m.consistency > consistency_budget(t) {
            let b = consistency_budget(t);
            failures.push(format!("{t} consistency {:.3e} > {b:.0e}", m.consistency));
        }
    }
    assert!(failures.is_empty(), "over budget: {failures:#?}");
}

/// Types the kernels quantize to (the codebook IQ types are only read: tests/kernels_iq.rs).
fn quantizable() -> impl Iterator<Item = TensorType> {
    TensorType::ALL.into_iter().filter(|t| t.has_quantizer())
}

#[test]
fn every_type_has_a_budget() {
    for t in quantizable() {
        assert!(BUDGETS.iter().any(|b| b.t == t), "{t} has no error budget");
    }
}

#[test]
fn zero_rows_round_trip_to_zero() {
    on_every_isa(zero_rows_round_trip_to_zero_on_this_isa);
}

fn zero_rows_round_trip_to_zero_on_this_isa() {
    for t in quantizable() {
        let q = quantize_rows(t, &[0.0; 512], 512);
        assert!(dequantize(t, &q).iter().all(|&v| v == 0.0), "{t}");
        let a = quantize_rows(t.vec_dot_type(), &[1.0; 512], 512);
        assert_eq!(vec_dot(t, 512, &q, &a), 0.0, "{t}");
    }
}

// ---- Activation quantizers: ggml's reference formulas, byte for byte ------------------------

fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_bits().to_le_bytes()
}

/// ggml's quantize_row_q8_0_ref / q8_1_ref for one block: d = amax / 127, q = roundf(x / d)
/// (half away from zero, as Rust's `round`), and for Q8_1 s = d * sum(q) with d before rounding.
fn ggml_q8_block(x: &[f32], with_sum: bool) -> Vec<u8> {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q: Vec<i8> = x.iter().map(|&v| (v * id).round() as i8).collect();
    let mut out = f16_bytes(d).to_vec();
    if with_sum {
        let sum: i32 = q.iter().map(|&v| v as i32).sum();
        out.extend(f16_bytes(sum as f32 * d));
    }
    out.extend(q.iter().map(|&v| v as u8));
    out
}

/// ggml's quantize_row_q8_K_ref for one block: iscale = -127 / (the signed largest-magnitude
/// element), q = nearest_int(iscale * x) (ties to even) capped at 127, d = 1 / iscale as f32.
fn ggml_q8_k_block(x: &[f32]) -> Vec<u8> {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        return vec![0; 292];
    }
    let iscale = -127.0 / max;
    let q: Vec<i8> = x
        .iter()
        .map(|&v| ((iscale * v).round_ties_even() as i32).min(127) as i8)
        .collect();
    let mut out = (1.0 / iscale).to_le_bytes().to_vec();
    out.extend(q.iter().map(|&v| v as u8));
    for g in q.chunks(16) {
        out.extend((g.iter().map(|&v| v as i32).sum::<i32>() as i16).to_le_bytes());
    }
    out
}

#[test]
fn activation_quantizers_match_ggml_reference() {
    on_every_isa(activation_quantizers_match_ggml_reference_on_this_isa);
}

fn activation_quantizers_match_ggml_reference_on_this_isa() {
    let mut rng = Rng(7);
    let mut x = test_data(&mut rng, 4096);
    x[..32].fill(0.0); // an all-zero block
    for (i, v) in x[256..512].iter_mut().enumerate() {
        *v = (i as f32 - 128.0) * 0.5; // ties at x / d = k + 0.5
    }
    for (t, block) in [
        (TensorType::Q8_0, 32),
        (TensorType::Q8_1, 32),
        (TensorType::Q8_K, 256),
    ] {
        let want: Vec<u8> = x
            .chunks(block)
            .flat_map(|b| match t {
                TensorType::Q8_K => ggml_q8_k_block(b),
                _ => ggml_q8_block(b, t == TensorType::Q8_1),
            })
            .collect();
        assert!(
            quantize_rows(t, &x, x.len()) == want,
            "{t} differs from ggml's reference"
        );
    }
}

// ---- Known-answer blocks --------------------------------------------------------------------
// Bytes are written from ggml-common.h's description of each layout; the expected values follow
// from the dequantization formulas by hand, with scales that keep every value exact in f32.

const F16_ONE: [u8; 2] = [0x00, 0x3C]; // 1.0
const F16_HALF: [u8; 2] = [0x00, 0x38]; // 0.5
const F16_TWO: [u8; 2] = [0x00, 0x40]; // 2.0
const F16_QUARTER: [u8; 2] = [0x00, 0x34]; // 0.25
const F16_MINUS_ONE: [u8; 2] = [0x00, 0xBC]; // -1.0

fn assert_dequantizes_to(t: TensorType, block: &[u8], want: &[f32]) {
    assert_eq!(block.len(), t.block_bytes(), "{t} test block size");
    let got = dequantize(t, block);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g, w, "{t} element {i}");
    }
}

/// Element i of a 32-block with 4-bit quants: the low nibble of qs[i] for i < 16, the high
/// nibble of qs[i - 16] otherwise.
fn nibble_of(qs: &[u8], i: usize) -> u8 {
    if i < 16 {
        qs[i] & 0xF
    } else {
        qs[i - 16] >> 4
    }
}

#[test]
fn q4_0_layout() {
    // { f16 d; u8 qs[16] }, x = d * (q - 8).
    let qs: Vec<u8> = (0..16u8).map(|j| j | ((15 - j) << 4)).collect();
    let block = [&F16_ONE[..], &qs].concat();
    let want: Vec<f32> = (0..32).map(|i| nibble_of(&qs, i) as f32 - 8.0).collect();
    assert_eq!(
        (want[0], want[15], want[16], want[31]),
        (-8.0, 7.0, 7.0, -8.0)
    );
    assert_dequantizes_to(TensorType::Q4_0, &block, &want);
}

#[test]
fn q4_1_layout() {
    // { f16 d; f16 m; u8 qs[16] }, x = d * q + m.
    let qs: Vec<u8> = (0..16u8)
        .map(|j| ((3 * j) % 16) | (((7 * j) % 16) << 4))
        .collect();
    let block = [&F16_HALF[..], &F16_MINUS_ONE, &qs].concat();
    let want: Vec<f32> = (0..32)
        .map(|i| 0.5 * nibble_of(&qs, i) as f32 - 1.0)
        .collect();
    assert_eq!((want[1], want[17]), (0.5, 2.5));
    assert_dequantizes_to(TensorType::Q4_1, &block, &want);
}

/// Bits 0, 9, 16 and 31 of qh (a little-endian u32): the fifth bits of those elements.
const QH: [u8; 4] = [0x01, 0x02, 0x01, 0x80];
const QH_SET: [usize; 4] = [0, 9, 16, 31];

fn q5_of(qs: &[u8], i: usize) -> f32 {
    (nibble_of(qs, i) as u32 | if QH_SET.contains(&i) { 16 } else { 0 }) as f32
}

#[test]
fn q5_0_layout() {
    // { f16 d; u8 qh[4]; u8 qs[16] }, x = d * (q - 16), q = nibble | (bit i of qh) << 4.
    let qs: Vec<u8> = (0..16u8).map(|j| j | ((15 - j) << 4)).collect();
    let block = [&F16_TWO[..], &QH, &qs].concat();
    let want: Vec<f32> = (0..32).map(|i| 2.0 * (q5_of(&qs, i) - 16.0)).collect();
    // Element 0: nibble 0 + 16 -> 0; element 1: nibble 1 -> -30; element 31: nibble 0 + 16 -> 0.
    assert_eq!(
        (want[0], want[1], want[9], want[31]),
        (0.0, -30.0, 18.0, 0.0)
    );
    assert_dequantizes_to(TensorType::Q5_0, &block, &want);
}

#[test]
fn q5_1_layout() {
    // { f16 d; f16 m; u8 qh[4]; u8 qs[16] }, x = d * q + m.
    let qs: Vec<u8> = (0..16u8).map(|j| ((5 * j) % 16) | (j << 4)).collect();
    let block = [&F16_HALF[..], &F16_MINUS_ONE, &QH, &qs].concat();
    let want: Vec<f32> = (0..32).map(|i| 0.5 * q5_of(&qs, i) - 1.0).collect();
    assert_eq!((want[16], want[31]), (7.0, 14.5));
    assert_dequantizes_to(TensorType::Q5_1, &block, &want);
}

#[test]
fn q8_0_and_q8_1_layout() {
    // { f16 d; i8 qs[32] } and { f16 d; f16 s; i8 qs[32] }, x = d * q (s is not read).
    let qs: Vec<u8> = (0..32).map(|i| (i as i8 - 16) as u8).collect();
    let want: Vec<f32> = (0..32).map(|i| 0.25 * (i as f32 - 16.0)).collect();
    assert_dequantizes_to(TensorType::Q8_0, &[&F16_QUARTER[..], &qs].concat(), &want);
    assert_dequantizes_to(
        TensorType::Q8_1,
        &[&F16_QUARTER[..], &F16_TWO, &qs].concat(),
        &want,
    );
}

#[test]
fn q8_k_layout() {
    // { f32 d; i8 qs[256]; i16 bsums[16] }, x = d * q (bsums are not read by dequantize).
    let qs: Vec<u8> = (0..256).map(|i| (i as u8).wrapping_mul(7)).collect();
    let block = [&0.125f32.to_le_bytes()[..], &qs, &[0u8; 32]].concat();
    let want: Vec<f32> = qs.iter().map(|&q| 0.125 * q as i8 as f32).collect();
    assert_dequantizes_to(TensorType::Q8_K, &block, &want);
}

// K-quant quants, placed as ggml-common.h lays them out. Element e of a super-block:
// - 2-bit fields (Q2_K, Q3_K low bits): bits 2 * ((e / 32) % 4) of qs[(e / 128) * 32 + e % 32];
// - 1-bit fields (Q3_K hmask, Q5_K qh): bit e / 32 of byte e % 32;
// - 4-bit fields (Q4_K, Q5_K): nibble (e / 32) % 2 of qs[(e / 64) * 32 + e % 32];
// - Q6_K: nibble ((e / 32) % 4) / 2 of ql[(e / 128) * 64 + ((e / 32) % 2) * 32 + e % 32] and
//   bits 2 * ((e / 32) % 4) of qh[(e / 128) * 32 + e % 32].

fn put_2bit(qs: &mut [u8], e: usize, v: u8) {
    qs[(e / 128) * 32 + e % 32] |= (v & 3) << (2 * ((e / 32) % 4));
}

fn put_1bit(bits: &mut [u8], e: usize, v: u8) {
    bits[e % 32] |= (v & 1) << (e / 32);
}

fn put_nibble(qs: &mut [u8], e: usize, v: u8) {
    qs[(e / 64) * 32 + e % 32] |= (v & 0xF) << (4 * ((e / 32) % 2));
}

/// A spread of quants in [0, levels) for each element of a super-block.
fn pattern(levels: usize) -> Vec<u8> {
    (0..256)
        .map(|e| ((e * 7 + e / 16) % levels) as u8)
        .collect()
}

/// Q4_K/Q5_K scales and mins, 6 bits each, packed into 12 bytes: j < 4 in the low 6 bits of
/// bytes j (scale) and j + 4 (min); j >= 4 split into a low nibble in byte j + 4 (scale low,
/// min high) and two top bits in bits 6-7 of bytes j - 4 (scale) and j (min).
fn pack_k4_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = sc[j] | (sc[j + 4] >> 4) << 6;
        s[j + 4] = m[j] | (m[j + 4] >> 4) << 6;
        s[j + 8] = (sc[j + 4] & 0xF) | (m[j + 4] & 0xF) << 4;
    }
    s
}

const K4_SCALES: [u8; 8] = [1, 2, 3, 4, 17, 33, 50, 63];
const K4_MINS: [u8; 8] = [0, 1, 2, 3, 20, 40, 5, 63];

#[test]
fn k4_scale_packing_by_hand() {
    // The same 12 bytes worked out by hand, as a check on pack_k4_scales itself.
    let by_hand = [
        0x41, 0x82, 0xC3, 0xC4, 0x40, 0x81, 0x02, 0xC3, 0x41, 0x81, 0x52, 0xFF,
    ];
    assert_eq!(pack_k4_scales(&K4_SCALES, &K4_MINS), by_hand);
}

#[test]
fn q4_k_layout() {
    // { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }, x = d * sc[e / 32] * q - dmin * m[e / 32].
    let q = pattern(16);
    let mut qs = [0u8; 128];
    for (e, &v) in q.iter().enumerate() {
        put_nibble(&mut qs, e, v);
    }
    let scales = pack_k4_scales(&K4_SCALES, &K4_MINS);
    let block = [&F16_ONE[..], &F16_HALF, &scales, &qs].concat();
    let want: Vec<f32> = (0..256)
        .map(|e| K4_SCALES[e / 32] as f32 * q[e] as f32 - 0.5 * K4_MINS[e / 32] as f32)
        .collect();
    assert_dequantizes_to(TensorType::Q4_K, &block, &want);
}

#[test]
fn q5_k_layout() {
    // { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }, q = nibble | qh bit << 4.
    let q = pattern(32);
    let (mut qh, mut qs) = ([0u8; 32], [0u8; 128]);
    for (e, &v) in q.iter().enumerate() {
        put_nibble(&mut qs, e, v);
        put_1bit(&mut qh, e, v >> 4);
    }
    let scales = pack_k4_scales(&K4_SCALES, &K4_MINS);
    let block = [&F16_HALF[..], &F16_ONE, &scales, &qh, &qs].concat();
    let want: Vec<f32> = (0..256)
        .map(|e| 0.5 * K4_SCALES[e / 32] as f32 * q[e] as f32 - K4_MINS[e / 32] as f32)
        .collect();
    assert_dequantizes_to(TensorType::Q5_K, &block, &want);
}

#[test]
fn q2_k_layout() {
    // { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin }, scales[j] = sc | m << 4,
    // x = d * sc[e / 16] * q - dmin * m[e / 16].
    let q = pattern(4);
    let sc: Vec<u8> = (0..16).map(|j| (j * 5 % 16) as u8).collect();
    let m: Vec<u8> = (0..16).map(|j| (15 - j) as u8).collect();
    let scales: Vec<u8> = (0..16).map(|j| sc[j] | m[j] << 4).collect();
    let mut qs = [0u8; 64];
    for (e, &v) in q.iter().enumerate() {
        put_2bit(&mut qs, e, v);
    }
    let block = [&scales[..], &qs, &F16_HALF, &F16_QUARTER].concat();
    let want: Vec<f32> = (0..256)
        .map(|e| 0.5 * sc[e / 16] as f32 * q[e] as f32 - 0.25 * m[e / 16] as f32)
        .collect();
    assert_dequantizes_to(TensorType::Q2_K, &block, &want);
}

#[test]
fn q3_k_layout() {
    // { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }, x = d * (l[e / 16] - 32) * (q - 4) with
    // q = low 2 bits | hmask bit << 2, and l 6 bits: low nibble in byte j (j < 8, low half) or
    // byte j - 8 (high half), top 2 bits at bits 2 * (j / 4) of byte 8 + j % 4.
    let l: [u8; 16] = [0, 63, 32, 33, 31, 1, 62, 48, 16, 47, 8, 40, 24, 56, 5, 60];
    let mut scales = [0u8; 12];
    for j in 0..16 {
        scales[j % 8] |= (l[j] & 0xF) << if j < 8 { 0 } else { 4 };
        scales[8 + j % 4] |= (l[j] >> 4) << (2 * (j / 4));
    }
    // By hand: byte 0 = l[0] low | l[8] low << 4 = 0x00; byte 8 = top bits of l[0], l[4], l[8],
    // l[12] = 0 | 1 << 2 | 1 << 4 | 1 << 6.
    assert_eq!((scales[0], scales[1], scales[8]), (0x00, 0xFF, 0x54));
    let q = pattern(8);
    let (mut hmask, mut qs) = ([0u8; 32], [0u8; 64]);
    for (e, &v) in q.iter().enumerate() {
        put_2bit(&mut qs, e, v);
        put_1bit(&mut hmask, e, v >> 2);
    }
    let block = [&hmask[..], &qs, &scales, &F16_HALF].concat();
    let want: Vec<f32> = (0..256)
        .map(|e| 0.5 * (l[e / 16] as f32 - 32.0) * (q[e] as f32 - 4.0))
        .collect();
    assert_dequantizes_to(TensorType::Q3_K, &block, &want);
}

#[test]
fn q6_k_layout() {
    // { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }, x = d * scales[e / 16] * (q - 32).
    let q = pattern(64);
    let sc: Vec<i8> = (0..16)
        .map(|j| if j % 2 == 0 { j + 1 } else { -(j + 1) })
        .collect();
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for (e, &v) in q.iter().enumerate() {
        let k = (e / 32) % 4;
        ql[(e / 128) * 64 + (k % 2) * 32 + e % 32] |= (v & 0xF) << (4 * (k / 2));
        qh[(e / 128) * 32 + e % 32] |= (v >> 4) << (2 * k);
    }
    let scales: Vec<u8> = sc.iter().map(|&s| s as u8).collect();
    let block = [&ql[..], &qh, &scales, &F16_HALF].concat();
    let want: Vec<f32> = (0..256)
        .map(|e| 0.5 * sc[e / 16] as f32 * (q[e] as f32 - 32.0))
        .collect();
    assert_dequantizes_to(TensorType::Q6_K, &block, &want);
}

// ---- Matrix product -------------------------------------------------------------------------

const MM_N_IN: usize = 512;
const MM_N_OUT: usize = 70; // 32 + 32 + 6 columns: a partial chunk
const MM_ROWS: usize = 7;

#[test]
fn matmul_equals_vec_dot_bit_for_bit() {
    on_every_isa(matmul_equals_vec_dot_bit_for_bit_on_this_isa);
}

fn matmul_equals_vec_dot_bit_for_bit_on_this_isa() {
    let mut rng = Rng(42);
    for t in quantizable() {
        let w = quantize_rows(t, &test_data(&mut rng, MM_N_OUT * MM_N_IN), MM_N_IN);
        let a = quantize_rows(
            t.vec_dot_type(),
            &test_data(&mut rng, MM_ROWS * MM_N_IN),
            MM_N_IN,
        );
        let (w_rb, a_rb) = (w.len() / MM_N_OUT, a.len() / MM_ROWS);
        let mut out = vec![f32::NAN; MM_ROWS * MM_N_OUT]; // [MM_ROWS][MM_N_OUT]
        matmul(t, &w, MM_N_IN, MM_N_OUT, &a, MM_ROWS, &mut out);
        for r in 0..MM_ROWS {
            for o in 0..MM_N_OUT {
                let want = vec_dot(t, MM_N_IN, &w[o * w_rb..][..w_rb], &a[r * a_rb..][..a_rb]);
                let got = out[r * MM_N_OUT + o];
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{t} row {r} output {o}: {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn matmul_is_batch_invariant() {
    on_every_isa(matmul_is_batch_invariant_on_this_isa);
}

fn matmul_is_batch_invariant_on_this_isa() {
    let mut rng = Rng(43);
    for t in quantizable() {
        let w = quantize_rows(t, &test_data(&mut rng, MM_N_OUT * MM_N_IN), MM_N_IN);
        let a = quantize_rows(
            t.vec_dot_type(),
            &test_data(&mut rng, MM_ROWS * MM_N_IN),
            MM_N_IN,
        );
        let a_rb = a.len() / MM_ROWS;
        let mut batch = vec![0.0; MM_ROWS * MM_N_OUT];
        matmul(t, &w, MM_N_IN, MM_N_OUT, &a, MM_ROWS, &mut batch);
        for r in 0..MM_ROWS {
            let mut single = vec![0.0; MM_N_OUT];
            matmul(
                t,
                &w,
                MM_N_IN,
                MM_N_OUT,
                &a[r * a_rb..][..a_rb],
                1,
                &mut single,
            );
            let batch_row = &batch[r * MM_N_OUT..][..MM_N_OUT];
            let same = single
                .iter()
                .zip(batch_row)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "{t}: row {r} differs between a batch of {MM_ROWS} and of 1"
            );
        }
    }
}

#[test]
fn matmul_handles_empty_shapes() {
    on_every_isa(matmul_handles_empty_shapes_on_this_isa);
}

fn matmul_handles_empty_shapes_on_this_isa() {
    let w = quantize_rows(TensorType::Q4_0, &[0.5; 64], 32);
    matmul(TensorType::Q4_0, &w, 32, 2, &[], 0, &mut []);
    matmul(TensorType::Q4_0, &[], 32, 0, &[], 0, &mut []);
}

// ---- Argument checks ------------------------------------------------------------------------

const EL_OK: i32 = 0;
const EL_ERR_TYPE: i32 = -1; // edge_kernels.h
const EL_ERR_SHAPE: i32 = -2;

#[test]
fn kernels_reject_unknown_types_and_partial_blocks() {
    on_every_isa(kernels_reject_unknown_types_and_partial_blocks_on_this_isa);
}

fn kernels_reject_unknown_types_and_partial_blocks_on_this_isa() {
    for id in [4, 5, 24, 28, 31, -1, 1000] {
        assert_eq!(kernel_statuses(id, 256), [EL_ERR_TYPE; 4], "type id {id}");
    }
    for t in TensorType::ALL.into_iter().filter(|t| t.block_size() > 1) {
        let id = t.ggml_id() as i32;
        assert_eq!(
            kernel_statuses(id, t.block_size() + 1),
            [EL_ERR_SHAPE; 4],
            "{t}"
        );
        // The codebook IQ types have no quantizer: quantize answers EL_ERR_TYPE.
        let quantize = if t.has_quantizer() {
            EL_OK
        } else {
            EL_ERR_TYPE
        };
        assert_eq!(
            kernel_statuses(id, 2 * t.block_size()),
            [EL_OK, quantize, EL_OK, EL_OK],
            "{t}"
        );
    }
    assert_eq!(
        kernel_statuses(TensorType::F32.ggml_id() as i32, 3),
        [EL_OK; 4]
    );
}

#[test]
#[should_panic(expected = "not a whole number of Q4_K blocks")]
fn wrapper_rejects_partial_blocks() {
    let mut y = vec![0.0; 300];
    dequantize_row(TensorType::Q4_K, &[0; 144], &mut y);
}

#[test]
#[should_panic(expected = "vec_dot")]
fn wrapper_rejects_mismatched_rows() {
    let w = quantize_rows(TensorType::Q8_0, &[1.0; 64], 64);
    let a = quantize_rows(TensorType::Q8_0, &[1.0; 32], 32);
    vec_dot(TensorType::Q8_0, 64, &w, &a);
}
