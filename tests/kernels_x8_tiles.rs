//! The interleaved (x8) matrix products' batch tiles at their edges, for every type with an
//! interleaved layout (Q4_1, Q8_0, Q4_K, Q5_K, Q6_K): every batch size from 1 to 17 rows (the
//! 8-row and 4-row Q4_1 tiles, the K-quants' 4-, 2- and 1-row ones, partial ones repeating their
//! last row), row lengths on either side of the tiles' chunks of spread activations (8 blocks for
//! 8 rows, 16 for 4), and column tasks on either side of the width from which Q4_1 batches use
//! them. Every output equals the same ISA's vec_dot on the row as stored, bit for bit, on every
//! ISA this machine has (scalar, AVX2 and, where the CPU has it, AVX-512 VNNI's tiles of 8, 4, 2
//! and 1 rows; the test checks that the product runs each ISA's own kernel).

mod support;

use edge_llm::kernels::tensor_type::TensorType;
use edge_llm::kernels::{
    available_isas, current_isa, matmul_x8, matmul_x8_isa, quantize_rows, repack_x8, set_isa,
    vec_dot,
};

use support::splitmix::Rng;

impl Rng {
    /// Uniform in [-1, 1), one value in 32 scaled by 8: blocks with large and small scales, and
    /// block sums with more bits than an f16 scale times them keeps, so the order of the float
    /// operations shows in the result.
    fn value(&mut self) -> f32 {
        let u = ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32;
        if self.next_u64().is_multiple_of(32) {
            8.0 * u
        } else {
            u
        }
    }

    fn data(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.value()).collect()
    }
}

/// `f` on a pool of one thread: the products' column tasks are then a quarter of the width each
/// (at least 32 columns), so the widths below give tasks of 1 to 17 groups of 8 columns on any
/// machine: both sides of X8_SPREAD_MIN_GROUPS (4) in csrc/quants_avx2.c, where Q4_1 batches
/// switch from the 4-row tiles to the 8-row ones over spread activation scales. The row lengths
/// cross that file's chunk edges too: 40 blocks for 8 rows, 80 for 4 (41, 48 and 81 blocks are
/// cut into two chunks, 81 into three for 8 rows).
fn on_one_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool")
        .install(f)
}

#[test]
fn x8_tiles_equal_vec_dot_for_every_batch_size_and_chunk_edge() {
    const MAX_ROWS: usize = 17;
    let before = current_isa();
    let mut rng = Rng(14);
    let mut checked = 0usize;
    for t in [
        TensorType::Q4_1,
        TensorType::Q8_0,
        TensorType::Q4_K,
        TensorType::Q5_K,
        TensorType::Q6_K,
    ] {
        // The K-quants' tiles have no chunks: a few super-blocks (of 256) are enough.
        let blocks: &[usize] = if t.block_size() == 32 {
            &[1, 7, 8, 9, 15, 16, 17, 33, 41, 48, 81]
        } else {
            &[1, 2, 3, 6]
        };
        for &blocks in blocks {
            let n_in = t.block_size() * blocks;
            for n_out in [8, 40, 264, 520] {
                let w = quantize_rows(t, &rng.data(n_out * n_in), n_in);
                let w8 = repack_x8(t, &w, n_in, n_out);
                let a = quantize_rows(t.vec_dot_type(), &rng.data(MAX_ROWS * n_in), n_in);
                let (w_rb, a_rb) = (w.len() / n_out, a.len() / MAX_ROWS);
                for isa in available_isas() {
                    set_isa(isa).expect("an available ISA");
                    assert_eq!(
                        matmul_x8_isa(t),
                        Some(isa),
                        "{t}'s product does not run {isa}'s kernel"
                    );
                    let want: Vec<f32> = (0..MAX_ROWS * n_out)
                        .map(|i| {
                            let (r, o) = (i / n_out, i % n_out);
                            vec_dot(t, n_in, &w[o * w_rb..][..w_rb], &a[r * a_rb..][..a_rb])
                        })
                        .collect();
                    for n_rows in 1..=MAX_ROWS {
                        let mut out = vec![f32::NAN; n_rows * n_out];
                        on_one_thread(|| {
                            matmul_x8(t, &w8, n_in, n_out, &a[..n_rows * a_rb], n_rows, &mut out)
                        });
                        for (i, (got, want)) in out.iter().zip(&want).enumerate() {
                            let (r, o) = (i / n_out, i % n_out);
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
    set_isa(before).expect("the ISA that was current is available");
    assert!(checked > 0, "no output was checked");
}
