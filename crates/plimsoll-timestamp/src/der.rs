//! A minimal, strict DER reader and writer for the few ASN.1 shapes RFC 3161 and CMS use.
//!
//! The reader never panics and never allocates in proportion to a length it has not seen the
//! bytes for: every length is checked against the bytes actually present. Only definite
//! lengths and single-byte tags are accepted (DER needs nothing else for these structures).
//! Certificates themselves are parsed by `x509-parser`, not here.

use crate::Error;

/// Tag bytes used by the structures this crate reads.
pub(crate) mod tag {
    pub const BOOLEAN: u8 = 0x01;
    pub const INTEGER: u8 = 0x02;
    pub const BIT_STRING: u8 = 0x03;
    pub const OCTET_STRING: u8 = 0x04;
    pub const NULL: u8 = 0x05;
    pub const OID: u8 = 0x06;
    pub const GENERALIZED_TIME: u8 = 0x18;
    pub const SEQUENCE: u8 = 0x30;
    pub const SET: u8 = 0x31;
    /// `[n]` constructed, context-specific.
    pub const fn ctx_cons(n: u8) -> u8 {
        0xa0 | n
    }
    /// `[n]` primitive, context-specific.
    pub const fn ctx_prim(n: u8) -> u8 {
        0x80 | n
    }
}

/// One tag-length-value element.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tlv<'a> {
    /// The identifier octet.
    pub tag: u8,
    /// The contents octets.
    pub value: &'a [u8],
    /// The whole element: identifier, length and contents.
    pub raw: &'a [u8],
}

/// Reads consecutive elements out of a byte slice; `ctx` names the structure in errors.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    ctx: &'static str,
}

pub(crate) fn malformed(ctx: &'static str, reason: impl Into<String>) -> Error {
    Error::Malformed {
        at: ctx,
        reason: reason.into(),
    }
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], ctx: &'static str) -> Self {
        Reader { buf, pos: 0, ctx }
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    pub fn peek_tag(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    /// The next element, whatever its tag.
    pub fn any(&mut self) -> Result<Tlv<'a>, Error> {
        let start = self.pos;
        let rest = self.buf.get(start..).unwrap_or_default();
        let (&t, after) = rest
            .split_first()
            .ok_or_else(|| malformed(self.ctx, "unexpected end of data"))?;
        if t & 0x1f == 0x1f {
            return Err(malformed(self.ctx, "high tag numbers are not used here"));
        }
        let (&l0, after) = after
            .split_first()
            .ok_or_else(|| malformed(self.ctx, "missing length"))?;
        let (len, after) = if l0 < 0x80 {
            (usize::from(l0), after)
        } else if l0 == 0x80 {
            return Err(malformed(self.ctx, "indefinite length is not DER"));
        } else {
            let n = usize::from(l0 & 0x7f);
            if n > 4 {
                return Err(malformed(self.ctx, "length field too long"));
            }
            let bytes = after
                .get(..n)
                .ok_or_else(|| malformed(self.ctx, "truncated length"))?;
            let len = bytes.iter().fold(0usize, |a, &b| (a << 8) | usize::from(b));
            if len < 0x80 || bytes.first() == Some(&0) {
                return Err(malformed(self.ctx, "length not minimally encoded"));
            }
            (len, after.get(n..).unwrap_or_default())
        };
        let value = after.get(..len).ok_or_else(|| {
            malformed(
                self.ctx,
                format!(
                    "length {len} runs past the end ({} bytes left)",
                    after.len()
                ),
            )
        })?;
        let header = rest.len() - after.len();
        let raw = rest.get(..header + len).unwrap_or_default();
        self.pos = start + header + len;
        Ok(Tlv { tag: t, value, raw })
    }

    /// The next element, which must carry tag `t`.
    pub fn expect(&mut self, t: u8, what: &str) -> Result<Tlv<'a>, Error> {
        match self.peek_tag() {
            Some(got) if got == t => self.any(),
            Some(got) => Err(malformed(
                self.ctx,
                format!("expected {what} (tag {t:#04x}), found tag {got:#04x}"),
            )),
            None => Err(malformed(
                self.ctx,
                format!("expected {what}, found the end"),
            )),
        }
    }

    /// The next element if it carries tag `t`.
    pub fn optional(&mut self, t: u8) -> Result<Option<Tlv<'a>>, Error> {
        if self.peek_tag() == Some(t) {
            self.any().map(Some)
        } else {
            Ok(None)
        }
    }

    /// Fails if anything is left.
    pub fn finish(&self) -> Result<(), Error> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(malformed(
                self.ctx,
                format!("{} unexpected trailing bytes", self.buf.len() - self.pos),
            ))
        }
    }

    /// A nested reader over the contents of the next element with tag `t`.
    pub fn nested(&mut self, t: u8, what: &str, ctx: &'static str) -> Result<Reader<'a>, Error> {
        let tlv = self.expect(t, what)?;
        Ok(Reader::new(tlv.value, ctx))
    }

    pub fn ctx(&self) -> &'static str {
        self.ctx
    }
}

/// Parses exactly one element filling `buf`.
pub(crate) fn single<'a>(
    buf: &'a [u8],
    t: u8,
    what: &str,
    ctx: &'static str,
) -> Result<Tlv<'a>, Error> {
    let mut r = Reader::new(buf, ctx);
    let tlv = r.expect(t, what)?;
    r.finish()?;
    Ok(tlv)
}

/// The dotted text of an OBJECT IDENTIFIER's contents.
pub(crate) fn oid_text(value: &[u8], ctx: &'static str) -> Result<String, Error> {
    if value.is_empty() || value.len() > 64 {
        return Err(malformed(ctx, "object identifier of bad length"));
    }
    let mut arcs: Vec<u64> = Vec::new();
    let mut acc: u64 = 0;
    let mut fresh = true;
    for &b in value {
        if fresh && b == 0x80 {
            return Err(malformed(ctx, "object identifier arc not minimal"));
        }
        if acc > (u64::MAX >> 8) {
            return Err(malformed(ctx, "object identifier arc too large"));
        }
        acc = (acc << 7) | u64::from(b & 0x7f);
        fresh = b & 0x80 == 0;
        if fresh {
            arcs.push(acc);
            acc = 0;
        }
    }
    if !fresh {
        return Err(malformed(ctx, "object identifier truncated"));
    }
    let first = arcs[0];
    let (a, b) = match first {
        0..=39 => (0, first),
        40..=79 => (1, first - 40),
        _ => (2, first - 80),
    };
    let mut s = format!("{a}.{b}");
    for arc in &arcs[1..] {
        s.push('.');
        s.push_str(&arc.to_string());
    }
    Ok(s)
}

/// Reads an OBJECT IDENTIFIER as dotted text.
pub(crate) fn read_oid(r: &mut Reader<'_>, what: &str) -> Result<String, Error> {
    let ctx = r.ctx();
    let tlv = r.expect(tag::OID, what)?;
    oid_text(tlv.value, ctx)
}

/// Reads an AlgorithmIdentifier, answering its OID. The hash and signature algorithms read
/// here have no parameters, so anything but absent or NULL parameters is refused.
pub(crate) fn read_algorithm(r: &mut Reader<'_>, what: &str) -> Result<String, Error> {
    let ctx = r.ctx();
    let mut alg = r.nested(tag::SEQUENCE, what, ctx)?;
    let oid = read_oid(&mut alg, what)?;
    if let Some(p) = alg.optional(tag::NULL)? {
        if !p.value.is_empty() {
            return Err(malformed(ctx, format!("{what} parameters are not NULL")));
        }
    }
    alg.finish()?;
    Ok(oid)
}

/// The contents of an INTEGER, checked to be a non-empty minimal encoding.
pub(crate) fn integer<'a>(tlv: &Tlv<'a>, ctx: &'static str) -> Result<&'a [u8], Error> {
    match tlv.value {
        [] => Err(malformed(ctx, "empty INTEGER")),
        [0, b, ..] if b & 0x80 == 0 => Err(malformed(ctx, "INTEGER not minimally encoded")),
        [0xff, b, ..] if b & 0x80 != 0 => Err(malformed(ctx, "INTEGER not minimally encoded")),
        v => Ok(v),
    }
}

/// A small non-negative INTEGER (versions, statuses).
pub(crate) fn small_uint(tlv: &Tlv<'_>, ctx: &'static str) -> Result<u64, Error> {
    let v = integer(tlv, ctx)?;
    if v.len() > 8 || v[0] & 0x80 != 0 {
        return Err(malformed(ctx, "INTEGER out of range"));
    }
    Ok(v.iter().fold(0u64, |a, &b| (a << 8) | u64::from(b)))
}

/// Two INTEGER contents compared as unsigned big-endian magnitudes: leading zero octets do
/// not matter, so `00 80` equals `80` (a TSA that echoes a nonce without its sign octet, or a
/// client that sent one with its high bit set, still compares as the same number).
pub fn integers_equal(a: &[u8], b: &[u8]) -> bool {
    fn strip(x: &[u8]) -> &[u8] {
        let n = x.iter().take_while(|&&b| b == 0).count();
        &x[n..]
    }
    strip(a) == strip(b)
}

// ---- writer ----

/// Appends a DER length.
fn push_len(out: &mut Vec<u8>, len: usize) {
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
}

/// One encoded element.
pub(crate) fn tlv(t: u8, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + 6);
    out.push(t);
    push_len(&mut out, value.len());
    out.extend_from_slice(value);
    out
}

/// A constructed element holding the concatenation of `parts`.
pub(crate) fn cons(t: u8, parts: &[&[u8]]) -> Vec<u8> {
    tlv(t, &parts.concat())
}

/// Encodes a dotted OID (only called with this crate's constants).
pub(crate) fn oid(dotted: &str) -> Vec<u8> {
    let arcs: Vec<u64> = dotted.split('.').filter_map(|a| a.parse().ok()).collect();
    let mut body = Vec::new();
    let mut push_arc = |mut v: u64| {
        let mut tmp = vec![(v & 0x7f) as u8];
        v >>= 7;
        while v > 0 {
            tmp.push(0x80 | (v & 0x7f) as u8);
            v >>= 7;
        }
        tmp.reverse();
        body.extend_from_slice(&tmp);
    };
    if arcs.len() >= 2 {
        push_arc(arcs[0] * 40 + arcs[1]);
        for &a in &arcs[2..] {
            push_arc(a);
        }
    }
    tlv(tag::OID, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oid_round_trip() {
        for o in [
            "1.2.840.113549.1.9.16.1.4",
            "2.16.840.1.101.3.4.2.1",
            "2.5.29.37",
        ] {
            let enc = oid(o);
            let t = single(&enc, tag::OID, "oid", "test").unwrap();
            assert_eq!(oid_text(t.value, "test").unwrap(), o);
        }
    }

    #[test]
    fn nonce_integers_compare_as_numbers() {
        // A leading zero octet does not change the number.
        assert!(integers_equal(&[0x00, 0x80, 0x01], &[0x80, 0x01]));
        assert!(integers_equal(&[0x12, 0x34], &[0x00, 0x00, 0x12, 0x34]));
        // The high bit set on the first octet, with and without its sign octet.
        assert!(integers_equal(&[0xff, 0x00], &[0x00, 0xff, 0x00]));
        // Different numbers stay different, also when one is a prefix of the other.
        assert!(!integers_equal(&[0x12, 0x34], &[0x12, 0x34, 0x00]));
        assert!(!integers_equal(&[0x01], &[0x02]));
        assert!(!integers_equal(&[0x80, 0x01], &[0x00, 0x80, 0x02]));
        assert!(integers_equal(&[], &[0x00]));
    }

    #[test]
    fn reader_refuses_bad_lengths() {
        for bad in [
            &[0x30, 0x80, 0x00, 0x00][..],      // indefinite
            &[0x30, 0x05, 0x01],                // past the end
            &[0x30, 0x81, 0x05, 1, 2, 3, 4, 5], // long form for a short length
            &[0x30, 0x85, 1, 1, 1, 1, 1],       // too long a length field
            &[0x1f, 0x01, 0x00],                // high tag number
            &[0x30],                            // no length
        ] {
            assert!(Reader::new(bad, "t").any().is_err(), "{bad:02x?}");
        }
        let long: Vec<u8> = [&[0x04, 0x81, 0x80][..], &[7u8; 0x80]].concat();
        let t = single(&long, tag::OCTET_STRING, "x", "t").unwrap();
        assert_eq!(t.value.len(), 0x80);
        assert_eq!(tlv(tag::OCTET_STRING, &[7u8; 0x80]), long);
    }
}
