//! GGUF (versions 2 and 3, little-endian) parsing.
//!
//! The file is memory-mapped; metadata is decoded into [`GgufValue`]s (arrays by element
//! type, [`GgufArray`]: a vocabulary is a few buffers, not an allocation per token) and tensor
//! data stays in the map (tensors are handed out as mapped [`Tensor`]s in their block format). Every count and
//! length read from the file is checked against the bytes that remain before anything is
//! allocated, so a corrupt header cannot make the parser allocate more than the file justifies.
//! Shapes are returned row-major: GGUF's `ne[0]` (the contiguous dimension) comes last.

use crate::file_map::FileMap;
use crate::{ModelError, Result};
use ferrum_runtime::{DType, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
const MAX_DIMS: u32 = 4;
const MAX_ARRAY_NESTING: usize = 2;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    /// The value as a non-negative integer, if it is an integer type.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is numeric.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The GGUF type name, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "uint8",
            GgufValue::I8(_) => "int8",
            GgufValue::U16(_) => "uint16",
            GgufValue::I16(_) => "int16",
            GgufValue::U32(_) => "uint32",
            GgufValue::I32(_) => "int32",
            GgufValue::F32(_) => "float32",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(_) => "array",
            GgufValue::U64(_) => "uint64",
            GgufValue::I64(_) => "int64",
            GgufValue::F64(_) => "float64",
        }
    }
}

/// A metadata array, its elements stored by type: a vocabulary's 262k token strings are one
/// buffer and its scores one `Vec<f32>`, not 262k values and allocations each.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(GgufStrings),
    Array(Vec<GgufArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl GgufArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a value (a string or array element copied).
    pub fn get(&self, i: usize) -> Option<GgufValue> {
        Some(match self {
            GgufArray::U8(v) => GgufValue::U8(*v.get(i)?),
            GgufArray::I8(v) => GgufValue::I8(*v.get(i)?),
            GgufArray::U16(v) => GgufValue::U16(*v.get(i)?),
            GgufArray::I16(v) => GgufValue::I16(*v.get(i)?),
            GgufArray::U32(v) => GgufValue::U32(*v.get(i)?),
            GgufArray::I32(v) => GgufValue::I32(*v.get(i)?),
            GgufArray::F32(v) => GgufValue::F32(*v.get(i)?),
            GgufArray::Bool(v) => GgufValue::Bool(*v.get(i)?),
            GgufArray::String(v) => GgufValue::String(v.get(i)?.to_owned()),
            GgufArray::Array(v) => GgufValue::Array(v.get(i)?.clone()),
            GgufArray::U64(v) => GgufValue::U64(*v.get(i)?),
            GgufArray::I64(v) => GgufValue::I64(*v.get(i)?),
            GgufArray::F64(v) => GgufValue::F64(*v.get(i)?),
        })
    }

    /// The elements as values, in order (see [`GgufArray::get`]).
    pub fn iter(&self) -> impl Iterator<Item = GgufValue> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// The strings, when the elements are strings.
    pub fn as_strings(&self) -> Option<&GgufStrings> {
        match self {
            GgufArray::String(s) => Some(s),
            _ => None,
        }
    }

    /// The GGUF type name of the elements, for error messages.
    pub fn element_type_name(&self) -> &'static str {
        match self {
            GgufArray::U8(_) => "uint8",
            GgufArray::I8(_) => "int8",
            GgufArray::U16(_) => "uint16",
            GgufArray::I16(_) => "int16",
            GgufArray::U32(_) => "uint32",
            GgufArray::I32(_) => "int32",
            GgufArray::F32(_) => "float32",
            GgufArray::Bool(_) => "bool",
            GgufArray::String(_) => "string",
            GgufArray::Array(_) => "array",
            GgufArray::U64(_) => "uint64",
            GgufArray::I64(_) => "int64",
            GgufArray::F64(_) => "float64",
        }
    }
}

/// Strings in one buffer. Invariant: `ends` is non-decreasing, each on a character boundary of
/// `text`, the last at its end.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufStrings {
    text: String,
    ends: Vec<usize>,
}

impl GgufStrings {
    /// Number of strings.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// String `i`.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.text.get(start..end)
    }

    /// The strings in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    fn push(&mut self, s: &str) {
        self.text.push_str(s);
        self.ends.push(self.text.len());
    }
}

/// One tensor's header entry.
#[derive(Debug, Clone)]
pub struct GgufTensorInfo {
    pub name: String,
    /// Row-major shape (GGUF dims reversed).
    pub shape: Vec<usize>,
    /// The ggml type id as stored.
    pub ggml_type: u32,
    /// Byte offset of the data in the file.
    pub offset: usize,
    /// Byte size, when the type is known.
    pub num_bytes: Option<usize>,
}

impl GgufTensorInfo {
    /// The type, if Ferrum supports it.
    pub fn dtype(&self) -> Option<DType> {
        DType::from_ggml_id(self.ggml_type)
    }

    /// Elements in the tensor.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A parsed, memory-mapped GGUF file.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: FileMap,
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl GgufFile {
    /// Maps and parses `path`.
    pub fn open(path: &Path) -> Result<GgufFile> {
        GgufFile::parse(path, FileMap::open(path)?)
    }

    /// Parses a file's contents held in memory (copied into an anonymous map); `name` stands
    /// for the file in errors. For tests and fuzzing.
    pub fn from_bytes(name: &Path, bytes: &[u8]) -> Result<GgufFile> {
        GgufFile::parse(name, FileMap::copy(name, bytes)?)
    }

    fn parse(path: &Path, map: FileMap) -> Result<GgufFile> {
        let mut r = Reader {
            buf: &map,
            pos: 0,
            path,
        };
        let magic = r.take(4, "magic")?;
        if magic != MAGIC {
            return Err(ModelError::format(path, "not a GGUF file (bad magic)"));
        }
        let version = r.u32("version")?;
        match version {
            2 | 3 => {}
            1 => {
                return Err(ModelError::format(
                    path,
                    "GGUF version 1 is not supported (versions 2 and 3 are)",
                ))
            }
            v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
                return Err(ModelError::format(
                    path,
                    "big-endian GGUF files are not supported",
                ))
            }
            v => {
                return Err(ModelError::format(
                    path,
                    format!("unknown GGUF version {v}"),
                ))
            }
        }
        let num_tensors = r.u64("tensor count")?;
        let num_kv = r.u64("metadata count")?;
        // A key-value pair takes at least 12 bytes (key length + type), a tensor info 24.
        r.check_count(num_kv, 12, "metadata count")?;
        r.check_count(num_tensors, 24, "tensor count")?;
        let mut metadata = Vec::with_capacity(num_kv as usize);
        let mut meta_index = HashMap::with_capacity(num_kv as usize);
        for _ in 0..num_kv {
            let key = r.string("metadata key")?;
            let ty = r.u32("metadata value type")?;
            let value = r.value(ty, &key, 0)?;
            if meta_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(ModelError::format(
                    path,
                    format!("duplicate metadata key `{key}`"),
                ));
            }
            metadata.push((key, value));
        }
        let alignment = match meta_index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => match metadata[i].1.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => {
                    return Err(ModelError::format(
                        path,
                        "`general.alignment` must be a power of two",
                    ))
                }
            },
        };
        let mut infos = Vec::with_capacity(num_tensors as usize);
        for _ in 0..num_tensors {
            let name = r.string("tensor name")?;
            let n_dims = r.u32("tensor dimension count")?;
            if n_dims > MAX_DIMS {
                return Err(ModelError::format(
                    path,
                    format!("tensor `{name}` has {n_dims} dimensions (at most {MAX_DIMS})"),
                ));
            }
            let mut shape = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                let d = r.u64("tensor dimension")?;
                shape.push(usize::try_from(d).map_err(|_| too_large(path, &name))?);
            }
            shape.reverse();
            let ggml_type = r.u32("tensor type")?;
            let offset = r.u64("tensor offset")?;
            infos.push((name, shape, ggml_type, offset));
        }
        let data_start = align_up(r.pos as u64, alignment);
        let file_len = map.len() as u64;
        let mut tensors = Vec::with_capacity(infos.len());
        let mut tensor_index = HashMap::with_capacity(infos.len());
        for (name, shape, ggml_type, offset) in infos {
            let start = data_start
                .checked_add(offset)
                .ok_or_else(|| too_large(path, &name))?;
            let num_bytes = match DType::from_ggml_id(ggml_type) {
                Some(dt) => {
                    let n = Tensor::bytes_for(dt, &shape)
                        .map_err(|e| ModelError::format(path, format!("tensor `{name}`: {e}")))?;
                    let end = start
                        .checked_add(n as u64)
                        .ok_or_else(|| too_large(path, &name))?;
                    if end > file_len {
                        return Err(ModelError::format(
                            path,
                            format!(
                                "file is truncated: tensor `{name}` needs bytes {start}..{end}, \
                                 the file has {file_len}"
                            ),
                        ));
                    }
                    Some(n)
                }
                None => None,
            };
            if start > file_len {
                return Err(ModelError::format(
                    path,
                    format!("file is truncated: tensor `{name}` starts at {start}, past the end"),
                ));
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(ModelError::format(
                    path,
                    format!("duplicate tensor `{name}`"),
                ));
            }
            tensors.push(GgufTensorInfo {
                name,
                shape,
                ggml_type,
                offset: start as usize,
                num_bytes,
            });
        }
        Ok(GgufFile {
            path: path.to_path_buf(),
            map,
            version,
            metadata,
            meta_index,
            tensors,
            tensor_index,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// A metadata value converted by `f`; `None` when absent, a config error naming the key
    /// when present with the wrong type (`want` reads "must be {want}").
    pub fn get_as<'a, T>(
        &'a self,
        key: &str,
        want: &str,
        f: impl FnOnce(&'a GgufValue) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| ModelError::Config {
                path: self.path.clone(),
                key: key.to_string(),
                msg: format!("must be {want}, found {}", v.type_name()),
            }),
        }
    }

    /// All tensor headers in file order.
    pub fn tensor_infos(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// A tensor's header.
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// A tensor, mapped in its stored format.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
            })?;
        let (Some(dtype), Some(len)) = (info.dtype(), info.num_bytes) else {
            return Err(ModelError::UnsupportedDType {
                path: self.path.clone(),
                name: name.to_string(),
                dtype: format!(
                    "{} (ggml type {})",
                    DType::ggml_name(info.ggml_type),
                    info.ggml_type
                ),
            });
        };
        let storage = self
            .map
            .storage(info.offset, len)
            .ok_or_else(|| too_large(&self.path, name))?;
        Ok(Tensor::new(dtype, info.shape.clone(), storage)?)
    }
}

fn too_large(path: &Path, name: &str) -> ModelError {
    ModelError::format(path, format!("tensor `{name}` lies outside the file"))
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a).saturating_mul(a)
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn truncated(&self, what: &str) -> ModelError {
        ModelError::format(
            self.path,
            format!(
                "file is truncated: {what} at byte {} runs past the end",
                self.pos
            ),
        )
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.truncated(what));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Refuses a count whose elements, at `min_size` bytes each, cannot fit in what remains.
    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<()> {
        if count.saturating_mul(min_size) > self.remaining() as u64 {
            return Err(ModelError::format(
                self.path,
                format!(
                    "{what} {count} at byte {} cannot fit in the {} bytes left (corrupt or truncated file)",
                    self.pos,
                    self.remaining()
                ),
            ));
        }
        Ok(())
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        self.check_count(len, 1, &format!("{what} length"))?;
        let bytes = self.take(len as usize, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| ModelError::format(self.path, format!("{what} is not valid UTF-8")))
    }

    fn bool(&mut self, key: &str) -> Result<bool> {
        match self.array::<1>(key)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(ModelError::format(
                self.path,
                format!("metadata `{key}`: bool byte {b} is neither 0 nor 1"),
            )),
        }
    }

    /// An array's element type, count and elements (after the array's type tag).
    fn array_value(&mut self, key: &str, depth: usize) -> Result<GgufArray> {
        let elem_ty = self.u32(key)?;
        let len = self.u64(key)?;
        let min_size = match elem_ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => 12,
            t => {
                return Err(ModelError::format(
                    self.path,
                    format!("metadata `{key}`: unknown array element type {t}"),
                ))
            }
        };
        self.check_count(len, min_size, &format!("array `{key}` length"))?;
        let len = len as usize;
        /// `len` fixed-size little-endian numbers of type `$t`.
        macro_rules! numbers {
            ($variant:ident, $t:ty) => {{
                let mut v = Vec::with_capacity(len);
                for _ in 0..len {
                    v.push(<$t>::from_le_bytes(self.array(key)?));
                }
                GgufArray::$variant(v)
            }};
        }
        Ok(match elem_ty {
            0 => numbers!(U8, u8),
            1 => numbers!(I8, i8),
            2 => numbers!(U16, u16),
            3 => numbers!(I16, i16),
            4 => numbers!(U32, u32),
            5 => numbers!(I32, i32),
            6 => numbers!(F32, f32),
            7 => {
                let mut v = Vec::with_capacity(len);
                for _ in 0..len {
                    v.push(self.bool(key)?);
                }
                GgufArray::Bool(v)
            }
            8 => {
                let mut v = GgufStrings {
                    text: String::new(),
                    ends: Vec::with_capacity(len),
                };
                for _ in 0..len {
                    let n = self.u64(key)?;
                    self.check_count(n, 1, &format!("{key} length"))?;
                    let bytes = self.take(n as usize, key)?;
                    let s = std::str::from_utf8(bytes).map_err(|_| {
                        ModelError::format(self.path, format!("{key} is not valid UTF-8"))
                    })?;
                    v.push(s);
                }
                v.text.shrink_to_fit();
                GgufArray::String(v)
            }
            9 => {
                // (Checked per element: an empty array of arrays nests nothing.)
                if len > 0 && depth + 1 >= MAX_ARRAY_NESTING {
                    return Err(ModelError::format(
                        self.path,
                        format!("metadata `{key}`: arrays nested too deeply"),
                    ));
                }
                let mut v = Vec::with_capacity(len);
                for _ in 0..len {
                    v.push(self.array_value(key, depth + 1)?);
                }
                GgufArray::Array(v)
            }
            10 => numbers!(U64, u64),
            11 => numbers!(I64, i64),
            _ => numbers!(F64, f64),
        })
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<GgufValue> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>(key)?[0]),
            1 => GgufValue::I8(self.array::<1>(key)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(key)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(key)?)),
            4 => GgufValue::U32(self.u32(key)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(key)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(key)?)),
            7 => GgufValue::Bool(self.bool(key)?),
            8 => GgufValue::String(self.string(key)?),
            9 => {
                if depth >= MAX_ARRAY_NESTING {
                    return Err(ModelError::format(
                        self.path,
                        format!("metadata `{key}`: arrays nested too deeply"),
                    ));
                }
                GgufValue::Array(self.array_value(key, depth)?)
            }
            10 => GgufValue::U64(self.u64(key)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(key)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(key)?)),
            t => {
                return Err(ModelError::format(
                    self.path,
                    format!("metadata `{key}`: unknown value type {t}"),
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests;
