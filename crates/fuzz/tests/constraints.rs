//! Fuzz target: structured-output constraints and tool-call output, the untrusted text of
//! `grammar`, `guided_grammar`, `json_schema` and `guided_regex` fields and of a model's
//! output. Each input is translated from GBNF (`guide::gbnf::to_lark`) and compiled as a GBNF
//! grammar, a Lark grammar, a JSON schema and a regex against the tiny fixture's tokenizer:
//! each gives a guide with a first mask or a clean error, never a panic and never more than
//! the time limit. The same bytes, as model output, go through the tool-call parser of every
//! format, whole and in pieces: no panic, and the pieces reassemble to the whole.

use ferrum_engine::guide::gbnf;
use ferrum_engine::GuideCompiler;
use ferrum_fuzz::harness::{run, Limits, Target};
use ferrum_fuzz::mutate::Mutator;
use ferrum_server::tools::parser::{parse_in_pieces, parse_whole};
use ferrum_server::tools::{CallSyntax, ToolFormat};
use ferrum_tokenizer::{load_special_tokens, Tokenizer};
use ferrum_types::StructuredOutput;

#[global_allocator]
static ALLOC: ferrum_fuzz::alloc::Counting = ferrum_fuzz::alloc::Counting;

const SEEDS: &[&str] = &[
    "root ::= \"yes\" | \"no\"",
    "root ::= item{2,3}\nitem ::= \"- \" [a-z]+ \"\\n\"",
    "root ::= (\"a\" | [^b-d] .)* rule-x?\nrule-x ::= \"\\x41\\u00e9\\U0001F600\" # comment",
    "start: \"x=\" NUM\nNUM: /[0-9]{1,3}/",
    "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\", \"minimum\": 0}}, \"required\": [\"a\"]}",
    "{\"$defs\": {\"n\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/n\"}}}, \"$ref\": \"#/$defs/n\"}",
    "[0-9]{3}-[a-z]+(x|y)*",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, {\"b\": \"}\"}]}}\n</tool_call>",
    "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}, {\"arguments\": 3, \"name\": \"g\"}]",
    "{\"name\": \"f\", \"parameters\": {\"q\": \"\\\"\"}}; {\"name\": \"g\"}",
    // Found by this target: whitespace after a call split differently, a `;` then no call, a
    // repeated key.
    "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}, {\"arguments\": 3, \"name\": \"g\"}]",
    "{\"name\": \"f\", \"parameters\": {\"q\": \"\\\"\"}}; \"g\"}",
    "[TOOL_CALLS][{\"name\": \"f\", \"aruments\": 3, \"name\": \"g\"}]",
    // Calls without markup: bare, opening the answer; fenced, after prose.
    " {\"name\": \"get_weather\", \"arguments\": {\"city\": \"`\"}}",
    "Sure:\n```json\n{\"name\": \"f\", \"arguments\": {}}\n```\nand ``` more",
];

fn tokenizer() -> Tokenizer {
    let dir = ferrum_testdata::fixture("tiny-smollm");
    let special = load_special_tokens(&dir).expect("the tiny fixture's special tokens");
    Tokenizer::from_json_file(&dir.join("tokenizer.json"), special).expect("its tokenizer")
}

#[test]
fn fuzz_constraints() {
    let tok = tokenizer();
    let eos = tok.special().stop_token_ids.clone();
    let compiler = GuideCompiler::new(&tok, &eos, tok.vocab_size()).expect("the compiler");
    let dictionary = [
        "::=",
        "root",
        "|",
        "(",
        ")",
        "*",
        "+",
        "?",
        "{2,5}",
        "{,3}",
        "[^",
        "]",
        "\\x",
        "\\u",
        "\"",
        "\\",
        "#",
        "\n",
        "start:",
        "%json",
        "/",
        "<[0]>",
        "<tool_call>",
        "</tool_call>",
        "```json\n",
        "```",
        "[TOOL_CALLS]",
        "{\"name\"",
        "\"arguments\"",
        "\"parameters\"",
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        ";",
        "\"type\"",
        "\"$ref\"",
        "\"anyOf\"",
        "\"items\"",
    ];
    let target = Target {
        name: "constraints",
        seeds: SEEDS.iter().map(|s| s.as_bytes().to_vec()).collect(),
        mutator: Mutator {
            hot: 1024,
            dictionary: dictionary.iter().map(|w| w.as_bytes().to_vec()).collect(),
            max_len: 4 << 10,
        },
        limits: Limits {
            memory_base: 256 << 20,
            memory_per_input_byte: 4096,
            ..Limits::default()
        },
    };
    let report = run(target, |bytes| {
        let text = String::from_utf8_lossy(bytes).into_owned();
        let mut outcome = match gbnf::to_lark(&text) {
            Ok(_) => "gbnf ok".to_string(),
            Err(e) => {
                if e.line == 0 || e.msg.is_empty() {
                    return Err(format!("a GBNF error without its line or message: {e:?}"));
                }
                format!("gbnf: {e}")
            }
        };
        for spec in [
            StructuredOutput::Gbnf(text.clone()),
            StructuredOutput::Lark(text.clone()),
            StructuredOutput::JsonSchema {
                schema: text.clone(),
                strict: false,
            },
            StructuredOutput::Regex(text.clone()),
        ] {
            let r = compiler.compile(&spec);
            outcome.push_str(if r.is_ok() { " ok" } else { " err" });
        }
        for format in ToolFormat::ALL {
            // Loose calls of two declared functions are read too.
            let syntax = CallSyntax::new(format, ["f".to_string(), "get_weather".to_string()]);
            let whole = parse_whole(&syntax, &text);
            for step in [1, 3, 17] {
                if parse_in_pieces(&syntax, &text, step)? != whole {
                    return Err(format!(
                        "{format:?}: pieces of {step} differ from the whole"
                    ));
                }
            }
        }
        Ok(outcome)
    });
    assert!(report.execs > 0);
}
