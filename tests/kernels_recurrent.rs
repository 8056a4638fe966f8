//! The recurrent layers' kernels on random data: LFM2's short convolution (`el_short_conv`,
//! the C reference; no SIMD variant: it is a few multiply-adds per channel beside the
//! products) against the formula written out here in plain Rust (bit for bit: the same f32
//! operations in the same order), for windows of 2 to 5 and chunks of 1 to 40 tokens; a chunk
//! equal, bit for bit, to its tokens one at a time (the prefill and decode forms); the state
//! left holding the last inputs; a reset starting from zeros whatever the state held.

mod support;

use edge_llm::kernels::short_conv;
use support::splitmix::Rng;

fn normals(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normal() as f32).collect()
}

/// The convolution as the header states it: bx = b * x, the window of token t the rows
/// t .. t + l - 1 of [state; bx], y = c * sum_k window[k] * w[k] summed in k order from 0.
fn naive(bcx: &[f32], w: &[f32], state: &[f32], d: usize, l: usize) -> (Vec<f32>, Vec<f32>) {
    let n = bcx.len() / (3 * d);
    let mut rows: Vec<Vec<f32>> = state.chunks(d).map(<[f32]>::to_vec).collect();
    for t in 0..n {
        let r = &bcx[t * 3 * d..(t + 1) * 3 * d];
        rows.push((0..d).map(|ch| r[ch] * r[2 * d + ch]).collect());
    }
    let mut y = vec![0.0f32; n * d];
    for t in 0..n {
        for ch in 0..d {
            let mut sum = 0.0f32;
            for k in 0..l {
                sum += rows[t + k][ch] * w[ch * l + k];
            }
            y[t * d + ch] = bcx[t * 3 * d + d + ch] * sum;
        }
    }
    let new_state: Vec<f32> = rows[rows.len() - (l - 1)..].concat();
    (y, new_state)
}

#[test]
fn short_conv_is_the_formula_and_chunks_equal_single_tokens() {
    let mut rng = Rng(29);
    for case in 0..40 {
        let d = 1 + rng.below(70);
        let l = 2 + rng.below(4);
        let n = 1 + rng.below(40);
        let bcx = normals(&mut rng, n * 3 * d);
        let w = normals(&mut rng, d * l);
        let state0 = normals(&mut rng, (l - 1) * d);

        let (want_y, want_state) = naive(&bcx, &w, &state0, d, l);
        let mut state = state0.clone();
        let mut y = vec![f32::NAN; n * d];
        short_conv(&bcx, &w, &mut state, false, d, &mut y);
        assert_eq!(y, want_y, "case {case}: d {d}, window {l}, {n} tokens");
        assert_eq!(state, want_state, "case {case}: the state after");

        // One token at a time (decode), from the same state: the same outputs and state.
        let mut state1 = state0.clone();
        let mut y1 = Vec::new();
        for t in 0..n {
            let mut yt = vec![f32::NAN; d];
            short_conv(
                &bcx[t * 3 * d..(t + 1) * 3 * d],
                &w,
                &mut state1,
                false,
                d,
                &mut yt,
            );
            y1.extend(yt);
        }
        assert_eq!(y1, want_y, "case {case}: single tokens");
        assert_eq!(state1, want_state, "case {case}: single tokens' state");

        // A reset ignores what the state held: the formula from zeros.
        let (zero_y, zero_state) = naive(&bcx, &w, &vec![0.0; (l - 1) * d], d, l);
        let mut state2 = state0.clone();
        short_conv(&bcx, &w, &mut state2, true, d, &mut y);
        assert_eq!(
            (y.clone(), state2),
            (zero_y, zero_state),
            "case {case}: reset"
        );
    }
}
