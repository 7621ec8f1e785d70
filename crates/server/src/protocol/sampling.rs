//! The sampling fields both endpoints share, and their rules.
//!
//! [`SamplingFields`] holds the fields as sent (types checked); [`SamplingFields::options`]
//! checks ranges and limits and builds the engine's [`SamplingParams`]. Every refusal names
//! the parameter; a default applies only where the field is absent or `null`.

use super::wire::{Count, Flag, Int, Num, Object, Seed, Strings, Text, TokenIds};
use super::{Options, MAX_LOGIT_BIAS, MAX_N, MAX_STOP_BYTES, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS};
use crate::error::{Result, ServerError};
use ferrum_types::{SamplingParams, TokenId};
use serde::Deserialize;
use serde_json::Value;

/// The fields of a request body that set up sampling (both endpoints).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(expecting = "an object")]
pub struct SamplingFields {
    pub model: Option<Text>,
    pub n: Option<Count>,
    pub temperature: Option<Num>,
    pub top_p: Option<Num>,
    /// `-1` or `0` disable it.
    pub top_k: Option<Int>,
    pub min_p: Option<Num>,
    pub repetition_penalty: Option<Num>,
    pub presence_penalty: Option<Num>,
    pub frequency_penalty: Option<Num>,
    /// Token id (as a string key) -> bias added to its logit.
    pub logit_bias: Option<Object>,
    pub seed: Option<Seed>,
    pub stream: Option<Flag>,
    pub stream_options: Option<StreamOptions>,
    /// OpenAI's end-user id: the tenant whose share of the engine the request uses (under
    /// `--scheduling fair`).
    pub user: Option<Text>,
    /// Lower values are scheduled first (vLLM's field; under `--scheduling priority` and
    /// `fair`).
    pub priority: Option<Int>,
    pub stop: Option<Strings>,
    pub stop_token_ids: Option<TokenIds>,
    pub ignore_eos: Option<Flag>,
    pub skip_special_tokens: Option<Flag>,
    /// Service-level targets: `{"ttft_ms": N, "tpot_ms": N, "best_effort": bool}`.
    pub slo: Option<SloFields>,
    /// A service-level class of the server's (`--slo-class`).
    pub slo_class: Option<Text>,
}

/// `slo`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(expecting = "an object")]
pub struct SloFields {
    pub ttft_ms: Option<Count>,
    pub tpot_ms: Option<Count>,
    pub best_effort: Option<Flag>,
}

/// The service-level targets a request asks for, as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SloAsk {
    Target {
        ttft_ms: Option<u64>,
        tpot_ms: Option<u64>,
        best_effort: bool,
    },
    Class(String),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(expecting = "an object")]
pub struct StreamOptions {
    /// A last chunk with the token counts. Its type is checked on admission, after the rule
    /// that `stream_options` needs `stream`.
    pub include_usage: Option<Value>,
}

/// Longest `user` (the tenant's name).
pub const MAX_USER_BYTES: usize = 256;

/// `max_tokens` of 0 is refused so the message names the field the client used.
pub fn max_tokens(key: &str, v: Option<Count>) -> Result<Option<usize>> {
    match v {
        Some(Count(0)) => Err(ServerError::param(
            key,
            format!("'{key}' must be at least 1"),
        )),
        v => Ok(v.map(|Count(m)| m)),
    }
}

impl SamplingFields {
    /// Checks ranges and limits; `max_tokens` is the endpoint's (already checked) limit.
    pub fn options(&self, max_tokens: Option<usize>) -> Result<Options> {
        let n = self.n.map_or(1, |Count(n)| n);
        if !(1..=MAX_N).contains(&n) {
            return Err(ServerError::param(
                "n",
                format!("'n' must be between 1 and {MAX_N}, got {n}"),
            ));
        }
        let top_k = match self.top_k.map(|Int(k)| k) {
            None | Some(-1) | Some(0) => None,
            Some(k) if k < 0 => {
                return Err(ServerError::param(
                    "top_k",
                    format!("'top_k' must be positive (or -1 to disable), got {k}"),
                ))
            }
            Some(k) => Some(usize::try_from(k).unwrap_or(usize::MAX)),
        };
        let logit_bias = self.logit_bias()?;
        let stream = self.stream.is_some_and(|Flag(b)| b);
        let include_usage = match &self.stream_options {
            None => false,
            Some(_) if !stream => {
                return Err(ServerError::param(
                    "stream_options",
                    "'stream_options' is only allowed when 'stream' is true",
                ))
            }
            Some(o) => match &o.include_usage {
                None => false,
                Some(v) => v.as_bool().ok_or_else(|| {
                    ServerError::param(
                        "stream_options.include_usage",
                        "'stream_options.include_usage' must be a boolean",
                    )
                })?,
            },
        };
        let stop = self.stop.clone().unwrap_or_default().0;
        if stop.len() > MAX_STOP_STRINGS {
            return Err(ServerError::param(
                "stop",
                format!(
                    "'stop' has {} strings; at most {MAX_STOP_STRINGS} are allowed",
                    stop.len()
                ),
            ));
        }
        if stop.iter().any(String::is_empty) {
            return Err(ServerError::param("stop", "stop strings must not be empty"));
        }
        if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
            return Err(ServerError::param(
                "stop",
                format!(
                    "a stop string of {} bytes is longer than the limit of {MAX_STOP_BYTES}",
                    long.len()
                ),
            ));
        }
        let stop_token_ids = self.stop_token_ids.clone().unwrap_or_default().0;
        if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return Err(ServerError::param(
                "stop_token_ids",
                format!("at most {MAX_STOP_TOKEN_IDS} stop token ids are allowed"),
            ));
        }
        let d = SamplingParams::default();
        let or = |v: Option<Num>, default: f32| v.map_or(default, |Num(x)| x);
        let params = SamplingParams {
            n,
            max_tokens,
            temperature: or(self.temperature, d.temperature),
            top_p: or(self.top_p, d.top_p),
            top_k,
            min_p: or(self.min_p, d.min_p),
            repetition_penalty: or(self.repetition_penalty, d.repetition_penalty),
            presence_penalty: or(self.presence_penalty, d.presence_penalty),
            frequency_penalty: or(self.frequency_penalty, d.frequency_penalty),
            logit_bias,
            seed: self.seed.map(|Seed(s)| s),
            stop,
            stop_token_ids,
            ignore_eos: self.ignore_eos.is_some_and(|Flag(b)| b),
            logprobs: None,
            skip_special_tokens: self.skip_special_tokens.is_none_or(|Flag(b)| b),
            structured: None,
        };
        let priority = match self.priority.map(|Int(p)| p) {
            None => 0,
            Some(p) => i32::try_from(p).map_err(|_| {
                ServerError::param(
                    "priority",
                    format!("'priority' must be a 32-bit integer, got {p}"),
                )
            })?,
        };
        let tenant = self.user.as_ref().map(|Text(u)| u.clone());
        if let Some(u) = tenant.as_ref().filter(|u| u.len() > MAX_USER_BYTES) {
            return Err(ServerError::param(
                "user",
                format!(
                    "'user' is {} bytes; at most {MAX_USER_BYTES} are allowed",
                    u.len()
                ),
            ));
        }
        Ok(Options {
            model: self.model.as_ref().map(|Text(m)| m.clone()),
            params,
            stream,
            include_usage,
            constraint_param: None,
            priority,
            tenant,
            slo: self.slo_ask()?,
        })
    }

    /// `slo` or `slo_class`, checked.
    fn slo_ask(&self) -> Result<Option<SloAsk>> {
        match (&self.slo, &self.slo_class) {
            (Some(_), Some(_)) => Err(ServerError::param(
                "slo_class",
                "give 'slo' or 'slo_class', not both",
            )),
            (None, None) => Ok(None),
            (None, Some(Text(c))) => Ok(Some(SloAsk::Class(c.clone()))),
            (Some(s), None) => {
                let ms = |v: Option<Count>, name: &'static str| match v {
                    Some(Count(0)) => Err(ServerError::param(
                        name,
                        format!("'{name}' must be at least 1 (milliseconds)"),
                    )),
                    other => Ok(other.map(|Count(n)| n as u64)),
                };
                let (ttft_ms, tpot_ms) =
                    (ms(s.ttft_ms, "slo.ttft_ms")?, ms(s.tpot_ms, "slo.tpot_ms")?);
                if ttft_ms.is_none() && tpot_ms.is_none() {
                    return Err(ServerError::param(
                        "slo.ttft_ms",
                        "'slo' needs 'ttft_ms' (the time-to-first-token target) or 'tpot_ms' \
                         (the time-per-output-token target), in milliseconds",
                    ));
                }
                Ok(Some(SloAsk::Target {
                    ttft_ms,
                    tpot_ms,
                    best_effort: s.best_effort.is_some_and(|Flag(b)| b),
                }))
            }
        }
    }

    /// `logit_bias` as (token id, bias) pairs, keys in the order the body's object keeps them.
    fn logit_bias(&self) -> Result<Vec<(TokenId, f32)>> {
        let Some(Object(map)) = &self.logit_bias else {
            return Ok(Vec::new());
        };
        if map.len() > MAX_LOGIT_BIAS {
            return Err(ServerError::param(
                "logit_bias",
                format!(
                    "'logit_bias' has {} entries; at most {MAX_LOGIT_BIAS} are allowed",
                    map.len()
                ),
            ));
        }
        map.iter()
            .map(|(k, v)| {
                let id: TokenId = k.trim().parse().map_err(|_| {
                    ServerError::param(
                        "logit_bias",
                        format!("'logit_bias' keys must be token ids, got {k:?}"),
                    )
                })?;
                let b = v.as_f64().ok_or_else(|| {
                    ServerError::param(
                        "logit_bias",
                        format!(
                            "'logit_bias' values must be numbers, got {}",
                            super::wire::kind(v)
                        ),
                    )
                })?;
                Ok((id, b as f32))
            })
            .collect()
    }
}
