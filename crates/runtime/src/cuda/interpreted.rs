//! The interpreted device: buffers in a worker process's host memory, launches run by the
//! Triton interpreter (`kernels/ferrum_kernels/worker.py`).
//!
//! The worker gets exactly what the CUDA driver would: the kernel's spec from the embedded
//! manifest at load, then per launch the grid and the arguments the Rust code computed, with
//! device pointers as addresses in its memory. Protocol over the worker's stdin and stdout:
//! one JSON line per request and per reply, raw bytes after a `write` request and after a
//! `read` reply. A reply `{"error": ...}` becomes an error naming the operation; a worker that
//! dies is an error too, never a hang (its pipes close).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use serde_json::{json, Value};

use super::gpu::{DevicePtr, Driver, KernelArg, KernelHandle, LaunchDims, Tally, GRAPH_HANDLE};
use super::manifest::{KernelBinary, KernelSpec, Variant};
use crate::{Result, RuntimeError};

/// Where the interpreter and the kernel sources are.
#[derive(Debug, Clone)]
pub struct InterpreterConfig {
    /// A Python with the pinned Triton and numpy (`kernels/requirements.txt`).
    pub python: PathBuf,
    /// The `kernels/` folder of the source tree.
    pub kernels_dir: PathBuf,
}

impl InterpreterConfig {
    /// `FERRUM_TRITON_PYTHON` and `FERRUM_KERNELS_DIR`, defaulting to the source tree this
    /// crate was built from (`target/triton-venv/bin/python`, made by
    /// `scripts/test-cuda-interpret.sh`, and `kernels/`).
    pub fn from_env() -> InterpreterConfig {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        InterpreterConfig {
            python: std::env::var_os("FERRUM_TRITON_PYTHON")
                .map(PathBuf::from)
                .unwrap_or_else(|| root.join("target/triton-venv/bin/python")),
            kernels_dir: std::env::var_os("FERRUM_KERNELS_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| root.join("kernels")),
        }
    }

    /// Whether the interpreter's Python exists.
    pub fn is_available(&self) -> bool {
        self.python.is_file() && self.kernels_dir.join("ferrum_kernels/worker.py").is_file()
    }
}

/// Launches and milliseconds by (kernel handle, grid).
type Totals = HashMap<(usize, [u32; 3]), (u64, f64)>;

/// A running worker.
#[derive(Debug)]
pub(crate) struct InterpretedDriver {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The launches of the open capture, recorded instead of run.
    recording: Option<Vec<Recorded>>,
    /// Captured graphs by id: their launch lists, replayed in order; `None` once freed.
    graphs: Vec<Option<Vec<Recorded>>>,
    /// Reads started and not finished, by slot: the worker runs every operation in order
    /// at once, so a started read's bytes are already here; `None` once finished.
    reads: Vec<Option<Vec<u8>>>,
    /// Per-launch timing when on ([`Driver::set_profiling`]): launches and milliseconds by
    /// (handle, grid), graph replays under [`GRAPH_HANDLE`] as on a GPU. The worker runs a
    /// launch before it replies, so a launch's time is its request's round trip: the
    /// interpreter's time, which says nothing of a GPU's, through every path a GPU profile
    /// takes (a GPU round's script is tested with it).
    profile: Option<Totals>,
}

/// One recorded launch: what [`Driver::launch`] was given.
#[derive(Debug, Clone)]
struct Recorded {
    kernel: KernelHandle,
    dims: LaunchDims,
    args: Vec<KernelArg>,
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
            reads: Vec::new(),
            profile: None,
        };
        driver.call("hello", &json!({"op": "hello"}), None)?;
        Ok(driver)
    }

    /// Sends one request (and its payload), returns the reply.
    fn call(&mut self, step: &str, req: &Value, payload: Option<&[u8]>) -> Result<Value> {
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
}

impl InterpretedDriver {
    /// Runs one launch in the worker (it replies once the launch has run).
    fn run(&mut self, kernel: KernelHandle, dims: LaunchDims, args: &[KernelArg]) -> Result<()> {
        let args: Vec<Value> = args
            .iter()
            .map(|a| match *a {
                KernelArg::Ptr(p) => json!(p.0),
                KernelArg::I32(v) => json!(v),
                KernelArg::U32(v) => json!(v),
                KernelArg::F32(v) => json!(v),
            })
            .collect();
        let req = json!({"op": "launch", "handle": kernel.0, "grid": dims.grid, "args": args});
        self.call("launch", &req, None).map(drop)
    }

    /// Counts a launch (or replay) of `handle` over `grid` begun at `start`, when profiling.
    fn tally(&mut self, handle: usize, grid: [u32; 3], start: Instant) {
        if let Some(totals) = self.profile.as_mut() {
            let e = totals.entry((handle, grid)).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += start.elapsed().as_secs_f64() * 1e3;
        }
    }
}

impl Driver for InterpretedDriver {
    fn describe(&self) -> String {
        "interpreted (Triton interpreter on the host)".to_string()
    }

    fn arch(&self) -> Option<&str> {
        None
    }

    fn alloc(&mut self, bytes: usize) -> Result<DevicePtr> {
        let step = format!("allocating {bytes} bytes");
        let v = self.call(&step, &json!({"op": "alloc", "bytes": bytes}), None)?;
        v.get("ptr")
            .and_then(Value::as_u64)
            .map(DevicePtr)
            .ok_or_else(|| worker_err("alloc", "reply has no pointer"))
    }

    fn free(&mut self, ptr: DevicePtr) -> Result<()> {
        self.call("free", &json!({"op": "free", "ptr": ptr.0}), None)
            .map(drop)
    }

    fn write(&mut self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        let req = json!({"op": "write", "ptr": dst.0, "bytes": src.len()});
        self.call("write", &req, Some(src)).map(drop)
    }

    fn read(&mut self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        let req = json!({"op": "read", "ptr": src.0, "bytes": dst.len()});
        self.call("read", &req, None)?;
        self.stdout
            .read_exact(dst)
            .map_err(|e| worker_err("read", e))
    }

    fn read_start(&mut self, src: DevicePtr, bytes: usize) -> Result<usize> {
        let mut staged = vec![0u8; bytes];
        self.read(src, &mut staged)?;
        let slot = match self.reads.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.reads.push(None);
                self.reads.len() - 1
            }
        };
        self.reads[slot] = Some(staged);
        Ok(slot)
    }

    fn read_finish(&mut self, slot: usize, dst: &mut [u8]) -> Result<()> {
        let staged = self
            .reads
            .get_mut(slot)
            .and_then(Option::take)
            .ok_or_else(|| worker_err("finishing a read", format!("no read in slot {slot}")))?;
        if staged.len() != dst.len() {
            return Err(worker_err(
                "finishing a read",
                format!("{} bytes staged, {} asked for", staged.len(), dst.len()),
            ));
        }
        dst.copy_from_slice(&staged);
        Ok(())
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
        let req = json!({
            "op": "load",
            "name": spec.name,
            "variant": variant.as_str(),
            "module": spec.module,
            "function": spec.function,
            "params": spec.params,
            "constexprs": spec.constexprs,
            "hints": hints,
        });
        let v = self.call(&format!("loading kernel {}", spec.name), &req, None)?;
        v.get("handle")
            .and_then(Value::as_u64)
            .map(|h| KernelHandle(h as usize))
            .ok_or_else(|| worker_err("load", "reply has no handle"))
    }

    fn launch(&mut self, kernel: KernelHandle, dims: LaunchDims, args: &[KernelArg]) -> Result<()> {
        if let Some(r) = self.recording.as_mut() {
            r.push(Recorded {
                kernel,
                dims,
                args: args.to_vec(),
            });
            return Ok(());
        }
        let start = Instant::now();
        self.run(kernel, dims, args)?;
        self.tally(kernel.0, dims.grid, start);
        Ok(())
    }

    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }

    fn memory_info(&mut self) -> Result<Option<(usize, usize)>> {
        Ok(None)
    }

    fn capture_begin(&mut self) -> Result<()> {
        self.recording = Some(Vec::new());
        Ok(())
    }

    fn capture_end(&mut self) -> Result<usize> {
        let launches = self
            .recording
            .take()
            .ok_or_else(|| worker_err("ending a capture", "no capture is open"))?;
        self.graphs.push(Some(launches));
        Ok(self.graphs.len() - 1)
    }

    fn capture_abort(&mut self) {
        self.recording = None;
    }

    fn graph_launch(&mut self, id: usize) -> Result<()> {
        let launches = self
            .graphs
            .get_mut(id)
            .and_then(Option::take)
            .ok_or_else(|| worker_err("replaying a graph", format!("no graph {id}")))?;
        // One entry for the whole replay, as a GPU's profile has.
        let start = Instant::now();
        let result = launches
            .iter()
            .try_for_each(|l| self.run(l.kernel, l.dims, &l.args));
        self.graphs[id] = Some(launches);
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
