//! Metadata values: `MetaValue`, `MetaArray` and the GGUF value type ids.
//!
//! The parser (`parse.rs`) builds these; the getters in `mod.rs` and `edge-llm info`
//! (`info.rs`) read them. The type ids and names follow ggml's `gguf_type`.

/// One metadata value, as stored in the file.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(MetaArray),
}

/// A metadata array: all elements share one type; arrays may nest.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<MetaArray>),
}

impl MetaValue {
    /// The type's name as `edge-llm info` and `GgufError::WrongType` show it: `u32`,
    /// `string`, `[f32]` for an array of f32, `[array]` for an array of arrays.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F32(_) => "f32",
            MetaValue::F64(_) => "f64",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(a) => a.type_name(),
        }
    }

    /// The value as a `u64` if it is an integer of any width and not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Whether the value is an integer of any width and sign.
    pub fn is_integer(&self) -> bool {
        matches!(
            self,
            MetaValue::U8(_)
                | MetaValue::I8(_)
                | MetaValue::U16(_)
                | MetaValue::I16(_)
                | MetaValue::U32(_)
                | MetaValue::I32(_)
                | MetaValue::U64(_)
                | MetaValue::I64(_)
        )
    }

    /// The value as an `f32` if it is a float or an integer (rounded to the nearest f32).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetaValue::F32(v) => Some(v),
            MetaValue::F64(v) => Some(v as f32),
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v as f32),
            MetaValue::I32(v) => Some(v as f32),
            MetaValue::U64(v) => Some(v as f32),
            MetaValue::I64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&MetaArray> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl MetaArray {
    pub fn len(&self) -> usize {
        match self {
            MetaArray::U8(v) => v.len(),
            MetaArray::I8(v) => v.len(),
            MetaArray::U16(v) => v.len(),
            MetaArray::I16(v) => v.len(),
            MetaArray::U32(v) => v.len(),
            MetaArray::I32(v) => v.len(),
            MetaArray::U64(v) => v.len(),
            MetaArray::I64(v) => v.len(),
            MetaArray::F32(v) => v.len(),
            MetaArray::F64(v) => v.len(),
            MetaArray::Bool(v) => v.len(),
            MetaArray::String(v) => v.len(),
            MetaArray::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `[u8]`, `[string]`, `[array]`, ...: the array's type as `MetaValue::type_name` shows it.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaArray::U8(_) => "[u8]",
            MetaArray::I8(_) => "[i8]",
            MetaArray::U16(_) => "[u16]",
            MetaArray::I16(_) => "[i16]",
            MetaArray::U32(_) => "[u32]",
            MetaArray::I32(_) => "[i32]",
            MetaArray::U64(_) => "[u64]",
            MetaArray::I64(_) => "[i64]",
            MetaArray::F32(_) => "[f32]",
            MetaArray::F64(_) => "[f64]",
            MetaArray::Bool(_) => "[bool]",
            MetaArray::String(_) => "[string]",
            MetaArray::Array(_) => "[array]",
        }
    }
}

/// A GGUF metadata value type id (ggml's `gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub(crate) fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The fewest bytes one value of this type takes in the file: the fixed width, or the
    /// length prefix of a string (u64), or the element type and count of an array (u32 + u64).
    /// Used to cap an array's claimed length by the bytes left in the file.
    pub(crate) fn min_bytes(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}
