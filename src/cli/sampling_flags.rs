//! llama.cpp's sampler flags for the subcommands that generate (`run`, `run --jsonl`'s base,
//! `chat`), named as llama.cpp's CLI names them: DRY, XTC, typical, top-n-sigma, Mirostat,
//! dynamic temperature, `--min-keep` and the chain's order (`--samplers` names separated by
//! `;`, or `--sampler-seq` one-letter codes). Flattened into `commands::SamplingArgs`, which
//! validates the result.

use anyhow::{bail, Result};
use clap::Args;

use crate::engine::sampler::{SamplerKind, SamplingParams};

#[derive(Args, Debug, Clone, Default)]
pub struct LlamaSamplingArgs {
    /// DRY repetition penalty multiplier (0: off).
    #[arg(long = "dry-multiplier", allow_negative_numbers = true)]
    pub dry_multiplier: Option<f32>,
    /// DRY penalty base, at least 1 [default: 1.75].
    #[arg(long = "dry-base", allow_negative_numbers = true)]
    pub dry_base: Option<f32>,
    /// Repeats longer than this are penalized by DRY [default: 2].
    #[arg(long = "dry-allowed-length")]
    pub dry_allowed_length: Option<usize>,
    /// How many of the last tokens DRY scans (0: off) [default: 64].
    #[arg(long = "dry-penalty-last-n")]
    pub dry_penalty_last_n: Option<usize>,
    /// A DRY sequence breaker; repeat the flag for several, they replace the defaults
    /// ("\n", ":", "\"", "*"); "none" for none.
    #[arg(long = "dry-sequence-breaker")]
    pub dry_sequence_breaker: Vec<String>,
    /// XTC: the chance per token of removing the top choices (0: off).
    #[arg(long = "xtc-probability", allow_negative_numbers = true)]
    pub xtc_probability: Option<f32>,
    /// XTC: tokens at least this likely are top choices (above 0.5: off) [default: 0.1].
    #[arg(long = "xtc-threshold", allow_negative_numbers = true)]
    pub xtc_threshold: Option<f32>,
    /// Locally typical sampling, p (1.0: off).
    #[arg(
        long = "typical",
        visible_alias = "typical-p",
        allow_negative_numbers = true
    )]
    pub typical_p: Option<f32>,
    /// Keep tokens within N standard deviations of the best logit (<= 0: off).
    #[arg(
        long = "top-nsigma",
        visible_alias = "top-n-sigma",
        allow_negative_numbers = true
    )]
    pub top_n_sigma: Option<f32>,
    /// Mirostat: 0 off, 1 Mirostat, 2 Mirostat 2.0 (then only the temperature runs before it).
    #[arg(long = "mirostat")]
    pub mirostat: Option<u8>,
    /// Mirostat learning rate, eta [default: 0.1].
    #[arg(long = "mirostat-lr", allow_negative_numbers = true)]
    pub mirostat_eta: Option<f32>,
    /// Mirostat target entropy, tau [default: 5.0].
    #[arg(long = "mirostat-ent", allow_negative_numbers = true)]
    pub mirostat_tau: Option<f32>,
    /// Dynamic temperature: the temperature moves within --temp ± this with the entropy (0: off).
    #[arg(long = "dynatemp-range", allow_negative_numbers = true)]
    pub dynatemp_range: Option<f32>,
    /// Dynamic temperature exponent [default: 1.0].
    #[arg(long = "dynatemp-exp", allow_negative_numbers = true)]
    pub dynatemp_exponent: Option<f32>,
    /// The truncating samplers keep at least this many tokens [default: 0].
    #[arg(long = "min-keep")]
    pub min_keep: Option<usize>,
    /// The samplers' order, names separated by ';'
    /// [default: penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature].
    #[arg(long = "samplers")]
    pub samplers: Option<String>,
    /// The samplers' order as one-letter codes [default: edskypmxt].
    #[arg(long = "sampler-seq", visible_alias = "sampling-seq")]
    pub sampler_seq: Option<String>,
}

impl LlamaSamplingArgs {
    /// Sets the flags given on `p` (the caller validates the whole).
    pub fn apply(&self, p: &mut SamplingParams) -> Result<()> {
        macro_rules! set {
            ($($field:ident),*) => {$(
                if let Some(v) = self.$field {
                    p.$field = v;
                }
            )*};
        }
        set!(
            dry_multiplier,
            dry_base,
            dry_allowed_length,
            dry_penalty_last_n,
            xtc_probability,
            xtc_threshold,
            typical_p,
            top_n_sigma,
            mirostat,
            mirostat_eta,
            mirostat_tau,
            dynatemp_range,
            dynatemp_exponent,
            min_keep
        );
        if !self.dry_sequence_breaker.is_empty() {
            p.dry_sequence_breakers = self
                .dry_sequence_breaker
                .iter()
                .filter(|b| b.as_str() != "none")
                .cloned()
                .collect();
        }
        match (&self.samplers, &self.sampler_seq) {
            (Some(_), Some(_)) => bail!("give one of --samplers and --sampler-seq"),
            (Some(names), None) => {
                let names: Vec<&str> = names.split(';').filter(|n| !n.is_empty()).collect();
                p.samplers = SamplerKind::parse_names(&names)
                    .map_err(|e| anyhow::anyhow!("--samplers: {e}"))?;
            }
            (None, Some(codes)) => {
                p.samplers = SamplerKind::parse_codes(codes)
                    .map_err(|e| anyhow::anyhow!("--sampler-seq: {e}"))?;
            }
            (None, None) => {}
        }
        Ok(())
    }
}
