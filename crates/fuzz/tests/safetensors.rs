//! Fuzz target: the safetensors header parser and the tensor views it hands out. Seeds: the
//! tiny Llama's weights and a hand-written two-tensor file.

mod common;

use ferrum_fuzz::harness::{run, Limits, Target};
use ferrum_fuzz::mutate::Mutator;
use ferrum_models::SafetensorsFile;
use std::path::Path;

#[global_allocator]
static ALLOC: ferrum_fuzz::alloc::Counting = ferrum_fuzz::alloc::Counting;

fn small() -> Vec<u8> {
    let header = br#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]}}"#;
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend((0..22u8).map(|i| i.wrapping_mul(37)));
    out
}

#[test]
fn fuzz_safetensors() {
    let dictionary = [
        "\"dtype\"",
        "\"shape\"",
        "\"data_offsets\"",
        "\"F32\"",
        "\"BF16\"",
        "\"F16\"",
        "\"I64\"",
        "\"F8_E4M3\"",
        "\"BOOL\"",
        "\"__metadata__\"",
        "[",
        "]",
        "{",
        "}",
        ",",
        ":",
        "18446744073709551615",
        "9223372036854775808",
        "-1",
        "1e308",
        "null",
        "0",
        "[]",
        "{}",
    ];
    let target = Target {
        name: "safetensors",
        seeds: vec![small(), common::read("tiny-llama/model.safetensors")],
        mutator: Mutator {
            hot: 8192,
            dictionary: dictionary.iter().map(|w| w.as_bytes().to_vec()).collect(),
            ..Mutator::default()
        },
        limits: Limits::default(),
    };
    let report = run(target, |bytes| {
        let f = match SafetensorsFile::from_bytes(Path::new("fuzz.safetensors"), bytes) {
            Ok(f) => f,
            Err(e) => return Ok(e.to_string()),
        };
        let mut outcome = format!("ok {} tensors", f.entries().len());
        for name in f.entries().keys() {
            match f.tensor(name) {
                Some(Ok(t)) => {
                    if t.rows() > 0 && t.cols() <= 1 << 16 {
                        let mut row = vec![0f32; t.cols()];
                        t.dequantize_row(t.rows() - 1, &mut row);
                        std::hint::black_box(&row);
                    }
                }
                Some(Err(e)) => outcome = e.to_string(),
                None => return Err(format!("listed tensor `{name}` is missing")),
            }
        }
        Ok(outcome)
    });
    assert!(report.execs > 0);
}
