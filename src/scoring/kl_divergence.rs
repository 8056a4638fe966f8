//! KL divergence against a base model, the way llama.cpp's community measures a quantization's
//! fidelity: `llama-perplexity --kl-divergence-base FILE` saves the base model's log-probabilities
//! and `--kl-divergence` compares another run with them. Both directions use llama.cpp's file
//! format (tools/perplexity/perplexity.cpp), so a base written by either program is read by both:
//!
//! - `"_logits_"`, then `n_ctx`, `n_vocab`, `n_chunk` (32-bit little-endian integers), then the
//!   `n_chunk * n_ctx` evaluated tokens (i32, the text's tokens, before any BOS replacement);
//! - per chunk, one row for each of the positions `n_ctx/2 .. n_ctx-1`: `nv = 2*((n_vocab+1)/2)+4`
//!   u16s, the first four holding two f32 (`scale`, `min_log_prob`), then each token's log-prob
//!   as `min_log_prob + scale * q` (16 bits over the top 16 nats; lower ones stored as 0).
//!
//! The statistics (and their float precision) are llama.cpp's, line for line.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::device::Placement;
use crate::model::Model;
use crate::scoring::perplexity::{chunk_tokens, for_each_chunk, PerplexityStats};

const MAGIC: &[u8; 8] = b"_logits_";

/// u16s per row: the vocabulary rounded up to even, plus the two f32 of scale and minimum.
fn row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Scored rows per chunk.
fn rows_per_chunk(n_ctx: usize) -> usize {
    n_ctx - 1 - n_ctx / 2
}

/// Scores `text` like `perplexity` and writes the base file to `path` (llama.cpp's
/// `--kl-divergence-base` without `--kl-divergence`). Returns the perplexity.
pub fn write_base(
    model: &Model,
    device: impl Into<Placement>,
    text: &str,
    n_ctx: usize,
    max_chunks: Option<usize>,
    path: &Path,
    mut on_chunk: impl FnMut(&PerplexityStats),
) -> Result<PerplexityStats> {
    let tokens = chunk_tokens(model, text, n_ctx, max_chunks)?;
    let n_vocab = model.config.vocab_size;
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = BufWriter::new(file);
    out.write_all(MAGIC)?;
    for v in [n_ctx, n_vocab, tokens.len() / n_ctx] {
        out.write_all(
            &i32::try_from(v)
                .context("too large for the base file")?
                .to_le_bytes(),
        )?;
    }
    for &t in &tokens {
        out.write_all(&(t as i32).to_le_bytes())?;
    }
    let mut row = vec![0u16; row_len(n_vocab)];
    let mut bytes = Vec::with_capacity(row.len() * 2);
    let mut stats = PerplexityStats::default();
    for_each_chunk(model, device, &tokens, n_ctx, |chunk, logits| {
        let targets = &tokens[chunk * n_ctx + n_ctx / 2 + 1..(chunk + 1) * n_ctx];
        for (logits, &target) in logits.chunks_exact(n_vocab).zip(targets) {
            stats.add(quantize_row(logits, &mut row, target as usize));
            bytes.clear();
            bytes.extend(row.iter().flat_map(|v| v.to_le_bytes()));
            out.write_all(&bytes)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        stats.num_chunks = chunk + 1;
        on_chunk(&stats);
        Ok(())
    })?;
    out.flush()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(stats)
}

/// llama.cpp's `log_softmax(n_vocab, logits, log_prob, tok)`: fills `row` and returns the
/// negative log-likelihood of `target`.
fn quantize_row(logits: &[f32], row: &mut [u16], target: usize) -> f64 {
    let mut max_logit = logits[0];
    let mut min_logit = logits[0];
    for &l in &logits[1..] {
        max_logit = max_logit.max(l);
        min_logit = min_logit.min(l);
    }
    min_logit = min_logit.max(max_logit - 16.0);
    let sum_exp: f64 = logits.iter().map(|&l| (l - max_logit).exp() as f64).sum();
    let log_sum_exp = sum_exp.ln() as f32;
    let min_log_prob = min_logit - max_logit - log_sum_exp;
    let scale = (max_logit - min_logit) / 65535.0;
    let (head, values) = row.split_at_mut(4);
    for (i, b) in [scale, min_log_prob].iter().enumerate() {
        let bits = b.to_bits();
        head[2 * i] = bits as u16;
        head[2 * i + 1] = (bits >> 16) as u16;
    }
    values.fill(0);
    if scale != 0.0 {
        let inv_scale = 1.0 / scale;
        for (q, &l) in values.iter_mut().zip(logits) {
            if l > min_logit {
                // nearest_int: round half to even, as the 1.5*2^23 trick does.
                *q = (inv_scale * (l - min_logit)).round_ties_even() as u16;
            }
        }
    }
    (max_logit + log_sum_exp - logits[target]) as f64
}

/// The header of a base file.
#[derive(Clone, Debug)]
pub struct BaseHeader {
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
    pub tokens: Vec<u32>,
}

/// Opens a base file and checks its header and size against `model`.
fn open_base(model: &Model, path: &Path) -> Result<(BaseHeader, BufReader<File>)> {
    let name = path.display();
    let file = File::open(path).with_context(|| format!("opening {name}"))?;
    let size = file.metadata()?.len();
    let mut input = BufReader::with_capacity(1 << 20, file);
    let mut head = [0u8; 20];
    if input.read_exact(&mut head).is_err() || &head[..8] != MAGIC {
        bail!("{name} is not a llama.cpp log-probabilities file (no \"_logits_\" header)");
    }
    let field = |i: usize| i32::from_le_bytes(head[8 + 4 * i..12 + 4 * i].try_into().unwrap());
    let (n_ctx, n_vocab, n_chunk) = (field(0), field(1), field(2));
    if n_ctx < 8 || n_vocab < 1 || n_chunk < 1 {
        bail!("{name}: bad header (n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk})");
    }
    let (n_ctx, n_vocab, n_chunk) = (n_ctx as usize, n_vocab as usize, n_chunk as usize);
    if n_vocab != model.config.vocab_size {
        bail!(
            "{name}: inconsistent vocabulary: the base file has {n_vocab} tokens, the model {}",
            model.config.vocab_size
        );
    }
    let expected = 20
        + 4 * (n_ctx * n_chunk) as u64
        + 2 * (n_chunk * rows_per_chunk(n_ctx) * row_len(n_vocab)) as u64;
    if size != expected {
        bail!(
            "{name}: {size} bytes where n_ctx {n_ctx}, n_vocab {n_vocab} and n_chunk {n_chunk} \
             make {expected} (truncated or not a base file)"
        );
    }
    let mut raw = vec![0u8; 4 * n_ctx * n_chunk];
    input
        .read_exact(&mut raw)
        .with_context(|| format!("reading the tokens of {name}"))?;
    let mut tokens = Vec::with_capacity(n_ctx * n_chunk);
    for (i, b) in raw.chunks_exact(4).enumerate() {
        let t = i32::from_le_bytes(b.try_into().unwrap());
        if t < 0 || t as usize >= n_vocab {
            bail!("{name}: token {i} is {t}, outside the vocabulary of {n_vocab}");
        }
        tokens.push(t as u32);
    }
    let header = BaseHeader {
        n_ctx,
        n_vocab,
        n_chunk,
        tokens,
    };
    Ok((header, input))
}

/// Running sums, as llama.cpp's `kl_divergence_result`.
#[derive(Clone, Debug, Default)]
pub struct KlStats {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    pub max_p_diff: f32,
    pub n_same_top: usize,
    pub count: usize,
    /// Every token's KL divergence and probability difference, for the percentiles.
    pub kld_values: Vec<f32>,
    pub p_diff_values: Vec<f32>,
    pub num_chunks: usize,
}

/// A mean and its standard error, as llama.cpp's `mean_and_uncertainty`.
fn mean_and_uncertainty(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count < 1 {
        return (0.0, 0.0);
    }
    let f = sum / count as f64;
    let df = sum2 / count as f64 - f * f;
    let df = if df > 0.0 && count > 10 {
        (df / (count - 1) as f64).sqrt()
    } else {
        0.0
    };
    (f, df)
}

fn covariance(suma: f64, sumb: f64, sumab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (sumab / n - (suma / n) * (sumb / n)) / (n - 1.0)
}

/// Linear interpolation between sorted values, as llama.cpp's `percentile`.
fn percentile(values: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return values[0];
    }
    if fraction >= 1.0 {
        return values[values.len() - 1];
    }
    let p = fraction * (values.len() - 1) as f32;
    let ip = p as usize;
    let p = p - ip as f32;
    (1.0 - p) * values[ip] + p * values[(ip + 1).min(values.len() - 1)]
}

fn median(values: &[f32]) -> f32 {
    let n = values.len();
    if n.is_multiple_of(2) {
        0.5 * (values[n / 2] + values[n / 2 - 1])
    } else {
        values[n / 2]
    }
}

impl KlStats {
    /// llama.cpp's `log_softmax(n_vocab, logits, base_log_prob, tok, kld)` for one position.
    fn add(&mut self, logits: &[f32], base: &[u16], tok: usize) {
        let mut max_logit = logits[0];
        let mut imax = 0;
        for (i, &l) in logits.iter().enumerate().skip(1) {
            if l > max_logit {
                max_logit = l;
                imax = i;
            }
        }
        let sum_exp: f64 = logits.iter().map(|&l| (l - max_logit).exp() as f64).sum();
        let log_sum_exp = sum_exp.ln() as f32;
        let scale = f32::from_bits(base[0] as u32 | (base[1] as u32) << 16);
        let min_log_prob = f32::from_bits(base[2] as u32 | (base[3] as u32) << 16);
        let base = &base[4..];

        let nll = max_logit + log_sum_exp - logits[tok];
        self.sum_nll += nll as f64;
        self.sum_nll2 += (nll * nll) as f64;
        let nll_base = -(scale * base[tok] as f32 + min_log_prob);
        self.sum_nll_base += nll_base as f64;
        self.sum_nll_base2 += (nll_base * nll_base) as f64;
        self.sum_nll_nll_base += (nll * nll_base) as f64;

        let max_logit = max_logit + log_sum_exp;
        let mut sum = 0.0f64;
        let mut imax_base = 0;
        let mut p_log_base_max = 0.0f32;
        for (i, (&q, &l)) in base.iter().zip(logits).enumerate() {
            let p_log_base = scale * q as f32 + min_log_prob;
            if i == 0 || p_log_base > p_log_base_max {
                p_log_base_max = p_log_base;
                imax_base = i;
            }
            if p_log_base > -16.0 {
                let p_base = p_log_base.exp();
                sum += (p_base * (p_log_base - l + max_logit)) as f64;
            }
        }
        self.sum_kld += sum;
        self.sum_kld2 += sum * sum;
        self.count += 1;
        if imax == imax_base {
            self.n_same_top += 1;
        }
        let p_diff = (-nll).exp() - (-nll_base).exp();
        self.sum_p_diff += p_diff as f64;
        let p_diff2 = (p_diff * p_diff) as f64;
        self.sum_p_diff2 += p_diff2;
        self.sum_p_diff4 += p_diff2 * p_diff2;
        self.max_p_diff = self.max_p_diff.max(p_diff.abs());
        self.kld_values.push(sum as f32);
        self.p_diff_values.push(p_diff);
    }

    /// ln(PPL(Q)) with its uncertainty.
    pub fn log_ppl(&self) -> (f64, f64) {
        mean_and_uncertainty(self.sum_nll, self.sum_nll2, self.count)
    }

    /// ln(PPL(base)) with its uncertainty.
    pub fn log_ppl_base(&self) -> (f64, f64) {
        mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, self.count)
    }

    fn log_ppl_cov(&self) -> f64 {
        covariance(
            self.sum_nll,
            self.sum_nll_base,
            self.sum_nll_nll_base,
            self.count,
        )
    }

    /// Mean ln(PPL(Q)/PPL(base)) with its uncertainty.
    pub fn log_ppl_ratio(&self) -> (f64, f64) {
        let (a, da) = self.log_ppl();
        let (b, db) = self.log_ppl_base();
        (
            a - b,
            (da * da + db * db - 2.0 * self.log_ppl_cov())
                .max(0.0)
                .sqrt(),
        )
    }

    /// Mean KL divergence with its uncertainty.
    pub fn kld(&self) -> (f64, f64) {
        mean_and_uncertainty(self.sum_kld, self.sum_kld2, self.count)
    }

    /// RMS of the change in the target token's probability, with its uncertainty.
    pub fn p_diff_rms(&self) -> (f64, f64) {
        let (mse, dmse) = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, self.count);
        let rms = mse.sqrt();
        (rms, if rms > 0.0 { 0.5 / rms * dmse } else { 0.0 })
    }

    /// The share of positions whose most likely token is the base's, with its uncertainty.
    pub fn same_top(&self) -> (f64, f64) {
        let p = self.n_same_top as f64 / self.count as f64;
        let n = self.count.max(2) as f64;
        (p, (p * (1.0 - p) / (n - 1.0)).sqrt())
    }

    /// The `p`-quantile (0..1) of the per-token KL divergences.
    pub fn kld_percentile(&self, p: f32) -> f32 {
        let mut v = self.kld_values.clone();
        v.sort_by(f32::total_cmp);
        percentile(&v, p)
    }

    /// The per-chunk line llama-perplexity prints.
    pub fn chunk_line(&self) -> String {
        let (lp, dlp) = self.log_ppl();
        let ppl = lp.exp();
        let (r, dr) = self.log_ppl_ratio();
        let (k, dk) = self.kld();
        let (rms, drms) = self.p_diff_rms();
        let (top, dtop) = self.same_top();
        format!(
            "{:4}    {:9.4} ± {:9.4}    {:10.5} ± {:10.5}    {:10.5} ± {:10.5}    {:6.3} ± {:6.3} %    {:6.3} ± {:6.3} %",
            self.num_chunks,
            ppl,
            ppl * dlp,
            r,
            dr,
            k,
            dk,
            100.0 * rms,
            100.0 * drms,
            100.0 * top,
            100.0 * dtop
        )
    }

    /// The final report llama-perplexity prints (its three statistics sections).
    pub fn report(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let mut kld = self.kld_values.clone();
        kld.sort_by(f32::total_cmp);
        let mut pd = self.p_diff_values.clone();
        pd.sort_by(f32::total_cmp);
        let (lp, dlp) = self.log_ppl();
        let (ppl, dppl) = (lp.exp(), lp.exp() * dlp);
        let (lb, dlb) = self.log_ppl_base();
        let (pplb, dpplb) = (lb.exp(), lb.exp() * dlb);
        let cov = self.log_ppl_cov();
        let (r, dr) = self.log_ppl_ratio();
        let ppl_cov = ppl * pplb * cov;
        let _ = writeln!(s, "====== Perplexity statistics ======");
        let _ = writeln!(
            s,
            "Mean PPL(Q)                   : {ppl:10.6} ± {dppl:10.6}"
        );
        let _ = writeln!(
            s,
            "Mean PPL(base)                : {pplb:10.6} ± {dpplb:10.6}"
        );
        let _ = writeln!(
            s,
            "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%",
            100.0 * cov / (dlp * dlb)
        );
        let _ = writeln!(s, "Mean ln(PPL(Q)/PPL(base))     : {r:10.6} ± {dr:10.6}");
        let _ = writeln!(
            s,
            "Mean PPL(Q)/PPL(base)         : {:10.6} ± {:10.6}",
            r.exp(),
            r.exp() * dr
        );
        let _ = writeln!(
            s,
            "Mean PPL(Q)-PPL(base)         : {:10.6} ± {:10.6}",
            ppl - pplb,
            (dppl * dppl + dpplb * dpplb - 2.0 * ppl_cov)
                .max(0.0)
                .sqrt()
        );
        let _ = writeln!(s);
        let _ = writeln!(s, "====== KL divergence statistics ======");
        let (k, dk) = self.kld();
        let _ = writeln!(s, "Mean    KLD: {k:10.6} ± {dk:10.6}");
        let _ = writeln!(s, "Maximum KLD: {:10.6}", kld[kld.len() - 1]);
        for (label, f) in [
            ("99.9%", 0.999),
            ("99.0%", 0.99),
            ("95.0%", 0.95),
            ("90.0%", 0.9),
        ] {
            let _ = writeln!(s, "{label}   KLD: {:10.6}", percentile(&kld, f));
        }
        let _ = writeln!(s, "Median  KLD: {:10.6}", median(&kld));
        for (label, f) in [
            ("10.0%", 0.1),
            (" 5.0%", 0.05),
            (" 1.0%", 0.01),
            (" 0.1%", 0.001),
        ] {
            let _ = writeln!(s, "{label}   KLD: {:10.6}", percentile(&kld, f));
        }
        let _ = writeln!(s, "Minimum KLD: {:10.6}", kld[0]);
        let _ = writeln!(s);
        let _ = writeln!(s, "====== Token probability statistics ======");
        let (m, dm) = mean_and_uncertainty(self.sum_p_diff, self.sum_p_diff2, self.count);
        let _ = writeln!(s, "Mean    Δp: {:6.3} ± {:5.3} %", 100.0 * m, 100.0 * dm);
        let _ = writeln!(s, "Maximum Δp: {:6.3}%", 100.0 * pd[pd.len() - 1]);
        for (label, f) in [
            ("99.9%", 0.999),
            ("99.0%", 0.99),
            ("95.0%", 0.95),
            ("90.0%", 0.9),
            ("75.0%", 0.75),
        ] {
            let _ = writeln!(s, "{label}   Δp: {:6.3}%", 100.0 * percentile(&pd, f));
        }
        let _ = writeln!(s, "Median  Δp: {:6.3}%", 100.0 * median(&pd));
        for (label, f) in [
            ("25.0%", 0.25),
            ("10.0%", 0.1),
            (" 5.0%", 0.05),
            (" 1.0%", 0.01),
            (" 0.1%", 0.001),
        ] {
            let _ = writeln!(s, "{label}   Δp: {:6.3}%", 100.0 * percentile(&pd, f));
        }
        let _ = writeln!(s, "Minimum Δp: {:6.3}%", 100.0 * pd[0]);
        let (rms, drms) = self.p_diff_rms();
        let _ = writeln!(
            s,
            "RMS Δp    : {:6.3} ± {:5.3} %",
            100.0 * rms,
            100.0 * drms
        );
        let (top, dtop) = self.same_top();
        let _ = writeln!(
            s,
            "Same top p: {:6.3} ± {:5.3} %",
            100.0 * top,
            100.0 * dtop
        );
        s
    }
}

/// Compares `model` with the base file at `path` (llama.cpp's `--kl-divergence`): evaluates the
/// file's tokens in its chunks and accumulates the statistics, calling `on_chunk` after each.
/// `n_ctx`, when given, must be the file's; `text`, when given, must tokenize to the file's
/// tokens; `max_chunks` compares only the first chunks.
pub fn compare_with_base(
    model: &Model,
    device: impl Into<Placement>,
    path: &Path,
    n_ctx: Option<usize>,
    text: Option<&str>,
    max_chunks: Option<usize>,
    mut on_chunk: impl FnMut(&KlStats),
) -> Result<KlStats> {
    let (header, mut input) = open_base(model, path)?;
    let name = path.display();
    let n_ctx_file = header.n_ctx;
    if let Some(c) = n_ctx {
        if c != n_ctx_file {
            bail!(
                "{name} was computed with context {n_ctx_file}; pass -c {n_ctx_file} (got -c {c})"
            );
        }
    }
    if max_chunks == Some(0) {
        bail!("--chunks must be at least 1");
    }
    let n_chunk = header.n_chunk.min(max_chunks.unwrap_or(usize::MAX));
    let tokens = &header.tokens[..n_chunk * n_ctx_file];
    if let Some(text) = text {
        let ours = chunk_tokens(model, text, n_ctx_file, Some(n_chunk))?;
        if let Some(i) = ours.iter().zip(tokens).position(|(a, b)| a != b) {
            bail!(
                "{name}: its tokens differ from this text's at position {i} ({} vs {}): \
                 another text or another tokenizer",
                tokens[i],
                ours[i]
            );
        }
        if ours.len() != tokens.len() {
            bail!(
                "{name}: {} tokens, this text gives {}",
                tokens.len(),
                ours.len()
            );
        }
    }
    let vocab = header.n_vocab;
    let nv = row_len(vocab);
    let rows = rows_per_chunk(n_ctx_file);
    let mut raw = vec![0u8; rows * nv * 2];
    let mut base = vec![0u16; rows * nv];
    let mut stats = KlStats::default();
    for_each_chunk(model, device, tokens, n_ctx_file, |chunk, logits| {
        input
            .read_exact(&mut raw)
            .with_context(|| format!("reading the log-probs of chunk {} of {name}", chunk + 1))?;
        for (v, b) in base.iter_mut().zip(raw.chunks_exact(2)) {
            *v = u16::from_le_bytes([b[0], b[1]]);
        }
        let targets = &tokens[chunk * n_ctx_file + n_ctx_file / 2 + 1..(chunk + 1) * n_ctx_file];
        for ((logits, row), &target) in logits
            .chunks_exact(vocab)
            .zip(base.chunks_exact(nv))
            .zip(targets)
        {
            stats.add(logits, row, target as usize);
        }
        stats.num_chunks = chunk + 1;
        on_chunk(&stats);
        Ok(())
    })?;
    Ok(stats)
}
