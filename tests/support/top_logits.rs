//! Comparing our logits with a llama.cpp reference that keeps, per position, the top tokens'
//! logits, the log-sum-exp and the logits at picked ids (scripts/synth/synth.py `refs` with
//! `top_k`): the mean KLD over those top tokens and the rest as one outcome (at most the full
//! KLD, by the data-processing inequality), the same-top share, and the worst logit error
//! relative to the top logit (over the top tokens and the picked ids). Used by
//! tests/synth_qwen35.rs, tests/synth_granite.rs and tests/hybrid_models.rs.

use serde_json::Value;

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// What [`compare`] measured.
#[derive(Clone, Debug)]
pub struct Agreement {
    pub mean_kld: f64,
    pub same_top: f64,
    /// Worst |ours - llama.cpp's| / |llama.cpp's top logit| over every position.
    pub worst: f32,
    /// The median position's worst.
    pub median: f32,
    /// Each position's worst, in position order.
    pub per_position: Vec<f32>,
}

/// `ours`: every position's logits, [positions][vocab].
pub fn compare(r: &Value, ours: &[f32], vocab: usize) -> Agreement {
    let picked = ids(&r["picked_ids"]);
    let positions = r["positions"].as_array().unwrap();
    let (mut kld, mut same) = (0.0f64, 0usize);
    let mut per_position = Vec::new();
    for (p, pos) in positions.iter().enumerate() {
        let mut worst = 0.0f32;
        let row = &ours[p * vocab..(p + 1) * vocab];
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
        let lse = max
            + row
                .iter()
                .map(|&x| (x as f64 - max).exp())
                .sum::<f64>()
                .ln();
        let ref_lse = pos["logsumexp"].as_f64().unwrap();
        let top: Vec<(usize, f64)> = pos["top"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t[0].as_u64().unwrap() as usize, t[1].as_f64().unwrap()))
            .collect();
        let (mut p_rest, mut q_rest) = (1.0f64, 1.0f64);
        for &(id, l) in &top {
            let (lp, lq) = (l - ref_lse, row[id] as f64 - lse);
            kld += lp.exp() * (lp - lq);
            p_rest -= lp.exp();
            q_rest -= lq.exp();
            worst = worst.max(((row[id] as f64 - l).abs() / top[0].1.abs()) as f32);
        }
        if p_rest > 0.0 && q_rest > 0.0 {
            kld += p_rest * (p_rest / q_rest).ln();
        }
        let argmax = (0..vocab)
            .max_by(|&a, &b| row[a].total_cmp(&row[b]))
            .unwrap();
        same += usize::from(argmax == top[0].0);
        for (k, &id) in picked.iter().enumerate() {
            let l = pos["picked"][k].as_f64().unwrap();
            worst = worst.max(((row[id as usize] as f64 - l).abs() / top[0].1.abs()) as f32);
        }
        per_position.push(worst);
    }
    let n = positions.len();
    let mut sorted = per_position.clone();
    sorted.sort_by(f32::total_cmp);
    Agreement {
        mean_kld: kld / n as f64,
        same_top: same as f64 / n as f64,
        worst: sorted[n - 1],
        median: sorted[n / 2],
        per_position,
    }
}
