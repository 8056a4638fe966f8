//! The SIMD kernel variants against the scalar references, on every instruction set this machine
//! has (`available_isas`), on random data. Every variant is bit-identical to its reference -- its
//! error budget is zero -- because the forward pass amplifies any last-bit difference: the next
//! matmul quantizes activations to int8, and a value that crosses a rounding boundary moves by a
//! whole quantization step (about 0.3 in the default model's logits, enough to flip near-tied
//! greedy tokens). So:
//! - vec_dot, the quantizers, RMSNorm, RoPE, SwiGLU, the KV write and paged attention: the SIMD
//!   result equals the reference's bit for bit;
//! - matmul: every element equals the same ISA's vec_dot, and a row's result is the same whatever
//!   the batch size;
//! - paged attention: a (token, head) computed alone equals the same item in a batch;
//! - and so the default model's logits, prefill and decode, are the same on every ISA: greedy
//!   outputs and perplexity do not depend on the kernels' instruction set.
//!
//! The ISA is process-wide, so every test that switches it holds `ISA_LOCK`.
//! The matmul throughput benchmark lives in `benches/matmul_gmacs.rs` (`cargo bench --bench
//! matmul_gmacs`).

mod support;

use edge_llm::kernels::tensor_type::TensorType;
use edge_llm::kernels::{
    available_isas, current_isa, glu_inplace, isa_available, kv_write, matmul, matmul_x8,
    matmul_x8_isa, paged_attention, quantize_rows, repack_x8, rms_norm, rope, set_isa, vec_dot,
    Activation, AttentionBatch, AttentionShape, FreqFactors, Isa, Rope, RopeStyle, Yarn,
};
use edge_llm::scoring::runner::SequenceRunner;

// ---- ISA switching ---------------------------------------------------------------------------

use support::isa_lock::lock_isa;

/// `f()` computed under `isa` (the caller holds the lock).
fn on<T>(isa: Isa, f: impl FnOnce() -> T) -> T {
    set_isa(isa).expect("available ISA");
    f()
}

/// The SIMD ISAs this machine has (none on a machine with only the references).
fn simd_isas() -> Vec<Isa> {
    available_isas()
        .into_iter()
        .filter(|&isa| isa != Isa::Scalar)
        .collect()
}

// ---- Deterministic data ---------------------------------------------------------------------

use support::splitmix::Rng;

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

/// `n` values uniform in [-1, 1): no outliers, so quants fill their range; dotted with themselves,
/// block sums get more bits than an f16 scale times them keeps exactly, so the order of the float
/// operations shows in the result.
fn uniform_data(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| (2.0 * rng.uniform() - 1.0) as f32).collect()
}

/// Activation rows with the cases the quantizers must round like the reference: an all-zero
/// block, exact ties at k + 1/2 quantization steps, equal magnitudes of both signs, and tiny and
/// huge values.
fn activation_data(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut x = test_data(rng, n);
    let n = x.len();
    if n >= 1024 {
        x[..32].fill(0.0);
        for (i, v) in x[256..512].iter_mut().enumerate() {
            *v = (i as f32 - 128.0) * 0.5;
        }
        x[512] = -3.0; // the first of two equal magnitudes sets Q8_K's sign
        x[600] = 3.0;
        for v in &mut x[640..672] {
            *v *= 1e-30;
        }
        for v in &mut x[704..736] {
            *v *= 1e30;
        }
    }
    x
}

// ---- The ISA API -----------------------------------------------------------------------------

#[test]
fn isa_selection_round_trips() {
    let _guard = lock_isa();
    assert!(isa_available(Isa::Scalar));
    assert!(available_isas().contains(&current_isa()));
    for isa in Isa::ALL {
        if isa_available(isa) {
            set_isa(isa).unwrap();
            assert_eq!(current_isa(), isa);
        } else {
            let before = current_isa();
            assert!(
                set_isa(isa).is_err(),
                "{isa} is unavailable but set_isa accepted it"
            );
            assert_eq!(current_isa(), before);
        }
        assert_eq!(isa.name().parse::<Isa>().unwrap(), isa);
    }
    eprintln!("available: {:?}", available_isas());
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_is_chosen_where_the_cpu_has_it() {
    let has = std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c");
    assert_eq!(isa_available(Isa::Avx2), has);
    assert!(!isa_available(Isa::Neon), "NEON on an x86-64 build");
}

/// Where the CPU has AVX-512 F, BW, VL and VNNI (with AVX2), `avx512vnni` is available and is the
/// best ISA (the one the kernels start on without EDGE_LLM_ISA), and the interleaved products run
/// its kernels under it: a machine with VNNI that quietly ran AVX2's fails here.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_vnni_is_chosen_where_the_cpu_has_it() {
    let _guard = lock_isa();
    let has = isa_available(Isa::Avx2)
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512vnni");
    assert_eq!(isa_available(Isa::Avx512Vnni), has);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    if cpuinfo.contains(" avx512_vnni") {
        assert!(
            has,
            "/proc/cpuinfo lists avx512_vnni but avx512vnni is not available"
        );
    }
    let before = current_isa();
    for isa in available_isas() {
        set_isa(isa).unwrap();
        for t in [
            TensorType::Q4_1,
            TensorType::Q8_0,
            TensorType::Q4_K,
            TensorType::Q5_K,
            TensorType::Q6_K,
        ] {
            assert_eq!(matmul_x8_isa(t), Some(isa), "{t} under {isa}");
        }
        assert_eq!(matmul_x8_isa(TensorType::Q4_0), None);
    }
    set_isa(before).unwrap();
    if has && std::env::var_os("EDGE_LLM_ISA").is_none() {
        assert_eq!(
            available_isas().last(),
            Some(&Isa::Avx512Vnni),
            "VNNI is not the best ISA"
        );
        assert_eq!(default_isa_of_a_fresh_process(), "avx512vnni");
    }
}

/// The ISA a new process starts on (no set_isa, no EDGE_LLM_ISA): this test binary run again for
/// the test below alone, which prints it.
#[cfg(target_arch = "x86_64")]
fn default_isa_of_a_fresh_process() -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "print_the_starting_isa",
            "--nocapture",
            "--include-ignored",
        ])
        .env_remove("EDGE_LLM_ISA")
        .output()
        .expect("run this test binary again");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("starting isa: "))
        .unwrap_or_else(|| panic!("no ISA printed: {text}"))
        .to_string()
}

/// Prints the ISA this process started on; run by `default_isa_of_a_fresh_process` (ignored on
/// its own: in a full run another test may have set the ISA first).
#[test]
#[ignore]
fn print_the_starting_isa() {
    println!("starting isa: {}", current_isa());
}

#[cfg(target_arch = "aarch64")]
#[test]
fn neon_is_chosen_where_the_cpu_has_the_dot_product() {
    let has = std::arch::is_aarch64_feature_detected!("dotprod");
    assert_eq!(isa_available(Isa::Neon), has);
    assert!(!isa_available(Isa::Avx2), "AVX2 on an AArch64 build");
}

// ---- vec_dot and the quantizers -------------------------------------------------------------

/// Row lengths per type: several blocks, plus for the float types lengths with a tail that is
/// not a multiple of 8.
fn lengths(t: TensorType) -> Vec<usize> {
    match t.block_size() {
        1 => vec![1, 7, 8, 576, 1000, 1027],
        32 => vec![32, 64, 576, 1536],
        _ => vec![256, 512, 1536],
    }
}

#[test]
fn vec_dot_is_bit_identical_to_the_reference() {
    let _guard = lock_isa();
    let mut rng = Rng(1);
    for isa in simd_isas() {
        for t in TensorType::ALL.into_iter().filter(|t| t.has_quantizer()) {
            let mut worst = 0.0f64;
            for n in lengths(t) {
                for k in 0..16 {
                    // Both rows quantized by the reference, so only the dot products differ.
                    let (x, y) = if k % 2 == 0 {
                        (test_data(&mut rng, n), activation_data(&mut rng, n))
                    } else {
                        // w = a: large block sums, whose products with the scales round.
                        let x = uniform_data(&mut rng, n);
                        (x.clone(), x)
                    };
                    let (w, a) = on(Isa::Scalar, || {
                        (
                            quantize_rows(t, &x, n),
                            quantize_rows(t.vec_dot_type(), &y, n),
                        )
                    });
                    let want = on(Isa::Scalar, || vec_dot(t, n, &w, &a));
                    let got = on(isa, || vec_dot(t, n, &w, &a));
                    worst = worst.max((got as f64 - want as f64).abs());
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{isa} {t} vec_dot over {n}: {got} vs the reference's {want}"
                    );
                }
            }
            eprintln!("{isa} {t:>5} vec_dot: largest difference {worst:e}");
        }
    }
}

#[test]
fn quantizers_are_byte_identical_to_the_reference() {
    let _guard = lock_isa();
    let mut rng = Rng(2);
    for isa in simd_isas() {
        for t in TensorType::ALL.into_iter().filter(|t| t.has_quantizer()) {
            for n in [256usize, 1024, 4096] {
                let mut x = activation_data(&mut rng, n);
                if t.block_size() == 1 {
                    // Every f16/bf16 rounding case: subnormals, overflow, infinities, NaNs.
                    x.extend([
                        1e-8,
                        -3e-6,
                        6e-8,
                        65504.0,
                        65520.0,
                        1e6,
                        -1e38,
                        1.0e-40,
                        f32::INFINITY,
                        f32::NEG_INFINITY,
                        f32::NAN,
                        -f32::NAN,
                        0.0,
                        -0.0,
                        2049.0,
                        2051.0,
                        1.00048828125,
                    ]);
                }
                let n = x.len();
                let want = on(Isa::Scalar, || quantize_rows(t, &x, n));
                let got = on(isa, || quantize_rows(t, &x, n));
                if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
                    panic!(
                        "{isa} {t} quantize over {n}: byte {i} is {:#04x}, the reference's {:#04x}",
                        got[i], want[i]
                    );
                }
            }
        }
    }
}

// ---- matmul ----------------------------------------------------------------------------------

const MM_N_OUT: usize = 70; // 8 * 8 + 6: partial tiles of every shape
const MM_BATCHES: [usize; 9] = [1, 2, 3, 4, 5, 6, 7, 9, 33];

fn mm_n_in(t: TensorType) -> usize {
    if t.block_size() == 1 {
        100
    } else {
        512
    }
}

#[test]
fn matmul_equals_vec_dot_on_every_isa() {
    let _guard = lock_isa();
    let mut rng = Rng(3);
    for isa in available_isas() {
        for t in TensorType::ALL.into_iter().filter(|t| t.has_quantizer()) {
            let n_in = mm_n_in(t);
            let rows = *MM_BATCHES.iter().max().unwrap();
            let w = quantize_rows(t, &test_data(&mut rng, MM_N_OUT * n_in), n_in);
            let a = quantize_rows(
                t.vec_dot_type(),
                &activation_data(&mut rng, rows * n_in),
                n_in,
            );
            let (w_rb, a_rb) = (w.len() / MM_N_OUT, a.len() / rows);
            set_isa(isa).unwrap();
            for n_rows in MM_BATCHES {
                let mut out = vec![f32::NAN; n_rows * MM_N_OUT];
                matmul(t, &w, n_in, MM_N_OUT, &a[..n_rows * a_rb], n_rows, &mut out);
                for r in 0..n_rows {
                    for o in 0..MM_N_OUT {
                        let want = vec_dot(t, n_in, &w[o * w_rb..][..w_rb], &a[r * a_rb..][..a_rb]);
                        let got = out[r * MM_N_OUT + o];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{isa} {t} batch of {n_rows}, row {r} output {o}: {got} vs vec_dot {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn interleaved_matmul_equals_vec_dot_on_every_isa() {
    // Q4_1, Q8_0, Q4_K, Q5_K and Q6_K matrices are read from copies with their rows interleaved
    // in eights; every output equals the same ISA's vec_dot on the row as stored (and so the
    // reference's), bit for bit: lengths of one block to many, one group of rows to several
    // tasks' worth, one activation row (the streaming path) and batches that fill 4-row tiles or
    // leave a partial one; Q4_1 and Q8_0 rows of over 512 blocks, whose batches take the
    // streaming path one row at a time.
    let _guard = lock_isa();
    let mut rng = Rng(21);
    for t in [
        TensorType::Q4_1,
        TensorType::Q8_0,
        TensorType::Q4_K,
        TensorType::Q5_K,
        TensorType::Q6_K,
    ] {
        let shapes: &[(usize, usize)] = if t.block_size() == 32 {
            &[(32, 8), (576, 1536), (1536, 72), (96, 40), (32 * 1030, 16)]
        } else {
            &[(256, 8), (512, 1536), (1536, 72), (8960, 16)]
        };
        for &(n_in, n_out) in shapes {
            let w = quantize_rows(t, &test_data(&mut rng, n_out * n_in), n_in);
            let w8 = repack_x8(t, &w, n_in, n_out);
            assert_eq!(
                w8.len(),
                w.len(),
                "the interleaved copy holds the same bytes"
            );
            let max_rows = 9;
            let a = quantize_rows(
                t.vec_dot_type(),
                &activation_data(&mut rng, max_rows * n_in),
                n_in,
            );
            let (w_rb, a_rb) = (w.len() / n_out, a.len() / max_rows);
            for isa in available_isas() {
                set_isa(isa).unwrap();
                for n_rows in [1, 2, 3, 4, 5, 9] {
                    let mut out = vec![f32::NAN; n_rows * n_out];
                    matmul_x8(t, &w8, n_in, n_out, &a[..n_rows * a_rb], n_rows, &mut out);
                    for r in 0..n_rows {
                        for o in 0..n_out {
                            let want =
                                vec_dot(t, n_in, &w[o * w_rb..][..w_rb], &a[r * a_rb..][..a_rb]);
                            let got = out[r * n_out + o];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{isa} {t} [{n_out}][{n_in}], {n_rows} rows, row {r} output {o}: {got} vs vec_dot {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn matmul_rows_do_not_depend_on_the_batch() {
    let _guard = lock_isa();
    let mut rng = Rng(4);
    for isa in available_isas() {
        set_isa(isa).unwrap();
        for t in TensorType::ALL.into_iter().filter(|t| t.has_quantizer()) {
            let n_in = mm_n_in(t);
            let w = quantize_rows(t, &test_data(&mut rng, MM_N_OUT * n_in), n_in);
            let a = quantize_rows(
                t.vec_dot_type(),
                &activation_data(&mut rng, 33 * n_in),
                n_in,
            );
            let a_rb = a.len() / 33;
            let run = |n_rows: usize| {
                let mut out = vec![0.0f32; n_rows * MM_N_OUT];
                matmul(t, &w, n_in, MM_N_OUT, &a[..n_rows * a_rb], n_rows, &mut out);
                out
            };
            let (one, seven, all) = (run(1), run(7), run(33));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&one),
                bits(&seven[..MM_N_OUT]),
                "{isa} {t}: row 0 alone vs in 7"
            );
            assert_eq!(
                bits(&seven),
                bits(&all[..7 * MM_N_OUT]),
                "{isa} {t}: rows 0-6 in 7 vs in 33"
            );
        }
    }
}

#[test]
fn matmul_is_the_same_on_every_isa() {
    let _guard = lock_isa();
    let mut rng = Rng(5);
    for t in TensorType::ALL.into_iter().filter(|t| t.has_quantizer()) {
        let n_in = mm_n_in(t);
        // Activation rows equal to the first weight rows: large block sums (see uniform_data).
        let x = uniform_data(&mut rng, MM_N_OUT * n_in);
        let (w, a) = on(Isa::Scalar, || {
            (
                quantize_rows(t, &x, n_in),
                quantize_rows(t.vec_dot_type(), &x[..9 * n_in], n_in),
            )
        });
        let run = |isa| {
            on(isa, || {
                let mut out = vec![0.0f32; 9 * MM_N_OUT];
                matmul(t, &w, n_in, MM_N_OUT, &a, 9, &mut out);
                out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            })
        };
        let want = run(Isa::Scalar);
        for isa in simd_isas() {
            assert!(
                run(isa) == want,
                "{isa} {t}: matmul differs from the reference"
            );
        }
    }
}

// ---- Row operations --------------------------------------------------------------------------

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The index and values of the first element where two outputs differ, for messages.
fn first_difference(got: &[f32], want: &[f32]) -> Option<(usize, f32, f32)> {
    got.iter()
        .zip(want)
        .position(|(g, w)| g.to_bits() != w.to_bits())
        .map(|i| (i, got[i], want[i]))
}

#[test]
fn rms_norm_is_bit_identical_to_the_reference() {
    let _guard = lock_isa();
    let mut rng = Rng(6);
    for isa in simd_isas() {
        for n in [1usize, 7, 64, 576, 1000, 2048] {
            for n_rows in [1usize, 3, 4, 9, 16, 23, 37] {
                let x = test_data(&mut rng, n_rows * n);
                let w = test_data(&mut rng, n);
                let run = |isa| {
                    on(isa, || {
                        let mut y = vec![0.0; x.len()];
                        rms_norm(&x, &w, &mut y, 1e-5);
                        y
                    })
                };
                let (want, got) = (run(Isa::Scalar), run(isa));
                if let Some(d) = first_difference(&got, &want) {
                    panic!("{isa} rms_norm of {n_rows} rows of {n}: element {} is {}, the reference's {}", d.0, d.1, d.2);
                }
            }
        }
    }
}

#[test]
fn swiglu_is_bit_identical_to_the_reference() {
    let _guard = lock_isa();
    let mut rng = Rng(7);
    for isa in simd_isas() {
        let n = 4099;
        let mut gate: Vec<f32> = test_data(&mut rng, n).iter().map(|v| 4.0 * v).collect();
        gate.extend([
            0.0, -0.0, 88.0, -88.0, 100.0, -100.0, 1e-20, -1e-20, 20.0, -20.0, 87.5, -104.0,
        ]);
        let up = test_data(&mut rng, gate.len());
        for act in [Activation::SwiGlu, Activation::GeGlu] {
            let run = |isa| {
                on(isa, || {
                    let mut y = gate.clone();
                    glu_inplace(&mut y, &up, act);
                    y
                })
            };
            let (want, got) = (run(Isa::Scalar), run(isa));
            if let Some(d) = first_difference(&got, &want) {
                panic!(
                    "{isa} {act:?}: element {} is {}, the reference's {}",
                    d.0, d.1, d.2
                );
            }
        }
    }
}

#[test]
fn rope_is_bit_identical_to_the_reference() {
    let _guard = lock_isa();
    let mut rng = Rng(8);
    for isa in simd_isas() {
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            for (head_dim, rope_dim) in [
                (64, 64),
                (128, 128),
                (80, 80),
                (256, 256),
                (64, 32),
                (6, 6),
                (96, 94),
            ] {
                let r = Rope {
                    head_dim,
                    rope_dim,
                    freq_base: 10000.0,
                    freq_scale: 1.0,
                    style,
                    freq_factors: None,
                    yarn: None,
                };
                let n_heads = 3;
                let pos: Vec<i32> = vec![0, 1, 17, 4095, 123_456, 5];
                let x = test_data(&mut rng, pos.len() * n_heads * head_dim);
                let run = |isa| {
                    on(isa, || {
                        let mut y = x.clone();
                        rope(&mut y, &pos, n_heads, &r);
                        y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                    })
                };
                assert!(
                    run(isa) == run(Isa::Scalar),
                    "{isa} rope {style:?} {head_dim}/{rope_dim}"
                );
            }
        }
    }
}

#[test]
fn kv_write_is_bit_identical_to_the_reference() {
    let _guard = lock_isa();
    let mut rng = Rng(9);
    for isa in simd_isas() {
        for kv_dim in [64usize, 192, 100, 3] {
            let n_tokens = 5;
            let mut k = test_data(&mut rng, n_tokens * kv_dim);
            let v = test_data(&mut rng, n_tokens * kv_dim);
            let specials = [1e-8, 65520.0, f32::NAN, f32::INFINITY, -0.0, 6e-5, 1e9];
            for (x, s) in k.iter_mut().step_by(7).zip(specials.iter().cycle()) {
                *x = *s;
            }
            let slots: Vec<i64> = vec![3, -1, 0, 7, 5];
            let run = |isa| {
                on(isa, || {
                    let (mut kc, mut vc) = (vec![0u16; 8 * kv_dim], vec![0u16; 8 * kv_dim]);
                    kv_write(&k, &v, &mut kc, &mut vc, &slots, kv_dim);
                    (kc, vc)
                })
            };
            assert!(run(isa) == run(Isa::Scalar), "{isa} kv_write over {kv_dim}");
        }
    }
}

// ---- Paged attention -------------------------------------------------------------------------

struct AttentionCase {
    shape: AttentionShape,
    k_cache: Vec<u16>,
    v_cache: Vec<u16>,
    q: Vec<f32>,
    block_tables: Vec<i32>,
    max_blocks_per_seq: usize,
    token_seq: Vec<i32>,
    context_lens: Vec<i32>,
}

fn f16_bits(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

/// The block ids `0..num_blocks` in a random order.
fn shuffled_blocks(rng: &mut Rng, num_blocks: usize) -> Vec<i32> {
    let mut ids: Vec<i32> = (0..num_blocks as i32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.below(i + 1));
    }
    ids
}

/// Random f16 keys and values for a cache of `len` elements each: keys with a spread that makes
/// the softmax peaked for some heads and flat for others.
fn random_kv(rng: &mut Rng, len: usize) -> (Vec<u16>, Vec<u16>) {
    let k = (0..len).map(|_| f16_bits(rng.normal() * 1.5)).collect();
    let v = (0..len).map(|_| f16_bits(rng.normal())).collect();
    (k, v)
}

/// A case over the given block tables and tokens, with random keys, values (f16) and queries.
fn with_random_data(
    rng: &mut Rng,
    shape: AttentionShape,
    (block_tables, max_blocks_per_seq): (Vec<i32>, usize),
    (token_seq, context_lens): (Vec<i32>, Vec<i32>),
) -> AttentionCase {
    let cache_len = shape.num_blocks * shape.block_size * shape.n_kv_heads * shape.head_dim;
    let (k_cache, v_cache) = random_kv(rng, cache_len);
    let q = test_data(rng, token_seq.len() * shape.n_heads * shape.head_dim);
    AttentionCase {
        shape,
        k_cache,
        v_cache,
        q,
        block_tables,
        max_blocks_per_seq,
        token_seq,
        context_lens,
    }
}

/// Sequences of random lengths over shuffled blocks; each token attends to a random prefix.
fn attention_case(
    rng: &mut Rng,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
) -> AttentionCase {
    let n_seqs = 3;
    let max_blocks_per_seq = 6;
    let num_blocks = n_seqs * max_blocks_per_seq + 2;
    let ids = shuffled_blocks(rng, num_blocks);
    let block_tables: Vec<i32> = ids[..n_seqs * max_blocks_per_seq].to_vec();
    let (k_cache, v_cache) = random_kv(rng, num_blocks * block_size * n_kv_heads * head_dim);
    let (mut token_seq, mut context_lens) = (Vec::new(), Vec::new());
    for s in 0..n_seqs {
        for _ in 0..4 {
            token_seq.push(s as i32);
            context_lens.push(1 + rng.below(max_blocks_per_seq * block_size) as i32);
        }
    }
    let q = test_data(rng, token_seq.len() * n_heads * head_dim);
    AttentionCase {
        shape: AttentionShape {
            n_heads,
            n_kv_heads,
            head_dim,
            block_size,
            num_blocks,
        },
        k_cache,
        v_cache,
        q,
        block_tables,
        max_blocks_per_seq,
        token_seq,
        context_lens,
    }
}

fn run_attention(c: &AttentionCase, window: Option<usize>) -> Vec<f32> {
    let mut out = vec![f32::NAN; c.q.len()];
    let batch = AttentionBatch {
        block_tables: &c.block_tables,
        max_blocks_per_seq: c.max_blocks_per_seq,
        token_seq: &c.token_seq,
        context_lens: &c.context_lens,
    };
    let scale = 1.0 / (c.shape.head_dim as f32).sqrt();
    paged_attention(
        &mut out, &c.q, &c.k_cache, &c.v_cache, &c.shape, &batch, scale, window,
    );
    out
}

#[test]
fn paged_attention_is_bit_identical_to_the_reference() {
    let _guard = lock_isa();
    let mut rng = Rng(10);
    for isa in simd_isas() {
        for (n_heads, n_kv_heads, head_dim, block_size) in [
            (9, 3, 64, 16),
            (4, 4, 128, 32),
            (8, 1, 256, 16),
            (14, 2, 64, 16),
            (2, 1, 80, 7),
            (3, 3, 6, 1),
            (4, 2, 64, 64),
            (18, 1, 32, 16),
            (9, 1, 64, 16), // four tokens of a 9-head group: 36 queries share one pass
            (66, 1, 32, 16), // a GQA group wider than the AVX2 kernel's 64 queries at once
            (8, 1, 512, 16), // head size 512: at most 16 queries per pass (its stack buffer)
        ] {
            let c = attention_case(&mut rng, n_heads, n_kv_heads, head_dim, block_size);
            for window in [None, Some(5), Some(40)] {
                let want = on(Isa::Scalar, || run_attention(&c, window));
                let got = on(isa, || run_attention(&c, window));
                if let Some(d) = first_difference(&got, &want) {
                    panic!(
                        "{isa} attention {n_heads}/{n_kv_heads} heads of {head_dim}, blocks of {block_size}, \
                         window {window:?}: element {} is {}, the reference's {}",
                        d.0, d.1, d.2
                    );
                }
            }
        }
    }
}

#[test]
fn paged_attention_items_are_independent() {
    // One (token, head) computed alone equals the same item in a full batch, on every ISA.
    let _guard = lock_isa();
    let mut rng = Rng(11);
    for isa in available_isas() {
        set_isa(isa).unwrap();
        let c = attention_case(&mut rng, 6, 2, 64, 16);
        let full = run_attention(&c, None);
        let hd = c.shape.head_dim;
        let per_token = c.shape.n_heads * hd;
        for t in [0usize, 5, 11] {
            let one = AttentionCase {
                shape: c.shape,
                k_cache: c.k_cache.clone(),
                v_cache: c.v_cache.clone(),
                q: c.q[t * per_token..][..per_token].to_vec(),
                block_tables: c.block_tables.clone(),
                max_blocks_per_seq: c.max_blocks_per_seq,
                token_seq: vec![c.token_seq[t]],
                context_lens: vec![c.context_lens[t]],
            };
            let alone = run_attention(&one, None);
            assert!(
                bits(&alone) == bits(&full[t * per_token..][..per_token]),
                "{isa}: token {t} alone differs from the batch"
            );
        }
    }
}

/// Sequences that share a cached prefix: `n_seqs` block tables whose first blocks point at the
/// same physical blocks (each sequence shares a random number of them, up to `prefix_blocks`, so
/// some share all, some part, some none), then blocks of their own; `tokens_per_seq` queries per
/// sequence at the end of its context (decode: 1), context lengths odd and random.
fn shared_prefix_case(
    rng: &mut Rng,
    (n_heads, n_kv_heads, head_dim, block_size): (usize, usize, usize, usize),
    n_seqs: usize,
    prefix_blocks: usize,
    tokens_per_seq: usize,
) -> AttentionCase {
    let own_blocks = 3;
    let max_blocks_per_seq = prefix_blocks + own_blocks;
    let num_blocks = prefix_blocks + n_seqs * max_blocks_per_seq;
    let ids = shuffled_blocks(rng, num_blocks);
    let (prefix, own) = ids.split_at(prefix_blocks);
    let mut block_tables = Vec::new();
    let (mut token_seq, mut context_lens) = (Vec::new(), Vec::new());
    for s in 0..n_seqs {
        // Most share the whole prefix (the 16-chat workload); a few share part of it or none.
        let shared = match s % 5 {
            3 => rng.below(prefix_blocks + 1),
            4 if s % 2 == 0 => 0,
            _ => prefix_blocks,
        };
        let mine = &own[s * max_blocks_per_seq..][..max_blocks_per_seq];
        for b in 0..max_blocks_per_seq {
            block_tables.push(if b < shared { prefix[b] } else { mine[b] });
        }
        // Past the shared blocks by a few keys to a few blocks (odd counts), or short of them.
        let len = if s % 7 == 6 {
            1 + rng.below(prefix_blocks * block_size + 1)
        } else {
            prefix_blocks * block_size + 1 + 2 * rng.below(own_blocks * block_size / 2)
        };
        let len = len.max(tokens_per_seq);
        for k in 0..tokens_per_seq {
            token_seq.push(s as i32);
            context_lens.push((len + 1 - tokens_per_seq + k) as i32);
        }
    }
    with_random_data(
        rng,
        AttentionShape {
            n_heads,
            n_kv_heads,
            head_dim,
            block_size,
            num_blocks,
        },
        (block_tables, max_blocks_per_seq),
        (token_seq, context_lens),
    )
}

/// The token `t` of a case computed alone.
fn run_token_alone(c: &AttentionCase, t: usize, window: Option<usize>) -> Vec<f32> {
    let per_token = c.shape.n_heads * c.shape.head_dim;
    let one = AttentionCase {
        shape: c.shape,
        k_cache: c.k_cache.clone(),
        v_cache: c.v_cache.clone(),
        q: c.q[t * per_token..][..per_token].to_vec(),
        block_tables: c.block_tables.clone(),
        max_blocks_per_seq: c.max_blocks_per_seq,
        token_seq: vec![c.token_seq[t]],
        context_lens: vec![c.context_lens[t]],
    };
    run_attention(&one, window)
}

/// Asserts that `isa`'s attention over `c` equals the scalar reference bit for bit and, with
/// `alone`, that its first, middle and last tokens each equal that token computed alone.
fn check_attention(isa: Isa, c: &AttentionCase, window: Option<usize>, what: &str, alone: bool) {
    let want = on(Isa::Scalar, || run_attention(c, window));
    let got = on(isa, || run_attention(c, window));
    if let Some(d) = first_difference(&got, &want) {
        panic!(
            "{what}: element {} is {}, the reference's {}",
            d.0, d.1, d.2
        );
    }
    if !alone {
        return;
    }
    let per_token = c.shape.n_heads * c.shape.head_dim;
    for t in [0, c.token_seq.len() / 2, c.token_seq.len() - 1] {
        let one = on(isa, || run_token_alone(c, t, window));
        assert!(
            bits(&one) == bits(&got[t * per_token..][..per_token]),
            "{what}: token {t} alone differs from the batch"
        );
    }
}

#[test]
fn shared_prefix_attention_is_bit_identical_to_the_reference_and_to_each_token_alone() {
    // Queries of several sequences that read the same physical blocks share one pass over those
    // keys (then each goes on over its own blocks): each must equal the scalar reference and the
    // same token computed alone, for the GQA shapes of the three models (SmolLM2 9/3, Qwen2.5
    // 14/2, Gemma 3 4/1 of 256) and odd ones, decode (one token per sequence) and several tokens
    // per sequence, with and without a sliding window.
    let _guard = lock_isa();
    let mut rng = Rng(12);
    let shapes = [
        (9, 3, 64, 16),
        (14, 2, 64, 16),
        (4, 1, 256, 16),
        (8, 2, 128, 16),
        (6, 2, 64, 7),
        (66, 1, 32, 16),
    ];
    for isa in simd_isas() {
        for &shape in &shapes {
            for (n_seqs, prefix_blocks, tokens_per_seq) in
                [(16, 5, 1), (5, 9, 1), (4, 3, 3), (3, 0, 1)]
            {
                let c = shared_prefix_case(&mut rng, shape, n_seqs, prefix_blocks, tokens_per_seq);
                for window in [None, Some(37), Some(70)] {
                    let what = format!(
                        "{isa} shape {shape:?}, {n_seqs} sequences x {tokens_per_seq} tokens, \
                         {prefix_blocks} prefix blocks, window {window:?}"
                    );
                    check_attention(isa, &c, window, &what, true);
                }
            }
        }
    }
}

/// `n_seqs` sequences prefilling `tokens` consecutive tokens each after `depth` keys already in
/// the cache (token k of a sequence sees depth + k + 1 keys), over shuffled blocks.
fn prefill_case(
    rng: &mut Rng,
    (n_heads, n_kv_heads, head_dim, block_size): (usize, usize, usize, usize),
    n_seqs: usize,
    depth: usize,
    tokens: usize,
) -> AttentionCase {
    let max_blocks_per_seq = (depth + tokens).div_ceil(block_size);
    let num_blocks = n_seqs * max_blocks_per_seq + 1;
    let ids = shuffled_blocks(rng, num_blocks);
    let block_tables = ids[..n_seqs * max_blocks_per_seq].to_vec();
    let (mut token_seq, mut context_lens) = (Vec::new(), Vec::new());
    for s in 0..n_seqs {
        for k in 0..tokens {
            token_seq.push(s as i32);
            context_lens.push((depth + k + 1) as i32);
        }
    }
    with_random_data(
        rng,
        AttentionShape {
            n_heads,
            n_kv_heads,
            head_dim,
            block_size,
            num_blocks,
        },
        (block_tables, max_blocks_per_seq),
        (token_seq, context_lens),
    )
}

#[test]
fn prefill_attention_is_bit_identical_to_the_reference_and_to_each_token_alone() {
    // A prompt's tokens share each pass over their keys (up to 64 queries of a GQA group: several
    // tokens times the group's heads), scored one query at a time and their values added two
    // queries at a time: odd and even numbers of queries, 1 to 70 tokens, keys ending mid-chunk
    // and mid-span, after 0 to 150 keys of context, for the GQA shapes of the models (SmolLM2 9/3,
    // Qwen2.5 0.5B 14/2, Qwen 1.5B 12/2 of 128, Gemma 3 4/1 of 256 with windows) and odd ones.
    let _guard = lock_isa();
    let mut rng = Rng(13);
    let shapes = [
        (9, 3, 64, 16),
        (14, 2, 64, 16),
        (12, 2, 128, 16),
        (4, 1, 256, 16),
        (6, 2, 64, 7),
        (5, 5, 32, 16),
    ];
    for isa in simd_isas() {
        for &shape in &shapes {
            for (n_seqs, depth, tokens) in [
                (1, 0, 1),
                (1, 0, 70),
                (2, 5, 21),
                (1, 150, 22),
                (2, 37, 3),
                (1, 61, 64),
            ] {
                let c = prefill_case(&mut rng, shape, n_seqs, depth, tokens);
                for window in [None, Some(37)] {
                    let what = format!(
                        "{isa} shape {shape:?}, {n_seqs} sequences x {tokens} tokens after {depth}, window {window:?}"
                    );
                    check_attention(isa, &c, window, &what, true);
                }
            }
        }
    }
}

#[test]
fn decode_attention_is_bit_identical_to_the_reference() {
    // One token: with a pool of threads that does not divide the GQA groups (CI's 2 threads and
    // SmolLM2's 3 groups), up to 1,024 keys, the kernel gets half the heads per task, a group's
    // heads split between two tasks (each converts that group's keys); past 1,024 whole groups.
    let _guard = lock_isa();
    let mut rng = Rng(14);
    let shapes = [
        (9, 3, 64, 16),
        (15, 5, 64, 16),
        (14, 2, 64, 16),
        (12, 2, 128, 16),
        (4, 1, 256, 16),
        (6, 3, 32, 7),
    ];
    for isa in simd_isas() {
        for &shape in &shapes {
            for keys in [1, 9, 100, 1024, 1025] {
                let c = prefill_case(&mut rng, shape, 1, keys - 1, 1);
                for window in [None, Some(37)] {
                    let what = format!("{isa} shape {shape:?}, {keys} keys, window {window:?}");
                    check_attention(isa, &c, window, &what, false);
                }
            }
        }
    }
}

// ---- The whole model -------------------------------------------------------------------------

#[test]
fn model_logits_are_bit_identical_on_every_isa() {
    let _guard = lock_isa();
    let model = support::model();
    let prompt = model
        .tokenizer
        .encode(
            "The quick brown fox jumps over the lazy dog. In 1905, Albert Einstein published four papers",
            false,
            true,
        )
        .unwrap();
    // A chunked prefill with every row's logits, then decode steps of one token.
    let run = |isa| {
        on(isa, || {
            let mut runner = SequenceRunner::new(model, 64, 16);
            let mut logits = runner.eval(&prompt[..9], true).unwrap();
            logits.extend(runner.eval(&prompt[9..], true).unwrap());
            for &t in &[13u32, 297, 1553, 30] {
                logits.extend(runner.eval(&[t], false).unwrap());
            }
            logits
        })
    };
    let want = run(Isa::Scalar);
    for isa in simd_isas() {
        let got = run(isa);
        if let Some(d) = first_difference(&got, &want) {
            panic!("{isa}: logit {} is {}, the reference's {}", d.0, d.1, d.2);
        }
    }
}

// ---- Throughput ------------------------------------------------------------------------------

/// Attention in f64, straight from the definition: softmax over the keys in the window of
/// (q . k) * scale, weights times values; K and V read from the f16 cache.
fn naive_attention(c: &AttentionCase, window: Option<usize>, scale: f64) -> Vec<f64> {
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
                        .map(|d| q[d] as f64 * f(c.k_cache[at(j) + d]))
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            let o = &mut out[(t * s.n_heads + h) * hd..][..hd];
            for (j, w) in (first..len).zip(&weights) {
                for d in 0..hd {
                    o[d] += w / total * f(c.v_cache[at(j) + d]);
                }
            }
        }
    }
    out
}

#[test]
fn paged_attention_matches_the_definition() {
    // The reference (and so every ISA, bit for bit) against f64 softmax attention: chunked online
    // softmax and its own exp cost a few f32 roundings (measured: 1.1e-6 at worst). Peaked and flat softmaxes, windows,
    // partial chunks, head sizes 64, 256 and 6.
    let _guard = lock_isa();
    let mut rng = Rng(13);
    for isa in available_isas() {
        for (n_heads, n_kv_heads, head_dim, block_size) in
            [(9, 3, 64, 16), (8, 1, 256, 16), (3, 3, 6, 1)]
        {
            let c = attention_case(&mut rng, n_heads, n_kv_heads, head_dim, block_size);
            for window in [None, Some(5)] {
                let got = on(isa, || run_attention(&c, window));
                let want = naive_attention(&c, window, 1.0 / (head_dim as f64).sqrt());
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(&g, &w)| (g as f64 - w).abs())
                    .fold(0.0, f64::max);
                // Outputs are averages of N(0, 1) values: about 1 in size.
                assert!(worst < 1e-5, "{isa} attention {n_heads}/{n_kv_heads} heads of {head_dim}, window {window:?}: worst error {worst:e}");
            }
        }
    }
}

// ---- The IQ types (csrc/quants_iq_avx2.c, quants_iq_neon.c) ---------------------------------

const IQ_TYPES: [TensorType; 10] = [
    TensorType::IQ4_NL,
    TensorType::IQ4_XS,
    TensorType::IQ3_S,
    TensorType::IQ3_XXS,
    TensorType::IQ2_XXS,
    TensorType::IQ2_XS,
    TensorType::IQ2_S,
    TensorType::IQ1_S,
    TensorType::IQ1_M,
    TensorType::MXFP4,
];

/// `n_blocks` IQ blocks of random bytes (every byte pattern is a valid block: any index selects
/// a grid point, any bit a sign or a scale) with a finite f16 super-scale of either sign; every
/// eighth block is all ones but the scale (the largest sub-scales and indices: the integer sums'
/// worst case).
fn iq_blocks(t: TensorType, n_blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let bb = t.block_bytes();
    let mut out: Vec<u8> = (0..n_blocks * bb).map(|_| rng.next_u64() as u8).collect();
    for (i, block) in out.chunks_exact_mut(bb).enumerate() {
        if i % 8 == 7 {
            block.fill(0xff);
        }
        let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
        let d = half::f16::from_f32(sign * (1e-3 + 0.05 * rng.uniform() as f32)).to_bits();
        if t == TensorType::IQ1_M {
            // The super-scale's four nibbles sit in the top nibbles of the four scale words.
            let scales = &mut block[48..56];
            for k in 0..4 {
                let word = u16::from_le_bytes([scales[2 * k], scales[2 * k + 1]]);
                let word = (word & 0x0fff) | (((d >> (4 * k)) & 0xf) << 12);
                scales[2 * k..2 * k + 2].copy_from_slice(&word.to_le_bytes());
            }
        } else if t == TensorType::MXFP4 {
            // An E8M0 scale byte, 2^-28 .. 2^3 (MXFP4 has no sign on its scale: the codes do).
            block[0] = 100 + rng.below(32) as u8;
        } else {
            block[..2].copy_from_slice(&d.to_le_bytes());
        }
    }
    out
}

/// Activation rows for the IQ tests: normal data with outliers, uniform data, and rows of +-1
/// (every quant +-127, the largest products) in turn.
fn iq_activations(rng: &mut Rng, n: usize, k: usize) -> Vec<f32> {
    match k % 3 {
        0 => test_data(rng, n),
        1 => uniform_data(rng, n),
        _ => (0..n)
            .map(|_| if rng.below(2) == 0 { 1.0 } else { -1.0 })
            .collect(),
    }
}

#[test]
fn iq_vec_dot_is_bit_identical_to_the_reference() {
    let _guard = lock_isa();
    let mut rng = Rng(31);
    let isas = simd_isas();
    for t in IQ_TYPES {
        for n in [256usize, 512, 1536, 4864] {
            for k in 0..12 {
                let w = iq_blocks(t, n / t.block_size(), &mut rng);
                let x = iq_activations(&mut rng, n, k);
                let a = on(Isa::Scalar, || quantize_rows(t.vec_dot_type(), &x, n));
                let want = on(Isa::Scalar, || vec_dot(t, n, &w, &a));
                assert!(want.is_finite(), "{t}: the reference gave {want}");
                for &isa in &isas {
                    let got = on(isa, || vec_dot(t, n, &w, &a));
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{isa} {t} vec_dot over {n} (case {k}): {got} vs the reference's {want}"
                    );
                }
            }
        }
    }
    eprintln!("IQ vec_dot checked on {isas:?}");
}

#[test]
fn iq_matmul_equals_vec_dot_on_every_isa() {
    // Every tile shape, partial tiles included; every element equals the reference's vec_dot.
    let _guard = lock_isa();
    let mut rng = Rng(32);
    for t in IQ_TYPES {
        let n_in = 512;
        let rows = *MM_BATCHES.iter().max().unwrap();
        let w = iq_blocks(t, MM_N_OUT * n_in / t.block_size(), &mut rng);
        let x = iq_activations(&mut rng, rows * n_in, 0);
        let a = on(Isa::Scalar, || quantize_rows(t.vec_dot_type(), &x, n_in));
        let (w_rb, a_rb) = (w.len() / MM_N_OUT, a.len() / rows);
        let want: Vec<f32> = on(Isa::Scalar, || {
            (0..rows * MM_N_OUT)
                .map(|i| {
                    let (r, o) = (i / MM_N_OUT, i % MM_N_OUT);
                    vec_dot(t, n_in, &w[o * w_rb..][..w_rb], &a[r * a_rb..][..a_rb])
                })
                .collect()
        });
        for isa in available_isas() {
            set_isa(isa).unwrap();
            for n_rows in MM_BATCHES {
                let mut out = vec![f32::NAN; n_rows * MM_N_OUT];
                matmul(t, &w, n_in, MM_N_OUT, &a[..n_rows * a_rb], n_rows, &mut out);
                if let Some(d) = first_difference(&out, &want[..n_rows * MM_N_OUT]) {
                    panic!(
                        "{isa} {t} batch of {n_rows}: row {} output {} is {}, the reference's {}",
                        d.0 / MM_N_OUT,
                        d.0 % MM_N_OUT,
                        d.1,
                        d.2
                    );
                }
            }
        }
    }
}

#[test]
fn rope_ext_is_bit_identical_to_the_reference() {
    // llama3's frequency factors, YaRN, both, on every head shape the plain rope test uses.
    let _guard = lock_isa();
    let mut rng = Rng(33);
    for isa in simd_isas() {
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            for (head_dim, rope_dim) in [(64, 64), (128, 128), (80, 80), (64, 32), (6, 6), (96, 94)]
            {
                let factors: Vec<f32> = (0..rope_dim / 2)
                    .map(|i| 1.0 + (i % 5) as f32 * 1.75)
                    .collect();
                for (with_factors, with_yarn) in [(true, false), (false, true), (true, true)] {
                    let r = Rope {
                        head_dim,
                        rope_dim,
                        freq_base: 500_000.0,
                        freq_scale: if with_yarn { 0.25 } else { 1.0 },
                        style,
                        freq_factors: with_factors.then(|| FreqFactors::new(&factors).unwrap()),
                        yarn: with_yarn.then(|| Yarn::new(rope_dim, 4096, 500_000.0, 0.25)),
                    };
                    let n_heads = 3;
                    let pos: Vec<i32> = vec![0, 1, 17, 4095, 16_000, 123_456];
                    let x = test_data(&mut rng, pos.len() * n_heads * head_dim);
                    let run = |isa| {
                        on(isa, || {
                            let mut y = x.clone();
                            rope(&mut y, &pos, n_heads, &r);
                            y
                        })
                    };
                    let (want, got) = (run(Isa::Scalar), run(isa));
                    assert!(want != x, "the rope changed nothing");
                    if let Some(d) = first_difference(&got, &want) {
                        panic!(
                            "{isa} rope_ext {style:?} {head_dim}/{rope_dim} factors {with_factors} yarn {with_yarn}: \
                             element {} is {}, the reference's {}",
                            d.0, d.1, d.2
                        );
                    }
                }
            }
        }
    }
}
