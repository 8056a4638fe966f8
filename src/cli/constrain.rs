//! `run --json-schema FILE`, `run --regex RE`, `run --grammar FILE`: the output constraint of a
//! pipe run, compiled by the engine's grammar cache (see `crate::constraint`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::constraint::{Constraint, ConstraintSpec};
use crate::engine::EngineHandle;

#[derive(Args, Clone, Debug, Default)]
pub struct ConstraintArgs {
    /// Constrain the output to the JSON schema in FILE.
    #[arg(long = "json-schema", value_name = "FILE", conflicts_with_all = ["regex", "grammar"])]
    pub json_schema: Option<PathBuf>,
    /// Constrain the output to match this regular expression.
    #[arg(long, value_name = "RE", conflicts_with = "grammar")]
    pub regex: Option<String>,
    /// Constrain the output to the Lark grammar in FILE (llguidance's syntax).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
}

impl ConstraintArgs {
    /// The compiled constraint, if one was asked for; errors name the flag.
    pub fn compile(&self, engine: &EngineHandle) -> Result<Option<Constraint>> {
        let (spec, flag) = if let Some(path) = &self.json_schema {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --json-schema {}", path.display()))?;
            let schema = serde_json::from_str(&text)
                .with_context(|| format!("--json-schema {} is not JSON", path.display()))?;
            (ConstraintSpec::JsonSchema(schema), "--json-schema")
        } else if let Some(rx) = &self.regex {
            (ConstraintSpec::Regex(rx.clone()), "--regex")
        } else if let Some(path) = &self.grammar {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --grammar {}", path.display()))?;
            (ConstraintSpec::Lark(text), "--grammar")
        } else {
            return Ok(None);
        };
        engine
            .grammars
            .compile(&spec, None)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("{flag}: {e}"))
    }
}
