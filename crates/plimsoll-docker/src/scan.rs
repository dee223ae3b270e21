//! The startup ship scan (`PLIMSOLL_WITHHELD_SET`): before the provider starts any container
//! of its image (the smoke test included), the engine exports the image it verified and the
//! export is scanned against the withheld set. A refuse-mode find, or an unreadable file not
//! on that image's known list, stops startup; audit-mode finds are logged. Nothing here
//! prints matched bytes: a find names its place.

use std::path::PathBuf;

use bollard::Docker;
use plimsoll_withheld::{KnownImages, Limits, Mode, WithheldSet};

/// Lines of a refused scan's message listed before "and N more".
const LINES: usize = 20;

/// The withheld set and known lists, read once when the configuration is read.
#[derive(Debug, Clone)]
pub struct ShipScan {
    /// `PLIMSOLL_WITHHELD_SET`.
    pub set_file: PathBuf,
    /// The set read from it.
    pub set: WithheldSet,
    /// `PLIMSOLL_WITHHELD_KNOWN_FILE`, if set.
    pub known_file: Option<PathBuf>,
    /// The known-unreadable lists read from it (empty without the file).
    pub known: KnownImages,
}

/// Scans `image_id` (the content ID the provider verified) through `docker`. The error is
/// the refusal or the failure, one message naming the image and each place, never bytes.
pub async fn run(docker: &Docker, image_id: &str, w: &ShipScan) -> Result<(), String> {
    if !plimsoll_withheld::known::valid_image_id(image_id) {
        return Err(format!(
            "the docker provider did not verify an image content ID ({image_id:?}); nothing was scanned, refusing to serve"
        ));
    }
    let started = std::time::Instant::now();
    tracing::info!(image = %image_id, set = %w.set_file.display(), entries = w.set.entries().len(), "withheld scan of the sandbox image");
    let report = plimsoll_withheld::scan_engine_image(
        docker,
        image_id,
        &w.set,
        &w.known,
        &Limits::default(),
    )
    .await
    .map_err(|e| {
        format!(
            "cannot scan image {image_id}: {e}; refusing to serve an image that was not scanned"
        )
    })?;
    if report.image_id != image_id {
        return Err(format!(
            "the engine's export of image {image_id} is keyed {}; refusing to serve an image that was not scanned",
            report.image_id
        ));
    }
    for f in report.findings.iter().filter(|f| f.mode == Mode::Audit) {
        tracing::warn!(image = %image_id, entry = %f.entry_id, layer = %f.layer, path = %f.path,
            r#match = f.kind, "withheld material found (audit mode: logged, not refused)");
    }
    for u in report.unreadable.iter().filter(|u| u.known) {
        tracing::info!(image = %image_id, layer = %u.layer, path = %u.path, reason = %u.reason,
            size = u.size, "unreadable file on the image's known list (its bytes were not read)");
    }
    let verdict = report.verdict();
    if !verdict.refuses() {
        tracing::info!(image = %image_id, verdict = verdict.as_str(), files = report.files,
            decoded_bytes = report.decoded_bytes, audit_finds = report.findings.len(),
            known_unreadable = report.unreadable.len(), elapsed_ms = started.elapsed().as_millis() as u64,
            "withheld scan passed");
        return Ok(());
    }
    let mut lines: Vec<String> = report
        .findings
        .iter()
        .filter(|f| f.mode == Mode::Refuse)
        .map(|f| {
            format!(
                "refuse entry {:?} ({} match) in layer {} path {:?}",
                f.entry_id, f.kind, f.layer, f.path
            )
        })
        .collect();
    let unknown: Vec<_> = report.unreadable.iter().filter(|u| !u.known).collect();
    lines.extend(unknown.iter().map(|u| {
        format!(
            "unreadable ({}, {} bytes) and not on the image's known list: layer {} path {:?}",
            u.reason, u.size, u.layer, u.path
        )
    }));
    let more = lines.len().saturating_sub(LINES) as u64 + report.omitted;
    lines.truncate(LINES);
    if more > 0 {
        lines.push(format!("and {more} more finds or unreadable files"));
    }
    let mut message = format!(
        "refusing to serve image {image_id} ({}):\n  - {}",
        verdict.as_str(),
        lines.join("\n  - ")
    );
    if !unknown.is_empty() || report.omitted > 0 {
        let known = w
            .known_file
            .as_ref()
            .map_or("known-images.json".into(), |p| p.display().to_string());
        message.push_str(&format!(
            "\nAn unreadable file is refused until an operator has looked at it and listed it for this image: \
             `plimsoll-withheld known-unreadable -set {} -known {known} {image_id}`, then set PLIMSOLL_WITHHELD_KNOWN_FILE={known}. \
             Listing acknowledges unread bytes, not that they hold no secret.",
            w.set_file.display()
        ));
    }
    Err(message)
}
