//! Mamba-2's kernels (`csrc/ssm_scan.c`, the C references; the scan's AVX2 form in
//! `csrc/ssm_scan_avx2.c`, run here under every available ISA) on random data:
//! the causal convolution (`el_ssm_conv`), the selective scan (`el_ssm_scan`) and the gate and
//! grouped norm (`el_ssm_gate_norm`) against the formulas written out here in plain Rust, bit for
//! bit (the same f32 operations in the same order, libm's exp and log on both sides); a chunk of
//! tokens equal, bit for bit, to its tokens one at a time (the prefill and decode forms) with
//! the state left where the last token leaves it; a reset starting from zeros.

mod support;

use edge_llm::kernels::rms_norm_inplace;
use edge_llm::kernels::ssm::{ssm_conv, ssm_gate_norm, ssm_scan, ScanInputs, SsmShape};
use edge_llm::kernels::{available_isas, set_isa};
use support::isa_lock::lock_isa;
use support::splitmix::Rng;

fn normals(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normal() as f32).collect()
}

fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

/// The convolution as the header states it: window rows t .. t + k of [state; x], summed in k
/// order from 0, plus the bias, through SiLU; the state the last d_conv - 1 inputs.
fn naive_conv(
    x: &[f32],
    stride: usize,
    w: &[f32],
    bias: &[f32],
    state: &[f32],
    d: usize,
    n: usize,
) -> (Vec<f32>, Vec<f32>) {
    let k = w.len() / d;
    let mut rows: Vec<Vec<f32>> = state.chunks(d).map(<[f32]>::to_vec).collect();
    for t in 0..n {
        rows.push(x[t * stride..t * stride + d].to_vec());
    }
    let mut y = vec![0.0f32; n * d];
    for t in 0..n {
        for ch in 0..d {
            let mut sum = 0.0f32;
            for j in 0..k {
                sum += rows[t + j][ch] * w[ch * k + j];
            }
            y[t * d + ch] = silu(sum + bias[ch]);
        }
    }
    (y, rows[rows.len() - (k - 1)..].concat())
}

/// The scan as ggml's Mamba-2 branch computes it (its scalar loop).
fn naive_scan(s: SsmShape, inp: &ScanInputs, state: &mut [f32], n: usize) -> Vec<f32> {
    let d_inner = s.d_inner();
    let mut y = vec![0.0f32; n * d_inner];
    for t in 0..n {
        for h in 0..s.n_head {
            let dt = inp.dt[t * inp.dt_stride + h] + inp.dt_bias[h];
            let sp = if dt > 20.0 { dt } else { (1.0 + dt.exp()).ln() };
            let da = (sp * inp.a[h]).exp();
            let g = h / (s.n_head / s.n_group);
            for i in 0..s.head_dim {
                let ii = h * s.head_dim + i;
                let x_dt = inp.x[t * inp.x_stride + ii] * sp;
                let mut sum = 0.0f32;
                for k in 0..s.d_state {
                    let b = inp.b[t * inp.bc_stride + g * s.d_state + k];
                    let c = inp.c[t * inp.bc_stride + g * s.d_state + k];
                    let v = state[ii * s.d_state + k] * da + b * x_dt;
                    sum += v * c;
                    state[ii * s.d_state + k] = v;
                }
                y[t * d_inner + ii] = sum;
            }
        }
    }
    y
}

fn random_shape(rng: &mut Rng) -> SsmShape {
    let n_group = 1 + rng.below(3);
    SsmShape {
        d_conv: 2 + rng.below(4),
        n_head: n_group * (1 + rng.below(3)),
        head_dim: 1 + rng.below(40),
        d_state: 1 + rng.below(40),
        n_group,
    }
}

#[test]
fn ssm_conv_is_the_formula_and_chunks_equal_single_tokens() {
    let mut rng = Rng(41);
    for case in 0..40 {
        let d = 1 + rng.below(70);
        let k = 2 + rng.below(4);
        let n = 1 + rng.below(40);
        let stride = d + rng.below(9);
        let x = normals(&mut rng, n * stride);
        let w = normals(&mut rng, d * k);
        let bias = normals(&mut rng, d);
        let state0 = normals(&mut rng, (k - 1) * d);
        let (want_y, want_state) = naive_conv(&x, stride, &w, &bias, &state0, d, n);

        let mut state = state0.clone();
        let mut y = vec![f32::NAN; n * d];
        ssm_conv(&x, stride, &w, Some(&bias), &mut state, false, d, &mut y);
        assert_eq!(y, want_y, "case {case}: d {d}, window {k}, {n} tokens");
        assert_eq!(state, want_state, "case {case}: the state after");

        let mut state1 = state0.clone();
        let mut y1 = Vec::new();
        for t in 0..n {
            let mut yt = vec![f32::NAN; d];
            let row = &x[t * stride..t * stride + d];
            ssm_conv(row, stride, &w, Some(&bias), &mut state1, false, d, &mut yt);
            y1.extend(yt);
        }
        assert_eq!(
            (y1, state1),
            (want_y, want_state),
            "case {case}: single tokens"
        );

        let (zero_y, zero_state) = naive_conv(&x, stride, &w, &bias, &vec![0.0; (k - 1) * d], d, n);
        let mut state2 = state0.clone();
        ssm_conv(&x, stride, &w, Some(&bias), &mut state2, true, d, &mut y);
        assert_eq!(
            (y.clone(), state2),
            (zero_y, zero_state),
            "case {case}: reset"
        );
    }
}

#[test]
fn ssm_scan_is_ggmls_loop_and_chunks_equal_single_tokens_on_every_isa() {
    let _guard = lock_isa();
    for isa in available_isas() {
        set_isa(isa).unwrap();
        scan_cases(&format!("{isa:?}"));
    }
}

/// Decode steps of Granite-4.0-H-Tiny's head shape (48 heads of 64 channels, d_state 128, one
/// group) on each ISA: the outputs equal, and each one's time printed.
#[test]
fn ssm_scan_isas_agree_on_the_real_shape() {
    let _guard = lock_isa();
    let s = SsmShape {
        d_conv: 4,
        n_head: 48,
        head_dim: 64,
        d_state: 128,
        n_group: 1,
    };
    let mut rng = Rng(53);
    let n = 16;
    let (d_inner, bc) = (s.d_inner(), s.d_state);
    let stride = d_inner + 2 * bc + s.n_head;
    let rows = normals(&mut rng, n * stride);
    let dt_bias = normals(&mut rng, s.n_head);
    let a: Vec<f32> = (0..s.n_head).map(|h| -1.0 - h as f32 / 4.0).collect();
    let inp = ScanInputs {
        x: &rows,
        x_stride: stride,
        b: &rows[d_inner..],
        c: &rows[d_inner + bc..],
        bc_stride: stride,
        dt: &rows[d_inner + 2 * bc..],
        dt_stride: stride,
        dt_bias: &dt_bias,
        a: &a,
    };
    let state0 = normals(&mut rng, s.scan_state_floats());
    let mut results = Vec::new();
    for isa in available_isas() {
        set_isa(isa).unwrap();
        let mut state = state0.clone();
        let mut y = vec![0.0f32; n * d_inner];
        let start = std::time::Instant::now();
        for t in 0..n {
            let r = &rows[t * stride..(t + 1) * stride];
            let one = ScanInputs {
                x: r,
                b: &r[d_inner..],
                c: &r[d_inner + bc..],
                dt: &r[d_inner + 2 * bc..],
                ..inp
            };
            ssm_scan(
                s,
                &one,
                &mut state,
                false,
                &mut y[t * d_inner..(t + 1) * d_inner],
            );
        }
        let per_token = start.elapsed() / n as u32;
        println!(
            "{isa:?}: {per_token:?} per token-layer ({} state floats)",
            s.scan_state_floats()
        );
        results.push((isa, y, state));
    }
    for (isa, y, state) in &results[1..] {
        assert!(
            y == &results[0].1 && state == &results[0].2,
            "{isa:?} differs from {:?}",
            results[0].0
        );
    }
}

fn scan_cases(isa: &str) {
    let mut rng = Rng(43);
    for case in 0..40 {
        let s = random_shape(&mut rng);
        let n = 1 + rng.below(24);
        let (d_inner, bc) = (s.d_inner(), s.n_group * s.d_state);
        // One row per token as in_proj and the convolution lay them out: x, B, C, then dt.
        let stride = d_inner + 2 * bc + s.n_head + rng.below(5);
        let rows = normals(&mut rng, n * stride);
        let dt_bias: Vec<f32> = (0..s.n_head).map(|_| rng.normal() as f32 * 2.0).collect();
        // Decays A in [-16, -1], one head's dt pushed past softplus's cut at 20.
        let a: Vec<f32> = (0..s.n_head)
            .map(|_| -1.0 - 15.0 * rng.below(1000) as f32 / 1000.0)
            .collect();
        let mut rows = rows;
        rows[d_inner + 2 * bc] = 25.0;
        let inp = ScanInputs {
            x: &rows,
            x_stride: stride,
            b: &rows[d_inner..],
            c: &rows[d_inner + bc..],
            bc_stride: stride,
            dt: &rows[d_inner + 2 * bc..],
            dt_stride: stride,
            dt_bias: &dt_bias,
            a: &a,
        };
        let state0 = normals(&mut rng, s.scan_state_floats());
        let mut want_state = state0.clone();
        let want_y = naive_scan(s, &inp, &mut want_state, n);

        let mut state = state0.clone();
        let mut y = vec![f32::NAN; n * d_inner];
        ssm_scan(s, &inp, &mut state, false, &mut y);
        assert_eq!(y, want_y, "{isa} case {case}: {s:?}, {n} tokens");
        assert_eq!(state, want_state, "{isa} case {case}: the state after");

        let mut state1 = state0.clone();
        let mut y1 = Vec::new();
        for t in 0..n {
            let r = &rows[t * stride..(t + 1) * stride];
            let one = ScanInputs {
                x: r,
                b: &r[d_inner..],
                c: &r[d_inner + bc..],
                dt: &r[d_inner + 2 * bc..],
                ..inp
            };
            let mut yt = vec![f32::NAN; d_inner];
            ssm_scan(s, &one, &mut state1, false, &mut yt);
            y1.extend(yt);
        }
        assert_eq!(
            (y1, state1),
            (want_y, want_state),
            "case {case}: single tokens"
        );

        let mut zero_state = vec![0.0; s.scan_state_floats()];
        let zero_y = naive_scan(s, &inp, &mut zero_state, n);
        let mut state2 = state0;
        ssm_scan(s, &inp, &mut state2, true, &mut y);
        assert_eq!(
            (y, state2),
            (zero_y, zero_state),
            "{isa} case {case}: reset"
        );
    }
}

#[test]
fn ssm_gate_norm_is_the_skip_the_gate_and_each_groups_norm() {
    let mut rng = Rng(47);
    for case in 0..30 {
        let s = random_shape(&mut rng);
        let n = 1 + rng.below(10);
        let d_inner = s.d_inner();
        let (xs, zs) = (d_inner + rng.below(7), d_inner + rng.below(7));
        let x = normals(&mut rng, n * xs);
        let z = normals(&mut rng, n * zs);
        let d_skip = normals(&mut rng, s.n_head);
        let norm = normals(&mut rng, d_inner);
        let y0 = normals(&mut rng, n * d_inner);
        let group = d_inner / s.n_group;
        let mut want = y0.clone();
        for t in 0..n {
            let row = &mut want[t * d_inner..(t + 1) * d_inner];
            for (i, v) in row.iter_mut().enumerate() {
                let skip = *v + x[t * xs + i] * d_skip[i / s.head_dim];
                *v = silu(z[t * zs + i]) * skip;
            }
            for g in 0..s.n_group {
                let part = g * group..(g + 1) * group;
                rms_norm_inplace(&mut row[part.clone()], &norm[part], 1e-5);
            }
        }
        let mut y = y0.clone();
        ssm_gate_norm(s, &mut y, &x, xs, &z, zs, &d_skip, &norm, 1e-5);
        assert_eq!(y, want, "case {case}: {s:?}, {n} tokens");
    }
}
