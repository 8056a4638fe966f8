//! `GgufFile::write_info`: the report `edge-llm info -m FILE` prints.
//!
//! A header (path, version, alignment, sizes, counts), every metadata entry with its type and
//! a short rendering of its value (long strings and arrays are cut, with their length), then
//! a table of tensors. Called by the CLI; reads only what `GgufFile` already validated.

use std::fmt::Write as _;
use std::io::{self, Write};

use super::value::{MetaArray, MetaValue};
use super::GgufFile;

/// `n` with a K/M/B suffix.
fn human_count(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.2} K", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2} M", n as f64 / 1e6),
        _ => format!("{:.2} B", n as f64 / 1e9),
    }
}

/// Characters of a string value shown before it is cut.
const MAX_STRING_CHARS: usize = 80;
/// Characters of a string inside an array shown before it is cut.
const MAX_ELEMENT_CHARS: usize = 32;
/// Array elements shown before the rest is summarised as a count.
const MAX_ARRAY_ITEMS: usize = 8;
/// An array's rendering stops taking more items past this many characters.
const MAX_ARRAY_CHARS: usize = 100;

impl GgufFile {
    /// Elements of every tensor.
    pub fn num_parameters(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0, |n, t| n.saturating_add(t.n_elements()))
    }

    /// For a mixture of experts (`{arch}.expert_count` and `.expert_used_count` set, the
    /// experts stacked in `*_exps` tensors, as llama.cpp names them): (experts used per token,
    /// experts, parameters a token uses: every other tensor and its share of the stacked ones).
    pub fn experts_used(&self) -> Option<(u64, u64, u64)> {
        let arch = self.architecture().ok()?;
        let of = self.get(&format!("{arch}.expert_count"))?.as_u64()?;
        let used = self.get(&format!("{arch}.expert_used_count"))?.as_u64()?;
        if of == 0 || used > of {
            return None;
        }
        let experts: u64 = self
            .tensors
            .iter()
            .filter(|t| t.name.contains("_exps."))
            .fold(0u64, |n, t| n.saturating_add(t.n_elements()));
        let others = self.num_parameters().saturating_sub(experts);
        Some((used, of, others.saturating_add(experts / of * used)))
    }

    /// Writes the `edge-llm info` report.
    pub fn write_info(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "file:       {}", self.path.display())?;
        writeln!(w, "version:    {}", self.version)?;
        writeln!(w, "alignment:  {}", self.alignment)?;
        writeln!(w, "size:       {}", human_bytes(self.file_bytes()))?;
        writeln!(w, "metadata:   {} entries", self.metadata.len())?;
        writeln!(
            w,
            "tensors:    {}, {} of data at offset {}",
            self.tensors.len(),
            human_bytes(self.total_tensor_bytes()),
            self.data_start
        )?;
        write!(
            w,
            "parameters: {} total",
            human_count(self.num_parameters())
        )?;
        match self.experts_used() {
            Some((used, of, active)) => writeln!(
                w,
                ", {} active per token ({used} of {of} experts)",
                human_count(active)
            )?,
            None => writeln!(w)?,
        }

        writeln!(w)?;
        writeln!(w, "metadata:")?;
        let key_width = self
            .metadata
            .iter()
            .map(|(k, _)| k.len())
            .max()
            .unwrap_or(0);
        let type_width = self
            .metadata
            .iter()
            .map(|(_, v)| v.type_name().len())
            .max()
            .unwrap_or(0);
        for (key, value) in &self.metadata {
            writeln!(
                w,
                "  {key:<key_width$}  {:<type_width$}  {}",
                value.type_name(),
                render_value(value)
            )?;
        }

        writeln!(w)?;
        writeln!(w, "tensors:")?;
        let rows: Vec<[String; 5]> = self
            .tensors
            .iter()
            .map(|t| {
                [
                    t.name.clone(),
                    t.ttype.name().to_string(),
                    t.shape_string(),
                    t.n_bytes.to_string(),
                    t.offset.to_string(),
                ]
            })
            .collect();
        let header = ["name", "type", "shape", "bytes", "offset"].map(String::from);
        let mut widths = [0usize; 5];
        for row in std::iter::once(&header).chain(&rows) {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.len());
            }
        }
        let [w0, w1, w2, w3, w4] = widths;
        for [name, ttype, shape, bytes, offset] in std::iter::once(&header).chain(&rows) {
            writeln!(
                w,
                "  {name:<w0$}  {ttype:<w1$}  {shape:<w2$}  {bytes:>w3$}  {offset:>w4$}"
            )?;
        }
        Ok(())
    }
}

/// A one-line rendering of a metadata value.
fn render_value(value: &MetaValue) -> String {
    match value {
        MetaValue::U8(v) => v.to_string(),
        MetaValue::I8(v) => v.to_string(),
        MetaValue::U16(v) => v.to_string(),
        MetaValue::I16(v) => v.to_string(),
        MetaValue::U32(v) => v.to_string(),
        MetaValue::I32(v) => v.to_string(),
        MetaValue::U64(v) => v.to_string(),
        MetaValue::I64(v) => v.to_string(),
        MetaValue::F32(v) => v.to_string(),
        MetaValue::F64(v) => v.to_string(),
        MetaValue::Bool(v) => v.to_string(),
        MetaValue::String(s) => render_string(s, MAX_STRING_CHARS),
        MetaValue::Array(a) => render_array(a),
    }
}

/// `"text"` escaped, or `"text..."... (N bytes)` when longer than `max_chars`.
fn render_string(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &s[..cut], s.len()),
    }
}

/// `[a, b, c]`, or `[a, b, c, ..., N items]` when long.
fn render_array(a: &MetaArray) -> String {
    fn items<T>(v: &[T], render: impl Fn(&T) -> String) -> String {
        let mut out = String::from("[");
        let mut shown = 0;
        for item in v {
            if shown == MAX_ARRAY_ITEMS || out.len() > MAX_ARRAY_CHARS {
                break;
            }
            if shown > 0 {
                out.push_str(", ");
            }
            out.push_str(&render(item));
            shown += 1;
        }
        if shown < v.len() {
            let _ = write!(
                out,
                "{}..., {} items",
                if shown > 0 { ", " } else { "" },
                v.len()
            );
        }
        out.push(']');
        out
    }
    match a {
        MetaArray::U8(v) => items(v, ToString::to_string),
        MetaArray::I8(v) => items(v, ToString::to_string),
        MetaArray::U16(v) => items(v, ToString::to_string),
        MetaArray::I16(v) => items(v, ToString::to_string),
        MetaArray::U32(v) => items(v, ToString::to_string),
        MetaArray::I32(v) => items(v, ToString::to_string),
        MetaArray::U64(v) => items(v, ToString::to_string),
        MetaArray::I64(v) => items(v, ToString::to_string),
        MetaArray::F32(v) => items(v, ToString::to_string),
        MetaArray::F64(v) => items(v, ToString::to_string),
        MetaArray::Bool(v) => items(v, ToString::to_string),
        MetaArray::String(v) => items(v, |s| render_string(s, MAX_ELEMENT_CHARS)),
        MetaArray::Array(v) => items(v, render_array),
    }
}

/// `92.3 MiB (96788512 bytes)`.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut value = n as f64;
    let mut unit = "bytes";
    for u in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = u;
    }
    format!("{value:.1} {unit} ({n} bytes)")
}
