//! Launch wrappers over the CUDA kernels in `csrc/cuda/`, one per kernel family, each checking
//! every device buffer against the bytes the kernel will touch before it launches (the GPU
//! counterpart of `crate::kernels`). Called by the GPU forward pass (`super::forward`) and by the
//! GPU kernel tests.

use anyhow::{bail, Result};

use super::launch::{Arg, DevPtr, Launch};
use crate::kernels::tensor_type::{TensorType, QK};
use crate::kernels::{Activation, Rope, RopeStyle, Yarn};

mod kv;
pub use kv::*;

const F32: usize = 4;

fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per).max(1).min(u32::MAX as usize) as u32
}

fn type_name(t: TensorType) -> Result<&'static str> {
    use TensorType::*;
    Ok(match t {
        F32 => "f32",
        F16 => "f16",
        BF16 => "bf16",
        Q4_0 => "q4_0",
        Q4_1 => "q4_1",
        Q5_0 => "q5_0",
        Q5_1 => "q5_1",
        Q8_0 => "q8_0",
        Q2_K => "q2_K",
        Q3_K => "q3_K",
        Q4_K => "q4_K",
        Q5_K => "q5_K",
        Q6_K => "q6_K",
        IQ4_NL => "iq4_nl",
        IQ4_XS => "iq4_xs",
        IQ3_XXS => "iq3_xxs",
        IQ3_S => "iq3_s",
        IQ2_XXS => "iq2_xxs",
        IQ2_XS => "iq2_xs",
        IQ2_S => "iq2_s",
        IQ1_S => "iq1_s",
        IQ1_M => "iq1_m",
        Q8_1 | Q8_K => bail!("{t} is not a weight type the GPU kernels take"),
        MXFP4 => "mxfp4",
    })
}

/// Ok when the GPU kernels take weights of type `t`; the error names the type otherwise (checked
/// when a model's matrices are uploaded, so a file the GPU cannot run fails at load).
pub fn check_weight_type(t: TensorType) -> Result<()> {
    type_name(t).map(|_| ())
}

fn row_bytes(t: TensorType, n: usize) -> Result<usize> {
    match t.row_bytes(n) {
        Some(b) => Ok(b),
        None => bail!("a row of {n} elements is not a whole number of {t} blocks"),
    }
}

/// Rows of `w` (a [*][n_in] matrix of type `t`) picked by `ids` (int32 device array of `n_ids`,
/// each < n_rows_w), dequantized and times `scale`, into `out` ([n_ids][n_in] f32).
#[allow(clippy::too_many_arguments)]
pub fn get_rows(
    gpu: &dyn Launch,
    t: TensorType,
    w: DevPtr,
    n_rows_w: usize,
    n_in: usize,
    ids: DevPtr,
    n_ids: usize,
    out: DevPtr,
    scale: f32,
) -> Result<()> {
    let rb = row_bytes(t, n_in)?;
    let name = format!("el_cuda_get_rows_{}", type_name(t)?);
    let args = [
        Arg::Ptr(w.need(n_rows_w * rb, &name)?),
        Arg::I64(rb as i64),
        Arg::Ptr(ids.need(n_ids * 4, &name)?),
        Arg::Ptr(out.need(n_ids * n_in * F32, &name)?),
        Arg::I64(n_in as i64),
        Arg::I64(n_ids as i64),
        Arg::F32(scale),
    ];
    let float = matches!(t, TensorType::F32 | TensorType::F16 | TensorType::BF16);
    if float {
        gpu.launch(&name, (blocks(n_in, 256), n_ids as u32, 1), 256, &args)
    } else {
        if !n_in.is_multiple_of(QK) {
            bail!("{name}: {n_in} elements per row");
        }
        gpu.launch(&name, (blocks(n_in / QK, 128), n_ids as u32, 1), 128, &args)
    }
}

/// `y` = the rows of `x` ([n_rows][n_in] f32) quantized to the activation type `vdt` (Q8_0,
/// Q8_1, Q8_K, F16 or BF16), byte for byte as `crate::kernels::quantize_rows` makes them.
pub fn quantize(
    gpu: &dyn Launch,
    vdt: TensorType,
    x: DevPtr,
    n_rows: usize,
    n_in: usize,
    y: DevPtr,
) -> Result<()> {
    let n = n_rows * n_in;
    let out_bytes = n_rows * row_bytes(vdt, n_in)?;
    let xp = x.need(n * F32, "quantize input")?;
    let yp = y.need(out_bytes, "quantize output")?;
    match vdt {
        TensorType::Q8_0 | TensorType::Q8_1 => {
            let name = if vdt == TensorType::Q8_0 {
                "el_cuda_quantize_q8_0"
            } else {
                "el_cuda_quantize_q8_1"
            };
            let nb = n / vdt.block_size();
            gpu.launch(
                name,
                (blocks(nb * 32, 256), 1, 1),
                256,
                &[Arg::Ptr(xp), Arg::Ptr(yp), Arg::I64(nb as i64)],
            )
        }
        TensorType::Q8_K => {
            let nb = n / vdt.block_size();
            gpu.launch(
                "el_cuda_quantize_q8_K",
                (blocks(nb * 32, 256), 1, 1),
                256,
                &[Arg::Ptr(xp), Arg::Ptr(yp), Arg::I64(nb as i64)],
            )
        }
        TensorType::F16 | TensorType::BF16 => {
            let name = if vdt == TensorType::F16 {
                "el_cuda_quantize_f16"
            } else {
                "el_cuda_quantize_bf16"
            };
            gpu.launch(
                name,
                (blocks(n, 256), 1, 1),
                256,
                &[Arg::Ptr(xp), Arg::Ptr(yp), Arg::I64(n as i64)],
            )
        }
        t => bail!("{t} is not an activation type"),
    }
}

/// Which product kernel runs: `Auto` picks by the number of rows; the others force one, for the
/// tests that check both give the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulKernel {
    Auto,
    Mmv,
    Tiled,
}

/// `out[r][o] = dot(w row o, a row r)`: `w` [n_out][n_in] of type `t`, `a` [n_rows][n_in] in
/// `t.vec_dot_type()` (F32 weights take the f32 rows themselves), `out` [n_rows][n_out] f32.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    gpu: &dyn Launch,
    t: TensorType,
    w: DevPtr,
    a: DevPtr,
    n_in: usize,
    n_out: usize,
    n_rows: usize,
    out: DevPtr,
    kernel: MatmulKernel,
) -> Result<()> {
    let wrb = row_bytes(t, n_in)?;
    let arb = row_bytes(t.vec_dot_type(), n_in)?;
    let tn = type_name(t)?;
    let float = matches!(t, TensorType::F32 | TensorType::F16 | TensorType::BF16);
    let (name, rows_per_block) = if float {
        (format!("el_cuda_mm_{tn}"), 8)
    } else {
        if !n_in.is_multiple_of(QK) {
            bail!("matmul {t}: {n_in} inputs");
        }
        let tiled = match kernel {
            MatmulKernel::Auto => n_rows > 8,
            MatmulKernel::Mmv => false,
            MatmulKernel::Tiled => true,
        };
        if tiled {
            (format!("el_cuda_mm_{tn}"), 16)
        } else {
            (format!("el_cuda_mmv_{tn}"), 8)
        }
    };
    let args = [
        Arg::Ptr(w.need(n_out * wrb, &name)?),
        Arg::I64(wrb as i64),
        Arg::Ptr(a.need(n_rows * arb, &name)?),
        Arg::I64(arb as i64),
        Arg::Ptr(out.need(n_rows * n_out * F32, &name)?),
        Arg::I64(n_out as i64),
        Arg::I64(n_in as i64),
        Arg::I64(n_rows as i64),
        Arg::I64(n_out as i64),
    ];
    gpu.launch(
        &name,
        (blocks(n_out, 8), blocks(n_rows, rows_per_block), 1),
        256,
        &args,
    )
}

/// RMSNorm of `n_rows` rows of `n` from `x` into `y` (which may be `x`), weight `w` [n].
pub fn rms_norm(
    gpu: &dyn Launch,
    x: DevPtr,
    w: DevPtr,
    y: DevPtr,
    n_rows: usize,
    n: usize,
    eps: f32,
) -> Result<()> {
    let bytes = n_rows * n * F32;
    let args = [
        Arg::Ptr(x.need(bytes, "rms_norm x")?),
        Arg::Ptr(w.need(n * F32, "rms_norm w")?),
        Arg::Ptr(y.need(bytes, "rms_norm y")?),
        Arg::I64(n_rows as i64),
        Arg::I64(n as i64),
        Arg::F32(eps),
    ];
    gpu.launch("el_cuda_rms_norm", (n_rows as u32, 1, 1), 256, &args)
}

/// RoPE in place on `x` ([n_tokens][n_heads][head_dim]) at the positions `pos` (int32 [n_tokens]).
/// A rope with frequency factors or YaRN runs el_cuda_rope_ext and needs `freq_factors`: its
/// factors on the device (f32 [rope_dim / 2], [`rope_factors`]), which `CudaBackend` uploads
/// once at load.
pub fn rope(
    gpu: &dyn Launch,
    x: DevPtr,
    pos: DevPtr,
    n_tokens: usize,
    n_heads: usize,
    r: &Rope,
    freq_factors: Option<DevPtr>,
) -> Result<()> {
    if r.rope_dim > r.head_dim || !r.rope_dim.is_multiple_of(2) {
        bail!("rope dims {} of head {}", r.rope_dim, r.head_dim);
    }
    // The reference's powf(freq_base, -2.0f / rope_dim), here through the same libm.
    let theta_scale = r.freq_base.powf(-2.0f32 / r.rope_dim as f32);
    let n_pairs = n_tokens * n_heads * (r.rope_dim / 2);
    if r.freq_factors.is_some() || r.yarn.is_some() {
        let Some(factors) = freq_factors else {
            bail!(
                "a rope with frequency factors or YaRN, launched without its factors on the device"
            );
        };
        return rope_ext(gpu, x, pos, factors, n_tokens, n_heads, r, theta_scale);
    }
    let args = [
        Arg::Ptr(x.need(n_tokens * n_heads * r.head_dim * F32, "rope x")?),
        Arg::Ptr(pos.need(n_tokens * 4, "rope positions")?),
        Arg::I64(n_tokens as i64),
        Arg::I64(n_heads as i64),
        Arg::I64(r.head_dim as i64),
        Arg::I64(r.rope_dim as i64),
        Arg::F32(r.freq_scale),
        Arg::F32(theta_scale),
        Arg::I32((r.style == RopeStyle::Neox) as i32),
    ];
    gpu.launch("el_cuda_rope", (blocks(n_pairs, 256), 1, 1), 256, &args)
}

/// el_cuda_rope_ext: `rope` with frequency factors (`factors`, [rope_dim / 2]) and YaRN.
#[allow(clippy::too_many_arguments)]
fn rope_ext(
    gpu: &dyn Launch,
    x: DevPtr,
    pos: DevPtr,
    factors: DevPtr,
    n_tokens: usize,
    n_heads: usize,
    r: &Rope,
    theta_scale: f32,
) -> Result<()> {
    let n_pairs = n_tokens * n_heads * (r.rope_dim / 2);
    let yarn = r.yarn.unwrap_or(Yarn {
        ext_factor: 0.0,
        attn_factor: 1.0,
        corr_low: 0.0,
        corr_high: 0.0,
    });
    // el_rope_ext's cos/sin factor, with the same float operations (host logf, as the C).
    let mscale = if yarn.ext_factor != 0.0 {
        yarn.attn_factor * (1.0f32 + 0.1f32 * (1.0f32 / r.freq_scale).ln())
    } else {
        yarn.attn_factor
    };
    let args = [
        Arg::Ptr(x.need(n_tokens * n_heads * r.head_dim * F32, "rope x")?),
        Arg::Ptr(pos.need(n_tokens * 4, "rope positions")?),
        Arg::Ptr(factors.need(r.rope_dim / 2 * F32, "rope frequency factors")?),
        Arg::I64(n_tokens as i64),
        Arg::I64(n_heads as i64),
        Arg::I64(r.head_dim as i64),
        Arg::I64(r.rope_dim as i64),
        Arg::F32(r.freq_scale),
        Arg::F32(theta_scale),
        Arg::I32((r.style == RopeStyle::Neox) as i32),
        Arg::F32(yarn.ext_factor),
        Arg::F32(mscale),
        Arg::F32(yarn.corr_low),
        Arg::F32(yarn.corr_high),
    ];
    gpu.launch("el_cuda_rope_ext", (blocks(n_pairs, 256), 1, 1), 256, &args)
}

/// The frequency factors `rope_ext` reads for `r`: its `rope_freqs` (llama3), or all 1 (YaRN
/// alone: dividing by 1 changes nothing, as the reference's missing factors).
pub fn rope_factors(r: &Rope) -> Result<Vec<f32>> {
    match &r.freq_factors {
        Some(f) if f.as_slice().len() != r.rope_dim / 2 => bail!(
            "{} rope frequency factors for {} rotated pairs",
            f.as_slice().len(),
            r.rope_dim / 2
        ),
        Some(f) => Ok(f.as_slice().to_vec()),
        None => Ok(vec![1.0; r.rope_dim / 2]),
    }
}

/// `x[i] *= s` over `n`.
pub fn scale(gpu: &dyn Launch, x: DevPtr, n: usize, s: f32) -> Result<()> {
    gpu.launch(
        "el_cuda_scale",
        (blocks(n, 256), 1, 1),
        256,
        &[
            Arg::Ptr(x.need(n * F32, "scale")?),
            Arg::I64(n as i64),
            Arg::F32(s),
        ],
    )
}

/// `gate[i] = act(gate[i]) * up[i]` over `n` elements.
pub fn glu(gpu: &dyn Launch, gate: DevPtr, up: DevPtr, n: usize, act: Activation) -> Result<()> {
    let name = match act {
        Activation::SwiGlu => "el_cuda_swiglu",
        Activation::GeGlu => "el_cuda_geglu",
        Activation::SwiGluOai => "el_cuda_swiglu_oai",
    };
    let g = gate.need(n * F32, name)?;
    let mut args = vec![
        Arg::Ptr(g),
        Arg::Ptr(up.need(n * F32, name)?),
        Arg::Ptr(g),
        Arg::I64(n as i64),
    ];
    if act == Activation::SwiGluOai {
        // gpt-oss's alpha and clamp, as the CPU path passes them.
        args.extend([
            Arg::F32(crate::kernels::SWIGLU_OAI_ALPHA),
            Arg::F32(crate::kernels::SWIGLU_OAI_LIMIT),
        ]);
    }
    gpu.launch(name, (blocks(n, 256), 1, 1), 256, &args)
}

/// `x[i] += y[i]` over `n`.
pub fn add(gpu: &dyn Launch, x: DevPtr, y: DevPtr, n: usize) -> Result<()> {
    gpu.launch(
        "el_cuda_add",
        (blocks(n, 256), 1, 1),
        256,
        &[
            Arg::Ptr(x.need(n * F32, "add x")?),
            Arg::Ptr(y.need(n * F32, "add y")?),
            Arg::I64(n as i64),
        ],
    )
}

/// `x[r][i] += bias[i]` for `n_rows` rows of `n`.
pub fn add_bias(gpu: &dyn Launch, x: DevPtr, bias: DevPtr, n_rows: usize, n: usize) -> Result<()> {
    let args = [
        Arg::Ptr(x.need(n_rows * n * F32, "bias x")?),
        Arg::Ptr(bias.need(n * F32, "bias")?),
        Arg::I64(n_rows as i64),
        Arg::I64(n as i64),
    ];
    gpu.launch(
        "el_cuda_add_bias",
        (blocks(n_rows * n, 256), 1, 1),
        256,
        &args,
    )
}

/// `x = cap * tanh(x / cap)` over `n`.
pub fn softcap(gpu: &dyn Launch, x: DevPtr, n: usize, cap: f32) -> Result<()> {
    gpu.launch(
        "el_cuda_softcap",
        (blocks(n, 256), 1, 1),
        256,
        &[
            Arg::Ptr(x.need(n * F32, "softcap")?),
            Arg::I64(n as i64),
            Arg::F32(cap),
        ],
    )
}

/// `out[i] = x[rows[i]]` for rows of `n` (`rows`: int32 [n_rows], each < x_rows).
pub fn gather_rows(
    gpu: &dyn Launch,
    x: DevPtr,
    x_rows: usize,
    rows: DevPtr,
    n_rows: usize,
    out: DevPtr,
    n: usize,
) -> Result<()> {
    let args = [
        Arg::Ptr(x.need(x_rows * n * F32, "gather x")?),
        Arg::Ptr(rows.need(n_rows * 4, "gather rows")?),
        Arg::Ptr(out.need(n_rows * n * F32, "gather out")?),
        Arg::I64(n_rows as i64),
        Arg::I64(n as i64),
    ];
    gpu.launch("el_cuda_gather_rows", (n_rows as u32, 1, 1), 256, &args)
}

/// `out[rows[i]] = x[i]` for rows of `n` (`rows`: int32 [n_rows], each < out_rows).
pub fn scatter_rows(
    gpu: &dyn Launch,
    x: DevPtr,
    rows: DevPtr,
    n_rows: usize,
    out: DevPtr,
    out_rows: usize,
    n: usize,
) -> Result<()> {
    let args = [
        Arg::Ptr(x.need(n_rows * n * F32, "scatter x")?),
        Arg::Ptr(rows.need(n_rows * 4, "scatter rows")?),
        Arg::Ptr(out.need(out_rows * n * F32, "scatter out")?),
        Arg::I64(n_rows as i64),
        Arg::I64(n as i64),
    ];
    gpu.launch("el_cuda_scatter_rows", (n_rows as u32, 1, 1), 256, &args)
}

/// `out[r] = sum over j < k, in order, of w[r*k + j] * x[r*k + j]` for rows of `n`
/// (`w`: f32 [n_rows * k]).
pub fn weighted_sum(
    gpu: &dyn Launch,
    x: DevPtr,
    w: DevPtr,
    n_rows: usize,
    k: usize,
    out: DevPtr,
    n: usize,
) -> Result<()> {
    let args = [
        Arg::Ptr(x.need(n_rows * k * n * F32, "weighted_sum x")?),
        Arg::Ptr(w.need(n_rows * k * F32, "weighted_sum weights")?),
        Arg::Ptr(out.need(n_rows * n * F32, "weighted_sum out")?),
        Arg::I64(n_rows as i64),
        Arg::I64(k as i64),
        Arg::I64(n as i64),
    ];
    gpu.launch("el_cuda_weighted_sum", (n_rows as u32, 1, 1), 256, &args)
}
