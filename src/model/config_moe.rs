//! The mixture-of-experts hyperparameters of a model (`{arch}.expert_count` and friends) and how
//! its router turns logits into expert weights, read by `super::config::ModelConfig::from_gguf`
//! for the families whose feed-forward blocks are experts, and used by `super::moe`.

use anyhow::{bail, Result};

/// The most experts a layer may have (llama.cpp's LLAMA_MAX_EXPERTS).
pub const MAX_EXPERTS: usize = 512;

/// How a row's router logits become its chosen experts' weights (llama.cpp's
/// `llama_expert_gating_func_type` with `norm_w`, as each family calls `build_moe_ffn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertGating {
    /// Softmax over all experts, the top k chosen by probability, their probabilities
    /// renormalised to sum to one (qwen3moe: `SOFTMAX` with `norm_w`).
    SoftmaxNormalized,
    /// The top k chosen by logit, their weights the softmax over those k logits alone
    /// (gpt-oss: `SOFTMAX_WEIGHT`, no `norm_w`).
    SoftmaxOfTopK,
}

/// A mixture-of-experts feed-forward block's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Experts {
    /// Experts in each layer (`{arch}.expert_count`).
    pub num_experts: usize,
    /// Experts each token uses (`{arch}.expert_used_count`).
    pub num_experts_used: usize,
    /// Each expert's hidden width (`{arch}.expert_feed_forward_length`).
    pub n_ff_exp: usize,
    pub gating: ExpertGating,
    /// The shared expert's hidden width beside the routed ones (granitehybrid's
    /// `{arch}.expert_shared_feed_forward_length`; 0: none).
    pub n_ff_shexp: usize,
}

/// The experts' shape from `{arch}.expert_count`, `.expert_used_count` and
/// `.expert_feed_forward_length` (when absent, `n_ff / expert_used_count`, as llama.cpp).
pub(crate) fn read_experts(
    usize_key: &dyn Fn(&str) -> Result<usize>,
    has: &dyn Fn(&str) -> bool,
    key: &dyn Fn(&str) -> String,
    n_ff: usize,
    gating: ExpertGating,
) -> Result<Experts> {
    let num_experts = usize_key("expert_count")?;
    let num_experts_used = usize_key("expert_used_count")?;
    if num_experts > MAX_EXPERTS {
        bail!(
            "{} = {num_experts} is more than {MAX_EXPERTS}",
            key("expert_count")
        );
    }
    if num_experts_used > num_experts {
        bail!(
            "{} = {num_experts_used} is more than {} = {num_experts}",
            key("expert_used_count"),
            key("expert_count")
        );
    }
    let n_ff_exp = if has("expert_feed_forward_length") {
        usize_key("expert_feed_forward_length")?
    } else if n_ff >= num_experts_used {
        n_ff / num_experts_used
    } else {
        bail!("{} is missing", key("expert_feed_forward_length"));
    };
    Ok(Experts {
        num_experts,
        num_experts_used,
        n_ff_exp,
        gating,
        n_ff_shexp: 0,
    })
}
