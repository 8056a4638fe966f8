//! Qwen3.5's gated delta-net core (`el_delta_net_conv` + `el_delta_net_rule` through
//! `kernels::gated_delta_net`, which runs ranges of value heads on the pool; the C reference, no
//! SIMD variant yet) on random data, against the arithmetic written out here in plain Rust as llama.cpp's CPU ops do it
//! (ssm_conv, silu, rms_norm as the L2 norm, softplus, sigmoid, the fused gated_delta_net) — bit
//! for bit: the same f32 operations in the same order. Then the prefill and decode forms: a run
//! of tokens equal, bit for bit, to the same tokens cut into random chunks and to single tokens;
//! the conv state left holding the last projections; a reset starting from zeros whatever the
//! state held; value heads sharing q/k heads (n_v_heads a multiple of n_k_heads).

mod support;

use edge_llm::kernels::{gated_delta_net, DeltaNetParams, DeltaNetShape};
use support::splitmix::Rng;

fn normals(rng: &mut Rng, n: usize, s: f32) -> Vec<f32> {
    (0..n).map(|_| s * rng.normal() as f32).collect()
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

fn l2_norm(x: &mut [f32], eps: f32) {
    let n = x.len();
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / n as f64) as f32;
    let scale = 1.0 / (mean + eps / n as f32).sqrt();
    let post = 1.0 / (n as f32).sqrt();
    x.iter_mut().for_each(|v| *v *= scale);
    x.iter_mut().for_each(|v| *v *= post);
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        s += x * y;
    }
    s
}

/// The layer core as llama.cpp computes it: whole-sequence conv, then per token and head the
/// delta rule on the transposed state M[j][i] = S[i][j].
#[allow(clippy::too_many_arguments)]
fn naive(
    s: &DeltaNetShape,
    qkv: &[f32],
    alpha: &[f32],
    beta: &[f32],
    p: &DeltaNetParams<'_>,
    state: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let (cd, hd, hv, hk, dc) = (s.conv_dim(), s.head_dim, s.n_v_heads, s.n_k_heads, s.d_conv);
    let n = qkv.len() / cd;
    let (conv0, ssm0) = state.split_at(s.conv_state_floats());
    let mut rows: Vec<&[f32]> = conv0.chunks(cd).collect();
    rows.extend(qkv.chunks(cd));
    let mut m = ssm0.to_vec();
    let mut out = vec![0.0f32; n * hv * hd];
    for t in 0..n {
        let mut x: Vec<f32> = (0..cd)
            .map(|ch| {
                let mut sum = 0.0f32;
                for k in 0..dc {
                    sum += rows[t + k][ch] * p.conv_w[ch * dc + k];
                }
                silu(sum)
            })
            .collect();
        for h in 0..2 * hk {
            l2_norm(&mut x[h * hd..(h + 1) * hd], s.eps);
        }
        for h in 0..hv {
            let q = &x[(h % hk) * hd..][..hd];
            let k = &x[(hk + h % hk) * hd..][..hd];
            let v = &x[(2 * hk + h) * hd..][..hd];
            let g = softplus(alpha[t * hv + h] + p.dt_bias[h]) * p.a[h];
            let b = 1.0 / (1.0 + (-beta[t * hv + h]).exp());
            let mh = &mut m[h * hd * hd..(h + 1) * hd * hd];
            let decay = g.exp();
            mh.iter_mut().for_each(|e| *e *= decay);
            let delta: Vec<f32> = (0..hd)
                .map(|j| (v[j] - dot(&mh[j * hd..(j + 1) * hd], k)) * b)
                .collect();
            for j in 0..hd {
                for i in 0..hd {
                    mh[j * hd + i] += k[i] * delta[j];
                }
            }
            for j in 0..hd {
                out[(t * hv + h) * hd + j] =
                    dot(&mh[j * hd..(j + 1) * hd], q) * (1.0 / (hd as f32).sqrt());
            }
        }
    }
    let mut new_state: Vec<f32> = rows[rows.len() - (dc - 1)..].concat();
    new_state.extend(m);
    (out, new_state)
}

#[test]
fn gated_delta_net_is_llama_cpps_arithmetic_and_chunks_equal_single_tokens() {
    let mut rng = Rng(35);
    for case in 0..34 {
        // The last cases are large enough (2^16 state elements and more) that the value heads run
        // in ranges over the pool.
        let big = case >= 30;
        let n_k_heads = 1 + rng.below(3);
        let s = DeltaNetShape {
            n_k_heads,
            n_v_heads: n_k_heads * (1 + rng.below(3) + usize::from(big)),
            head_dim: if big {
                48 + rng.below(17)
            } else {
                1 + rng.below(24)
            },
            d_conv: 2 + rng.below(4),
            eps: 1e-6,
        };
        let n = if big {
            16 + rng.below(15)
        } else {
            1 + rng.below(30)
        };
        let qkv = normals(&mut rng, n * s.conv_dim(), 1.0);
        let alpha = normals(&mut rng, n * s.n_v_heads, 2.0);
        let beta = normals(&mut rng, n * s.n_v_heads, 2.0);
        let conv_w = normals(&mut rng, s.conv_dim() * s.d_conv, 0.5);
        let dt_bias = normals(&mut rng, s.n_v_heads, 1.0);
        // a = -exp(A_log): negative, so the decay is below 1; one large alpha passes softplus's
        // x > 20 branch now and then.
        let a: Vec<f32> = normals(&mut rng, s.n_v_heads, 1.0)
            .iter()
            .map(|x| -x.exp())
            .collect();
        let p = DeltaNetParams {
            conv_w: &conv_w,
            dt_bias: &dt_bias,
            a: &a,
        };
        let state_len = s.conv_state_floats() + s.ssm_state_floats();
        let state0 = normals(&mut rng, state_len, 0.3);
        let what = format!("case {case}: {s:?}, {n} tokens");

        let (want, want_state) = naive(&s, &qkv, &alpha, &beta, &p, &state0);
        let mut state = state0.clone();
        let mut out = vec![f32::NAN; n * s.value_dim()];
        gated_delta_net(&s, &qkv, &alpha, &beta, &p, &mut state, false, &mut out);
        assert!(out.iter().all(|x| x.is_finite()), "{what}: finite");
        assert_eq!(out, want, "{what}: outputs");
        assert_eq!(state, want_state, "{what}: state after");

        // The same tokens in random chunks (1 is decode), from the same state.
        let mut state1 = state0.clone();
        let mut out1 = Vec::new();
        let mut t = 0;
        while t < n {
            let len = (1 + rng.below(5)).min(n - t);
            let mut o = vec![f32::NAN; len * s.value_dim()];
            let (cd, hv) = (s.conv_dim(), s.n_v_heads);
            gated_delta_net(
                &s,
                &qkv[t * cd..(t + len) * cd],
                &alpha[t * hv..(t + len) * hv],
                &beta[t * hv..(t + len) * hv],
                &p,
                &mut state1,
                false,
                &mut o,
            );
            out1.extend(o);
            t += len;
        }
        assert_eq!(out1, want, "{what}: chunked");
        assert_eq!(state1, want_state, "{what}: chunked state");

        // A reset ignores what the state held.
        let (zero_out, zero_state) = naive(&s, &qkv, &alpha, &beta, &p, &vec![0.0; state_len]);
        let mut state2 = state0.clone();
        gated_delta_net(&s, &qkv, &alpha, &beta, &p, &mut state2, true, &mut out);
        assert_eq!(
            (out.clone(), state2),
            (zero_out, zero_state),
            "{what}: reset"
        );
    }
}
