//! `cargo xtask bench attest`: signing and verifying run records, and `verify` of a large
//! bundle against its floor.
//!
//! 1. Records signed per second (`sign_record`) and verified per second (`verify_record`),
//!    over the same stamped records, each timed over the whole batch.
//! 2. A bundle of `--runs` single runs (default 100,000) is written with the real appender
//!    (one fsync a line, one checkpoint every 1,000 runs, as a harness appending in batches
//!    would), then timed three ways, each from a fresh read of the file:
//!    - the floor: read the file and SHA-256 every line;
//!    - the floor plus one Ed25519 verification per signature the bundle holds (two a run:
//!      the record's envelope and the line's link), over bytes of the same length: what any
//!      verifier must at least spend;
//!    - `verify_bundle` itself.
//!
//! The target is `verify_bundle` within 3× the floor. Signatures dominate, so the second
//! baseline shows how much of the gap is the cryptography every verifier pays.

use std::time::Instant;

use plimsoll_attest::bundle::{verify_bundle, Appender};
use plimsoll_attest::{sign_record, verify_record, SigningKey};
use plimsoll_core::digest::stamp;
use plimsoll_core::pb;

use super::{verdict, Args, PASS_MISS};

const USAGE: &str = "usage: cargo xtask bench attest [--runs N] [--sign N]";

/// A stamped single run whose stdout names `i`, as a javascript snippet would give it.
fn exchange(i: usize) -> (pb::RunRequest, pb::RunResponse) {
    let req = pb::RunRequest {
        protocol: plimsoll_core::PROTOCOL,
        timeout_ms: 5000,
        payload: Some(pb::run_request::Payload::Javascript(pb::JavaScriptRun {
            code: format!("console.log({i} * 2)"),
            ..Default::default()
        })),
        ..Default::default()
    };
    let mut resp = pb::RunResponse {
        sandbox: "process".into(),
        isolation: "process".into(),
        duration_ms: 12,
        environment: "node v20".into(),
        result: Some(pb::run_response::Result::Javascript(pb::JavaScriptResult {
            stdout: format!("{}\n", i * 2).into_bytes(),
            exit_code: 0,
            ..Default::default()
        })),
        ..Default::default()
    };
    stamp(&req, &mut resp, "", 1_700_000_000_000, 1_700_000_000_012);
    (req, resp)
}

/// The floor's work, as fast as the standard library goes: `str::lines` finds line ends
/// with the optimized `memchr` of `core` (a bundle is ASCII), whatever this crate's
/// optimization level.
fn sha256_every_line(bytes: &[u8]) -> usize {
    let text = std::str::from_utf8(bytes).expect("a bundle is ASCII");
    let mut n = 0;
    for line in text.lines() {
        let d = ring::digest::digest(&ring::digest::SHA256, line.as_bytes());
        n += usize::from(d.as_ref()[0] & 1);
    }
    n
}

/// Runs the benchmark.
pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let mut a = Args::new(args, USAGE);
    let (mut runs, mut signs) = (100_000usize, 20_000usize);
    while let Some(flag) = a.flag() {
        match flag {
            "--runs" => runs = a.parsed(flag)?,
            "--sign" => signs = a.parsed(flag)?,
            other => return Err(a.unknown(other)),
        }
    }
    let key = SigningKey::generate()?;
    let public = key.public();

    // 1. Sign and verify records.
    let records: Vec<pb::RunRecord> = (0..signs)
        .map(|i| exchange(i).1.record.expect("stamped"))
        .collect();
    let t = Instant::now();
    let envelopes: Vec<_> = records
        .iter()
        .map(|r| sign_record(&key, r))
        .collect::<Result<_, _>>()?;
    let sign_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for e in &envelopes {
        verify_record(e, &public)?;
    }
    let verify_s = t.elapsed().as_secs_f64();
    println!(
        "records: signed {:.0}/s, verified {:.0}/s ({signs} records)",
        signs as f64 / sign_s,
        signs as f64 / verify_s
    );

    // 2. A bundle of `runs` runs.
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("bench.jsonl");
    let t = Instant::now();
    {
        let (mut app, _) = Appender::open(&path, key.clone(), false)?;
        for i in 0..runs {
            let (req, resp) = exchange(i);
            app.append_run(&req, &resp)?;
            if (i + 1) % 1000 == 0 || i + 1 == runs {
                app.checkpoint()?;
            }
        }
    }
    let write_s = t.elapsed().as_secs_f64();
    let size = std::fs::metadata(&path)?.len();
    println!(
        "bundle: {runs} runs, {:.1} MB, written in {write_s:.1} s (one fsync a line)",
        size as f64 / 1e6
    );

    let t = Instant::now();
    let bytes = std::fs::read(&path)?;
    std::hint::black_box(sha256_every_line(&bytes));
    let floor_s = t.elapsed().as_secs_f64();
    drop(bytes);

    // The floor plus the signatures: two Ed25519 verifications a run, one a checkpoint.
    let sigs = 2 * runs + runs.div_ceil(1000);
    let msg = vec![7u8; 600];
    let sig = key.sign(&msg);
    let t = Instant::now();
    let bytes = std::fs::read(&path)?;
    std::hint::black_box(sha256_every_line(&bytes));
    for _ in 0..sigs {
        std::hint::black_box(public.verify(&msg, &sig));
    }
    let crypto_s = t.elapsed().as_secs_f64();
    drop(bytes);

    let t = Instant::now();
    let bytes = std::fs::read(&path)?;
    let summary = verify_bundle(&bytes, &public)?;
    let verify_bundle_s = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        summary.runs == runs as u64,
        "the bundle holds {} runs",
        summary.runs
    );

    let ratio = verify_bundle_s / floor_s;
    println!("floor (read + SHA-256 every line): {floor_s:.3} s");
    println!("floor + {sigs} Ed25519 verifications: {crypto_s:.3} s");
    println!(
        "verify_bundle: {verify_bundle_s:.3} s = {ratio:.1}x the floor (target <= 3x) {}; {:.2}x floor + signatures",
        verdict(ratio <= 3.0, PASS_MISS),
        verify_bundle_s / crypto_s
    );
    Ok(())
}
