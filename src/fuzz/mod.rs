//! Entry points for the fuzz targets: each takes arbitrary bytes, runs them through the same
//! library functions the faces call, and panics only when it finds a bug (a panic inside the
//! library, or a broken invariant checked here). A clean error for bad input is a pass.
//!
//! Callers: the coverage-guided targets in `fuzz/` (AFL++ through `cargo afl`), and
//! `tests/fuzz_regressions.rs`, which replays the kept findings and corpus and runs a short
//! mutation loop in CI through these same functions.
//!
//! Targets:
//! - [`gguf`]: the GGUF reader on a file held in memory, then what is built from a file that
//!   opens (info report, hyper-parameters, weights, tokenizer, chat template).
//! - [`tokenizer`]: decode of arbitrary token-id sequences (whole and streamed) and encode of
//!   arbitrary bytes, on the real models' vocabularies.
//! - [`chat_template`]: the real models' chat templates rendered with hostile messages.
//! - [`request`]: the JSON bodies of `/v1/completions`, `/v1/chat/completions`,
//!   `/v1/responses` and `/v1/messages` (translated into chat bodies), `POST /v1/cache/pin`,
//!   llama-server's `/completion` and `/infill`, and the lines of `run --jsonl`, through the faces' shared rules (`crate::api::plan`) to the token ids they
//!   would submit.
//! - [`disk_block`]: the disk tier's block-file check on arbitrary bytes: a file passes only if
//!   it is, byte for byte, the file the tier writes for that block.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::api::plan::{self, Setting};
use crate::api::request::{self, Endpoint};
use crate::api::RequestError;
use crate::chat_template::{encode_prompt, ChatMessage, ChatTemplate, TEMPLATE_KEY};
use crate::gguf::GgufFile;
use crate::model::{ModelConfig, Weights};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// The names of the fuzz targets, as `run_target` takes them.
pub const TARGETS: [&str; 5] = [
    "gguf",
    "tokenizer",
    "chat_template",
    "request",
    "disk_block",
];

/// The models whose vocabularies and templates the targets use: the default model first, then
/// the two extra ones (`scripts/fetch-extra-models.sh`) when present.
const MODEL_FILES: [&str; 3] = [
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma-3-270m-q4_k_m.gguf",
];

/// Largest request body the server takes by default (`--max-body-bytes`).
const MAX_BODY_BYTES: usize = 2 << 20;

/// One real model's tokenizer and chat template (no weights).
pub struct Vocabulary {
    pub name: String,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// Bytes that no token decodes to on its own.
    pub bytes_without_token: [bool; 256],
}

/// `EDGE_LLM_MODELS_DIR`, or `models/` of this crate.
pub fn models_dir() -> PathBuf {
    std::env::var_os("EDGE_LLM_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("models"))
}

/// The tokenizer and chat template of the model file at `path`.
pub fn load_vocabulary(path: &Path) -> Result<Vocabulary> {
    let file = GgufFile::open(path).with_context(|| format!("opening {}", path.display()))?;
    let tokenizer = Tokenizer::from_gguf(&file)
        .with_context(|| format!("building the tokenizer of {}", path.display()))?;
    // As `ChatTemplate::from_gguf` chooses: the file's template, else the built-in one.
    let source = match file.get(TEMPLATE_KEY) {
        Some(_) => file
            .get_str(TEMPLATE_KEY)
            .with_context(|| format!("reading {TEMPLATE_KEY} of {}", path.display()))?,
        None => {
            crate::chat_template::builtin_for(&tokenizer)
                .with_context(|| format!("{} has no chat template", path.display()))?
                .1
        }
    };
    let template = ChatTemplate::from_source(source)?.with_tokens_of(&tokenizer);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut bytes_without_token = [true; 256];
    for id in 0..tokenizer.vocab_size() as u32 {
        if let [b] = tokenizer.token_bytes(id)[..] {
            bytes_without_token[usize::from(b)] = false;
        }
    }
    Ok(Vocabulary {
        name,
        tokenizer,
        template,
        bytes_without_token,
    })
}

/// The vocabularies of every model found, loaded once per process. The default model is
/// required (an error names it); the extra ones are used when present.
pub fn vocabularies() -> Result<&'static [Vocabulary]> {
    static LOADED: OnceLock<std::result::Result<Vec<Vocabulary>, String>> = OnceLock::new();
    let loaded = LOADED.get_or_init(|| {
        let dir = models_dir();
        let mut out = Vec::new();
        for (i, name) in MODEL_FILES.iter().enumerate() {
            let path = dir.join(name);
            if i > 0 && !path.exists() {
                continue;
            }
            out.push(load_vocabulary(&path).map_err(|e| format!("{e:#}"))?);
        }
        Ok(out)
    });
    loaded.as_deref().map_err(|e| anyhow::anyhow!("{e}"))
}

/// Runs the target called `name` on `data`.
pub fn run_target(name: &str, data: &[u8]) -> Result<()> {
    match name {
        "gguf" => gguf(data),
        "tokenizer" => tokenizer(vocabularies()?, data),
        "chat_template" => chat_template(vocabularies()?, data),
        "request" => request(vocabularies()?, data),
        "disk_block" => disk_block(data),
        other => anyhow::bail!("no fuzz target {other:?}; targets: {}", TARGETS.join(", ")),
    }
    Ok(())
}

// ---- gguf ----

/// The GGUF reader on `data`, then everything a model load builds from a file that opens.
pub fn gguf(data: &[u8]) {
    let Ok(file) = GgufFile::from_bytes("fuzz.gguf", data) else {
        return;
    };
    let mut sink = ByteCount(0);
    file.write_info(&mut sink)
        .expect("the info report writes to a sink");
    for t in file.tensors() {
        let bytes = file.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.n_bytes, "tensor {} data size", t.name);
    }
    if let Ok(config) = ModelConfig::from_gguf(&file) {
        let _ = Weights::from_gguf(&file, &config);
    }
    let Ok(tokenizer) = Tokenizer::from_gguf(&file) else {
        return;
    };
    check_decode(&tokenizer, &[0, 1, 2, 3, 255, 256, u32::MAX]);
    let _ = tokenizer.encode("Hello, world! <|im_start|> 123 héllo\n\n  x", true, true);
    if let Ok(source) = file.get_str(TEMPLATE_KEY) {
        if let Ok(template) = ChatTemplate::from_source(source) {
            let template = template.with_tokens_of(&tokenizer);
            let messages = [
                ChatMessage::new("system", "s"),
                ChatMessage::new("user", "u"),
            ];
            let _ = template.render(&messages, true);
        }
    }
}

/// A writer that only counts.
struct ByteCount(u64);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// ---- tokenizer ----

/// Byte 0 picks the vocabulary and the mode: even, the rest is little-endian u32 token ids
/// (decoded whole and streamed); odd, the rest is text to encode (lossy UTF-8), then decoded.
pub fn tokenizer(vocabs: &[Vocabulary], data: &[u8]) {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let v = &vocabs[usize::from(head >> 2) % vocabs.len()];
    let tok = &v.tokenizer;
    if head & 1 == 0 {
        let ids: Vec<u32> = rest
            .chunks(4)
            .map(|c| {
                let mut b = [0u8; 4];
                b[..c.len()].copy_from_slice(c);
                // Mostly ids inside the vocabulary, some outside (bit 31 keeps the raw value).
                let raw = u32::from_le_bytes(b);
                if raw & 0x8000_0000 != 0 {
                    raw & 0x7fff_ffff
                } else {
                    raw % (tok.vocab_size() as u32 + 8)
                }
            })
            .collect();
        check_decode(tok, &ids);
    } else {
        let text = String::from_utf8_lossy(rest);
        let parse_special = head & 2 != 0;
        let ids = tok
            .encode(&text, false, parse_special)
            .unwrap_or_else(|e| panic!("{}: encode failed on valid UTF-8: {e:#}", v.name));
        for &id in &ids {
            assert!(
                (id as usize) < tok.vocab_size(),
                "{}: encode gave id {id} outside the vocabulary",
                v.name
            );
        }
        check_decode(tok, &ids);
        // Byte-level BPE loses nothing when control tokens are not parsed, except the bytes
        // the vocabulary has no one-byte token for (the default model lacks some C0 controls
        // and UTF-8 lead bytes such as 0xF2): those are dropped, as llama.cpp drops them.
        if !parse_special && is_bpe(v) {
            let kept: Vec<u8> = text
                .bytes()
                .filter(|&b| !v.bytes_without_token[usize::from(b)])
                .collect();
            assert_eq!(
                tok.decode(&ids),
                String::from_utf8_lossy(&kept),
                "{}: decode(encode(text))",
                v.name
            );
        }
    }
}

/// Whether the vocabulary is byte-level BPE (the default model's and qwen's), whose encode
/// and decode are exact inverses on plain text.
fn is_bpe(v: &Vocabulary) -> bool {
    !v.name.starts_with("gemma")
}

/// Decoding `ids` whole and streamed token by token must give the same text.
fn check_decode(tok: &Tokenizer, ids: &[u32]) {
    let whole = tok.decode(ids);
    let mut stream = StreamDecoder::new();
    let mut streamed = String::new();
    for &id in ids {
        streamed.push_str(&stream.push(tok, id));
    }
    streamed.push_str(&stream.finish());
    assert_eq!(
        streamed, whole,
        "streamed decode differs from decode of {ids:?}"
    );
}

// ---- chat templates ----

/// Byte 0 picks the vocabulary and `add_generation_prompt`; the rest is split on NUL bytes
/// into role, content, role, content, ... (lossy UTF-8). The rendered prompt is tokenized as
/// the server does.
pub fn chat_template(vocabs: &[Vocabulary], data: &[u8]) {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let v = &vocabs[usize::from(head >> 1) % vocabs.len()];
    let mut parts = rest.split(|&b| b == 0);
    let mut messages = Vec::new();
    while let Some(role) = parts.next() {
        let content = parts.next().unwrap_or_default();
        messages.push(ChatMessage::new(
            String::from_utf8_lossy(role),
            String::from_utf8_lossy(content),
        ));
    }
    render_and_encode(v, &messages, head & 1 == 0);
}

/// Renders and tokenizes; a refusal must be a one-line error.
fn render_and_encode(v: &Vocabulary, messages: &[ChatMessage], add_generation_prompt: bool) {
    match v.template.render(messages, add_generation_prompt) {
        Ok(prompt) => {
            let ids = encode_prompt(&v.tokenizer, &prompt)
                .unwrap_or_else(|e| panic!("{}: cannot tokenize a rendered prompt: {e:#}", v.name));
            assert!(ids
                .iter()
                .all(|&id| (id as usize) < v.tokenizer.vocab_size()));
        }
        Err(e) => check_message(&format!("{e:#}")),
    }
}

/// An error for the user: one line, not empty, of a readable size.
fn check_message(message: &str) {
    assert!(!message.is_empty(), "an empty error message");
    assert!(
        !message.contains('\n'),
        "an error message of several lines: {message:?}"
    );
    assert!(
        message.len() <= 4096,
        "an error message of {} bytes: {:?}...",
        message.len(),
        &message[..message.floor_char_boundary(200)]
    );
}

// ---- request bodies ----

/// `data` as the body of `/v1/completions` and of `/v1/chat/completions` (with the default
/// model's vocabulary and template), and as a `run --jsonl` line.
pub fn request(vocabs: &[Vocabulary], data: &[u8]) {
    let v = &vocabs[0];
    for endpoint in [Endpoint::Completions, Endpoint::Chat] {
        if let Err(e) = http_body(v, data, endpoint) {
            assert!(
                e.status.is_client_error(),
                "{endpoint:?}: status {} for {:?}",
                e.status,
                e.message
            );
            check_message(&e.message);
        }
    }
    if let Ok(line) = std::str::from_utf8(data) {
        if let Err(e) = jsonl_line(v, line) {
            check_message(&e.message);
        }
    }
    // The Responses and Messages APIs: their bodies translated into a chat body, then planned.
    if let Err(e) = translated_body(v, data) {
        check_message(&e.message);
    }
    // `POST /v1/cache/pin`: a prompt or chat messages to pin.
    let body = axum::body::Bytes::copy_from_slice(data);
    let pinned = crate::server::body::json_object(Ok(body), MAX_BODY_BYTES).and_then(|map| {
        crate::server::cache_routes::pin_body_tokens(&map, &v.tokenizer, Ok(&v.template))
    });
    if let Err(e) = pinned {
        assert!(e.status.is_client_error(), "pin: status {}", e.status);
        check_message(&e.message);
    }
    // llama-server's `/completion` and `/infill` (the latter's prompt from the FIM tokens of
    // every vocabulary that has them).
    let body = axum::body::Bytes::copy_from_slice(data);
    if let Ok(map) = crate::server::body::json_object(Ok(body), MAX_BODY_BYTES) {
        for v in vocabs {
            let n_batch = crate::api::infill::LLAMA_SERVER_N_BATCH;
            let native = [
                crate::api::llama::completion(setting(v, None), &map).map(|_| ()),
                crate::api::llama::infill(setting(v, None), &map, n_batch).map(|_| ()),
            ];
            for e in native.into_iter().filter_map(Result::err) {
                check_message(&e.message);
            }
        }
    }
}

/// What `/v1/responses` and `/v1/messages` do with a body before it reaches the engine: the
/// translation into a chat body, then the shared rules.
fn translated_body(v: &Vocabulary, data: &[u8]) -> std::result::Result<(), RequestError> {
    let body = axum::body::Bytes::copy_from_slice(data);
    let map = crate::server::body::json_object(Ok(body), MAX_BODY_BYTES)
        .map_err(|e| RequestError::bad_request(e.message))?;
    let responses = crate::api::responses::translate(&map, &[]).map(|t| t.chat);
    let messages = crate::api::messages::translate(&map)
        .map(|t| t.chat)
        .map_err(RequestError::from);
    for chat in [responses, messages] {
        match chat {
            Ok(chat) => {
                if let Err(e) = plan::plan(&setting(v, None), Endpoint::Chat, &chat) {
                    check_message(&e.message);
                }
            }
            Err(e) => check_message(&e.message),
        }
    }
    Ok(())
}

/// What the faces know that a body does not, for the fuzz target: the vocabulary's template,
/// no grammar cache (constraints are not compiled: there is no engine), a context of 4096.
fn setting(v: &Vocabulary, max_tokens: Option<usize>) -> Setting<'_> {
    Setting {
        tokenizer: &v.tokenizer,
        template: Ok(&v.template),
        grammars: None,
        max_seq_len: 4096,
        tenant: None,
        sampling: request::openai_sampling(0),
        max_tokens,
        add_bos: true,
        ignore_eos: false,
    }
}

/// What the server's handler does with a body before it reaches the engine.
fn http_body(
    v: &Vocabulary,
    data: &[u8],
    endpoint: Endpoint,
) -> std::result::Result<Vec<u32>, crate::server::error::ApiError> {
    let body = axum::body::Bytes::copy_from_slice(data);
    let map = crate::server::body::json_object(Ok(body), MAX_BODY_BYTES)?;
    Ok(plan::plan(&setting(v, None), endpoint, &map)?
        .request
        .prompt)
}

/// What `run --jsonl` does with one input line before it reaches the engine: the shared rules,
/// with the endpoint chosen by `prompt` or `messages`.
fn jsonl_line(v: &Vocabulary, line: &str) -> std::result::Result<Vec<u32>, RequestError> {
    let value: Value = serde_json::from_str(line)
        .map_err(|e| RequestError::bad_request(format!("malformed JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(RequestError::bad_request("expected a JSON object"));
    };
    let endpoint = plan::endpoint_of(&map)?;
    Ok(plan::plan(&setting(v, Some(usize::MAX)), endpoint, &map)?
        .request
        .prompt)
}

// ---- disk_block ----

/// The block every `disk_block` input is checked against: this identity and hash, 16 tokens,
/// 64 bytes of keys and values.
const BLOCK_IDENTITY: u64 = 0x5eed_1de7_1700_0001;
const BLOCK_HASH: u64 = 0x0b10_c4a5_4000_0002;
const BLOCK_KV_BYTES: usize = 64;

fn block_tokens() -> [u32; 16] {
    std::array::from_fn(|i| (i as u32 * 7919) % 49_152)
}

/// Byte 0's low bit set: the rest's last 8 bytes are replaced by the checksum of what comes
/// before them (so mutations reach the checks past it); then the rest goes through the tier's
/// check. A file that passes must be exactly the one the tier writes for the block.
pub fn disk_block(data: &[u8]) {
    use crate::engine::disk_cache::file::{checksum, decode, encode, Expected, FileKind};
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = rest.to_vec();
    if mode & 1 == 1 && bytes.len() >= 8 {
        let n = bytes.len() - 8;
        let sum = checksum(&bytes[..n]);
        bytes[n..].copy_from_slice(&sum.to_le_bytes());
    }
    let tokens = block_tokens();
    // Bit 1 of the mode: the file read as a state snapshot rather than a block.
    let kind = match mode & 2 {
        0 => FileKind::Kv,
        _ => FileKind::State,
    };
    let want = Expected {
        kind,
        identity: BLOCK_IDENTITY,
        hash: BLOCK_HASH,
        token_ids: &tokens,
        kv_bytes: BLOCK_KV_BYTES,
    };
    match decode(&bytes, &want) {
        Ok(kv) => {
            assert_eq!(kv.len(), BLOCK_KV_BYTES, "the KV bytes served");
            assert!(
                encode(kind, BLOCK_IDENTITY, BLOCK_HASH, &tokens, kv) == bytes,
                "a file that passes is the one the tier writes"
            );
        }
        Err(reject) => {
            let message = reject.to_string();
            assert!(!message.is_empty() && message.len() < 200, "{message}");
        }
    }
}
