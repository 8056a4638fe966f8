//! How a sequence's embeddings (the normed last hidden states the forward pass returns for
//! `Batch::embd_rows`) become one vector, as llama.cpp's `build_pooling` does: none (every
//! token's own), mean, cls (the first token's), last (the last token's); and the normalizations
//! of llama.cpp's `common_embd_normalize`. The engine collects the rows and calls [`pool`]; the
//! faces choose the [`Pooling`] (the GGUF's `{arch}.pooling_type`, else `--pooling`) and call
//! [`normalize`].

use anyhow::{bail, Result};

use crate::gguf::GgufFile;

/// llama.cpp's pooling types (`enum llama_pooling_type`), less rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pooling {
    /// Every token's vector.
    None,
    Mean,
    /// The first token's vector.
    Cls,
    /// The last token's vector.
    Last,
}

impl Pooling {
    /// The name llama.cpp's `--pooling` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }

    /// Parses a `--pooling` value.
    pub fn parse(s: &str) -> Result<Pooling> {
        Ok(match s {
            "none" => Pooling::None,
            "mean" => Pooling::Mean,
            "cls" => Pooling::Cls,
            "last" => Pooling::Last,
            "rank" => bail!("pooling 'rank' (rerankers) is not supported"),
            _ => bail!("unknown pooling '{s}' (none, mean, cls, last)"),
        })
    }

    /// The model's own pooling (`{arch}.pooling_type`, llama.cpp's numbering), None when the
    /// file has no such key.
    pub fn from_gguf(g: &GgufFile) -> Result<Option<Pooling>> {
        let key = format!("{}.pooling_type", g.architecture()?);
        if g.get(&key).is_none() {
            return Ok(None);
        }
        Ok(Some(match g.get_u64(&key)? {
            0 => Pooling::None,
            1 => Pooling::Mean,
            2 => Pooling::Cls,
            3 => Pooling::Last,
            4 => bail!("{key} = 4 (rank: a reranker) is not supported"),
            v => bail!("{key} = {v} is not a pooling type"),
        }))
    }

    /// Whether the file is a reranker's: `{arch}.pooling_type` = 4 (llama.cpp's
    /// `LLAMA_POOLING_TYPE_RANK`, which [`Pooling::from_gguf`] refuses): its score comes from
    /// a classifier head over the pooled vector (`crate::model::encoder::rank`).
    pub fn is_rank(g: &GgufFile) -> bool {
        g.architecture()
            .ok()
            .and_then(|a| g.get_u64(&format!("{a}.pooling_type")).ok())
            == Some(4)
    }

    /// Whether the token at `pos` of a prompt of `len` tokens contributes to the pooled vector.
    pub fn wants(self, pos: usize, len: usize) -> bool {
        match self {
            Pooling::None | Pooling::Mean => true,
            Pooling::Cls => pos == 0,
            Pooling::Last => pos + 1 == len,
        }
    }
}

/// Pools `rows` ([n_rows][n_embd], the rows [`Pooling::wants`] of one prompt, in order) into
/// one vector, or for [`Pooling::None`] returns them all.
pub fn pool(pooling: Pooling, rows: &[f32], n_embd: usize) -> Vec<f32> {
    match pooling {
        Pooling::None | Pooling::Cls | Pooling::Last => rows.to_vec(),
        Pooling::Mean => {
            let n_rows = rows.len() / n_embd;
            let mut sum = vec![0.0f64; n_embd];
            for row in rows.chunks_exact(n_embd) {
                for (s, &v) in sum.iter_mut().zip(row) {
                    *s += v as f64;
                }
            }
            sum.iter().map(|&s| (s / n_rows as f64) as f32).collect()
        }
    }
}

/// llama.cpp's `common_embd_normalize`: -1 none, 0 max absolute scaled to int16's range,
/// 2 euclidean, any other p the p-norm (1: taxicab).
pub fn normalize(v: &mut [f32], norm: i32) {
    let sum: f64 = match norm {
        -1 => 1.0,
        0 => v.iter().fold(0.0f64, |m, &x| m.max(x.abs() as f64)) / 32760.0,
        2 => v.iter().map(|&x| (x * x) as f64).sum::<f64>().sqrt(),
        p => v
            .iter()
            .map(|&x| (x.abs() as f64).powi(p))
            .sum::<f64>()
            .powf(1.0 / p as f64),
    };
    let scale = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
    for x in v {
        *x *= scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_cls_last_and_norms() {
        let rows = [1.0, 2.0, 3.0, 6.0];
        assert_eq!(pool(Pooling::Mean, &rows, 2), vec![2.0, 4.0]);
        assert_eq!(pool(Pooling::Last, &rows[2..], 2), vec![3.0, 6.0]);
        assert!(Pooling::Cls.wants(0, 5) && !Pooling::Cls.wants(1, 5));
        assert!(Pooling::Last.wants(4, 5) && !Pooling::Last.wants(3, 5));
        let mut v = [3.0, 4.0];
        normalize(&mut v, 2);
        assert_eq!(v, [0.6, 0.8]);
        let mut v = [3.0, -1.0];
        normalize(&mut v, 1);
        assert_eq!(v, [0.75, -0.25]);
        let mut v = [0.0, 0.0];
        normalize(&mut v, 2);
        assert_eq!(v, [0.0, 0.0]);
        assert!(Pooling::parse("rank").is_err() && Pooling::parse("x").is_err());
    }
}
