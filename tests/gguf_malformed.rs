//! The GGUF reader against valid files (v2, v3, every value type, custom alignment, the real
//! default model) and against malformed ones: each must give its own `GgufError` naming the
//! key or tensor at fault, and no input may panic (every truncation, random byte flips).
//!
//! Files are built by `support/gguf_writer.rs` into the temp dir.

mod support;

use edge_llm::gguf::{GgufError, GgufFile, MetaArray, MetaValue};
use edge_llm::kernels::tensor_type::TensorType;
use support::gguf_writer::{
    put_bytes, put_u32, put_u64, type_id, GgufBuilder, TempFile, TensorSpec,
};
use support::splitmix::Rng;

// ---- helpers ----

fn open(b: &GgufBuilder, tag: &str) -> Result<GgufFile, GgufError> {
    let file = b.write_temp(tag);
    GgufFile::open(file.path())
}

/// Opens a file that must fail, returning the error.
fn open_err(b: &GgufBuilder, tag: &str) -> GgufError {
    match open(b, tag) {
        Ok(f) => panic!("{tag}: expected an error, opened {f:?}"),
        Err(e) => e,
    }
}

/// Asserts the error's message contains each of `parts`.
fn assert_mentions(e: &GgufError, parts: &[&str]) {
    let msg = e.to_string();
    for part in parts {
        assert!(
            msg.contains(part),
            "message {msg:?} should mention {part:?}"
        );
    }
}

fn s(v: &str) -> MetaValue {
    MetaValue::String(v.to_string())
}

/// One metadata entry of every type, including a nested array and an empty one.
fn every_value() -> Vec<(&'static str, MetaValue)> {
    vec![
        ("general.architecture", s("llama")),
        ("test.u8", MetaValue::U8(200)),
        ("test.i8", MetaValue::I8(-100)),
        ("test.u16", MetaValue::U16(60_000)),
        ("test.i16", MetaValue::I16(-30_000)),
        ("test.u32", MetaValue::U32(4_000_000_000)),
        ("test.i32", MetaValue::I32(-2_000_000_000)),
        ("test.u64", MetaValue::U64(u64::MAX - 1)),
        ("test.i64", MetaValue::I64(i64::MIN + 1)),
        ("test.f32", MetaValue::F32(1.5e-5)),
        ("test.f64", MetaValue::F64(-2.25e100)),
        ("test.bool", MetaValue::Bool(true)),
        ("test.string", s("héllo, wörld \u{1F600}")),
        ("test.empty_string", s("")),
        (
            "test.arr_u8",
            MetaValue::Array(MetaArray::U8(vec![0, 1, 255])),
        ),
        (
            "test.arr_i8",
            MetaValue::Array(MetaArray::I8(vec![-128, 0, 127])),
        ),
        (
            "test.arr_u16",
            MetaValue::Array(MetaArray::U16(vec![1, 65535])),
        ),
        (
            "test.arr_i16",
            MetaValue::Array(MetaArray::I16(vec![-32768, 7])),
        ),
        (
            "test.arr_u32",
            MetaValue::Array(MetaArray::U32(vec![1, 2, 3])),
        ),
        (
            "test.arr_i32",
            MetaValue::Array(MetaArray::I32(vec![-1, 0, 1, 2])),
        ),
        (
            "test.arr_u64",
            MetaValue::Array(MetaArray::U64(vec![u64::MAX])),
        ),
        (
            "test.arr_i64",
            MetaValue::Array(MetaArray::I64(vec![i64::MIN, i64::MAX])),
        ),
        (
            "test.arr_f32",
            MetaValue::Array(MetaArray::F32(vec![0.5, -1.0, 3.25])),
        ),
        (
            "test.arr_f64",
            MetaValue::Array(MetaArray::F64(vec![1e-300, 2.0])),
        ),
        (
            "test.arr_bool",
            MetaValue::Array(MetaArray::Bool(vec![true, false, true])),
        ),
        (
            "test.arr_string",
            MetaValue::Array(MetaArray::String(vec!["a".into(), "".into(), "ünï".into()])),
        ),
        ("test.arr_empty", MetaValue::Array(MetaArray::F32(vec![]))),
        (
            "test.arr_nested",
            MetaValue::Array(MetaArray::Array(vec![
                MetaArray::I32(vec![1, 2]),
                MetaArray::String(vec!["x".into()]),
                MetaArray::Array(vec![MetaArray::U8(vec![9]), MetaArray::Bool(vec![])]),
            ])),
        ),
    ]
}

/// A small valid file: every value type and tensors of several types.
fn valid_builder(version: u32) -> GgufBuilder {
    let mut b = GgufBuilder::new(version);
    for (key, value) in every_value() {
        b.kv(key, &value);
    }
    b.tensor("token_embd.weight", &[64, 3], TensorType::Q4_0)
        .tensor("norm.weight", &[5], TensorType::F32) // 20 bytes: the next one gets padded
        .tensor("blk.0.attn_q.weight", &[32, 2, 2], TensorType::Q8_0)
        .tensor("blk.0.ffn.weight", &[256, 2], TensorType::Q4_K)
        .tensor("four_d", &[2, 3, 1, 2], TensorType::F16)
        .tensor("output.weight", &[32, 2], TensorType::Q4_1);
    b
}

/// Checks that `f` holds exactly what `b` wrote.
fn assert_reads_back(f: &GgufFile, b: &GgufBuilder) {
    // Metadata: same entries, same order.
    let expected = every_value_or_alignment(b);
    assert_eq!(b.metadata.len(), expected.len());
    assert_eq!(f.metadata(), expected.as_slice());
    for (key, value) in &expected {
        assert_eq!(f.get(key), Some(value), "{key}");
    }

    // Tensors: names, shapes, types, offsets, sizes, data.
    assert_eq!(f.tensors().len(), b.tensors.len());
    for ((t, spec), offset) in f.tensors().iter().zip(&b.tensors).zip(b.offsets()) {
        assert_eq!(t.name.as_bytes(), spec.name.as_slice());
        assert_eq!(t.dims, spec.dims);
        assert_eq!(t.ttype.ggml_id(), spec.type_id);
        assert_eq!(t.offset, offset);
        assert_eq!(t.offset % f.alignment, 0);
        assert_eq!(t.n_bytes, spec.data.len() as u64, "{}", t.name);
        assert_eq!(f.tensor_data(t), spec.data.as_slice(), "{}", t.name);
        assert_eq!(f.tensor(&t.name).unwrap(), t);
        assert_eq!((f.data_start() + t.offset) % f.alignment, 0);
    }
}

/// The entries `b` wrote, decoded from the test's own list (plus `general.alignment` when
/// `with_alignment` added it first).
fn every_value_or_alignment(b: &GgufBuilder) -> Vec<(String, MetaValue)> {
    let mut out = Vec::new();
    if b.metadata
        .first()
        .is_some_and(|(k, _)| k == b"general.alignment")
    {
        out.push((
            "general.alignment".to_string(),
            MetaValue::U32(b.alignment as u32),
        ));
    }
    out.extend(every_value().into_iter().map(|(k, v)| (k.to_string(), v)));
    out
}

// ---- valid files ----

#[test]
fn valid_v3_reads_back_exactly() {
    let b = valid_builder(3);
    let f = open(&b, "valid-v3").unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 32);
    assert_reads_back(&f, &b);

    let t = f.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(t.ttype, TensorType::Q8_0);
    assert_eq!((t.n_elements(), t.row_len(), t.n_rows()), (128, 32, 4));
    assert_eq!(t.n_bytes, 4 * 34);
    assert_eq!(f.tensor("four_d").unwrap().n_rows(), 6);
    assert_eq!(f.tensor("norm.weight").unwrap().n_rows(), 1);
    assert_eq!(f.file_bytes(), b.build().len() as u64);
}

#[test]
fn valid_v2_reads_back_exactly() {
    let b = valid_builder(2);
    let f = open(&b, "valid-v2").unwrap();
    assert_eq!(f.version, 2);
    assert_reads_back(&f, &b);
}

#[test]
fn typed_getters() {
    let f = open(&valid_builder(3), "getters").unwrap();
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.get_str("test.string").unwrap(), "héllo, wörld \u{1F600}");
    assert_eq!(f.get_u64("test.u8").unwrap(), 200);
    assert_eq!(f.get_u64("test.u32").unwrap(), 4_000_000_000);
    assert_eq!(f.get_u64("test.u64").unwrap(), u64::MAX - 1);
    assert_eq!(f.get_usize("test.u16").unwrap(), 60_000);
    assert_eq!(f.get_f32("test.f32").unwrap(), 1.5e-5);
    assert_eq!(f.get_f32("test.u16").unwrap(), 60_000.0);
    assert_eq!(f.get_f32("test.i8").unwrap(), -100.0);
    assert!(f.get_bool("test.bool").unwrap());
    assert_eq!(
        f.get_str_array("test.arr_string").unwrap(),
        ["a", "", "ünï"]
    );
    assert_eq!(f.get_f32_array("test.arr_f32").unwrap(), [0.5, -1.0, 3.25]);
    assert_eq!(f.get_i32_array("test.arr_i32").unwrap(), [-1, 0, 1, 2]);
    assert_eq!(f.get_array("test.arr_nested").unwrap().len(), 3);
    assert_eq!(f.get_u64_or("test.absent", 7).unwrap(), 7);
    assert_eq!(f.get_u64_or("test.u8", 7).unwrap(), 200);
    assert_eq!(f.get_f32_or("test.absent", 0.25).unwrap(), 0.25);
    assert!(!f.get_bool_or("test.absent", false).unwrap());
    assert!(f.find_tensor("nope").is_none());
    assert_eq!(f.get("test.arr_u8").unwrap().type_name(), "[u8]");
    assert_eq!(f.get("test.f64").unwrap().type_name(), "f64");
}

#[test]
fn missing_key_and_wrong_type_name_the_key() {
    let f = open(&valid_builder(3), "wrong-type").unwrap();

    let e = f.get_u64("llama.block_count").unwrap_err();
    assert!(matches!(&e, GgufError::MissingKey { key } if key == "llama.block_count"));
    assert_mentions(&e, &["llama.block_count"]);

    let e = f.get_str("test.u32").unwrap_err();
    assert!(matches!(
        &e,
        GgufError::WrongType { key, expected: "string", found: "u32" } if key == "test.u32"
    ));
    assert_mentions(&e, &["test.u32", "string", "u32"]);

    let e = f.get_str_array("test.arr_f32").unwrap_err();
    assert!(matches!(
        &e,
        GgufError::WrongType {
            expected: "[string]",
            found: "[f32]",
            ..
        }
    ));
    assert!(matches!(
        f.get_u64("test.string").unwrap_err(),
        GgufError::WrongType {
            found: "string",
            ..
        }
    ));
    assert!(matches!(
        f.get_f32("test.bool").unwrap_err(),
        GgufError::WrongType { .. }
    ));
    assert!(matches!(
        f.get_bool("test.u8").unwrap_err(),
        GgufError::WrongType { .. }
    ));
    assert!(matches!(
        f.get_i32_array("test.arr_u32").unwrap_err(),
        GgufError::WrongType { .. }
    ));
    assert!(matches!(
        f.get_u64_or("test.string", 1).unwrap_err(),
        GgufError::WrongType { .. }
    ));

    let e = f.get_u64("test.i8").unwrap_err();
    assert!(matches!(&e, GgufError::BadValue { key, .. } if key == "test.i8"));
    assert_mentions(&e, &["test.i8", "-100"]);
}

#[test]
fn missing_tensor_names_it() {
    let f = open(&valid_builder(3), "missing-tensor").unwrap();
    let e = f.tensor("blk.7.attn_k.weight").unwrap_err();
    assert!(matches!(&e, GgufError::MissingTensor { name } if name == "blk.7.attn_k.weight"));
    assert_mentions(&e, &["blk.7.attn_k.weight"]);
}

#[test]
fn custom_alignment() {
    for alignment in [1u32, 8, 64, 256] {
        let mut b = GgufBuilder::new(3);
        b.with_alignment(alignment);
        for (key, value) in every_value() {
            b.kv(key, &value);
        }
        b.tensor("a", &[3], TensorType::F32)
            .tensor("b", &[32], TensorType::Q8_0)
            .tensor("c", &[7, 2], TensorType::F16);
        let f = open(&b, "alignment").unwrap();
        assert_eq!(f.alignment, u64::from(alignment));
        assert_eq!(
            f.get_u64("general.alignment").unwrap(),
            u64::from(alignment)
        );
        assert_eq!(f.data_start() % u64::from(alignment), 0);
        assert_reads_back(&f, &b);
    }
}

#[test]
fn no_tensors_and_no_metadata() {
    let f = open(&GgufBuilder::new(3), "empty").unwrap();
    assert!(f.metadata().is_empty());
    assert!(f.tensors().is_empty());
    assert!(matches!(
        f.architecture().unwrap_err(),
        GgufError::MissingKey { .. }
    ));
    let mut out = Vec::new();
    f.write_info(&mut out).unwrap();
}

#[test]
fn write_info_shows_header_metadata_and_tensors() {
    let mut b = valid_builder(3);
    b.kv(
        "tokenizer.chat_template",
        &s(&"{% for m in messages %}".repeat(20)),
    );
    b.kv(
        "tokenizer.ggml.tokens",
        &MetaValue::Array(MetaArray::String(
            (0..1000).map(|i| format!("tok{i}")).collect(),
        )),
    );
    let file = b.write_temp("info");
    let f = GgufFile::open(file.path()).unwrap();
    let mut out = Vec::new();
    f.write_info(&mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    for needle in [
        "version:    3",
        "alignment:  32",
        "general.architecture",
        "\"llama\"",
        "1000 items]",
        "(460 bytes)",
        "token_embd.weight",
        "Q4_K",
        "[2, 3, 1, 2]",
        "[[1, 2], [\"x\"], [[9], []]]",
    ] {
        assert!(
            text.contains(needle),
            "info should contain {needle:?}:\n{text}"
        );
    }
    // The tensor table's columns line up: every row has its type at the same column.
    let rows: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "tensors:")
        .skip(1)
        .collect();
    let type_col = rows[0].find("type").unwrap();
    for row in &rows[1..] {
        assert!(
            row[type_col..].starts_with(['F', 'Q']),
            "misaligned row {row:?}"
        );
    }
}

// ---- malformed headers ----

#[test]
fn bad_magic_shows_the_bytes() {
    let mut bytes = valid_builder(3).build();
    bytes[..4].copy_from_slice(b"GGML");
    let file = TempFile::with_bytes("magic", &bytes);
    let e = GgufFile::open(file.path()).unwrap_err();
    assert!(matches!(e, GgufError::BadMagic { found } if &found == b"GGML"));
    assert_mentions(&e, &["GGML"]);
}

#[test]
fn unsupported_versions() {
    for version in [0, 1, 4, 99, 0x0300_0000] {
        let e = open_err(&GgufBuilder::new(version), "version");
        assert!(
            matches!(e, GgufError::UnsupportedVersion { version: v } if v == version),
            "{e}"
        );
        assert_mentions(&e, &[&version.to_string()]);
    }
}

#[test]
fn missing_file_names_the_path() {
    let path = std::env::temp_dir().join("edge-llm-test-does-not-exist.gguf");
    let e = GgufFile::open(&path).unwrap_err();
    assert!(matches!(&e, GgufError::Io { path: p, .. } if p == &path));
    assert_mentions(&e, &["edge-llm-test-does-not-exist.gguf"]);
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = valid_builder(3).build();
    let file = TempFile::with_bytes("truncated", &bytes);
    for len in 0..bytes.len() {
        file.rewrite(&bytes[..len]);
        match GgufFile::open(file.path()) {
            Ok(_) => panic!("a {len}-byte prefix of a {}-byte file opened", bytes.len()),
            Err(
                GgufError::Truncated { .. }
                | GgufError::CountTooLarge { .. }
                | GgufError::TensorPastEof { .. },
            ) => {}
            Err(e) => panic!("a {len}-byte prefix gave an unexpected error: {e}"),
        }
    }
    file.rewrite(&bytes);
    GgufFile::open(file.path()).unwrap();
}

#[test]
fn truncated_error_says_what_and_where() {
    let mut b = GgufBuilder::new(3);
    b.kv("general.name", &s("a fairly long model name"));
    let bytes = b.build();
    let file = TempFile::with_bytes("truncated-msg", &bytes[..bytes.len() - 3]);
    let e = GgufFile::open(file.path()).unwrap_err();
    assert!(
        matches!(&e, GgufError::Truncated { what, offset, needed: 24, available: 21 }
            if what.contains("general.name") && *offset == bytes.len() as u64 - 24),
        "{e}"
    );
}

#[test]
fn huge_tensor_count() {
    let mut b = valid_builder(3);
    b.tensor_count = Some(1 << 62);
    let e = open_err(&b, "tensor-count");
    assert!(
        matches!(&e, GgufError::CountTooLarge { what, count, .. }
        if what.contains("tensor count") && *count == 1 << 62),
        "{e}"
    );
}

#[test]
fn huge_metadata_count() {
    let mut b = valid_builder(3);
    b.metadata_count = Some(u64::MAX);
    let e = open_err(&b, "metadata-count");
    assert!(matches!(&e, GgufError::CountTooLarge { what, .. } if what.contains("metadata count")));
}

#[test]
fn metadata_count_a_bit_too_large_is_truncation() {
    let mut b = valid_builder(3);
    b.metadata_count = Some(b.metadata.len() as u64 + 1);
    // The next "entry" is read from the tensor infos and fails somewhere inside them.
    assert!(open(&b, "metadata-count+1").is_err());
}

// ---- malformed metadata ----

#[test]
fn huge_string_length() {
    let mut body = Vec::new();
    put_u32(&mut body, type_id::STRING);
    put_u64(&mut body, 1 << 62);
    let mut b = valid_builder(3);
    b.kv_raw(b"test.huge_string", body);
    let e = open_err(&b, "string-len");
    assert!(
        matches!(&e, GgufError::CountTooLarge { what, count, .. }
        if what.contains("test.huge_string") && *count == 1 << 62),
        "{e}"
    );
}

#[test]
fn huge_key_length() {
    let mut b = GgufBuilder::new(3);
    b.metadata_count = Some(1);
    let mut bytes = b.build();
    put_u64(&mut bytes, u64::MAX);
    bytes.extend_from_slice(&[b'k'; 64]);
    let file = TempFile::with_bytes("key-len", &bytes);
    let e = GgufFile::open(file.path()).unwrap_err();
    assert!(
        matches!(&e, GgufError::CountTooLarge { what, .. } if what.contains("key")),
        "{e}"
    );
}

#[test]
fn huge_array_length() {
    for elem in [type_id::U32, type_id::STRING, type_id::ARRAY, type_id::BOOL] {
        let mut body = Vec::new();
        put_u32(&mut body, type_id::ARRAY);
        put_u32(&mut body, elem);
        put_u64(&mut body, 1 << 62);
        let mut b = valid_builder(3);
        b.kv_raw(b"test.huge_array", body);
        let e = open_err(&b, "array-len");
        assert!(
            matches!(&e, GgufError::CountTooLarge { what, count, .. }
            if what.contains("test.huge_array") && *count == 1 << 62),
            "{e}"
        );
    }
}

#[test]
fn unknown_value_type() {
    let mut body = Vec::new();
    put_u32(&mut body, 13);
    put_u32(&mut body, 0);
    let mut b = valid_builder(3);
    b.kv_raw(b"test.bad_type", body);
    let e = open_err(&b, "value-type");
    assert!(
        matches!(&e, GgufError::UnknownValueType { key, type_id: 13, .. } if key == "test.bad_type")
    );
    assert_mentions(&e, &["test.bad_type", "13"]);

    // The same inside an array.
    let mut body = Vec::new();
    put_u32(&mut body, type_id::ARRAY);
    put_u32(&mut body, 200);
    put_u64(&mut body, 1);
    let mut b = valid_builder(3);
    b.kv_raw(b"test.bad_elem", body);
    let e = open_err(&b, "elem-type");
    assert!(
        matches!(&e, GgufError::UnknownValueType { key, type_id: 200, .. } if key == "test.bad_elem")
    );
}

#[test]
fn invalid_bool() {
    let mut b = valid_builder(3);
    b.kv_raw(b"test.bad_bool", vec![type_id::BOOL as u8, 0, 0, 0, 2]);
    let e = open_err(&b, "bool");
    assert!(
        matches!(&e, GgufError::InvalidBool { what, value: 2, .. } if what.contains("test.bad_bool"))
    );
}

#[test]
fn arrays_nested_too_deep() {
    // 100 levels of one-element arrays, then an empty u8 array.
    let mut body = Vec::new();
    put_u32(&mut body, type_id::ARRAY);
    for _ in 0..100 {
        put_u32(&mut body, type_id::ARRAY);
        put_u64(&mut body, 1);
    }
    put_u32(&mut body, type_id::U8);
    put_u64(&mut body, 0);
    let mut b = valid_builder(3);
    b.kv_raw(b"test.deep", body);
    let e = open_err(&b, "deep");
    assert!(matches!(&e, GgufError::NestingTooDeep { key, .. } if key == "test.deep"));
}

#[test]
fn duplicate_key() {
    let mut b = valid_builder(3);
    b.kv("test.u8", &MetaValue::U8(1));
    let e = open_err(&b, "dup-key");
    assert!(matches!(&e, GgufError::DuplicateKey { key } if key == "test.u8"));
    assert_mentions(&e, &["test.u8"]);
}

#[test]
fn invalid_utf8_key_and_value() {
    let mut body = Vec::new();
    put_u32(&mut body, type_id::U8);
    body.push(0);
    let mut b = valid_builder(3);
    b.kv_raw(b"gen\xffral.bad", body);
    let e = open_err(&b, "utf8-key");
    assert!(
        matches!(&e, GgufError::InvalidUtf8 { what, .. } if what.contains("key")),
        "{e}"
    );
    assert_mentions(&e, &["gen\u{FFFD}ral.bad"]);

    let mut body = Vec::new();
    put_u32(&mut body, type_id::STRING);
    put_bytes(&mut body, b"\xc3\x28");
    let mut b = valid_builder(3);
    b.kv_raw(b"test.bad_string", body);
    let e = open_err(&b, "utf8-value");
    assert!(matches!(&e, GgufError::InvalidUtf8 { what, .. } if what.contains("test.bad_string")));
}

#[test]
fn bad_alignment() {
    for alignment in [0u32, 3, 48] {
        let mut b = valid_builder(3);
        b.kv("general.alignment", &MetaValue::U32(alignment));
        let e = open_err(&b, "bad-alignment");
        assert!(
            matches!(e, GgufError::BadAlignment { alignment: a } if a == u64::from(alignment)),
            "{e}"
        );
    }
    let mut b = valid_builder(3);
    b.kv("general.alignment", &s("32"));
    let e = open_err(&b, "alignment-type");
    assert!(
        matches!(&e, GgufError::WrongType { key, found: "string", .. } if key == "general.alignment")
    );
}

// ---- malformed tensor infos ----

/// `valid_builder` plus one tensor record.
fn with_tensor(spec: TensorSpec) -> GgufBuilder {
    let mut b = valid_builder(3);
    b.tensor_spec(spec);
    b
}

fn spec(name: &str, dims: &[u64], ttype: TensorType) -> TensorSpec {
    TensorSpec::new(name, dims, ttype)
}

#[test]
fn unknown_tensor_type() {
    // 4 and 5: ggml's removed Q4_2/Q4_3; 24: I8; 31: removed Q4_0_4_4; 34: TQ1_0; 40: NVFP4.
    for id in [4u32, 5, 24, 31, 34, 40, 1000, u32::MAX] {
        let mut t = spec("blk.0.weird", &[32], TensorType::F32);
        t.type_id = id;
        let e = open_err(&with_tensor(t), "tensor-type");
        assert!(
            matches!(&e, GgufError::UnknownTensorType { name, type_id } if name == "blk.0.weird" && *type_id == id),
            "{e}"
        );
        assert_mentions(&e, &["blk.0.weird", &id.to_string()]);
    }
}

#[test]
fn bad_dimension_count() {
    for n_dims in [0u32, 5, u32::MAX] {
        let mut t = spec("bad_dims", &[32], TensorType::F32);
        t.n_dims = Some(n_dims);
        t.dims = vec![1; n_dims.min(5) as usize];
        let e = open_err(&with_tensor(t), "n-dims");
        assert!(
            matches!(&e, GgufError::BadDimCount { name, n_dims: n } if name == "bad_dims" && *n == n_dims),
            "{e}"
        );
    }
}

#[test]
fn zero_dimension() {
    let mut t = spec("empty_rows", &[32, 2], TensorType::F32);
    t.dims = vec![32, 0];
    let e = open_err(&with_tensor(t), "zero-dim");
    assert!(matches!(&e, GgufError::ZeroDim { name, index: 1, .. } if name == "empty_rows"));
}

#[test]
fn shape_overflow() {
    // The element count overflows u64.
    let mut t = spec("huge", &[32], TensorType::F32);
    t.dims = vec![1 << 32, 1 << 32, 2];
    let e = open_err(&with_tensor(t), "overflow-elements");
    assert!(
        matches!(&e, GgufError::ShapeOverflow { name, .. } if name == "huge"),
        "{e}"
    );

    // The element count fits, the byte size does not.
    let mut t = spec("huge_bytes", &[32], TensorType::F32);
    t.dims = vec![1 << 62];
    let e = open_err(&with_tensor(t), "overflow-bytes");
    assert!(
        matches!(&e, GgufError::ShapeOverflow { name, .. } if name == "huge_bytes"),
        "{e}"
    );
}

#[test]
fn row_not_a_multiple_of_the_block_size() {
    let mut t = spec("q", &[32], TensorType::Q4_0);
    t.dims = vec![33];
    let e = open_err(&with_tensor(t), "block");
    assert!(matches!(
        &e,
        GgufError::RowNotBlockMultiple { name, ttype: TensorType::Q4_0, row_len: 33, block_size: 32 }
            if name == "q"
    ));
    assert_mentions(&e, &["'q'", "33", "32"]);
}

#[test]
fn tensor_data_past_eof() {
    let mut t = spec("last", &[64], TensorType::F32);
    t.data.truncate(100);
    let e = open_err(&with_tensor(t), "eof");
    assert!(
        matches!(&e, GgufError::TensorPastEof { name, .. } if name == "last"),
        "{e}"
    );
    assert_mentions(&e, &["last"]);

    // An offset so large that start + size overflows.
    let mut t = spec("far", &[8], TensorType::F32);
    t.offset = Some(u64::MAX - 31);
    t.data.clear();
    let e = open_err(&with_tensor(t), "eof-overflow");
    assert!(
        matches!(&e, GgufError::TensorPastEof { name, .. } if name == "far"),
        "{e}"
    );
}

#[test]
fn overlapping_tensors() {
    let mut b = valid_builder(3);
    let first_offset = b.offsets()[1];
    let mut t = spec("overlapper", &[4], TensorType::F32);
    t.offset = Some(first_offset); // on top of "norm.weight"
    b.tensor_spec(t);
    let e = open_err(&b, "overlap");
    assert!(matches!(&e, GgufError::OverlappingTensors { .. }), "{e}");
    assert_mentions(&e, &["norm.weight", "overlapper"]);

    // A small tensor inside a big one (and a third tensor clear of both).
    let mut b = GgufBuilder::new(3);
    b.tensor("big", &[64], TensorType::F32) // bytes 0..256
        .tensor_spec(TensorSpec {
            offset: Some(32),
            ..spec("inside", &[8], TensorType::F32)
        })
        .tensor_spec(TensorSpec {
            offset: Some(512),
            ..spec("after", &[8], TensorType::F32)
        });
    let e = open_err(&b, "overlap-2");
    assert!(
        matches!(&e, GgufError::OverlappingTensors { first, second }
        if first == "big" && second == "inside"),
        "{e}"
    );
}

#[test]
fn misaligned_offset() {
    let mut t = spec("crooked", &[8], TensorType::F32);
    t.offset = Some(4096 + 4);
    let e = open_err(&with_tensor(t), "misaligned");
    assert!(
        matches!(&e, GgufError::MisalignedTensor { name, offset: 4100, alignment: 32 }
        if name == "crooked"),
        "{e}"
    );
}

#[test]
fn duplicate_tensor_name() {
    let e = open_err(
        &with_tensor(spec("norm.weight", &[8], TensorType::F32)),
        "dup-tensor",
    );
    assert!(matches!(&e, GgufError::DuplicateTensor { name } if name == "norm.weight"));
    assert_mentions(&e, &["norm.weight"]);
}

#[test]
fn invalid_utf8_tensor_name() {
    let mut t = spec("x", &[8], TensorType::F32);
    t.name = b"blk.\xfe".to_vec();
    let e = open_err(&with_tensor(t), "utf8-tensor");
    assert!(
        matches!(&e, GgufError::InvalidUtf8 { what, .. } if what.contains("tensor")),
        "{e}"
    );
}

// ---- no input panics ----

#[test]
fn random_byte_flips_never_panic() {
    let bytes = valid_builder(3).build();
    let file = TempFile::with_bytes("fuzz", &bytes);
    let header_len = bytes.len() - data_section_len(&valid_builder(3));
    let mut rng = Rng(0x5EED_1234_ABCD_0001);
    let (mut ok, mut err) = (0, 0);
    for _ in 0..3000 {
        let mut mutated = bytes.clone();
        for _ in 0..1 + rng.below(4) {
            // Mostly the header, where the structure is.
            let pos = if rng.below(8) == 0 {
                rng.below(bytes.len())
            } else {
                rng.below(header_len)
            };
            mutated[pos] = match rng.below(4) {
                0 => mutated[pos] ^ (1 << rng.below(8)),
                1 => 0xFF,
                2 => 0,
                _ => rng.next_u64() as u8,
            };
        }
        if rng.below(4) == 0 {
            mutated.truncate(rng.below(bytes.len() + 1));
        }
        file.rewrite(&mutated);
        match GgufFile::open(file.path()) {
            Ok(f) => {
                // Whatever opened must be usable without panics.
                for t in f.tensors() {
                    assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
                }
                f.write_info(&mut std::io::sink()).unwrap();
                ok += 1;
            }
            Err(e) => {
                let _ = e.to_string();
                err += 1;
            }
        }
    }
    assert!(ok > 0 && err > 0, "ok {ok}, err {err}");
}

/// Bytes of the data section `b.build()` writes (the padding before it excluded).
fn data_section_len(b: &GgufBuilder) -> usize {
    let last = b
        .offsets()
        .into_iter()
        .zip(&b.tensors)
        .map(|(o, t)| o as usize + t.data.len());
    last.max().unwrap_or(0)
}

// ---- the real model ----

#[test]
fn real_default_model() {
    let path = support::model_path();
    if !path.exists() {
        panic!(
            "{} is missing: run scripts/fetch-model.sh to download the default model",
            path.display()
        );
    }
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.get_u64("llama.block_count").unwrap(), 30);
    assert_eq!(f.get_u64("llama.embedding_length").unwrap(), 576);
    assert_eq!(f.get_u64("llama.attention.head_count").unwrap(), 9);
    assert_eq!(f.get_u64("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 100_000.0);
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(
        f.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );
    assert_eq!(
        f.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
        49152
    );
    assert_eq!(
        f.get_str_array("tokenizer.ggml.merges").unwrap().len(),
        48900
    );
    assert!(f
        .get_str("tokenizer.chat_template")
        .unwrap()
        .contains("im_start"));

    assert_eq!(f.tensors().len(), 272); // 30 layers x 9 + token_embd + output_norm
    let embd = f.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.ttype, TensorType::Q8_0);
    assert_eq!(embd.dims, [576, 49152]);
    assert_eq!(f.tensor_data(embd).len(), 49152 * 576 / 32 * 34);
    let q = f.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(
        (q.ttype, q.dims.as_slice()),
        (TensorType::Q4_1, &[576u64, 576][..])
    );
    let norm = f.tensor("output_norm.weight").unwrap();
    assert_eq!(
        (norm.ttype, norm.dims.as_slice()),
        (TensorType::F32, &[576u64][..])
    );
    assert!(f.find_tensor("output.weight").is_none()); // tied to token_embd
    let last_end = f
        .tensors()
        .iter()
        .map(|t| f.data_start() + t.offset + t.n_bytes)
        .max();
    assert_eq!(last_end, Some(f.file_bytes()));

    let mut out = Vec::new();
    f.write_info(&mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("token_embd.weight"));
    assert!(text.contains("49152 items]"));
}
