//! What a plain file carries past its first bytes. A file no magic number at offset 0 names is
//! read for:
//!
//! - **zlib streams wherever they start** (`78 01`, `78 5e`, `78 9c`, `78 da`, or any valid
//!   zlib header at offset 0): git loose objects, PDF and PyInstaller streams, zlib inside
//!   unknown containers. A candidate is first probed (decoded in memory from the bytes at hand);
//!   only a stream that decodes (to its end, or for 256 input bytes, or to 64 KiB of output) is
//!   opened, so random bytes that happen to look like a header cost a probe, not a report.
//! - **zip archives after a header** (`python -m zipapp` archives with a shebang,
//!   self-extracting archives): a plausible local header (`PK 03 04` with a known method, sane
//!   version, flags and name length) starts a zip walk. A walk that fails makes the file
//!   unreadable with the walk's reason. At the end, an end-of-central-directory record in the
//!   last 64 KiB (where extractors look for it) that no successful walk reached makes the file
//!   unreadable too (`format:zip-unreached`): a zip an extractor opens is never passed unread.
//!
//! - **PDF stream filters it does not decode**: a file that starts with `%PDF-` and names a
//!   filter other than FlateDecode (`/LZWDecode`, `/ASCII85Decode`, `/ASCIIHexDecode`,
//!   `/RunLengthDecode`, `/JBIG2Decode`, `/Crypt`, their short forms) or an `/Encrypt`
//!   dictionary is unreadable `format:pdf-filter` (`format:pdf-encrypted`): its FlateDecode
//!   streams are read, the rest would pass unread.
//!
//! Bytes are matched as they are in every case (the file's own space sees every byte); this
//! only adds what decoding reveals.

use std::cell::{Cell, RefCell};
use std::io::{self, BufReader, Read};

use flate2::{Decompress, FlushDecompress, Status};

use crate::limits::decoder_need;
use crate::sniff::zlib_header;
use crate::tag::ours;
use crate::walk::{Counting, Node, Scan, Space, ZipWalk};
use crate::zip::{self, Counted, ZipLimits};

/// Bytes kept after a candidate so its probe (and a zip local header) can be read whole.
const KEEP: usize = 4096;
/// Window of bytes searched at a time.
const WIN: usize = 64 << 10;
/// Where extractors look for the end of central directory record: the last 64 KiB + 22 bytes.
const TAIL: usize = 65_535 + 22;
/// Input bytes a zlib probe must get through without an error (unless the stream ends first).
const PROBE_IN: u64 = 256;
/// Output the probe decodes into.
const PROBE_OUT: usize = 64 << 10;

/// PDF names of filters the scan does not decode, and of encryption.
const PDF_NAMES: [(&[u8], &str); 12] = [
    (b"/LZWDecode", "format:pdf-filter"),
    (b"/ASCII85Decode", "format:pdf-filter"),
    (b"/ASCIIHexDecode", "format:pdf-filter"),
    (b"/RunLengthDecode", "format:pdf-filter"),
    (b"/JBIG2Decode", "format:pdf-filter"),
    (b"/Crypt", "format:pdf-filter"),
    (b"/LZW", "format:pdf-filter"),
    (b"/A85", "format:pdf-filter"),
    (b"/AHx", "format:pdf-filter"),
    (b"/RL", "format:pdf-filter"),
    (b"/Encrypt", "format:pdf-encrypted"),
    (b"/EncryptMetadata", "format:pdf-encrypted"),
];

/// Looks for [`PDF_NAMES`] in a PDF's bytes as they stream by.
#[derive(Default)]
struct PdfNames {
    carry: Vec<u8>,
    hit: Option<&'static str>,
}

impl PdfNames {
    fn feed(&mut self, buf: &[u8]) {
        if self.hit.is_some() {
            return;
        }
        let mut joined = std::mem::take(&mut self.carry);
        joined.extend_from_slice(&buf[..buf.len().min(24)]);
        self.search(&joined);
        self.search(buf);
        let keep = if buf.len() >= 24 {
            &buf[buf.len() - 24..]
        } else {
            &joined[joined.len().saturating_sub(24)..]
        };
        self.carry = keep.to_vec();
    }

    fn search(&mut self, d: &[u8]) {
        let mut i = 0;
        while let Some(k) = d[i..].iter().position(|&b| b == b'/') {
            let at = i + k;
            for (name, reason) in PDF_NAMES {
                // A name ends at a delimiter or white space (`/RL` is not `/RLE`).
                if d[at..].starts_with(name)
                    && d.get(at + name.len())
                        .is_some_and(|&c| !c.is_ascii_alphanumeric())
                {
                    self.hit = Some(reason);
                    return;
                }
            }
            i = at + 1;
        }
    }
}

/// Keeps the last [`TAIL`] bytes of a reader and counts what went through.
struct Tail<'r> {
    inner: &'r mut dyn Read,
    ring: Vec<u8>,
    w: usize,
    pos: u64,
    pdf: Option<PdfNames>,
}

impl Read for Tail<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(p) = self.pdf.as_mut() {
            p.feed(&buf[..n]);
        }
        self.pos += n as u64;
        let mut d = &buf[..n];
        if d.len() > TAIL {
            d = &d[d.len() - TAIL..];
        }
        if self.ring.len() < TAIL {
            let k = d.len().min(TAIL - self.ring.len());
            self.ring.extend_from_slice(&d[..k]);
            d = &d[k..];
        }
        while !d.is_empty() {
            let k = d.len().min(TAIL - self.w);
            self.ring[self.w..self.w + k].copy_from_slice(&d[..k]);
            self.w = (self.w + k) % TAIL;
            d = &d[k..];
        }
        Ok(n)
    }
}

impl Tail<'_> {
    /// The kept bytes in order, and the file offset of the first.
    fn kept(&self) -> (Vec<u8>, u64) {
        let mut v = Vec::with_capacity(self.ring.len());
        if self.ring.len() < TAIL {
            v.extend_from_slice(&self.ring);
        } else {
            v.extend_from_slice(&self.ring[self.w..]);
            v.extend_from_slice(&self.ring[..self.w]);
        }
        let start = self.pos - v.len() as u64;
        (v, start)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cand {
    Zlib,
    Zip,
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

fn has_byte(x: u64, b: u8) -> bool {
    let v = x ^ (LO * u64::from(b));
    v.wrapping_sub(LO) & !v & HI != 0
}

/// A zip local header that could start a real member: a known method, a sane version, only
/// defined flag bits, and a name of 1 to 4096 bytes without NULs once it is in view.
fn plausible_local(d: &[u8]) -> bool {
    if d.len() < 30 || !d.starts_with(b"PK\x03\x04") {
        return false;
    }
    let version = d[4];
    let flags = u16::from_le_bytes([d[6], d[7]]);
    let method = u16::from_le_bytes([d[8], d[9]]);
    let name_len = usize::from(u16::from_le_bytes([d[26], d[27]]));
    let methods = [0u16, 1, 6, 8, 9, 12, 14, 93, 95, 98, 99];
    if version > 63 || flags & 0xd690 != 0 || !methods.contains(&method) {
        return false;
    }
    if name_len == 0 || name_len > 4096 {
        return false;
    }
    let name = &d[30..d.len().min(30 + name_len)];
    !name.contains(&0)
}

/// The next candidate in `win[from..to]` (a candidate's bytes may run past `to`).
fn find(win: &[u8], from: usize, to: usize) -> Option<(usize, Cand)> {
    let check = |i: usize| -> Option<Cand> {
        let b = win[i];
        let next = *win.get(i + 1)?;
        if b == 0x78 && matches!(next, 0x01 | 0x5e | 0x9c | 0xda) {
            return Some(Cand::Zlib);
        }
        if b == b'P' && next == b'K' && plausible_local(&win[i..]) {
            return Some(Cand::Zip);
        }
        None
    };
    let mut i = from;
    while i < to {
        if i + 8 <= to {
            let x = u64::from_le_bytes(win[i..i + 8].try_into().expect("8 bytes"));
            if !has_byte(x, 0x78) && !has_byte(x, b'P') {
                i += 8;
                continue;
            }
            for j in i..i + 8 {
                if let Some(c) = check(j) {
                    return Some((j, c));
                }
            }
            i += 8;
        } else {
            if let Some(c) = check(i) {
                return Some((i, c));
            }
            i += 1;
        }
    }
    None
}

/// Decodes the start of a zlib candidate in memory: true when it is a stream worth opening.
fn probe(state: &mut (Decompress, Vec<u8>), d: &[u8]) -> bool {
    let (dec, out) = state;
    dec.reset(true);
    let d = &d[..d.len().min(KEEP)];
    match dec.decompress(d, out, FlushDecompress::None) {
        Ok(Status::StreamEnd) => true,
        Ok(_) => {
            dec.total_in() >= PROBE_IN.min(d.len() as u64 + 1)
                || dec.total_out() as usize == out.len()
        }
        Err(_) => false,
    }
}

/// An end of central directory record in `tail` that an extractor would take: its offset
/// within `tail`, or `None`.
fn eocd(tail: &[u8]) -> Option<usize> {
    let mut at = tail.len().checked_sub(22)?;
    loop {
        let d = &tail[at..];
        if d.starts_with(b"PK\x05\x06") {
            let disk = u16::from_le_bytes([d[4], d[5]]);
            let cd_disk = u16::from_le_bytes([d[6], d[7]]);
            let here = u16::from_le_bytes([d[8], d[9]]);
            let total = u16::from_le_bytes([d[10], d[11]]);
            let comment = usize::from(u16::from_le_bytes([d[20], d[21]]));
            if (disk == cd_disk || disk == 0xffff)
                && here == total
                && total != 0
                && 22 + comment <= d.len()
            {
                return Some(at);
            }
        }
        at = at.checked_sub(1)?;
    }
}

impl Scan<'_> {
    /// Reads a plain file to its end, opening what it carries (see the module doc).
    pub(crate) fn carve(
        &mut self,
        rd: &mut dyn Read,
        node: &Node<'_>,
        space: &RefCell<Space>,
        base: u64,
    ) -> io::Result<()> {
        let mut tail = Tail {
            inner: rd,
            ring: Vec::new(),
            w: 0,
            pos: 0,
            pdf: None,
        };
        // The search window, allocated once (no more than the file holds, so small files stay
        // small); `win[..end]` holds bytes, `win_off` is the file offset of `win[0]`.
        let cap = node.size.map_or(WIN + KEEP, |s| {
            (s as usize).saturating_add(1).clamp(2 * KEEP, WIN + KEEP)
        });
        let mut win = vec![0u8; cap];
        let mut end = 0usize;
        let mut from = 0usize;
        let mut eof = false;
        let mut walked: Vec<(u64, u64)> = Vec::new();
        let mut failed: Option<String> = None;
        let mut stop = false;
        loop {
            while end < win.len() && !eof {
                match tail.read(&mut win[end..]) {
                    Ok(0) => eof = true,
                    Ok(k) => end += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            let to = if eof { end } else { end.saturating_sub(KEEP) };
            let win_off = tail.pos - end as u64;
            if win_off == 0 && win[..end].starts_with(b"%PDF-") && tail.pdf.is_none() {
                let mut names = PdfNames::default();
                names.feed(&win[..end]);
                tail.pdf = Some(names);
            }
            let found = if stop {
                None
            } else {
                // Any valid zlib header opens a file; further in, only the common ones.
                if from == 0 && win_off == 0 && end >= 2 && zlib_header(win[0], win[1]) {
                    Some((0, Cand::Zlib))
                } else {
                    find(&win[..end], from, to)
                }
            };
            let Some((i, cand)) = found else {
                if eof {
                    break;
                }
                win.copy_within(to..end, 0);
                end -= to;
                from = 0;
                continue;
            };
            if cand == Cand::Zlib {
                let state = self
                    .probe
                    .get_or_insert_with(|| (Decompress::new(true), vec![0u8; PROBE_OUT]));
                if !probe(state, &win[i..end]) {
                    from = i + 1;
                    continue;
                }
            }
            if node.depth >= self.limits.max_depth {
                self.unreadable(node.path, "limit:depth".into(), node.path_size);
                stop = true;
                from = i + 1;
                continue;
            }
            // Open the stream or zip at `i`: the reader is the window from `i`, then the rest.
            let at = win_off + i as u64;
            let rest = {
                let encoded = Cell::new(0u64);
                let chained = io::Cursor::new(&win[i..end]).chain(&mut tail);
                let mut br = BufReader::with_capacity(
                    64 << 10,
                    Counting {
                        inner: chained,
                        n: &encoded,
                    },
                );
                match cand {
                    Cand::Zlib => {
                        let id = self.id();
                        let need = decoder_need("zlib", &win[i..end], self.limits);
                        match self.budget.reserve(need.bytes) {
                            None => {
                                self.unreadable(
                                    node.path,
                                    "limit:decoder-memory".into(),
                                    node.path_size,
                                );
                                stop = true;
                            }
                            Some(_reservation) => {
                                let dec = flate2::bufread::ZlibDecoder::new(&mut br);
                                let child = Node {
                                    path: node.path,
                                    size: None,
                                    path_size: node.path_size,
                                    depth: node.depth + 1,
                                    top: false,
                                };
                                self.decoded_space(Box::new(dec), id, "zlib", &encoded, &child)?;
                            }
                        }
                    }
                    Cand::Zip => {
                        let limits = ZipLimits {
                            budget: Some(std::rc::Rc::clone(&self.budget)),
                            prefix: at,
                            ..ZipLimits::new(
                                self.limits.max_zip_entries,
                                self.limits.zstd_window_log_max,
                                self.limits.xz_memory_kib,
                            )
                        };
                        let mut counted = Counted::new(&mut br);
                        let mut v = ZipWalk {
                            scan: self,
                            node,
                            space,
                            base: base + at,
                        };
                        match zip::walk_zip(&mut counted, &limits, &mut v) {
                            Ok(()) => walked.push((at, at + counted.pos)),
                            Err(zip::ZipError::Io(e)) if ours(&e) => return Err(e),
                            Err(e) => failed = Some(e.reason()),
                        }
                    }
                }
                let mut rest = br.buffer().to_vec();
                let counting = br.into_inner();
                let (cursor, _) = counting.inner.into_inner();
                let used = cursor.position() as usize;
                rest.extend_from_slice(&cursor.get_ref()[used..]);
                rest
            };
            if let Some(reason) = failed.take() {
                self.unreadable(node.path, reason, node.path_size);
                stop = true; // the walk took bytes it could not account for
            }
            let new_off = tail.pos - rest.len() as u64;
            if rest.len() > win.len() {
                win.resize(rest.len(), 0);
            }
            win[..rest.len()].copy_from_slice(&rest);
            end = rest.len();
            // Never stand still: a candidate that consumed nothing is passed over.
            from = if new_off <= at {
                (at - new_off) as usize + 1
            } else {
                0
            };
        }
        if let Some(reason) = tail.pdf.as_ref().and_then(|p| p.hit) {
            self.unreadable(node.path, reason.into(), node.path_size);
        }
        // A zip an extractor would open (its end record where they look) that no walk reached.
        let (tail_bytes, tail_start) = tail.kept();
        if let Some(e) = eocd(&tail_bytes) {
            let off = tail_start + e as u64;
            if !walked.iter().any(|&(s, end)| s <= off && off < end) {
                self.unreadable(node.path, "format:zip-unreached".into(), node.path_size);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_and_probes() {
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut z, b"hello hello hello hello").unwrap();
        let z = z.finish().unwrap();
        let mut d = b"some text first ".to_vec();
        let at = d.len();
        d.extend_from_slice(&z);
        assert_eq!(find(&d, 0, d.len()), Some((at, Cand::Zlib)));
        let mut st = (Decompress::new(true), vec![0u8; PROBE_OUT]);
        assert!(probe(&mut st, &d[at..]));
        assert!(!probe(&mut st, b"\x78\x9c\xff\xff\xff\xff\xff\xff"));
        assert!(!plausible_local(
            b"PK\x03\x04 not a header at all, no no no no"
        ));
    }
}
