//! Single-thread matrix-vector (and small-batch) throughput of the IQ types per ISA (a benchmark,
//! not a test: it checks nothing and only prints). Run with `cargo bench --bench iq_matmul`;
//! `BENCH_TYPES=IQ4_XS,IQ2_XXS` picks the types, `BENCH_ROUNDS` the number of timed rounds.
//!
//! The weights are random IQ blocks (every byte pattern is a valid block; the codebook types
//! have no quantizer) in two model-sized shapes: Qwen2.5-0.5B's ffn_down (896 outputs x 4864
//! inputs) and SmolLM2-135M's (576 x 1536). Each round times every ISA once (at least 20 ms of
//! repeated products each, in CPU time), the ISAs interleaved so a shared machine's noise falls on all of them;
//! the report is the median over rounds, in ns per output row and GMAC/s, and the ratio to scalar.

use std::time::Duration;

/// The process's CPU time (Linux CLOCK_PROCESS_CPUTIME_ID): on a shared machine, time spent
/// waiting for a core is not counted, as wall-clock time would count it.
fn cpu_time() -> Duration {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: t is a valid timespec for clock_gettime to fill.
    let rc = unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime");
    Duration::new(t.sec as u64, t.nsec as u32)
}

use edge_llm::kernels::tensor_type::TensorType;
use edge_llm::kernels::{available_isas, matmul, quantize_rows, set_isa, Isa};

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn normal(&mut self) -> f32 {
        let u = ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let v = ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}

/// Random blocks with a small positive f16 super-scale (IQ1_M keeps it in its scale words).
fn iq_blocks(t: TensorType, n_blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let bb = t.block_bytes();
    let mut out: Vec<u8> = (0..n_blocks * bb).map(|_| rng.next_u64() as u8).collect();
    let d: u16 = 0x2000; // 2^-7
    for block in out.chunks_exact_mut(bb) {
        if t == TensorType::IQ1_M {
            for k in 0..4 {
                let word = u16::from_le_bytes([block[48 + 2 * k], block[49 + 2 * k]]);
                let word = (word & 0x0fff) | (((d >> (4 * k)) & 0xf) << 12);
                block[48 + 2 * k..50 + 2 * k].copy_from_slice(&word.to_le_bytes());
            }
        } else {
            block[..2].copy_from_slice(&d.to_le_bytes());
        }
    }
    out
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS").map_or(9, |v| v.parse().unwrap());
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
            TensorType::IQ4_XS,
            TensorType::IQ4_NL,
            TensorType::IQ3_S,
            TensorType::IQ3_XXS,
            TensorType::IQ2_XXS,
            TensorType::IQ2_XS,
            TensorType::IQ2_S,
            TensorType::IQ1_S,
            TensorType::IQ1_M,
        ],
    };
    let mut rng = Rng(19);
    let isas = available_isas();
    println!("median of {rounds} interleaved rounds, one thread, CPU time; ns per output row, GMAC/s, speed-up vs scalar");
    for t in types {
        for (n_out, n_in) in [(896usize, 4864usize), (576, 1536)] {
            let w = iq_blocks(t, n_out * n_in / t.block_size(), &mut rng);
            for n_rows in [1usize, 8] {
                let x: Vec<f32> = (0..n_rows * n_in).map(|_| rng.normal()).collect();
                let a = quantize_rows(t.vec_dot_type(), &x, n_in);
                let mut out = vec![0.0; n_rows * n_out];
                let mut secs = vec![Vec::new(); isas.len()];
                for _ in 0..rounds {
                    for (k, &isa) in isas.iter().enumerate() {
                        set_isa(isa).unwrap();
                        let (mut reps, t0) = (0usize, cpu_time());
                        while (cpu_time() - t0).as_secs_f64() < 0.02 {
                            edge_llm::kernels::serial(|| {
                                matmul(t, &w, n_in, n_out, &a, n_rows, &mut out)
                            });
                            reps += 1;
                        }
                        secs[k].push((cpu_time() - t0).as_secs_f64() / reps as f64);
                    }
                }
                let med: Vec<f64> = secs.iter_mut().map(|s| median(s)).collect();
                let scalar = isas.iter().position(|&i| i == Isa::Scalar).map(|k| med[k]);
                for (k, isa) in isas.iter().enumerate() {
                    let ns_row = med[k] * 1e9 / n_out as f64;
                    let gmacs = (n_in * n_out * n_rows) as f64 / med[k] / 1e9;
                    let ratio = scalar.map_or(String::new(), |s| format!("{:5.1}x", s / med[k]));
                    println!(
                        "{t:>7} {n_out:>4}x{n_in:<4} rows={n_rows} {isa:>6}: {ns_row:9.0} ns/row {gmacs:6.2} GMAC/s {ratio}"
                    );
                }
            }
        }
    }
}
