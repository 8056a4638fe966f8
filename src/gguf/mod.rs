//! The GGUF reader: `GgufFile` opens a model file, memory-maps it, validates all of it, and
//! hands out typed metadata and zero-copy tensor data.
//!
//! Called by the model loader (weights, hyper-parameters), the tokenizer (vocabulary in the
//! metadata) and `edge-llm info` (`write_info`). Nothing here trusts the file: a hostile or
//! truncated file gives a `GgufError` naming the problem, never a panic or an out-of-bounds
//! read. The format is described in `parse.rs`.
//!
//! - `error.rs`: `GgufError`
//! - `value.rs`: `MetaValue`, `MetaArray`
//! - `tensor_info.rs`: `TensorInfo`
//! - `cursor.rs`, `parse.rs`: the parser
//! - `info.rs`: `GgufFile::write_info`

mod cursor;
mod error;
mod info;
mod parse;
mod tensor_info;
mod value;

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

pub use error::GgufError;
pub use parse::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT};
pub use tensor_info::{TensorInfo, MAX_DIMS};
pub use value::{MetaArray, MetaValue};

/// An open, validated GGUF file. Tensor data stays in the memory map; `tensor_data` borrows
/// it. `Send + Sync`: share it between threads by reference or `Arc`.
pub struct GgufFile {
    /// 2 or 3.
    pub version: u32,
    /// Alignment of the data section and of every tensor offset in it.
    pub alignment: u64,
    path: PathBuf,
    mmap: Mmap,
    metadata: Vec<(String, MetaValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// Offset in the file of the data section.
    data_start: u64,
}

impl GgufFile {
    /// Opens, maps and validates the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref().to_path_buf();
        let io_error = |source| GgufError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io_error)?;
        if file.metadata().map_err(io_error)?.is_dir() {
            return Err(io_error(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "is a directory, not a GGUF file",
            )));
        }
        // SAFETY: the map is read-only and lives as long as `GgufFile`. Like every mmap-based
        // model loader (llama.cpp, candle) we assume no one truncates or rewrites the file
        // while it is open; doing so is outside what a safe API can guard against.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io_error)?;
        Self::from_mmap(path, mmap)
    }

    /// Parses and validates the GGUF held in `mmap`; `path` names it in messages.
    fn from_mmap(path: PathBuf, mmap: Mmap) -> Result<GgufFile, GgufError> {
        let parsed = parse::parse(&mmap)?;
        Ok(GgufFile {
            version: parsed.version,
            alignment: parsed.alignment,
            path,
            mmap,
            metadata: parsed.metadata,
            metadata_index: parsed.metadata_index,
            tensors: parsed.tensors,
            tensor_index: parsed.tensor_index,
            data_start: parsed.data_start,
        })
    }

    /// Validates `bytes` as a GGUF file held in memory (a copy goes into an anonymous map);
    /// `name` stands for the path in messages. Used by the fuzz targets (`crate::fuzz`),
    /// which must not touch the disk for every input.
    pub fn from_bytes(name: &str, bytes: &[u8]) -> Result<GgufFile, GgufError> {
        let path = PathBuf::from(name);
        let io_error = |source| GgufError::Io {
            path: path.clone(),
            source,
        };
        let mut map = memmap2::MmapOptions::new()
            .len(bytes.len())
            .map_anon()
            .map_err(io_error)?;
        map.copy_from_slice(bytes);
        let mmap = map.make_read_only().map_err(io_error)?;
        Self::from_mmap(path, mmap)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file's bytes (the memory map).
    pub fn bytes(&self) -> &[u8] {
        &self.mmap
    }

    /// Size of the file in bytes.
    pub fn file_bytes(&self) -> u64 {
        self.mmap.len() as u64
    }

    /// Offset in the file where the data section (and tensor offsets) start.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    // ---- metadata ----

    /// Every metadata entry, in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// Locks the whole mapping in RAM (`mlock`): its pages are faulted in now and never paged
    /// out. Fails where RLIMIT_MEMLOCK is below the file's size.
    pub fn lock_in_memory(&self) -> std::io::Result<()> {
        self.mmap.lock()
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The value of `key`, or `MissingKey`.
    pub fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let value = self.require(key)?;
        value
            .as_str()
            .ok_or_else(|| wrong_type(key, "string", value))
    }

    /// An integer of any width, which must not be negative.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let value = self.require(key)?;
        match value.as_u64() {
            Some(v) => Ok(v),
            None if value.is_integer() => Err(GgufError::BadValue {
                key: key.to_string(),
                value: format!("{value:?}"),
                reason: "expected a non-negative integer",
            }),
            None => Err(wrong_type(key, "an integer", value)),
        }
    }

    /// `get_u64`, or `default` when the key is absent (a present key of the wrong type is
    /// still an error).
    pub fn get_u64_or(&self, key: &str, default: u64) -> Result<u64, GgufError> {
        match self.get(key) {
            None => Ok(default),
            Some(_) => self.get_u64(key),
        }
    }

    /// `get_u64`, as a `usize` (a count or size to allocate).
    pub fn get_usize(&self, key: &str) -> Result<usize, GgufError> {
        let v = self.get_u64(key)?;
        usize::try_from(v).map_err(|_| GgufError::BadValue {
            key: key.to_string(),
            value: v.to_string(),
            reason: "does not fit in usize",
        })
    }

    /// A float (f32, or f64 rounded) or an integer converted to f32.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let value = self.require(key)?;
        value
            .as_f32()
            .ok_or_else(|| wrong_type(key, "a number", value))
    }

    /// `get_f32`, or `default` when the key is absent.
    pub fn get_f32_or(&self, key: &str, default: f32) -> Result<f32, GgufError> {
        match self.get(key) {
            None => Ok(default),
            Some(_) => self.get_f32(key),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        let value = self.require(key)?;
        value
            .as_bool()
            .ok_or_else(|| wrong_type(key, "bool", value))
    }

    /// `get_bool`, or `default` when the key is absent.
    pub fn get_bool_or(&self, key: &str, default: bool) -> Result<bool, GgufError> {
        match self.get(key) {
            None => Ok(default),
            Some(_) => self.get_bool(key),
        }
    }

    /// An array of any element type.
    pub fn get_array(&self, key: &str) -> Result<&MetaArray, GgufError> {
        let value = self.require(key)?;
        value
            .as_array()
            .ok_or_else(|| wrong_type(key, "an array", value))
    }

    pub fn get_str_array(&self, key: &str) -> Result<&[String], GgufError> {
        match self.require(key)? {
            MetaValue::Array(MetaArray::String(v)) => Ok(v),
            value => Err(wrong_type(key, "[string]", value)),
        }
    }

    pub fn get_f32_array(&self, key: &str) -> Result<&[f32], GgufError> {
        match self.require(key)? {
            MetaValue::Array(MetaArray::F32(v)) => Ok(v),
            value => Err(wrong_type(key, "[f32]", value)),
        }
    }

    pub fn get_i32_array(&self, key: &str) -> Result<&[i32], GgufError> {
        match self.require(key)? {
            MetaValue::Array(MetaArray::I32(v)) => Ok(v),
            value => Err(wrong_type(key, "[i32]", value)),
        }
    }

    /// `general.architecture`, e.g. "llama": the prefix of the model's hyper-parameter keys.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    // ---- tensors ----

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`, or `MissingTensor`.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.find_tensor(name)
            .ok_or_else(|| GgufError::MissingTensor {
                name: name.to_string(),
            })
    }

    /// The tensor called `name`, if there is one (for optional weights such as an untied
    /// `output.weight`).
    pub fn find_tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The data of `t`, straight from the map (aligned to `alignment` within the file, and
    /// the map itself is page-aligned).
    ///
    /// # Panics
    /// If `t` did not come from this file (its bounds were validated at `open`).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let range = self
            .data_start
            .checked_add(t.offset)
            .and_then(|start| Some(start..start.checked_add(t.n_bytes)?))
            .and_then(|r| Some(usize::try_from(r.start).ok()?..usize::try_from(r.end).ok()?));
        range
            .and_then(|r| self.mmap.get(r))
            .unwrap_or_else(|| panic!("tensor '{}' is not from {}", t.name, self.path.display()))
    }

    /// Tells the OS this process no longer needs the pages of `data` (a slice of this file's map,
    /// such as part of a tensor the model keeps in another layout): `madvise(MADV_DONTNEED)` on the
    /// whole pages inside it, so they leave the process's resident memory. Best effort: a failure
    /// (locked pages, say), or a slice from elsewhere, changes nothing. Reading the data again stays
    /// correct: the map is read-only and backed by the file, so its pages fault back in with the
    /// same bytes.
    pub fn release_pages(&self, data: &[u8]) {
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|p| usize::try_from(p).ok())
            .filter(|&p| p > 0)
            .unwrap_or(4096);
        let base = self.mmap.as_ptr() as usize;
        let (begin, end) = (data.as_ptr() as usize, data.as_ptr() as usize + data.len());
        if begin < base || end > base + self.mmap.len() {
            return;
        }
        let (start, stop) = (
            (begin - base).next_multiple_of(page),
            (end - base) / page * page,
        );
        if stop > start {
            // SAFETY: the map is read-only and file-backed, so MADV_DONTNEED only drops pages that
            // reload with identical contents on the next access; nothing holds them mutably.
            let _ = unsafe {
                self.mmap.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start,
                    stop - start,
                )
            };
        }
    }

    /// Sum of all tensors' data sizes.
    pub fn total_tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_bytes).sum()
    }
}

fn wrong_type(key: &str, expected: &'static str, found: &MetaValue) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: found.type_name(),
    }
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("file_bytes", &self.file_bytes())
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_file_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<GgufFile>();
    }
}
