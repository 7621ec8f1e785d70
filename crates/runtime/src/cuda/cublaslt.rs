//! cuBLASLt, loaded at run time like libcuda (never linked): the vendor library behind
//! [`Gpu::gemm`](super::Gpu::gemm) on a GPU.
//!
//! [`CublasLt::open`] looks for the library in order: the path the user gave (a file, or a
//! folder holding one), `libcublasLt.so.13` then `.so.12` on the library path, then the folders
//! where PyPI's `nvidia-cublas` wheels put them in every Python environment it can see
//! (`VIRTUAL_ENV`, `PYTHONPATH`, the user's and the system's site-packages, `/opt/*/.venv`).
//! Failing all, the error lists each place looked in.
//!
//! Only the symbols below are used; their signatures and constants are those of cuBLASLt 12
//! and 13 (`cublasLt.h`), which agree on them. Each product shape ([`LtMatmul::key`]: sizes,
//! leading dimensions, types and the alignment of each address) gets its descriptors and one
//! algorithm, chosen once by the library's heuristic and pinned: a shape always runs the same
//! algorithm, so its results do not depend on what ran before. The algorithm's workspace is
//! a device buffer of [`WORKSPACE_BYTES`] made at open, so a product inside a graph capture
//! allocates nothing.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};

use cudarc::driver::{result, sys};

use super::gemm::{GemmSupport, GemmType, LtMatmul};
use crate::{Result, RuntimeError};

type Status = i32;
type Handle = *mut c_void;
type Desc = *mut c_void;

/// cuBLASLt's `cublasLtMatmulAlgo_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Algo {
    data: [u64; 8],
}

/// cuBLASLt's `cublasLtMatmulHeuristicResult_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Heuristic {
    algo: Algo,
    workspace_size: usize,
    state: Status,
    waves_count: f32,
    reserved: [i32; 4],
}

const STATUS_SUCCESS: Status = 0;
const COMPUTE_32F: i32 = 68;
const R_32F: i32 = 0;
const R_16F: i32 = 2;
const R_16BF: i32 = 14;
const OP_N: i32 = 0;
const OP_T: i32 = 1;
const DESC_TRANSA: i32 = 3;
const DESC_TRANSB: i32 = 4;
const PREF_MAX_WORKSPACE_BYTES: i32 = 1;
const PREF_MIN_ALIGNMENT: [i32; 4] = [5, 6, 7, 8];

/// The workspace every product may use: 32 MiB, what NVIDIA suggests for Hopper.
pub(crate) const WORKSPACE_BYTES: usize = 32 << 20;

/// The entry points used, resolved once.
#[derive(Debug, Clone, Copy)]
struct Api {
    create: unsafe extern "C" fn(*mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    version: unsafe extern "C" fn() -> usize,
    desc_create: unsafe extern "C" fn(*mut Desc, i32, i32) -> Status,
    desc_set: unsafe extern "C" fn(Desc, i32, *const c_void, usize) -> Status,
    desc_destroy: unsafe extern "C" fn(Desc) -> Status,
    layout_create: unsafe extern "C" fn(*mut Desc, i32, u64, u64, i64) -> Status,
    layout_destroy: unsafe extern "C" fn(Desc) -> Status,
    pref_create: unsafe extern "C" fn(*mut Desc) -> Status,
    pref_set: unsafe extern "C" fn(Desc, i32, *const c_void, usize) -> Status,
    pref_destroy: unsafe extern "C" fn(Desc) -> Status,
    #[allow(clippy::type_complexity)]
    heuristic: unsafe extern "C" fn(
        Handle,
        Desc,
        Desc,
        Desc,
        Desc,
        Desc,
        Desc,
        i32,
        *mut Heuristic,
        *mut i32,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    matmul: unsafe extern "C" fn(
        Handle,
        Desc,
        *const c_void,
        *const c_void,
        Desc,
        *const c_void,
        Desc,
        *const c_void,
        *const c_void,
        Desc,
        *mut c_void,
        Desc,
        *const Algo,
        *mut c_void,
        usize,
        sys::CUstream,
    ) -> Status,
}

/// One shape's descriptors and pinned algorithm (`None`: the library has none for it).
#[derive(Debug)]
struct Plan {
    op: Desc,
    a: Desc,
    b: Desc,
    d: Desc,
    algo: Option<Algo>,
}

/// An open cuBLASLt: the library, a handle, a workspace and a plan per shape.
#[derive(Debug)]
pub(crate) struct CublasLt {
    /// Kept open while the function pointers are in use.
    _lib: libloading::Library,
    api: Api,
    handle: Handle,
    path: String,
    version: usize,
    workspace: u64,
    plans: HashMap<LtMatmul, Plan>,
}

// SAFETY: the handle and descriptors are used only under the owning driver's `&mut self`,
// with its context current; cuBLASLt handles may move between threads.
unsafe impl Send for CublasLt {}

fn lt_err(step: &str, status: Status) -> RuntimeError {
    RuntimeError::Cuda {
        step: format!("cuBLASLt: {step}"),
        detail: format!("status {status}"),
    }
}

fn check(step: &str, status: Status) -> Result<()> {
    if status == STATUS_SUCCESS {
        Ok(())
    } else {
        Err(lt_err(step, status))
    }
}

fn data_type(t: GemmType) -> i32 {
    match t {
        GemmType::F32 => R_32F,
        GemmType::F16 => R_16F,
        GemmType::BF16 => R_16BF,
    }
}

/// The names a dynamic loader finds on the library path, newest first.
const SONAMES: [&str; 2] = ["libcublasLt.so.13", "libcublasLt.so.12"];

/// Where PyPI's wheels put the library inside a site-packages folder.
const WHEEL_PATHS: [&str; 3] = [
    "nvidia/cu13/lib/libcublasLt.so.13",
    "nvidia/cublas/lib/libcublasLt.so.13",
    "nvidia/cublas/lib/libcublasLt.so.12",
];

/// Every site-packages folder this process can see (existing ones only).
fn site_packages() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
        roots.push(PathBuf::from(v));
    }
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(PathBuf::from(home).join(".local"));
    }
    roots.extend(["/usr/local", "/usr"].map(PathBuf::from));
    if let Ok(opt) = std::fs::read_dir("/opt") {
        roots.extend(opt.flatten().map(|e| e.path().join(".venv")));
    }
    let mut out: Vec<PathBuf> = std::env::var_os("PYTHONPATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(root.join("lib")) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("python3") {
                out.push(e.path().join("site-packages"));
                out.push(e.path().join("dist-packages"));
            }
        }
    }
    out.push(PathBuf::from("/usr/lib/python3/dist-packages"));
    out.retain(|p| p.is_dir());
    out
}

/// The places to try, in order, as paths or sonames.
fn candidates(user: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = user {
        if p.is_dir() {
            out.extend(SONAMES.iter().map(|n| p.join(n)));
            out.push(p.join("libcublasLt.so"));
        } else {
            out.push(p.to_path_buf());
        }
        return out;
    }
    out.extend(SONAMES.iter().map(PathBuf::from));
    for site in site_packages() {
        out.extend(WHEEL_PATHS.iter().map(|w| site.join(w)));
    }
    out
}

impl CublasLt {
    /// Opens the library ([`candidates`]), creates a handle and allocates the workspace (the
    /// caller has made the device's context current).
    pub(crate) fn open(user: Option<&Path>) -> Result<CublasLt> {
        let tried = candidates(user);
        let mut failures = Vec::new();
        let mut found = None;
        for path in &tried {
            // A soname goes to the dynamic loader's search; a path is opened as is.
            // SAFETY: loading cuBLASLt runs its initializers, which only set up the library.
            match unsafe { libloading::Library::new(path) } {
                Ok(lib) => {
                    found = Some((lib, path.display().to_string()));
                    break;
                }
                Err(e) => failures.push(format!("{}: {e}", path.display())),
            }
        }
        let Some((lib, path)) = found else {
            return Err(RuntimeError::Cuda {
                step: "opening cuBLASLt".into(),
                detail: format!(
                    "no library found (looked in: {}); give one with --cublaslt PATH",
                    failures.join("; ")
                ),
            });
        };
        let api = resolve(&lib, &path)?;
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: a fresh handle out-parameter.
        check("cublasLtCreate", unsafe { (api.create)(&mut handle) })?;
        // SAFETY: no arguments.
        let version = unsafe { (api.version)() };
        // SAFETY: a plain allocation in the current context, freed in Drop.
        let workspace = match unsafe { result::malloc_sync(WORKSPACE_BYTES) } {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: the handle was just created and is destroyed once.
                unsafe { (api.destroy)(handle) };
                return Err(super::driver::cuda_err(
                    "allocating cuBLASLt's workspace",
                    e,
                ));
            }
        };
        Ok(CublasLt {
            _lib: lib,
            api,
            handle,
            path,
            version,
            workspace,
            plans: HashMap::new(),
        })
    }

    /// The library in words: version and file.
    pub(crate) fn describe(&self) -> String {
        let v = self.version;
        format!(
            "cuBLASLt {}.{}.{} ({})",
            v / 10_000,
            (v / 100) % 100,
            v % 100,
            self.path
        )
    }

    /// The plan of `call`'s shape, made on first use.
    fn plan(&mut self, call: &LtMatmul) -> Result<&Plan> {
        let key = call.key();
        if !self.plans.contains_key(&key) {
            let plan = self.make_plan(&key)?;
            self.plans.insert(key, plan);
        }
        self.plans
            .get(&key)
            .ok_or_else(|| RuntimeError::Kernels("cuBLASLt: a plan vanished".into()))
    }

    fn make_plan(&self, key: &LtMatmul) -> Result<Plan> {
        let api = self.api;
        let mut op: Desc = std::ptr::null_mut();
        // SAFETY: out-parameter; f32 compute and scale.
        check("cublasLtMatmulDescCreate", unsafe {
            (api.desc_create)(&mut op, COMPUTE_32F, R_32F)
        })?;
        let mut plan = Plan {
            op,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            algo: None,
        };
        let set = |attr: i32, value: i32| {
            // SAFETY: `op` is live; the attribute takes an int32 (cublasOperation_t).
            check("cublasLtMatmulDescSetAttribute", unsafe {
                (api.desc_set)(op, attr, (&value as *const i32).cast(), 4)
            })
        };
        let op_of = |t: bool| if t { OP_T } else { OP_N };
        set(DESC_TRANSA, op_of(key.trans_a))?;
        set(DESC_TRANSB, op_of(key.trans_b))?;
        // Stored shapes (column-major rows x cols): A is k x m when transposed, B k x n when
        // not, D m x n.
        let (a_rows, a_cols) = if key.trans_a {
            (key.k, key.m)
        } else {
            (key.m, key.k)
        };
        let (b_rows, b_cols) = if key.trans_b {
            (key.n, key.k)
        } else {
            (key.k, key.n)
        };
        let layout = |t: GemmType, rows: u64, cols: u64, ld: u64| -> Result<Desc> {
            let mut l: Desc = std::ptr::null_mut();
            // SAFETY: out-parameter.
            check("cublasLtMatrixLayoutCreate", unsafe {
                (api.layout_create)(&mut l, data_type(t), rows, cols, ld as i64)
            })?;
            Ok(l)
        };
        plan.a = layout(key.input, a_rows, a_cols, key.lda)?;
        plan.b = layout(key.input, b_rows, b_cols, key.ldb)?;
        plan.d = layout(key.output, key.m, key.n, key.ldd)?;
        let mut pref: Desc = std::ptr::null_mut();
        // SAFETY: out-parameter.
        check("cublasLtMatmulPreferenceCreate", unsafe {
            (api.pref_create)(&mut pref)
        })?;
        let workspace = WORKSPACE_BYTES as u64;
        let aligns = [key.a, key.b, key.d, key.d].map(|a| a as u32);
        // SAFETY: `pref` is live; each attribute takes the type passed.
        let configured = unsafe {
            check(
                "cublasLtMatmulPreferenceSetAttribute",
                (api.pref_set)(
                    pref,
                    PREF_MAX_WORKSPACE_BYTES,
                    (&workspace as *const u64).cast(),
                    8,
                ),
            )
            .and_then(|()| {
                PREF_MIN_ALIGNMENT
                    .iter()
                    .zip(&aligns)
                    .try_for_each(|(&attr, align)| {
                        check(
                            "cublasLtMatmulPreferenceSetAttribute",
                            (api.pref_set)(pref, attr, (align as *const u32).cast(), 4),
                        )
                    })
            })
        };
        let mut result = Heuristic::default();
        let mut count = 0i32;
        let asked = configured.and_then(|()| {
            // SAFETY: every descriptor is live; one result asked for, into `result`. D is
            // also C (beta is 0).
            let status = unsafe {
                (api.heuristic)(
                    self.handle,
                    plan.op,
                    plan.a,
                    plan.b,
                    plan.d,
                    plan.d,
                    pref,
                    1,
                    &mut result,
                    &mut count,
                )
            };
            // No algorithm for the shape is an answer, not a failure.
            if status != STATUS_SUCCESS && count == 0 {
                return Ok(());
            }
            check("cublasLtMatmulAlgoGetHeuristic", status)
        });
        // SAFETY: destroyed once, whatever the outcome.
        unsafe { (api.pref_destroy)(pref) };
        if let Err(e) = asked {
            destroy_plan(&api, &plan);
            return Err(e);
        }
        if count > 0 && result.state == STATUS_SUCCESS && result.workspace_size <= WORKSPACE_BYTES {
            plan.algo = Some(result.algo);
        }
        Ok(plan)
    }

    /// Whether the library has an algorithm for `call`'s shape.
    pub(crate) fn support(&mut self, call: &LtMatmul) -> Result<GemmSupport> {
        Ok(match self.plan(call)?.algo {
            Some(_) => GemmSupport::Supported,
            None => GemmSupport::Unsupported(format!(
                "cuBLASLt has no algorithm for {} x {} x {} ({} into {})",
                call.n,
                call.m,
                call.k,
                call.input.name(),
                call.output.name()
            )),
        })
    }

    /// Issues `call` on `stream` with its shape's pinned algorithm.
    pub(crate) fn matmul(&mut self, call: &LtMatmul, stream: sys::CUstream) -> Result<()> {
        let (api, handle, workspace) = (self.api, self.handle, self.workspace);
        let plan = self.plan(call)?;
        let algo = plan.algo.ok_or_else(|| {
            RuntimeError::Kernels(format!(
                "cuBLASLt has no algorithm for {} x {} x {}",
                call.n, call.m, call.k
            ))
        })?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the descriptors describe the operands' shapes and leading dimensions
        // (Gemm::check bounds them; the caller's buffers hold them), the algorithm came from
        // the heuristic for these descriptors, and the workspace is ours and large enough.
        let status = unsafe {
            (api.matmul)(
                handle,
                plan.op,
                (&alpha as *const f32).cast(),
                call.a as *const c_void,
                plan.a,
                call.b as *const c_void,
                plan.b,
                (&beta as *const f32).cast(),
                call.d as *const c_void,
                plan.d,
                call.d as *mut c_void,
                plan.d,
                &algo,
                workspace as *mut c_void,
                WORKSPACE_BYTES,
                stream,
            )
        };
        check("cublasLtMatmul", status)
    }
}

fn destroy_plan(api: &Api, plan: &Plan) {
    // SAFETY: each descriptor was created once (or is null, which is skipped) and is
    // destroyed once.
    unsafe {
        for l in [plan.a, plan.b, plan.d] {
            if !l.is_null() {
                (api.layout_destroy)(l);
            }
        }
        (api.desc_destroy)(plan.op);
    }
}

/// The entry points of `lib`, or an error naming the first missing one.
fn resolve(lib: &libloading::Library, path: &str) -> Result<Api> {
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol's type is cuBLASLt's declaration of it (cublasLt.h).
            *unsafe { lib.get($name) }.map_err(|e| RuntimeError::Cuda {
                step: "opening cuBLASLt".into(),
                detail: format!(
                    "{path} has no {}: {e}",
                    String::from_utf8_lossy(&$name[..$name.len() - 1])
                ),
            })?
        };
    }
    Ok(Api {
        create: sym!(b"cublasLtCreate\0"),
        destroy: sym!(b"cublasLtDestroy\0"),
        version: sym!(b"cublasLtGetVersion\0"),
        desc_create: sym!(b"cublasLtMatmulDescCreate\0"),
        desc_set: sym!(b"cublasLtMatmulDescSetAttribute\0"),
        desc_destroy: sym!(b"cublasLtMatmulDescDestroy\0"),
        layout_create: sym!(b"cublasLtMatrixLayoutCreate\0"),
        layout_destroy: sym!(b"cublasLtMatrixLayoutDestroy\0"),
        pref_create: sym!(b"cublasLtMatmulPreferenceCreate\0"),
        pref_set: sym!(b"cublasLtMatmulPreferenceSetAttribute\0"),
        pref_destroy: sym!(b"cublasLtMatmulPreferenceDestroy\0"),
        heuristic: sym!(b"cublasLtMatmulAlgoGetHeuristic\0"),
        matmul: sym!(b"cublasLtMatmul\0"),
    })
}

impl Drop for CublasLt {
    fn drop(&mut self) {
        for plan in self.plans.values() {
            destroy_plan(&self.api, plan);
        }
        // SAFETY: the device is idle (the driver synchronized before dropping this); the
        // workspace and handle are freed once.
        unsafe {
            let _ = result::free_sync(self.workspace);
            (self.api.destroy)(self.handle);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_user_path_is_the_only_place_looked_in() {
        let dir = std::env::temp_dir();
        let c = candidates(Some(&dir));
        assert!(c.iter().all(|p| p.starts_with(&dir)), "{c:?}");
        assert_eq!(c[0], dir.join("libcublasLt.so.13"));
        let file = Path::new("/nowhere/libcublasLt.so.12");
        assert_eq!(candidates(Some(file)), vec![file.to_path_buf()]);
    }

    #[test]
    fn without_a_path_the_sonames_come_first_then_the_wheels() {
        let c = candidates(None);
        assert_eq!(c[0], PathBuf::from("libcublasLt.so.13"));
        assert_eq!(c[1], PathBuf::from("libcublasLt.so.12"));
        assert!(c[2..]
            .iter()
            .all(|p| p.to_string_lossy().contains("nvidia/")));
    }

    #[test]
    fn a_missing_library_is_an_error_naming_where_it_looked() {
        let err = CublasLt::open(Some(Path::new("/nowhere/libcublasLt.so.13")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nowhere/libcublasLt.so.13"), "{err}");
        assert!(err.contains("--cublaslt"), "{err}");
    }
}
