//! Chooses how to open a file by its first bytes, never by its name or media type.

/// What a file's first bytes say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// gzip (`1f 8b 08`), possibly several members.
    Gzip,
    /// zstd frame (`28 b5 2f fd`) or a skippable frame before one.
    Zstd,
    /// xz stream (`fd 37 7a 58 5a 00`).
    Xz,
    /// bzip2 stream (`BZh1`..`BZh9` and a block or end magic).
    Bzip2,
    /// zip local header (`PK 03 04`) or an empty zip's end record.
    Zip,
    /// tar: ustar magic, or a header whose checksum holds.
    Tar,
    /// A git loose object once inflated: `blob|tree|commit|tag <size>\0` and the content.
    GitObject,
    /// A git pack (`PACK`, version 2 or 3).
    GitPack,
    /// A PNG image: its IDAT chunks are one zlib stream, other chunks may hold more.
    Png,
    /// A format recognised and not opened; the name goes into `format:<name>`.
    Unsupported(&'static str),
    /// Anything else: read as bytes.
    Data,
}

/// Bytes [`sniff`] wants to see (a tar header is 512 bytes).
pub const SNIFF_LEN: usize = 512;

/// Classifies a file by its first bytes (`head` holds up to [`SNIFF_LEN`] of them).
pub fn sniff(head: &[u8]) -> Kind {
    let starts = |m: &[u8]| head.starts_with(m);
    if starts(&[0x1f, 0x8b, 0x08]) {
        return Kind::Gzip;
    }
    if starts(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return Kind::Zstd;
    }
    // A zstd skippable frame (0x184D2A50..5F little endian) is used to prefix real frames.
    if head.len() >= 4 && head[1..4] == [0x2a, 0x4d, 0x18] && head[0] & 0xf0 == 0x50 {
        return Kind::Zstd;
    }
    if starts(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]) {
        return Kind::Xz;
    }
    if head.len() >= 10
        && starts(b"BZh")
        && (b'1'..=b'9').contains(&head[3])
        && (head[4..10] == [0x31, 0x41, 0x59, 0x26, 0x53, 0x59]
            || head[4..10] == [0x17, 0x72, 0x45, 0x38, 0x50, 0x90])
    {
        return Kind::Bzip2;
    }
    if starts(b"PK\x03\x04") || starts(b"PK\x05\x06") || starts(b"PK\x07\x08PK\x03\x04") {
        return Kind::Zip;
    }
    if head.len() >= 12 && starts(b"PACK\0\0\0") && matches!(head[7], 2 | 3) {
        return Kind::GitPack;
    }
    if starts(b"\x89PNG\r\n\x1a\n") {
        return Kind::Png;
    }
    if git_object_header(head).is_some() {
        return Kind::GitObject;
    }
    if starts(&[b'7', b'z', 0xbc, 0xaf, 0x27, 0x1c]) {
        return Kind::Unsupported("7z");
    }
    if starts(b"Rar!\x1a\x07") {
        return Kind::Unsupported("rar");
    }
    if starts(&[0x04, 0x22, 0x4d, 0x18]) {
        return Kind::Unsupported("lz4");
    }
    if starts(b"LZIP") {
        return Kind::Unsupported("lzip");
    }
    if starts(&[0x1f, 0x9d]) {
        return Kind::Unsupported("compress");
    }
    if starts(b"MSCF\0\0\0\0") {
        return Kind::Unsupported("cab");
    }
    if starts(b"xar!") {
        return Kind::Unsupported("xar");
    }
    if starts(&[0xed, 0xab, 0xee, 0xdb]) {
        return Kind::Unsupported("rpm");
    }
    if starts(b"!<arch>\n") {
        return Kind::Unsupported("ar");
    }
    if starts(b"070701") || starts(b"070702") || starts(b"070707") {
        return Kind::Unsupported("cpio");
    }
    if starts(b"hsqs") {
        return Kind::Unsupported("squashfs");
    }
    if crate::tar::looks_like_tar(head) {
        return Kind::Tar;
    }
    Kind::Data
}

/// The header of an inflated git loose object: (header length with its NUL, content size).
pub fn git_object_header(head: &[u8]) -> Option<(usize, u64)> {
    let rest = [&b"blob "[..], b"tree ", b"commit ", b"tag "]
        .iter()
        .find_map(|t| head.strip_prefix(*t))?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 19 || rest.get(digits) != Some(&0) {
        return None;
    }
    let size = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
    Some((head.len() - rest.len() + digits + 1, size))
}

/// A zlib stream header (RFC 1950: deflate, window up to 32 KiB, no preset dictionary,
/// check bits holding).
pub fn zlib_header(b0: u8, b1: u8) -> bool {
    b0 & 0x0f == 8
        && b0 >> 4 <= 7
        && b1 & 0x20 == 0
        && (u16::from(b0) << 8 | u16::from(b1)) % 31 == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_not_names() {
        assert_eq!(sniff(&[0x1f, 0x8b, 0x08, 0]), Kind::Gzip);
        assert_eq!(sniff(&[0x28, 0xb5, 0x2f, 0xfd, 0]), Kind::Zstd);
        assert_eq!(sniff(b"PK\x03\x04rest"), Kind::Zip);
        assert_eq!(
            sniff(&[b'7', b'z', 0xbc, 0xaf, 0x27, 0x1c, 0, 4]),
            Kind::Unsupported("7z")
        );
        assert_eq!(sniff(b"BZh9\x31\x41\x59\x26\x53\x59"), Kind::Bzip2);
        assert_eq!(sniff(b"BZh9 hello"), Kind::Data);
        assert_eq!(sniff(b"hello world"), Kind::Data);
        assert_eq!(sniff(b""), Kind::Data);
        assert_eq!(sniff(b"blob 5\0hello"), Kind::GitObject);
        assert_eq!(git_object_header(b"commit 12\0x"), Some((10, 12)));
        assert_eq!(sniff(b"blob x\0hello"), Kind::Data);
        assert_eq!(sniff(b"PACK\0\0\0\x02\0\0\0\x03"), Kind::GitPack);
        assert!(zlib_header(0x78, 0x9c) && zlib_header(0x78, 0x01) && zlib_header(0x78, 0xda));
        assert!(!zlib_header(0x78, 0x9d) && !zlib_header(b'h', b'e'));
    }
}
