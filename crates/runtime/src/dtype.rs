//! Element types: plain floats and GGUF (ggml) block-quantized formats.
//!
//! A block-quantized row of `cols` elements is stored as `cols / block_size` blocks of
//! `block_bytes` bytes each; a row is never split across blocks. Float types are blocks of one.

use std::fmt;

/// Data type of a tensor's elements as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

/// Elements in one K-quant super-block.
pub const QK_K: usize = 256;

impl DType {
    /// Every supported type, in ggml id order.
    pub const ALL: [DType; 11] = [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::BF16,
    ];

    /// Elements per block.
    pub const fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => 32,
            DType::Q4_K | DType::Q5_K | DType::Q6_K => QK_K,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q8_0 => 34,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
        }
    }

    /// Whether the type is block-quantized (as opposed to a plain float).
    pub const fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes of a row of `cols` elements, or `None` when `cols` is not a whole number of blocks
    /// or the size overflows.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        if !cols.is_multiple_of(self.block_size()) {
            return None;
        }
        (cols / self.block_size()).checked_mul(self.block_bytes())
    }

    /// The ggml type id used in GGUF files.
    pub const fn ggml_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::BF16 => 30,
        }
    }

    /// The type for a ggml type id, if Ferrum supports it.
    pub fn from_ggml_id(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|t| t.ggml_id() == id)
    }

    /// The ggml name of a type id, for error messages about types Ferrum does not support.
    pub fn ggml_name(id: u32) -> &'static str {
        match id {
            0 => "F32",
            1 => "F16",
            2 => "Q4_0",
            3 => "Q4_1",
            4 => "Q4_2 (removed)",
            5 => "Q4_3 (removed)",
            6 => "Q5_0",
            7 => "Q5_1",
            8 => "Q8_0",
            9 => "Q8_1",
            10 => "Q2_K",
            11 => "Q3_K",
            12 => "Q4_K",
            13 => "Q5_K",
            14 => "Q6_K",
            15 => "Q8_K",
            16 => "IQ2_XXS",
            17 => "IQ2_XS",
            18 => "IQ3_XXS",
            19 => "IQ1_S",
            20 => "IQ4_NL",
            21 => "IQ3_S",
            22 => "IQ2_S",
            23 => "IQ4_XS",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            29 => "IQ1_M",
            30 => "BF16",
            34 => "TQ1_0",
            35 => "TQ2_0",
            39 => "MXFP4",
            _ => "unknown",
        }
    }

    /// The safetensors dtype string for float types.
    pub fn from_safetensors(name: &str) -> Option<DType> {
        match name {
            "F32" => Some(DType::F32),
            "F16" => Some(DType::F16),
            "BF16" => Some(DType::BF16),
            _ => None,
        }
    }

    /// Short display name (ggml spelling).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
            DType::Q5_0 => "Q5_0",
            DType::Q5_1 => "Q5_1",
            DType::Q8_0 => "Q8_0",
            DType::Q4_K => "Q4_K",
            DType::Q5_K => "Q5_K",
            DType::Q6_K => "Q6_K",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_ids_round_trip() {
        for t in DType::ALL {
            assert_eq!(DType::from_ggml_id(t.ggml_id()), Some(t));
            assert_eq!(DType::ggml_name(t.ggml_id()), t.name());
        }
        assert_eq!(DType::from_ggml_id(10), None);
    }

    #[test]
    fn row_bytes_requires_whole_blocks() {
        assert_eq!(DType::Q4_0.row_bytes(64), Some(36));
        assert_eq!(DType::Q4_0.row_bytes(65), None);
        assert_eq!(DType::Q6_K.row_bytes(512), Some(420));
        assert_eq!(DType::F32.row_bytes(3), Some(12));
    }
}
