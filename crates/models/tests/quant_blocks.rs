//! Every supported storage type decodes to gguf-py's float32 values bit for bit
//! (`tests/fixtures/quant/blocks.safetensors`).
#![allow(clippy::unwrap_used)]

mod common;

use ferrum_models::SafetensorsFile;
use ferrum_runtime::{quant, DType};

#[test]
fn every_type_dequantizes_bit_exactly() {
    let path = common::fixtures().join("quant/blocks.safetensors");
    let st = SafetensorsFile::open(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let types = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::F16,
        DType::BF16,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ];
    for dtype in types {
        let raw = &st.entries()[&format!("{dtype}.raw")];
        let want = st.tensor(&format!("{dtype}.dequant")).unwrap().unwrap();
        let (rows, cols) = (want.shape()[0], want.shape()[1]);
        assert_eq!(raw.shape[0], rows);
        let want = want.to_f32_vec();
        let raw = &bytes[raw.start..raw.end];
        let row_bytes = raw.len() / rows;
        assert_eq!(Some(row_bytes), dtype.row_bytes(cols), "{dtype}: row size");
        let mut got = vec![0f32; cols];
        for r in 0..rows {
            quant::dequantize_row(dtype, &raw[r * row_bytes..(r + 1) * row_bytes], &mut got);
            for (c, (g, w)) in got.iter().zip(&want[r * cols..(r + 1) * cols]).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{dtype} row {r} col {c}: {g} vs {w}"
                );
            }
        }
    }
}
