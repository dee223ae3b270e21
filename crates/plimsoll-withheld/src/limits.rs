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
    /// Layer blobs are bounded by `max_total_decoded` only. Default 4 GiB.
    pub max_member_decoded: u64,
    /// Bytes all decoders of one image scan may produce together (`limit:total-size`).
    /// Default 256 GiB.
    pub max_total_decoded: u64,
    /// Largest decoded/encoded ratio a nested stream may reach once it has produced more than
    /// `ratio_floor` bytes (`limit:ratio`): decompression bombs stop here. Default 2000.
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
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_depth: 12,
            max_member_decoded: 4 << 30,
            max_total_decoded: 256 << 30,
            max_ratio: 2000,
            ratio_floor: 16 << 20,
            max_tar_header: 1 << 20,
            max_zip_entries: 1_000_000,
            max_metadata: 16 << 20,
            zstd_window_log_max: 24,
            xz_memory_kib: 16 << 10,
            max_confirm_factor: 16,
        }
    }
}
