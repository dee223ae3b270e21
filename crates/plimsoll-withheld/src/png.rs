//! PNG: the signature, then chunks (length, type, data, CRC). The data of consecutive IDAT
//! chunks is one zlib stream, decoded and scanned as the image's pixels; every other chunk's
//! data is read as a plain file (so the zlib of `zTXt`, `iTXt` and `iCCP` is found by the
//! carver); bytes after `IEND` are read as a plain file too (an appended zip is found there).
//! A PNG that breaks off or whose IDAT stream does not decode is unreadable
//! (`format:png-corrupt`, `format:png-idat-corrupt`).

use std::cell::{Cell, RefCell};
use std::io::{self, BufReader, Read};

use crate::tag::{own_reason, tagged};
use crate::walk::{Counting, Node, Scan, Space};

/// The data of a run of IDAT chunks, as one stream; stops at the first other chunk.
struct Idat<'r> {
    inner: &'r mut dyn Read,
    left: u64,
    next: Option<[u8; 8]>,
    done: bool,
    id: u64,
}

fn read_full(r: &mut dyn Read, buf: &mut [u8], id: u64) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => return Err(tagged(id, "format:png-corrupt")),
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Read for Idat<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.left == 0 {
            if self.done {
                return Ok(0);
            }
            let mut crc_and_header = [0u8; 12];
            read_full(self.inner, &mut crc_and_header[..4], self.id)?;
            let mut h = [0u8; 8];
            read_full(self.inner, &mut h, self.id)?;
            if &h[4..] == b"IDAT" {
                self.left = u64::from(u32::from_be_bytes([h[0], h[1], h[2], h[3]]));
            } else {
                self.next = Some(h);
                self.done = true;
                return Ok(0);
            }
        }
        let k = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..k])?;
        if n == 0 {
            return Err(tagged(self.id, "format:png-corrupt"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

impl Scan<'_> {
    /// Reads a PNG (see the module doc).
    pub(crate) fn walk_png(
        &mut self,
        rd: &mut dyn Read,
        node: &Node<'_>,
        space: &RefCell<Space>,
        base: u64,
    ) -> io::Result<()> {
        if node.depth >= self.limits.max_depth {
            self.unreadable(node.path, "limit:depth".into(), node.path_size);
            return Ok(());
        }
        let id = self.id();
        let pos = Cell::new(0u64);
        let mut rd = Counting { inner: rd, n: &pos };
        match self.png_chunks(&mut rd, &pos, id, node, space, base) {
            Ok(()) => Ok(()),
            Err(e) => match own_reason(&e, id) {
                Some(reason) => {
                    self.unreadable(node.path, reason, node.path_size);
                    Ok(())
                }
                None => Err(e),
            },
        }
    }

    fn png_chunks(
        &mut self,
        rd: &mut dyn Read,
        pos: &Cell<u64>,
        id: u64,
        node: &Node<'_>,
        space: &RefCell<Space>,
        base: u64,
    ) -> io::Result<()> {
        let mut sig = [0u8; 8];
        read_full(rd, &mut sig, id)?;
        let mut pending: Option<[u8; 8]> = None;
        let child = |size| Node {
            path: node.path,
            size,
            path_size: node.path_size,
            depth: node.depth + 1,
            top: false,
        };
        loop {
            let h = match pending.take() {
                Some(h) => h,
                None => {
                    let mut h = [0u8; 8];
                    read_full(rd, &mut h, id)?;
                    h
                }
            };
            let len = u64::from(u32::from_be_bytes([h[0], h[1], h[2], h[3]]));
            if len > 0x7fff_ffff {
                return Err(tagged(id, "format:png-corrupt"));
            }
            if &h[4..] == b"IDAT" {
                let mut idat = Idat {
                    inner: &mut *rd,
                    left: len,
                    next: None,
                    done: false,
                    id,
                };
                {
                    let dec_id = self.id();
                    let encoded = Cell::new(0u64);
                    let input = BufReader::with_capacity(
                        32 << 10,
                        Counting {
                            inner: &mut idat,
                            n: &encoded,
                        },
                    );
                    let dec = flate2::bufread::ZlibDecoder::new(input);
                    let node = child(None);
                    self.decoded_space(Box::new(dec), dec_id, "png-idat", &encoded, &node)?;
                }
                // What the decoder left of the IDAT run, up to the next chunk's header.
                io::copy(&mut idat, &mut io::sink())?;
                pending = Some(idat.next.ok_or_else(|| tagged(id, "format:png-corrupt"))?);
                continue;
            }
            let at = pos.get();
            let mut data = (&mut *rd).take(len);
            self.carve(&mut data, &child(Some(len)), space, base + at)?;
            if data.limit() != 0 {
                return Err(tagged(id, "format:png-corrupt"));
            }
            let mut crc = [0u8; 4];
            read_full(rd, &mut crc, id)?;
            if &h[4..] == b"IEND" {
                break;
            }
        }
        let at = pos.get();
        self.carve(rd, &child(None), space, base + at)
    }
}
