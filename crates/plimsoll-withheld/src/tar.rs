//! A streaming tar reader that reads the way Go's archive/tar (which Docker and containerd use
//! to apply layers) reads, so the scanner sees the same entries the engine unpacks.
//!
//! It parses one 512-byte header at a time (fields through the `tar` crate's `Header`), holds
//! at most one PAX header or GNU long name in memory (bounded by `max_header`), never unpacks,
//! never follows a link and never trusts a name: names are labels only.
//!
//! Go's rules it mirrors: a header is valid when its checksum matches the signed or the
//! unsigned sum; PAX `size`, `path` and `linkpath` override the header; GNU `L`/`K` set long
//! names; links, directories, devices and FIFOs carry no data whatever their size field says;
//! end of archive is two zero blocks, one zero block then EOF, or EOF at a header boundary.

use std::io::{self, Read};

const BLOCK: u64 = 512;

/// Why a tar stream could not be read further.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TarError {
    /// The stream ended inside a header, its data or padding.
    #[error("tar is truncated")]
    Truncated,
    /// A header or PAX record is malformed.
    #[error("tar is corrupt: {0}")]
    Corrupt(String),
    /// A PAX header or GNU long name is larger than the limit.
    #[error("tar extension header of {0} bytes is over the limit")]
    HeaderLimit(u64),
    /// Reading the underlying stream failed.
    #[error("reading tar: {0}")]
    Io(#[from] io::Error),
}

impl TarError {
    fn from_io(e: io::Error) -> TarError {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            TarError::Truncated
        } else {
            TarError::Io(e)
        }
    }
}

/// One entry's header, after PAX and GNU extensions are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TarEntry {
    /// The entry's name as raw bytes.
    pub path: Vec<u8>,
    /// The link target for hard and symbolic links.
    pub link: Option<Vec<u8>>,
    /// The type flag byte (`b'0'` regular, `b'5'` directory, ...).
    pub kind: u8,
    /// Bytes of data that follow the header in the archive.
    pub size: u64,
    /// Offset of the entry's first header block (including extension headers).
    pub start: u64,
    /// Offset of the entry's data.
    pub data_start: u64,
    /// A GNU or PAX sparse file: its data is a map of regions, not the file's bytes in order.
    pub sparse: bool,
}

impl TarEntry {
    /// Offset just after the entry's data and padding.
    pub fn end(&self) -> u64 {
        self.data_start + self.size.div_ceil(BLOCK) * BLOCK
    }
}

/// Streaming reader of tar entries.
#[derive(Debug)]
pub struct TarReader<R> {
    inner: R,
    pos: u64,
    remaining: u64,
    pad: u64,
    max_header: u64,
    done: bool,
    tag: Option<u64>,
}

fn parse_octal(field: &[u8]) -> Result<u64, TarError> {
    let t: &[u8] = {
        let start = field.iter().position(|&b| b != b' ' && b != 0);
        match start {
            None => return Ok(0),
            Some(s) => {
                let end = field
                    .iter()
                    .rposition(|&b| b != b' ' && b != 0)
                    .unwrap_or(s);
                &field[s..=end]
            }
        }
    };
    let mut v: u64 = 0;
    for &b in t {
        if !(b'0'..=b'7').contains(&b) {
            return Err(TarError::Corrupt(format!(
                "numeric field {:?} is not octal",
                String::from_utf8_lossy(field)
            )));
        }
        v = v
            .checked_mul(8)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
            .ok_or_else(|| TarError::Corrupt("numeric field overflows".into()))?;
    }
    Ok(v)
}

/// Go's parseNumeric: base-256 when the high bit is set, octal otherwise.
fn parse_numeric(field: &[u8]) -> Result<u64, TarError> {
    if field.first().is_some_and(|&b| b & 0x80 != 0) {
        if field[0] & 0x40 != 0 {
            return Err(TarError::Corrupt("negative base-256 number".into()));
        }
        let mut v: u64 = u64::from(field[0] & 0x3f);
        for &b in &field[1..] {
            if v >> 56 != 0 {
                return Err(TarError::Corrupt("base-256 number overflows".into()));
            }
            v = (v << 8) | u64::from(b);
        }
        if v > i64::MAX as u64 {
            return Err(TarError::Corrupt("base-256 number overflows".into()));
        }
        return Ok(v);
    }
    parse_octal(field)
}

fn cstr(field: &[u8]) -> &[u8] {
    match field.iter().position(|&b| b == 0) {
        Some(n) => &field[..n],
        None => field,
    }
}

fn checksum_ok(block: &[u8; 512]) -> Result<bool, TarError> {
    let want = parse_octal(&block[148..156])?;
    let mut unsigned: u64 = 0;
    let mut signed: i64 = 0;
    for (i, &b) in block.iter().enumerate() {
        let b = if (148..156).contains(&i) { b' ' } else { b };
        unsigned += u64::from(b);
        signed += i64::from(b as i8);
    }
    Ok(want == unsigned || i64::try_from(want).is_ok_and(|w| w == signed))
}

/// True when a block looks like a tar header: ustar magic, or a valid v7 checksum.
pub fn looks_like_tar(block: &[u8]) -> bool {
    if block.len() < 512 {
        return false;
    }
    if &block[257..262] == b"ustar" {
        return true;
    }
    let b: &[u8; 512] = block[..512].try_into().expect("512 bytes");
    b.iter().any(|&x| x != 0) && b[0] != 0 && checksum_ok(b).unwrap_or(false)
}

struct Pax {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
    sparse: bool,
}

fn parse_pax(data: &[u8], pax: &mut Pax) -> Result<(), TarError> {
    let bad = |m: &str| TarError::Corrupt(format!("PAX record {m}"));
    let mut rest = data;
    while !rest.is_empty() {
        // Go stops at a NUL-padded tail.
        if rest.iter().all(|&b| b == 0) {
            break;
        }
        let sp = rest
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| bad("has no length"))?;
        let len: usize = std::str::from_utf8(&rest[..sp])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("length is not a number"))?;
        if len <= sp + 1 || len > rest.len() || rest[len - 1] != b'\n' {
            return Err(bad("length is wrong"));
        }
        let rec = &rest[sp + 1..len - 1];
        let eq = rec
            .iter()
            .position(|&b| b == b'=')
            .ok_or_else(|| bad("has no '='"))?;
        let (key, value) = (&rec[..eq], &rec[eq + 1..]);
        match key {
            b"path" => pax.path = Some(value.to_vec()),
            b"linkpath" => pax.link = Some(value.to_vec()),
            b"size" => {
                let v: u64 = std::str::from_utf8(value)
                    .ok()
                    .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|s| s.parse().ok())
                    .filter(|&v| v <= i64::MAX as u64)
                    .ok_or_else(|| bad("size is not a number"))?;
                pax.size = Some(v);
            }
            b"GNU.sparse.name" => {
                pax.path = Some(value.to_vec());
                pax.sparse = true;
            }
            k if k.starts_with(b"GNU.sparse.") => pax.sparse = true,
            _ => {}
        }
        rest = &rest[len..];
    }
    Ok(())
}

impl<R: Read> TarReader<R> {
    /// A reader over `inner`, with extension headers bounded by `max_header` bytes.
    pub fn new(inner: R, max_header: u64) -> TarReader<R> {
        TarReader {
            inner,
            pos: 0,
            remaining: 0,
            pad: 0,
            max_header,
            done: false,
            tag: None,
        }
    }

    /// Marks the early end of an entry's data as this scan node's own error (so a decoder
    /// reading that data does not take the truncation for its own corruption).
    pub(crate) fn with_tag(mut self, tag: u64) -> TarReader<R> {
        self.tag = Some(tag);
        self
    }

    /// Bytes consumed from the underlying stream so far.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// The underlying stream (positioned after what was consumed).
    pub fn into_inner(self) -> R {
        self.inner
    }

    /// A mutable reference to the underlying stream.
    pub fn inner_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    fn read_block(&mut self, block: &mut [u8; 512]) -> Result<bool, TarError> {
        let mut got = 0;
        while got < 512 {
            match self.inner.read(&mut block[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(TarError::from_io(e)),
            }
        }
        self.pos += got as u64;
        match got {
            0 => Ok(false),
            512 => Ok(true),
            _ => Err(TarError::Truncated),
        }
    }

    fn skip(&mut self, mut n: u64) -> Result<(), TarError> {
        let mut buf = [0u8; 8192];
        while n > 0 {
            let want = n.min(buf.len() as u64) as usize;
            let got = match self.inner.read(&mut buf[..want]) {
                Ok(0) => return Err(TarError::Truncated),
                Ok(g) => g,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(TarError::from_io(e)),
            };
            self.pos += got as u64;
            n -= got as u64;
        }
        Ok(())
    }

    fn read_ext(&mut self, size: u64) -> Result<Vec<u8>, TarError> {
        if size > self.max_header {
            return Err(TarError::HeaderLimit(size));
        }
        let mut data = vec![0u8; size as usize];
        self.inner
            .read_exact(&mut data)
            .map_err(TarError::from_io)?;
        self.pos += size;
        let pad = size.div_ceil(BLOCK) * BLOCK - size;
        self.skip(pad)?;
        Ok(data)
    }

    /// Skips what is left of the current entry and reads the next header. `Ok(None)` is the
    /// end of the archive; bytes after it are left in the stream.
    pub fn next_entry(&mut self) -> Result<Option<TarEntry>, TarError> {
        if self.done {
            return Ok(None);
        }
        let left = self.remaining + self.pad;
        self.remaining = 0;
        self.pad = 0;
        self.skip(left)?;
        let start = self.pos;
        let mut pax = Pax {
            path: None,
            link: None,
            size: None,
            sparse: false,
        };
        let mut long_name: Option<Vec<u8>> = None;
        let mut long_link: Option<Vec<u8>> = None;
        let mut block = [0u8; 512];
        loop {
            if !self.read_block(&mut block)? {
                self.done = true;
                return Ok(None);
            }
            if block.iter().all(|&b| b == 0) {
                // One zero block then EOF, or two zero blocks, end the archive.
                if !self.read_block(&mut block)? || block.iter().all(|&b| b == 0) {
                    self.done = true;
                    return Ok(None);
                }
                return Err(TarError::Corrupt(
                    "a zero block is followed by a header".into(),
                ));
            }
            if !checksum_ok(&block)? {
                return Err(TarError::Corrupt("header checksum mismatch".into()));
            }
            let kind = block[156];
            let size = parse_numeric(&block[124..136])?;
            match kind {
                b'x' => {
                    let data = self.read_ext(size)?;
                    parse_pax(&data, &mut pax)?;
                }
                b'L' => {
                    let data = self.read_ext(size)?;
                    long_name = Some(cstr(&data).to_vec());
                }
                b'K' => {
                    let data = self.read_ext(size)?;
                    long_link = Some(cstr(&data).to_vec());
                }
                _ => break,
            }
        }
        let kind = block[156];
        let ustar = &block[257..263] == b"ustar\0";
        let gnu = &block[257..265] == b"ustar  \0";
        let mut sparse = pax.sparse;
        if kind == b'S' && gnu {
            sparse = true;
            // Old GNU sparse: extension blocks follow while `isextended` is set.
            let mut extended = block[482] != 0;
            let mut ext = [0u8; 512];
            while extended {
                if !self.read_block(&mut ext)? {
                    return Err(TarError::Truncated);
                }
                extended = ext[504] != 0;
            }
        }
        let path = if let Some(p) = pax.path {
            p
        } else if let Some(p) = long_name {
            p
        } else {
            let name = cstr(&block[0..100]);
            let prefix = if ustar {
                cstr(&block[345..500])
            } else {
                &[][..]
            };
            if prefix.is_empty() {
                name.to_vec()
            } else {
                let mut p = prefix.to_vec();
                p.push(b'/');
                p.extend_from_slice(name);
                p
            }
        };
        let link = if matches!(kind, b'1' | b'2') {
            Some(
                pax.link
                    .or(long_link)
                    .unwrap_or_else(|| cstr(&block[157..257]).to_vec()),
            )
        } else {
            None
        };
        let size = match pax.size {
            Some(s) => s,
            None => parse_numeric(&block[124..136])?,
        };
        let data = if matches!(kind, b'1' | b'2' | b'3' | b'4' | b'5' | b'6') {
            0
        } else {
            size
        };
        self.remaining = data;
        self.pad = data.div_ceil(BLOCK) * BLOCK - data;
        Ok(Some(TarEntry {
            path,
            link,
            kind,
            size: data,
            start,
            data_start: self.pos,
            sparse,
        }))
    }

    /// Reads the current entry's data.
    pub fn data(&mut self) -> EntryData<'_, R> {
        EntryData { tar: self }
    }
}

/// The data of the current entry; EOF at its end, `UnexpectedEof` if the stream ends early.
#[derive(Debug)]
pub struct EntryData<'a, R> {
    tar: &'a mut TarReader<R>,
}

impl<R: Read> Read for EntryData<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.tar.remaining == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(self.tar.remaining.min(usize::MAX as u64) as usize);
        let n = self.tar.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(match self.tar.tag {
                Some(tag) => crate::tag::tagged(tag, "format:tar-truncated"),
                None => io::Error::new(io::ErrorKind::UnexpectedEof, "tar entry data is truncated"),
            });
        }
        self.tar.remaining -= n as u64;
        self.tar.pos += n as u64;
        Ok(n)
    }
}

/// What one entry looked like, for tests and fuzzing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntrySummary {
    /// The entry header.
    pub entry: TarEntry,
    /// The bytes of its data that were read.
    pub data_len: u64,
}

/// Walks a whole tar held in memory, reading every entry's data: the fuzz target for the tar
/// reader. It returns the entries seen before the first error, and the error.
pub fn walk_tar(bytes: &[u8], max_header: u64) -> (Vec<EntrySummary>, Option<TarError>) {
    let mut tar = TarReader::new(bytes, max_header);
    let mut out = Vec::new();
    loop {
        match tar.next_entry() {
            Ok(Some(entry)) => {
                let mut sink = io::sink();
                match io::copy(&mut tar.data(), &mut sink) {
                    Ok(n) => out.push(EntrySummary { entry, data_len: n }),
                    Err(e) => return (out, Some(TarError::from_io(e))),
                }
            }
            Ok(None) => return (out, None),
            Err(e) => return (out, Some(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &str, kind: u8, size: u64) -> [u8; 512] {
        let mut h = tar::Header::new_ustar();
        h.set_path(name).unwrap();
        h.set_size(size);
        h.set_entry_type(tar::EntryType::new(kind));
        h.set_mode(0o644);
        h.set_cksum();
        *h.as_bytes()
    }

    fn archive(entries: &[(&str, u8, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, kind, data) in entries {
            out.extend_from_slice(&header(name, *kind, data.len() as u64));
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
        out.extend_from_slice(&[0u8; 1024]);
        out
    }

    #[test]
    fn reads_entries_and_offsets() {
        let a = archive(&[("a.txt", b'0', b"hello"), ("dir/", b'5', b"")]);
        let (entries, err) = walk_tar(&a, 1 << 20);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].entry.path, b"a.txt");
        assert_eq!(entries[0].data_len, 5);
        assert_eq!(entries[0].entry.data_start, 512);
        assert_eq!(entries[1].entry.start, 1024);
    }

    #[test]
    fn pax_size_overrides_the_header_like_go() {
        // The header says 0 bytes, PAX says 600: Go reads 600 bytes of data (the tar crate
        // before 0.4.45 did not), so a file hidden there is read.
        let mut out = Vec::new();
        let rec = b"12 size=600\n";
        out.extend_from_slice(&header("././@PaxHeader", b'x', rec.len() as u64));
        out.extend_from_slice(rec);
        out.resize(1024, 0);
        out.extend_from_slice(&header("hidden.bin", b'0', 0));
        out.extend_from_slice(&[7u8; 600]);
        out.resize(out.len().div_ceil(512) * 512, 0);
        out.extend_from_slice(&[0u8; 1024]);
        let (entries, err) = walk_tar(&out, 1 << 20);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].data_len, 600);
        assert_eq!(entries[0].entry.start, 0);
    }

    #[test]
    fn links_carry_no_data_whatever_the_size_field_says() {
        let mut out = Vec::new();
        out.extend_from_slice(&header("link", b'2', 512));
        out.extend_from_slice(&header("next", b'0', 3));
        out.extend_from_slice(b"abc");
        out.resize(out.len().div_ceil(512) * 512, 0);
        out.extend_from_slice(&[0u8; 1024]);
        let (entries, err) = walk_tar(&out, 1 << 20);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1].entry.path, b"next");
    }

    #[test]
    fn truncation_corruption_and_huge_headers_are_errors() {
        let a = archive(&[("a.txt", b'0', &[1u8; 1000])]);
        let (_, err) = walk_tar(&a[..700], 1 << 20);
        assert!(matches!(err, Some(TarError::Truncated)), "{err:?}");
        let mut bad = a.clone();
        bad[10] ^= 0x55;
        let (_, err) = walk_tar(&bad, 1 << 20);
        assert!(matches!(err, Some(TarError::Corrupt(_))), "{err:?}");
        let mut big = Vec::new();
        big.extend_from_slice(&header("././@LongLink", b'L', 5 << 20));
        let (_, err) = walk_tar(&big, 1 << 20);
        assert!(matches!(err, Some(TarError::HeaderLimit(_))), "{err:?}");
        let mut absurd = header("x", b'0', 0);
        absurd[124..136].copy_from_slice(&[0xff; 12]);
        let (_, err) = walk_tar(&absurd, 1 << 20);
        assert!(matches!(err, Some(TarError::Corrupt(_))), "{err:?}");
    }

    #[test]
    fn garbage_never_panics() {
        let mut x = 1u64;
        for len in [0usize, 1, 511, 512, 513, 1024, 4096] {
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    (x >> 33) as u8
                })
                .collect();
            let _ = walk_tar(&data, 1 << 20);
            assert!(!looks_like_tar(&data) || len >= 512);
        }
    }
}
