//! What the GGUF says about each layer's position encoding and attention span, read for
//! `super::config`: llama3's rope frequency factors (`rope_freqs.weight`) and which layers attend
//! within a sliding window (llama.cpp's `load_swa_pattern` / `set_swa_pattern`).

use anyhow::{bail, Context, Result};

use crate::gguf::{GgufFile, MetaArray, MetaValue};
use crate::kernels::tensor_type::TensorType;
use crate::kernels::FreqFactors;

/// llama3's per-pair frequency factors from `rope_freqs.weight` ([rope_dim / 2] floats), if the
/// file has them.
pub(super) fn rope_freqs(g: &GgufFile, rope_dim: usize) -> Result<Option<FreqFactors>> {
    const NAME: &str = "rope_freqs.weight";
    let Some(info) = g.find_tensor(NAME) else {
        return Ok(None);
    };
    if info.n_elements() != (rope_dim / 2) as u64 || info.ttype != TensorType::F32 {
        bail!(
            "tensor '{NAME}' is {} {:?}, expected F32 [{}]",
            info.ttype,
            info.dims,
            rope_dim / 2
        );
    }
    let mut v = vec![0.0f32; rope_dim / 2];
    crate::kernels::dequantize_row(TensorType::F32, g.tensor_data(info), &mut v);
    if v.iter().any(|f| !(f.is_finite() && *f > 0.0)) {
        bail!("tensor '{NAME}' holds a factor that is not a positive finite number");
    }
    Ok(Some(
        FreqFactors::new(&v).context("more rope_freqs than a head has pairs")?,
    ))
}

/// Which layers attend locally, from `key`: an array of one bool per layer, or a period N,
/// or `default_pattern` when absent (llama.cpp's `load_swa_pattern`).
pub(super) fn swa_layers(
    g: &GgufFile,
    key: &str,
    num_layers: usize,
    default_pattern: usize,
) -> Result<Vec<bool>> {
    let pattern = match g.get(key) {
        Some(MetaValue::Array(MetaArray::Bool(v))) => {
            if v.len() != num_layers {
                bail!("{key} has {} entries for {num_layers} layers", v.len());
            }
            return Ok(v.clone());
        }
        Some(_) => g.get_usize(key)?,
        None => default_pattern,
    };
    Ok(swa_pattern(pattern, num_layers))
}

/// Every layer local but each `pattern`-th (layers pattern-1, 2*pattern-1, ...); 0: all local
/// (llama.cpp's `set_swa_pattern`).
pub(super) fn swa_pattern(pattern: usize, num_layers: usize) -> Vec<bool> {
    (0..num_layers)
        .map(|l| pattern == 0 || l % pattern < pattern - 1)
        .collect()
}
