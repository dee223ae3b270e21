//! `docs/learn/check.html` in a real browser: headless Chromium (Debian's
//! `chromium-headless-shell`) opens it from disk and the test reads the verdicts from the
//! DOM. The five shipped records are green with WebCrypto's Ed25519 and with the page's own
//! JavaScript; a copy with one byte changed in an answer, a signature or a link shows that
//! record red with the reason; the page asks for nothing but its own files; it weighs under
//! 200 KiB with the records. Both Markdown pages are rendered and their picture loads.
//! Screenshots go to `target/artifacts/pages/`.
//!
//! Without a browser the tests say so and pass, unless `PLIMSOLL_REQUIRE_BROWSER=1` (CI
//! sets it, and `.ci/run` installs `chromium-headless-shell`).

mod common;

use std::path::{Path, PathBuf};

use common::*;
use plimsoll_learn::browser;

fn chromium() -> Option<PathBuf> {
    let found = browser::find();
    if found.is_none() {
        assert!(
            std::env::var("PLIMSOLL_REQUIRE_BROWSER").as_deref() != Ok("1"),
            "PLIMSOLL_REQUIRE_BROWSER=1 and no browser: install chromium-headless-shell (Debian) or set PLIMSOLL_CHROMIUM"
        );
        eprintln!("skipped: no chromium-headless-shell on PATH (set PLIMSOLL_REQUIRE_BROWSER=1 to fail instead)");
    }
    found
}

fn artifacts() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../artifacts/pages");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The files the page loads, beside it.
const PAGE_FILES: [&str; 4] = [
    "check.html",
    "check/verify.js",
    "check/page.js",
    "check/bundle.js",
];

/// A copy of the page with `lines` as its bundle.
fn page_with(lines: &[String]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("check")).unwrap();
    for f in &PAGE_FILES[..3] {
        std::fs::copy(learn().join(f), dir.path().join(f)).unwrap();
    }
    let jsonl: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(
        dir.path().join("check/bundle.js"),
        plimsoll_learn::records::bundle_js(&jsonl, &shipped_pub()),
    )
    .unwrap();
    dir
}

#[derive(Debug)]
struct Verdict {
    line: usize,
    kind: String,
    valid: bool,
    reason: String,
}

struct Seen {
    state: String,
    ok: bool,
    ms: f64,
    engine: String,
    lines: Vec<Verdict>,
    requested: Vec<String>,
}

fn open(bin: &Path, page: &Path, query: &str) -> Seen {
    let url = browser::file_url(page, query).unwrap();
    let v = browser::dump_dom(bin, &url).unwrap();
    let dom = &v.stdout;
    let s = |a: &str| browser::attr(dom, "id=\"summary\"", a).unwrap_or_default();
    let lines = browser::tags(dom, "data-line=\"")
        .into_iter()
        .filter(|t| t.starts_with("<section"))
        .map(|t| Verdict {
            line: browser::tag_attr(t, "data-line").unwrap().parse().unwrap(),
            kind: browser::tag_attr(t, "data-kind").unwrap(),
            valid: browser::tag_attr(t, "data-verdict").as_deref() == Some("valid"),
            reason: browser::tag_attr(t, "data-reason").unwrap_or_default(),
        })
        .collect();
    Seen {
        state: s("data-state"),
        ok: s("data-ok") == "true",
        ms: s("data-verify-ms").parse().unwrap_or(f64::NAN),
        engine: s("data-engine"),
        lines,
        requested: v.requested,
    }
}

fn records(seen: &Seen) -> Vec<&Verdict> {
    seen.lines
        .iter()
        .filter(|l| l.kind == "run" || l.kind == "call")
        .collect()
}

#[test]
fn the_five_shipped_records_are_green_and_the_page_asks_for_nothing_outside() {
    let Some(bin) = chromium() else { return };
    let page = learn().join("check.html");
    for (query, engine) in [("", "webcrypto"), ("engine=js", "javascript")] {
        let seen = open(&bin, &page, query);
        assert_eq!(seen.state, "done", "the page finished checking");
        assert_eq!(seen.engine, engine);
        assert!(seen.ok, "the bundle checks: {:?}", seen.lines);
        let recs = records(&seen);
        assert_eq!(recs.len(), 5, "five records: {:?}", seen.lines);
        assert!(recs.iter().all(|r| r.valid), "{recs:?}");
        assert_eq!(seen.lines.len(), shipped_lines().len());
        assert!(seen.lines.iter().all(|l| l.valid));
        let outside: Vec<&String> = seen
            .requested
            .iter()
            .filter(|u| !u.starts_with("file://"))
            .collect();
        assert!(outside.is_empty(), "the page asked for {outside:?}");
        eprintln!(
            "check.html ({engine}): five records verified in {} ms (as the page measured it)",
            seen.ms
        );
    }
    // The control: the same net log does show a page that asks for something outside.
    let control = tempfile::tempdir().unwrap();
    let p = control.path().join("control.html");
    std::fs::write(&p, "<!doctype html><img src=\"http://127.0.0.1:9/x.png\">").unwrap();
    let seen = open(&bin, &p, "");
    assert!(
        seen.requested
            .iter()
            .any(|u| u == "http://127.0.0.1:9/x.png"),
        "the net log records outside requests: {:?}",
        seen.requested
    );
    let size: u64 = PAGE_FILES
        .iter()
        .map(|f| std::fs::metadata(learn().join(f)).unwrap().len())
        .sum();
    eprintln!(
        "check.html with its scripts and the records: {size} bytes ({:.1} KiB)",
        size as f64 / 1024.0
    );
    assert!(
        size < 200 * 1024,
        "the page weighs {size} bytes, over 200 KiB"
    );
    let url = browser::file_url(&page, "").unwrap();
    browser::screenshot(&bin, &url, &artifacts().join("check.png"), 1100, 2600).unwrap();
}

#[test]
fn one_changed_byte_turns_that_record_red_with_the_reason() {
    let Some(bin) = chromium() else { return };
    let lines = shipped_lines();
    for OneByte {
        name,
        line,
        lines: changed,
        reason,
    } in one_byte_changes(&lines)
    {
        let dir = page_with(&changed);
        let seen = open(&bin, &dir.path().join("check.html"), "");
        assert_eq!(seen.state, "done");
        assert!(!seen.ok, "{name}: the bundle no longer checks");
        let bad = seen.lines.iter().find(|l| l.line == line).unwrap();
        assert!(!bad.valid, "{name}: line {line} is red");
        assert!(
            bad.reason.contains(reason),
            "{name}: the reason is {:?}",
            bad.reason
        );
        for r in records(&seen).iter().filter(|r| r.line != line) {
            assert!(
                r.valid,
                "{name}: record on line {} stays green ({})",
                r.line, r.reason
            );
        }
        eprintln!("{name}: line {line} red: {}", bad.reason);
        let url = browser::file_url(&dir.path().join("check.html"), "").unwrap();
        browser::screenshot(
            &bin,
            &url,
            &artifacts().join(format!("check-changed-{name}.png")),
            1100,
            1400,
        )
        .unwrap();
    }
}

#[test]
fn both_pages_render_with_their_picture() {
    let Some(bin) = chromium() else { return };
    for (md, png) in [
        (plimsoll_learn::SANDBOX_PAGE, "what-a-sandbox-is.png"),
        (plimsoll_learn::PROOF_PAGE, "proof-of-what-ran.png"),
    ] {
        let text = std::fs::read_to_string(learn().join(md)).unwrap();
        let mut body = String::new();
        let opts = pulldown_cmark::Options::ENABLE_TABLES;
        pulldown_cmark::html::push_html(&mut body, pulldown_cmark::Parser::new_ext(&text, opts));
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(learn().join("rooms.svg"), dir.path().join("rooms.svg")).unwrap();
        let html = format!(
            "<!doctype html><meta charset=utf-8><style>body{{font:15px/1.5 sans-serif;max-width:56rem;margin:1rem auto}}\
             pre{{background:#f4f5f6;padding:.5rem}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.2rem .4rem}}</style>\
             {body}<script>window.onload=function(){{var i=document.images;document.body.setAttribute('data-images',\
             Array.prototype.map.call(i,function(x){{return x.naturalWidth}}).join(','))}}</script>"
        );
        let page = dir.path().join("page.html");
        std::fs::write(&page, html).unwrap();
        let url = browser::file_url(&page, "").unwrap();
        let v = browser::dump_dom(&bin, &url).unwrap();
        let widths = browser::attr(&v.stdout, "data-images=", "data-images").unwrap_or_default();
        if md == plimsoll_learn::SANDBOX_PAGE {
            assert_eq!(
                widths, "720",
                "the rooms picture loads and draws at its width"
            );
        }
        browser::screenshot(&bin, &url, &artifacts().join(png), 1000, 3000).unwrap();
    }
}

#[test]
fn the_pages_own_buttons_change_one_byte_and_the_verdict_turns_red() {
    let Some(bin) = chromium() else { return };
    let page = learn().join("check.html");
    let lines = shipped_lines();
    for c in one_byte_changes(&lines) {
        let seen = open(&bin, &page, &format!("press={}:{}", c.name, c.line));
        assert_eq!(seen.state, "done");
        assert!(
            !seen.ok,
            "{}: pressing the button breaks the bundle",
            c.name
        );
        let bad = seen.lines.iter().find(|l| l.line == c.line).unwrap();
        assert!(
            !bad.valid && bad.reason.contains(c.reason),
            "{}: {bad:?}",
            c.name
        );
        for r in records(&seen).iter().filter(|r| r.line != c.line) {
            assert!(
                r.valid,
                "{}: record on line {} stays green ({})",
                c.name, r.line, r.reason
            );
        }
    }
}
