//! `SamplingParams`, one request's sampling fields with llama.cpp's defaults and names, their
//! range checks, and `SamplerKind`, the stages a `samplers` order lists (llama.cpp's
//! `common_sampler_type`, read from names or one-letter codes as `common/sampling.cpp` reads
//! them). Built by the faces (`api::request`, `cli`), read by `Sampler`.

/// One stage of the sampling chain, in the order `SamplingParams::samplers` lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SamplerKind {
    Penalties,
    Dry,
    TopNSigma,
    TopK,
    TypicalP,
    TopP,
    MinP,
    Xtc,
    Temperature,
    /// llama.cpp's fill-in-the-middle sampler (`llama_sampler_infill`): not in the default
    /// chain; llama.vscode lists it last.
    Infill,
}

impl SamplerKind {
    /// llama.cpp's default chain (`common_params_sampling::samplers`).
    pub const DEFAULT_ORDER: [SamplerKind; 9] = [
        SamplerKind::Penalties,
        SamplerKind::Dry,
        SamplerKind::TopNSigma,
        SamplerKind::TopK,
        SamplerKind::TypicalP,
        SamplerKind::TopP,
        SamplerKind::MinP,
        SamplerKind::Xtc,
        SamplerKind::Temperature,
    ];

    /// The canonical name (`common_sampler_type_to_str`).
    pub fn name(self) -> &'static str {
        match self {
            SamplerKind::Penalties => "penalties",
            SamplerKind::Dry => "dry",
            SamplerKind::TopNSigma => "top_n_sigma",
            SamplerKind::TopK => "top_k",
            SamplerKind::TypicalP => "typ_p",
            SamplerKind::TopP => "top_p",
            SamplerKind::MinP => "min_p",
            SamplerKind::Xtc => "xtc",
            SamplerKind::Temperature => "temperature",
            SamplerKind::Infill => "infill",
        }
    }

    /// The one-letter code (`common_sampler_type_to_chr`).
    pub fn code(self) -> char {
        match self {
            SamplerKind::Penalties => 'e',
            SamplerKind::Dry => 'd',
            SamplerKind::TopNSigma => 's',
            SamplerKind::TopK => 'k',
            SamplerKind::TypicalP => 'y',
            SamplerKind::TopP => 'p',
            SamplerKind::MinP => 'm',
            SamplerKind::Xtc => 'x',
            SamplerKind::Temperature => 't',
            SamplerKind::Infill => 'i',
        }
    }

    /// A name as llama.cpp accepts it: canonical, kebab-case (`top-k`), without the underscore
    /// (`topk`), or an alias (`nucleus`, `temp`, `typ`); any case.
    pub fn from_name(name: &str) -> Result<SamplerKind, String> {
        let lower = name.to_ascii_lowercase();
        let plain = lower.replace(['-', '_'], "");
        let found = Self::DEFAULT_ORDER
            .into_iter()
            .find(|k| k.name() == lower || k.name().replace('_', "") == plain);
        match (found, plain.as_str()) {
            (Some(k), _) => Ok(k),
            (None, "nucleus") => Ok(SamplerKind::TopP),
            (None, "temp") => Ok(SamplerKind::Temperature),
            (None, "typ") => Ok(SamplerKind::TypicalP),
            (None, "infill") => Ok(SamplerKind::Infill),
            (None, "adaptivep") => Err(format!("sampler {name:?} is not supported by edge-llm")),
            (None, _) => Err(format!(
                "unknown sampler {name:?}; known: {}",
                Self::DEFAULT_ORDER.map(|k| k.name()).join(", ")
            )),
        }
    }

    pub fn from_code(c: char) -> Result<SamplerKind, String> {
        if c == 'i' {
            return Ok(SamplerKind::Infill);
        }
        Self::DEFAULT_ORDER
            .into_iter()
            .find(|k| k.code() == c)
            .ok_or_else(|| {
                let known: String = Self::DEFAULT_ORDER.map(|k| k.code()).iter().collect();
                format!("unknown sampler code {c:?}; known: {known}")
            })
    }

    /// A list of names, as llama-server's `samplers` array.
    pub fn parse_names<S: AsRef<str>>(names: &[S]) -> Result<Vec<SamplerKind>, String> {
        names.iter().map(|n| Self::from_name(n.as_ref())).collect()
    }

    /// A string of one-letter codes, as llama-server's `samplers` string and `--sampler-seq`.
    pub fn parse_codes(codes: &str) -> Result<Vec<SamplerKind>, String> {
        codes.chars().map(Self::from_code).collect()
    }
}

/// DRY's default sequence breakers (llama.cpp's `dry_sequence_breakers`).
pub const DRY_DEFAULT_BREAKERS: [&str; 4] = ["\n", ":", "\"", "*"];

/// Sampling parameters of one request. Every field has llama.cpp's name and default; a stage
/// whose value is its "off" value does nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy: logit bias and penalties, then the best token; no other stage runs.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1.0 disables.
    pub top_p: f32,
    /// 0.0 disables.
    pub min_p: f32,
    /// 1.0 disables. Applied to the last `repeat_last_n` tokens, as llama.cpp does.
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
    /// OpenAI-style penalties over the generated tokens; 0.0 disables.
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: u64,
    /// Added to the logits of these tokens before anything else (minus infinity bans one), as
    /// llama.cpp's logit-bias sampler, first in its chain.
    pub logit_bias: Vec<(u32, f32)>,
    /// What the output must match (JSON schema, regex, grammar); None leaves it free.
    pub constraint: Option<crate::constraint::Constraint>,
    /// DRY ("don't repeat yourself"): a token that would extend a repeat of more than
    /// `dry_allowed_length` tokens loses `dry_multiplier * dry_base^(length - allowed)`. 0 disables.
    pub dry_multiplier: f32,
    /// At least 1.
    pub dry_base: f32,
    pub dry_allowed_length: usize,
    /// How many of the last tokens (prompt and generated) DRY scans; 0 disables.
    pub dry_penalty_last_n: usize,
    /// Strings a repeat may not run across (tokenized against the model's vocabulary).
    pub dry_sequence_breakers: Vec<String>,
    /// XTC ("exclude top choices"): with this chance per token, drop every token at least
    /// `xtc_threshold` likely but the least likely of them. 0 disables.
    pub xtc_probability: f32,
    /// Above 0.5 disables.
    pub xtc_threshold: f32,
    /// Locally typical sampling; 1.0 disables.
    pub typical_p: f32,
    /// Keep the tokens whose logit is within n standard deviations of the best; <= 0 disables.
    pub top_n_sigma: f32,
    /// 0 off, 1 Mirostat, 2 Mirostat 2.0; when on, the chain is temperature then Mirostat only.
    pub mirostat: u8,
    /// Target surprise (entropy) in bits.
    pub mirostat_tau: f32,
    /// Learning rate of mu.
    pub mirostat_eta: f32,
    /// Temperature ranges over `temperature ± dynatemp_range` with the distribution's entropy;
    /// 0 disables.
    pub dynatemp_range: f32,
    pub dynatemp_exponent: f32,
    /// The truncating stages (top-p, min-p, typical, XTC) keep at least this many tokens.
    pub min_keep: usize,
    /// The order the stages run in (a stage left out does not run).
    pub samplers: Vec<SamplerKind>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
            logit_bias: Vec::new(),
            constraint: None,
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: 64,
            dry_sequence_breakers: DRY_DEFAULT_BREAKERS.map(String::from).to_vec(),
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            typical_p: 1.0,
            top_n_sigma: -1.0,
            mirostat: 0,
            mirostat_tau: 5.0,
            mirostat_eta: 0.1,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
            min_keep: 0,
            samplers: SamplerKind::DEFAULT_ORDER.to_vec(),
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    /// Whether DRY runs (llama.cpp's `dry_enabled`).
    pub fn dry_enabled(&self) -> bool {
        self.dry_multiplier != 0.0
            && self.dry_base >= 1.0
            && self.dry_penalty_last_n > 0
            && self.samplers.contains(&SamplerKind::Dry)
    }

    /// The first field out of range, as "`name` must be ..., got ...".
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            return Err(format!(
                "repeat_penalty must be > 0, got {}",
                self.repeat_penalty
            ));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(format!("{name} must be in [-2, 2], got {v}"));
            }
        }
        for (name, v, lo, hi) in [
            ("dry_multiplier", self.dry_multiplier, 0.0, f32::MAX),
            ("dry_base", self.dry_base, 1.0, f32::MAX),
            ("xtc_probability", self.xtc_probability, 0.0, 1.0),
            ("xtc_threshold", self.xtc_threshold, 0.0, 1.0),
            ("typical_p", self.typical_p, 0.0, 1.0),
            ("top_n_sigma", self.top_n_sigma, f32::MIN, f32::MAX),
            ("mirostat_tau", self.mirostat_tau, 0.0, f32::MAX),
            ("mirostat_eta", self.mirostat_eta, 0.0, f32::MAX),
            ("dynatemp_range", self.dynatemp_range, 0.0, f32::MAX),
            ("dynatemp_exponent", self.dynatemp_exponent, 0.0, f32::MAX),
        ] {
            if !(v >= lo && v <= hi) {
                return Err(match (lo, hi) {
                    (f32::MIN, _) => format!("{name} must be a finite number, got {v}"),
                    (_, f32::MAX) => format!("{name} must be at least {lo}, got {v}"),
                    _ => format!("{name} must be in [{lo}, {hi}], got {v}"),
                });
            }
        }
        if self.mirostat > 2 {
            return Err(format!("mirostat must be 0, 1 or 2, got {}", self.mirostat));
        }
        if self.dry_sequence_breakers.iter().any(String::is_empty) {
            return Err("dry_sequence_breakers must not hold an empty string".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_names_and_codes_as_llama_cpp_reads_them() {
        for k in SamplerKind::DEFAULT_ORDER {
            assert_eq!(SamplerKind::from_name(k.name()), Ok(k));
            assert_eq!(SamplerKind::from_code(k.code()), Ok(k));
        }
        for (alias, k) in [
            ("top-k", SamplerKind::TopK),
            ("TopK", SamplerKind::TopK),
            ("nucleus", SamplerKind::TopP),
            ("temp", SamplerKind::Temperature),
            ("typ", SamplerKind::TypicalP),
            ("top-n-sigma", SamplerKind::TopNSigma),
            ("minp", SamplerKind::MinP),
        ] {
            assert_eq!(SamplerKind::from_name(alias), Ok(k), "{alias}");
        }
        assert_eq!(
            SamplerKind::parse_codes("edskypmxt").unwrap(),
            SamplerKind::DEFAULT_ORDER.to_vec()
        );
        assert!(SamplerKind::from_name("bogus")
            .unwrap_err()
            .contains("bogus"));
        assert_eq!(SamplerKind::from_name("infill"), Ok(SamplerKind::Infill));
        assert_eq!(SamplerKind::from_code('i'), Ok(SamplerKind::Infill));
        assert!(SamplerKind::from_name("adaptive_p")
            .unwrap_err()
            .contains("not supported"));
        assert!(SamplerKind::parse_codes("kz").is_err());
    }

    #[test]
    fn validate_names_the_new_fields() {
        for (p, name) in [
            (
                SamplingParams {
                    dry_base: 0.5,
                    ..Default::default()
                },
                "dry_base",
            ),
            (
                SamplingParams {
                    xtc_probability: 1.5,
                    ..Default::default()
                },
                "xtc_probability",
            ),
            (
                SamplingParams {
                    mirostat: 3,
                    ..Default::default()
                },
                "mirostat",
            ),
            (
                SamplingParams {
                    typical_p: f32::NAN,
                    ..Default::default()
                },
                "typical_p",
            ),
            (
                SamplingParams {
                    top_n_sigma: f32::INFINITY,
                    ..Default::default()
                },
                "top_n_sigma",
            ),
        ] {
            let e = p.validate().unwrap_err();
            assert!(e.starts_with(name), "{e}");
        }
    }
}
