//! Single-thread matmul throughput per ISA and weight layout (a benchmark, not a test: it
//! checks nothing and only prints). Run with `cargo bench --bench matmul_gmacs`;
//! `BENCH_TYPES=Q4_1,Q8_0` picks the types, `BENCH_N_OUT` the output width. Moved out of
//! `tests/kernels_simd.rs`, where it was an ignored test.

use std::time::Instant;

use edge_llm::kernels::tensor_type::TensorType;
use edge_llm::kernels::{
    available_isas, has_x8, matmul, matmul_x8, quantize_rows, repack_x8, set_isa,
};

/// splitmix64 (as in tests/kernels_simd.rs).
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in (0, 1).
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}

/// `n` values ~N(0, 1), one in 64 scaled by 8 (outliers), one in 128 zero.
fn test_data(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let x = rng.normal();
            match rng.below(128) {
                0 | 1 => 8.0 * x,
                2 => 0.0,
                _ => x,
            }
        })
        .collect()
}

/// Single-thread matmul throughput, in multiply-adds per second, per ISA: a 576 -> 1536 projection
/// (the default model's ffn_up; 512 -> 1536 for the K-quants) for 1 and 64 activation rows. The
/// best of 15 runs of at least 20 ms each, the ISAs interleaved: this machine is shared and noisy.
/// `BENCH_TYPES=Q4_1,Q8_0` picks the types, `BENCH_N_OUT` the output width.
fn main() {
    let n_out: usize = std::env::var("BENCH_N_OUT").map_or(1536, |v| v.parse().unwrap());
    let types: Vec<TensorType> = match std::env::var("BENCH_TYPES") {
        Ok(v) => v
            .split(',')
            .map(|name| {
                *TensorType::ALL
                    .iter()
                    .find(|t| t.to_string() == name)
                    .expect("a type name")
            })
            .collect(),
        Err(_) => vec![
            TensorType::Q4_1,
            TensorType::Q8_0,
            TensorType::Q4_0,
            TensorType::Q5_0,
            TensorType::Q4_K,
            TensorType::Q6_K,
        ],
    };
    let mut rng = Rng(12);
    let x = test_data(&mut rng, n_out * 576);
    for t in types {
        let n_in = if t.block_size() == 256 { 512 } else { 576 };
        let w = quantize_rows(t, &x[..n_out * n_in], n_in);
        let w8 = has_x8(t).then(|| repack_x8(t, &w, n_in, n_out));
        for n_rows in [1usize, 64] {
            let a = quantize_rows(t.vec_dot_type(), &x[..n_rows * n_in], n_in);
            let mut out = vec![0.0; n_rows * n_out];
            let isas = available_isas();
            // (isa, interleaved) pairs, timed in turns.
            let cases: Vec<_> = isas
                .iter()
                .flat_map(|&isa| [(isa, false), (isa, true)])
                .filter(|&(_, x8)| !x8 || w8.is_some())
                .collect();
            let mut best = vec![f64::MAX; cases.len()];
            for _ in 0..15 {
                for (k, &(isa, x8)) in cases.iter().enumerate() {
                    set_isa(isa).unwrap();
                    let (mut reps, t0) = (0usize, Instant::now());
                    while t0.elapsed().as_secs_f64() < 0.02 {
                        edge_llm::kernels::serial(|| match (&w8, x8) {
                            (Some(w8), true) => matmul_x8(t, w8, n_in, n_out, &a, n_rows, &mut out),
                            _ => matmul(t, &w, n_in, n_out, &a, n_rows, &mut out),
                        });
                        reps += 1;
                    }
                    best[k] = best[k].min(t0.elapsed().as_secs_f64() / reps as f64);
                }
            }
            for (k, (isa, x8)) in cases.iter().enumerate() {
                let gmacs = (n_in * n_out * n_rows) as f64 / best[k] / 1e9;
                let layout = if *x8 { "x8" } else { "rows" };
                eprintln!("{t:>5} n_rows={n_rows:>2} {isa:>6} {layout:>4}: {gmacs:6.2} GMAC/s");
            }
        }
    }
}
