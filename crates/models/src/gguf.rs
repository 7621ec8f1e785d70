//! GGUF (versions 2 and 3, little-endian) parsing.
//!
//! The file is memory-mapped; metadata is decoded into [`GgufValue`]s and tensor data stays in
//! the map (tensors are handed out as mapped [`Tensor`]s in their block format). Every count and
//! length read from the file is checked against the bytes that remain before anything is
//! allocated, so a corrupt header cannot make the parser allocate more than the file justifies.
//! Shapes are returned row-major: GGUF's `ne[0]` (the contiguous dimension) comes last.

use crate::{ModelError, Result};
use ferrum_runtime::{DType, Storage, Tensor};
use memmap2::Mmap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    Array(Vec<GgufValue>),
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
    pub fn as_array(&self) -> Option<&[GgufValue]> {
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
    map: Arc<Mmap>,
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
}

/// A read-only anonymous map holding a copy of `bytes` (an empty input is an error: a map
/// cannot be empty, and no model file is).
pub(crate) fn anonymous_map(name: &Path, bytes: &[u8]) -> Result<Arc<Mmap>> {
    if bytes.is_empty() {
        return Err(ModelError::format(name, "file is empty"));
    }
    let mut m = memmap2::MmapMut::map_anon(bytes.len()).map_err(|e| ModelError::io(name, e))?;
    m.copy_from_slice(bytes);
    Ok(Arc::new(
        m.make_read_only().map_err(|e| ModelError::io(name, e))?,
    ))
}

impl GgufFile {
    /// Maps and parses `path`.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
        // SAFETY: the map is read-only; a file truncated underneath us by another process is
        // outside what any mmap-based loader can defend against.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
        GgufFile::parse(path, Arc::new(map))
    }

    /// Parses a file's contents held in memory (copied into an anonymous map); `name` stands
    /// for the file in errors. For tests and fuzzing.
    pub fn from_bytes(name: &Path, bytes: &[u8]) -> Result<GgufFile> {
        GgufFile::parse(name, anonymous_map(name, bytes)?)
    }

    fn parse(path: &Path, map: Arc<Mmap>) -> Result<GgufFile> {
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
        let storage = Storage::mapped(Arc::clone(&self.map), info.offset, len)
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

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<GgufValue> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>(key)?[0]),
            1 => GgufValue::I8(self.array::<1>(key)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(key)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(key)?)),
            4 => GgufValue::U32(self.u32(key)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(key)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(key)?)),
            7 => match self.array::<1>(key)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => {
                    return Err(ModelError::format(
                        self.path,
                        format!("metadata `{key}`: bool byte {b} is neither 0 nor 1"),
                    ))
                }
            },
            8 => GgufValue::String(self.string(key)?),
            9 => {
                if depth >= MAX_ARRAY_NESTING {
                    return Err(ModelError::format(
                        self.path,
                        format!("metadata `{key}`: arrays nested too deeply"),
                    ));
                }
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
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.value(elem_ty, key, depth + 1)?);
                }
                GgufValue::Array(items)
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
