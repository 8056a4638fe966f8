//! A backend's own copy of the weights: [`Weights::load`] turns [`Weights<InFile>`] (what the
//! file holds, checked) into `Weights<S>` for the backend's [`WeightStore`], one matrix and one
//! vector conversion at a time, at load, never during a step. Called by each backend's loader.

use super::backend::WeightStore;
use super::per_layer::{PerLayerBlock, PerLayerInputs};
use super::weights::{
    Attention, FeedForward, InFile, LayerWeights, Linear, MatrixInfo, Mixer, Mlp, ShortConv,
    Weights,
};

impl Weights<InFile> {
    /// The same weights in store `S`: each matrix made by `matrix`, each vector by `vector`
    /// (the one place a backend's copy of the weights is made, at load time).
    pub fn load<S: WeightStore, E>(
        &self,
        matrix: &mut MakeMatrix<S, E>,
        vector: &mut MakeVector<S, E>,
    ) -> Result<Weights<S>, E> {
        let mut s = Loader::<S, E> { matrix, vector };
        let mut layers = Vec::with_capacity(self.layers.len());
        for lw in &self.layers {
            let mixer = match &lw.mixer {
                Mixer::Attention(a) => Mixer::Attention(Attention {
                    attn_sinks: s.vector_if(&a.attn_sinks)?,
                    wq: s.linear(&a.wq)?,
                    wk: s.linear(&a.wk)?,
                    wv: s.linear(&a.wv)?,
                    attn_q_norm: s.vector_if(&a.attn_q_norm)?,
                    attn_k_norm: s.vector_if(&a.attn_k_norm)?,
                    attn_v_norm: s.vector_if(&a.attn_v_norm)?,
                    wo: s.linear(&a.wo)?,
                    attn_post_norm: s.vector_if(&a.attn_post_norm)?,
                    q_gate: a.q_gate,
                }),
                Mixer::DeltaNet(d) => Mixer::DeltaNet(Box::new(d.load(s.matrix, s.vector)?)),
                Mixer::ShortConv(sc) => Mixer::ShortConv(ShortConv {
                    in_proj: (s.matrix)(&sc.in_proj)?,
                    conv: (s.vector)(&sc.conv)?,
                    out_proj: (s.matrix)(&sc.out_proj)?,
                }),
                Mixer::Mamba2(m) => Mixer::Mamba2(Box::new(m.convert(s.matrix, s.vector)?)),
            };
            layers.push(LayerWeights {
                attn_norm: (s.vector)(&lw.attn_norm)?,
                mixer,
                ffn_norm: (s.vector)(&lw.ffn_norm)?,
                ffn: s.feed_forward(&lw.ffn)?,
                ffn_post_norm: s.vector_if(&lw.ffn_post_norm)?,
                out_scale: lw.out_scale,
                per_layer: match &lw.per_layer {
                    Some(p) => Some(PerLayerBlock {
                        inp_gate: (s.matrix)(&p.inp_gate)?,
                        proj: (s.matrix)(&p.proj)?,
                        post_norm: (s.vector)(&p.post_norm)?,
                    }),
                    None => None,
                },
            });
        }
        Ok(Weights {
            token_embd: (s.matrix)(&self.token_embd)?,
            layers,
            output_norm: (s.vector)(&self.output_norm)?,
            output: self.output.as_ref().map(|o| s.linear(o)).transpose()?,
            per_layer: match &self.per_layer {
                Some(p) => Some(PerLayerInputs {
                    token_embd: (s.matrix)(&p.token_embd)?,
                    model_proj: (s.matrix)(&p.model_proj)?,
                    proj_norm: (s.vector)(&p.proj_norm)?,
                }),
                None => None,
            },
        })
    }
}

/// How [`Weights::load`] makes a matrix of store `S`.
pub type MakeMatrix<'f, S, E> =
    dyn FnMut(&MatrixInfo) -> Result<<S as WeightStore>::Matrix, E> + 'f;
/// How [`Weights::load`] makes a vector of store `S`.
pub type MakeVector<'f, S, E> = dyn FnMut(&[f32]) -> Result<<S as WeightStore>::Vector, E> + 'f;

impl Mlp<InFile> {
    /// The same gated feed-forward network in store `S` (a dense block's, an expert's, a shared
    /// expert's).
    pub(super) fn load<S: WeightStore, E>(
        &self,
        matrix: &mut MakeMatrix<S, E>,
        vector: &mut MakeVector<S, E>,
    ) -> Result<Mlp<S>, E> {
        let mut vector_if = |v: &Option<Vec<f32>>| v.as_deref().map(&mut *vector).transpose();
        Ok(Mlp {
            gate: matrix(&self.gate)?,
            up: matrix(&self.up)?,
            down: matrix(&self.down)?,
            gate_bias: vector_if(&self.gate_bias)?,
            up_bias: vector_if(&self.up_bias)?,
            down_bias: vector_if(&self.down_bias)?,
        })
    }
}

/// The two conversions of [`Weights::load`].
struct Loader<'f, S: WeightStore, E> {
    matrix: &'f mut MakeMatrix<'f, S, E>,
    vector: &'f mut MakeVector<'f, S, E>,
}

impl<S: WeightStore, E> Loader<'_, S, E> {
    fn vector_if(&mut self, v: &Option<Vec<f32>>) -> Result<Option<S::Vector>, E> {
        v.as_deref().map(&mut *self.vector).transpose()
    }

    fn mlp(&mut self, m: &Mlp<InFile>) -> Result<Mlp<S>, E> {
        m.load(self.matrix, self.vector)
    }

    fn feed_forward(&mut self, f: &FeedForward<InFile>) -> Result<FeedForward<S>, E> {
        Ok(match f {
            FeedForward::Dense(m) => FeedForward::Dense(self.mlp(m)?),
            FeedForward::Experts {
                router,
                experts,
                shared,
            } => FeedForward::Experts {
                router: self.linear(router)?,
                experts: experts
                    .iter()
                    .map(|m| self.mlp(m))
                    .collect::<Result<_, E>>()?,
                shared: match shared {
                    Some(m) => Some(Box::new(self.mlp(m)?)),
                    None => None,
                },
            },
            FeedForward::SharedExperts(m) => {
                FeedForward::SharedExperts(Box::new(m.load(self.matrix, self.vector)?))
            }
            FeedForward::SharedGated(m) => {
                FeedForward::SharedGated(Box::new(m.load(self.matrix, self.vector)?))
            }
        })
    }

    fn linear(&mut self, l: &Linear<InFile>) -> Result<Linear<S>, E> {
        Ok(Linear {
            weight: (self.matrix)(&l.weight)?,
            bias: self.vector_if(&l.bias)?,
        })
    }
}
