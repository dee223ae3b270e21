//! plimsoll-withheld: the ship scan. It reads every byte an image ships (every file of every
//! layer, including files a later layer deletes, the image config, and the inside of every
//! archive or compressed file it can open, recursively) and matches it against a withheld set
//! of digests; what it cannot read it lists as unreadable with a `format:` or `limit:` reason.
//!
//! It must never unpack to disk, never hold an unbounded buffer (see [`Limits`]), never follow
//! a link or trust a name, and never put matched bytes into a report or a log.
//!
//! Entry points: [`scan_engine_image`] (the engine, as plimsolld's startup scan uses it),
//! [`scan_archive`] (a `docker save` file or an OCI layout directory), and for tests and fuzzing
//! [`scan_archive_bytes`], [`walk::scan_file_bytes`], [`tar::walk_tar`], [`zip::walk_zip_bytes`].

use std::io::{self, BufReader, Read};
use std::path::Path;

mod carve;
mod engine;
mod file;
pub mod git;
mod image;
pub mod known;
pub mod limits;
mod matcher;
mod pipe;
mod png;
pub mod report;
pub mod set;
pub mod sniff;
mod tag;
pub mod tar;
pub mod walk;
pub mod zip;

pub use bollard::Docker;
pub use engine::{connect_docker, scan_engine_image, stream_baseline};
pub use known::{KnownImages, KnownItem};
pub use limits::Limits;
pub use matcher::{prefilter_of, MAX_RUN, MIN_RUN};
pub use report::{
    render_json, render_sarif, render_text, Finding, ScanReport, Unreadable, Verdict,
};
pub use set::{Entry, Matcher, Mode, WithheldSet};

/// Why an image could not be scanned at all (the CLI's exit 3).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScanError {
    /// The engine could not be reached, does not hold the image, or its export failed.
    #[error("engine: {0}")]
    Engine(String),
    /// The archive or directory could not be read.
    #[error("read: {0}")]
    Read(String),
    /// The bytes are not a readable image (no manifest, missing layer, corrupt export tar).
    #[error("not a readable image: {0}")]
    BadImage(String),
    /// The export does not contain the image that was asked for.
    #[error("{0}")]
    Mismatch(String),
}

fn reports(
    export: image::Export,
    source: &str,
    set: &WithheldSet,
    known: &KnownImages,
) -> Result<Vec<ScanReport>, ScanError> {
    let images = export.images()?;
    if images.is_empty() {
        return Err(ScanError::BadImage("the export holds no image".into()));
    }
    Ok(images
        .iter()
        .map(|p| export.report(&images, p, &p.config_digest, source, set, known))
        .collect())
}

/// Scans a `docker save` archive (plain or compressed tar, either layout) or an OCI layout
/// directory, without an engine. One report per image it holds, keyed by config digest.
pub fn scan_archive(
    path: &Path,
    set: &WithheldSet,
    known: &KnownImages,
    limits: &Limits,
) -> Result<Vec<ScanReport>, ScanError> {
    let meta =
        std::fs::metadata(path).map_err(|e| ScanError::Read(format!("{}: {e}", path.display())))?;
    let export = if meta.is_dir() {
        image::scan_dir(path, set, limits)?
    } else {
        let f = std::fs::File::open(path)
            .map_err(|e| ScanError::Read(format!("{}: {e}", path.display())))?;
        image::scan_stream(f, set, limits)?
    };
    reports(export, &path.display().to_string(), set, known)
}

/// Scans an image archive held in memory: the fuzz target for the export and layer readers.
pub fn scan_archive_bytes(
    bytes: &[u8],
    set: &WithheldSet,
    known: &KnownImages,
    limits: &Limits,
) -> Result<Vec<ScanReport>, ScanError> {
    // Bytes in memory: a matcher thread would cost more than it saves.
    let inline = Limits {
        match_thread: false,
        ..limits.clone()
    };
    let export = image::scan_stream(bytes, set, &inline)?;
    reports(export, "memory", set, known)
}

/// The benchmark's per-byte comparison: the time to run-match `data` with `set` (the rolling
/// prefilter and its confirmations, fed in 64 KiB chunks as a scan feeds it), and the time of
/// a plain SHA-256 of the same bytes in the same chunks. Best of `rounds`, taken in turns.
#[doc(hidden)]
pub fn match_and_hash_times(
    set: &WithheldSet,
    data: &[u8],
    rounds: u32,
) -> (std::time::Duration, std::time::Duration) {
    use std::time::{Duration, Instant};
    let (mut best_match, mut best_sha) = (Duration::MAX, Duration::MAX);
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        let mut lane = pipe::Lane::new(&set.runs, Limits::default().max_confirm_factor);
        for chunk in data.chunks(pipe::STAGE) {
            lane.feed(&set.runs, chunk);
        }
        std::hint::black_box(&lane.pending);
        best_match = best_match.min(t.elapsed());
        let t = Instant::now();
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        for chunk in data.chunks(pipe::STAGE) {
            ctx.update(chunk);
        }
        std::hint::black_box(ctx.finish());
        best_sha = best_sha.min(t.elapsed());
    }
    (best_match, best_sha)
}

/// The benchmark baseline over an export stream: reads the export tar, decompresses each layer
/// blob by its magic bytes and reads every tar entry of it, with no matching, no hashing and no
/// recursion into nested archives. Returns the bytes read after decompression.
pub fn baseline_read(r: &mut dyn Read) -> io::Result<u64> {
    let mut total = 0u64;
    let mut export = tar::TarReader::new(BufReader::with_capacity(256 << 10, r), 1 << 20);
    let mut buf = vec![0u8; 64 << 10];
    let mut drain = |r: &mut dyn Read| -> io::Result<u64> {
        let mut n = 0;
        loop {
            let k = r.read(&mut buf)?;
            if k == 0 {
                return Ok(n);
            }
            n += k as u64;
        }
    };
    while export.next_entry().map_err(io::Error::other)?.is_some() {
        let mut data = BufReader::with_capacity(64 << 10, export.data());
        let head = io::BufRead::fill_buf(&mut data)?.to_vec();
        let mut layer: Box<dyn Read + '_> = match sniff::sniff(&head) {
            sniff::Kind::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(&mut data)),
            sniff::Kind::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(&mut data)?),
            _ => Box::new(&mut data),
        };
        let mut inner = BufReader::with_capacity(64 << 10, &mut layer);
        let head = io::BufRead::fill_buf(&mut inner)?.to_vec();
        if sniff::sniff(&head) == sniff::Kind::Tar {
            let mut t = tar::TarReader::new(&mut inner, 1 << 20);
            while t.next_entry().map_err(io::Error::other)?.is_some() {
                total += drain(&mut t.data())?;
            }
            total += drain(t.inner_mut())?;
        } else {
            total += drain(&mut inner)?;
        }
        drop(inner);
        drop(layer);
        drain(&mut data)?;
    }
    drain(export.inner_mut())?;
    Ok(total)
}
