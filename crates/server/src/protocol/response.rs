//! Response bodies as serde types: completions and their stream chunks, usage, logprobs,
//! errors, the models list and the tokenizer routes' answers.
//!
//! Invariant: every struct declares its fields in alphabetical order. The server wrote these
//! bodies through `serde_json::Value` before they were types, whose maps sort their keys, and
//! the bytes on the wire stay what they were (tests compare each type's output with its sorted
//! form). Which fields are omitted and which are `null` is stated per field.

use serde::Serialize;
use std::collections::BTreeMap;

/// A completion object or stream chunk: `chat.completion`, `chat.completion.chunk` or
/// `text_completion`, around choices of type `C`.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionObject<C> {
    pub choices: Vec<C>,
    pub created: u64,
    pub id: String,
    pub model: String,
    pub object: &'static str,
    /// Omitted when `None`; `Some(None)` is `"usage": null` (stream chunks of a request that
    /// asked for a final usage chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// OpenAI's usage object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub completion_tokens: usize,
    pub prompt_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
    pub total_tokens: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: usize,
}

impl From<&ferrum_engine::Usage> for Usage {
    fn from(u: &ferrum_engine::Usage) -> Self {
        Usage {
            completion_tokens: u.completion_tokens,
            prompt_tokens: u.prompt_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: u.cached_tokens,
            },
            total_tokens: u.prompt_tokens + u.completion_tokens,
        }
    }
}

/// A choice of a `chat.completion`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    /// `null` while unfinished (never, in a whole response).
    pub finish_reason: Option<&'static str>,
    pub index: usize,
    /// `null` unless the request asked for logprobs.
    pub logprobs: Option<ChatLogprobs>,
    pub message: AssistantMessage,
}

/// The assistant's answer in a `chat.completion`.
#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    /// `null` when the answer is only tool calls.
    pub content: Option<String>,
    pub role: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

/// A tool call of an answer.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallOut {
    pub function: FunctionOut,
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// A called function: its name and its arguments as JSON text.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionOut {
    pub arguments: String,
    pub name: String,
}

/// A piece of a streamed tool call: index, id, type and name first, then arguments.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallDelta {
    pub function: FunctionDelta,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub index: usize,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
}

/// A piece of a streamed call's function.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionDelta {
    pub arguments: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A choice of a `chat.completion.chunk`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChunkChoice {
    pub delta: Delta,
    /// `null` except in the choice's last chunk.
    pub finish_reason: Option<&'static str>,
    pub index: usize,
    pub logprobs: Option<ChatLogprobs>,
}

/// New text of a stream chunk: `{"content", "role"}` first, `{"content"}` after, `{}` at the
/// end.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// A chat choice's logprobs: one entry per token.
#[derive(Debug, Clone, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<TokenLogprobEntry>,
}

/// One generated token with the most likely alternatives.
#[derive(Debug, Clone, Serialize)]
pub struct TokenLogprobEntry {
    pub bytes: Vec<u8>,
    pub logprob: f64,
    pub token: String,
    pub top_logprobs: Vec<TopLogprob>,
}

/// A token as OpenAI's logprob objects show it: text, logprob and UTF-8 bytes.
#[derive(Debug, Clone, Serialize)]
pub struct TopLogprob {
    pub bytes: Vec<u8>,
    pub logprob: f64,
    pub token: String,
}

/// A choice of a `text_completion` (whole or streamed).
#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    pub finish_reason: Option<&'static str>,
    pub index: usize,
    pub logprobs: Option<CompletionLogprobs>,
    pub text: String,
}

/// The legacy completions logprobs object, column by column.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompletionLogprobs {
    /// Characters of text before each token.
    pub text_offset: Vec<usize>,
    pub token_logprobs: Vec<f64>,
    pub tokens: Vec<String>,
    /// Per token: token text -> logprob (one entry per distinct text).
    pub top_logprobs: Vec<BTreeMap<String, f64>>,
}

/// `{"error": {...}}`, the body of every error response and of a stream's error frame.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorResponse {
    pub error: ErrorBody,
}

/// OpenAI's error object; `code` and `param` are `null` when they do not apply.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorBody {
    pub code: Option<&'static str>,
    pub message: String,
    pub param: Option<String>,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    pub data: Vec<ModelCard>,
    pub object: &'static str,
}

/// One served model.
#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    pub created: u64,
    pub id: String,
    pub max_model_len: usize,
    pub object: &'static str,
    pub owned_by: &'static str,
}

/// `POST /tokenize`'s answer.
#[derive(Debug, Clone, Serialize)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<ferrum_types::TokenId>,
}

/// `POST /tokenize`'s answer to llama-server's body (`content`): the ids, or with
/// `with_pieces` each id with its text.
#[derive(Debug, Clone, Serialize)]
pub struct LlamaTokenizeResponse {
    pub tokens: LlamaTokens,
}

/// The ids of a llama-server `/tokenize` answer, plain or with their pieces.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum LlamaTokens {
    Ids(Vec<ferrum_types::TokenId>),
    Pieces(Vec<TokenPiece>),
}

/// One token and its text.
#[derive(Debug, Clone, Serialize)]
pub struct TokenPiece {
    pub id: ferrum_types::TokenId,
    pub piece: String,
}

/// `POST /detokenize`'s answer.
#[derive(Debug, Clone, Serialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

/// A body as JSON text. Serializing these types cannot fail (string keys, finite numbers);
/// should it ever, the client gets an error object rather than a broken body.
pub fn to_json_string<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| {
        let err = ErrorResponse {
            error: ErrorBody {
                code: None,
                message: format!("writing the response failed: {e}"),
                param: None,
                kind: "server_error",
            },
        };
        serde_json::to_string(&err).unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes as written, and as `serde_json::Value` (sorted keys) writes the same body.
    fn same_as_sorted<T: Serialize>(v: &T) {
        let direct = to_json_string(v);
        let sorted = serde_json::to_value(v).unwrap().to_string();
        assert_eq!(direct, sorted);
    }

    #[test]
    fn fields_are_in_the_order_the_server_always_wrote() {
        let usage = Usage::from(&ferrum_engine::Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            cached_tokens: 1,
            ..ferrum_engine::Usage::default()
        });
        let top = TopLogprob {
            bytes: b"a".to_vec(),
            logprob: -0.5,
            token: "a".into(),
        };
        let entry = TokenLogprobEntry {
            bytes: b"a".to_vec(),
            logprob: -0.5,
            token: "a".into(),
            top_logprobs: vec![top],
        };
        let chat = CompletionObject {
            choices: vec![ChatChoice {
                finish_reason: Some("stop"),
                index: 0,
                logprobs: Some(ChatLogprobs {
                    content: vec![entry.clone()],
                }),
                message: AssistantMessage {
                    content: Some("hi".into()),
                    role: "assistant",
                    tool_calls: vec![ToolCallOut {
                        function: FunctionOut {
                            arguments: "{}".into(),
                            name: "f".into(),
                        },
                        id: "call_1".into(),
                        kind: "function",
                    }],
                },
            }],
            created: 1,
            id: "chatcmpl-1".into(),
            model: "m".into(),
            object: "chat.completion",
            usage: Some(Some(usage)),
        };
        same_as_sorted(&chat);
        let chunk = CompletionObject {
            choices: vec![ChatChunkChoice {
                delta: Delta {
                    content: Some(String::new()),
                    role: Some("assistant"),
                    tool_calls: Some(vec![ToolCallDelta {
                        function: FunctionDelta {
                            arguments: String::new(),
                            name: Some("f".into()),
                        },
                        id: Some("call_1".into()),
                        index: 0,
                        kind: Some("function"),
                    }]),
                },
                finish_reason: None,
                index: 0,
                logprobs: None,
            }],
            created: 1,
            id: "chatcmpl-1".into(),
            model: "m".into(),
            object: "chat.completion.chunk",
            usage: Some(None),
        };
        same_as_sorted(&chunk);
        assert!(to_json_string(&chunk).ends_with(r#""usage":null}"#));
        let mut lp = CompletionLogprobs::default();
        lp.text_offset.push(0);
        lp.token_logprobs.push(-1.0);
        lp.tokens.push("a".into());
        lp.top_logprobs.push(BTreeMap::from([("a".into(), -1.0)]));
        let completion = CompletionObject {
            choices: vec![CompletionChoice {
                finish_reason: Some("length"),
                index: 0,
                logprobs: Some(lp),
                text: "a".into(),
            }],
            created: 1,
            id: "cmpl-1".into(),
            model: "m".into(),
            object: "text_completion",
            usage: None,
        };
        same_as_sorted(&completion);
        assert!(!to_json_string(&completion).contains("usage"));
        same_as_sorted(&ErrorResponse {
            error: ErrorBody {
                code: None,
                message: "m".into(),
                param: Some("p".into()),
                kind: "invalid_request_error",
            },
        });
        same_as_sorted(&ModelList {
            data: vec![ModelCard {
                created: 1,
                id: "m".into(),
                max_model_len: 8,
                object: "model",
                owned_by: "ferrum",
            }],
            object: "list",
        });
        same_as_sorted(&TokenizeResponse {
            count: 1,
            max_model_len: 8,
            tokens: vec![1],
        });
        same_as_sorted(&Delta::default());
    }
}
