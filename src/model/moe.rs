//! The mixture-of-experts feed-forward block (qwen3moe, gpt-oss), called by `super::forward` in
//! place of the dense one: a router scores every expert for each row, each row goes to its top
//! `k` experts, and their outputs are added with the router's weights, as llama.cpp's
//! `build_moe_ffn` does: softmax gating with `norm_w` (qwen3moe), or the softmax of the top `k`
//! logits (gpt-oss's `SOFTMAX_WEIGHT`, with biases on the router and on every expert's
//! products).
//!
//! The products batch: a step's rows are grouped by expert ([`Routing::groups`]), so each
//! chosen expert's matrices are read once per step for all the rows that chose it, and an
//! expert no row chose is not read at all. Routing happens on the host from the router's
//! logits ([`Routing::new`], plain arithmetic on integers and floats, tested without a model).
//! A row's result never depends on the other rows of the step: its router logits, its experts'
//! products (each output element one dot product of its own inputs) and its weighted sum (in
//! the order of its own ranking) are all computed from that row alone.

use anyhow::{bail, Result};

use super::backend::Backend;
use super::config::ExpertGating;
use super::weights::{Linear, Mlp};
use super::ModelConfig;

/// llama.cpp clamps the sum of a row's chosen probabilities to at least this (2^-14, the
/// smallest normal f16) before dividing by it.
const MIN_WEIGHT_SUM: f32 = 1.0 / 16384.0;

/// Which experts each row of a step uses, with what weight.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    /// Experts each row uses.
    pub k: usize,
    /// Row r's j-th expert at `r * k + j`, by falling probability (ties to the lower id):
    /// [n_rows * k].
    pub chosen: Vec<u32>,
    /// Each chosen expert's weight: its probability over the sum of the row's chosen ones,
    /// [n_rows * k].
    pub weights: Vec<f32>,
}

/// The rows one expert runs on: `rows[i]` is a row of the step and `slots[i]` = `rows[i] * k +
/// j` its rank j among that row's experts; rows in increasing order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub expert: usize,
    pub rows: Vec<u32>,
    pub slots: Vec<u32>,
}

impl Routing {
    /// Routes each row of `logits` ([n_rows][num_experts]) to its top `k` experts, weighted as
    /// `gating` says:
    /// - `SoftmaxNormalized`: by softmax probability, weights renormalised to sum to one
    ///   (llama.cpp: `ggml_soft_max`, `ggml_argsort_top_k`, `ggml_get_rows`, `norm_w`);
    /// - `SoftmaxOfTopK`: by logit, weights the softmax of the k chosen logits (`SOFTMAX_WEIGHT`).
    ///
    /// llama.cpp's argsort is a `std::sort`, whose order among equal scores is unspecified;
    /// here the lower id goes first.
    pub fn new(logits: &[f32], num_experts: usize, k: usize, gating: ExpertGating) -> Routing {
        let n_rows = logits.len() / num_experts;
        let mut chosen = Vec::with_capacity(n_rows * k);
        let mut weights = Vec::with_capacity(n_rows * k);
        let mut probs = vec![0.0f32; num_experts];
        let mut order: Vec<u32> = Vec::with_capacity(num_experts);
        let (mut top_logits, mut top_weights) = (vec![0.0f32; k], vec![0.0f32; k]);
        for row in logits.chunks_exact(num_experts) {
            let scores = match gating {
                ExpertGating::SoftmaxNormalized => {
                    softmax(row, &mut probs);
                    &probs
                }
                ExpertGating::SoftmaxOfTopK => row,
            };
            order.clear();
            order.extend(0..num_experts as u32);
            order.sort_by(|&a, &b| {
                scores[b as usize]
                    .total_cmp(&scores[a as usize])
                    .then(a.cmp(&b))
            });
            let top = &order[..k];
            chosen.extend_from_slice(top);
            match gating {
                ExpertGating::SoftmaxNormalized => {
                    let sum: f32 = top.iter().map(|&e| probs[e as usize]).sum();
                    let sum = sum.max(MIN_WEIGHT_SUM);
                    weights.extend(top.iter().map(|&e| probs[e as usize] / sum));
                }
                ExpertGating::SoftmaxOfTopK => {
                    for (l, &e) in top_logits.iter_mut().zip(top) {
                        *l = row[e as usize];
                    }
                    softmax(&top_logits, &mut top_weights);
                    weights.extend_from_slice(&top_weights);
                }
            }
        }
        Routing { k, chosen, weights }
    }

    /// The experts some row chose, in increasing id, each with its rows.
    pub fn groups(&self, num_experts: usize) -> Vec<Group> {
        let mut groups: Vec<Group> = (0..num_experts)
            .map(|expert| Group {
                expert,
                rows: Vec::new(),
                slots: Vec::new(),
            })
            .collect();
        for (slot, &e) in self.chosen.iter().enumerate() {
            let g = &mut groups[e as usize];
            g.rows.push((slot / self.k) as u32);
            g.slots.push(slot as u32);
        }
        groups.retain(|g| !g.rows.is_empty());
        groups
    }
}

/// `p = softmax(x)` as ggml's soft_max: exp(x - max), summed in f64, times 1 / sum.
fn softmax(x: &[f32], p: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for (p, &v) in p.iter_mut().zip(x) {
        *p = (v - max).exp();
        sum += *p as f64;
    }
    let inv = (1.0 / sum) as f32;
    p.iter_mut().for_each(|v| *v *= inv);
}

/// `x[r] += bias` if there is one.
fn add_bias_if<B: Backend>(b: &mut B, x: &mut B::Acts, bias: &Option<B::Vector>) -> Result<()> {
    match bias {
        Some(bias) => b.add_bias(x, bias),
        None => Ok(()),
    }
}

/// `out = sum over each row's chosen experts of weight * down(act(gate(h)) * up(h))` (each
/// product plus its bias where the model has them): `h` [n][n_embd] the normed input, `out`
/// [n][n_embd].
pub fn experts_ffn<B: Backend>(
    b: &mut B,
    router: &Linear<B>,
    experts: &[Mlp<B>],
    c: &ModelConfig,
    h: &B::Acts,
    n: usize,
    out: &mut B::Acts,
) -> Result<()> {
    let routing = route(b, &router.weight, &router.bias, c, h, n)?;
    run_experts(b, &routing, experts, c, h, n, out)
}

/// `out += down(act(gate(h)) * up(h))` of a shared expert every row runs (granitehybrid's, added
/// after the routed experts' sum as llama.cpp's `ggml_add(moe_out, ffn_shexp)`).
pub fn add_shared_expert<B: Backend>(
    b: &mut B,
    mlp: &Mlp<B>,
    c: &ModelConfig,
    h: &B::Acts,
    n: usize,
    out: &mut B::Acts,
) -> Result<()> {
    let n_ff = c.experts.map_or(0, |x| x.n_ff_shexp);
    let (mut gate, mut up) = (b.acts(n, n_ff)?, b.acts(n, n_ff)?);
    let mut down = b.acts(n, c.n_embd)?;
    let mut hq = b.input(h);
    b.matmul_many(&mut hq, &mut [(&mlp.gate, &mut gate), (&mlp.up, &mut up)])?;
    drop(hq);
    b.glu(&mut gate, &up, c.activation)?;
    let mut gq = b.input(&gate);
    b.matmul(&mut gq, &mlp.down, &mut down)?;
    drop(gq);
    b.add(out, &down)?;
    for buf in [gate, up, down] {
        b.recycle(buf);
    }
    Ok(())
}

/// Each row of `x` ([n][n_embd]) routed by the router's logits (`Routing::new`).
pub fn route<B: Backend>(
    b: &mut B,
    router: &B::Matrix,
    bias: &Option<B::Vector>,
    c: &ModelConfig,
    x: &B::Acts,
    n: usize,
) -> Result<Routing> {
    let Some(shape) = &c.experts else {
        bail!("a mixture of experts in a model of no experts");
    };
    // logits: [n][num_experts], each expert's score for each row.
    let mut logits = b.acts(n, shape.num_experts)?;
    let mut hq = b.input(x);
    b.matmul(&mut hq, router, &mut logits)?;
    drop(hq);
    add_bias_if(b, &mut logits, bias)?;
    let routing = Routing::new(
        &b.read(&logits)?,
        shape.num_experts,
        shape.num_experts_used,
        shape.gating,
    );
    b.recycle(logits);
    Ok(routing)
}

/// `out = sum over each row's chosen experts of weight * down(act(gate(h)) * up(h))` for a
/// routing made already.
pub fn run_experts<B: Backend>(
    b: &mut B,
    routing: &Routing,
    experts: &[Mlp<B>],
    c: &ModelConfig,
    h: &B::Acts,
    n: usize,
    out: &mut B::Acts,
) -> Result<()> {
    let Some(shape) = &c.experts else {
        bail!("a mixture of experts in a model of no experts");
    };
    let (k, n_ff, n_embd) = (shape.num_experts_used, shape.n_ff_exp, c.n_embd);

    // slots: [n][k][n_embd], each row's experts' outputs in the order of its ranking.
    let mut slots = b.acts(n * k, n_embd)?;
    for g in routing.groups(shape.num_experts) {
        let (m, mlp) = (g.rows.len(), &experts[g.expert]);
        let mut x = b.acts(m, n_embd)?; // the rows that chose this expert
        b.gather_rows(h, &g.rows, &mut x)?;
        let (mut gate, mut up) = (b.acts(m, n_ff)?, b.acts(m, n_ff)?);
        let mut xq = b.input(&x);
        b.matmul_many(&mut xq, &mut [(&mlp.gate, &mut gate), (&mlp.up, &mut up)])?;
        drop(xq);
        add_bias_if(b, &mut gate, &mlp.gate_bias)?;
        add_bias_if(b, &mut up, &mlp.up_bias)?;
        b.glu(&mut gate, &up, c.activation)?;
        let mut y = b.acts(m, n_embd)?;
        let mut gq = b.input(&gate);
        b.matmul(&mut gq, &mlp.down, &mut y)?;
        drop(gq);
        add_bias_if(b, &mut y, &mlp.down_bias)?;
        b.scatter_rows(&y, &g.slots, &mut slots)?;
        for buffer in [x, gate, up, y] {
            b.recycle(buffer);
        }
    }
    b.weighted_sum(&slots, &routing.weights, k, out)?;
    b.recycle(slots);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_row_takes_its_top_k_with_renormalised_weights() {
        // Two rows of four experts.
        let logits = [0.0, 2.0, 1.0, -1.0, 3.0, 3.0, 0.0, 5.0];
        let r = Routing::new(&logits, 4, 2, ExpertGating::SoftmaxNormalized);
        assert_eq!(r.chosen, [1, 2, 3, 0]);
        let (e1, e2) = (2.0f32.exp(), 1.0f32.exp());
        assert!((r.weights[0] - e1 / (e1 + e2)).abs() < 1e-6);
        assert!((r.weights[0] + r.weights[1] - 1.0).abs() < 1e-6);
        // Experts 0 and 1 tie in the second row: the lower id ranks first.
        let tie = Routing::new(&[3.0, 3.0, 0.0, 1.0], 4, 2, ExpertGating::SoftmaxNormalized);
        assert_eq!(tie.chosen, [0, 1]);
        assert_eq!(tie.weights, [0.5, 0.5]);
    }

    #[test]
    fn groups_list_each_chosen_expert_once_with_its_rows_and_slots() {
        let r = Routing {
            k: 2,
            chosen: vec![1, 2, 3, 1, 2, 0],
            weights: vec![0.5; 6],
        };
        let g = r.groups(4);
        let summary: Vec<(usize, Vec<u32>, Vec<u32>)> =
            g.into_iter().map(|g| (g.expert, g.rows, g.slots)).collect();
        assert_eq!(
            summary,
            [
                (0, vec![2], vec![5]),
                (1, vec![0, 1], vec![0, 3]),
                (2, vec![0, 2], vec![1, 4]),
                (3, vec![1], vec![2]),
            ]
        );
    }

    #[test]
    fn a_rows_routing_does_not_depend_on_the_other_rows() {
        let a = [0.3, -1.0, 2.5, 0.7, 0.1, 0.0];
        let b = [1.0, 1.0, -2.0, 4.0, 0.5, 0.5];
        for gating in [ExpertGating::SoftmaxNormalized, ExpertGating::SoftmaxOfTopK] {
            let alone = Routing::new(&a, 6, 3, gating);
            let both = Routing::new(&[b, a].concat(), 6, 3, gating);
            assert_eq!(alone.chosen, both.chosen[3..]);
            assert_eq!(alone.weights, both.weights[3..]);
        }
    }

    #[test]
    fn softmax_of_top_k_weights_the_chosen_logits_alone() {
        // gpt-oss: the top 2 of [0, 2, 1, -1] by logit are 1 and 2, weighted by softmax([2, 1]).
        let r = Routing::new(&[0.0, 2.0, 1.0, -1.0], 4, 2, ExpertGating::SoftmaxOfTopK);
        assert_eq!(r.chosen, [1, 2]);
        let e = 1.0f32.exp();
        assert!((r.weights[0] - e / (e + 1.0)).abs() < 1e-6);
        assert!((r.weights[1] - 1.0 / (e + 1.0)).abs() < 1e-6);
        // The unchosen logits do not matter, unlike with softmax over all experts.
        let r2 = Routing::new(&[-9.0, 2.0, 1.0, -9.0], 4, 2, ExpertGating::SoftmaxOfTopK);
        assert_eq!(r.weights, r2.weights);
        let n = Routing::new(
            &[-9.0, 2.0, 1.0, -9.0],
            4,
            2,
            ExpertGating::SoftmaxNormalized,
        );
        assert_eq!(n.chosen, r2.chosen);
    }
}
