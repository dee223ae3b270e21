//! The matcher: whole files by size then SHA-256, and runs of N bytes by a rolling prefilter
//! confirmed with SHA-256.
//!
//! The prefilter (`gear-v1`) is a gear hash: `h = (h << 1) + GEAR[byte]` over the stream. Bit
//! `j` of `h` depends only on the last `j + 1` bytes, so the low `c = min(N, 64)` bits are a
//! function of the last N bytes alone, whatever came before. One rolling value per byte thus
//! serves every run length at once; each distinct `c` costs one mix and one bitmap probe.
//! The set stores 24 bits of the mixed value per run entry (the only thing besides the
//! SHA-256 it holds about the material), the scanner keeps a bitmap of those keys and hashes
//! the window with SHA-256 only where the bitmap says "maybe".

use std::collections::{HashMap, HashSet, VecDeque};

use ring::digest;

/// Shortest run the set accepts: below this the 24-bit prefilter would pass too many windows.
pub const MIN_RUN: usize = 16;
/// Longest run the set accepts; every decoded stream keeps this many bytes of history.
pub const MAX_RUN: usize = 65_536;

const fn gear_table() -> [u64; 256] {
    // SplitMix64 from a fixed seed: the table is part of the `gear-v1` format.
    let mut t = [0u64; 256];
    let mut x: u64 = 0x706c_696d_736f_6c6c; // "plimsoll"
    let mut i = 0;
    while i < 256 {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        t[i] = z ^ (z >> 31);
        i += 1;
    }
    t
}

/// The gear table of prefilter `gear-v1`.
static GEAR: [u64; 256] = gear_table();
const MIX: u64 = 0xD6E8_FEB8_6659_FD93;
const SALT: u64 = 0x9E37_79B9_7F4A_7C15;

fn class_of(len: usize) -> u32 {
    len.min(64) as u32
}

fn mask_of(c: u32) -> u64 {
    if c >= 64 {
        u64::MAX
    } else {
        (1u64 << c) - 1
    }
}

fn salt_of(c: u32) -> u64 {
    SALT.wrapping_mul(u64::from(c))
}

/// The 24-bit `gear-v1` prefilter of a value: what `plimsoll-withheld add` stores beside the
/// value's SHA-256 for a run entry.
pub fn prefilter_of(value: &[u8]) -> u32 {
    let mut h = 0u64;
    for &b in value {
        h = (h << 1).wrapping_add(GEAR[b as usize]);
    }
    let c = class_of(value.len());
    (((h & mask_of(c)) ^ salt_of(c)).wrapping_mul(MIX) >> 40) as u32
}

/// SHA-256 of a byte slice.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    let d = digest::digest(&digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

#[derive(Debug, Clone)]
struct RunEntry {
    len: usize,
    sha256: [u8; 32],
    entry: usize,
    slot: usize,
}

/// The mixed value of class `k` at rolling value `h`; its top 24 bits are the entry key.
#[inline(always)]
fn mixed(k: &Class, h: u64) -> u64 {
    ((h & k.mask) ^ k.salt).wrapping_mul(MIX)
}

/// The first-level test: the top 16 bits of `m` in the fixed 8 KiB bitmap. The shifts are
/// constants and the word index is below 1,024 by its width, so the loop has no bounds check
/// and no variable shift but the bit test.
#[inline(always)]
fn quick_bit(quick: &[u64; QUICK_WORDS], m: u64) -> bool {
    let q = m >> 48;
    (quick[(q >> 6) as usize] >> (q & 63)) & 1 != 0
}

/// The second-level test, at the set's own resolution (16 to 24 bits by its size).
fn fine_bit(index: &RunIndex, m: u64) -> bool {
    let x = m >> index.shift;
    let word = index.bitmap.get((x >> 6) as usize).copied().unwrap_or(0);
    (word >> (x & 63)) & 1 != 0
}

/// The prefilter over `chunk`. Called with an array for a set of one to four classes (the
/// common case: a few distinct lengths), so the class loop is unrolled and every mask and salt
/// stays in a register, or with a slice for more; the loop takes one branch per byte. Pushes
/// `(offset, class, h)` of every maybe; returns the rolling value after the chunk.
#[inline(always)]
fn probe<K: AsRef<[Class]>>(
    ks: K,
    index: &RunIndex,
    mut h: u64,
    chunk: &[u8],
    cands: &mut Vec<(usize, u32, u64)>,
) -> u64 {
    let ks = ks.as_ref();
    let quick = &*index.quick;
    for (i, &b) in chunk.iter().enumerate() {
        h = (h << 1).wrapping_add(GEAR[b as usize]);
        let mut any = false;
        for k in ks {
            any |= quick_bit(quick, mixed(k, h));
        }
        if any {
            maybe(ks, index, i, h, cands);
        }
    }
    h
}

/// The rare path of a first-level hit: the classes that pass both levels become candidates.
#[cold]
#[inline(never)]
fn maybe(ks: &[Class], index: &RunIndex, i: usize, h: u64, cands: &mut Vec<(usize, u32, u64)>) {
    for k in ks {
        let m = mixed(k, h);
        if quick_bit(&index.quick, m) && fine_bit(index, m) {
            cands.push((i, k.c, h));
        }
    }
}

/// Words of the first-level bitmap: 2^16 bits.
const QUICK_WORDS: usize = 1 << 10;

#[derive(Debug, Clone, Copy)]
struct Class {
    c: u32,
    mask: u64,
    salt: u64,
}

/// The compiled run entries of a set: classes, the prefilter bitmap and the candidates table.
#[derive(Debug, Clone)]
pub(crate) struct RunIndex {
    classes: Vec<Class>,
    shift: u32,
    bitmap: Vec<u64>,
    /// The top 16 bits of every key: the first, fixed-size level of the prefilter.
    quick: Box<[u64; QUICK_WORDS]>,
    table: HashMap<(u32, u32), Vec<RunEntry>>,
    max_len: usize,
    slots: usize,
}

impl RunIndex {
    /// Builds the index from `(entry index, length, sha256, prefilter)`.
    pub(crate) fn new(runs: &[(usize, usize, [u8; 32], u32)]) -> RunIndex {
        let bits: u32 = {
            let n = runs.len().max(1) as u64;
            (64 - n.leading_zeros() + 14).clamp(16, 24)
        };
        let mut bitmap = vec![0u64; 1usize << (bits - 6)];
        let mut quick = Box::new([0u64; QUICK_WORDS]);
        let mut classes: Vec<Class> = Vec::new();
        let mut table: HashMap<(u32, u32), Vec<RunEntry>> = HashMap::new();
        let mut max_len = 0;
        for (slot, &(entry, len, sha, pre)) in runs.iter().enumerate() {
            let c = class_of(len);
            if !classes.iter().any(|k| k.c == c) {
                classes.push(Class {
                    c,
                    mask: mask_of(c),
                    salt: salt_of(c),
                });
            }
            let key = pre & 0x00FF_FFFF;
            let idx = (key >> (24 - bits)) as usize;
            bitmap[idx >> 6] |= 1 << (idx & 63);
            let q = (key >> 8) as usize;
            quick[q >> 6] |= 1 << (q & 63);
            table.entry((c, key)).or_default().push(RunEntry {
                len,
                sha256: sha,
                entry,
                slot,
            });
            max_len = max_len.max(len);
        }
        classes.sort_by_key(|k| k.c);
        RunIndex {
            classes,
            shift: 64 - bits,
            bitmap,
            quick,
            table,
            max_len,
            slots: runs.len(),
        }
    }

    /// True when the set has no run entries (the stream needs no rolling hash).
    pub(crate) fn is_empty(&self) -> bool {
        self.slots == 0
    }
}

/// How many bytes the confirmations of one stream may hash: `factor` per byte of the stream
/// up to the candidate's end, plus `allowance` (`limit:confirmations` beyond it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    pub factor: u64,
    pub allowance: u64,
}

impl Budget {
    fn at(&self, end: u64) -> u64 {
        self.factor
            .saturating_mul(end)
            .saturating_add(self.allowance)
    }
}

/// A confirmed run: bytes `[start, end)` of the stream equal a run entry's material.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunHit {
    pub start: u64,
    pub end: u64,
    pub entry: usize,
}

#[derive(Debug, Clone, Copy)]
struct ConstMemo {
    end: u64,
    byte: u8,
    matched: bool,
}

/// Rolling state over one decoded stream.
#[derive(Debug)]
pub(crate) struct RunState {
    h: u64,
    pos: u64,
    tail: VecDeque<u8>,
    keep: usize,
    cands: Vec<(usize, u32, u64)>,
    scratch: Vec<u8>,
    memo: Vec<Option<ConstMemo>>,
    confirmed_bytes: u64,
    /// True once the confirmation budget was spent: the rest of the stream was not matched.
    pub(crate) over_budget: bool,
}

impl RunState {
    pub(crate) fn new(index: &RunIndex) -> RunState {
        RunState {
            h: 0,
            pos: 0,
            tail: VecDeque::new(),
            keep: index.max_len.saturating_sub(1),
            cands: Vec::new(),
            scratch: Vec::new(),
            memo: vec![None; index.slots],
            confirmed_bytes: 0,
            over_budget: false,
        }
    }

    /// Feeds the next bytes of the stream; confirmed runs are pushed onto `hits`. How the
    /// stream is cut into chunks changes nothing: the budget is judged at each candidate.
    pub(crate) fn feed(
        &mut self,
        index: &RunIndex,
        chunk: &[u8],
        budget: Budget,
        hits: &mut Vec<RunHit>,
    ) {
        if index.is_empty() || chunk.is_empty() {
            self.pos += chunk.len() as u64;
            return;
        }
        self.cands.clear();
        let h = match &index.classes[..] {
            [a] => probe([*a], index, self.h, chunk, &mut self.cands),
            [a, b] => probe([*a, *b], index, self.h, chunk, &mut self.cands),
            [a, b, c] => probe([*a, *b, *c], index, self.h, chunk, &mut self.cands),
            [a, b, c, d] => probe([*a, *b, *c, *d], index, self.h, chunk, &mut self.cands),
            more => probe(more, index, self.h, chunk, &mut self.cands),
        };
        self.h = h;
        if !self.cands.is_empty() && !self.over_budget {
            let cands = std::mem::take(&mut self.cands);
            for &(i, c, h) in &cands {
                self.confirm(index, chunk, (i, c, h), budget, hits);
            }
            self.cands = cands;
        }
        self.pos += chunk.len() as u64;
        // Keep the last `keep` bytes for windows that straddle the next chunk.
        if self.keep > 0 {
            if chunk.len() >= self.keep {
                self.tail.clear();
                self.tail.extend(&chunk[chunk.len() - self.keep..]);
            } else {
                self.tail.extend(chunk);
                let excess = self.tail.len().saturating_sub(self.keep);
                self.tail.drain(..excess);
            }
        }
    }

    fn confirm(
        &mut self,
        index: &RunIndex,
        chunk: &[u8],
        (i, c, h): (usize, u32, u64),
        budget: Budget,
        hits: &mut Vec<RunHit>,
    ) {
        if self.over_budget {
            return;
        }
        let key = ((((h & mask_of(c)) ^ salt_of(c)).wrapping_mul(MIX)) >> 40) as u32;
        let Some(list) = index.table.get(&(c, key)) else {
            return;
        };
        let end = self.pos + i as u64 + 1;
        for e in list {
            if end < e.len as u64 {
                continue;
            }
            // A window of one repeated byte that was already judged one position earlier is
            // the same window: reuse the answer instead of hashing it again.
            if let Some(m) = self.memo[e.slot] {
                if m.end + 1 == end && chunk[i] == m.byte {
                    self.memo[e.slot] = Some(ConstMemo { end, ..m });
                    if m.matched {
                        hits.push(RunHit {
                            start: end - e.len as u64,
                            end,
                            entry: e.entry,
                        });
                    }
                    continue;
                }
            }
            if self.confirmed_bytes > budget.at(end) {
                self.over_budget = true;
                return;
            }
            self.confirmed_bytes += e.len as u64;
            let window: &[u8] = if i + 1 >= e.len {
                &chunk[i + 1 - e.len..=i]
            } else {
                let from_tail = e.len - (i + 1);
                if self.tail.len() < from_tail {
                    continue;
                }
                self.scratch.clear();
                let skip = self.tail.len() - from_tail;
                self.scratch.extend(self.tail.iter().skip(skip));
                self.scratch.extend_from_slice(&chunk[..=i]);
                &self.scratch
            };
            let matched = sha256(window) == e.sha256;
            let first = window[0];
            self.memo[e.slot] = if window.iter().all(|&b| b == first) {
                Some(ConstMemo {
                    end,
                    byte: first,
                    matched,
                })
            } else {
                None
            };
            if matched {
                hits.push(RunHit {
                    start: end - e.len as u64,
                    end,
                    entry: e.entry,
                });
            }
        }
    }
}

/// The compiled whole-file entries: sizes first (cheap), then SHA-256.
#[derive(Debug, Clone, Default)]
pub(crate) struct FileIndex {
    sizes: HashSet<u64>,
    max_size: u64,
    by_digest: HashMap<(u64, [u8; 32]), Vec<usize>>,
}

impl FileIndex {
    pub(crate) fn new(files: &[(usize, u64, [u8; 32])]) -> FileIndex {
        let mut ix = FileIndex::default();
        for &(entry, size, sha) in files {
            ix.sizes.insert(size);
            ix.max_size = ix.max_size.max(size);
            ix.by_digest.entry((size, sha)).or_default().push(entry);
        }
        ix
    }

    /// Whether a file of this size (or unknown size) must be hashed.
    pub(crate) fn wants(&self, size: Option<u64>) -> bool {
        match size {
            Some(s) => self.sizes.contains(&s),
            None => !self.sizes.is_empty(),
        }
    }

    /// The largest listed size (a stream of unknown size is hashed up to this many bytes).
    pub(crate) fn max_size(&self) -> u64 {
        self.max_size
    }

    /// Entries whose whole file has this size and digest.
    pub(crate) fn lookup(&self, size: u64, sha: &[u8; 32]) -> &[usize] {
        self.by_digest
            .get(&(size, *sha))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index_for(values: &[&[u8]]) -> RunIndex {
        let runs: Vec<_> = values
            .iter()
            .enumerate()
            .map(|(i, v)| (i, v.len(), sha256(v), prefilter_of(v)))
            .collect();
        RunIndex::new(&runs)
    }

    fn scan(index: &RunIndex, data: &[u8], chunk: usize) -> Vec<RunHit> {
        let mut st = RunState::new(index);
        let mut hits = Vec::new();
        for part in data.chunks(chunk) {
            let budget = Budget {
                factor: u64::MAX,
                allowance: 0,
            };
            st.feed(index, part, budget, &mut hits);
        }
        hits
    }

    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn finds_runs_of_every_length_at_every_chunking() {
        let short = b"canary-0123456789".to_vec(); // 17 bytes
        let long = noise(300, 7);
        let ix = index_for(&[&short, &long]);
        let mut data = noise(10_000, 1);
        data.splice(1234..1234, short.iter().copied());
        data.splice(7000..7000, long.iter().copied());
        for chunk in [1, 7, 64, 299, 301, 4096, 100_000] {
            let hits = scan(&ix, &data, chunk);
            assert!(
                hits.contains(&RunHit {
                    start: 1234,
                    end: 1234 + 17,
                    entry: 0
                }),
                "chunk {chunk}: {hits:?}"
            );
            assert!(
                hits.iter().any(|h| h.entry == 1 && h.start == 7000),
                "chunk {chunk}: {hits:?}"
            );
            assert_eq!(hits.len(), 2, "chunk {chunk}: {hits:?}");
        }
    }

    /// One to six distinct lengths: the unrolled probes for one to four classes and the
    /// general one all find every value and nothing else.
    #[test]
    fn every_number_of_classes_finds_every_value() {
        let lens = [16usize, 21, 33, 47, 58, 200];
        for n in 1..=lens.len() {
            let values: Vec<Vec<u8>> = (0..n).map(|k| noise(lens[k], 50 + k as u64)).collect();
            let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            let ix = index_for(&refs);
            assert_eq!(ix.classes.len(), n);
            let mut data = noise(200_000, 3);
            let mut at = Vec::new();
            for (k, v) in values.iter().enumerate() {
                let pos = 10_000 + k * 30_000;
                data[pos..pos + v.len()].copy_from_slice(v);
                at.push((pos as u64, k));
            }
            for chunk in [1, 64, 65_536] {
                let hits = scan(&ix, &data, chunk);
                for &(pos, k) in &at {
                    assert!(
                        hits.iter().any(|h| h.entry == k && h.start == pos),
                        "{n} classes, chunk {chunk}: value {k} at {pos} missed: {hits:?}"
                    );
                }
                assert_eq!(hits.len(), n, "{n} classes, chunk {chunk}: {hits:?}");
            }
        }
    }

    #[test]
    fn a_run_one_byte_off_is_not_found() {
        let v = b"the answer key is 42, shh".to_vec();
        let ix = index_for(&[&v]);
        let mut other = v.clone();
        other[10] ^= 1;
        let mut data = noise(5000, 3);
        data.extend_from_slice(&other);
        data.extend_from_slice(&v[..v.len() - 1]);
        assert!(scan(&ix, &data, 512).is_empty());
    }

    #[test]
    fn repeated_bytes_are_judged_once_per_run_and_still_found() {
        let zeros = vec![0u8; 64];
        let ix = index_for(&[&zeros]);
        let data = vec![0u8; 100_000];
        let mut st = RunState::new(&ix);
        let mut hits = Vec::new();
        let none = Budget {
            factor: 0,
            allowance: 0,
        };
        st.feed(&ix, &data, none, &mut hits);
        // A budget of 0 allows one confirmation; the memo answers the rest.
        assert_eq!(hits.len(), 100_000 - 63);
        assert!(!st.over_budget);
    }

    #[test]
    fn prefilter_depends_only_on_the_value() {
        let v = noise(40, 9);
        let mut a = noise(100, 11);
        a.extend_from_slice(&v);
        let mut h = 0u64;
        for &b in &a {
            h = (h << 1).wrapping_add(GEAR[b as usize]);
        }
        let c = class_of(v.len());
        let k = (((h & mask_of(c)) ^ salt_of(c)).wrapping_mul(MIX) >> 40) as u32;
        assert_eq!(k, prefilter_of(&v));
    }

    #[test]
    fn file_index_filters_by_size() {
        let ix = FileIndex::new(&[(0, 5, sha256(b"hello"))]);
        assert!(ix.wants(Some(5)));
        assert!(!ix.wants(Some(6)));
        assert_eq!(ix.lookup(5, &sha256(b"hello")), &[0]);
        assert!(ix.lookup(5, &sha256(b"world")).is_empty());
    }
}
