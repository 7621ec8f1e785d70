//! The interpreted device: buffers in a worker process's host memory, launches run by the
//! Triton interpreter and vendor products by numpy under cuBLASLt's layout rules
//! (`kernels/ferrum_kernels/worker.py`).
//!
//! The worker gets exactly what the CUDA driver would: the kernel's spec from the embedded
//! manifest at load, then per launch the grid and the arguments the Rust code computed, with
//! device pointers as addresses in its memory; per vendor product the column-major call a
//! GPU's cuBLASLt gets. Protocol over the worker's stdin and stdout: one JSON line per request
//! ([`Request`]) and per reply, raw bytes after a `write` request and after a `read` reply. A
//! reply `{"error": ...}` becomes an error naming the operation; a worker that dies is an error
//! too, never a hang (its pipes close).
//!
//! Streams ([`Queues`]): the main stream's work runs when issued; every other stream's work
//! waits in its queue until something needs it (an event wait or query, a host wait, a
//! synchronize, a free), then runs up to that point. Work thus runs as late as CUDA allows,
//! so a missing event shows up in CI as a read of bytes not yet (or no longer) there. Host
//! buffers are this process's memory: a queued copy reads or fills them when it runs.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use super::gemm::{GemmSupport, LtMatmul};
use super::gpu::{DevicePtr, KernelArg};
use super::manifest::{KernelBinary, KernelSpec, Variant};
use super::ops::{
    gemm_grid, Driver, KernelHandle, Op, Tally, GEMM_HANDLE, GRAPH_HANDLE, MAIN_STREAM,
};
use crate::{Result, RuntimeError};

/// Where the interpreter and the kernel sources are.
#[derive(Debug, Clone)]
pub struct InterpreterConfig {
    /// A Python with the pinned Triton and numpy (`kernels/requirements.txt`).
    pub python: PathBuf,
    /// The `kernels/` folder of the source tree.
    pub kernels_dir: PathBuf,
    /// Whether the worker stands in for cuBLASLt ([`InterpretedGemm`]).
    pub gemm: InterpretedGemm,
}

/// What the interpreted device answers for vendor products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterpretedGemm {
    /// Runs them in numpy under cuBLASLt's rules (the default).
    StandIn,
    /// Has no library (`FERRUM_INTERPRETED_GEMM=none`): opening it fails, as on a machine
    /// without cuBLASLt.
    Missing,
    /// Opens, but takes no product (`FERRUM_INTERPRETED_GEMM=unsupported`), as when no
    /// algorithm fits a shape: every product falls back.
    Unsupported,
}

impl InterpreterConfig {
    /// `FERRUM_TRITON_PYTHON` and `FERRUM_KERNELS_DIR`, defaulting to the source tree this
    /// crate was built from (`target/triton-venv/bin/python`, made by
    /// `scripts/test-cuda-interpret.sh`, and `kernels/`); `FERRUM_INTERPRETED_GEMM`
    /// (`none`, `unsupported`; anything else: the stand-in).
    pub fn from_env() -> InterpreterConfig {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        InterpreterConfig {
            python: std::env::var_os("FERRUM_TRITON_PYTHON")
                .map(PathBuf::from)
                .unwrap_or_else(|| root.join("target/triton-venv/bin/python")),
            kernels_dir: std::env::var_os("FERRUM_KERNELS_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| root.join("kernels")),
            gemm: match std::env::var("FERRUM_INTERPRETED_GEMM").as_deref() {
                Ok("none") => InterpretedGemm::Missing,
                Ok("unsupported") => InterpretedGemm::Unsupported,
                _ => InterpretedGemm::StandIn,
            },
        }
    }

    /// Whether the interpreter's Python exists.
    pub fn is_available(&self) -> bool {
        self.python.is_file() && self.kernels_dir.join("ferrum_kernels/worker.py").is_file()
    }
}

/// Launches and milliseconds by (kernel handle, grid).
type Totals = HashMap<(usize, [u32; 3]), (u64, f64)>;

/// One request to the worker (`kernels/ferrum_kernels/worker.py` documents each).
#[derive(Debug, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request<'a> {
    Hello,
    Alloc {
        bytes: usize,
    },
    Free {
        ptr: u64,
    },
    /// Followed by `bytes` raw bytes.
    Write {
        ptr: u64,
        bytes: usize,
    },
    /// Answered by `bytes` raw bytes after the reply line.
    Read {
        ptr: u64,
        bytes: usize,
    },
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
    Load {
        name: &'a str,
        variant: &'a str,
        module: &'a str,
        function: &'a str,
        params: &'a [(String, String)],
        constexprs: &'a std::collections::BTreeMap<String, i64>,
        hints: &'a [String],
    },
    Launch {
        handle: usize,
        grid: [u32; 3],
        args: Vec<ArgValue>,
    },
    GemmOpen,
    GemmSupport(&'a LtMatmul),
    Gemm(&'a LtMatmul),
}

/// A launch argument as the worker reads it: a number.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum ArgValue {
    Ptr(u64),
    I32(i32),
    U32(u32),
    F32(f32),
}

/// Work waiting on a side stream.
#[derive(Debug)]
enum Queued {
    Op(Op),
    ToHost {
        host: usize,
        offset: usize,
        src: DevicePtr,
        bytes: usize,
    },
    FromHost {
        dst: DevicePtr,
        host: usize,
        offset: usize,
        bytes: usize,
    },
    /// Completes `event`'s record number `generation`.
    Record {
        event: usize,
        generation: u64,
    },
    /// Holds the stream until `event`'s record number `generation` has completed.
    Wait {
        event: usize,
        generation: u64,
    },
}

/// An event: how many times it was recorded, and the latest record that completed.
#[derive(Debug, Default, Clone, Copy)]
struct EventState {
    recorded: u64,
    done: u64,
}

/// A running worker.
#[derive(Debug)]
pub(crate) struct InterpretedDriver {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The main stream's operations of the open capture, recorded instead of run.
    recording: Option<Vec<Op>>,
    /// Captured graphs by id: their operations, replayed in order; `None` once freed.
    graphs: Vec<Option<Vec<Op>>>,
    /// Per-operation timing when on ([`Driver::set_profiling`]): launches and milliseconds by
    /// (handle, grid), graph replays under [`GRAPH_HANDLE`] and vendor products under
    /// [`GEMM_HANDLE`] as on a GPU. The worker runs an operation before it replies, so its
    /// time is its request's round trip: the interpreter's time, which says nothing of a
    /// GPU's, through every path a GPU profile takes (a GPU round's script is tested with it).
    profile: Option<Totals>,
    /// Side streams' queued work by stream; the main stream's (index 0) is always empty.
    /// Handles are never reused, so a stale one is an error, not another stream.
    streams: Vec<Option<std::collections::VecDeque<Queued>>>,
    events: Vec<Option<EventState>>,
    /// Host buffers by handle (this process's memory).
    hosts: Vec<Option<Vec<u8>>>,
    gemm: InterpretedGemm,
}

/// One recorded launch's arguments as the worker reads them.
fn arg_values(args: &[KernelArg]) -> Vec<ArgValue> {
    args.iter()
        .map(|a| match *a {
            KernelArg::Ptr(p) => ArgValue::Ptr(p.0),
            KernelArg::I32(v) => ArgValue::I32(v),
            KernelArg::U32(v) => ArgValue::U32(v),
            KernelArg::F32(v) => ArgValue::F32(v),
        })
        .collect()
}

fn worker_err(step: &str, detail: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Cuda {
        step: format!("interpreted device: {step}"),
        detail: detail.to_string(),
    }
}

impl InterpretedDriver {
    pub(crate) fn start(config: &InterpreterConfig) -> Result<InterpretedDriver> {
        if !config.is_available() {
            return Err(worker_err(
                "starting the worker",
                format!(
                    "{} or {} is missing (bash scripts/test-cuda-interpret.sh makes the venv)",
                    config.python.display(),
                    config
                        .kernels_dir
                        .join("ferrum_kernels/worker.py")
                        .display()
                ),
            ));
        }
        let mut child = Command::new(&config.python)
            .arg("-m")
            .arg("ferrum_kernels.worker")
            .current_dir(&config.kernels_dir)
            .env("TRITON_INTERPRET", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| worker_err("starting the worker", e))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(worker_err("starting the worker", "no pipes"));
        };
        let mut driver = InterpretedDriver {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            recording: None,
            graphs: Vec::new(),
            profile: None,
            streams: vec![Some(Default::default())],
            events: Vec::new(),
            hosts: Vec::new(),
            gemm: config.gemm,
        };
        driver.call("hello", &Request::Hello, None)?;
        Ok(driver)
    }

    /// Sends one request (and its payload), returns the reply.
    fn call(&mut self, step: &str, req: &Request<'_>, payload: Option<&[u8]>) -> Result<Value> {
        let mut line = serde_json::to_vec(req).map_err(|e| worker_err(step, e))?;
        line.push(b'\n');
        self.stdin
            .write_all(&line)
            .and_then(|_| payload.map_or(Ok(()), |p| self.stdin.write_all(p)))
            .and_then(|_| self.stdin.flush())
            .map_err(|e| worker_err(step, format!("the worker is gone ({e})")))?;
        let mut reply = String::new();
        let n = self
            .stdout
            .read_line(&mut reply)
            .map_err(|e| worker_err(step, e))?;
        if n == 0 {
            return Err(worker_err(step, "the worker exited (see its stderr above)"));
        }
        let v: Value = serde_json::from_str(&reply).map_err(|e| worker_err(step, e))?;
        if let Some(e) = v.get("error") {
            return Err(worker_err(step, e.as_str().unwrap_or("unknown error")));
        }
        Ok(v)
    }

    /// Runs one operation in the worker (it replies once the operation has run).
    fn run(&mut self, op: &Op) -> Result<()> {
        let start = Instant::now();
        match op {
            Op::Launch { kernel, dims, args } => {
                let req = Request::Launch {
                    handle: kernel.0,
                    grid: dims.grid,
                    args: arg_values(args),
                };
                self.call("launch", &req, None)?;
                self.tally(kernel.0, dims.grid, start);
            }
            Op::Copy { dst, src, bytes } => {
                let req = Request::Copy {
                    dst: dst.0,
                    src: src.0,
                    bytes: *bytes,
                };
                self.call("a device copy", &req, None)?;
            }
            Op::Gemm(call) => {
                self.call("a vendor product", &Request::Gemm(call), None)?;
                self.tally(GEMM_HANDLE.0, gemm_grid(call), start);
            }
        }
        Ok(())
    }

    /// Counts an operation (or replay) of `handle` over `grid` begun at `start`, when
    /// profiling.
    fn tally(&mut self, handle: usize, grid: [u32; 3], start: Instant) {
        if let Some(totals) = self.profile.as_mut() {
            let e = totals.entry((handle, grid)).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += start.elapsed().as_secs_f64() * 1e3;
        }
    }

    fn queue(&mut self, stream: usize) -> Result<&mut std::collections::VecDeque<Queued>> {
        self.streams
            .get_mut(stream)
            .and_then(Option::as_mut)
            .ok_or_else(|| worker_err("a stream operation", format!("no stream {stream}")))
    }

    fn event(&mut self, event: usize) -> Result<&mut EventState> {
        self.events
            .get_mut(event)
            .and_then(Option::as_mut)
            .ok_or_else(|| worker_err("an event operation", format!("no event {event}")))
    }

    /// Issues `work` on `stream`: at once on the main stream, queued on another.
    fn enqueue(&mut self, stream: usize, work: Queued) -> Result<()> {
        if stream == MAIN_STREAM {
            self.queue(stream)?;
            return self.execute(work);
        }
        self.queue(stream)?.push_back(work);
        Ok(())
    }

    fn execute(&mut self, work: Queued) -> Result<()> {
        match work {
            Queued::Op(op) => self.run(&op),
            Queued::ToHost {
                host,
                offset,
                src,
                bytes,
            } => {
                let mut staged = vec![0u8; bytes];
                self.read(src, &mut staged)?;
                self.host_slice(host, offset, bytes)?
                    .copy_from_slice(&staged);
                Ok(())
            }
            Queued::FromHost {
                dst,
                host,
                offset,
                bytes,
            } => {
                let staged = self.host_slice(host, offset, bytes)?.to_vec();
                self.write(dst, &staged)
            }
            Queued::Record { event, generation } => {
                // A destroyed event's record completes nothing.
                if let Some(Some(e)) = self.events.get_mut(event) {
                    e.done = e.done.max(generation);
                }
                Ok(())
            }
            Queued::Wait { event, generation } => self.complete(event, generation),
        }
    }

    /// Runs the streams until `event`'s record number `generation` has completed: the
    /// stream it waits in runs up to and through it.
    fn complete(&mut self, event: usize, generation: u64) -> Result<()> {
        loop {
            if let Some(Some(e)) = self.events.get(event) {
                if e.done >= generation {
                    return Ok(());
                }
            }
            let holder = self.streams.iter().position(|q| {
                q.as_ref().is_some_and(|q| {
                    q.iter().any(|w| {
                        matches!(w, Queued::Record { event: e, generation: g }
                            if *e == event && *g == generation)
                    })
                })
            });
            let Some(stream) = holder else {
                // Its stream ran it already (a destroyed event's record leaves no mark).
                return Ok(());
            };
            // Run that stream's work through the record.
            while let Some(work) = self.queue(stream)?.pop_front() {
                let is_it = matches!(work, Queued::Record { event: e, generation: g }
                    if e == event && g == generation);
                self.execute(work)?;
                if is_it {
                    break;
                }
            }
        }
    }

    /// Runs all of `stream`'s queued work.
    fn flush(&mut self, stream: usize) -> Result<()> {
        while let Some(work) = self.queue(stream)?.pop_front() {
            self.execute(work)?;
        }
        Ok(())
    }

    fn host_slice(&mut self, host: usize, offset: usize, bytes: usize) -> Result<&mut [u8]> {
        let buf = self
            .hosts
            .get_mut(host)
            .and_then(Option::as_mut)
            .ok_or_else(|| worker_err("a host copy", format!("no host buffer {host}")))?;
        let len = buf.len();
        buf.get_mut(offset..offset.saturating_add(bytes))
            .ok_or_else(|| {
                worker_err(
                    "a host copy",
                    format!("{bytes} bytes at {offset} of a {len}-byte host buffer"),
                )
            })
    }
}

impl Driver for InterpretedDriver {
    fn describe(&self) -> String {
        "interpreted (Triton interpreter on the host)".to_string()
    }

    fn arch(&self) -> Option<&str> {
        None
    }

    fn multiprocessors(&self) -> usize {
        132
    }

    fn alloc(&mut self, bytes: usize) -> Result<DevicePtr> {
        let step = format!("allocating {bytes} bytes");
        let v = self.call(&step, &Request::Alloc { bytes }, None)?;
        v.get("ptr")
            .and_then(Value::as_u64)
            .map(DevicePtr)
            .ok_or_else(|| worker_err("alloc", "reply has no pointer"))
    }

    fn free(&mut self, ptr: DevicePtr) -> Result<()> {
        // As on a GPU, after the work issued before on every stream.
        self.synchronize()?;
        self.call("free", &Request::Free { ptr: ptr.0 }, None)
            .map(drop)
    }

    fn write(&mut self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        let req = Request::Write {
            ptr: dst.0,
            bytes: src.len(),
        };
        self.call("write", &req, Some(src)).map(drop)
    }

    fn read(&mut self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        let req = Request::Read {
            ptr: src.0,
            bytes: dst.len(),
        };
        self.call("read", &req, None)?;
        self.stdout
            .read_exact(dst)
            .map_err(|e| worker_err("read", e))
    }

    fn load(
        &mut self,
        spec: &KernelSpec,
        variant: Variant,
        _image: Option<(&KernelBinary, &[u8])>,
    ) -> Result<KernelHandle> {
        // The interpreter runs the source either way; an aligned variant's hints are checked
        // at each of its launches, as its compiled binary would assume them.
        let hints: &[String] = match (variant, &spec.aligned) {
            (Variant::Aligned, Some(a)) => &a.hints,
            _ => &[],
        };
        let req = Request::Load {
            name: &spec.name,
            variant: variant.as_str(),
            module: &spec.module,
            function: &spec.function,
            params: &spec.params,
            constexprs: &spec.constexprs,
            hints,
        };
        let v = self.call(&format!("loading kernel {}", spec.name), &req, None)?;
        v.get("handle")
            .and_then(Value::as_u64)
            .map(|h| KernelHandle(h as usize))
            .ok_or_else(|| worker_err("load", "reply has no handle"))
    }

    fn issue(&mut self, op: &Op, stream: usize) -> Result<()> {
        if stream == MAIN_STREAM {
            if let Some(r) = self.recording.as_mut() {
                r.push(op.clone());
                return Ok(());
            }
        }
        self.enqueue(stream, Queued::Op(op.clone()))
    }

    fn synchronize(&mut self) -> Result<()> {
        for stream in 0..self.streams.len() {
            if self.streams[stream].is_some() {
                self.flush(stream)?;
            }
        }
        Ok(())
    }

    fn memory_info(&mut self) -> Result<Option<(usize, usize)>> {
        Ok(None)
    }

    fn stream_create(&mut self) -> Result<usize> {
        self.streams.push(Some(Default::default()));
        Ok(self.streams.len() - 1)
    }

    fn stream_destroy(&mut self, stream: usize) -> Result<()> {
        self.flush(stream)?;
        self.streams[stream] = None;
        Ok(())
    }

    fn event_create(&mut self) -> Result<usize> {
        self.events.push(Some(EventState::default()));
        Ok(self.events.len() - 1)
    }

    fn event_destroy(&mut self, event: usize) -> Result<()> {
        self.event(event)?;
        self.events[event] = None;
        Ok(())
    }

    fn event_record(&mut self, event: usize, stream: usize) -> Result<()> {
        self.queue(stream)?;
        let e = self.event(event)?;
        e.recorded += 1;
        let generation = e.recorded;
        self.enqueue(stream, Queued::Record { event, generation })
    }

    fn stream_wait(&mut self, stream: usize, event: usize) -> Result<()> {
        self.queue(stream)?;
        let e = *self.event(event)?;
        if e.done >= e.recorded {
            return Ok(());
        }
        let wait = Queued::Wait {
            event,
            generation: e.recorded,
        };
        self.enqueue(stream, wait)
    }

    fn event_synchronize(&mut self, event: usize) -> Result<()> {
        let e = *self.event(event)?;
        self.complete(event, e.recorded)
    }

    fn event_query(&mut self, event: usize) -> Result<bool> {
        let e = *self.event(event)?;
        if e.done >= e.recorded {
            return Ok(true);
        }
        // Not yet: the query moves the work along, so a caller that polls gets there.
        self.complete(event, e.recorded)?;
        Ok(false)
    }

    fn host_alloc(&mut self, bytes: usize) -> Result<usize> {
        self.hosts.push(Some(vec![0u8; bytes]));
        Ok(self.hosts.len() - 1)
    }

    fn host_free(&mut self, host: usize) -> Result<()> {
        match self.hosts.get_mut(host) {
            Some(h @ Some(_)) => {
                *h = None;
                Ok(())
            }
            _ => Err(worker_err(
                "freeing host memory",
                format!("no host buffer {host}"),
            )),
        }
    }

    fn copy_to_host(
        &mut self,
        host: usize,
        offset: usize,
        src: DevicePtr,
        bytes: usize,
        stream: usize,
    ) -> Result<()> {
        self.host_slice(host, offset, bytes)?;
        let work = Queued::ToHost {
            host,
            offset,
            src,
            bytes,
        };
        self.enqueue(stream, work)
    }

    fn copy_from_host(
        &mut self,
        dst: DevicePtr,
        host: usize,
        offset: usize,
        bytes: usize,
        stream: usize,
    ) -> Result<()> {
        self.host_slice(host, offset, bytes)?;
        let work = Queued::FromHost {
            dst,
            host,
            offset,
            bytes,
        };
        self.enqueue(stream, work)
    }

    fn host_bytes(&mut self, host: usize) -> Result<&mut [u8]> {
        let len = self
            .hosts
            .get(host)
            .and_then(Option::as_ref)
            .map_or(0, Vec::len);
        self.host_slice(host, 0, len)
    }

    fn gemm_open(&mut self, path: Option<&std::path::Path>) -> Result<String> {
        if self.gemm == InterpretedGemm::Missing {
            return Err(worker_err(
                "opening cuBLASLt",
                "no library (the interpreted device was started with FERRUM_INTERPRETED_GEMM=none)",
            ));
        }
        let v = self.call("opening cuBLASLt", &Request::GemmOpen, None)?;
        let what = v
            .get("library")
            .and_then(Value::as_str)
            .unwrap_or("the numpy stand-in")
            .to_string();
        Ok(match path {
            Some(p) => format!(
                "{what} (not {}: the interpreted device loads no library)",
                p.display()
            ),
            None => what,
        })
    }

    fn gemm_support(&mut self, call: &LtMatmul) -> Result<GemmSupport> {
        if self.gemm == InterpretedGemm::Unsupported {
            return Ok(GemmSupport::Unsupported(
                "the interpreted device takes no product (FERRUM_INTERPRETED_GEMM=unsupported)"
                    .into(),
            ));
        }
        let v = self.call("asking cuBLASLt", &Request::GemmSupport(call), None)?;
        Ok(match v.get("unsupported").and_then(Value::as_str) {
            Some(why) => GemmSupport::Unsupported(why.to_string()),
            None => GemmSupport::Supported,
        })
    }

    fn capture_begin(&mut self) -> Result<()> {
        self.recording = Some(Vec::new());
        Ok(())
    }

    fn capture_end(&mut self) -> Result<usize> {
        let ops = self
            .recording
            .take()
            .ok_or_else(|| worker_err("ending a capture", "no capture is open"))?;
        self.graphs.push(Some(ops));
        Ok(self.graphs.len() - 1)
    }

    fn capture_abort(&mut self) {
        self.recording = None;
    }

    fn graph_launch(&mut self, id: usize) -> Result<()> {
        let ops = self
            .graphs
            .get_mut(id)
            .and_then(Option::take)
            .ok_or_else(|| worker_err("replaying a graph", format!("no graph {id}")))?;
        // One entry for the whole replay, as a GPU's profile has: the operations inside are
        // not tallied one by one.
        let start = Instant::now();
        let profile = self.profile.take();
        let result = ops.iter().try_for_each(|op| self.run(op));
        self.profile = profile;
        self.graphs[id] = Some(ops);
        result?;
        self.tally(GRAPH_HANDLE.0, [1, 1, 1], start);
        Ok(())
    }

    fn graph_drop(&mut self, id: usize) -> Result<()> {
        if let Some(g) = self.graphs.get_mut(id) {
            *g = None;
        }
        Ok(())
    }

    fn set_profiling(&mut self, on: bool) -> Result<()> {
        self.profile = on.then(HashMap::new);
        Ok(())
    }

    fn profile(&mut self) -> Result<Vec<Tally>> {
        self.synchronize()?;
        let totals = self
            .profile
            .as_ref()
            .ok_or_else(|| RuntimeError::Kernels("profiling is off (Gpu::set_profiling)".into()))?;
        Ok(totals
            .iter()
            .map(|(&(h, grid), &(n, ms))| (KernelHandle(h), grid, n, ms))
            .collect())
    }
}

impl Drop for InterpretedDriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
