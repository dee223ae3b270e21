//! The recursive scan of one file ("node"): it hashes the file when a whole-file entry has its
//! size, chooses a reader by magic bytes, walks tar and zip members in place and opens
//! compressed streams into a new decoded stream ("space").
//!
//! Run matching happens once per byte of every space: the root stream and each decoder's
//! output. Members of tar and stored zip members are byte ranges of the space they live in, so
//! their bytes are not matched twice; a confirmed run is attributed to the innermost member
//! range that contains it when that member ends (members end inner-first).
//!
//! Errors: every error that is not this node's own is passed up unchanged. A component that
//! originates an error tags it with its node's id ([`Tagged`]), so the node that owns the
//! component, and only that node, turns it into an unreadable reason; errors of the source
//! itself (the engine stream, the disk) are [`Fatal`] and end the scan.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::{self, BufReader, Read};
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use crate::limits::{decoder_need, Limits, MemBudget};
use crate::pipe::{self, Claim, Lane, Pipe, SharedLane, STAGE};
use crate::set::WithheldSet;
use crate::sniff::{sniff, Kind, SNIFF_LEN};
use crate::tag::{ours, own_reason, tagged, Fatal};
use crate::tar::{TarError, TarReader};
use crate::zip::{self, Counted, MemberData, ZipLimits, ZipMember, ZipVisitor};

/// Most findings one scan keeps (the rest are counted, not listed).
const MAX_FINDINGS: usize = 100_000;
/// Most unreadable files one scan keeps.
const MAX_UNREADABLE: usize = 100_000;

/// Wraps a source so its errors become [`Fatal`].
pub(crate) struct Source<R>(pub R);

impl<R: Read> Read for Source<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf).map_err(|e| {
            if ours(&e) {
                e
            } else {
                io::Error::other(Fatal(e))
            }
        })
    }
}

/// Renders a name for reports: UTF-8 as is; `\`, `!`, control characters and bytes that are not
/// UTF-8 as escapes, so `!` only ever separates an archive from a path inside it.
pub fn escape_name(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '!' => out.push_str("\\x21"),
                c if c.is_control() => {
                    let mut b = [0u8; 4];
                    for x in c.encode_utf8(&mut b).bytes() {
                        out.push_str(&format!("\\x{x:02x}"));
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// A find before it is placed in an image: the full path from the scan's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawFinding {
    pub path: String,
    pub entry: usize,
    pub whole_file: bool,
    /// When the place it is attributed to ended, in the reading order: what orders the
    /// report, so matching on a thread of its own (which attributes later) reports in the
    /// same order as matching inline.
    order: u64,
}

/// An unreadable file before it is placed in an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawUnreadable {
    pub path: String,
    pub reason: String,
    pub size: Option<u64>,
}

/// What a scan collected.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub findings: Vec<RawFinding>,
    pub unreadable: Vec<RawUnreadable>,
    pub files: u64,
    pub streams: u64,
    pub omitted: u64,
    /// Each (path, entry) found, with its place in `findings`.
    seen: HashMap<(String, usize), usize>,
    next_order: u64,
}

impl Collected {
    /// The next place in the reading order.
    fn ticket(&mut self) -> u64 {
        self.next_order += 1;
        self.next_order
    }

    fn find(&mut self, path: &str, entry: usize, whole_file: bool) {
        let order = self.ticket();
        self.find_at(path, entry, whole_file, order);
    }

    /// The findings in reading order, to be read, not added to: call once the scan has
    /// ended (the places `seen` points at no longer hold).
    pub(crate) fn in_order(mut self) -> Collected {
        self.findings.sort_by_key(|f| f.order);
        self.seen.clear();
        self
    }

    fn find_at(&mut self, path: &str, entry: usize, whole_file: bool, order: u64) {
        let key = (path.to_owned(), entry);
        if let Some(&at) = self.seen.get(&key) {
            // Found again: it belongs at the earlier of its places in the reading order (the
            // matcher thread may report a later place first).
            let f = &mut self.findings[at];
            f.order = f.order.min(order);
            return;
        }
        if self.findings.len() >= MAX_FINDINGS {
            self.omitted += 1;
            return;
        }
        self.seen.insert(key, self.findings.len());
        self.findings.push(RawFinding {
            path: path.to_owned(),
            entry,
            whole_file,
            order,
        });
    }

    fn unreadable(&mut self, path: &str, reason: String, size: Option<u64>) {
        if self
            .unreadable
            .iter()
            .rev()
            .take(8)
            .any(|u| u.path == path && u.reason == reason)
        {
            return;
        }
        if self.unreadable.len() >= MAX_UNREADABLE {
            self.omitted += 1;
            return;
        }
        self.unreadable.push(RawUnreadable {
            path: path.to_owned(),
            reason,
            size,
        });
    }
}

/// One decoded stream and its run matching: inline, or on the scan's matcher thread
/// ([`crate::pipe`]).
pub(crate) struct Space {
    at: LaneAt,
    /// Bytes read but not yet handed to the matcher.
    stage: Vec<u8>,
    /// Members that ended inside the staged bytes, at the offset where reading stood.
    claims: Vec<Claim>,
}

enum LaneAt {
    Here(Box<Lane>),
    Piped(SharedLane, Rc<Pipe>),
}

/// Most members one staged chunk carries before it is sent early.
const MAX_CLAIMS: usize = 1024;

impl Space {
    /// A space matched inline, on the reading thread.
    pub(crate) fn new(set: &WithheldSet, limits: &Limits) -> Space {
        Space {
            at: LaneAt::Here(Box::new(Lane::new(&set.runs, limits.max_confirm_factor))),
            stage: Vec::new(),
            claims: Vec::new(),
        }
    }

    fn piped(pipe: &Rc<Pipe>, limits: &Limits) -> Space {
        let lane = Lane::new(pipe.index(), limits.max_confirm_factor);
        Space {
            at: LaneAt::Piped(Arc::new(Mutex::new(lane)), Rc::clone(pipe)),
            stage: pipe.buffer(),
            claims: Vec::new(),
        }
    }

    fn feed(&mut self, set: &WithheldSet, mut chunk: &[u8]) {
        match &mut self.at {
            LaneAt::Here(lane) => lane.feed(&set.runs, chunk),
            LaneAt::Piped(..) => {
                while !chunk.is_empty() {
                    let room = STAGE - self.stage.len();
                    let n = room.min(chunk.len());
                    self.stage.extend_from_slice(&chunk[..n]);
                    chunk = &chunk[n..];
                    if self.stage.len() >= STAGE {
                        self.flush();
                    }
                }
            }
        }
    }

    /// Hands the staged bytes and the members that ended in them to the matcher.
    fn flush(&mut self) {
        if let LaneAt::Piped(lane, pipe) = &self.at {
            if !self.stage.is_empty() || !self.claims.is_empty() {
                let buf = std::mem::replace(&mut self.stage, pipe.buffer());
                pipe.send(lane, buf, std::mem::take(&mut self.claims));
            }
        }
    }

    /// Attributes every pending hit inside `[start, end)` to `path` (an export member).
    pub(crate) fn resolve_member(&mut self, start: u64, end: u64, path: &str, out: &mut Collected) {
        self.resolve(start, end, path, out);
    }

    /// Ends an export's own stream: hits outside every member belong to the export itself.
    pub(crate) fn finish_export(&mut self, out: &mut Collected) {
        self.finish("", None, out);
    }

    /// Attributes every pending hit inside `[start, end)` to `path`: now when matching is
    /// inline; on the matcher thread, at this very point of the stream, otherwise.
    fn resolve(&mut self, start: u64, end: u64, path: &str, out: &mut Collected) {
        match &mut self.at {
            LaneAt::Here(lane) => claim(lane, start, end, path, out),
            LaneAt::Piped(..) => {
                let order = out.ticket();
                self.claims.push(Claim {
                    at: self.stage.len(),
                    start,
                    end,
                    path: path.to_owned(),
                    order,
                });
                if self.claims.len() >= MAX_CLAIMS {
                    self.flush();
                }
                self.collect(out, false);
            }
        }
    }

    /// Moves what the matcher claimed into `out`; without `wait`, only when the lane's lock
    /// is free (the matcher holds it while it matches a chunk).
    fn collect(&mut self, out: &mut Collected, wait: bool) {
        let LaneAt::Piped(lane, _) = &self.at else {
            return;
        };
        let claimed = if wait {
            std::mem::take(&mut pipe::lock(lane).claimed)
        } else {
            match lane.try_lock() {
                Ok(mut l) => std::mem::take(&mut l.claimed),
                Err(_) => return,
            }
        };
        for (path, entry, order) in claimed {
            out.find_at(&path, entry, false, order);
        }
    }

    /// Waits until the matcher has matched and claimed everything read so far, and collects
    /// its claims (a stream whose members claim all of it ends with this, not `finish`).
    pub(crate) fn complete(&mut self, out: &mut Collected) {
        if let LaneAt::Piped(_, pipe) = &self.at {
            let pipe = Rc::clone(pipe);
            self.flush();
            pipe.sync();
            self.collect(out, true);
        }
    }

    /// Ends the stream: what no member claimed belongs to the stream's own path.
    pub(crate) fn finish(&mut self, path: &str, size: Option<u64>, out: &mut Collected) {
        self.complete(out);
        let over = match &mut self.at {
            LaneAt::Here(lane) => {
                claim(lane, 0, u64::MAX, path, out);
                lane.over_budget()
            }
            LaneAt::Piped(lane, _) => {
                let mut lane = pipe::lock(lane);
                claim(&mut lane, 0, u64::MAX, path, out);
                lane.over_budget()
            }
        };
        if over {
            out.unreadable(path, "limit:confirmations".into(), size);
        }
    }
}

/// Attributes every pending hit of `lane` inside `[start, end)` to `path`, now.
fn claim(lane: &mut Lane, start: u64, end: u64, path: &str, out: &mut Collected) {
    lane.take_inside(start, end, |entry| out.find(path, entry, false));
}

/// Feeds every byte read through it to a space's run matcher.
pub(crate) struct Tee<'s, R> {
    pub inner: R,
    pub space: &'s RefCell<Space>,
    pub set: &'s WithheldSet,
}

impl<R: Read> Read for Tee<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.space.borrow_mut().feed(self.set, &buf[..n]);
        Ok(n)
    }
}

/// Hashes a file's bytes when a whole-file entry could match it.
struct Hashing<R> {
    inner: R,
    ctx: Option<ring::digest::Context>,
    cap: u64,
    n: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(ctx) = self.ctx.as_mut() {
            if self.n + n as u64 > self.cap {
                self.ctx = None;
            } else {
                ctx.update(&buf[..n]);
            }
        }
        self.n += n as u64;
        Ok(n)
    }
}

/// Counts bytes read (the encoded side of a decoder, for the ratio limit).
pub(crate) struct Counting<'c, R> {
    pub inner: R,
    pub n: &'c Cell<u64>,
}

/// Counts the bytes read from the image itself (depth 0), for the ratio of all decoders.
struct RawCount<R> {
    inner: R,
    n: Rc<Cell<u64>>,
}

impl<R: Read> Read for RawCount<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n.set(self.n.get() + n as u64);
        Ok(n)
    }
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n.set(self.n.get() + n as u64);
        Ok(n)
    }
}

/// Tags a decoder's own errors with its node, and enforces the decoded-size limits.
pub(crate) struct Decoded<'c, R> {
    inner: R,
    origin: u64,
    codec: &'static str,
    produced: u64,
    encoded: &'c Cell<u64>,
    total: Rc<Cell<u64>>,
    raw: Rc<Cell<u64>>,
    limits: &'c Limits,
    /// A layer blob's own decoder: `max_layer_decoded` instead of `max_member_decoded`, and
    /// not bound by the ratio of all decoders (its own ratio still holds).
    top: bool,
    hit: Option<&'static str>,
}

impl<R: Read> Read for Decoded<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(name) = self.hit {
            return Err(tagged(self.origin, format!("limit:{name}")));
        }
        let n = match self.inner.read(buf) {
            Ok(n) => n,
            Err(e) if ours(&e) => return Err(e),
            Err(e) => return Err(tagged(self.origin, decoder_reason(self.codec, &e))),
        };
        self.produced += n as u64;
        self.total.set(self.total.get() + n as u64);
        let l = self.limits;
        let total = self.total.get();
        let hit = if total > l.max_total_decoded {
            Some("total-size")
        } else if self.top && self.produced > l.max_layer_decoded {
            Some("layer-size")
        } else if !self.top && self.produced > l.max_member_decoded {
            Some("member-size")
        } else if self.produced > l.ratio_floor
            && self.produced / self.encoded.get().max(1) > l.max_ratio
        {
            Some("ratio")
        } else if !self.top && total > l.ratio_floor && total / self.raw.get().max(1) > l.max_ratio
        {
            // Nested bombs: every level below the ratio, all of them together far above it.
            Some("ratio")
        } else {
            None
        };
        if let Some(name) = hit {
            self.hit = Some(name);
            return Err(tagged(self.origin, format!("limit:{name}")));
        }
        Ok(n)
    }
}

fn decoder_reason(codec: &str, e: &io::Error) -> String {
    let msg = e.to_string();
    if codec.ends_with("zstd") && (msg.contains("too much memory") || msg.contains("indowLog")) {
        "limit:zstd-window".into()
    } else if codec.ends_with("xz") && msg.contains("mem_limit") {
        "limit:xz-memory".into()
    } else {
        format!("format:{codec}-corrupt")
    }
}

/// A file to scan: where it is and what is known about it.
#[derive(Debug, Clone)]
pub(crate) struct Node<'p> {
    /// Full path from the scan's root, `!`-separated.
    pub path: &'p str,
    /// This reader's exact size, when known.
    pub size: Option<u64>,
    /// The whole size of the file `path` names (for unreadable reports).
    pub path_size: Option<u64>,
    pub depth: u32,
    /// An export member (a layer blob or the config): its decoder is bound by the layer
    /// size limit instead of the member size limit.
    pub top: bool,
}

/// One scan: the set, the limits, the totals and what was found.
pub(crate) struct Scan<'a> {
    pub set: &'a WithheldSet,
    pub limits: &'a Limits,
    pub out: Collected,
    next_id: u64,
    total: Rc<Cell<u64>>,
    /// Bytes read from the image itself (depth-0 files).
    raw: Rc<Cell<u64>>,
    /// Decoder memory of the whole scan.
    pub budget: Rc<MemBudget>,
    /// The zlib probe's decoder and output buffer, made once per scan.
    pub probe: Option<(flate2::Decompress, Vec<u8>)>,
    /// The matcher thread, for scans big enough to gain from one.
    pipe: Option<Rc<Pipe>>,
}

pub(crate) fn drain(r: &mut dyn Read) -> io::Result<u64> {
    let mut buf = vec![0u8; 64 << 10];
    let mut n = 0u64;
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok(n),
            Ok(k) => n += k as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

pub(crate) fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}!{name}")
    }
}

impl<'a> Scan<'a> {
    pub(crate) fn new(set: &'a WithheldSet, limits: &'a Limits) -> Scan<'a> {
        Scan {
            set,
            limits,
            out: Collected::default(),
            next_id: 1,
            total: Rc::new(Cell::new(0)),
            raw: Rc::new(Cell::new(0)),
            budget: MemBudget::new(limits.max_decoder_memory),
            probe: None,
            pipe: None,
        }
    }

    /// A scan whose run matching runs on a thread of its own (inline when the set has no run
    /// entries, when [`Limits::match_thread`] is off, or when the thread cannot be started).
    pub(crate) fn piped(set: &'a WithheldSet, limits: &'a Limits) -> Scan<'a> {
        let mut scan = Scan::new(set, limits);
        if limits.match_thread && !set.runs.is_empty() {
            scan.pipe = Pipe::start(Arc::clone(&set.runs)).ok().map(Rc::new);
        }
        scan
    }

    /// A new decoded stream of this scan.
    pub(crate) fn space(&self) -> RefCell<Space> {
        RefCell::new(match &self.pipe {
            Some(pipe) => Space::piped(pipe, self.limits),
            None => Space::new(self.set, self.limits),
        })
    }

    /// Wraps a decoder's output in the decoded-size limits, tagged with `origin`.
    pub(crate) fn limited<'c, R: Read>(
        &self,
        inner: R,
        origin: u64,
        codec: &'static str,
        encoded: &'c Cell<u64>,
        top: bool,
    ) -> Decoded<'c, R>
    where
        'a: 'c,
    {
        Decoded {
            inner,
            origin,
            codec,
            produced: 0,
            encoded,
            total: Rc::clone(&self.total),
            raw: Rc::clone(&self.raw),
            limits: self.limits,
            top,
            hit: None,
        }
    }

    pub(crate) fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Bytes all decoders produced so far.
    pub(crate) fn decoded_total(&self) -> u64 {
        self.total.get()
    }

    pub(crate) fn unreadable(&mut self, path: &str, reason: String, size: Option<u64>) {
        self.out.unreadable(path, reason, size);
    }

    /// Scans one file whose bytes are `r` and live in `space` from offset `base`. Reads `r`
    /// to its end. `Err` is an error that is not this file's own (see the module doc).
    pub(crate) fn scan_node(
        &mut self,
        r: &mut dyn Read,
        node: &Node<'_>,
        space: &RefCell<Space>,
        base: u64,
    ) -> io::Result<()> {
        self.out.files += 1;
        let mut raw;
        let r: &mut dyn Read = if node.depth == 0 {
            raw = RawCount {
                inner: r,
                n: Rc::clone(&self.raw),
            };
            &mut raw
        } else {
            r
        };
        let files = &self.set.files;
        let mut hr = Hashing {
            inner: r,
            ctx: files
                .wants(node.size)
                .then(|| ring::digest::Context::new(&ring::digest::SHA256)),
            cap: node.size.unwrap_or(files.max_size()),
            n: 0,
        };
        let mut head = [0u8; SNIFF_LEN];
        let mut got = 0;
        while got < SNIFF_LEN {
            match hr.read(&mut head[got..]) {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let kind = sniff(&head[..got]);
        {
            let mut rd = io::Cursor::new(&head[..got]).chain(&mut hr);
            self.open(&mut rd, &head[..got], kind, node, space, base)?;
            drain(&mut rd)?;
        }
        if let Some(ctx) = hr.ctx.take() {
            let digest = ctx.finish();
            let mut sha = [0u8; 32];
            sha.copy_from_slice(digest.as_ref());
            for &entry in self.set.files.lookup(hr.n, &sha) {
                self.out.find(node.path, entry, true);
            }
        }
        Ok(())
    }

    fn open(
        &mut self,
        rd: &mut dyn Read,
        head: &[u8],
        kind: Kind,
        node: &Node<'_>,
        space: &RefCell<Space>,
        base: u64,
    ) -> io::Result<()> {
        let container = !matches!(kind, Kind::Data | Kind::Unsupported(_));
        if container && node.depth >= self.limits.max_depth {
            self.unreadable(node.path, "limit:depth".into(), node.path_size);
            return Ok(());
        }
        match kind {
            Kind::Data => self.carve(rd, node, space, base),
            Kind::Unsupported(name) => {
                self.unreadable(node.path, format!("format:{name}"), node.path_size);
                Ok(())
            }
            Kind::Tar => self.walk_tar(rd, node, space, base),
            Kind::Zip => self.walk_zip(rd, node, space, base),
            Kind::Gzip => self.decode(rd, head, "gzip", node),
            Kind::Zstd => self.decode(rd, head, "zstd", node),
            Kind::Xz => self.decode(rd, head, "xz", node),
            Kind::Bzip2 => self.decode(rd, head, "bzip2", node),
            Kind::GitObject => self.git_object(rd, node, space, base),
            Kind::GitPack => self.walk_pack(rd, node),
            Kind::Png => self.walk_png(rd, node, space, base),
        }
    }

    fn walk_tar(
        &mut self,
        rd: &mut dyn Read,
        node: &Node<'_>,
        space: &RefCell<Space>,
        base: u64,
    ) -> io::Result<()> {
        let id = self.id();
        let mut tar = TarReader::new(rd, self.limits.max_tar_header).with_tag(id);
        let reason = loop {
            match tar.next_entry() {
                Ok(Some(e)) => {
                    let path = join(node.path, &escape_name(&e.path));
                    if e.sparse {
                        self.unreadable(&path, "format:tar-sparse".into(), Some(e.size));
                    }
                    let child = Node {
                        path: &path,
                        size: Some(e.size),
                        path_size: Some(e.size),
                        depth: node.depth + 1,
                        top: false,
                    };
                    let res = self.scan_node(&mut tar.data(), &child, space, base + e.data_start);
                    if let Err(err) = res {
                        match own_reason(&err, id) {
                            Some(reason) => break Some(reason),
                            None => return Err(err),
                        }
                    }
                    space.borrow_mut().resolve(
                        base + e.start,
                        base + e.data_start + e.size,
                        &path,
                        &mut self.out,
                    );
                }
                Ok(None) => break None,
                Err(TarError::Io(err)) => match own_reason(&err, id) {
                    Some(reason) => break Some(reason),
                    None => return Err(err),
                },
                Err(TarError::Truncated) => break Some("format:tar-truncated".to_owned()),
                Err(TarError::Corrupt(_)) => break Some("format:tar-corrupt".to_owned()),
                Err(TarError::HeaderLimit(_)) => break Some("limit:tar-header".to_owned()),
            }
        };
        if let Some(reason) = reason {
            self.unreadable(node.path, reason, node.path_size);
        }
        Ok(())
    }

    fn walk_zip(
        &mut self,
        rd: &mut dyn Read,
        node: &Node<'_>,
        space: &RefCell<Space>,
        base: u64,
    ) -> io::Result<()> {
        let mut counted = Counted::new(BufReader::with_capacity(64 << 10, rd));
        let limits = ZipLimits {
            budget: Some(Rc::clone(&self.budget)),
            ..ZipLimits::new(
                self.limits.max_zip_entries,
                self.limits.zstd_window_log_max,
                self.limits.xz_memory_kib,
            )
        };
        let mut v = ZipWalk {
            scan: self,
            node,
            space,
            base,
        };
        match zip::walk_zip(&mut counted, &limits, &mut v) {
            Ok(()) => Ok(()),
            Err(zip::ZipError::Io(e)) if ours(&e) => Err(e),
            Err(e) => {
                self.unreadable(node.path, e.reason(), node.path_size);
                Ok(())
            }
        }
    }

    /// Opens a compressed stream: its output is a new space, scanned as the same path.
    fn decode(
        &mut self,
        rd: &mut dyn Read,
        head: &[u8],
        codec: &'static str,
        node: &Node<'_>,
    ) -> io::Result<()> {
        let id = self.id();
        let need = decoder_need(codec, head, self.limits);
        let Some(_reservation) = self.budget.reserve(need.bytes) else {
            self.unreadable(node.path, "limit:decoder-memory".into(), node.path_size);
            return Ok(());
        };
        let encoded = Cell::new(0u64);
        let input = BufReader::with_capacity(
            64 << 10,
            Counting {
                inner: rd,
                n: &encoded,
            },
        );
        let dec: Box<dyn Read + '_> = match codec {
            "gzip" => Box::new(flate2::bufread::MultiGzDecoder::new(input)),
            "zstd" => {
                let mut d = match zstd::stream::read::Decoder::with_buffer(input) {
                    Ok(d) => d,
                    Err(e) => {
                        return self.decoder_failed(
                            id,
                            tagged(id, decoder_reason("zstd", &e)),
                            node,
                        )
                    }
                };
                if let Err(e) = d.window_log_max(need.zstd_window_log) {
                    return self.decoder_failed(id, tagged(id, decoder_reason("zstd", &e)), node);
                }
                Box::new(d)
            }
            "xz" => Box::new(lzma_rust2::XzReader::new_mem_limit(
                input,
                true,
                need.xz_memory_kib,
            )),
            _ => Box::new(bzip2::bufread::MultiBzDecoder::new(input)),
        };
        self.decoded_space(dec, id, codec, &encoded, node)
            .map(|_| ())
    }

    pub(crate) fn decoder_failed(
        &mut self,
        id: u64,
        e: io::Error,
        node: &Node<'_>,
    ) -> io::Result<()> {
        match own_reason(&e, id) {
            Some(reason) => {
                self.unreadable(node.path, reason, node.path_size);
                Ok(())
            }
            None => Err(e),
        }
    }

    /// Scans a decoder's output as a new space named `node.path`. `Ok(false)` when a reason of
    /// its own (a limit, corrupt data) stopped it before the end of its output.
    pub(crate) fn decoded_space(
        &mut self,
        dec: Box<dyn Read + '_>,
        id: u64,
        codec: &'static str,
        encoded: &Cell<u64>,
        node: &Node<'_>,
    ) -> io::Result<bool> {
        self.out.streams += 1;
        let child_space = self.space();
        let result = {
            let mut tee = Tee {
                inner: self.limited(dec, id, codec, encoded, node.top),
                space: &child_space,
                set: self.set,
            };
            let child = Node {
                path: node.path,
                size: None,
                path_size: node.path_size,
                depth: node.depth + 1,
                top: false,
            };
            self.scan_node(&mut tee, &child, &child_space, 0)
        };
        child_space
            .borrow_mut()
            .finish(node.path, node.path_size, &mut self.out);
        match result {
            Ok(()) => Ok(true),
            Err(e) => self.decoder_failed(id, e, node).map(|()| false),
        }
    }
}

pub(crate) struct ZipWalk<'s, 'a, 'n, 'p> {
    pub scan: &'s mut Scan<'a>,
    pub node: &'n Node<'p>,
    pub space: &'n RefCell<Space>,
    pub base: u64,
}

impl ZipWalk<'_, '_, '_, '_> {
    fn path(&self, m: &ZipMember) -> String {
        join(self.node.path, &escape_name(&m.name))
    }
}

impl ZipVisitor for ZipWalk<'_, '_, '_, '_> {
    fn content(&mut self, m: &ZipMember, data: MemberData<'_>) -> io::Result<()> {
        let path = self.path(m);
        let depth = self.node.depth + 1;
        match data {
            MemberData::Stored(r) => {
                let child = Node {
                    path: &path,
                    size: m.csize,
                    path_size: m.csize,
                    depth,
                    top: false,
                };
                self.scan
                    .scan_node(r, &child, self.space, self.base + m.data_start)
            }
            MemberData::Decoded(r, consumed) => {
                let id = self.scan.id();
                let codec = match m.method {
                    8 => "zip-deflate",
                    12 => "zip-bzip2",
                    93 => "zip-zstd",
                    _ => "zip-xz",
                };
                // The compressed bytes the decoder consumed so far: the ratio holds with or
                // without a data descriptor.
                let child = Node {
                    path: &path,
                    size: m.usize,
                    path_size: m.usize,
                    depth,
                    top: false,
                };
                let whole = self
                    .scan
                    .decoded_space(Box::new(r), id, codec, consumed, &child)?;
                if whole {
                    Ok(())
                } else {
                    // Stopped by a limit: the walker skips the member instead of decoding on.
                    Err(zip::abandon())
                }
            }
        }
    }

    fn unreadable(&mut self, m: &ZipMember, reason: String, size: u64) {
        let path = self.path(m);
        self.scan.unreadable(&path, reason, Some(size));
    }

    fn done(&mut self, m: &ZipMember, end: u64, size: u64) {
        let path = self.path(m);
        self.space.borrow_mut().resolve(
            self.base + m.start,
            self.base + end,
            &path,
            &mut self.scan.out,
        );
        for u in self.scan.out.unreadable.iter_mut().rev().take(64) {
            if u.size.is_none() && u.path == path {
                u.size = Some(size);
            }
        }
    }
}

/// What [`scan_file_bytes`] found in one file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileScan {
    /// (path, entry id, whole-file match) of every find.
    pub findings: Vec<(String, String, bool)>,
    /// (path, reason, whole-file size) of every unreadable file.
    pub unreadable: Vec<(String, String, u64)>,
    /// Files (including archive members and decoded streams) read.
    pub files: u64,
}

/// Scans one file held in memory, named `name`, recursively: the fuzz target for the archive
/// and compression readers, and the way tests check a single file.
pub fn scan_file_bytes(name: &str, bytes: &[u8], set: &WithheldSet, limits: &Limits) -> FileScan {
    let mut scan = Scan::new(set, limits);
    let space = RefCell::new(Space::new(set, limits));
    let size = bytes.len() as u64;
    let node = Node {
        path: name,
        size: Some(size),
        path_size: Some(size),
        depth: 0,
        top: false,
    };
    let res = {
        let mut tee = Tee {
            inner: Source(bytes),
            space: &space,
            set,
        };
        scan.scan_node(&mut tee, &node, &space, 0)
    };
    space.borrow_mut().finish(name, Some(size), &mut scan.out);
    if let Err(e) = res {
        // Reading memory cannot fail; anything here is a bug in tagging, kept visible.
        scan.out
            .unreadable(name, format!("format:internal-{}", e.kind()), Some(size));
    }
    let entries = set.entries();
    scan.out = std::mem::take(&mut scan.out).in_order();
    FileScan {
        findings: scan
            .out
            .findings
            .iter()
            .map(|f| (f.path.clone(), entries[f.entry].id.clone(), f.whole_file))
            .collect(),
        unreadable: scan
            .out
            .unreadable
            .iter()
            .map(|u| (u.path.clone(), u.reason.clone(), u.size.unwrap_or(0)))
            .collect(),
        files: scan.out.files,
    }
}
