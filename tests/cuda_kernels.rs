//! Every CUDA kernel against the C reference (`crate::kernels`) on random data, and the GPU
//! forward pass against the CPU one. Needs a GPU, so every test is `#[ignore]`d: CI compiles
//! this file (the `cuda` feature is on there) and scripts/bench-cuda.sh runs it on a GPU machine
//! with `--ignored`.
//!
//! Named error budgets, relative to the largest magnitude of the reference output. They are far
//! tighter than the CPU tests' quantization budgets (tests/kernels_quant.rs, e.g. 1e-2 for a
//! Q4_0 dot product), because the GPU computes the same quantized products as the C code and
//! differs only in the order of float additions:
//! - dequantization (embedding rows), the activation quantizers and the KV write: bit-identical;
//! - the two matrix-product kernels (few rows, tiled): bit-identical to each other;
//! - everything else within the constants below.
#![cfg(feature = "cuda")]

mod support;

use std::sync::OnceLock;

use edge_llm::cuda::kernels::{self as ck, DevAttentionBatch, MatmulKernel};
use edge_llm::cuda::Gpu;
use edge_llm::device::{Device, Executor};
use edge_llm::kernels::{self, Activation, AttentionBatch, AttentionShape, Rope, RopeStyle};
use edge_llm::model::Batch;
use edge_llm::tensor_type::TensorType;

/// Matrix products against `kernels::matmul`: float sums in another order.
const MATMUL_BUDGET: f64 = 2e-5;
/// RMSNorm (the double sum in another order).
const RMS_NORM_BUDGET: f64 = 1e-6;
/// RoPE (cos/sin from double precision against glibc's cosf/sinf).
const ROPE_BUDGET: f64 = 1e-6;
/// SwiGLU/GeGLU (exp/tanh from double precision against glibc's expf/tanhf).
const GLU_BUDGET: f64 = 1e-6;
/// Paged attention (an online softmax over chunks of 32 keys against one key at a time).
const ATTENTION_BUDGET: f64 = 1e-5;
/// The whole forward pass of the default model, logits against the CPU path's.
const FORWARD_LOGITS_BUDGET: f64 = 2e-3;

const WEIGHT_TYPES: [TensorType; 13] = [
    TensorType::F32,
    TensorType::F16,
    TensorType::BF16,
    TensorType::Q4_0,
    TensorType::Q4_1,
    TensorType::Q5_0,
    TensorType::Q5_1,
    TensorType::Q8_0,
    TensorType::Q2_K,
    TensorType::Q3_K,
    TensorType::Q4_K,
    TensorType::Q5_K,
    TensorType::Q6_K,
];

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    let g = GPU.get_or_init(|| Gpu::new().expect("a usable CUDA GPU (these tests need one)"));
    g.bind().unwrap();
    g
}

/// splitmix64, as the CPU kernel tests.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }

    /// `n` values ~N(0, 1), one in 64 scaled by 8 (outliers, as real rows have).
    fn data(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                if self.next_u64().is_multiple_of(64) {
                    8.0 * self.normal()
                } else {
                    self.normal()
                }
            })
            .collect()
    }
}

/// max |got - want| / max |want|.
fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want
        .iter()
        .fold(0f64, |m, &w| m.max(w.abs() as f64))
        .max(1e-30);
    got.iter()
        .zip(want)
        .fold(0f64, |m, (&g, &w)| m.max((g as f64 - w as f64).abs()))
        / scale
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn up<T: cudarc::driver::DeviceRepr>(v: &[T]) -> cudarc::driver::CudaSlice<T> {
    gpu().upload(v).unwrap()
}

fn zeros_f32(n: usize) -> cudarc::driver::CudaSlice<f32> {
    gpu().zeros::<f32>(n).unwrap()
}

fn down(buf: &cudarc::driver::CudaSlice<f32>, n: usize) -> Vec<f32> {
    gpu().download(buf, n).unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn embedding_rows_dequantize_bit_identically() {
    let g = gpu();
    let mut rng = Rng(1);
    let (n_in, n_rows) = (512, 7);
    for t in WEIGHT_TYPES {
        let x = rng.data(n_in * n_rows);
        let w = kernels::quantize_rows(t, &x, n_in);
        let rb = t.row_bytes(n_in).unwrap();
        let ids: Vec<i32> = vec![3, 0, 6, 6, 1];
        for scale in [1.0f32, 2.5] {
            let (dw, di, dout) = (up(&w), up(&ids), zeros_f32(ids.len() * n_in));
            ck::get_rows(
                g,
                t,
                g.ptr(&dw),
                n_rows,
                n_in,
                g.ptr(&di),
                ids.len(),
                g.ptr(&dout),
                scale,
            )
            .unwrap();
            let got = down(&dout, ids.len() * n_in);
            let mut want = vec![0f32; ids.len() * n_in];
            for (i, &id) in ids.iter().enumerate() {
                let row = &mut want[i * n_in..(i + 1) * n_in];
                kernels::dequantize_row(t, &w[id as usize * rb..(id as usize + 1) * rb], row);
                row.iter_mut().for_each(|v| *v *= scale);
            }
            assert_eq!(bits(&got), bits(&want), "{t} rows, scale {scale}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn activation_quantizers_are_byte_identical() {
    let g = gpu();
    let mut rng = Rng(2);
    let n_in = 512;
    for vdt in [
        TensorType::Q8_0,
        TensorType::Q8_1,
        TensorType::Q8_K,
        TensorType::F16,
        TensorType::BF16,
    ] {
        let mut x = rng.data(n_in * 6);
        x[n_in..2 * n_in].iter_mut().for_each(|v| *v = 0.0); // an all-zero row
        x[2 * n_in + 5] = -x[2 * n_in..3 * n_in]
            .iter()
            .fold(0f32, |m, v| m.max(v.abs())); // a tie for the largest magnitude
        let want = kernels::quantize_rows(vdt, &x, n_in);
        let (dx, dy) = (up(&x), g.zeros::<u8>(want.len()).unwrap());
        ck::quantize(g, vdt, g.ptr(&dx), 6, n_in, g.ptr(&dy)).unwrap();
        let got = g.download(&dy, want.len()).unwrap();
        let first = got.iter().zip(&want).position(|(a, b)| a != b);
        assert!(first.is_none(), "{vdt}: first differing byte {first:?}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_matches_the_c_reference_and_both_kernels_agree() {
    let g = gpu();
    let mut rng = Rng(3);
    let (n_in, n_out) = (768, 37);
    let mut report = Vec::new();
    for t in WEIGHT_TYPES {
        let w = kernels::quantize_rows(t, &rng.data(n_in * n_out), n_in);
        let dw = up(&w);
        for n_rows in [1usize, 5, 8, 9, 33] {
            let x = rng.data(n_in * n_rows);
            let a = kernels::quantize_rows(t.vec_dot_type(), &x, n_in);
            let mut want = vec![0f32; n_rows * n_out];
            kernels::matmul(t, &w, n_in, n_out, &a, n_rows, &mut want);
            let da = up(&a);
            let mut outs = Vec::new();
            for kernel in [MatmulKernel::Auto, MatmulKernel::Mmv, MatmulKernel::Tiled] {
                let dout = zeros_f32(n_rows * n_out);
                ck::matmul(
                    g,
                    t,
                    g.ptr(&dw),
                    g.ptr(&da),
                    n_in,
                    n_out,
                    n_rows,
                    g.ptr(&dout),
                    kernel,
                )
                .unwrap();
                outs.push(down(&dout, n_rows * n_out));
            }
            let err = rel_err(&outs[0], &want);
            report.push(format!("{t:>5} rows {n_rows:>2}: {err:.2e}"));
            assert!(
                err <= MATMUL_BUDGET,
                "{t} with {n_rows} rows: {err:.3e} > {MATMUL_BUDGET:e}"
            );
            assert_eq!(
                bits(&outs[1]),
                bits(&outs[2]),
                "{t} with {n_rows} rows: mmv and tiled differ"
            );
        }
    }
    eprintln!("{}", report.join("\n"));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn row_operations_match_the_c_reference() {
    let g = gpu();
    let mut rng = Rng(4);
    // RMSNorm: rows of 576 and of a head (QK-norm), in place.
    for n in [576usize, 64, 1000] {
        let (x, w) = (rng.data(n * 5), rng.data(n));
        let mut want = vec![0f32; x.len()];
        kernels::rms_norm(&x, &w, &mut want, 1e-5);
        let (dx, dw) = (up(&x), up(&w));
        ck::rms_norm(g, g.ptr(&dx), g.ptr(&dw), g.ptr(&dx), 5, n, 1e-5).unwrap();
        let err = rel_err(&down(&dx, x.len()), &want);
        assert!(err <= RMS_NORM_BUDGET, "rms_norm n={n}: {err:.3e}");
    }
    // RoPE, both styles, a partial rotary dimension, large positions.
    for (style, rope_dim, freq_scale) in [
        (RopeStyle::Normal, 64, 1.0f32),
        (RopeStyle::Neox, 64, 0.25),
        (RopeStyle::Neox, 32, 1.0),
    ] {
        let (n_tokens, n_heads, head_dim) = (9, 3, 64);
        let r = Rope {
            head_dim,
            rope_dim,
            freq_base: 10000.0,
            freq_scale,
            style,
        };
        let pos: Vec<i32> = (0..n_tokens as i32).map(|i| i * 517 + 3).collect();
        let mut want = rng.data(n_tokens * n_heads * head_dim);
        let dx = up(&want);
        kernels::rope(&mut want, &pos, n_heads, &r);
        let dp = up(&pos);
        ck::rope(g, g.ptr(&dx), g.ptr(&dp), n_tokens, n_heads, &r).unwrap();
        let err = rel_err(&down(&dx, want.len()), &want);
        assert!(
            err <= ROPE_BUDGET,
            "rope {style:?} dim {rope_dim}: {err:.3e}"
        );
    }
    // SwiGLU and GeGLU.
    for act in [Activation::SwiGlu, Activation::GeGlu] {
        let n = 4096;
        let (mut gate, upv) = (rng.data(n), rng.data(n));
        let (dg, du) = (up(&gate), up(&upv));
        kernels::glu_inplace(&mut gate, &upv, act);
        ck::glu(g, g.ptr(&dg), g.ptr(&du), n, act).unwrap();
        let err = rel_err(&down(&dg, n), &gate);
        assert!(err <= GLU_BUDGET, "{act:?}: {err:.3e}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn kv_write_and_paged_attention_match_the_c_reference() {
    let g = gpu();
    let mut rng = Rng(5);
    let (n_heads, n_kv_heads, head_dim, block_size, num_blocks) = (6, 2, 64, 16, 24);
    let kv_dim = n_kv_heads * head_dim;
    let num_slots = num_blocks * block_size;
    // Three sequences with shuffled block tables: a long prefill over a cached prefix (the
    // cache is filled first), a decode step, and a short one.
    let tables: Vec<Vec<i32>> = vec![vec![5, 17, 2, 9, 11, 0], vec![3, 22, 14], vec![7]];
    let max_blocks = 6;
    let mut block_tables = Vec::new();
    for t in &tables {
        block_tables.extend(t.iter().copied());
        block_tables.extend(std::iter::repeat_n(-1, max_blocks - t.len()));
    }
    let slot = |seq: usize, pos: usize| {
        tables[seq][pos / block_size] as i64 * block_size as i64 + (pos % block_size) as i64
    };
    // Fill every position of every sequence through kv_write (checked bit for bit).
    let mut all_slots = Vec::new();
    for (s, t) in tables.iter().enumerate() {
        for p in 0..t.len() * block_size {
            all_slots.push(slot(s, p));
        }
    }
    let n_all = all_slots.len();
    let (k, v) = (rng.data(n_all * kv_dim), rng.data(n_all * kv_dim));
    let (mut kc, mut vc) = (
        vec![0u16; num_slots * kv_dim],
        vec![0u16; num_slots * kv_dim],
    );
    kernels::kv_write(&k, &v, &mut kc, &mut vc, &all_slots, kv_dim);
    let (dk, dv, ds) = (up(&k), up(&v), up(&all_slots));
    let (dkc, dvc) = (
        g.zeros::<u16>(num_slots * kv_dim).unwrap(),
        g.zeros::<u16>(num_slots * kv_dim).unwrap(),
    );
    ck::kv_write(
        g,
        g.ptr(&dk),
        g.ptr(&dv),
        g.ptr(&dkc),
        g.ptr(&dvc),
        g.ptr(&ds),
        n_all,
        kv_dim,
        num_slots,
    )
    .unwrap();
    assert_eq!(g.download(&dkc, kc.len()).unwrap(), kc, "kv_write keys");
    assert_eq!(g.download(&dvc, vc.len()).unwrap(), vc, "kv_write values");

    // Queries: positions 40..90 of sequence 0 (prefill past a cached prefix), 47 of sequence 1,
    // 0..16 of sequence 2.
    let mut token_seq = Vec::new();
    let mut lens = Vec::new();
    for p in 40..90 {
        token_seq.push(0);
        lens.push(p + 1);
    }
    token_seq.push(1);
    lens.push(48);
    for p in 0..16 {
        token_seq.push(2);
        lens.push(p + 1);
    }
    let n_tokens = token_seq.len();
    let q = rng.data(n_tokens * n_heads * head_dim);
    let shape = AttentionShape {
        n_heads,
        n_kv_heads,
        head_dim,
        block_size,
        num_blocks,
    };
    let (dq, dt, dts, dl) = (up(&q), up(&block_tables), up(&token_seq), up(&lens));
    let db = DevAttentionBatch {
        block_tables: g.ptr(&dt),
        max_blocks_per_seq: max_blocks,
        n_seqs: tables.len(),
        token_seq: g.ptr(&dts),
        context_lens: g.ptr(&dl),
    };
    for window in [None, Some(7), Some(33)] {
        let mut want = vec![0f32; q.len()];
        let b = AttentionBatch {
            block_tables: &block_tables,
            max_blocks_per_seq: max_blocks,
            token_seq: &token_seq,
            context_lens: &lens,
        };
        kernels::paged_attention(&mut want, &q, &kc, &vc, &shape, &b, 0.125, window);
        let dout = zeros_f32(q.len());
        ck::paged_attention(
            g,
            g.ptr(&dout),
            g.ptr(&dq),
            g.ptr(&dkc),
            g.ptr(&dvc),
            &shape,
            &db,
            n_tokens,
            0.125,
            window,
        )
        .unwrap();
        let err = rel_err(&down(&dout, q.len()), &want);
        assert!(
            err <= ATTENTION_BUDGET,
            "attention window {window:?}: {err:.3e}"
        );
    }
}

/// A batch of one sequence: `tokens` at positions start.., blocks 0.. in order.
fn one_sequence(tokens: &[u32], start: usize, block_size: usize, all_logits: bool) -> Batch {
    let end = start + tokens.len();
    let table: Vec<u32> = (0..end.div_ceil(block_size) as u32).collect();
    let mut b = Batch {
        max_blocks_per_seq: table.len(),
        ..Default::default()
    };
    let seq = b.push_block_table(&table);
    for (i, &t) in tokens.iter().enumerate() {
        let p = start + i;
        b.push_token(
            t,
            p,
            table[p / block_size] as usize * block_size + p % block_size,
            seq,
            all_logits || i + 1 == tokens.len(),
        );
    }
    b
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold(0, |best, (i, &x)| if x > v[best] { i } else { best })
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn forward_pass_matches_the_cpu_and_copy_on_write_copies_blocks() {
    let model = support::model();
    let vocab = model.config.vocab_size;
    let bs = 16;
    let mut cpu = Executor::cpu(model, bs, 16);
    let mut gpu_exec =
        Executor::new(model, Device::Cuda, bs, 16).expect("the model loads onto the GPU");
    assert_eq!(gpu_exec.device(), Device::Cuda);
    let prompt = model
        .tokenizer
        .encode(
            "The capital of France is Paris, and the capital of Germany is",
            false,
            true,
        )
        .unwrap();
    // Prefill with every row's logits, then greedy decode step by step.
    let b = one_sequence(&prompt, 0, bs, true);
    let (lc, lg) = (
        cpu.forward(model, &b).unwrap(),
        gpu_exec.forward(model, &b).unwrap(),
    );
    let err = rel_err(&lg, &lc);
    eprintln!("prefill logits: {err:.3e}");
    assert!(
        err <= FORWARD_LOGITS_BUDGET,
        "prefill logits {err:.3e} > {FORWARD_LOGITS_BUDGET:e}"
    );
    let mut pos = prompt.len();
    let mut tok = argmax(&lc[(prompt.len() - 1) * vocab..]) as u32;
    assert_eq!(
        argmax(&lg[(prompt.len() - 1) * vocab..]) as u32,
        tok,
        "first greedy token"
    );
    for step in 0..24 {
        let b = one_sequence(&[tok], pos, bs, false);
        let (lc, lg) = (
            cpu.forward(model, &b).unwrap(),
            gpu_exec.forward(model, &b).unwrap(),
        );
        let err = rel_err(&lg, &lc);
        assert!(
            err <= FORWARD_LOGITS_BUDGET,
            "decode step {step}: {err:.3e}"
        );
        let (tc, tg) = (argmax(&lc), argmax(&lg));
        assert_eq!(tg, tc, "greedy token at decode step {step}");
        tok = tc as u32;
        pos += 1;
    }
    // Copy-on-write: block 0 onto block 9 on both, then a sequence whose table starts with 9
    // reads the copy: same logits as reading block 0.
    cpu.copy_block(0, 9).unwrap();
    gpu_exec.copy_block(0, 9).unwrap();
    let mut b = Batch {
        max_blocks_per_seq: 2,
        ..Default::default()
    };
    let seq = b.push_block_table(&[9, 10]);
    b.push_token(prompt[bs % prompt.len()], bs, 10 * bs, seq, true);
    let (lc, lg) = (
        cpu.forward(model, &b).unwrap(),
        gpu_exec.forward(model, &b).unwrap(),
    );
    let err = rel_err(&lg, &lc);
    assert!(err <= FORWARD_LOGITS_BUDGET, "after copy_block: {err:.3e}");
}
