//! Scoring text: one sequence's logits straight through the paged KV cache ([`runner`]), and
//! what is computed from them: perplexity ([`perplexity`]) and the KL divergence against a
//! reference's logits ([`kl_divergence`]). Generation goes through the engine instead.

pub mod kl_divergence;
pub mod perplexity;
pub mod runner;
