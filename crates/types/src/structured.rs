//! What a constrained request asks its output to be: [`StructuredOutput`], carried in
//! [`crate::SamplingParams`]. The forms are kept as the client wrote them (a schema's JSON
//! text, a regex, a grammar's source); the engine compiles them against the tokenizer, and
//! a form that does not compile is refused before the request is scheduled.

/// A constraint on a request's output. The output is a complete match of the constraint, or
/// stops short of one only when a length limit ends it first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StructuredOutput {
    /// A JSON value valid under this JSON Schema (its JSON text). `strict`: a keyword the
    /// engine cannot enforce (`uniqueItems`, say) refuses the schema, naming the keyword, as
    /// OpenAI's strict mode does; not strict, such keywords are left out and the rest of the
    /// schema enforced, as vLLM does.
    JsonSchema { schema: String, strict: bool },
    /// Any JSON object (OpenAI's `{"type": "json_object"}`).
    JsonObject,
    /// A text matching this regular expression as a whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
    /// A grammar in llama.cpp's GBNF.
    Gbnf(String),
    /// Free text until the output produces one of `triggers` (a tool call opening, say), then
    /// a Lark grammar whose output starts with that trigger itself (the grammar starts with
    /// any of them). A trigger that is one token of the vocabulary starts the grammar only as
    /// that token (its text spelled out in pieces is free text).
    Triggered {
        triggers: Vec<Trigger>,
        grammar: String,
    },
}

/// One opening of a [`StructuredOutput::Triggered`] grammar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trigger {
    pub text: String,
    /// Counts only where the output opens with it (after whitespace, if any): a bare call
    /// object starting the answer is a call, the same object later in prose is not.
    pub at_start: bool,
}

impl Trigger {
    /// A trigger that counts anywhere in the output.
    pub fn anywhere(text: impl Into<String>) -> Trigger {
        Trigger {
            text: text.into(),
            at_start: false,
        }
    }

    /// A trigger that counts only where the output opens with it.
    pub fn at_start(text: impl Into<String>) -> Trigger {
        Trigger {
            text: text.into(),
            at_start: true,
        }
    }
}

impl StructuredOutput {
    /// A JSON schema constraint made strict or not; any other constraint as it is.
    pub fn with_strict(self, strict: bool) -> Self {
        match self {
            StructuredOutput::JsonSchema { schema, .. } => {
                StructuredOutput::JsonSchema { schema, strict }
            }
            other => other,
        }
    }

    /// The constraint's kind, as errors and logs name it.
    pub fn kind(&self) -> &'static str {
        match self {
            StructuredOutput::JsonSchema { .. } => "JSON schema",
            StructuredOutput::JsonObject => "JSON object",
            StructuredOutput::Regex(_) => "regex",
            StructuredOutput::Choice(_) => "choice",
            StructuredOutput::Lark(_) => "Lark grammar",
            StructuredOutput::Gbnf(_) => "GBNF grammar",
            StructuredOutput::Triggered { .. } => "triggered grammar",
        }
    }
}
