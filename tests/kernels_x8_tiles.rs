//! The interleaved (x8) matrix products' batch tiles at their edges: every batch size from 1 to 17
//! rows (the 8-row and 4-row Q4_1 tiles, partial ones repeating their last row), row lengths on
//! either side of the tiles' chunks of spread activations (8 blocks for 8 rows, 16 for 4), and
//! widths of one to five groups of 8 columns. Every output equals the same ISA's vec_dot on the
//! row as stored, bit for bit, on every ISA this machine has.

use edge_llm::kernels::{
    available_isas, current_isa, matmul_x8, quantize_rows, repack_x8, set_isa, vec_dot,
};
use edge_llm::tensor_type::TensorType;

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

    /// Uniform in [-1, 1), one value in 32 scaled by 8: blocks with large and small scales, and
    /// block sums with more bits than an f16 scale times them keeps, so the order of the float
    /// operations shows in the result.
    fn value(&mut self) -> f32 {
        let u = ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32;
        if self.next_u64() % 32 == 0 {
            8.0 * u
        } else {
            u
        }
    }

    fn data(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.value()).collect()
    }
}

#[test]
fn x8_tiles_equal_vec_dot_for_every_batch_size_and_chunk_edge() {
    const MAX_ROWS: usize = 17;
    let before = current_isa();
    let mut rng = Rng(14);
    let mut checked = 0usize;
    for t in [TensorType::Q4_1, TensorType::Q8_0] {
        for blocks in [1, 7, 8, 9, 15, 16, 17, 33] {
            let n_in = 32 * blocks;
            for n_out in [8, 24, 40] {
                let w = quantize_rows(t, &rng.data(n_out * n_in), n_in);
                let w8 = repack_x8(t, &w, n_in, n_out);
                let a = quantize_rows(t.vec_dot_type(), &rng.data(MAX_ROWS * n_in), n_in);
                let (w_rb, a_rb) = (w.len() / n_out, a.len() / MAX_ROWS);
                for isa in available_isas() {
                    set_isa(isa).expect("an available ISA");
                    for n_rows in 1..=MAX_ROWS {
                        let mut out = vec![f32::NAN; n_rows * n_out];
                        matmul_x8(t, &w8, n_in, n_out, &a[..n_rows * a_rb], n_rows, &mut out);
                        for r in 0..n_rows {
                            for o in 0..n_out {
                                let want = vec_dot(
                                    t,
                                    n_in,
                                    &w[o * w_rb..][..w_rb],
                                    &a[r * a_rb..][..a_rb],
                                );
                                let got = out[r * n_out + o];
                                assert_eq!(
                                    got.to_bits(),
                                    want.to_bits(),
                                    "{isa} {t} [{n_out}][{n_in}], {n_rows} rows, row {r} output {o}: {got} vs vec_dot {want}"
                                );
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    set_isa(before).expect("the ISA that was current is available");
    assert!(checked > 0, "no output was checked");
}
