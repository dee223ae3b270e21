//! Reads an image as exported: a `docker save` tar (`manifest.json` and layer tars) or an OCI
//! layout (`index.json`, `blobs/sha256/...`), from a stream, a file or a directory. Every file
//! of the export is scanned as it streams past (layers, config, and the rest); the JSON that
//! says which file is which is kept in memory (bounded) and read at the end, because
//! `manifest.json` may come after the layers.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::io::{self, BufReader, Read};
use std::path::Path;

use serde::Deserialize;

use crate::known::KnownImages;
use crate::limits::{decoder_need, Limits};
use crate::matcher::sha256;
use crate::report::{Finding, ScanReport, Unreadable};
use crate::set::WithheldSet;
use crate::sniff::{sniff, Kind, SNIFF_LEN};
use crate::tag::{as_fatal, own_reason};
use crate::tar::{TarError, TarReader};
use crate::walk::{escape_name, Collected, Counting, Node, Scan, Source, Space, Tee};
use crate::ScanError;

/// One file of the export.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub name: String,
}

/// What scanning a whole export produced.
pub(crate) struct Export {
    pub out: Collected,
    pub members: Vec<Member>,
    pub metadata: HashMap<String, Vec<u8>>,
    pub decoded: u64,
}

/// Keeps a member's bytes while it is read, if it is small JSON.
struct Capture<'b, R> {
    inner: R,
    buf: Option<&'b mut Vec<u8>>,
    started: bool,
}

impl<R: Read> Read for Capture<'_, R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(out)?;
        if let Some(buf) = self.buf.as_mut() {
            if !self.started {
                if let Some(&b) = out[..n].iter().find(|b| !b.is_ascii_whitespace()) {
                    self.started = true;
                    if b != b'{' && b != b'[' {
                        buf.clear();
                        self.buf = None;
                        return Ok(n);
                    }
                }
            }
            buf.extend_from_slice(&out[..n]);
        }
        Ok(n)
    }
}

fn wants_capture(name: &str) -> bool {
    name.ends_with(".json")
        || name.starts_with("blobs/")
        || matches!(name, "repositories" | "oci-layout")
}

fn member_name(raw: &[u8]) -> String {
    let mut n = escape_name(raw);
    while let Some(rest) = n.strip_prefix("./") {
        n = rest.to_owned();
    }
    n
}

struct Meta<'l> {
    limits: &'l Limits,
    metadata: HashMap<String, Vec<u8>>,
    held: u64,
}

impl Meta<'_> {
    fn slot(&self, name: &str, size: u64) -> bool {
        wants_capture(name)
            && size <= self.limits.max_metadata
            && self.held + size <= self.limits.max_metadata.saturating_mul(4)
    }
    fn keep(&mut self, name: String, buf: Vec<u8>) {
        if !buf.is_empty() {
            self.held += buf.len() as u64;
            self.metadata.insert(name, buf);
        }
    }
}

fn read_error(e: io::Error, what: &str) -> ScanError {
    match as_fatal(&e) {
        Some(f) => ScanError::Read(format!("{what}: {}", f.0)),
        None => ScanError::BadImage(format!("{what}: {e}")),
    }
}

/// Scans an export stream (`docker save` tar or OCI archive tar, optionally compressed),
/// matching on a thread of its own unless [`Limits::match_thread`] is off.
pub(crate) fn scan_stream(
    input: impl Read,
    set: &WithheldSet,
    limits: &Limits,
) -> Result<Export, ScanError> {
    let mut scan = Scan::piped(set, limits);
    let root = scan.space();
    let mut meta = Meta {
        limits,
        metadata: HashMap::new(),
        held: 0,
    };
    let mut members = Vec::new();
    let mut tee = Tee {
        inner: Source(BufReader::with_capacity(256 << 10, input)),
        space: &root,
        set,
    };
    let mut head = [0u8; SNIFF_LEN];
    let mut got = 0;
    while got < SNIFF_LEN {
        match tee.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(read_error(e, "reading the export")),
        }
    }
    let kind = sniff(&head[..got]);
    let mut rd = io::Cursor::new(&head[..got]).chain(&mut tee);
    match kind {
        Kind::Tar => walk_export(&mut scan, &mut rd, &root, &mut meta, &mut members)?,
        Kind::Gzip | Kind::Zstd | Kind::Xz | Kind::Bzip2 => {
            // The export's own decoder holds its window from the decoder memory too, and its
            // output is bound by the layer size and ratio limits (a compressed export that is a
            // bomb stops; it is not drained to its end).
            let codec = match kind {
                Kind::Gzip => "gzip",
                Kind::Zstd => "zstd",
                Kind::Xz => "xz",
                _ => "bzip2",
            };
            let need = decoder_need(codec, &head[..got], limits);
            let budget = std::rc::Rc::clone(&scan.budget);
            let _reservation = budget.reserve(need.bytes).ok_or_else(|| {
                ScanError::BadImage("the compressed archive: limit:decoder-memory".into())
            })?;
            let encoded = Cell::new(0u64);
            let input = BufReader::with_capacity(
                64 << 10,
                Counting {
                    inner: &mut rd,
                    n: &encoded,
                },
            );
            let dec: Box<dyn Read + '_> = match kind {
                Kind::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(input)),
                Kind::Zstd => {
                    let mut d = zstd::stream::read::Decoder::with_buffer(input)
                        .map_err(|e| ScanError::BadImage(format!("zstd: {e}")))?;
                    d.window_log_max(need.zstd_window_log)
                        .map_err(|e| ScanError::BadImage(format!("zstd: {e}")))?;
                    Box::new(d)
                }
                Kind::Xz => Box::new(lzma_rust2::XzReader::new_mem_limit(
                    input,
                    true,
                    need.xz_memory_kib,
                )),
                _ => Box::new(bzip2::bufread::MultiBzDecoder::new(input)),
            };
            let export_id = scan.id();
            let dec = scan.limited(dec, export_id, codec, &encoded, true);
            let inner_space = scan.space();
            let mut tee2 = Tee {
                inner: dec,
                space: &inner_space,
                set,
            };
            let mut head2 = [0u8; SNIFF_LEN];
            let mut got2 = 0;
            while got2 < SNIFF_LEN {
                match tee2.read(&mut head2[got2..]) {
                    Ok(0) => break,
                    Ok(k) => got2 += k,
                    Err(e) => return Err(read_error(e, "decompressing the export")),
                }
            }
            if sniff(&head2[..got2]) != Kind::Tar {
                return Err(ScanError::BadImage(
                    "the compressed archive does not hold a tar".into(),
                ));
            }
            let mut rd2 = io::Cursor::new(&head2[..got2]).chain(&mut tee2);
            walk_export(&mut scan, &mut rd2, &inner_space, &mut meta, &mut members)?;
            io::copy(&mut rd2, &mut io::sink())
                .map_err(|e| read_error(e, "decompressing the export"))?;
            inner_space.borrow_mut().finish_export(&mut scan.out);
        }
        _ => {
            return Err(ScanError::BadImage(
                "not an image archive (a docker save or OCI layout tar)".into(),
            ))
        }
    }
    io::copy(&mut rd, &mut io::sink()).map_err(|e| read_error(e, "reading the export"))?;
    root.borrow_mut().finish_export(&mut scan.out);
    let decoded = scan.decoded_total();
    Ok(Export {
        out: scan.out.in_order(),
        members,
        metadata: meta.metadata,
        decoded,
    })
}

fn walk_export(
    scan: &mut Scan<'_>,
    rd: &mut dyn Read,
    space: &RefCell<Space>,
    meta: &mut Meta<'_>,
    members: &mut Vec<Member>,
) -> Result<(), ScanError> {
    let id = 1;
    let mut tar = TarReader::new(rd, scan.limits.max_tar_header).with_tag(id);
    loop {
        let e = match tar.next_entry() {
            Ok(Some(e)) => e,
            Ok(None) => return Ok(()),
            Err(TarError::Io(e)) => return Err(read_error(e, "reading the export")),
            Err(e) => return Err(ScanError::BadImage(format!("the export tar: {e}"))),
        };
        let name = member_name(&e.path);
        let mut buf = Vec::new();
        let capture = meta.slot(&name, e.size);
        let node = Node {
            path: &name,
            size: Some(e.size),
            path_size: Some(e.size),
            depth: 0,
            top: true,
        };
        let res = {
            let mut r = Capture {
                inner: tar.data(),
                buf: capture.then_some(&mut buf),
                started: false,
            };
            scan.scan_node(&mut r, &node, space, e.data_start)
        };
        if let Err(err) = res {
            if own_reason(&err, id).is_some() {
                return Err(ScanError::BadImage(format!(
                    "the export tar is truncated in {name}"
                )));
            }
            return Err(read_error(err, "reading the export"));
        }
        space
            .borrow_mut()
            .resolve_member(e.start, e.data_start + e.size, &name, &mut scan.out);
        if capture {
            meta.keep(name.clone(), buf);
        }
        members.push(Member { name });
    }
}

/// Scans an OCI layout (or an unpacked `docker save`) directory: every file in it.
pub(crate) fn scan_dir(
    dir: &Path,
    set: &WithheldSet,
    limits: &Limits,
) -> Result<Export, ScanError> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd =
            std::fs::read_dir(&d).map_err(|e| ScanError::Read(format!("{}: {e}", d.display())))?;
        for ent in rd {
            let ent = ent.map_err(|e| ScanError::Read(format!("{}: {e}", d.display())))?;
            let ty = ent
                .file_type()
                .map_err(|e| ScanError::Read(format!("{}: {e}", ent.path().display())))?;
            if ty.is_dir() {
                stack.push(ent.path());
            } else {
                files.push((ent.path(), ty.is_file()));
            }
        }
    }
    files.sort();
    let mut scan = Scan::piped(set, limits);
    let mut meta = Meta {
        limits,
        metadata: HashMap::new(),
        held: 0,
    };
    let mut members = Vec::new();
    for (path, regular) in files {
        let rel = path.strip_prefix(dir).unwrap_or(&path);
        let name = member_name(rel.as_os_str().as_encoded_bytes());
        if !regular {
            scan.unreadable(&name, "format:not-a-regular-file".into(), Some(0));
            members.push(Member { name });
            continue;
        }
        let f = std::fs::File::open(&path)
            .map_err(|e| ScanError::Read(format!("{}: {e}", path.display())))?;
        let size = f
            .metadata()
            .map_err(|e| ScanError::Read(format!("{}: {e}", path.display())))?
            .len();
        let space = scan.space();
        let mut buf = Vec::new();
        let capture = meta.slot(&name, size);
        let node = Node {
            path: &name,
            size: Some(size),
            path_size: Some(size),
            depth: 0,
            top: true,
        };
        let res = {
            let mut r = Capture {
                inner: Tee {
                    inner: Source(BufReader::with_capacity(256 << 10, f)),
                    space: &space,
                    set,
                },
                buf: capture.then_some(&mut buf),
                started: false,
            };
            scan.scan_node(&mut r, &node, &space, 0)
        };
        res.map_err(|e| read_error(e, &path.display().to_string()))?;
        let mut space = space.borrow_mut();
        space.resolve_member(0, u64::MAX, &name, &mut scan.out);
        space.complete(&mut scan.out);
        drop(space);
        if capture {
            meta.keep(name.clone(), buf);
        }
        members.push(Member { name });
    }
    let decoded = scan.decoded_total();
    Ok(Export {
        out: scan.out.in_order(),
        members,
        metadata: meta.metadata,
        decoded,
    })
}

/// One image of an export: which members are its config and layers.
#[derive(Debug, Clone)]
pub(crate) struct ImageParts {
    pub config_member: String,
    pub config_digest: String,
    /// (member, label) lowest layer first.
    pub layers: Vec<(String, String)>,
    pub tags: Vec<String>,
    /// Digests of the manifests and indexes that lead to this image.
    pub manifest_digests: Vec<String>,
}

#[derive(Deserialize)]
struct LegacyManifest {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

#[derive(Deserialize)]
struct Descriptor {
    digest: String,
    #[serde(default)]
    annotations: Option<HashMap<String, String>>,
}

#[derive(Deserialize)]
struct OciDoc {
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
}

#[derive(Deserialize)]
struct ConfigDoc {
    #[serde(default)]
    rootfs: Option<RootFs>,
}

#[derive(Deserialize)]
struct RootFs {
    #[serde(default)]
    diff_ids: Vec<String>,
}

fn blob_member(digest: &str) -> Result<String, ScanError> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| ScanError::BadImage(format!("unsupported digest {digest:?}")))?;
    Ok(format!("blobs/sha256/{hex}"))
}

impl Export {
    fn json<'a>(&'a self, name: &str) -> Result<&'a [u8], ScanError> {
        if !self.members.iter().any(|m| m.name == name) {
            return Err(ScanError::BadImage(format!("the export has no {name}")));
        }
        self.metadata.get(name).map(Vec::as_slice).ok_or_else(|| {
            ScanError::BadImage(format!("{name} is not JSON or is over the metadata limit"))
        })
    }

    fn has(&self, name: &str) -> bool {
        self.members.iter().any(|m| m.name == name)
    }

    fn config(&self, member: &str) -> Result<(String, Vec<String>), ScanError> {
        let bytes = self.json(member)?;
        let digest = format!("sha256:{}", hex::encode(sha256(bytes)));
        let doc: ConfigDoc = serde_json::from_slice(bytes)
            .map_err(|e| ScanError::BadImage(format!("image config {member}: {e}")))?;
        Ok((digest, doc.rootfs.map(|r| r.diff_ids).unwrap_or_default()))
    }

    /// The images the export holds.
    pub(crate) fn images(&self) -> Result<Vec<ImageParts>, ScanError> {
        if self.has("manifest.json") {
            let list: Vec<LegacyManifest> = serde_json::from_slice(self.json("manifest.json")?)
                .map_err(|e| ScanError::BadImage(format!("manifest.json: {e}")))?;
            let mut out = Vec::new();
            for m in list {
                let config_member = member_name(m.config.as_bytes());
                let (config_digest, diff_ids) = self.config(&config_member)?;
                let mut layers = Vec::new();
                for (i, l) in m.layers.iter().enumerate() {
                    let member = member_name(l.as_bytes());
                    if !self.has(&member) {
                        return Err(ScanError::BadImage(format!(
                            "the export lacks layer {member}"
                        )));
                    }
                    let label = match diff_ids.get(i) {
                        Some(d) if diff_ids.len() == m.layers.len() => d.clone(),
                        _ => member.clone(),
                    };
                    layers.push((member, label));
                }
                let mut manifest_digests = Vec::new();
                if let Ok(oci) = self.oci_images() {
                    for o in oci {
                        if o.config_digest == config_digest {
                            manifest_digests.extend(o.manifest_digests);
                        }
                    }
                }
                out.push(ImageParts {
                    config_member,
                    config_digest,
                    layers,
                    tags: m.repo_tags.unwrap_or_default(),
                    manifest_digests,
                });
            }
            return Ok(out);
        }
        if self.has("index.json") {
            return self.oci_images();
        }
        Err(ScanError::BadImage(
            "the export has neither manifest.json nor index.json".into(),
        ))
    }

    fn oci_images(&self) -> Result<Vec<ImageParts>, ScanError> {
        let index: OciDoc = serde_json::from_slice(self.json("index.json")?)
            .map_err(|e| ScanError::BadImage(format!("index.json: {e}")))?;
        let mut out = Vec::new();
        let mut queue: Vec<(Descriptor, Vec<String>, u32)> = index
            .manifests
            .unwrap_or_default()
            .into_iter()
            .map(|d| (d, Vec::new(), 0))
            .collect();
        let mut seen = HashSet::new();
        while let Some((d, mut chain, depth)) = queue.pop() {
            if depth > 4 || !seen.insert(d.digest.clone()) {
                continue;
            }
            let member = blob_member(&d.digest)?;
            let bytes = self.json(&member)?;
            if format!("sha256:{}", hex::encode(sha256(bytes))) != d.digest {
                return Err(ScanError::BadImage(format!(
                    "{member} does not match its digest"
                )));
            }
            let doc: OciDoc = serde_json::from_slice(bytes)
                .map_err(|e| ScanError::BadImage(format!("{member}: {e}")))?;
            chain.push(d.digest.clone());
            let tags: Vec<String> = d
                .annotations
                .as_ref()
                .map(|a| {
                    [
                        "io.containerd.image.name",
                        "org.opencontainers.image.ref.name",
                    ]
                    .iter()
                    .filter_map(|k| a.get(*k).cloned())
                    .collect()
                })
                .unwrap_or_default();
            if let Some(children) = doc.manifests {
                for c in children {
                    queue.push((c, chain.clone(), depth + 1));
                }
                continue;
            }
            let (Some(config), Some(layers)) = (doc.config, doc.layers) else {
                return Err(ScanError::BadImage(format!("{member} is not a manifest")));
            };
            let config_member = blob_member(&config.digest)?;
            let (config_digest, _) = self.config(&config_member)?;
            if config_digest != config.digest {
                return Err(ScanError::BadImage(format!(
                    "{config_member} does not match its digest"
                )));
            }
            let mut parts = Vec::new();
            for l in layers {
                let m = blob_member(&l.digest)?;
                if !self.has(&m) {
                    return Err(ScanError::BadImage(format!("the export lacks layer {m}")));
                }
                parts.push((m, l.digest));
            }
            out.push(ImageParts {
                config_member,
                config_digest,
                layers: parts,
                tags,
                manifest_digests: chain,
            });
        }
        Ok(out)
    }

    /// The report of one image of this export.
    pub(crate) fn report(
        &self,
        all: &[ImageParts],
        image: &ImageParts,
        image_id: &str,
        source: &str,
        set: &WithheldSet,
        known: &KnownImages,
    ) -> ScanReport {
        let mut others: HashSet<&str> = HashSet::new();
        for p in all {
            others.insert(&p.config_member);
            for (m, _) in &p.layers {
                others.insert(m);
            }
        }
        let place = |raw: &str| -> Option<(String, String)> {
            let (member, rest) = match raw.split_once('!') {
                Some((m, r)) => (m, r),
                None => (raw, ""),
            };
            if member == image.config_member {
                return Some(("config".into(), rest.to_owned()));
            }
            if let Some((_, label)) = image.layers.iter().find(|(m, _)| m == member) {
                return Some((label.clone(), rest.to_owned()));
            }
            if others.contains(member) {
                return None;
            }
            Some(("export".into(), raw.to_owned()))
        };
        let entries = set.entries();
        let findings = self
            .out
            .findings
            .iter()
            .filter_map(|f| {
                let (layer, path) = place(&f.path)?;
                let e = &entries[f.entry];
                Some(Finding {
                    layer,
                    path,
                    entry_id: e.id.clone(),
                    mode: e.mode,
                    kind: if f.whole_file { "file" } else { "run" },
                })
            })
            .collect();
        let unreadable = self
            .out
            .unreadable
            .iter()
            .filter_map(|u| {
                let (layer, path) = place(&u.path)?;
                Some(Unreadable {
                    layer,
                    path,
                    reason: u.reason.clone(),
                    size: u.size.unwrap_or(0),
                    known: false,
                })
            })
            .collect();
        let mut r = ScanReport {
            image_id: image_id.to_owned(),
            config_digest: image.config_digest.clone(),
            source: source.to_owned(),
            tags: image.tags.clone(),
            layers: image.layers.iter().map(|(_, l)| l.clone()).collect(),
            findings,
            unreadable,
            files: self.out.files,
            decoded_bytes: self.decoded,
            omitted: self.out.omitted,
        };
        r.apply_known(known);
        r
    }
}
