//! The element types a paged KV cache may hold (`--cache-type-k`, `--cache-type-v`): f16 (the
//! default), bf16, and ggml's 32-element block types q8_0, q4_0, q4_1, q5_0, q5_1 and iq4_nl,
//! blocks laid along each head's `head_dim` (csrc/edge_kernels.h, "Paged KV cache"). Named as
//! llama.cpp's `-ctk`/`-ctv` name them. Every type's block is a whole number of 16-bit words, so
//! a cache is held in `u16` words whatever its type.

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
