//! Not a test helper: the tests use `support::gguf_writer` (tests/support/gguf_writer.rs). This
//! file exists only because `fuzz/src/bin/make_seeds.rs` (outside tests/) still includes the
//! writer by this path (`#[path = "../../../tests/common/gguf_writer.rs"] mod gguf_writer;`).
//! Once it points at tests/support/gguf_writer.rs (with tests/support/splitmix.rs beside it as
//! `splitmix`), delete this file.

#![allow(dead_code)]

#[path = "../support/splitmix.rs"]
mod splitmix;
#[path = "../support/gguf_writer.rs"]
mod writer;

pub use writer::*;
