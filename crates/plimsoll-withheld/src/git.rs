//! git's object storage: loose objects (a zlib stream of `<type> <size>\0` and the content; the
//! zlib part is opened by the carver, the header here) and packs (`PACK`, a count, then each
//! object as a type/size header and a zlib stream; deltas name their base by offset or by id).
//!
//! A pack's whole objects are scanned as files named `pack!object@<offset>`. Deltas are
//! rebuilt against their base when the base is held: the last objects up to
//! [`Limits::max_git_object`](crate::Limits) bytes are kept (reserved from the decoder memory),
//! chains up to `max_git_delta_depth` deep. A delta that cannot be rebuilt (base not held,
//! chain too deep, object too large) is unreadable with its `limit:git-…` reason; its
//! instructions (which hold every inserted byte) are still scanned.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read};

use crate::sniff::git_object_header;
use crate::tag::own_reason;
use crate::walk::{join, Node, Scan, Source, Space, Tee};
use crate::zip::{CountBuf, Counted};

/// One object kept to rebuild deltas against.
struct Held {
    offset: u64,
    id: [u8; 20],
    kind: u8,
    depth: u32,
    data: Vec<u8>,
}

const TYPE_NAMES: [&str; 5] = ["", "commit", "tree", "blob", "tag"];

fn object_id(kind: u8, data: &[u8]) -> [u8; 20] {
    let mut c = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    c.update(format!("{} {}\0", TYPE_NAMES[usize::from(kind)], data.len()).as_bytes());
    c.update(data);
    let mut id = [0u8; 20];
    id.copy_from_slice(c.finish().as_ref());
    id
}

/// Why a pack cannot be read on.
enum PackStop {
    /// An error that is not the pack's own.
    Foreign(io::Error),
    /// The pack's reason.
    Reason(String),
}

fn corrupt() -> PackStop {
    PackStop::Reason("format:git-pack-corrupt".into())
}

fn byte<R: Read>(r: &mut R) -> Result<u8, PackStop> {
    let mut b = [0u8; 1];
    match r.read_exact(&mut b) {
        Ok(()) => Ok(b[0]),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(corrupt()),
        Err(e) => Err(PackStop::Foreign(e)),
    }
}

/// Applies a git delta to `base`; the result is at most `max` bytes.
pub fn apply_delta(base: &[u8], delta: &[u8], max: u64) -> Result<Vec<u8>, String> {
    let bad = || "format:git-pack-corrupt".to_owned();
    let mut i = 0usize;
    let varint = |i: &mut usize| -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let c = *delta.get(*i).ok_or_else(bad)?;
            *i += 1;
            v |= u64::from(c & 0x7f) << shift;
            if c & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad())
    };
    let src = varint(&mut i)?;
    let dst = varint(&mut i)?;
    if src != base.len() as u64 {
        return Err(bad());
    }
    if dst > max {
        return Err("limit:git-object-size".into());
    }
    let mut out = Vec::with_capacity(dst as usize);
    while i < delta.len() {
        let cmd = delta[i];
        i += 1;
        if cmd & 0x80 != 0 {
            let mut off = 0u64;
            let mut len = 0u64;
            for k in 0..4 {
                if cmd & (1 << k) != 0 {
                    off |= u64::from(*delta.get(i).ok_or_else(bad)?) << (8 * k);
                    i += 1;
                }
            }
            for k in 0..3 {
                if cmd & (0x10 << k) != 0 {
                    len |= u64::from(*delta.get(i).ok_or_else(bad)?) << (8 * k);
                    i += 1;
                }
            }
            if len == 0 {
                len = 0x10000;
            }
            let end = off.checked_add(len).ok_or_else(bad)?;
            if end > base.len() as u64 || out.len() as u64 + len > dst {
                return Err(bad());
            }
            out.extend_from_slice(&base[off as usize..end as usize]);
        } else if cmd != 0 {
            let n = usize::from(cmd);
            let lit = delta.get(i..i + n).ok_or_else(bad)?;
            if out.len() + n > dst as usize {
                return Err(bad());
            }
            out.extend_from_slice(lit);
            i += n;
        } else {
            return Err(bad());
        }
    }
    if out.len() as u64 != dst {
        return Err(bad());
    }
    Ok(out)
}

impl Scan<'_> {
    /// An inflated loose object: the content after the header is the file.
    pub(crate) fn git_object(
        &mut self,
        rd: &mut dyn Read,
        node: &Node<'_>,
        space: &RefCell<Space>,
        base: u64,
    ) -> io::Result<()> {
        let mut head = Vec::with_capacity(32);
        let mut b = [0u8; 1];
        while head.len() < 32 {
            if rd.read(&mut b)? == 0 {
                break;
            }
            head.push(b[0]);
            if b[0] == 0 {
                break;
            }
        }
        let Some((hlen, size)) = git_object_header(&head) else {
            return Ok(());
        };
        let child = Node {
            path: node.path,
            size: Some(size),
            path_size: node.path_size,
            depth: node.depth + 1,
            top: false,
        };
        self.scan_node(&mut rd.take(size), &child, space, base + hlen as u64)
    }

    /// Scans bytes held in memory as a file of their own (a new space).
    fn scan_held(&mut self, data: &[u8], path: &str, depth: u32) -> io::Result<()> {
        let space = self.space();
        let size = Some(data.len() as u64);
        let node = Node {
            path,
            size,
            path_size: size,
            depth,
            top: false,
        };
        let res = {
            let mut tee = Tee {
                inner: Source(data),
                space: &space,
                set: self.set,
            };
            self.scan_node(&mut tee, &node, &space, 0)
        };
        space.borrow_mut().finish(path, size, &mut self.out);
        res
    }

    /// Reads a git pack (see the module doc). Its own problems are unreadable reasons.
    pub(crate) fn walk_pack(&mut self, rd: &mut dyn Read, node: &Node<'_>) -> io::Result<()> {
        if node.depth >= self.limits.max_depth {
            self.unreadable(node.path, "limit:depth".into(), node.path_size);
            return Ok(());
        }
        let mut r = Counted::new(BufReader::with_capacity(64 << 10, rd));
        match self.pack_objects(&mut r, node) {
            Ok(()) => Ok(()),
            Err(PackStop::Foreign(e)) => Err(e),
            Err(PackStop::Reason(reason)) => {
                self.unreadable(node.path, reason, node.path_size);
                Ok(())
            }
        }
    }

    fn pack_objects<R: BufRead>(
        &mut self,
        r: &mut Counted<R>,
        node: &Node<'_>,
    ) -> Result<(), PackStop> {
        let mut h = [0u8; 12];
        r.read_exact(&mut h).map_err(|_| corrupt())?;
        let count = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
        let max = self.limits.max_git_object;
        // The held objects, one delta and one rebuilt object: reserved for the whole pack.
        let reservation = self.budget.reserve(max.saturating_mul(3));
        let cache_cap = if reservation.is_some() { max } else { 0 };
        let mut cache: VecDeque<Held> = VecDeque::new();
        let mut held = 0u64;
        let depth = node.depth + 1;
        for _ in 0..count {
            let offset = r.pos;
            let name = join(node.path, &format!("object@{offset}"));
            let mut c = byte(r)?;
            let kind = (c >> 4) & 7;
            let mut size = u64::from(c & 15);
            let mut shift = 4;
            while c & 0x80 != 0 {
                c = byte(r)?;
                if shift > 57 {
                    return Err(corrupt());
                }
                size |= u64::from(c & 0x7f) << shift;
                shift += 7;
            }
            let base_ref = match kind {
                1..=4 => None,
                6 => {
                    let mut c = byte(r)?;
                    let mut back = u64::from(c & 0x7f);
                    while c & 0x80 != 0 {
                        c = byte(r)?;
                        back = back
                            .checked_add(1)
                            .and_then(|b| b.checked_mul(128))
                            .ok_or_else(corrupt)?
                            | u64::from(c & 0x7f);
                    }
                    Some(Err(offset.checked_sub(back).ok_or_else(corrupt)?))
                }
                7 => {
                    let mut id = [0u8; 20];
                    r.read_exact(&mut id).map_err(|_| corrupt())?;
                    Some(Ok(id))
                }
                _ => return Err(corrupt()),
            };
            // Objects that fit are decoded into memory; larger ones are streamed.
            if size > cache_cap {
                self.pack_stream(r, &name, size, depth)?;
                if base_ref.is_some() {
                    let reason = if cache_cap == 0 {
                        "limit:decoder-memory"
                    } else {
                        "limit:git-object-size"
                    };
                    self.unreadable(&name, reason.into(), Some(size));
                }
                continue;
            }
            let data = self.pack_inflate(r, size)?;
            let (kind, depth_of, content) = match base_ref {
                None => (kind, 0, data),
                Some(base_ref) => {
                    let base = cache.iter().find(|h| match base_ref {
                        Err(off) => h.offset == off,
                        Ok(id) => h.id == id,
                    });
                    let rebuilt = match base {
                        None => Err("limit:git-delta-base".to_owned()),
                        Some(b) if b.depth >= self.limits.max_git_delta_depth => {
                            Err("limit:git-delta-depth".to_owned())
                        }
                        Some(b) => {
                            apply_delta(&b.data, &data, max).map(|o| (b.kind, b.depth + 1, o))
                        }
                    };
                    match rebuilt {
                        Ok(x) => x,
                        Err(reason) => {
                            self.scan_held(&data, &name, depth)
                                .map_err(PackStop::Foreign)?;
                            self.unreadable(&name, reason, Some(size));
                            continue;
                        }
                    }
                }
            };
            self.scan_held(&content, &name, depth)
                .map_err(PackStop::Foreign)?;
            let len = content.len() as u64;
            if len <= cache_cap {
                while held + len > cache_cap {
                    let Some(old) = cache.pop_front() else { break };
                    held -= old.data.len() as u64;
                }
                held += len;
                cache.push_back(Held {
                    offset,
                    id: object_id(kind, &content),
                    kind,
                    depth: depth_of,
                    data: content,
                });
            }
        }
        drop(cache);
        drop(reservation);
        Ok(())
    }

    /// Inflates one object of `size` bytes into memory, within the decoded-size limits.
    fn pack_inflate<R: BufRead>(
        &mut self,
        r: &mut Counted<R>,
        size: u64,
    ) -> Result<Vec<u8>, PackStop> {
        let id = self.id();
        let encoded = Cell::new(0u64);
        let mut out = Vec::with_capacity(size as usize);
        let res = {
            let input = CountBuf {
                inner: &mut *r,
                n: &encoded,
            };
            let dec = flate2::bufread::ZlibDecoder::new(input);
            let mut lim = self.limited(dec, id, "git-pack", &encoded, false);
            (&mut lim).take(size + 1).read_to_end(&mut out)
        };
        match res {
            Ok(_) if out.len() as u64 == size => Ok(out),
            Ok(_) => Err(corrupt()),
            Err(e) => Err(match own_reason(&e, id) {
                Some(reason) => PackStop::Reason(reason),
                None => PackStop::Foreign(e),
            }),
        }
    }

    /// Streams one large object as a decoded file; the pack stops if it does not end.
    fn pack_stream<R: BufRead>(
        &mut self,
        r: &mut Counted<R>,
        name: &str,
        size: u64,
        depth: u32,
    ) -> Result<(), PackStop> {
        let id = self.id();
        let encoded = Cell::new(0u64);
        let input = CountBuf {
            inner: &mut *r,
            n: &encoded,
        };
        let mut dec = flate2::bufread::ZlibDecoder::new(input);
        let child = Node {
            path: name,
            size: Some(size),
            path_size: Some(size),
            depth: depth - 1,
            top: false,
        };
        self.decoded_space(Box::new(&mut dec), id, "git-pack", &encoded, &child)
            .map_err(PackStop::Foreign)?;
        let mut b = [0u8; 1];
        match dec.read(&mut b) {
            Ok(0) => Ok(()),
            // The object stopped early (a limit, corrupt data): where the next one starts is
            // not known, so the rest of the pack is unreadable for the same reason.
            _ => Err(PackStop::Reason(
                self.out
                    .unreadable
                    .iter()
                    .rev()
                    .find(|u| u.path == name)
                    .map_or_else(
                        || "format:git-pack-corrupt".to_owned(),
                        |u| u.reason.clone(),
                    ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_copy_and_insert() {
        let base = b"0123456789abcdef";
        // src 16, dst 9: copy 4 bytes at offset 2, insert "XYZ", copy 2 at 14.
        let delta = [16, 9, 0x91, 2, 4, 3, b'X', b'Y', b'Z', 0x91, 14, 2];
        assert_eq!(apply_delta(base, &delta, 100).unwrap(), b"2345XYZef");
        assert!(apply_delta(base, &delta, 5).is_err());
        assert!(apply_delta(base, &[16, 9, 0x91, 15, 4], 100).is_err());
    }
}
