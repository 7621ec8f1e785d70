//! Fuzz target: compiling and rendering chat templates, hostile ones included, the way the
//! `ferrum` binary does: in a memory-capped worker process (`ferrum_tokenizer::sandbox`; the
//! worker is this binary, hence `harness = false`). Seeds: real
//! templates (SmolLM2's, the tiny fixture's) and templates built to hang or flood (runaway
//! recursion, nested huge loops, huge repetition, output floods, lazily repeated lists).
//! Every input must end within the time limit, with the server side's memory bounded, in a
//! rendered prompt or a clean error; a worker that runs out of memory is an error, not a crash.

mod common;

use ferrum_fuzz::harness::{run, Limits, Target};
use ferrum_fuzz::mutate::Mutator;
use ferrum_tokenizer::sandbox::{worker_main, RENDER_TIMEOUT, WORKER_ARG};
use ferrum_tokenizer::{ChatMessage, ChatTemplate, SpecialTokens};
use std::time::Duration;

#[global_allocator]
static ALLOC: ferrum_fuzz::alloc::Counting = ferrum_fuzz::alloc::Counting;

const HOSTILE: &[&str] = &[
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{% macro f(n) %}{{ caller() }}{% call f(n) %}x{% endcall %}{% endmacro %}{% call f(0) %}y{% endcall %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}",
    "{{ 'x' * 10000000000 }}",
    "{{ range(10000000000)|length }}",
    "{{ messages * 1000000 }}",
    "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}",
    "{{ messages|tojson(indent=100000000) }}",
    "{{ messages[0].content|indent(100000000) }}",
    "{{ messages[0].content.center(100000000) }}",
    "{{ messages[0].content.ljust(100000000) }}",
    "{{ messages[0].content.zfill(100000000) }}",
    "{{ messages[0].content|wordwrap(1) }}",
    "{{ raise_exception('refused') }}",
    "{% include 'other' %}{% import 'x' as y %}{% extends 'z' %}",
    "{{ ((((((((((((((((((((((((((((((((((((1)))))))))))))))))))))))))))))))))))) }}",
    "{{ [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]] }}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content|length %}{% endfor %}{{ ns.n }}",
    "{{ strftime_now('%Y%Y%Y%Y%Y%Y%Y%Y%Y%Y%Y%Y%Y') }}{{ strftime_now('%') }}",
    "{{ messages[0].content.split('')|list }}{{ messages|map(attribute='x')|join }}",
    "{% for m in messages %}{{ m.content.replace('', 'xxxxxxxx') }}{% endfor %}",
    "{{ messages|batch(0) }}{{ messages|slice(0) }}{{ 1 / 0 }}{{ 1 // 0 }}{{ 1 % 0 }}",
    "{{ 2 ** 100000 }}{{ 9223372036854775807 + 1 }}{{ -9223372036854775808 * -1 }}",
    "{{ (range(100000) * 30000)|list|length }}",
    "{% set s = 'xxxxxxxxxxxxxxxx' %}{% for i in range(40) %}{% set s = s ~ s %}{% endfor %}{{ s|length }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
];

fn main() {
    if std::env::args_os().nth(1).is_some_and(|a| a == WORKER_ARG) {
        std::process::exit(worker_main());
    }
    // `cargo test NAME`: run only when NAME selects this target.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if filters
        .iter()
        .any(|f| !"fuzz_chat_template".contains(f.as_str()))
    {
        return;
    }
    fuzz_chat_template();
    println!("test fuzz_chat_template ... ok");
}

fn fuzz_chat_template() {
    let exe = std::env::current_exe().expect("this test's path");
    let mut seeds: Vec<Vec<u8>> = vec![
        common::read("smollm2-135m/chat_template.jinja"),
        common::read("tiny-smollm/chat_template.jinja"),
    ];
    seeds.extend(HOSTILE.iter().map(|t| t.as_bytes().to_vec()));
    let dictionary = [
        "{{",
        "}}",
        "{%",
        "%}",
        "{#",
        "#}",
        " for x in ",
        "range(",
        "endfor",
        "if ",
        "else",
        "endif",
        "macro m(a)",
        "endmacro",
        "call m(1)",
        "endcall",
        "caller()",
        "set ",
        "~",
        "*",
        "**",
        "+",
        "messages",
        "loop.index",
        " recursive",
        "loop(",
        "|join",
        "|tojson",
        "|list",
        "|string",
        "|length",
        "|reverse",
        "|sort",
        "|unique",
        "|batch(",
        "|indent(",
        "|wordwrap(",
        "|center(",
        "|format(",
        ".split(",
        ".replace(",
        ".strip()",
        "[",
        "]",
        "(",
        ")",
        "'",
        "\"",
        ",",
        "100000",
        "99999999999",
        "-1",
        "0",
        "namespace(",
        "raise_exception(",
        "strftime_now(",
        "bos_token",
        "eos_token",
        "add_generation_prompt",
        "m.content",
        "m.role",
        "messages[0]",
        "messages[-1]",
        "none",
        "true",
        "|safe",
        "|e",
    ];
    let target = Target {
        name: "chat_template",
        seeds,
        mutator: Mutator {
            hot: 4096,
            dictionary: dictionary.iter().map(|w| w.as_bytes().to_vec()).collect(),
            max_len: 16 << 10,
        },
        limits: Limits {
            // The worker's own timeout, its start and a margin.
            time: RENDER_TIMEOUT + Duration::from_secs(10),
            // Compiling and rendering happen in the worker.
            memory_base: 16 << 20,
            memory_per_input_byte: 1024,
        },
    };
    let special = SpecialTokens {
        bos_token: Some("<s>".into()),
        eos_token: Some("</s>".into()),
        ..SpecialTokens::default()
    };
    let messages = [
        ChatMessage::new("system", "You are helpful."),
        ChatMessage::new("user", "Hi! ünïcödé \u{1F600} {{ not a template }}"),
        ChatMessage::new("assistant", ""),
        ChatMessage::new("user", "x".repeat(300)),
    ];
    let report = run(target, |bytes| {
        let Ok(src) = std::str::from_utf8(bytes) else {
            return Ok("not utf-8".into());
        };
        let t = match ChatTemplate::in_worker(src, &special, &exe) {
            Ok(t) => t,
            Err(e) => return Ok(e.to_string()),
        };
        Ok(match t.render(&messages, true) {
            Ok(s) => format!("ok {}", s.len().min(1)),
            Err(e) => e.to_string(),
        })
    });
    assert!(report.execs > 0);
}
