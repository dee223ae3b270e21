//! Headless Chromium opening a page from disk, for the tests and `cargo xtask bench pages`.
//!
//! The browser is Debian's `chromium-headless-shell` (or `PLIMSOLL_CHROMIUM`, or a
//! `chromium` on `PATH`). Each call gets a fresh profile folder, `--no-sandbox` (the tests
//! run as root in CI), and a deadline of 60 seconds after which the browser is killed.
//! `--virtual-time-budget` lets the page's scripts finish before the DOM is taken, so the
//! time a page measures itself under it is virtual; [`dump_dom_real_time`] waits in real
//! time instead, for measuring.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{io_err, LearnError};

/// The browser to use, if this machine has one.
pub fn find() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PLIMSOLL_CHROMIUM").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    ["chromium-headless-shell", "chromium", "chromium-browser"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |d| d.join(name)))
        .find(|p| p.is_file())
}

/// A `file://` URL for `path` (made absolute), with `query` appended if not empty.
pub fn file_url(path: &Path, query: &str) -> Result<String, LearnError> {
    let abs = path
        .canonicalize()
        .map_err(io_err(format!("find {}", path.display())))?;
    let mut url = String::from("file://");
    for b in abs.display().to_string().bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            url.push(b as char);
        } else {
            url.push_str(&format!("%{b:02X}"));
        }
    }
    if !query.is_empty() {
        url.push('?');
        url.push_str(query);
    }
    Ok(url)
}

/// What one browser run gave.
#[derive(Debug)]
pub struct Visit {
    /// stdout (the DOM for `--dump-dom`).
    pub stdout: String,
    /// stderr (console messages with `--enable-logging=stderr`).
    pub stderr: String,
    /// The URLs the page asked for (from the net log), if one was asked for.
    pub requested: Vec<String>,
}

fn run(bin: &Path, args: &[String], net_log: bool) -> Result<Visit, LearnError> {
    let profile = tempfile::tempdir().map_err(io_err("a browser profile folder"))?;
    let log = profile.path().join("netlog.json");
    let mut cmd = Command::new(bin);
    cmd.arg("--no-sandbox")
        .arg("--disable-gpu")
        .arg("--no-first-run")
        .arg("--hide-scrollbars")
        .arg("--enable-logging=stderr")
        .arg(format!("--user-data-dir={}", profile.path().display()));
    if net_log {
        cmd.arg(format!("--log-net-log={}", log.display()));
    }
    let mut child = cmd
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| LearnError::Browser(format!("start {}: {e}", bin.display())))?;
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let t_out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().map_err(io_err("wait for the browser"))? {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(LearnError::Browser(
                "the browser did not finish in 60 s".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = String::from_utf8_lossy(&t_out.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&t_err.join().unwrap_or_default()).into_owned();
    if !status.success() {
        return Err(LearnError::Browser(format!(
            "the browser exited with {status}: {}",
            stderr.trim()
        )));
    }
    let requested = if net_log {
        let text = std::fs::read_to_string(&log).map_err(io_err("read the net log"))?;
        urls_in_net_log(&text)?
    } else {
        Vec::new()
    };
    Ok(Visit {
        stdout,
        stderr,
        requested,
    })
}

/// Every URL a Chromium net log (`--log-net-log`) names, in order, without repeats.
pub fn urls_in_net_log(text: &str) -> Result<Vec<String>, LearnError> {
    // Chromium may leave the final `]}` off a log it was still writing at exit.
    let v: serde_json::Value = serde_json::from_str(text)
        .or_else(|_| serde_json::from_str(&format!("{}]}}", text.trim_end().trim_end_matches(','))))
        .map_err(|e| LearnError::Browser(format!("the net log is not JSON: {e}")))?;
    let mut urls = Vec::new();
    for e in v["events"].as_array().into_iter().flatten() {
        if let Some(u) = e["params"]["url"].as_str() {
            if !urls.iter().any(|x| x == u) {
                urls.push(u.to_owned());
            }
        }
    }
    Ok(urls)
}

/// The page's DOM once its scripts ran (under a 10 s virtual-time budget), and the URLs it
/// asked for.
pub fn dump_dom(bin: &Path, url: &str) -> Result<Visit, LearnError> {
    run(
        bin,
        &[
            "--virtual-time-budget=10000".to_owned(),
            "--dump-dom".to_owned(),
            url.to_owned(),
        ],
        true,
    )
}

/// The DOM after `wait_ms` of real time (no virtual time), so the page's own clock is real.
pub fn dump_dom_real_time(bin: &Path, url: &str, wait_ms: u32) -> Result<Visit, LearnError> {
    run(
        bin,
        &[
            format!("--timeout={wait_ms}"),
            "--dump-dom".to_owned(),
            url.to_owned(),
        ],
        false,
    )
}

/// A PNG screenshot of the page at `width`×`height` into `out`.
pub fn screenshot(
    bin: &Path,
    url: &str,
    out: &Path,
    width: u32,
    height: u32,
) -> Result<(), LearnError> {
    run(
        bin,
        &[
            "--virtual-time-budget=10000".to_owned(),
            format!("--window-size={width},{height}"),
            format!("--screenshot={}", out.display()),
            url.to_owned(),
        ],
        false,
    )?;
    if !out.is_file() {
        return Err(LearnError::Browser(format!(
            "the browser wrote no screenshot at {}",
            out.display()
        )));
    }
    Ok(())
}

/// The value of attribute `name` on the first element whose opening tag contains `anchor`.
pub fn attr(dom: &str, anchor: &str, name: &str) -> Option<String> {
    let at = dom.find(anchor)?;
    let tag_start = dom[..at].rfind('<')?;
    let tag_end = at + dom[at..].find('>')?;
    let tag = &dom[tag_start..tag_end];
    let key = format!(" {name}=\"");
    let v = tag.find(&key)? + key.len();
    let end = tag[v..].find('"')?;
    Some(unescape(&tag[v..v + end]))
}

/// Every opening tag in `dom` that contains `anchor`.
pub fn tags<'a>(dom: &'a str, anchor: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = dom[from..].find(anchor) {
        let at = from + i;
        if let (Some(s), Some(e)) = (dom[..at].rfind('<'), dom[at..].find('>')) {
            out.push(&dom[s..at + e + 1]);
        }
        from = at + anchor.len();
    }
    out
}

/// Attribute `name` of one opening tag.
pub fn tag_attr(tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let v = tag.find(&key)? + key.len();
    let end = tag[v..].find('"')?;
    Some(unescape(&tag[v..v + end]))
}

fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}
