//! The scan's limits. Every buffer and every decoder is bounded by one of these; a limit hit
//! never silently skips bytes: the file it concerns is listed as unreadable `limit:<name>`.

/// Bounds on what one scan may decode and hold. `Limits::default()` documents the defaults;
/// each field names the `limit:<name>` reason a file gets when the limit stops its reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// How many archives or compressed streams may nest inside a layer (a layer's own tar is
    /// depth 0, a `.tar.gz` inside it takes two levels: gzip, then tar). Deeper content is
    /// `limit:depth`. Default 12.
    pub max_depth: u32,
    /// Bytes one nested compressed stream or archive member may decode to (`limit:member-size`).
    /// Default 4 GiB.
    pub max_member_decoded: u64,
    /// Bytes one layer blob (an export member: a compressed layer) may decode to
    /// (`limit:layer-size`). Default 64 GiB: layers of model weights are legitimately larger
    /// than any member limit, and the ratio limit applies to them as to every other stream.
    pub max_layer_decoded: u64,
    /// Bytes all decoders of one image scan may produce together (`limit:total-size`).
    /// Default 256 GiB.
    pub max_total_decoded: u64,
    /// Largest decoded/encoded ratio any decoded stream (layer blobs, nested streams, zip
    /// members with or without a data descriptor) may reach once it has produced more than
    /// `ratio_floor` bytes (`limit:ratio`): decompression bombs stop here. The same ratio bounds
    /// all nested decoders together against the bytes read from the image (nested bombs such as
    /// a zip of zips, where each level alone stays below it). Default 2000.
    pub max_ratio: u64,
    /// Decoded bytes below which the ratio is not checked (small, highly repetitive files
    /// are common and harmless). Default 16 MiB.
    pub ratio_floor: u64,
    /// Largest PAX header, GNU long name or long link one tar entry may carry
    /// (`limit:tar-header`); the same 1 MiB bound Go's archive/tar, which Docker uses, applies.
    pub max_tar_header: u64,
    /// Members one zip archive may hold (`limit:zip-entries`). Default 1,000,000.
    pub max_zip_entries: u64,
    /// Largest JSON document (manifest, index, image config) held in memory to learn an
    /// image's structure. A larger one makes the image unreadable as a whole. Default 16 MiB.
    pub max_metadata: u64,
    /// zstd window a frame may ask for, as log2 bytes (`limit:zstd-window`). Default 24
    /// (16 MiB), below zstd's own decoder default of 27 so memory stays small.
    pub zstd_window_log_max: u32,
    /// Dictionary memory an xz stream may ask for, in KiB (`limit:xz-memory`). Default 16384
    /// (16 MiB), enough for `xz -9` (64 MiB dictionaries are `-9e` and rarer).
    pub xz_memory_kib: u32,
    /// Bytes hashed to confirm prefilter candidates per decoded byte, plus a fixed 64 MiB
    /// allowance, for one stream (`limit:confirmations`). Guards against data built to
    /// collide with the prefilter. Default 16.
    pub max_confirm_factor: u64,
    /// Memory all decoders of one scan may hold at once, in bytes (`limit:decoder-memory`):
    /// zstd windows and xz dictionaries (as each stream's header asks), bzip2 block buffers,
    /// deflate/zlib state and the git pack object cache. A nested decoder that would take the
    /// total above this is not opened. Default 40 MiB, which keeps the whole scan under 64 MiB.
    pub max_decoder_memory: u64,
    /// Largest git object kept whole to rebuild deltas against it, and largest delta or
    /// rebuilt object (`limit:git-object-size`); also the git object cache of one pack. Default
    /// 8 MiB.
    pub max_git_object: u64,
    /// Longest chain of git deltas rebuilt (`limit:git-delta-depth`). Default 50 (git's own
    /// default `pack.depth`).
    pub max_git_delta_depth: u32,
    /// Run matching of a whole-image scan (an engine export, a saved archive, an OCI layout)
    /// on a thread of its own beside the reading thread (`true`, the default), or inline on
    /// the reading thread (`false`; the benchmark's comparison). Scans of bytes in memory
    /// always match inline. The findings are the same either way.
    pub match_thread: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_depth: 12,
            max_member_decoded: 4 << 30,
            max_layer_decoded: 64 << 30,
            max_total_decoded: 256 << 30,
            max_ratio: 2000,
            ratio_floor: 16 << 20,
            max_tar_header: 1 << 20,
            max_zip_entries: 1_000_000,
            max_metadata: 16 << 20,
            zstd_window_log_max: 24,
            xz_memory_kib: 16 << 10,
            max_confirm_factor: 16,
            max_decoder_memory: 40 << 20,
            max_git_object: 8 << 20,
            max_git_delta_depth: 50,
            match_thread: true,
        }
    }
}

/// The decoder memory of one scan ([`Limits::max_decoder_memory`]): each decoder reserves what
/// it will hold before it is opened and gives it back when it is dropped.
#[derive(Debug)]
pub(crate) struct MemBudget {
    left: std::cell::Cell<u64>,
}

impl MemBudget {
    pub(crate) fn new(bytes: u64) -> std::rc::Rc<MemBudget> {
        std::rc::Rc::new(MemBudget {
            left: std::cell::Cell::new(bytes),
        })
    }

    /// Takes `bytes`, or `None` (nothing taken) when fewer are left.
    pub(crate) fn reserve(self: &std::rc::Rc<Self>, bytes: u64) -> Option<Reservation> {
        let left = self.left.get();
        if bytes > left {
            return None;
        }
        self.left.set(left - bytes);
        Some(Reservation {
            budget: std::rc::Rc::clone(self),
            bytes,
        })
    }
}

/// Memory taken from a [`MemBudget`]; given back on drop.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: std::rc::Rc<MemBudget>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.left.set(self.budget.left.get() + self.bytes);
    }
}

/// Window a zstd frame at the start of `head` asks for, in bytes (skippable frames before it
/// are passed over when they fit in `head`); `None` when `head` is too short to tell.
pub(crate) fn zstd_window(head: &[u8]) -> Option<u64> {
    let mut h = head;
    loop {
        if h.len() < 4 {
            return None;
        }
        let magic = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        if magic & 0xFFFF_FFF0 == 0x184D_2A50 {
            if h.len() < 8 {
                return None;
            }
            let n = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
            h = h.get(8 + n..)?;
            continue;
        }
        if magic != 0xFD2F_B528 || h.len() < 6 {
            return None;
        }
        let fhd = h[4];
        let single = fhd & 0x20 != 0;
        if !single {
            let wd = h[5];
            let exp = u64::from(wd >> 3);
            let base = 1u64 << (10 + exp);
            return Some(base + (base / 8) * u64::from(wd & 7));
        }
        // Single segment: the window is the frame content size.
        let dict = [0usize, 1, 2, 4][usize::from(fhd & 3)];
        let fcs_len = [1usize, 2, 4, 8][usize::from(fhd >> 6)];
        let at = 5 + dict;
        let f = h.get(at..at + fcs_len)?;
        let mut v = 0u64;
        for (i, b) in f.iter().enumerate() {
            v |= u64::from(*b) << (8 * i);
        }
        if fcs_len == 2 {
            v += 256;
        }
        return Some(v.max(1));
    }
}

/// Dictionary size the first LZMA2 filter of the first block of an xz stream at the start of
/// `head` asks for; `None` when `head` does not say.
pub(crate) fn xz_dict(head: &[u8]) -> Option<u64> {
    // Stream header (12 bytes), then the block header: size, flags, optional sizes, filters.
    let b = head.get(12..)?;
    let hsize = (usize::from(*b.first()?) + 1) * 4;
    let bh = b.get(..hsize)?;
    let flags = bh[1];
    let mut i = 2;
    let varint = |i: &mut usize| -> Option<u64> {
        let mut v = 0u64;
        for k in 0..9 {
            let c = *bh.get(*i)?;
            *i += 1;
            v |= u64::from(c & 0x7f) << (7 * k);
            if c & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    };
    if flags & 0x40 != 0 {
        varint(&mut i)?;
    }
    if flags & 0x80 != 0 {
        varint(&mut i)?;
    }
    for _ in 0..=(flags & 3) {
        let id = varint(&mut i)?;
        let n = varint(&mut i)? as usize;
        let props = bh.get(i..i + n)?;
        i += n;
        if id == 0x21 {
            let p = u32::from(*props.first()?);
            if p > 40 {
                return None;
            }
            if p == 40 {
                return Some(u64::from(u32::MAX));
            }
            return Some(u64::from((2 | (p & 1)) << (p / 2 + 11)));
        }
    }
    None
}

/// What a decoder will hold: the bytes to reserve and the window it may then open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DecoderNeed {
    pub bytes: u64,
    pub zstd_window_log: u32,
    pub xz_memory_kib: u32,
}

impl Default for DecoderNeed {
    fn default() -> Self {
        let l = Limits::default();
        DecoderNeed {
            bytes: 96 << 10,
            zstd_window_log: l.zstd_window_log_max,
            xz_memory_kib: l.xz_memory_kib,
        }
    }
}

/// The memory a decoder of `codec` (`gzip`, `zlib`, `deflate`, `zstd`, `xz`, `bzip2`, with or
/// without a `zip-` prefix) holds for the stream whose first bytes are `head`, within `l`'s
/// window caps. A later frame or block that asks for more fails with its window limit.
pub(crate) fn decoder_need(codec: &str, head: &[u8], l: &Limits) -> DecoderNeed {
    let cap_log = l.zstd_window_log_max;
    let mut need = DecoderNeed {
        bytes: 96 << 10,
        zstd_window_log: cap_log,
        xz_memory_kib: l.xz_memory_kib,
    };
    match codec.trim_start_matches("zip-") {
        "zstd" => {
            let window = zstd_window(head).unwrap_or(1 << cap_log);
            let log = (64 - window.saturating_sub(1).leading_zeros()).clamp(10, cap_log);
            need.zstd_window_log = log;
            need.bytes = (1u64 << log) + (384 << 10);
        }
        "xz" => {
            let cap = u64::from(l.xz_memory_kib) << 10;
            let dict = xz_dict(head).unwrap_or(cap).clamp(4096, cap.max(4096));
            let kib = dict.div_ceil(1024) + 128;
            need.xz_memory_kib = u32::try_from(kib).unwrap_or(u32::MAX);
            need.bytes = dict + (192 << 10);
        }
        // libbzip2 holds 4 bytes per byte of a block (900 kB at level 9) while decoding.
        "bzip2" => need.bytes = 3_700_000,
        _ => {}
    }
    need
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_gives_back_what_it_lent() {
        let b = MemBudget::new(100);
        let r1 = b.reserve(60).unwrap();
        assert!(b.reserve(50).is_none());
        drop(r1);
        assert!(b.reserve(100).is_some());
    }

    #[test]
    fn zstd_window_descriptor() {
        // Not single segment, window descriptor 0x58: exponent 11, mantissa 0 -> 2 MiB.
        assert_eq!(
            zstd_window(&[0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x58]),
            Some(2 << 20)
        );
        // A skippable frame first.
        let mut h = vec![0x50, 0x2a, 0x4d, 0x18, 2, 0, 0, 0, 9, 9];
        h.extend([0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x70]);
        assert_eq!(zstd_window(&h), Some(16 << 20));
        assert_eq!(zstd_window(b"nope"), None);
    }
}
