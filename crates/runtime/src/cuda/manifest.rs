//! The manifest of the embedded kernels, written by `kernels/build.py`.
//!
//! For every kernel specialization: the Triton function it comes from, its non-constexpr
//! parameters in launch order with their Triton types, its constexprs and warps, and per
//! architecture the place of its cubin in that architecture's blob with the compiler's figures
//! (shared memory, scratch sizes). [`Manifest::embedded`] parses and checks the copy compiled
//! into this binary; a manifest that disagrees with its blobs is an error, never a launch.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::{Result, RuntimeError};

/// The manifest as embedded, and the architecture blobs it indexes.
const MANIFEST_JSON: &str = include_str!("../../kernels/manifest.json");
const SM80_BIN: &[u8] = include_bytes!("../../kernels/sm80.bin");
const SM90_BIN: &[u8] = include_bytes!("../../kernels/sm90.bin");

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
    /// The compiled binary per architecture name (`sm80`, `sm90`).
    pub binaries: BTreeMap<String, KernelBinary>,
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

/// All embedded kernels.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    /// The Triton version that compiled them.
    pub triton: String,
    /// The architectures with binaries.
    pub archs: Vec<String>,
    /// The specializations.
    pub kernels: Vec<KernelSpec>,
}

impl Manifest {
    /// Parses and checks the embedded manifest.
    pub fn embedded() -> Result<Manifest> {
        let manifest: Manifest = serde_json::from_str(MANIFEST_JSON)
            .map_err(|e| RuntimeError::Kernels(format!("embedded manifest: {e}")))?;
        manifest.check()?;
        Ok(manifest)
    }

    /// The embedded binary blob of `arch`, if this build has one.
    pub fn blob(arch: &str) -> Option<&'static [u8]> {
        match arch {
            "sm80" => Some(SM80_BIN),
            "sm90" => Some(SM90_BIN),
            _ => None,
        }
    }

    /// The spec named `name`.
    pub fn kernel(&self, name: &str) -> Option<&KernelSpec> {
        self.kernels.iter().find(|k| k.name == name)
    }

    /// The cubin of `spec` for `arch`, checked to lie inside the blob and to be an ELF image.
    pub fn cubin(&self, spec: &KernelSpec, arch: &str) -> Result<&'static [u8]> {
        let bin = spec.binaries.get(arch).ok_or_else(|| {
            RuntimeError::Kernels(format!("kernel {} has no binary for {arch}", spec.name))
        })?;
        let blob = Self::blob(arch)
            .ok_or_else(|| RuntimeError::Kernels(format!("no embedded binaries for {arch}")))?;
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
        if !image.starts_with(b"\x7fELF") || bin.offset % 8 != 0 {
            return Err(RuntimeError::Kernels(format!(
                "kernel {} ({arch}): not an aligned cubin at offset {}",
                spec.name, bin.offset
            )));
        }
        Ok(image)
    }

    /// Every spec must have a binary for every listed architecture, inside its blob, with
    /// parameters of known types and the spec's warps.
    fn check(&self) -> Result<()> {
        for spec in &self.kernels {
            for (name, ty) in &spec.params {
                if ArgKind::of(ty).is_none() {
                    return Err(RuntimeError::Kernels(format!(
                        "kernel {}: parameter {name} has unsupported type {ty}",
                        spec.name
                    )));
                }
            }
            for arch in &self.archs {
                self.cubin(spec, arch)?;
                let bin = &spec.binaries[arch];
                if bin.num_warps != spec.num_warps {
                    return Err(RuntimeError::Kernels(format!(
                        "kernel {} ({arch}): compiled with {} warps, spec says {}",
                        spec.name, bin.num_warps, spec.num_warps
                    )));
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

    #[test]
    fn embedded_manifest_is_whole() {
        let m = Manifest::embedded().expect("embedded manifest");
        assert!(m.archs.contains(&"sm80".to_string()) && m.archs.contains(&"sm90".to_string()));
        for spec in &m.kernels {
            for arch in &m.archs {
                let image = m.cubin(spec, arch).expect("cubin");
                assert_eq!(image.len(), spec.binaries[arch].bytes);
            }
        }
        assert!(m.kernel("gemm_bf16_bias0").is_some());
    }
}
