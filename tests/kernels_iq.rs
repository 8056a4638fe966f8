//! The IQ tensor types (`csrc/quants_iq.c`) against independent references:
//! - dequantization bit for bit against the `gguf` package's numpy dequantizers (`gguf.quants`,
//!   run through scripts/synth/dequant_ref.py), on random blocks and on the blocks llama.cpp's
//!   `llama-quantize` wrote into tests/synth/iq/ (with a synthetic importance matrix);
//! - dot products against the f64 dot of the dequantized weights with the unquantized
//!   activations, within a named budget (the activations are quantized to Q8_0 / Q8_K);
//! - the matrix product equal to vec_dot bit for bit; IQ4_NL and IQ4_XS quantizers round-trip
//!   in tests/kernels_quant.rs.
//!
//! The Python reference needs `gguf` and `numpy`: scripts/test.sh installs them into
//! target/synth-venv (EDGE_LLM_SYNTH_PYTHON overrides the interpreter). Without them the
//! comparison is skipped, or fails under CI=true.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use edge_llm::gguf::GgufFile;
use edge_llm::kernels::tensor_type::TensorType;
use edge_llm::kernels::{dequantize_row, matmul, quantize_rows, vec_dot};
use half::f16;

const IQ_TYPES: [TensorType; 9] = [
    TensorType::IQ4_NL,
    TensorType::IQ4_XS,
    TensorType::IQ3_S,
    TensorType::IQ3_XXS,
    TensorType::IQ2_S,
    TensorType::IQ2_XS,
    TensorType::IQ2_XXS,
    TensorType::IQ1_M,
    TensorType::IQ1_S,
];

use support::splitmix::Rng;
use support::{root, skip_or_fail};

/// This file's draws, in f32 (its inputs since it was written; the shared ones are f64).
impl Rng {
    fn uniform_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn normal_f32(&mut self) -> f32 {
        let (u, v) = (self.uniform_f32().max(1e-7), self.uniform_f32());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
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

/// `blocks` of type `t` dequantized by gguf.quants.
fn gguf_dequantize(py: &Path, t: TensorType, blocks: &[u8]) -> Vec<f32> {
    // One folder per call: the tests run in parallel threads of one process.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("edge-llm-iq-{}-{call}-{t}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (inp, out) = (dir.join("in.bin"), dir.join("out.bin"));
    std::fs::write(&inp, blocks).unwrap();
    let status = Command::new(py)
        .arg(root().join("scripts/synth/dequant_ref.py"))
        .arg(t.name())
        .arg(&inp)
        .arg(&out)
        .status()
        .expect("run dequant_ref.py");
    assert!(status.success(), "dequant_ref.py {t} failed");
    let bytes = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// `n_blocks` blocks of random bytes whose f16 scale is a finite positive value (every other
/// byte pattern is a valid block: any index selects a grid point, any bit a sign or a scale).
fn random_blocks(t: TensorType, n_blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let bb = t.block_bytes();
    let mut out: Vec<u8> = (0..n_blocks * bb).map(|_| rng.next_u64() as u8).collect();
    for block in out.chunks_exact_mut(bb) {
        let d = f16::from_f32(0.001 + 0.05 * rng.uniform_f32()).to_bits();
        if t == TensorType::IQ1_M {
            // The super-scale's four nibbles sit in the top nibbles of the four scale words.
            let scales = &mut block[48..56];
            for k in 0..4 {
                let word = u16::from_le_bytes([scales[2 * k], scales[2 * k + 1]]);
                let word = (word & 0x0fff) | (((d >> (4 * k)) & 0xf) << 12);
                scales[2 * k..2 * k + 2].copy_from_slice(&word.to_le_bytes());
            }
        } else {
            block[..2].copy_from_slice(&d.to_le_bytes());
        }
    }
    out
}

/// The first rows of every `t` matrix llama-quantize wrote into any of tests/synth/iq/*.gguf
/// (its type mixtures put some types in other files: IQ2_S blocks come with the IQ3_XXS model),
/// or None when the folder is missing (after `skip_or_fail`).
fn llama_quantize_blocks(t: TensorType) -> Option<Vec<u8>> {
    let dir = root().join("tests/synth/iq");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        skip_or_fail(&format!(
            "{} (scripts/synth/refs.sh writes it)",
            dir.display()
        ));
        return None;
    };
    let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    let mut out = Vec::new();
    for path in files
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
    {
        let g = GgufFile::open(path).unwrap();
        for info in g.tensors().iter().filter(|i| i.ttype == t) {
            let data = g.tensor_data(info);
            out.extend_from_slice(&data[..data.len().min(4 * info.row_bytes())]);
        }
    }
    assert!(
        !out.is_empty(),
        "{}: no {t} tensor in any file",
        dir.display()
    );
    Some(out)
}

fn ours(t: TensorType, blocks: &[u8]) -> Vec<f32> {
    let mut y = vec![0.0; blocks.len() / t.block_bytes() * t.block_size()];
    dequantize_row(t, blocks, &mut y);
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

#[test]
fn iq_dequantization_is_bit_identical_to_gguf_quants_on_random_blocks() {
    let Some(py) = python() else { return };
    let mut rng = Rng(19);
    for t in IQ_TYPES {
        let n_blocks = if t.block_size() == 32 { 256 } else { 64 };
        let blocks = random_blocks(t, n_blocks, &mut rng);
        let want = gguf_dequantize(&py, t, &blocks);
        let got = ours(t, &blocks);
        assert_eq!(got.len(), want.len(), "{t}");
        assert_eq!(
            first_difference(&got, &want),
            None,
            "{t}: (element, ours, gguf.quants)"
        );
        eprintln!("{t}: {} random blocks bit-identical", n_blocks);
    }
}

#[test]
fn iq_dequantization_is_bit_identical_to_gguf_quants_on_llama_quantize_blocks() {
    let Some(py) = python() else { return };
    for t in IQ_TYPES {
        let Some(blocks) = llama_quantize_blocks(t) else {
            return;
        };
        let want = gguf_dequantize(&py, t, &blocks);
        let got = ours(t, &blocks);
        assert_eq!(
            first_difference(&got, &want),
            None,
            "{t}: (element, ours, gguf.quants)"
        );
        // Blocks a quantizer wrote are not all zeros.
        assert!(got.iter().any(|&v| v != 0.0), "{t}");
        eprintln!(
            "{t}: {} llama-quantize blocks bit-identical",
            blocks.len() / t.block_bytes()
        );
    }
}

/// |vec_dot - w.a| / (|w| |a|): the weights as dequantized, the activations unquantized. Only the
/// activation's quantization to Q8_0 / Q8_K (and f32 rounding) separates the two: about the
/// Q8 round-trip error (1 / 254 of each block's largest magnitude) over sqrt(n); measured 4e-4 to 6e-4.
const DOT_BUDGET: f64 = 1e-3;

#[test]
fn iq_dot_products_within_budget_and_matmul_equals_vec_dot() {
    let mut rng = Rng(7);
    const N_IN: usize = 1024;
    const N_OUT: usize = 8;
    const N_ROWS: usize = 3;
    for t in IQ_TYPES {
        let w = random_blocks(t, N_OUT * N_IN / t.block_size(), &mut rng);
        let w_deq = ours(t, &w);
        let a: Vec<f32> = (0..N_ROWS * N_IN).map(|_| rng.normal_f32()).collect();
        let aq = quantize_rows(t.vec_dot_type(), &a, N_IN);
        let (w_rb, a_rb) = (w.len() / N_OUT, aq.len() / N_ROWS);
        let mut out = vec![0.0f32; N_ROWS * N_OUT];
        matmul(t, &w, N_IN, N_OUT, &aq, N_ROWS, &mut out);
        let mut worst = 0.0f64;
        for o in 0..N_OUT {
            for r in 0..N_ROWS {
                let got = vec_dot(
                    t,
                    N_IN,
                    &w[o * w_rb..(o + 1) * w_rb],
                    &aq[r * a_rb..(r + 1) * a_rb],
                );
                assert_eq!(
                    got.to_bits(),
                    out[r * N_OUT + o].to_bits(),
                    "{t}: matmul row {r} col {o}"
                );
                let (wr, ar) = (
                    &w_deq[o * N_IN..(o + 1) * N_IN],
                    &a[r * N_IN..(r + 1) * N_IN],
                );
                let exact: f64 = wr.iter().zip(ar).map(|(&x, &y)| x as f64 * y as f64).sum();
                let norm = |v: &[f32]| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
                worst = worst.max((got as f64 - exact).abs() / (norm(wr) * norm(ar)));
            }
        }
        eprintln!("{t}: dot error {worst:.2e} of |w| |a| (budget {DOT_BUDGET:.0e})");
        assert!(worst < DOT_BUDGET, "{t}: dot error {worst:.3e}");
    }
}

#[test]
fn codebook_iq_types_refuse_to_quantize_and_iq4_types_do() {
    for t in IQ_TYPES {
        let quantizable = matches!(t, TensorType::IQ4_NL | TensorType::IQ4_XS);
        assert_eq!(t.has_quantizer(), quantizable, "{t}");
    }
    // A row quantized by our IQ4 quantizers dequantizes to values from the IQ4 grid.
    let mut rng = Rng(3);
    let x: Vec<f32> = (0..512).map(|_| rng.normal_f32()).collect();
    for t in [TensorType::IQ4_NL, TensorType::IQ4_XS] {
        let q = quantize_rows(t, &x, 512);
        let y = ours(t, &q);
        let err: f64 = x
            .iter()
            .zip(&y)
            .map(|(&a, &b)| ((a - b) as f64).powi(2))
            .sum();
        let rms: f64 = x.iter().map(|&a| (a as f64).powi(2)).sum();
        assert!((err / rms).sqrt() < 0.15, "{t}: {}", (err / rms).sqrt());
    }
}
