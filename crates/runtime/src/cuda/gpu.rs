//! [`Gpu`]: one device (real or interpreted), its kernels, and checked launches.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use super::driver::CudaDriver;
use super::interpreted::{InterpretedDriver, InterpreterConfig};
use super::manifest::{ArgKind, Dispatch, KernelSpec, Manifest, Variant};
use super::ops::{Driver, KernelHandle, LaunchDims, Op, GEMM_HANDLE, GRAPH_HANDLE, MAIN_STREAM};
use super::stream::{HostState, Stream};
use crate::{Result, RuntimeError};

/// An address in a [`Gpu`]'s memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The null pointer (for parameters a specialization does not read).
    pub const NULL: DevicePtr = DevicePtr(0);

    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0 + bytes as u64)
    }
}

/// One launch argument; its kind must match the kernel's parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg {
    /// A device pointer.
    Ptr(DevicePtr),
    /// A 32-bit signed integer.
    I32(i32),
    /// A 32-bit unsigned integer.
    U32(u32),
    /// A 32-bit float.
    F32(f32),
}

impl KernelArg {
    fn kind(&self) -> ArgKind {
        match self {
            KernelArg::Ptr(_) => ArgKind::Ptr,
            KernelArg::I32(_) => ArgKind::I32,
            KernelArg::U32(_) => ArgKind::U32,
            KernelArg::F32(_) => ArgKind::F32,
        }
    }
}

struct Loaded {
    spec: KernelSpec,
    kinds: Vec<ArgKind>,
    block: u32,
    generic: LoadedBinary,
    /// The aligned variant and the indices of the parameters it assumes divisible by 16.
    aligned: Option<(LoadedBinary, Vec<usize>)>,
}

/// One loaded binary of a kernel.
#[derive(Debug, Clone, Copy)]
struct LoadedBinary {
    handle: KernelHandle,
    shared: u32,
    global_scratch: u64,
}

/// Whether every hinted argument is divisible by 16: a pointer's address in bytes (offsets
/// into buffers included), an integer's value.
fn qualifies(args: &[KernelArg], hinted: &[usize]) -> bool {
    hinted.iter().all(|&i| match args.get(i) {
        Some(KernelArg::Ptr(p)) => p.0 % 16 == 0,
        Some(KernelArg::I32(v)) => v % 16 == 0,
        Some(KernelArg::U32(v)) => v % 16 == 0,
        Some(KernelArg::F32(_)) | None => false,
    })
}

/// How many launches of one kernel took each of its binaries ([`Gpu::variant_launches`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VariantLaunches {
    pub generic: u64,
    pub aligned: u64,
}

/// A captured sequence of operations on one [`Gpu`] ([`Gpu::begin_capture`]): a CUDA graph on
/// a GPU, the recorded list on the interpreted device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphId(usize);

/// Device time of one kernel at one grid over a profiled stretch ([`Gpu::profile`]): the grid
/// tells a product's shapes apart.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelTime {
    /// The kernel's name; `graph replay` for whole replayed graphs.
    pub name: String,
    /// Which of its binaries ran (graph replays: generic).
    pub variant: Variant,
    pub grid: [u32; 3],
    pub launches: u64,
    /// Device time summed over the launches, in milliseconds.
    pub total_ms: f64,
}

/// A device with every embedded kernel loaded.
pub struct Gpu {
    pub(super) driver: Box<dyn Driver>,
    dispatch: Dispatch,
    kernels: Vec<Loaded>,
    /// Each kernel's index in `kernels`, by name: a launch looks its kernel up once.
    by_name: HashMap<String, usize>,
    load_time: Duration,
    scratch: Option<(DevicePtr, usize)>,
    /// The thread whose capture is open: its operations on the main stream are recorded, and
    /// nothing else may run until it ends; other threads may not issue work.
    capturing: Option<std::thread::ThreadId>,
    /// The open capture's operations, kept so that they can be issued plainly when the driver
    /// cannot make a graph of them.
    shadow: Vec<Op>,
    /// Launches per kernel (as `kernels`) by the binary they took.
    variant_launches: Vec<VariantLaunches>,
    /// Live host buffers by handle: size and the event after their latest copy.
    pub(super) hosts: HashMap<usize, HostState>,
    /// What the vendor library for matrix products is, once opened.
    pub(super) gemm_library: Option<String>,
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu")
            .field("device", &self.driver.describe())
            .field("kernels", &self.kernels.len())
            .finish()
    }
}

impl Gpu {
    /// CUDA device `ordinal`: probes for the driver library and the device, then loads the
    /// kernels for its architecture. Each missing piece is an error that names it.
    pub fn cuda(ordinal: usize) -> Result<Gpu> {
        Gpu::cuda_with(ordinal, None)
    }

    /// [`Gpu::cuda`], the kernels of `overlay` ([`Manifest::from_dir`]: a tuning sweep's
    /// candidate) replacing the embedded ones of the same names.
    pub fn cuda_with(ordinal: usize, overlay: Option<Manifest>) -> Result<Gpu> {
        Gpu::with_driver(Box::new(CudaDriver::new(ordinal)?), overlay)
    }

    /// The interpreted device: a worker process running the Triton interpreter.
    pub fn interpreted(config: &InterpreterConfig) -> Result<Gpu> {
        Gpu::interpreted_with(config, None)
    }

    /// [`Gpu::interpreted`] with the kernels of `overlay` replacing the embedded ones of the
    /// same names: the interpreter runs their sources with the overlay's constexprs.
    pub fn interpreted_with(config: &InterpreterConfig, overlay: Option<Manifest>) -> Result<Gpu> {
        Gpu::with_driver(Box::new(InterpretedDriver::start(config)?), overlay)
    }

    /// Loads every embedded kernel, or the overlay's of that name: an overlay kernel must be
    /// an embedded one with the same parameters (the launches are written for those).
    fn with_driver(mut driver: Box<dyn Driver>, overlay: Option<Manifest>) -> Result<Gpu> {
        let manifest = Manifest::embedded()?;
        let dispatch = manifest.dispatch.clone().ok_or_else(|| {
            RuntimeError::Kernels("the embedded manifest has no dispatch values".into())
        })?;
        if let Some(d) = overlay.as_ref().and_then(|o| o.dispatch.as_ref()) {
            if *d != dispatch {
                return Err(RuntimeError::Kernels(format!(
                    "{}: built with other dispatch values ({d:?}) than this build's \
                     ({dispatch:?})",
                    overlay.as_ref().map_or_else(String::new, |o| o.source())
                )));
            }
        }
        if let Some(o) = &overlay {
            for k in &o.kernels {
                match manifest.kernel(&k.name) {
                    None => {
                        return Err(RuntimeError::Kernels(format!(
                            "{}: kernel {} is not one of this build's",
                            o.source(),
                            k.name
                        )))
                    }
                    Some(base) if base.params != k.params => {
                        return Err(RuntimeError::Kernels(format!(
                            "{}: kernel {} takes other parameters than this build's",
                            o.source(),
                            k.name
                        )))
                    }
                    Some(_) => {}
                }
            }
        }
        let start = Instant::now();
        let arch = driver.arch().map(str::to_owned);
        // The architecture's cubins, decompressed once; the driver copies what it loads.
        let blob = arch.as_deref().map(|a| manifest.blob(a)).transpose()?;
        let overlay_blob = match (&overlay, arch.as_deref()) {
            (Some(o), Some(a)) => Some(o.blob(a)?),
            _ => None,
        };
        let mut kernels = Vec::with_capacity(manifest.kernels.len());
        for base in &manifest.kernels {
            // The overlay's spec and blob for this kernel, else the embedded ones.
            let (source, spec, blob) = match overlay
                .as_ref()
                .and_then(|o| o.kernel(&base.name).map(|k| (o, k)))
            {
                Some((o, k)) => (o, k, &overlay_blob),
                None => (&manifest, base, &blob),
            };
            let mut load = |variant: Variant| -> Result<LoadedBinary> {
                let image = match (&arch, blob) {
                    (Some(arch), Some(blob)) => Some(source.cubin(spec, variant, arch, blob)?),
                    _ => None,
                };
                if image.is_some_and(|(b, _)| b.profile_scratch_size > 0) {
                    return Err(RuntimeError::Kernels(format!(
                        "kernel {} was compiled with profiling scratch; rebuild without it",
                        spec.name
                    )));
                }
                Ok(LoadedBinary {
                    handle: driver.load(spec, variant, image)?,
                    shared: image.map_or(0, |(b, _)| b.shared),
                    global_scratch: image.map_or(0, |(b, _)| b.global_scratch_size),
                })
            };
            let generic = load(Variant::Generic)?;
            let aligned = match &spec.aligned {
                Some(_) => {
                    let hinted = spec.hinted_params().ok_or_else(|| {
                        RuntimeError::Kernels(format!(
                            "kernel {}: a hint names no parameter",
                            spec.name
                        ))
                    })?;
                    Some((load(Variant::Aligned)?, hinted))
                }
                None => None,
            };
            let kinds = spec
                .params
                .iter()
                .map(|(_, ty)| ArgKind::of(ty))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| RuntimeError::Kernels(format!("kernel {}: bad types", spec.name)))?;
            kernels.push(Loaded {
                spec: spec.clone(),
                kinds,
                block: spec.num_warps * 32,
                generic,
                aligned,
            });
        }
        let by_name = kernels
            .iter()
            .enumerate()
            .map(|(i, k)| (k.spec.name.clone(), i))
            .collect();
        Ok(Gpu {
            driver,
            dispatch,
            kernels,
            by_name,
            load_time: start.elapsed(),
            scratch: None,
            capturing: None,
            shadow: Vec::new(),
            variant_launches: vec![VariantLaunches::default(); manifest.kernels.len()],
            hosts: HashMap::new(),
            gemm_library: None,
        })
    }

    /// How launches pick among the kernels (`kernels/specs.py`'s values, from the manifest).
    pub fn dispatch(&self) -> &Dispatch {
        &self.dispatch
    }

    /// The device in words.
    pub fn describe(&self) -> String {
        self.driver.describe()
    }

    /// How long loading the kernels took (decompressing the architecture's blob included).
    pub fn kernel_load_time(&self) -> Duration {
        self.load_time
    }

    /// The spec of kernel `name`.
    pub fn spec(&self, name: &str) -> Option<&KernelSpec> {
        self.loaded(name).map(|k| &k.spec)
    }

    fn loaded(&self, name: &str) -> Option<&Loaded> {
        self.by_name.get(name).map(|&i| &self.kernels[i])
    }

    /// A constexpr of kernel `name` (block sizes the grid depends on).
    pub fn constexpr(&self, name: &str, key: &str) -> Result<i64> {
        self.spec(name)
            .and_then(|s| s.constexprs.get(key).copied())
            .ok_or_else(|| RuntimeError::Kernels(format!("kernel {name} has no constexpr {key}")))
    }

    /// Allocates `bytes` of device memory.
    pub fn alloc(&mut self, bytes: usize) -> Result<DevicePtr> {
        self.not_capturing("allocating")?;
        self.driver.alloc(bytes.max(1))
    }

    /// Frees memory from [`Gpu::alloc`] once the work issued before on every stream is done.
    pub fn free(&mut self, ptr: DevicePtr) -> Result<()> {
        self.not_capturing("freeing")?;
        self.driver.free(ptr)
    }

    /// Copies `src` to `dst`.
    pub fn write(&mut self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.not_capturing("a copy to the device")?;
        self.driver.write(dst, src)
    }

    /// Copies device bytes into `dst` once all earlier work on the main stream has finished.
    pub fn read(&mut self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        self.not_capturing("a copy to the host")?;
        self.driver.read(src, dst)
    }

    /// Allocates and fills a buffer of f32.
    pub fn upload_f32(&mut self, data: &[f32]) -> Result<DevicePtr> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        let ptr = self.alloc(bytes.len())?;
        self.write(ptr, &bytes)?;
        Ok(ptr)
    }

    /// Allocates and fills a buffer of u32.
    pub fn upload_u32(&mut self, data: &[u32]) -> Result<DevicePtr> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        let ptr = self.alloc(bytes.len())?;
        self.write(ptr, &bytes)?;
        Ok(ptr)
    }

    /// Reads `len` f32 values.
    pub fn download_f32(&mut self, src: DevicePtr, len: usize) -> Result<Vec<f32>> {
        let mut bytes = vec![0u8; len * 4];
        self.read(src, &mut bytes)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Streaming multiprocessors: what split sizes are tuned against (the interpreted device
    /// answers as an H100, whose 132 the tuning tables were measured on).
    pub fn multiprocessors(&self) -> usize {
        self.driver.multiprocessors()
    }

    /// Free and total device memory in bytes; `None` for the interpreted device (host memory).
    pub fn memory_info(&mut self) -> Result<Option<(usize, usize)>> {
        self.not_capturing("a memory query")?;
        self.driver.memory_info()
    }

    /// Waits for all issued work on every stream; a failed launch surfaces here at the latest.
    pub fn synchronize(&mut self) -> Result<()> {
        self.not_capturing("waiting for the device")?;
        self.driver.synchronize()
    }

    /// How many launches of kernel `name` took its generic and its aligned binary since the
    /// device was opened (launches recorded into a graph count once, when recorded).
    pub fn variant_launches(&self, name: &str) -> Option<VariantLaunches> {
        self.by_name.get(name).map(|&i| self.variant_launches[i])
    }

    /// Launches kernel `name` over `grid` with `args` on the main stream, checked against the
    /// manifest: the kernel must exist, the arguments must match its parameters in number and
    /// kind, and no grid dimension may be zero or over the hardware's limits. The aligned
    /// binary runs when the kernel has one and every argument it assumes divisible by 16 is;
    /// the generic one otherwise.
    pub fn launch(&mut self, name: &str, grid: [u32; 3], args: &[KernelArg]) -> Result<()> {
        self.launch_on(Stream::MAIN, name, grid, args)
    }

    /// [`Gpu::launch`] with each argument named as the kernel's parameter (`x_ptr`, `n_cols`):
    /// the names must be the manifest's, in its order, so an argument out of place is an error
    /// naming it rather than a wrong result.
    pub fn launch_named(
        &mut self,
        name: &str,
        grid: [u32; 3],
        args: &[(&str, KernelArg)],
    ) -> Result<()> {
        let index = *self
            .by_name
            .get(name)
            .ok_or_else(|| RuntimeError::Kernels(format!("no kernel named {name}")))?;
        let params = &self.kernels[index].spec.params;
        let named = |i: usize| args.get(i).map(|a| a.0);
        let built = |i: usize| params.get(i).map(|p| p.0.as_str());
        if let Some(i) = (0..args.len().max(params.len())).find(|&i| named(i) != built(i)) {
            return Err(RuntimeError::Kernels(format!(
                "kernel {name}: argument {i} is {} in the launch and {} in the build",
                named(i).unwrap_or("missing"),
                built(i).unwrap_or("missing"),
            )));
        }
        let values: Vec<KernelArg> = args.iter().map(|a| a.1).collect();
        self.launch_on(Stream::MAIN, name, grid, &values)
    }

    /// [`Gpu::launch`] on `stream`.
    pub fn launch_on(
        &mut self,
        stream: Stream,
        name: &str,
        grid: [u32; 3],
        args: &[KernelArg],
    ) -> Result<()> {
        let index = *self
            .by_name
            .get(name)
            .ok_or_else(|| RuntimeError::Kernels(format!("no kernel named {name}")))?;
        let k = &self.kernels[index];
        if args.len() != k.kinds.len() {
            return Err(RuntimeError::Kernels(format!(
                "kernel {name} takes {} arguments, got {}",
                k.kinds.len(),
                args.len()
            )));
        }
        for (i, (arg, kind)) in args.iter().zip(&k.kinds).enumerate() {
            if arg.kind() != *kind {
                return Err(RuntimeError::Kernels(format!(
                    "kernel {name}: argument {} ({}) must be {:?}, got {arg:?}",
                    i, k.spec.params[i].0, kind
                )));
            }
        }
        if grid.contains(&0) || grid[1] > 65_535 || grid[2] > 65_535 || grid[0] > i32::MAX as u32 {
            return Err(RuntimeError::Kernels(format!(
                "kernel {name}: grid {grid:?} is empty or over the device's limits"
            )));
        }
        let (binary, variant) = match &k.aligned {
            Some((aligned, hinted)) if qualifies(args, hinted) => (*aligned, Variant::Aligned),
            _ => (k.generic, Variant::Generic),
        };
        let (handle, block, shared) = (binary.handle, k.block, binary.shared);
        let programs = grid.iter().map(|&g| g as usize).product::<usize>();
        let scratch = binary.global_scratch as usize * programs;
        self.may_issue(stream, &format!("kernel {name}"))?;
        let dims = LaunchDims {
            grid,
            block,
            shared,
            scratch: self.scratch(scratch)?,
        };
        let op = Op::Launch {
            kernel: handle,
            dims,
            args: args.to_vec(),
        };
        self.issue(op, stream)?;
        let count = &mut self.variant_launches[index];
        match variant {
            Variant::Generic => count.generic += 1,
            Variant::Aligned => count.aligned += 1,
        }
        Ok(())
    }

    /// Whether `what` may be issued on `stream` now: while a capture is open, only the
    /// capturing thread's work on the main stream (which the capture records).
    pub(super) fn may_issue(&self, stream: Stream, what: &str) -> Result<()> {
        match self.capturing {
            Some(t) if t != std::thread::current().id() => Err(RuntimeError::Kernels(format!(
                "{what}: another thread is capturing a graph on this device"
            ))),
            Some(_) if stream != Stream::MAIN => Err(RuntimeError::Kernels(format!(
                "{what} on a side stream while a graph is being captured (a capture records \
                 the main stream only)"
            ))),
            _ => Ok(()),
        }
    }

    /// Issues `op` on `stream`, keeping a copy while a capture is open.
    pub(super) fn issue(&mut self, op: Op, stream: Stream) -> Result<()> {
        self.driver.issue(&op, stream.0)?;
        if self.capturing.is_some() {
            self.shadow.push(op);
        }
        Ok(())
    }

    /// The kernels' global scratch area's address (null before any kernel needed one): a
    /// captured graph holds it.
    pub fn scratch_ptr(&self) -> DevicePtr {
        self.scratch.map_or(DevicePtr::NULL, |(p, _)| p)
    }

    /// A global scratch area of at least `bytes` (null when none is needed), grown on demand
    /// (never inside a capture: the graph would keep the old address).
    fn scratch(&mut self, bytes: usize) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        if let Some((ptr, len)) = self.scratch {
            if len >= bytes {
                return Ok(ptr);
            }
            self.not_capturing("growing the kernels' scratch area")?;
            self.driver.synchronize()?;
            self.driver.free(ptr)?;
            self.scratch = None;
        }
        self.not_capturing("allocating the kernels' scratch area")?;
        let ptr = self.driver.alloc(bytes)?;
        self.scratch = Some((ptr, bytes));
        Ok(ptr)
    }

    pub(super) fn not_capturing(&self, what: &str) -> Result<()> {
        if self.capturing.is_some() {
            return Err(RuntimeError::Kernels(format!(
                "{what} while a graph is being captured (a capture holds launches only)"
            )));
        }
        Ok(())
    }

    /// Starts capturing on the calling thread: the launches, device copies ([`Gpu::copy`]) and
    /// vendor products ([`Gpu::gemm`]) it issues on the main stream until [`Gpu::end_capture`]
    /// are recorded into a graph instead of running. Between the two, allocating, freeing,
    /// host copies, events, side streams and waiting are errors, and so is other threads'
    /// work; the graph keeps every address and argument as issued, so what it reads and writes
    /// must stay where it is for as long as the graph is replayed. A capture ends on the
    /// thread that began it.
    pub fn begin_capture(&mut self) -> Result<()> {
        self.not_capturing("starting a capture")?;
        self.driver.capture_begin()?;
        self.capturing = Some(std::thread::current().id());
        self.shadow.clear();
        Ok(())
    }

    /// Ends the capture: the recorded operations as one graph, or `None` when the driver could
    /// not make one (instantiation out of memory, say), in which case they have been issued
    /// plainly instead, so their results come all the same.
    pub fn end_capture(&mut self) -> Result<Option<GraphId>> {
        if self.capturing.take().is_none() {
            return Err(RuntimeError::Kernels("no capture to end".into()));
        }
        let shadow = std::mem::take(&mut self.shadow);
        match self.driver.capture_end() {
            Ok(id) => Ok(Some(GraphId(id))),
            Err(_) => {
                for op in &shadow {
                    self.driver.issue(op, MAIN_STREAM)?;
                }
                Ok(None)
            }
        }
    }

    /// Abandons an open capture, if any (a launch inside it failed); no graph is kept.
    pub fn abort_capture(&mut self) {
        if self.capturing.take().is_some() {
            self.shadow.clear();
            self.driver.capture_abort();
        }
    }

    /// Whether a capture is open.
    pub fn is_capturing(&self) -> bool {
        self.capturing.is_some()
    }

    /// Issues every operation of `graph` on the main stream, in capture order, after all
    /// earlier work there.
    pub fn replay(&mut self, graph: GraphId) -> Result<()> {
        self.not_capturing("replaying a graph")?;
        self.driver.graph_launch(graph.0)
    }

    /// Frees `graph`.
    pub fn drop_graph(&mut self, graph: GraphId) -> Result<()> {
        self.not_capturing("freeing a graph")?;
        self.driver.graph_drop(graph.0)
    }

    /// Times every launch (and graph replay) on the device from now on, or stops; each call
    /// starts a new tally. The interpreted device times its launches on the host clock.
    pub fn set_profiling(&mut self, on: bool) -> Result<()> {
        self.not_capturing("turning profiling on or off")?;
        self.driver.set_profiling(on)
    }

    /// The kernel and variant a driver handle belongs to, for the profile.
    fn binary_of(&self, h: KernelHandle) -> (String, Variant) {
        if h == GRAPH_HANDLE {
            return ("graph replay".to_string(), Variant::Generic);
        }
        if h == GEMM_HANDLE {
            let library = self.gemm_library.as_deref().unwrap_or("vendor");
            return (format!("{library} product"), Variant::Generic);
        }
        for k in &self.kernels {
            if k.generic.handle == h {
                return (k.spec.name.clone(), Variant::Generic);
            }
            if k.aligned.as_ref().is_some_and(|(a, _)| a.handle == h) {
                return (k.spec.name.clone(), Variant::Aligned);
            }
        }
        (format!("kernel #{}", h.0), Variant::Generic)
    }

    /// The device time per kernel and grid since [`Gpu::set_profiling`], largest first (waits
    /// for the device).
    pub fn profile(&mut self) -> Result<Vec<KernelTime>> {
        self.not_capturing("reading the profile")?;
        let mut out: Vec<KernelTime> = self
            .driver
            .profile()?
            .into_iter()
            .map(|(h, grid, launches, total_ms)| {
                let (name, variant) = self.binary_of(h);
                KernelTime {
                    name,
                    variant,
                    grid,
                    launches,
                    total_ms,
                }
            })
            .collect();
        out.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
        Ok(out)
    }
}
