//! The greedy choice over a row of logits, shared by the engine's sampler and the backends that
//! decide greedy rows without sending the logits anywhere ([`crate::Model::forward_argmax`]).

use ferrum_types::TokenId;

/// Index of the largest value (the first among equals); NaN never wins; 0 when nothing beats
/// minus infinity.
///
/// Two passes that the compiler vectorizes: the maximum (eight running maxima, NaN ignored),
/// then the first index holding it. That is the one-at-a-time scan's answer (the first value
/// greater than all before it), and several times faster: greedy decoding runs this over the
/// whole vocabulary for every sequence of every step, on the engine thread.
pub fn argmax(row: &[f32]) -> TokenId {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = row.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = m.max(v);
        }
    }
    let max = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    if max == f32::NEG_INFINITY {
        return 0;
    }
    row.iter().position(|&v| v == max).unwrap_or(0) as TokenId
}
