//! `cargo xtask bench pages`: how long `docs/learn/check.html` takes to verify its five
//! records, as the page reports it (`data-verify-ms`: `performance.now()` around the whole
//! check, from the bundle's lines to the last verdict), in a fresh headless Chromium per run
//! (what a reader who opens the page gets), with WebCrypto's Ed25519 and with the page's own
//! JavaScript (`?engine=js`). Baseline: the Rust verifier (`plimsoll_attest::verify_bundle`)
//! on the same bytes, in this process, timed the same way (around the call alone, a cold
//! call per run: the key parsed and the bundle read before the clock starts). Also: the
//! page's weight with its scripts and the records (target: under 200 KiB).
//!
//! No time target is set (the issue asks for the figure); the ratio to Rust is printed.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use plimsoll_learn::{browser, learn_dir, records};

use super::stats::{median, ms};
use super::{verdict, Args, MET_MISSED};

const USAGE: &str = "usage: cargo xtask bench pages [--runs N]";

pub fn run(args: &[&str]) -> Result<()> {
    let mut a = Args::new(args, USAGE);
    let mut runs: usize = 9;
    while let Some(f) = a.flag() {
        match f {
            "--runs" => runs = a.parsed("--runs")?,
            other => return Err(a.unknown(other)),
        }
    }
    let bin = browser::find()
        .context("no chromium-headless-shell (apt-get install chromium-headless-shell)")?;
    let learn = learn_dir();
    let page = learn.join("check.html");
    let files = [
        "check.html",
        "check/verify.js",
        "check/page.js",
        "check/bundle.js",
    ];
    let size: u64 = files
        .iter()
        .map(|f| std::fs::metadata(learn.join(f)).map(|m| m.len()))
        .sum::<std::io::Result<u64>>()?;

    let page_ms = |query: &str, engine: &str| -> Result<Vec<f64>> {
        let url = browser::file_url(&page, query)?;
        let mut v = Vec::new();
        for _ in 0..runs {
            let dom = browser::dump_dom_real_time(&bin, &url, 2500)?.stdout;
            let get = |a: &str| browser::attr(&dom, "id=\"summary\"", a).unwrap_or_default();
            if get("data-ok") != "true" || get("data-engine") != engine {
                bail!(
                    "the page did not check ({query}): ok={} engine={}",
                    get("data-ok"),
                    get("data-engine")
                );
            }
            v.push(get("data-verify-ms").parse()?);
        }
        Ok(v)
    };
    let webcrypto = page_ms("", "webcrypto")?;
    let js = page_ms("engine=js", "javascript")?;

    let bytes = std::fs::read(learn.join(records::BUNDLE))?;
    let key = plimsoll_attest::PublicKey::from_spki_pem(&std::fs::read_to_string(
        learn.join(records::PUBLIC_KEY),
    )?)?;
    let mut rust = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        plimsoll_attest::bundle::verify_bundle(&bytes, &key)?;
        rust.push(ms(t.elapsed()));
    }
    let (w, j, r) = (median(&webcrypto), median(&js), median(&rust));
    println!("bench pages: check.html verifying its five records (10 lines, 16 signatures), {runs} fresh browsers each");
    println!(
        "  page, WebCrypto Ed25519     median {w:8.2} ms   ({:.0}x the Rust verifier)",
        w / r
    );
    println!(
        "  page, pure-JS Ed25519       median {j:8.2} ms   ({:.0}x the Rust verifier)",
        j / r
    );
    println!("  baseline: Rust verify_bundle median {r:8.3} ms");
    println!(
        "  page weight with scripts and records: {size} bytes ({:.1} KiB), target < 200 KiB: {}",
        size as f64 / 1024.0,
        verdict(size < 200 * 1024, MET_MISSED)
    );
    Ok(())
}
