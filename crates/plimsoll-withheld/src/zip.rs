//! A streaming zip reader: it walks the local headers in order (stored, deflate, and bzip2,
//! zstd and xz members of known size), then checks every central directory record against what
//! the walk reached, so a member that only the central directory (which extractors use) names
//! cannot hide. It never seeks, never extracts and never follows a name.

use std::cell::Cell;
use std::collections::HashMap;
use std::io::{self, BufRead, Read};
use std::rc::Rc;

use crate::limits::{decoder_need, Limits, MemBudget};

/// Local file header.
const LOCAL: u32 = 0x0403_4b50;
/// Central directory record.
const CENTRAL: u32 = 0x0201_4b50;
/// End of central directory.
const EOCD: u32 = 0x0605_4b50;
const EOCD64: u32 = 0x0606_4b50;
const EOCD64_LOCATOR: u32 = 0x0706_4b50;
const DESCRIPTOR: u32 = 0x0807_4b50;
const DIGITAL_SIGNATURE: u32 = 0x0505_4b50;
const ARCHIVE_EXTRA: u32 = 0x0806_4b50;

/// Why a zip could not be walked to its end. Each maps to the unreadable reason of the zip.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZipError {
    /// Structure is broken (bad signature, truncated, sizes disagree).
    #[error("zip is corrupt: {0}")]
    Corrupt(String),
    /// An encrypted member whose end cannot be found without decrypting it.
    #[error("zip member is encrypted")]
    Encrypted,
    /// A stored member with a data descriptor and no size: its end cannot be found.
    #[error("zip member is stored with a data descriptor and no size")]
    StoredDescriptor,
    /// A compression method this reader cannot stream past.
    #[error("zip method {0} is not supported")]
    Method(u16),
    /// The central directory disagrees with the local headers.
    #[error("zip central directory disagrees with the local headers: {0}")]
    Inconsistent(String),
    /// More members than the limit.
    #[error("zip has more than {0} members")]
    TooManyEntries(u64),
    /// A member with a data descriptor that a limit stopped: where the next member begins is
    /// not known without decoding it to its end, which the limit forbids.
    #[error("a zip member with a data descriptor was stopped by a limit")]
    Abandoned,
    /// A member of unknown size whose decoder would take the scan above its decoder memory.
    #[error("zip member's decoder needs more memory than the scan has left")]
    DecoderMemory,
    /// The underlying stream failed.
    #[error("reading zip: {0}")]
    Io(#[source] io::Error),
}

impl ZipError {
    /// The unreadable reason for the zip as a whole.
    pub fn reason(&self) -> String {
        match self {
            ZipError::Corrupt(_) | ZipError::Io(_) => "format:zip-corrupt".into(),
            ZipError::Encrypted => "format:zip-encrypted".into(),
            ZipError::StoredDescriptor => "format:zip-stored-descriptor".into(),
            ZipError::Method(m) => format!("format:zip-method-{m}"),
            ZipError::Inconsistent(_) => "format:zip-inconsistent".into(),
            ZipError::TooManyEntries(_) => "limit:zip-entries".into(),
            ZipError::DecoderMemory => "limit:decoder-memory".into(),
            ZipError::Abandoned => "limit:zip-member".into(),
        }
    }
}

fn io_err(e: io::Error) -> ZipError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        ZipError::Corrupt("truncated".into())
    } else {
        ZipError::Io(e)
    }
}

/// A `BufRead` that counts the bytes consumed through it.
#[derive(Debug)]
pub struct Counted<R> {
    inner: R,
    /// Bytes consumed so far.
    pub pos: u64,
}

impl<R> Counted<R> {
    /// Wraps a reader, starting the count at zero.
    pub fn new(inner: R) -> Counted<R> {
        Counted { inner, pos: 0 }
    }
}

impl<R: BufRead> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl<R: BufRead> BufRead for Counted<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.inner.fill_buf()
    }
    fn consume(&mut self, amt: usize) {
        self.pos += amt as u64;
        self.inner.consume(amt);
    }
}

/// One member as its local header (and data descriptor) describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZipMember {
    /// The member's name as raw bytes.
    pub name: Vec<u8>,
    /// Offset of its local header from the start of the zip.
    pub start: u64,
    /// Offset of its (compressed) data.
    pub data_start: u64,
    /// Compression method.
    pub method: u16,
    /// General-purpose flags.
    pub flags: u16,
    /// Compressed size, when the local header states it.
    pub csize: Option<u64>,
    /// Uncompressed size, when the local header states it (else learned after the data).
    pub usize: Option<u64>,
}

/// A member's content as the walker hands it over.
pub enum MemberData<'a> {
    /// Stored: the bytes are the zip's own bytes, in order.
    Stored(&'a mut dyn Read),
    /// Decompressed output of the member's data, and the count of compressed bytes the
    /// decoder has consumed so far (for the ratio limit, with or without a data descriptor).
    Decoded(&'a mut dyn Read, &'a Cell<u64>),
}

/// What the walker calls for each member. `content` may stop reading early (a limit); the
/// walker then finds the member's end itself.
pub trait ZipVisitor {
    /// Reads one member's content.
    fn content(&mut self, member: &ZipMember, data: MemberData<'_>) -> io::Result<()>;
    /// A member that cannot be read (`reason` is `format:...`), with its whole size.
    fn unreadable(&mut self, member: &ZipMember, reason: String, size: u64);
    /// The member ended at `end` (offset from the zip's start, after any descriptor); `size`
    /// is its uncompressed size.
    fn done(&mut self, member: &ZipMember, end: u64, size: u64);
}

struct Crc<'a> {
    inner: &'a mut dyn Read,
    crc: crc32fast::Hasher,
    n: u64,
}

impl Read for Crc<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc.update(&buf[..n]);
        self.n += n as u64;
        Ok(n)
    }
}

fn u16le(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}
fn u32le(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}
fn u64le(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

fn fnv(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Zip64 extended information: replaces the 32-bit fields that are all ones, in order.
fn zip64(extra: &[u8], fields: &mut [&mut u64]) -> Result<bool, ZipError> {
    let mut rest = extra;
    while rest.len() >= 4 {
        let id = u16le(rest);
        let len = u16le(&rest[2..]) as usize;
        if rest.len() < 4 + len {
            return Err(ZipError::Corrupt("extra field overruns".into()));
        }
        if id == 1 {
            let mut d = &rest[4..4 + len];
            for f in fields.iter_mut() {
                if **f == 0xFFFF_FFFF {
                    if d.len() < 8 {
                        return Err(ZipError::Corrupt("zip64 field is short".into()));
                    }
                    **f = u64le(d);
                    d = &d[8..];
                }
            }
            return Ok(true);
        }
        rest = &rest[4 + len..];
    }
    Ok(false)
}

fn skip(r: &mut impl Read, n: u64) -> Result<(), ZipError> {
    let got = io::copy(&mut r.take(n), &mut io::sink()).map_err(io_err)?;
    if got != n {
        return Err(ZipError::Corrupt("truncated".into()));
    }
    Ok(())
}

#[derive(Clone, Copy)]
struct Seen {
    name: u64,
    method: u16,
    csize: u64,
    crc: u32,
}

/// Limits and knobs for one zip walk.
#[derive(Debug, Clone)]
pub struct ZipLimits {
    /// Most members allowed.
    pub max_entries: u64,
    /// zstd window (log2) for method 93.
    pub zstd_window_log_max: u32,
    /// xz memory (KiB) for method 95.
    pub xz_memory_kib: u32,
    /// The scan's decoder memory: each member's decoder reserves what it holds.
    pub(crate) budget: Option<Rc<MemBudget>>,
    /// Where the zip starts in its file: central directory offsets may count from the file's
    /// start (a zip written after a header, as `python -m zipapp` does) instead of the zip's.
    pub prefix: u64,
}

impl ZipLimits {
    /// Limits with no shared decoder memory budget (the windows are still capped).
    pub fn new(max_entries: u64, zstd_window_log_max: u32, xz_memory_kib: u32) -> ZipLimits {
        ZipLimits {
            max_entries,
            zstd_window_log_max,
            xz_memory_kib,
            budget: None,
            prefix: 0,
        }
    }
}

/// Walks a zip from its first local header to the end of its central directory. Bytes after
/// the end record are left unread in `r`.
pub fn walk_zip<R: BufRead>(
    r: &mut Counted<R>,
    limits: &ZipLimits,
    v: &mut dyn ZipVisitor,
) -> Result<(), ZipError> {
    let base = r.pos;
    let mut seen: HashMap<u64, Seen> = HashMap::new();
    let mut central = 0u64;
    loop {
        let mut sig = [0u8; 4];
        match r.read_exact(&mut sig) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(ZipError::Corrupt("ends without an end record".into()))
            }
            Err(e) => return Err(ZipError::Io(e)),
        }
        let at = r.pos - 4 - base;
        match u32le(&sig) {
            LOCAL => {
                if central > 0 {
                    return Err(ZipError::Corrupt(
                        "local header after central directory".into(),
                    ));
                }
                if seen.len() as u64 >= limits.max_entries {
                    return Err(ZipError::TooManyEntries(limits.max_entries));
                }
                let s = local(r, base, at, limits, v)?;
                seen.insert(at, s);
            }
            CENTRAL => {
                central += 1;
                let mut h = [0u8; 42];
                r.read_exact(&mut h).map_err(io_err)?;
                let flags = u16le(&h[4..]);
                let method = u16le(&h[6..]);
                let crc = u32le(&h[12..]);
                let mut csize = u64::from(u32le(&h[16..]));
                let mut usize_ = u64::from(u32le(&h[20..]));
                let name_len = u16le(&h[24..]) as usize;
                let extra_len = u16le(&h[26..]) as usize;
                let comment_len = u16le(&h[28..]) as u64;
                let mut offset = u64::from(u32le(&h[38..]));
                let mut name = vec![0u8; name_len];
                r.read_exact(&mut name).map_err(io_err)?;
                let mut extra = vec![0u8; extra_len];
                r.read_exact(&mut extra).map_err(io_err)?;
                skip(r, comment_len)?;
                zip64(&extra, &mut [&mut usize_, &mut csize, &mut offset])?;
                let shifted = offset
                    .checked_sub(limits.prefix)
                    .filter(|_| limits.prefix > 0);
                let Some(s) = seen
                    .get(&offset)
                    .or_else(|| shifted.and_then(|o| seen.get(&o)))
                else {
                    return Err(ZipError::Inconsistent(format!(
                        "{:?} at offset {offset} was not reached by the local headers",
                        String::from_utf8_lossy(&name)
                    )));
                };
                let enc = flags & 1 != 0;
                if s.name != fnv(&name)
                    || s.method != method
                    || s.csize != csize
                    || (!enc && s.crc != crc)
                {
                    return Err(ZipError::Inconsistent(format!(
                        "{:?} differs between its local and central headers",
                        String::from_utf8_lossy(&name)
                    )));
                }
            }
            EOCD => {
                let mut h = [0u8; 18];
                r.read_exact(&mut h).map_err(io_err)?;
                let total = u16le(&h[6..]);
                skip(r, u64::from(u16le(&h[16..])))?;
                if total != 0xFFFF && u64::from(total) != central {
                    return Err(ZipError::Inconsistent(format!(
                        "end record counts {total} members, the central directory has {central}"
                    )));
                }
                return Ok(());
            }
            EOCD64 => {
                let mut n = [0u8; 8];
                r.read_exact(&mut n).map_err(io_err)?;
                skip(r, u64le(&n))?;
            }
            EOCD64_LOCATOR => skip(r, 16)?,
            DIGITAL_SIGNATURE => {
                let mut n = [0u8; 2];
                r.read_exact(&mut n).map_err(io_err)?;
                skip(r, u64::from(u16le(&n)))?;
            }
            ARCHIVE_EXTRA => {
                let mut n = [0u8; 4];
                r.read_exact(&mut n).map_err(io_err)?;
                skip(r, u64::from(u32le(&n)))?;
            }
            DESCRIPTOR if at == 0 => {} // spanning marker of a single-segment archive
            other => {
                return Err(ZipError::Corrupt(format!(
                    "unexpected signature {other:#010x} at offset {at}"
                )))
            }
        }
    }
}

fn local<R: BufRead>(
    r: &mut Counted<R>,
    base: u64,
    at: u64,
    limits: &ZipLimits,
    v: &mut dyn ZipVisitor,
) -> Result<Seen, ZipError> {
    let mut h = [0u8; 26];
    r.read_exact(&mut h).map_err(io_err)?;
    let flags = u16le(&h[2..]);
    let method = u16le(&h[4..]);
    let crc_local = u32le(&h[10..]);
    let mut csize = u64::from(u32le(&h[14..]));
    let mut usize_ = u64::from(u32le(&h[18..]));
    let name_len = u16le(&h[22..]) as usize;
    let extra_len = u16le(&h[24..]) as usize;
    let mut name = vec![0u8; name_len];
    r.read_exact(&mut name).map_err(io_err)?;
    let mut extra = vec![0u8; extra_len];
    r.read_exact(&mut extra).map_err(io_err)?;
    let is64 = zip64(&extra, &mut [&mut usize_, &mut csize])?;
    let descriptor = flags & 8 != 0;
    let encrypted = flags & 1 != 0;
    // With a data descriptor, a zero size in the local header means "unknown".
    let known = !descriptor || csize != 0;
    let mut m = ZipMember {
        name,
        start: at,
        data_start: r.pos - base,
        method,
        flags,
        csize: known.then_some(csize),
        usize: (!descriptor || usize_ != 0).then_some(usize_),
    };
    let unsupported = encrypted || !matches!(method, 0 | 8 | 12 | 93 | 95);
    // A decoder reserves its memory (window, dictionary, block) before it is opened.
    let mut need = None;
    let mut reservation = None;
    if !unsupported && method != 0 {
        let head = r.fill_buf().map_err(io_err)?;
        let head = &head[..head.len().min(64)];
        let cap = Limits {
            zstd_window_log_max: limits.zstd_window_log_max,
            xz_memory_kib: limits.xz_memory_kib,
            ..Limits::default()
        };
        let n = decoder_need(method_name(method), head, &cap);
        need = Some(n);
        if let Some(b) = &limits.budget {
            reservation = b.reserve(n.bytes);
            if reservation.is_none() {
                need = None;
            }
        }
    }
    let no_memory = !unsupported && method != 0 && need.is_none();
    let (consumed, crc, produced) = if unsupported || no_memory {
        let reason = if encrypted {
            "format:zip-encrypted".to_owned()
        } else if no_memory {
            "limit:decoder-memory".to_owned()
        } else {
            format!("format:zip-method-{method}")
        };
        if !known {
            return Err(if encrypted {
                ZipError::Encrypted
            } else if no_memory {
                ZipError::DecoderMemory
            } else {
                ZipError::Method(method)
            });
        }
        v.unreadable(&m, reason, m.usize.unwrap_or(csize));
        skip(r, csize)?;
        (csize, None, m.usize.unwrap_or(0))
    } else if method == 0 {
        if !known {
            return Err(ZipError::StoredDescriptor);
        }
        let start = r.pos;
        let mut take = (&mut *r).take(csize);
        let mut c = Crc {
            inner: &mut take,
            crc: crc32fast::Hasher::new(),
            n: 0,
        };
        v.content(&m, MemberData::Stored(&mut c)).map_err(io_err)?;
        io::copy(&mut c, &mut io::sink()).map_err(io_err)?;
        let (n, crc) = (c.n, c.crc.finalize());
        if r.pos - start != csize {
            return Err(ZipError::Corrupt("stored member is truncated".into()));
        }
        (csize, Some(crc), n)
    } else {
        let start = r.pos;
        let result = if known {
            let mut take = (&mut *r).take(csize);
            decode(&mut take, &m, need.unwrap_or_default(), v)
        } else {
            decode(&mut *r, &m, need.unwrap_or_default(), v)
        };
        drop(reservation);
        let (crc, n) = match result {
            Ok(x) => (Some(x.0), x.1),
            // An error of the stream the zip lives in is not this member's.
            Err(e) if crate::tag::ours(&e) => return Err(ZipError::Io(e)),
            Err(e) if is_abandon(&e) => {
                if !known {
                    return Err(ZipError::Abandoned);
                }
                (None, m.usize.unwrap_or(0))
            }
            Err(e) => {
                if !known {
                    return Err(ZipError::Corrupt(format!("undecodable member: {e}")));
                }
                v.unreadable(
                    &m,
                    format!("format:zip-{}-corrupt", method_name(method)),
                    m.usize.unwrap_or(0),
                );
                (None, m.usize.unwrap_or(0))
            }
        };
        if known {
            let used = r.pos - start;
            skip(r, csize.saturating_sub(used))?;
        }
        (r.pos - start, crc, n)
    };
    let (crc_want, size) = if descriptor {
        let mut d = [0u8; 4];
        r.read_exact(&mut d).map_err(io_err)?;
        if u32le(&d) == DESCRIPTOR {
            r.read_exact(&mut d).map_err(io_err)?;
        }
        let crc = u32le(&d);
        let (cs, us) = if is64 {
            let mut b = [0u8; 16];
            r.read_exact(&mut b).map_err(io_err)?;
            (u64le(&b), u64le(&b[8..]))
        } else {
            let mut b = [0u8; 8];
            r.read_exact(&mut b).map_err(io_err)?;
            (u64::from(u32le(&b)), u64::from(u32le(&b[4..])))
        };
        if cs != consumed {
            return Err(ZipError::Corrupt("data descriptor size disagrees".into()));
        }
        m.csize = Some(cs);
        m.usize = Some(us);
        (crc, us)
    } else {
        (crc_local, m.usize.unwrap_or(produced))
    };
    if let Some(crc) = crc {
        if !encrypted && crc != crc_want {
            v.unreadable(&m, "format:zip-crc".into(), size);
        }
    }
    v.done(&m, r.pos - base, size);
    Ok(Seen {
        name: fnv(&m.name),
        method,
        csize: consumed,
        crc: crc_want,
    })
}

/// What a visitor's `content` returns when it stopped reading a decoded member for a reason of
/// its own (a limit): the walker then skips the member's compressed bytes instead of decoding
/// the rest, or gives up on a member of unknown size.
#[derive(Debug)]
struct Abandon;

impl std::fmt::Display for Abandon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("member abandoned")
    }
}
impl std::error::Error for Abandon {}

/// The error a visitor returns from `content` to abandon a decoded member (see [`Abandon`]).
pub fn abandon() -> io::Error {
    io::Error::other(Abandon)
}

fn is_abandon(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|x| x.is::<Abandon>())
}

/// A `BufRead` that counts what its reader consumes into a shared cell.
pub(crate) struct CountBuf<'c, R> {
    pub inner: R,
    pub n: &'c Cell<u64>,
}

impl<R: BufRead> Read for CountBuf<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.n.set(self.n.get() + k as u64);
        Ok(k)
    }
}

impl<R: BufRead> BufRead for CountBuf<'_, R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.inner.fill_buf()
    }
    fn consume(&mut self, amt: usize) {
        self.n.set(self.n.get() + amt as u64);
        self.inner.consume(amt);
    }
}

fn method_name(method: u16) -> &'static str {
    match method {
        8 => "deflate",
        12 => "bzip2",
        93 => "zstd",
        95 => "xz",
        _ => "method",
    }
}

/// Decodes one member, hands the output to the visitor, then reads the rest of the output
/// (so the member's end and CRC are known). Returns (crc, decoded size).
fn decode<R: BufRead>(
    input: R,
    m: &ZipMember,
    need: crate::limits::DecoderNeed,
    v: &mut dyn ZipVisitor,
) -> io::Result<(u32, u64)> {
    let consumed = Cell::new(0u64);
    let input = CountBuf {
        inner: input,
        n: &consumed,
    };
    let mut dec: Box<dyn Read + '_> = match m.method {
        8 => Box::new(flate2::bufread::DeflateDecoder::new(input)),
        12 => Box::new(bzip2::bufread::MultiBzDecoder::new(input)),
        93 => {
            let mut d = zstd::stream::read::Decoder::with_buffer(input)?;
            d.window_log_max(need.zstd_window_log)?;
            Box::new(d)
        }
        95 => Box::new(lzma_rust2::XzReader::new_mem_limit(
            input,
            true,
            need.xz_memory_kib,
        )),
        other => {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("method {other}"),
            ))
        }
    };
    let mut c = Crc {
        inner: &mut dec,
        crc: crc32fast::Hasher::new(),
        n: 0,
    };
    v.content(m, MemberData::Decoded(&mut c, &consumed))?;
    io::copy(&mut c, &mut io::sink())?;
    Ok((c.crc.finalize(), c.n))
}

/// Members seen by [`walk_zip_bytes`].
#[derive(Debug, Default)]
pub struct ZipSummary {
    /// (name, uncompressed size) of members read.
    pub members: Vec<(Vec<u8>, u64)>,
    /// (name, reason) of members that could not be read.
    pub unreadable: Vec<(Vec<u8>, String)>,
}

struct Collect(ZipSummary, u64);

impl ZipVisitor for Collect {
    fn content(&mut self, _m: &ZipMember, data: MemberData<'_>) -> io::Result<()> {
        match data {
            MemberData::Stored(r) => {
                io::copy(r, &mut io::sink())?;
            }
            MemberData::Decoded(r, _) => {
                // Read at most the cap, as the scanner would under its member limit.
                let n = io::copy(&mut r.take(self.1), &mut io::sink())?;
                if n == self.1 {
                    return Err(abandon());
                }
            }
        }
        Ok(())
    }
    fn unreadable(&mut self, m: &ZipMember, reason: String, _size: u64) {
        self.0.unreadable.push((m.name.clone(), reason));
    }
    fn done(&mut self, m: &ZipMember, _end: u64, size: u64) {
        self.0.members.push((m.name.clone(), size));
    }
}

/// Walks a zip held in memory: the fuzz target for the zip reader.
pub fn walk_zip_bytes(bytes: &[u8]) -> (ZipSummary, Result<(), ZipError>) {
    let mut r = Counted::new(bytes);
    let mut c = Collect(ZipSummary::default(), 64 << 20);
    let limits = ZipLimits {
        budget: Some(MemBudget::new(Limits::default().max_decoder_memory)),
        ..ZipLimits::new(10_000, 24, 16 << 10)
    };
    let res = walk_zip(&mut r, &limits, &mut c);
    (c.0, res)
}
