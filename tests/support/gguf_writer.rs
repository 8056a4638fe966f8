//! A GGUF writer for tests: builds small valid files and, through its raw knobs (header
//! counts, raw key bytes and value bodies, raw tensor records), malformed ones.
//!
//! Used by `tests/gguf_malformed.rs` and `tests/cuda_tiny_model.rs` (as `support::gguf_writer`),
//! and by `fuzz/src/bin/make_seeds.rs`. It encodes the format on its own (it shares no code with
//! the reader it tests), following ggml's docs/gguf.md.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use edge_llm::gguf::{MetaArray, MetaValue};
use edge_llm::kernels::tensor_type::TensorType;

use super::splitmix::Rng;

/// GGUF metadata value type ids.
pub mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// One tensor info record plus its data, every field under the test's control.
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: Vec<u8>,
    pub dims: Vec<u64>,
    /// Written as n_dims instead of `dims.len()` when set.
    pub n_dims: Option<u32>,
    pub type_id: u32,
    /// Offset in the data section; `None` places the tensor after the previous one, aligned.
    pub offset: Option<u64>,
    /// Bytes written at the offset (may differ from what the shape needs).
    pub data: Vec<u8>,
}

impl TensorSpec {
    /// A well-formed tensor of `ttype` and shape `dims`, with deterministic data of the
    /// right size.
    pub fn new(name: &str, dims: &[u64], ttype: TensorType) -> TensorSpec {
        let n_elements: u64 = dims.iter().product();
        let n_rows = (n_elements / dims[0]) as usize;
        let n_bytes = ttype.row_bytes(dims[0] as usize).expect("whole blocks") * n_rows;
        TensorSpec {
            name: name.as_bytes().to_vec(),
            dims: dims.to_vec(),
            n_dims: None,
            type_id: ttype.ggml_id(),
            offset: None,
            data: pseudo_random_bytes(n_bytes, name.len() as u64 + n_bytes as u64),
        }
    }
}

/// Builds a GGUF file in memory.
#[derive(Clone, Debug)]
pub struct GgufBuilder {
    pub version: u32,
    /// Alignment used to lay out the data section (the `general.alignment` key is separate:
    /// `with_alignment` sets both).
    pub alignment: u64,
    /// Written as the tensor count instead of the real one when set.
    pub tensor_count: Option<u64>,
    /// Written as the metadata count instead of the real one when set.
    pub metadata_count: Option<u64>,
    /// Key bytes and encoded value (type id, then the value).
    pub metadata: Vec<(Vec<u8>, Vec<u8>)>,
    pub tensors: Vec<TensorSpec>,
}

impl Default for GgufBuilder {
    fn default() -> Self {
        GgufBuilder::new(3)
    }
}

impl GgufBuilder {
    pub fn new(version: u32) -> GgufBuilder {
        GgufBuilder {
            version,
            alignment: 32,
            tensor_count: None,
            metadata_count: None,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Lays the data out at `alignment` and records it as `general.alignment` (u32).
    pub fn with_alignment(&mut self, alignment: u32) -> &mut Self {
        self.alignment = alignment.into();
        self.kv("general.alignment", &MetaValue::U32(alignment))
    }

    pub fn kv(&mut self, key: &str, value: &MetaValue) -> &mut Self {
        let mut body = Vec::new();
        put_u32(&mut body, value_type_id(value));
        encode_value(&mut body, value);
        self.kv_raw(key.as_bytes(), body)
    }

    /// A metadata entry with raw key bytes and a raw body (type id and value, as written).
    pub fn kv_raw(&mut self, key: &[u8], body: Vec<u8>) -> &mut Self {
        self.metadata.push((key.to_vec(), body));
        self
    }

    pub fn tensor(&mut self, name: &str, dims: &[u64], ttype: TensorType) -> &mut Self {
        self.tensor_spec(TensorSpec::new(name, dims, ttype))
    }

    pub fn tensor_spec(&mut self, spec: TensorSpec) -> &mut Self {
        self.tensors.push(spec);
        self
    }

    /// The offsets `build` gives each tensor in the data section.
    pub fn offsets(&self) -> Vec<u64> {
        let mut next = 0u64;
        self.tensors
            .iter()
            .map(|t| {
                let offset = t
                    .offset
                    .unwrap_or_else(|| next.next_multiple_of(self.alignment));
                next = next.max(offset + t.data.len() as u64);
                offset
            })
            .collect()
    }

    /// The file's bytes. It ends where the last tensor's data ends.
    pub fn build(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        put_u32(&mut out, self.version);
        put_u64(
            &mut out,
            self.tensor_count.unwrap_or(self.tensors.len() as u64),
        );
        put_u64(
            &mut out,
            self.metadata_count.unwrap_or(self.metadata.len() as u64),
        );
        for (key, body) in &self.metadata {
            put_bytes(&mut out, key);
            out.extend_from_slice(body);
        }
        let offsets = self.offsets();
        for (t, &offset) in self.tensors.iter().zip(&offsets) {
            put_bytes(&mut out, &t.name);
            put_u32(&mut out, t.n_dims.unwrap_or(t.dims.len() as u32));
            for &d in &t.dims {
                put_u64(&mut out, d);
            }
            put_u32(&mut out, t.type_id);
            put_u64(&mut out, offset);
        }
        if self.tensors.is_empty() {
            return out;
        }
        out.resize(
            (out.len() as u64).next_multiple_of(self.alignment) as usize,
            0,
        );
        let data_start = out.len();
        for (t, &offset) in self.tensors.iter().zip(&offsets) {
            if t.data.is_empty() {
                continue;
            }
            let start = data_start + offset as usize;
            let end = start + t.data.len();
            if out.len() < end {
                out.resize(end, 0);
            }
            out[start..end].copy_from_slice(&t.data);
        }
        out
    }

    /// Builds the file into a fresh temporary path, removed when the `TempFile` drops.
    pub fn write_temp(&self, tag: &str) -> TempFile {
        TempFile::with_bytes(tag, &self.build())
    }
}

/// The type id `kv` writes for `value`.
pub fn value_type_id(value: &MetaValue) -> u32 {
    match value {
        MetaValue::U8(_) => type_id::U8,
        MetaValue::I8(_) => type_id::I8,
        MetaValue::U16(_) => type_id::U16,
        MetaValue::I16(_) => type_id::I16,
        MetaValue::U32(_) => type_id::U32,
        MetaValue::I32(_) => type_id::I32,
        MetaValue::U64(_) => type_id::U64,
        MetaValue::I64(_) => type_id::I64,
        MetaValue::F32(_) => type_id::F32,
        MetaValue::F64(_) => type_id::F64,
        MetaValue::Bool(_) => type_id::BOOL,
        MetaValue::String(_) => type_id::STRING,
        MetaValue::Array(_) => type_id::ARRAY,
    }
}

fn array_elem_type_id(a: &MetaArray) -> u32 {
    match a {
        MetaArray::U8(_) => type_id::U8,
        MetaArray::I8(_) => type_id::I8,
        MetaArray::U16(_) => type_id::U16,
        MetaArray::I16(_) => type_id::I16,
        MetaArray::U32(_) => type_id::U32,
        MetaArray::I32(_) => type_id::I32,
        MetaArray::U64(_) => type_id::U64,
        MetaArray::I64(_) => type_id::I64,
        MetaArray::F32(_) => type_id::F32,
        MetaArray::F64(_) => type_id::F64,
        MetaArray::Bool(_) => type_id::BOOL,
        MetaArray::String(_) => type_id::STRING,
        MetaArray::Array(_) => type_id::ARRAY,
    }
}

/// A value without its type id.
pub fn encode_value(out: &mut Vec<u8>, value: &MetaValue) {
    match value {
        MetaValue::U8(v) => out.push(*v),
        MetaValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::Bool(v) => out.push(u8::from(*v)),
        MetaValue::String(s) => put_bytes(out, s.as_bytes()),
        MetaValue::Array(a) => encode_array(out, a),
    }
}

/// An array body: element type id, u64 count, elements.
pub fn encode_array(out: &mut Vec<u8>, a: &MetaArray) {
    put_u32(out, array_elem_type_id(a));
    put_u64(out, a.len() as u64);
    fn each<T>(out: &mut Vec<u8>, v: &[T], f: impl Fn(&mut Vec<u8>, &T)) {
        for x in v {
            f(out, x);
        }
    }
    match a {
        MetaArray::U8(v) => out.extend_from_slice(v),
        MetaArray::I8(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        MetaArray::U16(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        MetaArray::I16(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        MetaArray::U32(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        MetaArray::I32(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        MetaArray::U64(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        MetaArray::I64(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        MetaArray::F32(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        MetaArray::F64(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        MetaArray::Bool(v) => each(out, v, |o, x| o.push(u8::from(*x))),
        MetaArray::String(v) => each(out, v, |o, s| put_bytes(o, s.as_bytes())),
        MetaArray::Array(v) => each(out, v, encode_array),
    }
}

pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// A GGUF string: u64 length, then the bytes (which need not be UTF-8 here).
pub fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u64(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// `n` deterministic bytes drawn from `seed` (tensor data).
pub fn pseudo_random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    (0..n).map(|_| rng.next_u64() as u8).collect()
}

/// A file in the temp dir with a unique name, deleted on drop.
pub struct TempFile {
    pub path: PathBuf,
}

impl TempFile {
    pub fn with_bytes(tag: &str, bytes: &[u8]) -> TempFile {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "edge-llm-test-{}-{n}-{tag}.gguf",
            std::process::id()
        ));
        std::fs::write(&path, bytes).expect("write temp GGUF");
        // `scripts/fuzz.sh` collects the files the tests make as seeds for the GGUF fuzz target.
        if let Some(dir) = std::env::var_os("EDGE_LLM_GGUF_SEED_DIR") {
            let _ = std::fs::write(Path::new(&dir).join(format!("{n}-{tag}.gguf")), bytes);
        }
        TempFile { path }
    }

    /// Replaces the file's contents.
    pub fn rewrite(&self, bytes: &[u8]) {
        std::fs::write(&self.path, bytes).expect("rewrite temp GGUF");
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
