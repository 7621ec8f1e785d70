//! safetensors files: an 8-byte little-endian header length, a JSON header mapping tensor names
//! to dtype, shape and data offsets, then the data. The file is memory-mapped; tensors are
//! handed out as views of the map. Offsets, sizes and the header length are all checked against
//! the file before use.

use crate::file_map::FileMap;
use crate::{ModelError, Result};
use ferrum_runtime::{DType, Tensor};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One tensor's header entry.
#[derive(Debug, Clone)]
pub struct SafetensorsEntry {
    /// dtype as written in the file (`F32`, `BF16`, `I64`, ...).
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub start: usize,
    pub end: usize,
}

/// A parsed, memory-mapped safetensors file.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    map: FileMap,
    entries: BTreeMap<String, SafetensorsEntry>,
}

fn element_size(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "F32" | "I32" | "U32" => 4,
        "F64" | "I64" | "U64" => 8,
        _ => return None,
    })
}

impl SafetensorsFile {
    /// Maps and parses `path`.
    pub fn open(path: &Path) -> Result<SafetensorsFile> {
        SafetensorsFile::parse(path, FileMap::open(path)?)
    }

    /// Parses a file's contents held in memory (copied into an anonymous map); `name` stands
    /// for the file in errors. For tests and fuzzing.
    pub fn from_bytes(name: &Path, bytes: &[u8]) -> Result<SafetensorsFile> {
        SafetensorsFile::parse(name, FileMap::copy(name, bytes)?)
    }

    fn parse(path: &Path, map: FileMap) -> Result<SafetensorsFile> {
        let fmt = |m: String| ModelError::format(path, m);
        if map.len() < 8 {
            return Err(fmt(format!(
                "file is truncated: {} bytes, too short for a safetensors header",
                map.len()
            )));
        }
        let mut len_bytes = [0u8; 8];
        len_bytes.copy_from_slice(&map[..8]);
        let header_len = u64::from_le_bytes(len_bytes);
        if header_len > (map.len() - 8) as u64 {
            return Err(fmt(format!(
                "file is truncated: header of {header_len} bytes but only {} follow",
                map.len() - 8
            )));
        }
        let data_start = 8 + header_len as usize;
        let header: Value = serde_json::from_slice(&map[8..data_start])
            .map_err(|e| fmt(format!("header is not valid JSON: {e}")))?;
        let Value::Object(obj) = header else {
            return Err(fmt("header is not a JSON object".into()));
        };
        let mut entries = BTreeMap::new();
        for (name, v) in obj {
            if name == "__metadata__" {
                continue;
            }
            let bad = |what: &str| fmt(format!("tensor `{name}`: {what}"));
            let dtype = v
                .get("dtype")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("`dtype` is missing or not a string"))?
                .to_string();
            let shape: Vec<usize> = v
                .get("shape")
                .and_then(Value::as_array)
                .ok_or_else(|| bad("`shape` is missing or not an array"))?
                .iter()
                .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("`shape` holds a value that is not a non-negative integer"))?;
            let offsets: Vec<u64> = v
                .get("data_offsets")
                .and_then(Value::as_array)
                .filter(|a| a.len() == 2)
                .and_then(|a| a.iter().map(Value::as_u64).collect())
                .ok_or_else(|| bad("`data_offsets` must be two non-negative integers"))?;
            let (begin, end) = (offsets[0], offsets[1]);
            let data_len = (map.len() - data_start) as u64;
            if begin > end {
                return Err(bad("`data_offsets` are reversed"));
            }
            if end > data_len {
                return Err(fmt(format!(
                    "file is truncated: tensor `{name}` needs data bytes {begin}..{end}, \
                     the file holds {data_len}"
                )));
            }
            if let Some(es) = element_size(&dtype) {
                let numel = shape
                    .iter()
                    .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
                    .and_then(|n| n.checked_mul(es as u64));
                if numel != Some(end - begin) {
                    return Err(bad(&format!(
                        "shape {shape:?} of {dtype} does not match its {} data bytes",
                        end - begin
                    )));
                }
            }
            entries.insert(
                name.clone(),
                SafetensorsEntry {
                    dtype,
                    shape,
                    start: data_start + begin as usize,
                    end: data_start + end as usize,
                },
            );
        }
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            map,
            entries,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Header entries by name.
    pub fn entries(&self) -> &BTreeMap<String, SafetensorsEntry> {
        &self.entries
    }

    /// A tensor as a view of the map; `None` if absent.
    pub fn tensor(&self, name: &str) -> Option<Result<Tensor>> {
        let e = self.entries.get(name)?;
        let Some(dtype) = DType::from_safetensors(&e.dtype) else {
            return Some(Err(ModelError::UnsupportedDType {
                path: self.path.clone(),
                name: name.to_string(),
                dtype: e.dtype.clone(),
            }));
        };
        Some(
            self.map
                .storage(e.start, e.end - e.start)
                .ok_or_else(|| {
                    ModelError::format(&self.path, format!("tensor `{name}` lies outside the file"))
                })
                .and_then(|s| Ok(Tensor::new(dtype, e.shape.clone(), s)?)),
        )
    }
}
