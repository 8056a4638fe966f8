//! What a model file's header says (family, training context, quantization, size), read without
//! loading the model: `GET /models` lists it, and a file that cannot be read is listed as
//! unavailable with the reason. Called by `registry` when it builds the catalog.

use std::path::Path;

/// What a model file's header says, read without loading it.
#[derive(Clone, Debug)]
pub struct FileInfo {
    /// `general.architecture` (llama, qwen2, gemma3...).
    pub family: String,
    /// `<family>.context_length`: the training context.
    pub context_length: u64,
    /// `general.file_type` by its llama.cpp name (Q4_K_M...), when known.
    pub quantization: Option<&'static str>,
    pub size_bytes: u64,
}

/// The header of `path` (mapped, not loaded), or why it cannot be read.
pub(super) fn read_info(path: &Path) -> std::result::Result<FileInfo, String> {
    let file = crate::gguf::GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let family = file
        .architecture()
        .map_err(|e| format!("{}: {e}", path.display()))?
        .to_string();
    let context_length = file
        .get_u64(&format!("{family}.context_length"))
        .unwrap_or(0);
    let quantization = file
        .get_u64("general.file_type")
        .ok()
        .and_then(file_type_name);
    Ok(FileInfo {
        family,
        context_length,
        quantization,
        size_bytes: file.file_bytes(),
    })
}

/// llama.cpp's names of `general.file_type` (`llama_ftype`).
fn file_type_name(t: u64) -> Option<&'static str> {
    Some(match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => return None,
    })
}
