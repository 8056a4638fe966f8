//! Writes the GGUF target's seeds from the real models into a folder: for each model, a tiny
//! model of the same architecture (every metadata key, vocabulary arrays cut to 256 entries,
//! hyper-parameters shrunk, the real tensor names and types at tiny shapes, so the seed opens and
//! loads all the way), and the file's first 64 KiB (a truncated copy).
//!
//! Usage: `make-seeds MODELS_DIR OUT_DIR`. Run by `scripts/fuzz.sh`.

// The tests' GGUF writer, with the random generator it uses (`super::splitmix`).
#[path = "../../../tests/support/gguf_writer.rs"]
#[allow(dead_code)]
mod gguf_writer;
#[path = "../../../tests/support/splitmix.rs"]
#[allow(dead_code)]
mod splitmix;

use std::path::Path;

use edge_llm::gguf::{GgufFile, MetaArray, MetaValue};
use edge_llm::kernels::tensor_type::TensorType;
use gguf_writer::{GgufBuilder, TensorSpec};

/// Tiny sizes: embedding 256 (whole K-quant blocks), 4 query heads of 64, one KV head.
const N_EMBD: u64 = 256;
const N_FF: u64 = 256;
const N_VOCAB: u64 = 256;
const HEAD_DIM: u64 = 64;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, models, out] = args.as_slice() else {
        eprintln!("usage: make-seeds MODELS_DIR OUT_DIR");
        std::process::exit(2);
    };
    std::fs::create_dir_all(out).expect("creating the seed folder");
    for entry in std::fs::read_dir(models).expect("reading the models folder") {
        let path = entry.expect("listing the models folder").path();
        if path.extension().is_none_or(|e| e != "gguf") || !path.exists() {
            continue;
        }
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let tiny = tiny_model(&path);
        std::fs::write(Path::new(out).join(format!("{stem}-tiny.gguf")), &tiny).unwrap();
        let head = std::fs::read(&path).expect("reading the model");
        let cut = &head[..head.len().min(64 << 10)];
        std::fs::write(Path::new(out).join(format!("{stem}-first-64k.gguf")), cut).unwrap();
        eprintln!("{stem}: tiny model {} bytes", tiny.len());
    }
}

fn tiny_model(path: &Path) -> Vec<u8> {
    let g = GgufFile::open(path).expect("opening the model");
    let arch = g.architecture().expect("general.architecture").to_string();
    let hp = |k: &str| g.get_u64(&format!("{arch}.{k}")).ok();
    let n_embd = hp("embedding_length").unwrap();
    let n_ff = hp("feed_forward_length").unwrap();
    let n_head = hp("attention.head_count").unwrap();
    let head_dim = hp("attention.key_length").unwrap_or(n_embd / n_head);
    let kv_dim = head_dim * hp("attention.head_count_kv").unwrap_or(n_head);
    let n_vocab = g.get_str_array("tokenizer.ggml.tokens").unwrap().len() as u64;

    let mut b = GgufBuilder::new(g.version);
    for (key, value) in g.metadata() {
        let value = match (key.strip_prefix(&format!("{arch}.")), value) {
            (Some("embedding_length"), _) => MetaValue::U32(N_EMBD as u32),
            (Some("feed_forward_length"), _) => MetaValue::U32(N_FF as u32),
            (Some("block_count"), _) => MetaValue::U32(1),
            (Some("attention.head_count"), _) => MetaValue::U32((N_EMBD / HEAD_DIM) as u32),
            (Some("attention.head_count_kv"), _) => MetaValue::U32(1),
            (Some("attention.key_length" | "attention.value_length"), _) => {
                MetaValue::U32(HEAD_DIM as u32)
            }
            (Some("vocab_size"), _) => MetaValue::U32(N_VOCAB as u32),
            _ if key.ends_with("_token_id") => match value.as_u64() {
                Some(id) => MetaValue::U32((id % N_VOCAB) as u32),
                None => value.clone(),
            },
            (_, MetaValue::Array(a)) => MetaValue::Array(truncate(a, N_VOCAB as usize)),
            _ => value.clone(),
        };
        b.kv(key, &value);
    }
    let shrink = |d: u64| match d {
        d if d == n_vocab => N_VOCAB,
        d if d == n_embd || d == n_ff || d == n_head * head_dim => N_EMBD,
        d if d == kv_dim || d == head_dim => HEAD_DIM,
        d => d,
    };
    for t in g.tensors() {
        let Some(rest) = t.name.strip_prefix("blk.") else {
            b.tensor_spec(spec(&t.name, t.dims.iter().map(|&d| shrink(d)), t.ttype));
            continue;
        };
        if rest.starts_with("0.") {
            b.tensor_spec(spec(&t.name, t.dims.iter().map(|&d| shrink(d)), t.ttype));
        }
    }
    b.build()
}

/// A tensor of `ttype` if its rows are whole blocks, else F32.
fn spec(name: &str, dims: impl Iterator<Item = u64>, ttype: TensorType) -> TensorSpec {
    let dims: Vec<u64> = dims.collect();
    let ttype = match ttype.row_bytes(dims[0] as usize) {
        Some(_) => ttype,
        None => TensorType::F32,
    };
    TensorSpec::new(name, &dims, ttype)
}

fn truncate(a: &MetaArray, n: usize) -> MetaArray {
    match a {
        MetaArray::String(v) => MetaArray::String(v.iter().take(n).cloned().collect()),
        MetaArray::F32(v) => MetaArray::F32(v.iter().take(n).copied().collect()),
        MetaArray::I32(v) => MetaArray::I32(v.iter().take(n).copied().collect()),
        other => other.clone(),
    }
}
