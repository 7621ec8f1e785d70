//! The manifest of the embedded kernels, written by `kernels/build.py`.
//!
//! For every kernel specialization: the Triton function it comes from, its non-constexpr
//! parameters in launch order with their Triton types, its constexprs and warps, and per
//! architecture the place of its cubin in that architecture's blob with the compiler's figures
//! (shared memory, scratch sizes). [`Manifest::embedded`] parses and checks the copy compiled
//! into this binary; a manifest that disagrees with its blobs is an error, never a launch.
//!
//! Each architecture's blob is embedded zstd-compressed (`<arch>.bin.zst`, about a seventh of
//! its size) and decompressed once, when a device of that architecture loads its kernels
//! ([`Manifest::blob`]): its length and the frame's checksum are checked before any cubin in
//! it is used.
//!
//! [`Manifest::from_dir`] reads the same files from a folder instead (`kernels/build.py --out
//! DIR`, a tuning sweep's candidate build), with the same checks: the engine then runs those
//! binaries through its own launch path, grids computed from their constexprs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::{Result, RuntimeError};

/// The manifest as embedded, and the architecture blobs it indexes.
const MANIFEST_JSON: &str = include_str!("../../kernels/manifest.json");
const SM80_ZST: &[u8] = include_bytes!("../../kernels/sm80.bin.zst");
const SM90_ZST: &[u8] = include_bytes!("../../kernels/sm90.bin.zst");

/// One kernel specialization.
#[derive(Debug, Clone, Deserialize)]
pub struct KernelSpec {
    /// The name launches use (`gemm_bf16_bias0`).
    pub name: String,
    /// The Python module under `kernels/ferrum_kernels/` that defines the kernel.
    pub module: String,
    /// The Triton function's name.
    pub function: String,
    /// Non-constexpr parameters in order: (name, Triton type such as `*fp32` or `i32`).
    pub params: Vec<(String, String)>,
    /// Compile-time constants.
    pub constexprs: BTreeMap<String, i64>,
    /// Warps per block.
    pub num_warps: u32,
    /// The compiled binary per architecture name (`sm80`, `sm90`): the generic one, which
    /// assumes nothing of its arguments.
    pub binaries: BTreeMap<String, KernelBinary>,
    /// The aligned variant, when the build made one.
    #[serde(default)]
    pub aligned: Option<AlignedVariant>,
}

/// A kernel's binaries compiled on the assumption that some parameters are divisible by 16
/// (pointers: the address in bytes; integers: the value), as Triton's JIT specializes: wide
/// vector loads and copies instead of element-wide ones. Launched only when every hinted
/// argument qualifies (`Gpu::launch` checks at each launch).
#[derive(Debug, Clone, Deserialize)]
pub struct AlignedVariant {
    /// The hinted parameters, by name.
    pub hints: Vec<String>,
    /// The compiled binary per architecture name.
    pub binaries: BTreeMap<String, KernelBinary>,
}

/// Which of a kernel's binaries a launch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// Compiled without assumptions on the arguments.
    Generic,
    /// Compiled with the [`AlignedVariant`]'s hints.
    Aligned,
}

impl Variant {
    /// `generic` or `aligned`.
    pub fn as_str(self) -> &'static str {
        match self {
            Variant::Generic => "generic",
            Variant::Aligned => "aligned",
        }
    }
}

impl KernelSpec {
    /// The binary of `variant` for `arch`, if the build made it.
    pub fn binary(&self, variant: Variant, arch: &str) -> Option<&KernelBinary> {
        match variant {
            Variant::Generic => self.binaries.get(arch),
            Variant::Aligned => self.aligned.as_ref()?.binaries.get(arch),
        }
    }

    /// The indices of the aligned variant's hinted parameters (empty without one); a hint
    /// that names no parameter is `None` ([`Manifest::embedded`] refuses such a manifest).
    pub fn hinted_params(&self) -> Option<Vec<usize>> {
        let Some(aligned) = &self.aligned else {
            return Some(Vec::new());
        };
        aligned
            .hints
            .iter()
            .map(|h| self.params.iter().position(|(name, _)| name == h))
            .collect()
    }
}

/// A kernel's cubin for one architecture.
#[derive(Debug, Clone, Deserialize)]
pub struct KernelBinary {
    /// Byte offset in the architecture's blob.
    pub offset: usize,
    /// Length in bytes.
    pub bytes: usize,
    /// The entry point's symbol.
    pub symbol: String,
    /// Warps per block (the same as the spec's).
    pub num_warps: u32,
    /// Dynamic shared memory per block, in bytes.
    pub shared: u32,
    /// Global scratch per program, in bytes (0: none).
    pub global_scratch_size: u64,
    /// Alignment of the global scratch.
    pub global_scratch_align: u64,
    /// Profile scratch per program, in bytes (0: none).
    pub profile_scratch_size: u64,
    /// Alignment of the profile scratch.
    pub profile_scratch_align: u64,
    /// SHA-256 of the cubin, as the build wrote it.
    pub sha256: String,
}

/// One architecture's blob: every cubin of that architecture, concatenated.
#[derive(Debug, Clone, Deserialize)]
pub struct BlobInfo {
    /// Length in bytes, decompressed.
    pub bytes: usize,
}

/// What the launcher must know of the specializations to pick among them: the one source of
/// these values is `kernels/specs.py` (`dispatch()`), which the build writes into the
/// manifest.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Dispatch {
    /// Products of at most this many activation rows take the decode specializations.
    pub decode_m: usize,
    /// Products of a half-precision weight with more rows than this take the `_large` tiles.
    pub large_m: usize,
    /// Query tokens per tile of the prefill attention kernels.
    pub prefill_m: usize,
    /// Head sizes the attention and KV kernels are built for, increasing.
    pub head_blocks: Vec<usize>,
}

impl Dispatch {
    fn check(&self) -> Result<()> {
        let ok = self.decode_m >= 1
            && self.large_m >= self.decode_m
            && self.prefill_m >= 1
            && !self.head_blocks.is_empty()
            && self.head_blocks.windows(2).all(|w| w[0] < w[1]);
        if ok {
            Ok(())
        } else {
            Err(RuntimeError::Kernels(format!(
                "bad dispatch values {self:?}"
            )))
        }
    }
}

/// All embedded kernels.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    /// The Triton version that compiled them.
    pub triton: String,
    /// The architectures with binaries.
    pub archs: Vec<String>,
    /// Each architecture's blob.
    pub blobs: BTreeMap<String, BlobInfo>,
    /// The specializations.
    pub kernels: Vec<KernelSpec>,
    /// How launches pick among them: required of the embedded manifest; an overlay's, when it
    /// has one, must be the same.
    #[serde(default)]
    pub dispatch: Option<Dispatch>,
    /// The folder of a manifest read by [`Manifest::from_dir`], whose blobs are read from it;
    /// `None` for the embedded one.
    #[serde(skip)]
    dir: Option<PathBuf>,
}

impl Manifest {
    /// Parses and checks the embedded manifest.
    pub fn embedded() -> Result<Manifest> {
        let manifest: Manifest = serde_json::from_str(MANIFEST_JSON)
            .map_err(|e| RuntimeError::Kernels(format!("embedded manifest: {e}")))?;
        manifest.check()?;
        if manifest.dispatch.is_none() {
            return Err(RuntimeError::Kernels(
                "embedded manifest: no dispatch values (rebuild with kernels/build.py)".into(),
            ));
        }
        Ok(manifest)
    }

    /// The manifest `kernels/build.py --out DIR` wrote into `dir` (its blobs are read from
    /// there when a device loads them), checked as the embedded one is.
    pub fn from_dir(dir: &Path) -> Result<Manifest> {
        let path = dir.join("manifest.json");
        let err = |s: String| RuntimeError::Kernels(format!("{}: {s}", path.display()));
        let text = std::fs::read_to_string(&path).map_err(|e| err(e.to_string()))?;
        let mut manifest: Manifest = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
        manifest.check().map_err(|e| err(e.to_string()))?;
        manifest.dir = Some(dir.to_path_buf());
        Ok(manifest)
    }

    /// The compressed blob of `arch` embedded in this build, if it has one.
    fn compressed(arch: &str) -> Option<&'static [u8]> {
        match arch {
            "sm80" => Some(SM80_ZST),
            "sm90" => Some(SM90_ZST),
            _ => None,
        }
    }

    /// Where this manifest's binaries come from, in words.
    pub fn source(&self) -> String {
        match &self.dir {
            Some(d) => d.display().to_string(),
            None => "embedded".into(),
        }
    }

    /// The blob of `arch`, decompressed and checked: its length is the manifest's and the zstd
    /// frame's checksum matches.
    pub fn blob(&self, arch: &str) -> Result<Vec<u8>> {
        let err = |s: String| {
            RuntimeError::Kernels(format!("{} binaries for {arch}: {s}", self.source()))
        };
        let read;
        let zst = match &self.dir {
            Some(dir) => {
                let path = dir.join(format!("{arch}.bin.zst"));
                read = std::fs::read(&path)
                    .map_err(|e| err(format!("reading {}: {e}", path.display())))?;
                &read[..]
            }
            None => Self::compressed(arch).ok_or_else(|| err("none in this build".into()))?,
        };
        let want = self
            .blobs
            .get(arch)
            .ok_or_else(|| err("not in the manifest".into()))?
            .bytes;
        let mut decoder = ruzstd::decoding::FrameDecoder::new();
        let mut blob = Vec::with_capacity(want);
        decoder
            .decode_all_to_vec(zst, &mut blob)
            .map_err(|e| err(format!("cannot decompress: {e}")))?;
        if blob.len() != want {
            return Err(err(format!(
                "{} bytes decompressed, the manifest says {want}",
                blob.len()
            )));
        }
        match (
            decoder.get_checksum_from_data(),
            decoder.get_calculated_checksum(),
        ) {
            (Some(stored), Some(computed)) if stored == computed => Ok(blob),
            (stored, computed) => Err(err(format!(
                "frame checksum {stored:?}, computed {computed:?}"
            ))),
        }
    }

    /// The spec named `name`.
    pub fn kernel(&self, name: &str) -> Option<&KernelSpec> {
        self.kernels.iter().find(|k| k.name == name)
    }

    /// The binary of `spec`'s `variant` for `arch` and its cubin in `blob`, the decompressed
    /// blob of `arch` ([`Manifest::blob`]), checked to lie inside it and to be an 8-byte-aligned
    /// ELF image.
    pub fn cubin<'s, 'b>(
        &self,
        spec: &'s KernelSpec,
        variant: Variant,
        arch: &str,
        blob: &'b [u8],
    ) -> Result<(&'s KernelBinary, &'b [u8])> {
        let bin = spec.binary(variant, arch).ok_or_else(|| {
            RuntimeError::Kernels(format!(
                "kernel {} has no {} binary for {arch}",
                spec.name,
                variant.as_str()
            ))
        })?;
        let end = bin.offset.checked_add(bin.bytes);
        let image = end
            .and_then(|end| blob.get(bin.offset..end))
            .ok_or_else(|| {
                RuntimeError::Kernels(format!(
                    "kernel {} ({arch}): bytes {}..+{} lie outside the {}-byte blob",
                    spec.name,
                    bin.offset,
                    bin.bytes,
                    blob.len()
                ))
            })?;
        if !image.starts_with(b"\x7fELF") || !(image.as_ptr() as usize).is_multiple_of(8) {
            return Err(RuntimeError::Kernels(format!(
                "kernel {} ({arch}): not an aligned cubin at offset {}",
                spec.name, bin.offset
            )));
        }
        Ok((bin, image))
    }

    /// Every spec must have a binary for every listed architecture, inside its blob, with
    /// parameters of known types and the spec's warps; an aligned variant's hints must name
    /// pointer or integer parameters, and its binaries obey the same rules (the cubins
    /// themselves are checked when a blob is decompressed, [`Manifest::cubin`]).
    fn check(&self) -> Result<()> {
        if let Some(d) = &self.dispatch {
            d.check()?;
        }
        for spec in &self.kernels {
            let err = |s: String| RuntimeError::Kernels(format!("kernel {}: {s}", spec.name));
            for (name, ty) in &spec.params {
                if ArgKind::of(ty).is_none() {
                    return Err(err(format!("parameter {name} has unsupported type {ty}")));
                }
            }
            let mut variants = vec![Variant::Generic];
            if let Some(aligned) = &spec.aligned {
                variants.push(Variant::Aligned);
                for hint in &aligned.hints {
                    match spec.params.iter().find(|(name, _)| name == hint) {
                        None => return Err(err(format!("hint {hint} names no parameter"))),
                        Some((_, ty)) if ArgKind::of(ty) == Some(ArgKind::F32) => {
                            return Err(err(format!("hint {hint} is a float parameter")))
                        }
                        Some(_) => {}
                    }
                }
            }
            for arch in &self.archs {
                for &variant in &variants {
                    let bin = spec
                        .binary(variant, arch)
                        .ok_or_else(|| err(format!("no {} binary for {arch}", variant.as_str())))?;
                    let blob = self.blobs.get(arch).map_or(0, |b| b.bytes);
                    if bin
                        .offset
                        .checked_add(bin.bytes)
                        .is_none_or(|end| end > blob)
                    {
                        return Err(err(format!(
                            "{} binary ({arch}): bytes {}..+{} lie outside the {blob}-byte blob",
                            variant.as_str(),
                            bin.offset,
                            bin.bytes
                        )));
                    }
                    if bin.num_warps != spec.num_warps {
                        return Err(err(format!(
                            "{} binary ({arch}): compiled with {} warps, spec says {}",
                            variant.as_str(),
                            bin.num_warps,
                            spec.num_warps
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// The kind of value a kernel parameter takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArgKind {
    /// A device pointer (`*fp32`, `*bf16`, `*u32`...).
    Ptr,
    /// `i32`.
    I32,
    /// `u32`.
    U32,
    /// `fp32`.
    F32,
}

impl ArgKind {
    /// The kind of a Triton type name.
    pub(crate) fn of(ty: &str) -> Option<ArgKind> {
        match ty {
            t if t.starts_with('*') => Some(ArgKind::Ptr),
            "i32" => Some(ArgKind::I32),
            "u32" => Some(ArgKind::U32),
            "fp32" => Some(ArgKind::F32),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn embedded_manifest_is_whole() {
        let m = Manifest::embedded().expect("embedded manifest");
        assert!(m.archs.contains(&"sm80".to_string()) && m.archs.contains(&"sm90".to_string()));
        for arch in &m.archs {
            let blob = m.blob(arch).expect("decompresses");
            for spec in &m.kernels {
                for variant in [Variant::Generic, Variant::Aligned] {
                    let (bin, image) = m.cubin(spec, variant, arch, &blob).expect("cubin");
                    assert_eq!(image.len(), bin.bytes);
                    let sha = Sha256::digest(image);
                    let hex: String = sha.iter().map(|b| format!("{b:02x}")).collect();
                    assert_eq!(hex, bin.sha256, "{} ({arch}, {variant:?})", spec.name);
                }
            }
        }
        let gemm = m.kernel("gemm_bf16_bias0").expect("gemm_bf16_bias0");
        let hinted = gemm.hinted_params().expect("hints name parameters");
        let names: Vec<&str> = hinted.iter().map(|&i| gemm.params[i].0.as_str()).collect();
        // Every pointer and the sizes and strides, never the row count.
        assert!(names.contains(&"w_ptr") && names.contains(&"k") && names.contains(&"x_stride"));
        assert!(!names.contains(&"m"), "{names:?}");
    }

    /// The dispatch values come from `kernels/specs.py` through the manifest (CI's
    /// `build.py --check` holds the manifest to the build); bad ones are refused.
    #[test]
    fn dispatch_values_are_in_the_manifest_and_checked() {
        let m = Manifest::embedded().expect("embedded manifest");
        let d = m.dispatch.clone().expect("dispatch values");
        assert!(d.decode_m >= 1 && d.large_m > d.decode_m && d.prefill_m >= 1);
        assert!(d.head_blocks.contains(&128), "{d:?}");
        // A decode tile of the decode specializations is `decode_m` rows high.
        let gemm = m.kernel("gemm_bf16_decode").expect("gemm_bf16_decode");
        assert_eq!(gemm.constexprs.get("BLOCK_M"), Some(&(d.decode_m as i64)));
        for bad in [
            Dispatch {
                decode_m: 0,
                ..d.clone()
            },
            Dispatch {
                large_m: 1,
                decode_m: 16,
                ..d.clone()
            },
            Dispatch {
                head_blocks: vec![64, 32],
                ..d.clone()
            },
            Dispatch {
                head_blocks: vec![],
                ..d.clone()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_hint_must_name_an_integer_or_pointer_parameter() {
        let mut m = Manifest::embedded().expect("embedded manifest");
        let spec = &mut m.kernels[0];
        let aligned = spec.aligned.as_mut().expect("aligned variant");
        aligned.hints.push("no_such_param".into());
        let err = m.check().unwrap_err().to_string();
        assert!(err.contains("no_such_param"), "{err}");

        let mut m = Manifest::embedded().expect("embedded manifest");
        let spec = m.kernel("rms_norm_res0").expect("rms_norm_res0").clone();
        let i = m
            .kernels
            .iter()
            .position(|k| k.name == spec.name)
            .expect("index");
        m.kernels[i]
            .aligned
            .as_mut()
            .expect("aligned")
            .hints
            .push("eps".into());
        let err = m.check().unwrap_err().to_string();
        assert!(err.contains("eps") && err.contains("float"), "{err}");
    }

    #[test]
    fn a_damaged_blob_is_refused() {
        let mut m = Manifest::embedded().expect("embedded manifest");
        m.blobs.get_mut("sm90").expect("sm90").bytes += 1;
        let err = m.blob("sm90").unwrap_err().to_string();
        assert!(
            err.contains("sm90") && err.contains("manifest says"),
            "{err}"
        );
        assert!(m.blob("sm75").is_err());
    }
}
