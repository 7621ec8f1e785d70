//! Mixture-of-experts routing, shared by every backend: from the router's logits to each
//! expert's list of `(token, weight)`, so an expert's weights are read once per step for all
//! the tokens routed to it (the products then run on the gathered rows).
//!
//! Per token (transformers' arithmetic, f32): `p = softmax(logits)`; the `top_k` largest `p`
//! (ties to the lower expert index, as `torch.topk` on CPU); with `norm_topk_prob` the chosen
//! `p` are divided by their sum. A token's output is `sum_e w_e * expert_e(x)`, added in
//! ascending expert order (the order of transformers' per-expert loop), so a token's result
//! does not depend on its batch mates.
//!
//! Invariants of a [`Routing`] after [`route`]: every token appears in exactly `top_k` expert
//! lists, once each; each list is in ascending token order.

/// Which tokens each expert serves this step, with their weights.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Routing {
    /// `experts[e]`: `(token, weight)` in ascending token order.
    pub experts: Vec<Vec<(u32, f32)>>,
    /// Scratch: one token's probabilities and its chosen experts.
    probs: Vec<f32>,
    chosen: Vec<usize>,
}

/// Routes `t = logits.len() / num_experts` tokens (`logits`: `[t, num_experts]`) into
/// `routing`, reusing its lists.
pub fn route(
    logits: &[f32],
    num_experts: usize,
    top_k: usize,
    norm_topk_prob: bool,
    routing: &mut Routing,
) {
    routing.experts.resize_with(num_experts, Vec::new);
    routing.experts.iter_mut().for_each(Vec::clear);
    if num_experts == 0 {
        return;
    }
    let top_k = top_k.min(num_experts);
    for (t, row) in logits.chunks_exact(num_experts).enumerate() {
        let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        routing.probs.clear();
        routing.probs.extend(row.iter().map(|&l| (l - max).exp()));
        let z: f32 = routing.probs.iter().sum();
        routing.probs.iter_mut().for_each(|p| *p /= z);
        // The top_k by probability, ties to the lower index.
        routing.chosen.clear();
        for _ in 0..top_k {
            let mut best: Option<usize> = None;
            for (e, &p) in routing.probs.iter().enumerate() {
                if routing.chosen.contains(&e) {
                    continue;
                }
                if best.is_none_or(|b| p > routing.probs[b]) {
                    best = Some(e);
                }
            }
            if let Some(b) = best {
                routing.chosen.push(b);
            }
        }
        let sum: f32 = routing.chosen.iter().map(|&e| routing.probs[e]).sum();
        for &e in &routing.chosen {
            let p = routing.probs[e];
            let w = if norm_topk_prob { p / sum } else { p };
            routing.experts[e].push((t as u32, w));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_token_goes_to_its_top_k_with_softmax_weights() {
        // Two tokens, four experts.
        let logits = [0.0, 2.0, 1.0, -1.0, 3.0, 3.0, 0.0, 0.0];
        let mut r = Routing::default();
        route(&logits, 4, 2, false, &mut r);
        let z0: f32 = [0.0f32, 2.0, 1.0, -1.0]
            .iter()
            .map(|l| (l - 2.0).exp())
            .sum();
        assert_eq!(r.experts[1][0].0, 0);
        assert!((r.experts[1][0].1 - 1.0 / z0).abs() < 1e-6);
        assert_eq!(r.experts[2][0].0, 0);
        // The tie of token 1 goes to both 0 and 1 (top-2), each 1/(2 + 2e^-3).
        assert_eq!((r.experts[0][0].0, r.experts[1][1].0), (1, 1));
        assert!(r.experts[3].is_empty());
        route(&logits, 4, 2, true, &mut r);
        let w: f32 = r.experts[1][0].1 + r.experts[2][0].1;
        assert!((w - 1.0).abs() < 1e-6);
        assert!((r.experts[0][0].1 - 0.5).abs() < 1e-6);
        let total: usize = r.experts.iter().map(Vec::len).sum();
        assert_eq!(total, 4);
    }
}
