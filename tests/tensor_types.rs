//! `csrc/el_types.h` is the one list of tensor types and block sizes. `TensorType` takes its
//! numbers from the header's bindgen constants; these tests read the header's own text, so they
//! also catch bindings that were not regenerated after a header edit (as tests/bindings_drift.rs
//! does by hash), and check both ways that every type is in the header and in `TensorType`:
//! - each `TensorType`'s ggml id, elements per block and bytes per block equal the header's
//!   `EL_TYPE_<T>`, `EL_<T>_ELEMS` and `EL_<T>_BYTES`;
//! - the C kernels' run-time table (`el_type_block_size`, `el_type_block_bytes`) agrees;
//! - no other file under csrc/ or src/cuda/ defines a copy of the list or of the sizes.

use std::collections::BTreeMap;
use std::path::Path;

use edge_llm::kernels::tensor_type::{TensorType, QK, QK_K};
use edge_llm::kernels::{c_block_bytes, c_block_size};

const HEADER: &str = include_str!("../csrc/el_types.h");

/// The header without its comments.
fn strip_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        let end = rest[i..].find("*/").expect("unterminated comment") + i + 2;
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The header's `enum el_type`: type name (without EL_TYPE_) -> id.
fn header_types() -> BTreeMap<String, u32> {
    let text = strip_comments(HEADER);
    let start = text
        .find("enum el_type {")
        .expect("enum el_type in el_types.h");
    let body = &text[start + "enum el_type {".len()..];
    let body = &body[..body.find('}').expect("end of enum el_type")];
    let mut types = BTreeMap::new();
    for item in body.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, value) = item
            .split_once('=')
            .unwrap_or_else(|| panic!("enum el_type: {item:?} has no explicit value"));
        let name = name
            .trim()
            .strip_prefix("EL_TYPE_")
            .unwrap_or_else(|| panic!("enum el_type: {name:?} lacks the EL_TYPE_ prefix"));
        let value: u32 = value.trim().parse().expect("enum el_type: a decimal id");
        assert!(
            types.insert(name.to_string(), value).is_none(),
            "EL_TYPE_{name} twice"
        );
    }
    types
}

/// The header's object-like `#define`s, each evaluated (a decimal or the name of an earlier one).
fn header_defines() -> BTreeMap<String, u64> {
    let mut defines = BTreeMap::new();
    for line in strip_comments(HEADER).lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("#define") {
            continue;
        }
        let (Some(name), Some(value), None) = (words.next(), words.next(), words.next()) else {
            continue; // the include guard
        };
        let value = match value.parse::<u64>() {
            Ok(v) => v,
            Err(_) => *defines
                .get(value)
                .unwrap_or_else(|| panic!("#define {name} {value}: not a number or known name")),
        };
        defines.insert(name.to_string(), value);
    }
    defines
}

#[test]
fn every_tensor_type_matches_the_header() {
    let types = header_types();
    let defines = header_defines();
    for t in TensorType::ALL {
        let name = t.name();
        assert_eq!(
            types.get(name).copied(),
            Some(t.ggml_id()),
            "{name}: ggml id against EL_TYPE_{name} in csrc/el_types.h"
        );
        let elems = defines.get(&format!("EL_{name}_ELEMS")).copied();
        let bytes = defines.get(&format!("EL_{name}_BYTES")).copied();
        assert_eq!(
            elems,
            Some(t.block_size() as u64),
            "{name}: elements per block against EL_{name}_ELEMS in csrc/el_types.h"
        );
        assert_eq!(
            bytes,
            Some(t.block_bytes() as u64),
            "{name}: bytes per block against EL_{name}_BYTES in csrc/el_types.h"
        );
        // The C kernels' dispatch table (csrc/quants.c), compiled against the same header.
        assert_eq!(
            c_block_size(t),
            t.block_size(),
            "{name}: el_type_block_size"
        );
        assert_eq!(
            c_block_bytes(t),
            t.block_bytes(),
            "{name}: el_type_block_bytes"
        );
    }
    assert_eq!(defines.get("EL_QK").copied(), Some(QK as u64), "EL_QK");
    assert_eq!(
        defines.get("EL_QK_K").copied(),
        Some(QK_K as u64),
        "EL_QK_K"
    );
}

#[test]
fn every_header_type_is_a_tensor_type() {
    let types = header_types();
    assert_eq!(types.len(), TensorType::ALL.len(), "types in el_types.h");
    for (name, id) in &types {
        let t = TensorType::from_ggml_id(*id)
            .unwrap_or_else(|| panic!("EL_TYPE_{name} = {id} is no TensorType"));
        assert_eq!(t.name(), name, "ggml id {id}");
    }
    // Every size in the header belongs to a type.
    for name in header_defines().keys() {
        let t = name.strip_prefix("EL_").and_then(|n| {
            n.strip_suffix("_ELEMS")
                .or_else(|| n.strip_suffix("_BYTES"))
        });
        if let Some(t) = t {
            assert!(types.contains_key(t), "{name}: no EL_TYPE_{t}");
        }
    }
}

/// The list used to be written out again in csrc/cuda/el_cuda_common.cuh and el_iq.cuh; no file
/// but el_types.h may define type ids, EL_QK/EL_QK_K or per-type block sizes.
#[test]
fn no_other_copy_of_the_list() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["csrc", "csrc/cuda", "csrc/cuda/emu"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.is_file() && p.file_name().unwrap() != "el_types.h" {
                files.push(p);
            }
        }
    }
    let names: Vec<String> = TensorType::ALL
        .iter()
        .map(|t| t.name().to_string())
        .collect();
    for p in files {
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            !text.contains("enum el_type {"),
            "{}: a second enum el_type",
            p.display()
        );
        for line in text.lines() {
            let Some(rest) = line.trim_start().strip_prefix("#define") else {
                continue;
            };
            let name = rest.split_whitespace().next().unwrap_or("");
            let copy = name.starts_with("EL_TYPE_")
                || name == "EL_QK"
                || name == "EL_QK_K"
                || names
                    .iter()
                    .any(|t| name == format!("EL_{t}_BYTES") || name == format!("EL_{t}_ELEMS"));
            assert!(
                !copy,
                "{}: #define {name}, which csrc/el_types.h owns",
                p.display()
            );
        }
    }
}
