//! `TensorInfo`: one tensor's name, shape, type and place in the data section.
//!
//! Built and validated by the parser (`parse.rs`); read by the model loader to find and size
//! its weights, and by `edge-llm info`.

use super::error::GgufError;
use crate::kernels::tensor_type::TensorType;

/// GGUF (ggml) tensors have 1 to 4 dimensions.
pub const MAX_DIMS: usize = 4;

/// One tensor as the file describes it. Every `TensorInfo` a `GgufFile` hands out has been
/// checked: 1..=4 dimensions, none 0, rows a whole number of blocks, sizes that fit in
/// `u64` and `usize`, data inside the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// Shape in ggml order: `dims[0]` is the number of elements per row (innermost).
    pub dims: Vec<u64>,
    pub ttype: TensorType,
    /// Byte offset of the data from the start of the data section.
    pub offset: u64,
    /// Bytes of data.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Validates a tensor info record read from the file (all but its place in the file,
    /// which `parse.rs` checks once all tensors are known).
    pub(crate) fn new(
        name: String,
        dims: Vec<u64>,
        type_id: u32,
        offset: u64,
        alignment: u64,
    ) -> Result<TensorInfo, GgufError> {
        if dims.is_empty() || dims.len() > MAX_DIMS {
            return Err(GgufError::BadDimCount {
                name,
                n_dims: dims.len() as u32,
            });
        }
        if let Some(index) = dims.iter().position(|&d| d == 0) {
            return Err(GgufError::ZeroDim { name, dims, index });
        }
        let Some(ttype) = TensorType::from_ggml_id(type_id) else {
            return Err(GgufError::UnknownTensorType { name, type_id });
        };
        let row_len = dims[0];
        let block_size = ttype.block_size();
        if !row_len.is_multiple_of(block_size as u64) {
            return Err(GgufError::RowNotBlockMultiple {
                name,
                ttype,
                row_len,
                block_size,
            });
        }
        let n_bytes = byte_size(&dims, ttype);
        let Some(n_bytes) = n_bytes else {
            return Err(GgufError::ShapeOverflow { name, dims });
        };
        if !offset.is_multiple_of(alignment) {
            return Err(GgufError::MisalignedTensor {
                name,
                offset,
                alignment,
            });
        }
        Ok(TensorInfo {
            name,
            dims,
            ttype,
            offset,
            n_bytes,
        })
    }

    /// Total number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |n, &d| n.saturating_mul(d))
    }

    /// Elements per row: `dims[0]`.
    pub fn row_len(&self) -> usize {
        self.dims.first().map_or(1, |&d| d as usize)
    }

    /// Number of rows: the product of `dims[1..]` (1 for a vector).
    pub fn n_rows(&self) -> usize {
        self.dims
            .iter()
            .skip(1)
            .fold(1usize, |n, &d| n.saturating_mul(d as usize))
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.ttype.row_bytes(self.row_len()).unwrap_or(0)
    }

    /// The shape as `[576, 49152]`.
    pub fn shape_string(&self) -> String {
        format!("{:?}", self.dims)
    }
}

/// Bytes of a tensor of shape `dims` (rows of `dims[0]` elements), or `None` if the element
/// count, a row's size or the total overflows `u64` or `usize`.
fn byte_size(dims: &[u64], ttype: TensorType) -> Option<u64> {
    let n_elements = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d))?;
    usize::try_from(n_elements).ok()?;
    let row_bytes = ttype.row_bytes(usize::try_from(dims[0]).ok()?)?;
    let n_rows = n_elements / dims[0];
    let n_bytes = (row_bytes as u64).checked_mul(n_rows)?;
    usize::try_from(n_bytes).ok()?;
    Some(n_bytes)
}
