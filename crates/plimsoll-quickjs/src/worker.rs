//! The worker process: reads one request, loads QuickJS, locks itself down (resource limits,
//! `no_new_privs`, a seccomp filter), runs the snippet under the deadline and memory limit,
//! writes one answer, exits.
//!
//! The worker is plimsolld (or `plimsoll`) re-executed with [`WORKER_ARG`], or the
//! `plimsoll-quickjs-worker` binary; either way its `main` is [`main`]. It inherits nothing
//! but its three pipes and an environment of `TZ=UTC` alone.
//!
//! What the snippet sees: the ECMAScript built-ins of QuickJS-ng and a `console` object whose
//! `log`/`info`/`debug` write to stdout and `error`/`warn`/`trace` to stderr. There is no
//! `require`, `process`, `fetch`, `std`, `os`, timer, module loader (so no `import()`) or any
//! other host function. Values are written as strings; objects as JSON (where node would use
//! its own inspection format).

use std::cell::RefCell;
use std::io::{Read, Write};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use rquickjs::{Context, Ctx, Function, Runtime};

use crate::protocol::{Answer, Request, MAX_REQUEST_BYTES};
use crate::seccomp;

/// The first argument that turns plimsolld or `plimsoll` into a QuickJS worker.
pub const WORKER_ARG: &str = "__plimsoll-quickjs-worker";

/// Exit code of a worker that could not read its request or answer (it wrote nothing useful).
pub const WORKER_FAILED: u8 = 70;

/// Exit code when the lock-down failed: nothing was run.
pub const LOCKDOWN_FAILED: u8 = 71;

/// Address space allowed beyond the engine's heap limit: the binary, the C library, the
/// engine's own tables and Rust's buffers.
const ADDRESS_SPACE_HEADROOM: u64 = 512 * 1024 * 1024;

/// If this process was started as a worker, runs it and returns its exit code; otherwise
/// returns `None` at once. Call it first thing in `main` of every binary that may serve as
/// the worker, and return the code when there is one:
///
/// ```no_run
/// fn main() -> std::process::ExitCode {
///     if let Some(code) = plimsoll_quickjs::run_if_worker() {
///         return code;
///     }
///     // … the binary's own work …
///     std::process::ExitCode::SUCCESS
/// }
/// ```
pub fn run_if_worker() -> Option<std::process::ExitCode> {
    if std::env::args_os().nth(1).is_some_and(|a| a == WORKER_ARG) {
        Some(std::process::ExitCode::from(main()))
    } else {
        None
    }
}

/// The worker's whole life. Returns its exit code: 0 when an answer was written.
pub fn main() -> u8 {
    let mut raw = Vec::new();
    if let Err(e) = std::io::stdin()
        .take(MAX_REQUEST_BYTES + 1)
        .read_to_end(&mut raw)
    {
        eprintln!("plimsoll-quickjs-worker: cannot read the request: {e}");
        return WORKER_FAILED;
    }
    if raw.len() as u64 > MAX_REQUEST_BYTES {
        eprintln!("plimsoll-quickjs-worker: the request is over {MAX_REQUEST_BYTES} bytes");
        return WORKER_FAILED;
    }
    let req: Request = match serde_json::from_slice(&raw) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("plimsoll-quickjs-worker: the request is not valid: {e}");
            return WORKER_FAILED;
        }
    };
    drop(raw);
    // Before the lock-down, which leaves no way to read /proc.
    let descriptors = if req.list_descriptors {
        match open_descriptors() {
            Ok(d) => d,
            Err(e) => {
                eprintln!("plimsoll-quickjs-worker: cannot list its descriptors: {e}");
                return WORKER_FAILED;
            }
        }
    } else {
        Vec::new()
    };
    let answer = match run(&req) {
        Ok(a) => Answer { descriptors, ..a },
        Err(e) => {
            eprintln!("plimsoll-quickjs-worker: {e}");
            return LOCKDOWN_FAILED;
        }
    };
    let text = match serde_json::to_vec(&answer) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("plimsoll-quickjs-worker: cannot encode the answer: {e}");
            return WORKER_FAILED;
        }
    };
    let mut out = std::io::stdout().lock();
    if out.write_all(&text).and_then(|()| out.flush()).is_err() {
        return WORKER_FAILED;
    }
    0
}

/// This process's open descriptors and their targets, from `/proc/self/fd`, without the
/// listing's own (the one pointing at this process's `fd` directory).
fn open_descriptors() -> std::io::Result<Vec<(i32, String)>> {
    let own = format!("/proc/{}/fd", std::process::id());
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let entry = entry?;
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let target = match std::fs::read_link(entry.path()) {
            Ok(t) => t.display().to_string(),
            // Gone since it was listed: the listing's own.
            Err(_) => continue,
        };
        if target != own {
            out.push((fd, target));
        }
    }
    out.sort();
    Ok(out)
}

/// Captured output of one stream, cut at the cap.
#[derive(Debug, Default)]
struct Stream {
    bytes: Vec<u8>,
    truncated: bool,
}

impl Stream {
    fn push(&mut self, s: &str, cap: usize) {
        let room = cap.saturating_sub(self.bytes.len());
        if s.len() > room {
            self.bytes.extend_from_slice(&s.as_bytes()[..room]);
            self.truncated = true;
        } else {
            self.bytes.extend_from_slice(s.as_bytes());
        }
    }
}

#[derive(Debug, Default)]
struct Output {
    stdout: Stream,
    stderr: Stream,
}

/// Defines `console` over one host function, then removes the host function's name.
const PRELUDE: &str = r#"
(function (write) {
  "use strict";
  const show = (v) => {
    if (typeof v === "string") return v;
    if (v instanceof Error) return v.stack ? String(v) + "\n" + v.stack : String(v);
    if (v !== null && typeof v === "object") {
      try { const j = JSON.stringify(v); if (j !== undefined) return j; } catch (_) {}
    }
    return String(v);
  };
  // Lone surrogates cannot travel as UTF-8: they become U+FFFD, as TextEncoder does.
  const wellFormed = (s) => typeof s.toWellFormed === "function" ? s.toWellFormed()
    : s.replace(/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(^|[^\uD800-\uDBFF])[\uDC00-\uDFFF]/g, (m, p) => (p || "") + "\uFFFD");
  const line = (args) => wellFormed(Array.prototype.map.call(args, show).join(" ")) + "\n";
  const out = function () { write(1, line(arguments)); };
  const err = function () { write(2, line(arguments)); };
  Object.defineProperty(globalThis, "console", {
    value: Object.freeze({ log: out, info: out, debug: out, error: err, warn: err, trace: err }),
    writable: false, enumerable: false, configurable: false,
  });
})(globalThis.__plimsoll_write);
delete globalThis.__plimsoll_write;
"#;

/// Applies the process limits that hold for the rest of the worker's life.
fn limit_resources(req: &Request) -> Result<(), String> {
    use nix::sys::resource::{setrlimit, Resource};
    // Past the deadline and the provider's own kill (2 s later), so the provider, not the
    // kernel, ends a worker that overran and can still report it as timed out.
    let cpu_seconds = req.timeout_ms.div_ceil(1000) + 4;
    let address_space = req.memory_bytes.saturating_add(ADDRESS_SPACE_HEADROOM);
    for (what, resource, value) in [
        ("address space", Resource::RLIMIT_AS, address_space),
        ("CPU time", Resource::RLIMIT_CPU, cpu_seconds),
        ("file size", Resource::RLIMIT_FSIZE, 0),
        ("core size", Resource::RLIMIT_CORE, 0),
        ("open files", Resource::RLIMIT_NOFILE, 16),
    ] {
        setrlimit(resource, value, value)
            .map_err(|e| format!("cannot limit the worker's {what}: {e}"))?;
    }
    Ok(())
}

/// The variable naming the worker's parent (plimsolld), set by the provider.
pub const PARENT_PID_VAR: &str = "PLIMSOLL_QUICKJS_PARENT_PID";

/// Ties the worker's life to the process named by [`PARENT_PID_VAR`]: the kernel sends
/// SIGKILL when it exits, and a parent already gone ends the worker here. Unset: nothing.
fn die_with_parent() -> Result<(), String> {
    let Ok(v) = std::env::var(PARENT_PID_VAR) else {
        return Ok(());
    };
    let want: i32 = v
        .trim()
        .parse()
        .map_err(|_| format!("{PARENT_PID_VAR}={v:?} is not a process id"))?;
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("cannot ask for the parent-death signal: {e}"))?;
    if nix::unistd::getppid().as_raw() != want {
        return Err(format!("the parent (pid {want}) is gone; not running"));
    }
    Ok(())
}

/// Runs one request. `Err` only when the worker could not lock itself down (nothing ran).
pub fn run(req: &Request) -> Result<Answer, String> {
    die_with_parent()?;
    limit_resources(req)?;
    let rt = Runtime::new().map_err(|e| format!("cannot start QuickJS: {e}"))?;
    rt.set_memory_limit(usize::try_from(req.memory_bytes).unwrap_or(usize::MAX));
    rt.set_max_stack_size(usize::try_from(req.stack_bytes).unwrap_or(usize::MAX));
    let ctx = Context::full(&rt).map_err(|e| format!("cannot create a QuickJS context: {e}"))?;
    let output = Rc::new(RefCell::new(Output::default()));
    let cap = usize::try_from(req.output_bytes).unwrap_or(usize::MAX);
    ctx.with(|ctx| -> Result<(), String> {
        let sink = output.clone();
        let write = Function::new(ctx.clone(), move |fd: i32, text: String| {
            let mut o = sink.borrow_mut();
            let stream = if fd == 2 {
                &mut o.stderr
            } else {
                &mut o.stdout
            };
            stream.push(&text, cap);
        })
        .map_err(|e| format!("cannot define console: {e}"))?;
        ctx.globals()
            .set("__plimsoll_write", write)
            .map_err(|e| format!("cannot define console: {e}"))?;
        ctx.eval::<(), _>(PRELUDE)
            .map_err(|e| format!("cannot define console: {e}"))
    })?;

    // Everything the engine needs is loaded: from here on the worker may only compute, write
    // to its pipes, allocate and exit.
    seccomp::lock_down()?;

    // Rejections nobody handled by the end are reported, as node does (exit code 1).
    let unhandled: Rc<RefCell<Vec<String>>> = Rc::new(RefCell::new(Vec::new()));
    {
        let list = unhandled.clone();
        rt.set_host_promise_rejection_tracker(Some(Box::new(
            move |_ctx, _promise, reason, is_handled| {
                let mut l = list.borrow_mut();
                if is_handled {
                    l.pop();
                } else {
                    l.push(format_exception(&reason));
                }
            },
        )));
    }

    let interrupted = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_millis(req.timeout_ms);
    {
        let flag = interrupted.clone();
        rt.set_interrupt_handler(Some(Box::new(move || {
            if Instant::now() >= deadline {
                flag.store(true, Ordering::Relaxed);
                true
            } else {
                false
            }
        })));
    }

    let mut answer = Answer::default();
    let mut failure: Option<String> = ctx.with(|ctx| {
        ctx.eval::<(), _>(req.code.as_bytes().to_vec())
            .err()
            .map(|e| describe(&ctx, e))
    });
    // Promise jobs (then-callbacks, async functions) run to the end, under the same deadline.
    while failure.is_none() && rt.is_job_pending() {
        match rt.execute_pending_job() {
            Ok(true) => {}
            Ok(false) => break,
            Err(job) => {
                failure = Some(job.0.with(|ctx| {
                    let e = ctx.catch();
                    format_exception(&e)
                }));
            }
        }
    }

    // The closing note may go past the cap by one line, so it is never lost.
    let note =
        |o: &mut Output, text: String| o.stderr.push(&format!("plimsoll: {text}\n"), cap + 1024);
    // A long built-in call can run past the deadline between two interrupt checks: the
    // deadline holds at the end too.
    if Instant::now() >= deadline {
        interrupted.store(true, Ordering::Relaxed);
    }
    if failure.is_none() {
        if let Some(reason) = unhandled.borrow().first() {
            failure = Some(format!("(in promise) {reason}"));
        }
    }
    if interrupted.load(Ordering::Relaxed) {
        answer.timed_out = true;
        answer.exit_code = 124;
        note(
            &mut output.borrow_mut(),
            format!(
                "the snippet was stopped at its deadline ({} ms)",
                req.timeout_ms
            ),
        );
    } else if let Some(f) = failure {
        answer.exit_code = 1;
        let mut o = output.borrow_mut();
        o.stderr.push(&format!("Uncaught {f}\n"), cap);
        // QuickJS throws `null` when memory runs out while it is already out of memory.
        let near_limit = rt.memory_usage().malloc_size as u64 * 10 >= req.memory_bytes * 9;
        if f.contains("out of memory") || (f == "null" && near_limit) {
            note(
                &mut o,
                format!(
                    "the snippet ran out of memory: the engine's limit is {} MiB (SANDBOX_MEMORY_MB)",
                    req.memory_bytes / (1024 * 1024)
                ),
            );
        } else if f.contains("stack overflow") || f.contains("call stack size exceeded") {
            note(
                &mut o,
                "the snippet overflowed the engine's stack (recursion too deep)".to_owned(),
            );
        }
    }
    let out = output.borrow();
    let b64 = base64::engine::general_purpose::STANDARD;
    answer.stdout = b64.encode(&out.stdout.bytes);
    answer.stderr = b64.encode(&out.stderr.bytes);
    answer.stdout_truncated = out.stdout.truncated;
    answer.stderr_truncated = out.stderr.truncated;
    Ok(answer)
}

/// The text of an error from `eval`: the thrown value when it was an exception.
fn describe(ctx: &Ctx<'_>, e: rquickjs::Error) -> String {
    match e {
        rquickjs::Error::Exception => format_exception(&ctx.catch()),
        other => other.to_string(),
    }
}

/// A thrown value as text: an Error's name, message and stack; anything else as a string.
fn format_exception(v: &rquickjs::Value<'_>) -> String {
    if let Some(obj) = v.as_object() {
        let message: Option<String> = obj.get("message").ok();
        let name: Option<String> = obj.get("name").ok();
        let stack: Option<String> = obj.get("stack").ok();
        if let Some(message) = message {
            let mut s = match name {
                Some(n) if !n.is_empty() => format!("{n}: {message}"),
                _ => message,
            };
            if let Some(st) = stack.filter(|s| !s.trim().is_empty()) {
                s.push('\n');
                s.push_str(st.trim_end());
            }
            return s;
        }
    }
    if let Some(s) = v.as_string() {
        return s
            .to_string()
            .unwrap_or_else(|_| "(a string that is not valid Unicode)".to_owned());
    }
    if let Some(sym) = v.as_symbol() {
        let d: Option<String> = sym.description().ok().and_then(|d| d.get().ok());
        return format!("Symbol({})", d.unwrap_or_default());
    }
    // Numbers, booleans, null, undefined and other objects: JavaScript's own String(v)
    // (which may run the object's toString, still under the deadline).
    match v.get::<rquickjs::Coerced<String>>() {
        Ok(s) => s.0,
        Err(_) => format!("(a thrown {})", v.type_name()),
    }
}
