//! The bytes Go's `encoding/json` `Marshal` writes for the few structs of this crate.
//!
//! Bundles are verified by re-encoding every line and comparing bytes, so lines written by
//! the Go tools and by this crate must be identical. The rules followed here are those of
//! Go's `encodeState.string` with HTML escaping on (what `json.Marshal` uses):
//!
//! - `"` and `\` as `\"` and `\\`; `\n`, `\r`, `\t` in their short forms;
//! - `\b` (U+0008) and `\f` (U+000C) in their short forms too, as Go 1.22 and later write
//!   them (Go 1.21 and earlier wrote `\u0008` and `\u000c`; a line holding one of these two
//!   bytes written by such an old Go would not re-encode identically here);
//! - every other byte below 0x20 as `\u00XX` with lowercase hex;
//! - `<`, `>`, `&` as `\u003c`, `\u003e`, `\u0026`; U+2028 and U+2029 as `\u2028`, `\u2029`;
//! - everything else, DEL (0x7f) and all other non-ASCII included, as the UTF-8 bytes
//!   themselves (a Rust `str` cannot hold invalid UTF-8, which Go would turn into U+FFFD).
//!
//! Integers are decimal, booleans `true`/`false`, `[]byte` std padded base64, no whitespace.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends `s` as a Go JSON string (quotes included).
pub fn string(out: &mut String, s: &str) {
    out.push('"');
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let esc: Option<&str> = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            '\u{8}' => Some("\\b"),
            '\u{c}' => Some("\\f"),
            '<' => Some("\\u003c"),
            '>' => Some("\\u003e"),
            '&' => Some("\\u0026"),
            '\u{2028}' => Some("\\u2028"),
            '\u{2029}' => Some("\\u2029"),
            c if (c as u32) < 0x20 => None,
            _ => continue,
        };
        out.push_str(&s[start..i]);
        match esc {
            Some(e) => out.push_str(e),
            None => {
                let b = c as u32 as u8;
                out.push_str("\\u00");
                out.push(HEX[(b >> 4) as usize] as char);
                out.push(HEX[(b & 0xf) as usize] as char);
            }
        }
        start = i + c.len_utf8();
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Appends `b` as Go writes a `[]byte`: a JSON string of std padded base64.
pub fn bytes(out: &mut String, b: &[u8]) {
    out.push('"');
    STANDARD.encode_string(b, out);
    out.push('"');
}

/// Appends an integer in decimal.
pub fn int(out: &mut String, v: impl Into<i128>) {
    use std::fmt::Write as _;
    let _ = write!(out, "{}", v.into());
}

/// Appends `true` or `false`.
pub fn boolean(out: &mut String, v: bool) {
    out.push_str(if v { "true" } else { "false" });
}

/// Writes a JSON object member by member, with the commas Go puts between them.
pub struct Object<'a> {
    out: &'a mut String,
    first: bool,
}

impl<'a> Object<'a> {
    /// Opens an object (`{`) on `out`.
    pub fn new(out: &'a mut String) -> Self {
        out.push('{');
        Object { out, first: true }
    }

    /// Starts member `name` and hands back the buffer for its value.
    pub fn key(&mut self, name: &str) -> &mut String {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        string(self.out, name);
        self.out.push(':');
        self.out
    }

    /// A string member.
    pub fn str(&mut self, name: &str, v: &str) -> &mut Self {
        string(self.key(name), v);
        self
    }

    /// A string member that Go's `omitempty` leaves out when empty.
    pub fn str_omitempty(&mut self, name: &str, v: &str) -> &mut Self {
        if !v.is_empty() {
            self.str(name, v);
        }
        self
    }

    /// An integer member.
    pub fn int(&mut self, name: &str, v: impl Into<i128>) -> &mut Self {
        int(self.key(name), v);
        self
    }

    /// A `[]byte` member (base64).
    pub fn bytes(&mut self, name: &str, v: &[u8]) -> &mut Self {
        bytes(self.key(name), v);
        self
    }

    /// Closes the object (`}`).
    pub fn end(self) {
        self.out.push('}');
    }
}

/// Decodes std padded base64 as Go's `[]byte` field decoding would, refusing anything
/// that does not re-encode to the same text (the canonical check depends on it).
pub fn decode_base64(s: &str) -> Result<Vec<u8>, base64::DecodeError> {
    STANDARD.decode(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(s: &str) -> String {
        let mut o = String::new();
        string(&mut o, s);
        o
    }

    // Expected bytes are what Go 1.22+ `json.Marshal(s)` prints, written out literally.
    #[test]
    fn escapes_like_go() {
        assert_eq!(enc("plain"), r#""plain""#);
        assert_eq!(enc(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(enc("\n\r\t"), r#""\n\r\t""#);
        assert_eq!(enc("\u{8}\u{c}"), r#""\b\f""#);
        assert_eq!(
            enc("\u{0}\u{1}\u{1f}\u{b}"),
            r#""\u0000\u0001\u001f\u000b""#
        );
        assert_eq!(enc("<a href=x&y>"), r#""\u003ca href=x\u0026y\u003e""#);
        assert_eq!(enc("x\u{2028}y\u{2029}z"), r#""x\u2028y\u2029z""#);
        assert_eq!(enc("\u{7f}é€😀"), "\"\u{7f}é€😀\"");
        assert_eq!(enc("'/"), r#""'/""#);
        assert_eq!(enc(""), r#""""#);
        assert_eq!(enc("\u{1b}[0m"), r#""\u001b[0m""#);
    }

    #[test]
    fn bytes_and_objects_like_go() {
        let mut o = String::new();
        let mut obj = Object::new(&mut o);
        obj.bytes("b", &[0xfb, 0xff])
            .bytes("e", b"")
            .int("n", -5i64)
            .int("u", u64::MAX)
            .str_omitempty("gone", "")
            .str("s", "<");
        boolean(obj.key("t"), true);
        obj.end();
        assert_eq!(
            o,
            r#"{"b":"+/8=","e":"","n":-5,"u":18446744073709551615,"s":"\u003c","t":true}"#
        );
        assert!(decode_base64("+/8=").is_ok());
        assert!(decode_base64("+/8").is_err(), "padding is required");
        assert!(
            decode_base64("+/9=").is_err(),
            "non-canonical trailing bits"
        );
    }
}
