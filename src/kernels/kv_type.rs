//! The element types a paged KV cache may hold (`--cache-type-k`, `--cache-type-v`): f16 (the
//! default), bf16, and ggml's 32-element block types q8_0, q4_0, q4_1, q5_0, q5_1 and iq4_nl,
//! blocks laid along each head's `head_dim` (csrc/edge_kernels.h, "Paged KV cache"). Named as
//! llama.cpp's `-ctk`/`-ctv` name them. Every type's block is a whole number of 16-bit words, so
//! a cache is held in `u16` words whatever its type.
//!
//! As llama.cpp does since its attention rotation (llama-kv-cache.cpp, `n_rot_k`, `n_rot_v`), a
//! quantized cache stores keys and values turned by an orthonormal Walsh-Hadamard rotation
//! ([`hadamard_rows`]) in chunks of each head: an outlier channel is spread over the chunk
//! instead of widening its block's scale. Queries are turned the same way (q . k is unchanged)
//! and attention's output turned back (H H = I). The rotation is per row, so it never depends on
//! the batch.

use super::bindings as ffi;
use super::tensor_type::TensorType;

/// Every type a KV cache may hold, in the order `--help` lists them.
pub const KV_TYPES: [TensorType; 8] = [
    TensorType::F16,
    TensorType::BF16,
    TensorType::Q8_0,
    TensorType::Q4_0,
    TensorType::Q4_1,
    TensorType::Q5_0,
    TensorType::Q5_1,
    TensorType::IQ4_NL,
];

/// The types the CUDA backend's KV cache may hold (src/cuda: el_cuda_kv_write_q quantizes them,
/// el_cuda_paged_attention reads them); `--device cuda` refuses the others.
pub const CUDA_KV_TYPES: [TensorType; 3] = [TensorType::F16, TensorType::Q8_0, TensorType::Q4_0];

/// The cache types of keys and of values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvTypes {
    pub k: TensorType,
    pub v: TensorType,
}

impl KvTypes {
    pub const F16: KvTypes = KvTypes {
        k: TensorType::F16,
        v: TensorType::F16,
    };

    /// Checks both types against a model's head size: the 32-element types need whole blocks
    /// per head (as llama.cpp requires); the error is one line naming the flag.
    pub fn check(self, head_dim: usize) -> Result<(), String> {
        for (t, flag) in [(self.k, "--cache-type-k"), (self.v, "--cache-type-v")] {
            if !head_dim.is_multiple_of(t.block_size()) {
                return Err(format!(
                    "{flag} {}: the model's head size {head_dim} is not a multiple of the type's \
                     block of {} (use f16 or bf16)",
                    kv_type_name(t),
                    t.block_size()
                ));
            }
        }
        Ok(())
    }

    /// The rotation's chunk for keys (and queries): with a quantized K and a head size that is a
    /// multiple of 64, the largest power of two dividing it (llama.cpp's `n_rot_k`); else none.
    pub fn k_rotation(self, head_dim: usize) -> Option<usize> {
        (self.k.block_size() > 1 && head_dim.is_multiple_of(64))
            .then(|| 1 << head_dim.trailing_zeros())
    }

    /// The rotation's chunk for values (and attention's output): 64 with a quantized V and a
    /// head size that is a multiple of 64 (llama.cpp's `n_rot_v`); else none.
    pub fn v_rotation(self, head_dim: usize) -> Option<usize> {
        (self.v.block_size() > 1 && head_dim.is_multiple_of(64)).then_some(64)
    }

    /// Bytes of one token's keys and values in one layer of `kv_dim` elements each.
    pub fn token_bytes(self, kv_dim: usize) -> usize {
        2 * (kv_row_words(self.k, kv_dim) + kv_row_words(self.v, kv_dim))
    }
}

impl std::fmt::Display for KvTypes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "K {}, V {}", kv_type_name(self.k), kv_type_name(self.v))
    }
}

/// A type's name as the flags take it: "f16", "q8_0", ...
pub fn kv_type_name(t: TensorType) -> String {
    t.name().to_ascii_lowercase()
}

/// The cache type a flag names (case-insensitive), or an error listing the names it takes.
pub fn parse_kv_type(name: &str) -> Result<TensorType, String> {
    KV_TYPES
        .into_iter()
        .find(|t| t.name().eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            let names: Vec<String> = KV_TYPES.into_iter().map(kv_type_name).collect();
            format!(
                "unknown KV cache type {name:?} (one of {})",
                names.join(", ")
            )
        })
}

/// Every run of `n` values of `x` (`n` a power of two dividing `x.len()`) times the orthonormal
/// Walsh-Hadamard matrix of size `n` in Sylvester's order (H_2n = [[H, H], [H, -H]] / sqrt 2, as
/// llama.cpp's `ggml_gen_hadamard`): the butterflies in a fixed order, then the scale, so the
/// result depends only on the run.
pub fn hadamard_rows(x: &mut [f32], n: usize) {
    assert!(
        n.is_power_of_two() && x.len().is_multiple_of(n),
        "hadamard shapes"
    );
    // Runs are independent: in tasks of whole runs on the pool (each run's arithmetic is the
    // same whichever task takes it).
    const TASK_FLOATS: usize = 16 * 1024;
    let runs_per_task = (TASK_FLOATS / n).max(1);
    let n_runs = x.len() / n;
    if n_runs <= runs_per_task {
        x.chunks_exact_mut(n).for_each(hadamard_run);
        return;
    }
    let len = x.len();
    let ptr = super::pool::SharedMut(x.as_mut_ptr());
    super::pool::for_each_task(n_runs.div_ceil(runs_per_task), &|t| {
        let begin = t * runs_per_task * n;
        let end = (begin + runs_per_task * n).min(len);
        // SAFETY: each task takes the disjoint runs [begin, end) of `x`, borrowed mutably until
        // for_each_task returns.
        let part = unsafe { std::slice::from_raw_parts_mut(ptr.ptr().add(begin), end - begin) };
        part.chunks_exact_mut(n).for_each(hadamard_run);
    });
}

/// One run times the orthonormal Walsh-Hadamard matrix: stage h adds and subtracts the halves
/// of every block of 2h values (each element's operations in the same order however the
/// compiler vectorizes the stage), then the scale.
fn hadamard_run(run: &mut [f32]) {
    let n = run.len();
    let mut h = 1;
    while h < n {
        for block in run.chunks_exact_mut(2 * h) {
            let (a, b) = block.split_at_mut(h);
            for (x, y) in a.iter_mut().zip(b.iter_mut()) {
                let (p, q) = (*x, *y);
                *x = p + q;
                *y = p - q;
            }
        }
        h *= 2;
    }
    let scale = 1.0 / (n as f32).sqrt();
    for v in run.iter_mut() {
        *v *= scale;
    }
}

/// Whether the kernels take `t` for a KV cache.
pub fn kv_type_ok(t: TensorType) -> bool {
    // SAFETY: a pure function of an integer.
    unsafe { ffi::el_kv_type_ok(t.ggml_id() as i32) == 1 }
}

/// 16-bit words of one row of `kv_dim` elements of `t` (`kv_dim` a whole number of blocks).
pub fn kv_row_words(t: TensorType, kv_dim: usize) -> usize {
    let bytes = t.row_bytes(kv_dim).expect("KV row of whole blocks");
    assert!(bytes.is_multiple_of(2), "KV blocks are whole 16-bit words");
    bytes / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_type_is_taken_by_the_kernels_and_parses_back() {
        for t in KV_TYPES {
            assert!(kv_type_ok(t), "{t:?}");
            assert_eq!(parse_kv_type(&kv_type_name(t)), Ok(t));
            assert!(t.block_bytes().is_multiple_of(2));
        }
        assert!(!kv_type_ok(TensorType::Q4_K));
        assert!(parse_kv_type("q4_k").is_err());
    }

    #[test]
    fn hadamard_is_the_orthonormal_sylvester_matrix_and_its_own_inverse() {
        let n = 64;
        // Row i of H (Sylvester's order) is (-1)^popcount(i & j) / sqrt(n).
        let x: Vec<f32> = (0..2 * n)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3)
            .collect();
        let mut y = x.clone();
        hadamard_rows(&mut y, n);
        for r in 0..2 {
            for i in 0..n {
                let want: f64 = (0..n)
                    .map(|j| {
                        let sign = if (i & j).count_ones() % 2 == 0 {
                            1.0
                        } else {
                            -1.0
                        };
                        sign * x[r * n + j] as f64
                    })
                    .sum::<f64>()
                    / (n as f64).sqrt();
                assert!((y[r * n + i] as f64 - want).abs() < 1e-5, "{r} {i}");
            }
        }
        hadamard_rows(&mut y, n);
        assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() < 1e-5));
        let q8 = KvTypes {
            k: TensorType::Q8_0,
            v: TensorType::Q4_0,
        };
        assert_eq!(q8.k_rotation(128), Some(128));
        assert_eq!(q8.k_rotation(192), Some(64));
        assert_eq!(q8.v_rotation(128), Some(64));
        assert_eq!(q8.k_rotation(96), None);
        assert_eq!(KvTypes::F16.k_rotation(128), None);
    }

    #[test]
    fn a_head_size_off_the_block_is_refused() {
        let q8 = KvTypes {
            k: TensorType::F16,
            v: TensorType::Q8_0,
        };
        assert!(q8.check(64).is_ok());
        let e = q8.check(80).unwrap_err();
        assert!(e.starts_with("--cache-type-v q8_0"), "{e}");
        assert!(KvTypes::F16.check(80).is_ok());
    }
}
