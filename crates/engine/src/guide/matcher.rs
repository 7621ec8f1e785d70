//! [`Guide`]: one sequence's constraint state (an llguidance matcher) and the mask of the
//! tokens it allows next.

use ferrum_types::TokenId;
use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;
use std::sync::Arc;

/// A sequence's constraint: offers the mask of its current state, consumes sampled tokens.
#[derive(Clone)]
pub struct Guide {
    matcher: Matcher,
    kind: &'static str,
    /// The mask of the current state, once computed; dropped when a token is consumed.
    mask: Option<SimpleVob>,
    model_vocab: usize,
    /// The ids that end a sequence: a complete constraint allows exactly these.
    eos: Arc<[TokenId]>,
}

impl std::fmt::Debug for Guide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guide")
            .field("kind", &self.kind)
            .field("has_mask", &self.mask.is_some())
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

impl Guide {
    pub(super) fn new(
        matcher: Matcher,
        kind: &'static str,
        model_vocab: usize,
        eos: Arc<[TokenId]>,
    ) -> Guide {
        Guide {
            matcher,
            kind,
            mask: None,
            model_vocab,
            eos,
        }
    }

    /// The constraint's kind (`JSON schema`, `regex`, ...).
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// An independent copy in the same state (another sample of the same request).
    pub fn fork(&self) -> Guide {
        Guide {
            matcher: self.matcher.deep_clone(),
            kind: self.kind,
            mask: self.mask.clone(),
            model_vocab: self.model_vocab,
            eos: self.eos.clone(),
        }
    }

    /// Computes the mask of the current state, unless it is computed already. A state that
    /// allows no token at all is an error (the constraint cannot be completed).
    pub fn compute_mask(&mut self) -> Result<(), String> {
        if self.mask.is_some() {
            return Ok(());
        }
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        if mask.is_zero() {
            return Err(format!(
                "the {} allows no token after the output so far",
                self.kind
            ));
        }
        self.mask = Some(mask);
        Ok(())
    }

    /// Whether the mask of the current state is computed.
    pub fn has_mask(&self) -> bool {
        self.mask.is_some()
    }

    /// Whether the current state allows `token`; `false` until the mask is computed.
    pub fn allows(&self, token: TokenId) -> bool {
        self.mask
            .as_ref()
            .is_some_and(|m| (token as usize) < m.len() && m.is_allowed(token))
    }

    /// Sets every logit the current state does not allow to minus infinity (all of them when
    /// the mask is not computed, which the engine never lets happen).
    pub fn apply(&self, logits: &mut [f32]) {
        let words: &[u32] = self.mask.as_ref().map_or(&[], |m| m.as_slice());
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX {
                continue;
            }
            for (i, l) in chunk.iter_mut().enumerate() {
                if bits & (1 << i) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// The allowed token with the largest logit (the first on ties), without copying.
    pub fn argmax(&self, logits: &[f32]) -> Option<TokenId> {
        let words: &[u32] = self.mask.as_ref().map_or(&[], |m| m.as_slice());
        let mut best: Option<(f32, usize)> = None;
        for (w, &bits) in words.iter().enumerate() {
            let mut b = bits;
            while b != 0 {
                let i = w * 32 + b.trailing_zeros() as usize;
                b &= b - 1;
                let Some(&l) = logits.get(i) else {
                    break;
                };
                if best.is_none_or(|(bl, _)| l > bl) {
                    best = Some((l, i));
                }
            }
        }
        best.map(|(_, i)| i as TokenId)
    }

    /// Consumes a sampled token (the mask is dropped). Errors when the constraint refuses it.
    /// A complete constraint that stopped takes an end-of-sequence id and stays as it is.
    pub fn consume(&mut self, token: TokenId) -> Result<(), String> {
        self.mask = None;
        if self.matcher.is_stopped() && !self.matcher.is_error() && self.eos.contains(&token) {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    /// Whether the constraint is complete and allows nothing more (or failed).
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// How many of `tokens`, from the first, the current state accepts in a row (the
    /// state itself does not change): a proposal is cut to this before it is verified.
    pub fn valid_prefix(&mut self, tokens: &[TokenId]) -> usize {
        self.matcher.validate_tokens(tokens).unwrap_or(0)
    }

    /// The number of logits per row of the model this guide is for.
    pub fn model_vocab(&self) -> usize {
        self.model_vocab
    }
}
