//! Scans an image straight from the Docker Engine: `GET /images/{id}/get` streamed through a
//! small bounded channel into the blocking scanner. Nothing is written to disk.

use std::io::{self, Read};

use bollard::Docker;
use futures_util::StreamExt;

use crate::image;
use crate::known::KnownImages;
use crate::limits::Limits;
use crate::report::ScanReport;
use crate::set::WithheldSet;
use crate::ScanError;

/// Chunks in flight between the engine stream and the scanner (each a few KiB to a few
/// hundred KiB): the only buffer between them.
const CHANNEL_CHUNKS: usize = 16;

/// Connects to the engine named by `DOCKER_HOST` (a `unix://` socket or `tcp://` address;
/// the local socket when unset) and agrees an API version with it.
pub async fn connect_docker() -> Result<Docker, ScanError> {
    let docker = Docker::connect_with_defaults()
        .map_err(|e| ScanError::Engine(format!("connecting to the engine: {e}")))?;
    docker
        .negotiate_version()
        .await
        .map_err(|e| ScanError::Engine(format!("the engine did not answer: {e}")))
}

struct ChannelReader<T> {
    rx: tokio::sync::mpsc::Receiver<Result<T, String>>,
    cur: Option<T>,
    off: usize,
}

impl<T: AsRef<[u8]>> Read for ChannelReader<T> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(cur) = &self.cur {
                let b = cur.as_ref();
                if self.off < b.len() {
                    let n = buf.len().min(b.len() - self.off);
                    buf[..n].copy_from_slice(&b[self.off..self.off + n]);
                    self.off += n;
                    return Ok(n);
                }
            }
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => {
                    self.cur = Some(chunk);
                    self.off = 0;
                }
                Some(Err(msg)) => return Err(io::Error::other(msg)),
                None => return Ok(0),
            }
        }
    }
}

/// Streams the export of `image_id` into `consume`, run on a blocking thread.
async fn with_export<F, O>(docker: &Docker, image_id: &str, consume: F) -> Result<O, ScanError>
where
    F: FnOnce(&mut dyn Read) -> O + Send + 'static,
    O: Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(CHANNEL_CHUNKS);
    let mut stream = Box::pin(docker.export_image(image_id));
    let pump = async move {
        while let Some(item) = stream.next().await {
            let item = item.map_err(|e| format!("the engine's export stream failed: {e}"));
            let stop = item.is_err();
            if tx.send(item).await.is_err() || stop {
                break;
            }
        }
    };
    let work = tokio::task::spawn_blocking(move || {
        let mut r = ChannelReader {
            rx,
            cur: None,
            off: 0,
        };
        consume(&mut r)
    });
    let ((), out) = tokio::join!(pump, work);
    out.map_err(|e| ScanError::Engine(format!("the scan thread failed: {e}")))
}

/// Scans one image the engine holds, by content ID (or any name the engine resolves; the
/// report is keyed by the ID the engine states). This is plimsolld's startup scan: call it
/// with the ID it verified and refuse to serve when `report.verdict().refuses()`.
///
/// The export must contain that very image: its config digest must equal the ID (classic
/// store), or the ID must be the digest of a manifest or index in the export (containerd
/// store); otherwise [`ScanError::Mismatch`].
pub async fn scan_engine_image(
    docker: &Docker,
    image_id: &str,
    set: &WithheldSet,
    known: &KnownImages,
    limits: &Limits,
) -> Result<ScanReport, ScanError> {
    let inspect = docker
        .inspect_image(image_id)
        .await
        .map_err(|e| ScanError::Engine(format!("image {image_id}: {e}")))?;
    let id = inspect
        .id
        .ok_or_else(|| ScanError::Engine(format!("image {image_id}: the engine gave no ID")))?;
    let (set2, limits2) = (set.clone(), limits.clone());
    let export =
        with_export(docker, &id, move |r| image::scan_stream(r, &set2, &limits2)).await??;
    let images = export.images()?;
    let image = images
        .iter()
        .find(|p| p.config_digest == id || p.manifest_digests.contains(&id))
        .ok_or_else(|| {
            ScanError::Mismatch(format!(
                "the engine's export of {image_id} does not contain image {id}"
            ))
        })?;
    Ok(export.report(
        &images,
        image,
        &id,
        &format!("docker:{image_id}"),
        set,
        known,
    ))
}

/// The benchmark's baseline: streams the same export and decompresses its layers (and reads
/// their tar entries) without any matching. Returns the decoded bytes.
pub async fn stream_baseline(docker: &Docker, image_id: &str) -> Result<u64, ScanError> {
    with_export(docker, image_id, |r| crate::baseline_read(r))
        .await?
        .map_err(|e| ScanError::Read(format!("export of {image_id}: {e}")))
}
