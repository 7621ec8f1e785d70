//! Chat templates rendered in a child process, so that a hostile template cannot take the
//! server down.
//!
//! Fuel, the recursion limit and the output cap (see `ferrum_tokenizer::chat`) stop most
//! runaway templates in-process, but not all: minijinja repeats and concatenates sequences
//! lazily, so `(range(100000) * 30000)|list` asks for tens of gigabytes in one filter call, and
//! `{% set s = s ~ s %}` doubles a string per step. No in-process check can refuse an
//! allocation gracefully, and minijinja even folds constant expressions while compiling
//! (`{{ 'x' * 100000000 }}` allocates 100 MB before any render). So the `ferrum` binary
//! compiles and renders templates in a worker ([`ChatTemplate::in_worker`]): the same binary
//! started with [`WORKER_ARG`], its address space capped at [`WORKER_MEMORY`] bytes (on
//! Linux), each render bounded by [`RENDER_TIMEOUT`]; the parent never compiles the template.
//!
//! Protocol (one JSON object per line): the parent sends the template and special tokens; the
//! worker answers `{"ready": true}` or `{"fatal": msg}`; then each request
//! `{"messages": [message, ...], "tools": [...], "add_generation_prompt": bool}` (messages as
//! [`ChatMessage`] serializes them; `tools` only when given) gets `{"ok": text}` or
//! `{"err": msg}`.
//!
//! Invariants: renders are serialized through one worker; a worker that dies (allocation
//! refused, crash) or overruns the timeout is killed and replaced by the next render, and the
//! render that hit it fails alone with a template error (a 400), whatever happened.

use crate::{ChatMessage, ChatTemplate, SpecialTokens, TokenizerError};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::time::Duration;

/// The first argument that makes the `ferrum` binary a template worker.
pub const WORKER_ARG: &str = "__chat-template-worker";
/// The worker's address-space limit.
pub const WORKER_MEMORY: u64 = 1 << 30;
/// How long one render may take, the worker's start included.
pub const RENDER_TIMEOUT: Duration = Duration::from_secs(10);

type Result<T> = std::result::Result<T, TokenizerError>;

fn err(msg: impl Into<String>) -> TokenizerError {
    TokenizerError::Template(msg.into())
}

/// One render, as the parent sends it.
#[derive(Serialize)]
struct RenderRequestRef<'a> {
    messages: &'a [ChatMessage],
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a Value>,
    add_generation_prompt: bool,
}

/// One render, as the worker reads it.
#[derive(Deserialize)]
struct RenderRequest {
    #[serde(default)]
    messages: Vec<ChatMessage>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default = "yes")]
    add_generation_prompt: bool,
}

fn yes() -> bool {
    true
}

/// A running worker.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A chat template compiled and rendered by a worker process.
pub(crate) struct TemplateWorker {
    exe: PathBuf,
    hello: String,
    worker: Mutex<Option<Worker>>,
}

impl std::fmt::Debug for TemplateWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TemplateWorker")
            .field("exe", &self.exe)
            .finish_non_exhaustive()
    }
}

impl TemplateWorker {
    /// Starts a worker running `exe` (the `ferrum` binary) for the template `source`; it
    /// compiles the template and says whether that worked.
    pub(crate) fn start(exe: PathBuf, source: &str, sp: &SpecialTokens) -> Result<TemplateWorker> {
        let hello = json!({
            "source": source,
            "bos_token": sp.bos_token,
            "eos_token": sp.eos_token,
            "pad_token": sp.pad_token,
            "unk_token": sp.unk_token,
        })
        .to_string();
        let t = TemplateWorker {
            exe,
            hello,
            worker: Mutex::new(None),
        };
        let mut w = t
            .worker
            .lock()
            .map_err(|_| err("template worker lock poisoned"))?;
        *w = Some(t.spawn()?);
        drop(w);
        Ok(t)
    }

    fn spawn(&self) -> Result<Worker> {
        let failed = |e: std::io::Error| {
            err(format!(
                "cannot start the chat template worker ({} {WORKER_ARG}): {e}",
                self.exe.display()
            ))
        };
        let mut child = Command::new(&self.exe)
            .arg(WORKER_ARG)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(failed)?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(err("the chat template worker has no pipes"));
        };
        let (tx, lines) = channel();
        std::thread::Builder::new()
            .name("ferrum-template-io".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .map_err(failed)?;
        writeln!(stdin, "{}", self.hello).map_err(failed)?;
        let w = Worker {
            child,
            stdin,
            lines,
        };
        let first = w.lines.recv_timeout(RENDER_TIMEOUT).map_err(|e| match e {
            RecvTimeoutError::Timeout => err(format!(
                "compiling the chat template took more than {} s",
                RENDER_TIMEOUT.as_secs()
            )),
            RecvTimeoutError::Disconnected => err(format!(
                "compiling the chat template failed: it needed more than {} MiB of memory or crashed",
                WORKER_MEMORY >> 20
            )),
        })?;
        let v: Value = serde_json::from_str(&first)
            .map_err(|_| err("the chat template worker answered garbage"))?;
        if let Some(msg) = v.get("fatal").and_then(Value::as_str) {
            return Err(err(msg));
        }
        if v.get("ready") != Some(&Value::Bool(true)) {
            return Err(err("the chat template worker answered garbage"));
        }
        Ok(w)
    }

    /// Renders in the worker (starting a new one if the last died).
    pub(crate) fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let mut slot = self.worker.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(self.spawn()?);
        }
        let Some(w) = slot.as_mut() else {
            return Err(err("no chat template worker"));
        };
        let req = serde_json::to_string(&RenderRequestRef {
            messages,
            tools,
            add_generation_prompt,
        })
        .map_err(|e| err(format!("encoding a render request failed: {e}")))?;
        let sent = writeln!(w.stdin, "{req}").and_then(|_| w.stdin.flush());
        let answer = match sent {
            Ok(()) => w.lines.recv_timeout(RENDER_TIMEOUT),
            Err(_) => Err(RecvTimeoutError::Disconnected),
        };
        let line = match answer {
            Ok(line) => line,
            Err(e) => {
                // Dead or stuck: this render fails; the next one gets a fresh worker.
                *slot = None;
                return Err(err(match e {
                    RecvTimeoutError::Timeout => format!(
                        "rendering the chat template took more than {} s",
                        RENDER_TIMEOUT.as_secs()
                    ),
                    RecvTimeoutError::Disconnected => format!(
                        "rendering the chat template failed: it needed more than {} MiB of memory or crashed",
                        WORKER_MEMORY >> 20
                    ),
                }));
            }
        };
        let v: Value = serde_json::from_str(&line).map_err(|_| {
            *slot = None;
            err("the chat template worker answered garbage")
        })?;
        if let Some(text) = v.get("ok").and_then(Value::as_str) {
            return Ok(text.to_string());
        }
        Err(err(v
            .get("err")
            .and_then(Value::as_str)
            .unwrap_or("the chat template worker answered garbage")))
    }
}

/// Caps this process's address space (Linux); elsewhere the worker runs without a cap.
fn limit_memory(bytes: u64) {
    #[cfg(target_os = "linux")]
    {
        let lim = libc::rlimit {
            rlim_cur: bytes as libc::rlim_t,
            rlim_max: bytes as libc::rlim_t,
        };
        // SAFETY: setrlimit reads the struct we pass and changes only this process's limits.
        unsafe {
            libc::setrlimit(libc::RLIMIT_AS, &lim);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = bytes;
}

fn reply(out: &mut impl Write, v: Value) -> bool {
    writeln!(out, "{v}").and_then(|_| out.flush()).is_ok()
}

/// The worker's main loop (the `ferrum` binary calls this when its first argument is
/// [`WORKER_ARG`]); returns the exit code.
pub fn worker_main() -> i32 {
    limit_memory(WORKER_MEMORY);
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut out = std::io::stdout().lock();
    let Some(Ok(first)) = lines.next() else {
        return 2;
    };
    let hello: Value = match serde_json::from_str(&first) {
        Ok(v) => v,
        Err(e) => {
            reply(&mut out, json!({"fatal": format!("bad hello: {e}")}));
            return 2;
        }
    };
    let s = |k: &str| hello.get(k).and_then(Value::as_str).map(str::to_owned);
    let special = SpecialTokens {
        bos_token: s("bos_token"),
        eos_token: s("eos_token"),
        pad_token: s("pad_token"),
        unk_token: s("unk_token"),
        ..SpecialTokens::default()
    };
    let template = match ChatTemplate::new(&s("source").unwrap_or_default(), &special) {
        Ok(t) => t,
        Err(e) => {
            reply(&mut out, json!({"fatal": e.to_string()}));
            return 2;
        }
    };
    if !reply(&mut out, json!({"ready": true})) {
        return 0;
    }
    for line in lines.map_while(|l| l.ok()) {
        let answer = match serde_json::from_str::<RenderRequest>(&line) {
            Err(e) => json!({"err": format!("bad request to the template worker: {e}")}),
            Ok(req) => {
                match template.render_with_tools(
                    &req.messages,
                    req.tools.as_ref(),
                    req.add_generation_prompt,
                ) {
                    Ok(text) => json!({"ok": text}),
                    Err(TokenizerError::Template(m)) => json!({"err": m}),
                    Err(e) => json!({"err": e.to_string()}),
                }
            }
        };
        if !reply(&mut out, answer) {
            break;
        }
    }
    0
}
