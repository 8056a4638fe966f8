//! `--models-preset FILE`: each model's own flags when one server serves several, in
//! llama-server's INI format. A section names a model (its id: the file's stem); `[*]` holds
//! what every model gets; keys are `serve` flags without their dashes (`ctx-size = 4096`, the
//! one-letter forms `c = 4096`, llama.cpp's `ctk`/`ctv`; `true`/`false` for switches), and
//! `model = PATH` in a section that names no listed file adds one under that id; `spec = draft`
//! with `draft-model = PATH` (llama-server's `model-draft`) gives one model its draft. As in
//! llama-server the command line wins, then the model's section, then `[*]`: a model's flags
//! are the command line's `serve` arguments parsed after the preset's (the later of a flag wins).
//! The server's own flags (address, keys, the model list and its limits) are not a model's: a
//! preset naming one is refused at start-up.
//!
//! ```ini
//! [*]
//! ctx-size = 4096
//! [qwen2.5-coder-0.5b-instruct-q4_k_m]
//! ctk = q8_0
//! ctv = q8_0
//! [tiny]
//! model = /models/SmolLM2-135M-Instruct.Q4_1.gguf
//! ```

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, FromArgMatches};

use super::ServeArgs;

/// Keys a preset may not set: the server's, not a model's.
const SERVER_KEYS: [&str; 12] = [
    "host",
    "port",
    "api-key",
    "api-key-file",
    "admin-api-key",
    "models-dir",
    "models-max",
    "keep-alive",
    "models-preset",
    "allowed-host",
    "max-connections",
    "m",
];

/// A preset file: `[*]`'s flags and each section's, in file order.
#[derive(Clone, Debug, Default)]
pub struct Presets {
    global: Vec<(String, String)>,
    sections: Vec<(String, Vec<(String, String)>)>,
}

impl Presets {
    /// Reads and checks `path` (every key a `serve` flag a model may take).
    pub fn read(path: &Path) -> Result<Presets> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --models-preset {}", path.display()))?;
        let p =
            parse(&text).map_err(|e| anyhow::anyhow!("--models-preset {}: {e}", path.display()))?;
        // Every section's flags must parse now, not when its model is first asked for.
        for (id, _) in &p.sections {
            p.args_for(id, &[])
                .with_context(|| format!("--models-preset {}: [{id}]", path.display()))?;
        }
        Ok(p)
    }

    /// The models the preset adds: (id, path) of each section with `model = PATH`.
    pub fn added_models(&self) -> Vec<(String, PathBuf)> {
        self.sections
            .iter()
            .filter_map(|(id, kv)| {
                let (_, path) = kv.iter().rev().find(|(k, _)| k == "model")?;
                Some((id.clone(), PathBuf::from(path)))
            })
            .collect()
    }

    /// Model `id`'s flags: `[*]`'s, then its section's, then `cli` (the command line's `serve`
    /// arguments), the later of a flag winning.
    pub fn args_for(&self, id: &str, cli: &[OsString]) -> Result<ServeArgs> {
        let command = ServeArgs::augment_args(clap::Command::new("serve")).args_override_self(true);
        let mut argv: Vec<OsString> = vec!["serve".into()];
        let own = self
            .sections
            .iter()
            .filter(|(s, _)| s == id)
            .flat_map(|(_, kv)| kv);
        for (key, value) in self.global.iter().chain(own) {
            if key == "model" {
                continue;
            }
            let long = match key.as_str() {
                "ctk" => "cache-type-k",
                "ctv" => "cache-type-v",
                // llama-server's name of the draft model.
                "model-draft" | "md" => "draft-model",
                k => k,
            };
            let arg = command
                .get_arguments()
                .find(|a| {
                    a.get_long() == Some(long)
                        || (long.len() == 1 && a.get_short() == long.chars().next())
                })
                .with_context(|| format!("`{key}` is not a flag of edge-llm serve"))?;
            let flag = match arg.get_long() {
                Some(l) => format!("--{l}"),
                None => format!("-{long}"),
            };
            if arg.get_action().takes_values() {
                argv.push(flag.into());
                argv.push(value.into());
            } else {
                match value.as_str() {
                    "true" | "1" | "on" => argv.push(flag.into()),
                    "false" | "0" | "off" => {}
                    v => bail!("`{key}` is a switch: true or false, got {v:?}"),
                }
            }
        }
        argv.extend(cli.iter().cloned());
        let matches = command
            .try_get_matches_from(argv)
            .map_err(|e| anyhow::anyhow!("{}", e.to_string().lines().next().unwrap_or("")))?;
        Ok(ServeArgs::from_arg_matches(&matches)?)
    }
}

/// The `serve` arguments of this process's command line (after the subcommand), as the binary
/// parsed them.
pub fn command_line() -> Vec<OsString> {
    std::env::args_os()
        .map(crate::flags::kv_type::expand_llama_flags)
        .skip_while(|a| a != "serve")
        .skip(1)
        .collect()
}

/// The INI text: `[section]` headers, `key = value` lines, `;` and `#` comments, llama-server's
/// `version = 1` before the first section.
fn parse(text: &str) -> Result<Presets, String> {
    let mut p = Presets::default();
    let mut current: Option<usize> = None; // None: before any section, or `[*]`
    let mut in_global = false;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.trim();
            if name == "*" {
                (current, in_global) = (None, true);
            } else if name.is_empty() {
                return Err(format!("line {}: a section needs a name", n + 1));
            } else {
                p.sections.push((name.to_string(), Vec::new()));
                (current, in_global) = (Some(p.sections.len() - 1), false);
            }
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(format!(
                "line {}: expected `key = value`, got {line:?}",
                n + 1
            ));
        };
        let (key, value) = (key.trim().to_string(), value.trim().to_string());
        if SERVER_KEYS.contains(&key.as_str()) {
            return Err(format!(
                "line {}: `{key}` is the server's, not a model's: give it on the command line",
                n + 1
            ));
        }
        match current {
            Some(i) => p.sections[i].1.push((key, value)),
            None if in_global => {
                if key == "model" {
                    return Err(format!(
                        "line {}: `model` belongs in a model's section",
                        n + 1
                    ));
                }
                p.global.push((key, value));
            }
            None if key == "version" => {}
            None => return Err(format!("line {}: `{key}` before any section", n + 1)),
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn presets(text: &str) -> Presets {
        parse(text).unwrap()
    }

    #[test]
    fn the_command_line_wins_then_the_section_then_the_global_one() {
        let p = presets(
            "version = 1\n[*]\nctx-size = 1024\ntemp = 0.5\n; a comment\n[a]\nc = 768\nctk = q8_0\n[b]\nmodel = /x/b.gguf\n",
        );
        let a = p.args_for("a", &[]).unwrap();
        assert_eq!(a.engine.ctx_size, Some(768));
        assert_eq!(
            a.engine.kv_types.kv_types().k,
            crate::kernels::tensor_type::TensorType::Q8_0
        );
        assert_eq!(a.temp, Some(0.5));
        let b = p.args_for("b", &[]).unwrap();
        assert_eq!(b.engine.ctx_size, Some(1024));
        let cli = p.args_for("a", &["-c".into(), "2048".into()]).unwrap();
        assert_eq!(cli.engine.ctx_size, Some(2048));
        assert_eq!(
            p.added_models(),
            vec![("b".to_string(), PathBuf::from("/x/b.gguf"))]
        );
    }

    #[test]
    fn bad_presets_are_one_line_errors() {
        for (text, says) in [
            ("[a]\nport = 1\n", "the server's"),
            ("c = 1\n", "before any section"),
            ("[a]\nnonsense\n", "key = value"),
            ("[*]\nmodel = x\n", "model's section"),
            ("[]\n", "needs a name"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(says) && !e.contains('\n'), "{text:?}: {e}");
        }
        let p = presets("[a]\nno-such-flag = 1\n");
        let e = format!("{:#}", p.args_for("a", &[]).unwrap_err());
        assert!(e.contains("not a flag"), "{e}");
        let p = presets("[a]\nc = many\n");
        assert!(p.args_for("a", &[]).is_err());
    }
}
