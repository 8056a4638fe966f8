//! The MXFP4 tensor type (`csrc/quants_mxfp4.c`, gpt-oss's expert weights) against independent
//! references:
//! - dequantization bit for bit against the `gguf` package's numpy dequantizer (`gguf.quants`,
//!   through scripts/synth/dequant_ref.py) on random blocks with every scale byte 0..=255, and on
//!   the MXFP4 blocks llama.cpp's `llama-quantize` wrote for the synthetic gpt-oss file
//!   (tests/synth/quant/gpt-oss-MXFP4.gguf);
//! - the quantizer byte for byte against gguf.quants' (a port of ggml's quantize_row_mxfp4_ref);
//! - the dot product against Q8_0 activations within a named budget of the f64 dot of the
//!   dequantized weights with the unquantized activations, and the matrix product equal to
//!   vec_dot bit for bit on every instruction set this machine has (the AVX2 and NEON variants
//!   against the reference are also in tests/kernels_simd.rs and tests/neon_qemu.rs).
//!
//! The Python reference needs `gguf` and `numpy` (target/synth-venv, as tests/kernels_iq.rs):
//! without them those comparisons are skipped, or fail under CI=true.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use edge_llm::gguf::GgufFile;
use edge_llm::kernels::tensor_type::TensorType;
use edge_llm::kernels::Isa;
use edge_llm::kernels::{available_isas, dequantize_row, matmul, quantize_rows, set_isa, vec_dot};

use support::isa_lock::lock_isa;
use support::splitmix::Rng;
use support::{root, skip_or_fail};

const T: TensorType = TensorType::MXFP4;

fn on<R>(isa: Isa, f: impl FnOnce() -> R) -> R {
    set_isa(isa).expect("available ISA");
    f()
}

/// The Python with `gguf` and `numpy`, or None (after `skip_or_fail`).
fn python() -> Option<PathBuf> {
    let py = std::env::var_os("EDGE_LLM_SYNTH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/synth-venv/bin/python"));
    let ok = Command::new(&py)
        .args(["-c", "import gguf, numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip_or_fail(&format!(
            "{} with the gguf and numpy packages (scripts/test.sh makes target/synth-venv)",
            py.display()
        ));
        return None;
    }
    Some(py)
}

/// Runs scripts/synth/dequant_ref.py with `args` then IN and OUT files, `input` written to IN;
/// returns OUT's bytes.
fn gguf_ref(py: &Path, args: &[&str], input: &[u8]) -> Vec<u8> {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("edge-llm-mxfp4-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (inp, out) = (dir.join("in.bin"), dir.join("out.bin"));
    std::fs::write(&inp, input).unwrap();
    let status = Command::new(py)
        .arg(root().join("scripts/synth/dequant_ref.py"))
        .args(args)
        .arg(&inp)
        .arg(&out)
        .status()
        .expect("run dequant_ref.py");
    assert!(status.success(), "dequant_ref.py {args:?} failed");
    let bytes = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    bytes
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn ours(blocks: &[u8]) -> Vec<f32> {
    let mut y = vec![0.0; blocks.len() / T.block_bytes() * T.block_size()];
    dequantize_row(T, blocks, &mut y);
    y
}

/// Index and values of the first element where `a` and `b` differ in bits.
fn first_difference(a: &[f32], b: &[f32]) -> Option<(usize, f32, f32)> {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
        .map(|i| (i, a[i], b[i]))
}

/// `n_blocks` blocks of random codes whose scale bytes are drawn from `scales`.
fn random_blocks(n_blocks: usize, scales: std::ops::Range<usize>, rng: &mut Rng) -> Vec<u8> {
    let mut out: Vec<u8> = (0..n_blocks * T.block_bytes())
        .map(|_| rng.next_u64() as u8)
        .collect();
    for block in out.chunks_exact_mut(T.block_bytes()) {
        block[0] = (scales.start + rng.below(scales.len())) as u8;
    }
    out
}

#[test]
fn mxfp4_dequantization_is_bit_identical_to_gguf_quants_on_every_scale() {
    let Some(py) = python() else { return };
    let mut rng = Rng(39);
    // Every scale byte (the subnormal 2^-128 and 2^-127, 2^127 whose products overflow to
    // infinity) with random codes, and 512 more blocks of ordinary scales.
    let mut blocks = random_blocks(256, 0..256, &mut rng);
    for (e, block) in blocks.chunks_exact_mut(T.block_bytes()).enumerate() {
        block[0] = e as u8;
    }
    blocks.extend(random_blocks(512, 100..150, &mut rng));
    let want = f32s(&gguf_ref(&py, &["MXFP4"], &blocks));
    let got = ours(&blocks);
    assert_eq!(got.len(), want.len());
    assert_eq!(
        first_difference(&got, &want),
        None,
        "(element, ours, gguf.quants)"
    );
    eprintln!("MXFP4: 768 random blocks bit-identical to gguf.quants");
}

#[test]
fn mxfp4_quantizer_is_byte_identical_to_gguf_quants() {
    let Some(py) = python() else { return };
    let mut rng = Rng(40);
    // Normal data, data with outliers, exact grid values and ties between two codes.
    let mut x: Vec<f32> = (0..4096).map(|_| rng.normal()).collect();
    x.extend((0..1024).map(|i| {
        if i % 37 == 0 {
            40.0
        } else {
            rng.normal() * 0.01
        }
    }));
    x.extend((0..1024).map(|i| [0.5f32, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -6.0][i % 8]));
    x.extend((0..1024).map(|i| [0.25f32, 1.25, 2.5, 5.0, -3.5, 6.0, 0.0, 0.75][i % 8]));
    let input: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let want = gguf_ref(&py, &["--quantize", "MXFP4"], &input);
    let got = quantize_rows(T, &x, x.len());
    assert_eq!(got.len(), want.len());
    let diff = got.iter().zip(&want).position(|(a, b)| a != b);
    assert_eq!(
        diff,
        None,
        "first differing byte (block {:?})",
        diff.map(|i| i / 17)
    );
    eprintln!(
        "MXFP4: {} blocks quantized byte-identical to gguf.quants",
        x.len() / 32
    );
}

#[test]
fn mxfp4_dequantization_is_bit_identical_to_gguf_quants_on_llama_quantize_blocks() {
    let Some(py) = python() else { return };
    // The block matrices llama-quantize MXFP4_MOE wrote, committed (LLAMA_CPP=newest
    // scripts/synth/refs.sh gpt-oss-MXFP4 rewrites them).
    let path = root().join("tests/synth/quant/gpt-oss-MXFP4.gguf");
    let g = GgufFile::open(&path).unwrap();
    let mut blocks = Vec::new();
    for info in g.tensors().iter().filter(|i| i.ttype == T) {
        let data = g.tensor_data(info);
        blocks.extend_from_slice(&data[..data.len().min(64 * info.row_bytes())]);
    }
    assert!(!blocks.is_empty(), "{}: no MXFP4 tensor", path.display());
    let want = f32s(&gguf_ref(&py, &["MXFP4"], &blocks));
    let got = ours(&blocks);
    assert_eq!(
        first_difference(&got, &want),
        None,
        "(element, ours, gguf.quants)"
    );
    assert!(got.iter().any(|&v| v != 0.0));
    eprintln!(
        "MXFP4: {} llama-quantize blocks bit-identical",
        blocks.len() / T.block_bytes()
    );
}

/// |vec_dot - w.a| / (|w| |a|): only the activations' Q8_0 rounding (1 / 254 of each block's
/// largest magnitude, over sqrt(n)) separates the two; measured about 5e-4.
const DOT_BUDGET: f64 = 1e-3;

#[test]
fn mxfp4_dot_within_budget_and_matmul_equals_vec_dot_on_every_isa() {
    let _guard = lock_isa();
    let mut rng = Rng(7);
    const N_IN: usize = 1024;
    const N_OUT: usize = 11; // not a multiple of the tiles' widths
    for n_rows in [1usize, 2, 3, 5] {
        let w = random_blocks(N_OUT * N_IN / 32, 110..140, &mut rng);
        let w_deq = ours(&w);
        let a: Vec<f32> = (0..n_rows * N_IN).map(|_| rng.normal()).collect();
        let aq = quantize_rows(T.vec_dot_type(), &a, N_IN);
        let (w_rb, a_rb) = (w.len() / N_OUT, aq.len() / n_rows);
        let reference = on(Isa::Scalar, || {
            let mut out = vec![0.0f32; n_rows * N_OUT];
            matmul(T, &w, N_IN, N_OUT, &aq, n_rows, &mut out);
            out
        });
        let mut worst = 0.0f64;
        for isa in available_isas() {
            let out = on(isa, || {
                let mut out = vec![0.0f32; n_rows * N_OUT];
                matmul(T, &w, N_IN, N_OUT, &aq, n_rows, &mut out);
                out
            });
            for o in 0..N_OUT {
                for r in 0..n_rows {
                    let (wr, ar) = (&w[o * w_rb..][..w_rb], &aq[r * a_rb..][..a_rb]);
                    let got = on(isa, || vec_dot(T, N_IN, wr, ar));
                    let (m, want) = (out[r * N_OUT + o], reference[r * N_OUT + o]);
                    assert_eq!(got.to_bits(), m.to_bits(), "{isa}: matmul row {r} col {o}");
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{isa} vs scalar: row {r} col {o}"
                    );
                    let (wd, af) = (&w_deq[o * N_IN..][..N_IN], &a[r * N_IN..][..N_IN]);
                    let exact: f64 = wd.iter().zip(af).map(|(&x, &y)| x as f64 * y as f64).sum();
                    let norm =
                        |v: &[f32]| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
                    worst = worst.max((got as f64 - exact).abs() / (norm(wd) * norm(af)));
                }
            }
        }
        eprintln!(
            "MXFP4 {n_rows} rows: dot error {worst:.2e} of |w| |a| (budget {DOT_BUDGET:.0e})"
        );
        assert!(worst < DOT_BUDGET, "dot error {worst:.3e}");
    }
}
