//! Rotary embedding time per token, per ISA, for llama3's frequency factors and for YaRN (a
//! benchmark: it checks nothing and only prints). Run with `cargo bench --bench rope_ext`.
//!
//! The shape is Llama 3.2 1B's queries (32 heads of 64, adjacent pairs) and Qwen2.5's (14 heads of
//! 64, halves), one token (decode) and 512 (prefill). Each round times every ISA once (at least
//! 20 ms of CPU time each), interleaved; the report is the median over rounds and the ratio to scalar.

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

use edge_llm::kernels::{available_isas, rope, set_isa, FreqFactors, Isa, Rope, RopeStyle, Yarn};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS").map_or(9, |v| v.parse().unwrap());
    let isas = available_isas();
    let factors: Vec<f32> = (0..32).map(|i| 1.0 + (i % 5) as f32).collect();
    let cases = [
        ("llama3 rope_freqs", 32usize, RopeStyle::Normal, true, false),
        ("yarn x4", 14, RopeStyle::Neox, false, true),
        ("plain", 32, RopeStyle::Normal, false, false),
    ];
    println!("median of {rounds} interleaved rounds, one thread, CPU time; microseconds per token, speed-up vs scalar");
    for (name, n_heads, style, with_factors, with_yarn) in cases {
        let r = Rope {
            head_dim: 64,
            rope_dim: 64,
            freq_base: 500_000.0,
            freq_scale: if with_yarn { 0.25 } else { 1.0 },
            style,
            freq_factors: with_factors.then(|| FreqFactors::new(&factors).unwrap()),
            yarn: with_yarn.then(|| Yarn::new(64, 32768, 500_000.0, 0.25)),
        };
        for n_tokens in [1usize, 512] {
            let pos: Vec<i32> = (0..n_tokens as i32).map(|p| p + 1000).collect();
            let mut x: Vec<f32> = (0..n_tokens * n_heads * 64)
                .map(|i| ((i % 97) as f32 - 48.0) / 48.0)
                .collect();
            let mut secs = vec![Vec::new(); isas.len()];
            for _ in 0..rounds {
                for (k, &isa) in isas.iter().enumerate() {
                    set_isa(isa).unwrap();
                    let (mut reps, t0) = (0usize, cpu_time());
                    while (cpu_time() - t0).as_secs_f64() < 0.02 {
                        rope(&mut x, &pos, n_heads, &r);
                        reps += 1;
                    }
                    secs[k].push((cpu_time() - t0).as_secs_f64() / reps as f64);
                }
            }
            let med: Vec<f64> = secs.iter_mut().map(|s| median(s)).collect();
            let scalar = isas.iter().position(|&i| i == Isa::Scalar).map(|k| med[k]);
            for (k, isa) in isas.iter().enumerate() {
                let us = med[k] * 1e6 / n_tokens as f64;
                let ratio = scalar.map_or(String::new(), |s| format!("{:5.2}x", s / med[k]));
                println!("{name:>18} {n_heads:>2} heads tokens={n_tokens:<3} {isa:>6}: {us:8.3} us/token {ratio}");
            }
        }
    }
}
