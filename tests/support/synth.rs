//! The synthetic models `scripts/synth/synth.py models target/synth` writes, and the committed
//! llama.cpp references computed on them (each names its file and the file's sha256).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::{root, skip_or_fail};

/// A committed JSON file under the repository root (`tests/synth/qwen3.json`).
pub fn json(rel: &str) -> Value {
    let p = root().join(rel);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

pub fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum (coreutils)");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The synthetic file reference `r` was computed on (in `$EDGE_LLM_SYNTH_DIR` or
/// target/synth), checked against its sha256; None when it was not made (skipped outside CI, a
/// failure under CI=true). `regenerate` names the script that rewrites file and reference.
pub fn model_file(r: &Value, regenerate: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("EDGE_LLM_SYNTH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/synth"));
    let path = dir.join(r["file"].as_str().unwrap());
    if !path.is_file() {
        skip_or_fail(&format!(
            "{} not made (target/synth-venv/bin/python scripts/synth/synth.py models target/synth)",
            path.display()
        ));
        return None;
    }
    assert_eq!(
        sha256(&path),
        r["sha256"].as_str().unwrap(),
        "{}: not the file llama.cpp's reference was computed on (regenerate both with {regenerate})",
        path.display()
    );
    Some(path)
}
