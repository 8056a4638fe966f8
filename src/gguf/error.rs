//! `GgufError`: every way opening or querying a GGUF file can fail.
//!
//! Produced by the parser (`parse.rs`, `cursor.rs`) and the typed getters in `mod.rs`; callers
//! (the model loader, `edge-llm info`) match on the variants they can act on and otherwise
//! add the file path with `anyhow` context. Every variant names what it is about: the key,
//! the tensor, the offset in the file.

use std::path::PathBuf;

use crate::kernels::tensor_type::TensorType;

/// An error from opening or querying a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// Opening, measuring or mapping the file failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The file does not start with `GGUF`.
    #[error(
        "bad magic {found:02x?} ({}), expected \"GGUF\": not a GGUF file",
        printable(found)
    )]
    BadMagic { found: [u8; 4] },

    /// A GGUF version other than 2 or 3.
    #[error("unsupported GGUF version {version}{}", version_hint(*version))]
    UnsupportedVersion { version: u32 },

    /// The file ends in the middle of something.
    #[error(
        "file truncated reading {what} at offset {offset}: needs {needed} bytes, {available} left"
    )]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },

    /// A count or length that cannot be right: more than the rest of the file could hold, or
    /// past a sanity cap.
    #[error("{what} at offset {offset} is {count}, more than {limit} ({why})")]
    CountTooLarge {
        what: String,
        offset: u64,
        count: u64,
        limit: u64,
        why: String,
    },

    /// A key, string value or tensor name that is not UTF-8.
    #[error("invalid UTF-8 in {what} at offset {offset}: {lossy:?}")]
    InvalidUtf8 {
        what: String,
        offset: u64,
        lossy: String,
    },

    /// A bool stored as something other than 0 or 1.
    #[error("invalid bool {value} in {what} at offset {offset} (must be 0 or 1)")]
    InvalidBool {
        what: String,
        offset: u64,
        value: u8,
    },

    /// A metadata value type id outside the GGUF spec (for a scalar or an array element).
    #[error("metadata key '{key}' has unknown value type {type_id} at offset {offset}")]
    UnknownValueType {
        key: String,
        type_id: u32,
        offset: u64,
    },

    /// Arrays of arrays nested deeper than the parser follows.
    #[error("metadata key '{key}' nests arrays more than {limit} deep")]
    NestingTooDeep { key: String, limit: usize },

    /// The same metadata key twice.
    #[error("duplicate metadata key '{key}'")]
    DuplicateKey { key: String },

    /// `general.alignment` that is zero or not a power of two.
    #[error("general.alignment is {alignment}, must be a non-zero power of two")]
    BadAlignment { alignment: u64 },

    /// The same tensor name twice.
    #[error("duplicate tensor name '{name}'")]
    DuplicateTensor { name: String },

    /// A tensor with 0 or more than 4 dimensions.
    #[error("tensor '{name}' has {n_dims} dimensions, GGUF allows 1 to 4")]
    BadDimCount { name: String, n_dims: u32 },

    /// A tensor with a dimension of 0 elements.
    #[error("tensor '{name}' has shape {dims:?}: dimension {index} is 0")]
    ZeroDim {
        name: String,
        dims: Vec<u64>,
        index: usize,
    },

    /// A tensor whose element count or byte size does not fit in 64 bits.
    #[error("tensor '{name}' has shape {dims:?}: its size overflows")]
    ShapeOverflow { name: String, dims: Vec<u64> },

    /// A tensor type id edge-llm does not know.
    #[error("tensor '{name}' has unknown or unsupported type id {type_id}")]
    UnknownTensorType { name: String, type_id: u32 },

    /// A row length that is not a whole number of quantization blocks.
    #[error(
        "tensor '{name}' of type {ttype} has rows of {row_len} elements, \
         not a multiple of the block size {block_size}"
    )]
    RowNotBlockMultiple {
        name: String,
        ttype: TensorType,
        row_len: u64,
        block_size: usize,
    },

    /// A tensor offset that is not a multiple of the file's alignment.
    #[error("tensor '{name}' has offset {offset}, not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        name: String,
        offset: u64,
        alignment: u64,
    },

    /// A tensor whose data would run past the end of the file.
    #[error(
        "tensor '{name}' runs past the end of the file: {n_bytes} bytes at offset {offset} of \
         the data section (which starts at {data_start}), but the file has {file_bytes} bytes"
    )]
    TensorPastEof {
        name: String,
        offset: u64,
        n_bytes: u64,
        data_start: u64,
        file_bytes: u64,
    },

    /// Two tensors whose data overlap.
    #[error("tensors '{first}' and '{second}' overlap in the data section")]
    OverlappingTensors { first: String, second: String },

    /// A metadata key the caller needs is absent.
    #[error("missing metadata key '{key}'")]
    MissingKey { key: String },

    /// A metadata key holds a different type than the caller needs.
    #[error("metadata key '{key}' should be {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },

    /// A metadata value of the right type but out of range (e.g. a negative count).
    #[error("metadata key '{key}' has value {value}, {reason}")]
    BadValue {
        key: String,
        value: String,
        reason: &'static str,
    },

    /// A tensor the caller needs is absent.
    #[error("missing tensor '{name}'")]
    MissingTensor { name: String },
}

/// The magic bytes as text, with `?` for anything unprintable.
fn printable(bytes: &[u8; 4]) -> String {
    bytes
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '?'
            }
        })
        .collect()
}

fn version_hint(version: u32) -> &'static str {
    match version {
        1 => " (GGUF v1 is no longer supported; re-convert the model)",
        v if v != 0 && v & 0xFFFF == 0 => " (a big-endian file? only little-endian is supported)",
        _ => " (supported: 2 and 3)",
    }
}
