//! `tojson` as Hugging Face's Jinja environment has it: what Python's
//! `json.dumps(x, ensure_ascii=False, indent=indent)` writes (keys in the order given, `", "` and
//! `": "` separators, no HTML escaping). Called by the templates through `super`.

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};
use serde::Serialize;

/// `tojson`, as Hugging Face's: Python's `json.dumps(x, ensure_ascii=False, indent=indent)`
/// (keys in the order given, `", "` and `": "` separators, no HTML escaping).
pub(super) fn tojson(value: Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(usize::try_from(v)?),
    };
    // Python's sort_keys and separators: accepted; separators are honoured only in their
    // default form.
    let _: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let mut writer = serde_json::Serializer::with_formatter(&mut out, PythonJson::new(indent));
    value
        .serialize(&mut writer)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let out = String::from_utf8(out).expect("serde_json writes UTF-8");
    Ok(Value::from_safe_string(out))
}

/// serde_json's output in Python's `json.dumps` layout: `", "` and `": "` on one line; with an
/// indent, `","` then a new line and `indent` spaces per level (serde_json's own pretty printer
/// with Python's separators). Non-finite floats come out as `null`, as serde_json writes them.
struct PythonJson {
    indent: Option<usize>,
    depth: usize,
    /// The container just closed held something (its closing bracket goes on a new line).
    has_value: bool,
}

impl PythonJson {
    fn new(indent: Option<usize>) -> Self {
        PythonJson {
            indent,
            depth: 0,
            has_value: false,
        }
    }

    /// Before an item: the separator, then (indented) a new line.
    fn item<W: ?Sized + std::io::Write>(&self, w: &mut W, first: bool) -> std::io::Result<()> {
        match self.indent {
            None if first => Ok(()),
            None => w.write_all(b", "),
            Some(n) => {
                w.write_all(if first { b"\n" } else { b",\n" })?;
                w.write_all(" ".repeat(n * self.depth).as_bytes())
            }
        }
    }

    fn close<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        bracket: &[u8],
    ) -> std::io::Result<()> {
        self.depth -= 1;
        if let (Some(n), true) = (self.indent, self.has_value) {
            w.write_all(b"\n")?;
            w.write_all(" ".repeat(n * self.depth).as_bytes())?;
        }
        self.has_value = true;
        w.write_all(bracket)
    }
}

impl serde_json::ser::Formatter for PythonJson {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(b"[")
    }

    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"]")
    }

    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }

    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(b"{")
    }

    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"}")
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }

    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}
