//! The GGUF parser: header, metadata, tensor infos, and the layout of the data section.
//!
//! Called once by `GgufFile::open` on the mapped bytes. Everything is validated here so that
//! the rest of the crate can trust a `GgufFile`: counts are capped by the bytes left in the
//! file, strings are UTF-8, keys and tensor names are unique, every tensor's data lies
//! inside the file, is aligned, and overlaps no other tensor.
//!
//! Layout (all little-endian; GGUF v2 and v3 are identical, v1 used u32 counts):
//!
//! ```text
//! "GGUF" | version u32 | tensor count u64 | metadata count u64
//! metadata: key string | value type u32 | value              (repeated)
//! tensor info: name string | n_dims u32 | dims u64 x n_dims | type u32 | offset u64
//! padding to `general.alignment` (default 32)
//! data section: tensor data at `offset` from its start
//! ```
//!
//! A string is a u64 byte length then UTF-8 bytes; an array is an element type u32, a u64
//! count, then the elements (arrays may nest).

use std::collections::HashMap;

use super::cursor::Cursor;
use super::error::GgufError;
use super::tensor_info::{TensorInfo, MAX_DIMS};
use super::value::{MetaArray, MetaValue, ValueType};

/// Alignment of the data section and tensor offsets when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The metadata key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Sanity caps on counts; real models have tens of keys and at most tens of thousands of
/// tensors. Counts are also capped by what the bytes left in the file could hold.
const MAX_TENSORS: u64 = 1 << 20;
const MAX_METADATA: u64 = 1 << 20;

/// Arrays of arrays deeper than this are refused (recursion guard).
const MAX_ARRAY_DEPTH: usize = 8;

/// Smallest metadata entry: an empty key (u64 length), the value type (u32), a one-byte value.
const MIN_METADATA_BYTES: u64 = 8 + 4 + 1;

/// Smallest tensor info: an empty name, n_dims (u32), one dim (u64), type (u32), offset (u64).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// Don't reserve more than this many elements up front, whatever a count claims.
const MAX_PREALLOC: u64 = 4096;

/// What the parser found, all validated.
pub(crate) struct Parsed {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, MetaValue)>,
    pub metadata_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
    /// Offset in the file of the data section.
    pub data_start: u64,
}

pub(crate) fn parse(bytes: &[u8]) -> Result<Parsed, GgufError> {
    let mut cur = Cursor::new(bytes);

    let magic = cur.take(4, "magic")?;
    if magic != b"GGUF" {
        let mut found = [0u8; 4];
        found.copy_from_slice(magic);
        return Err(GgufError::BadMagic { found });
    }
    let version = cur.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion { version });
    }
    let n_tensors = cur.count(
        "tensor count",
        MAX_TENSORS,
        "the sanity cap on tensors",
        Some(MIN_TENSOR_INFO_BYTES),
    )?;
    let n_metadata = cur.count(
        "metadata count",
        MAX_METADATA,
        "the sanity cap on metadata entries",
        Some(MIN_METADATA_BYTES),
    )?;

    let (metadata, metadata_index) = read_metadata(&mut cur, n_metadata)?;
    let alignment = alignment(&metadata, &metadata_index)?;
    let (tensors, tensor_index) = read_tensor_infos(&mut cur, n_tensors, alignment)?;

    // The data section starts at the first aligned offset after the tensor infos.
    let data_start = cur
        .pos()
        .checked_next_multiple_of(alignment)
        .ok_or(GgufError::BadAlignment { alignment })?;
    check_layout(&tensors, data_start, bytes.len() as u64)?;

    Ok(Parsed {
        version,
        alignment,
        metadata,
        metadata_index,
        tensors,
        tensor_index,
        data_start,
    })
}

type Metadata = (Vec<(String, MetaValue)>, HashMap<String, usize>);

fn read_metadata(cur: &mut Cursor, n: u64) -> Result<Metadata, GgufError> {
    let mut metadata = Vec::with_capacity(n.min(MAX_PREALLOC) as usize);
    let mut index = HashMap::with_capacity(n.min(MAX_PREALLOC) as usize);
    for i in 0..n {
        cur.context = format!("of metadata entry #{i}");
        let key = cur.string("key")?;
        if index.contains_key(&key) {
            return Err(GgufError::DuplicateKey { key });
        }
        cur.context = format!("of metadata key '{key}'");
        let type_offset = cur.pos();
        let type_id = cur.u32("value type")?;
        let value_type = value_type(type_id, &key, type_offset)?;
        let value = read_value(cur, &key, value_type)?;
        index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }
    Ok((metadata, index))
}

fn value_type(type_id: u32, key: &str, offset: u64) -> Result<ValueType, GgufError> {
    ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
        key: key.to_string(),
        type_id,
        offset,
    })
}

fn read_value(cur: &mut Cursor, key: &str, value_type: ValueType) -> Result<MetaValue, GgufError> {
    const WHAT: &str = "value";
    Ok(match value_type {
        ValueType::U8 => MetaValue::U8(cur.u8(WHAT)?),
        ValueType::I8 => MetaValue::I8(cur.u8(WHAT)? as i8),
        ValueType::U16 => MetaValue::U16(u16::from_le_bytes(fixed(cur, WHAT)?)),
        ValueType::I16 => MetaValue::I16(i16::from_le_bytes(fixed(cur, WHAT)?)),
        ValueType::U32 => MetaValue::U32(cur.u32(WHAT)?),
        ValueType::I32 => MetaValue::I32(i32::from_le_bytes(fixed(cur, WHAT)?)),
        ValueType::F32 => MetaValue::F32(f32::from_le_bytes(fixed(cur, WHAT)?)),
        ValueType::Bool => MetaValue::Bool(cur.bool(WHAT)?),
        ValueType::String => MetaValue::String(cur.string("string value")?),
        ValueType::Array => MetaValue::Array(read_array(cur, key, 1)?),
        ValueType::U64 => MetaValue::U64(cur.u64(WHAT)?),
        ValueType::I64 => MetaValue::I64(i64::from_le_bytes(fixed(cur, WHAT)?)),
        ValueType::F64 => MetaValue::F64(f64::from_le_bytes(fixed(cur, WHAT)?)),
    })
}

fn fixed<const N: usize>(cur: &mut Cursor, what: &str) -> Result<[u8; N], GgufError> {
    let mut out = [0u8; N];
    out.copy_from_slice(cur.take(N as u64, what)?);
    Ok(out)
}

/// An array value (after its `Array` type id): element type, count, elements.
fn read_array(cur: &mut Cursor, key: &str, depth: usize) -> Result<MetaArray, GgufError> {
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::NestingTooDeep {
            key: key.to_string(),
            limit: MAX_ARRAY_DEPTH,
        });
    }
    let type_offset = cur.pos();
    let elem_type = value_type(cur.u32("array element type")?, key, type_offset)?;
    let n = cur.count("array length", u64::MAX, "", Some(elem_type.min_bytes()))?;
    const WHAT: &str = "array data";
    Ok(match elem_type {
        ValueType::U8 => MetaArray::U8(cur.fixed_vec(n, WHAT, |[b]: [u8; 1]| b)?),
        ValueType::I8 => MetaArray::I8(cur.fixed_vec(n, WHAT, i8::from_le_bytes)?),
        ValueType::U16 => MetaArray::U16(cur.fixed_vec(n, WHAT, u16::from_le_bytes)?),
        ValueType::I16 => MetaArray::I16(cur.fixed_vec(n, WHAT, i16::from_le_bytes)?),
        ValueType::U32 => MetaArray::U32(cur.fixed_vec(n, WHAT, u32::from_le_bytes)?),
        ValueType::I32 => MetaArray::I32(cur.fixed_vec(n, WHAT, i32::from_le_bytes)?),
        ValueType::F32 => MetaArray::F32(cur.fixed_vec(n, WHAT, f32::from_le_bytes)?),
        ValueType::U64 => MetaArray::U64(cur.fixed_vec(n, WHAT, u64::from_le_bytes)?),
        ValueType::I64 => MetaArray::I64(cur.fixed_vec(n, WHAT, i64::from_le_bytes)?),
        ValueType::F64 => MetaArray::F64(cur.fixed_vec(n, WHAT, f64::from_le_bytes)?),
        ValueType::Bool => MetaArray::Bool(collect(n, || cur.bool("array element"))?),
        ValueType::String => MetaArray::String(collect(n, || cur.string("array element"))?),
        ValueType::Array => MetaArray::Array(collect(n, || read_array(cur, key, depth + 1))?),
    })
}

/// `n` items from `next`, stopping at the first error.
fn collect<T>(n: u64, mut next: impl FnMut() -> Result<T, GgufError>) -> Result<Vec<T>, GgufError> {
    let mut out = Vec::with_capacity(n.min(MAX_PREALLOC) as usize);
    for _ in 0..n {
        out.push(next()?);
    }
    Ok(out)
}

/// `general.alignment`, or the default: an integer that is a non-zero power of two.
fn alignment(
    metadata: &[(String, MetaValue)],
    index: &HashMap<String, usize>,
) -> Result<u64, GgufError> {
    let Some(&i) = index.get(ALIGNMENT_KEY) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let value = &metadata[i].1;
    match value.as_u64() {
        Some(alignment) if alignment.is_power_of_two() => Ok(alignment),
        Some(alignment) => Err(GgufError::BadAlignment { alignment }),
        None if value.is_integer() => Err(GgufError::BadValue {
            key: ALIGNMENT_KEY.to_string(),
            value: format!("{value:?}"),
            reason: "must be a non-zero power of two",
        }),
        None => Err(GgufError::WrongType {
            key: ALIGNMENT_KEY.to_string(),
            expected: "an unsigned integer",
            found: value.type_name(),
        }),
    }
}

type Tensors = (Vec<TensorInfo>, HashMap<String, usize>);

fn read_tensor_infos(cur: &mut Cursor, n: u64, alignment: u64) -> Result<Tensors, GgufError> {
    let mut tensors = Vec::with_capacity(n.min(MAX_PREALLOC) as usize);
    let mut index = HashMap::with_capacity(n.min(MAX_PREALLOC) as usize);
    for i in 0..n {
        cur.context = format!("of tensor info #{i}");
        let name = cur.string("name")?;
        if index.contains_key(&name) {
            return Err(GgufError::DuplicateTensor { name });
        }
        cur.context = format!("of tensor '{name}'");
        let n_dims = cur.u32("dimension count")?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(GgufError::BadDimCount { name, n_dims });
        }
        let dims = (0..n_dims)
            .map(|_| cur.u64("dimension"))
            .collect::<Result<Vec<u64>, _>>()?;
        let type_id = cur.u32("type")?;
        let offset = cur.u64("data offset")?;
        let info = TensorInfo::new(name, dims, type_id, offset, alignment)?;
        index.insert(info.name.clone(), tensors.len());
        tensors.push(info);
    }
    Ok((tensors, index))
}

/// Every tensor's data must lie inside the file and overlap no other tensor's.
fn check_layout(tensors: &[TensorInfo], data_start: u64, file_bytes: u64) -> Result<(), GgufError> {
    for t in tensors {
        let end = data_start
            .checked_add(t.offset)
            .and_then(|start| start.checked_add(t.n_bytes));
        if end.is_none_or(|end| end > file_bytes) {
            return Err(GgufError::TensorPastEof {
                name: t.name.clone(),
                offset: t.offset,
                n_bytes: t.n_bytes,
                data_start,
                file_bytes,
            });
        }
    }

    // In offset order, each tensor must start at or after the end of the one before (ends
    // cannot overflow: checked above). If every neighbour passes, no two tensors overlap.
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        let (first, second) = (pair[0], pair[1]);
        if second.offset < first.offset + first.n_bytes {
            return Err(GgufError::OverlappingTensors {
                first: first.name.clone(),
                second: second.name.clone(),
            });
        }
    }
    Ok(())
}
