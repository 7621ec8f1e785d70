//! [`Guide`]: one sequence's constraint state (an llguidance matcher) and the mask of the
//! tokens it allows next.

use ferrum_types::TokenId;
use llguidance::toktrie::{SimpleVob, TokEnv, TokTrie};
use llguidance::Matcher;
use std::sync::Arc;

/// One opening of a triggered constraint, as the guide watches for it.
#[derive(Clone, Debug)]
pub(super) struct Watched {
    pub bytes: Vec<u8>,
    /// The trigger's one token, when it is one: only that token opens the grammar.
    pub token: Option<TokenId>,
    /// Counts only where the output opens with it (after whitespace).
    pub at_start: bool,
}

/// Most bytes of output kept to find an at-start trigger (leading whitespace included).
const MAX_HEAD: usize = 4096;

/// A triggered constraint before its trigger: the output is free text, watched for the
/// triggers.
#[derive(Clone)]
struct Pending {
    triggers: Vec<Watched>,
    /// The output's last bytes (fewer than the longest trigger's), to find a trigger that
    /// spans tokens.
    tail: Vec<u8>,
    /// The whole output so far while it may still open with an at-start trigger (whitespace,
    /// then a prefix of one); `None` once it cannot.
    head: Option<Vec<u8>>,
    env: TokEnv,
}

fn trim_blank(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|c| c.is_ascii_whitespace()).count();
    &b[n..]
}

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
    /// A triggered constraint that has not seen its trigger yet.
    pending: Option<Box<Pending>>,
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
            pending: None,
        }
    }

    /// Makes this a triggered constraint: free text until one of `triggers`, then the
    /// grammar, which starts with that trigger.
    pub(super) fn set_triggers(&mut self, triggers: Vec<Watched>, env: TokEnv) {
        self.mask = None;
        let head = triggers.iter().any(|w| w.at_start).then(Vec::new);
        self.pending = Some(Box::new(Pending {
            triggers,
            tail: Vec::new(),
            head,
            env,
        }));
    }

    /// Whether the constraint applies to the next token (a triggered one only after its
    /// trigger).
    pub fn is_active(&self) -> bool {
        self.pending.is_none()
    }

    /// Whether the next token needs a mask that is not computed yet.
    pub fn needs_mask(&self) -> bool {
        self.is_active() && self.mask.is_none()
    }

    /// Watches a free-text token for the triggers; on one, the grammar starts with the output
    /// from the trigger on. The output from the trigger on may not fit the grammar (a token
    /// that completed the trigger carried more text than the grammar takes there): then it was
    /// free text after all, and watching goes on.
    fn watch(&mut self, token: TokenId) {
        let Some(p) = self.pending.as_mut() else {
            return;
        };
        let trie: &TokTrie = p.env.tok_trie();
        // Ids past the tokenizer's vocabulary (a model's padding rows) are no text.
        let b: &[u8] = if (token as usize) < trie.vocab_size() {
            trie.token(token)
        } else {
            &[]
        };
        let b = b
            .strip_prefix(&[TokTrie::SPECIAL_TOKEN_MARKER])
            .unwrap_or(b);
        let blank_before = p.head.as_deref().is_some_and(|h| trim_blank(h).is_empty());
        let mut opened: Option<Vec<TokenId>> = None;
        // A one-token trigger opens only as itself.
        if let Some(w) = p.triggers.iter().find(|w| w.token == Some(token)) {
            if !w.at_start || blank_before {
                opened = Some(vec![token]);
            }
        }
        // Text triggers where the output opens.
        if let Some(head) = p.head.as_mut() {
            head.extend_from_slice(b);
            let body = trim_blank(head);
            let mut starts = p
                .triggers
                .iter()
                .filter(|w| w.at_start && w.token.is_none());
            if opened.is_some() {
                p.head = None;
            } else if starts.clone().any(|w| body.starts_with(&w.bytes)) {
                opened = Some(trie.greedy_tokenize(body));
                p.head = None;
            } else if head.len() > MAX_HEAD || !starts.any(|w| w.bytes.starts_with(body)) {
                p.head = None;
            }
        }
        // Text triggers anywhere: the earliest occurrence in the output's tail.
        let keep = p
            .triggers
            .iter()
            .filter(|w| !w.at_start && w.token.is_none())
            .map(|w| w.bytes.len() - 1)
            .max();
        if let Some(keep) = keep {
            p.tail.extend_from_slice(b);
            let found = p
                .triggers
                .iter()
                .filter(|w| !w.at_start && w.token.is_none())
                .filter_map(|w| {
                    p.tail
                        .windows(w.bytes.len())
                        .position(|x| x == w.bytes.as_slice())
                })
                .min();
            match found {
                Some(at) if opened.is_none() => {
                    opened = Some(trie.greedy_tokenize(&p.tail[at..]));
                    // Whatever happens next, this occurrence is decided.
                    p.tail.drain(..=at);
                }
                _ => {
                    let cut = p.tail.len().saturating_sub(keep);
                    p.tail.drain(..cut);
                }
            }
        }
        let Some(opened) = opened else {
            return;
        };
        let mut trial = self.matcher.deep_clone();
        if opened.iter().all(|&t| trial.consume_token(t).is_ok()) && !trial.is_error() {
            self.matcher = trial;
            self.pending = None;
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
            pending: self.pending.clone(),
        }
    }

    /// Computes the mask of the current state, unless it is computed already. A state that
    /// allows no token at all is an error (the constraint cannot be completed).
    pub fn compute_mask(&mut self) -> Result<(), String> {
        if !self.needs_mask() {
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

    /// The mask of the current state as words (bit `t % 32` of word `t / 32` allows `t`):
    /// empty, so nothing allowed, when it is not computed, which the engine never lets happen.
    pub fn mask_words(&self) -> &[u32] {
        self.mask.as_ref().map_or(&[], |m| m.as_slice())
    }

    /// The allowed token with the largest logit (the first on ties), without copying: the
    /// argmax of the masked row by [`ferrum_models::argmax`]'s rules (NaN never wins; `None`
    /// when no allowed logit beats minus infinity, where the masked row's argmax is 0).
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
                if l > best.map_or(f32::NEG_INFINITY, |(bl, _)| bl) {
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
        if self.pending.is_some() {
            self.watch(token);
            return Ok(());
        }
        if self.matcher.is_stopped() && !self.matcher.is_error() && self.eos.contains(&token) {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    /// Whether the constraint is complete and allows nothing more (or failed).
    pub fn is_stopped(&self) -> bool {
        self.is_active() && self.matcher.is_stopped()
    }

    /// How many of `tokens`, from the first, the current state accepts in a row (the
    /// state itself does not change): a proposal is cut to this before it is verified.
    pub fn valid_prefix(&mut self, tokens: &[TokenId]) -> usize {
        if !self.is_active() {
            return tokens.len();
        }
        // An id past the tokenizer's vocabulary would put the matcher in an error state.
        let n = self
            .matcher
            .tok_env()
            .map_or(0, |e| e.tok_trie().vocab_size());
        let known = tokens.iter().take_while(|&&t| (t as usize) < n).count();
        self.matcher.validate_tokens(&tokens[..known]).unwrap_or(0)
    }

    /// The number of logits per row of the model this guide is for.
    pub fn model_vocab(&self) -> usize {
        self.model_vocab
    }
}
