//! Tensor element types as GGUF files number them, with their block geometry.
//!
//! Pure data, shared by the GGUF reader (to size tensors) and the kernels (to call the C code).
//! The numbers are not written here: each type's ggml id, elements per block and bytes per block
//! are `csrc/el_types.h`'s (`enum el_type`, `EL_<T>_ELEMS`, `EL_<T>_BYTES`), the header the C and
//! CUDA kernels compile against, read through its bindgen constants in `super::bindings`.
//! tests/tensor_types.rs checks every type against the header's text and the C kernels' tables,
//! and that every type in the header is here.

use std::fmt;

use super::bindings as c;

/// A tensor type edge-llm can read. Discriminants are the ggml/GGUF type ids, `enum el_type` in
/// csrc/el_types.h.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum TensorType {
    F32 = c::el_type_EL_TYPE_F32,
    F16 = c::el_type_EL_TYPE_F16,
    Q4_0 = c::el_type_EL_TYPE_Q4_0,
    Q4_1 = c::el_type_EL_TYPE_Q4_1,
    Q5_0 = c::el_type_EL_TYPE_Q5_0,
    Q5_1 = c::el_type_EL_TYPE_Q5_1,
    Q8_0 = c::el_type_EL_TYPE_Q8_0,
    Q8_1 = c::el_type_EL_TYPE_Q8_1,
    Q2_K = c::el_type_EL_TYPE_Q2_K,
    Q3_K = c::el_type_EL_TYPE_Q3_K,
    Q4_K = c::el_type_EL_TYPE_Q4_K,
    Q5_K = c::el_type_EL_TYPE_Q5_K,
    Q6_K = c::el_type_EL_TYPE_Q6_K,
    Q8_K = c::el_type_EL_TYPE_Q8_K,
    IQ2_XXS = c::el_type_EL_TYPE_IQ2_XXS,
    IQ2_XS = c::el_type_EL_TYPE_IQ2_XS,
    IQ3_XXS = c::el_type_EL_TYPE_IQ3_XXS,
    IQ1_S = c::el_type_EL_TYPE_IQ1_S,
    IQ4_NL = c::el_type_EL_TYPE_IQ4_NL,
    IQ3_S = c::el_type_EL_TYPE_IQ3_S,
    IQ2_S = c::el_type_EL_TYPE_IQ2_S,
    IQ4_XS = c::el_type_EL_TYPE_IQ4_XS,
    IQ1_M = c::el_type_EL_TYPE_IQ1_M,
    BF16 = c::el_type_EL_TYPE_BF16,
    MXFP4 = c::el_type_EL_TYPE_MXFP4,
}

/// Elements per block of the 32-element types (`EL_QK`), also the CUDA product kernels' unit.
pub const QK: usize = c::EL_QK as usize;

/// Elements in one K-quant super-block (`EL_QK_K`).
pub const QK_K: usize = c::EL_QK_K as usize;

impl TensorType {
    /// Every supported type, in ggml id order.
    pub const ALL: [TensorType; 25] = [
        TensorType::F32,
        TensorType::F16,
        TensorType::Q4_0,
        TensorType::Q4_1,
        TensorType::Q5_0,
        TensorType::Q5_1,
        TensorType::Q8_0,
        TensorType::Q8_1,
        TensorType::Q2_K,
        TensorType::Q3_K,
        TensorType::Q4_K,
        TensorType::Q5_K,
        TensorType::Q6_K,
        TensorType::Q8_K,
        TensorType::IQ2_XXS,
        TensorType::IQ2_XS,
        TensorType::IQ3_XXS,
        TensorType::IQ1_S,
        TensorType::IQ4_NL,
        TensorType::IQ3_S,
        TensorType::IQ2_S,
        TensorType::IQ4_XS,
        TensorType::IQ1_M,
        TensorType::BF16,
        TensorType::MXFP4,
    ];

    /// The type with ggml id `id`, or `None` for an id edge-llm does not support.
    pub fn from_ggml_id(id: u32) -> Option<TensorType> {
        Self::ALL.iter().copied().find(|t| t.ggml_id() == id)
    }

    pub fn ggml_id(self) -> u32 {
        self as u32
    }

    /// Elements per block (1 for the float types).
    pub fn block_size(self) -> usize {
        self.geometry().0 as usize
    }

    /// Bytes per block, as laid out in ggml-common.h.
    pub fn block_bytes(self) -> usize {
        self.geometry().1 as usize
    }

    /// (elements, bytes) per block: `EL_<T>_ELEMS` and `EL_<T>_BYTES` in csrc/el_types.h.
    const fn geometry(self) -> (u32, u32) {
        use TensorType::*;
        match self {
            F32 => (c::EL_F32_ELEMS, c::EL_F32_BYTES),
            F16 => (c::EL_F16_ELEMS, c::EL_F16_BYTES),
            Q4_0 => (c::EL_Q4_0_ELEMS, c::EL_Q4_0_BYTES),
            Q4_1 => (c::EL_Q4_1_ELEMS, c::EL_Q4_1_BYTES),
            Q5_0 => (c::EL_Q5_0_ELEMS, c::EL_Q5_0_BYTES),
            Q5_1 => (c::EL_Q5_1_ELEMS, c::EL_Q5_1_BYTES),
            Q8_0 => (c::EL_Q8_0_ELEMS, c::EL_Q8_0_BYTES),
            Q8_1 => (c::EL_Q8_1_ELEMS, c::EL_Q8_1_BYTES),
            Q2_K => (c::EL_Q2_K_ELEMS, c::EL_Q2_K_BYTES),
            Q3_K => (c::EL_Q3_K_ELEMS, c::EL_Q3_K_BYTES),
            Q4_K => (c::EL_Q4_K_ELEMS, c::EL_Q4_K_BYTES),
            Q5_K => (c::EL_Q5_K_ELEMS, c::EL_Q5_K_BYTES),
            Q6_K => (c::EL_Q6_K_ELEMS, c::EL_Q6_K_BYTES),
            Q8_K => (c::EL_Q8_K_ELEMS, c::EL_Q8_K_BYTES),
            IQ2_XXS => (c::EL_IQ2_XXS_ELEMS, c::EL_IQ2_XXS_BYTES),
            IQ2_XS => (c::EL_IQ2_XS_ELEMS, c::EL_IQ2_XS_BYTES),
            IQ3_XXS => (c::EL_IQ3_XXS_ELEMS, c::EL_IQ3_XXS_BYTES),
            IQ1_S => (c::EL_IQ1_S_ELEMS, c::EL_IQ1_S_BYTES),
            IQ4_NL => (c::EL_IQ4_NL_ELEMS, c::EL_IQ4_NL_BYTES),
            IQ3_S => (c::EL_IQ3_S_ELEMS, c::EL_IQ3_S_BYTES),
            IQ2_S => (c::EL_IQ2_S_ELEMS, c::EL_IQ2_S_BYTES),
            IQ4_XS => (c::EL_IQ4_XS_ELEMS, c::EL_IQ4_XS_BYTES),
            IQ1_M => (c::EL_IQ1_M_ELEMS, c::EL_IQ1_M_BYTES),
            BF16 => (c::EL_BF16_ELEMS, c::EL_BF16_BYTES),
            MXFP4 => (c::EL_MXFP4_ELEMS, c::EL_MXFP4_BYTES),
        }
    }

    /// Bytes of a row of `n` elements, or `None` when `n` is not a whole number of blocks
    /// or the size overflows.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.block_bytes())
    }

    /// The activation type a dot product with a row of this type consumes (llama.cpp's
    /// `vec_dot_type`): activations are quantized to it once per row.
    pub fn vec_dot_type(self) -> TensorType {
        use TensorType::*;
        match self {
            F32 => F32,
            F16 => F16,
            BF16 => BF16,
            Q4_0 | Q5_0 | Q8_0 | IQ4_NL | MXFP4 => Q8_0,
            Q4_1 | Q5_1 | Q8_1 => Q8_1,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K => Q8_K,
            IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M | IQ4_XS => Q8_K,
        }
    }

    /// Whether the kernels can quantize to this type. The codebook IQ types cannot: llama.cpp
    /// makes them from an importance matrix, and edge-llm only reads them.
    pub fn has_quantizer(self) -> bool {
        use TensorType::*;
        !matches!(
            self,
            IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M
        )
    }

    /// The name llama.cpp prints ("Q4_1", "F16", ...).
    pub fn name(self) -> &'static str {
        use TensorType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            BF16 => "BF16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            IQ2_XXS => "IQ2_XXS",
            IQ2_XS => "IQ2_XS",
            IQ3_XXS => "IQ3_XXS",
            IQ1_S => "IQ1_S",
            IQ4_NL => "IQ4_NL",
            IQ3_S => "IQ3_S",
            IQ2_S => "IQ2_S",
            IQ4_XS => "IQ4_XS",
            IQ1_M => "IQ1_M",
            MXFP4 => "MXFP4",
        }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for t in TensorType::ALL {
            assert_eq!(TensorType::from_ggml_id(t.ggml_id()), Some(t));
        }
        assert_eq!(TensorType::from_ggml_id(4), None); // Q4_2, removed from ggml
        assert_eq!(TensorType::from_ggml_id(24), None); // I8
        assert_eq!(TensorType::from_ggml_id(99), None);
    }

    /// The ids come from csrc/el_types.h; these are ggml.h's (enum ggml_type), which GGUF files
    /// store, so a renumbered header fails here even with its bindings regenerated.
    #[test]
    fn ids_match_ggml() {
        use TensorType::*;
        let expected = [
            (F32, 0),
            (F16, 1),
            (Q4_0, 2),
            (Q4_1, 3),
            (Q5_0, 6),
            (Q5_1, 7),
            (Q8_0, 8),
            (Q8_1, 9),
            (Q2_K, 10),
            (Q3_K, 11),
            (Q4_K, 12),
            (Q5_K, 13),
            (Q6_K, 14),
            (Q8_K, 15),
            (IQ2_XXS, 16),
            (IQ2_XS, 17),
            (IQ3_XXS, 18),
            (IQ1_S, 19),
            (IQ4_NL, 20),
            (IQ3_S, 21),
            (IQ2_S, 22),
            (IQ4_XS, 23),
            (IQ1_M, 29),
            (BF16, 30),
            (MXFP4, 39),
        ];
        assert_eq!(expected.len(), TensorType::ALL.len());
        for (t, id) in expected {
            assert_eq!(t.ggml_id(), id, "{t}");
        }
    }

    #[test]
    fn block_bytes_match_ggml() {
        use TensorType::*;
        let expected = [
            (Q4_0, 18),
            (Q4_1, 20),
            (Q5_0, 22),
            (Q5_1, 24),
            (Q8_0, 34),
            (Q8_1, 36),
            (Q2_K, 84),
            (Q3_K, 110),
            (Q4_K, 144),
            (Q5_K, 176),
            (Q6_K, 210),
            (Q8_K, 292),
            (IQ4_NL, 18),
            (IQ4_XS, 136),
            (IQ2_XXS, 66),
            (IQ2_XS, 74),
            (IQ2_S, 82),
            (IQ3_XXS, 98),
            (IQ3_S, 110),
            (IQ1_S, 50),
            (IQ1_M, 56),
            (MXFP4, 17),
        ];
        for (t, bytes) in expected {
            assert_eq!(t.block_bytes(), bytes, "{t}");
        }
    }
}
