//! The withheld set: a versioned JSON file of entries, each an id, a mode and a digest of the
//! material (a whole file, or a run of N bytes). It never holds the material itself.

use std::collections::HashSet;
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::matcher::{self, FileIndex, RunIndex, MAX_RUN, MIN_RUN};

/// The `format` field of a withheld set file.
pub const SET_FORMAT: &str = "plimsoll-withheld-set";
/// The only set version this build reads and writes.
pub const SET_VERSION: u32 = 1;

/// The only prefilter this build knows.
pub const PREFILTER: &str = "gear-v1";

/// What a find of an entry does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The image must not ship (scan exit 1; plimsolld refuses to serve it).
    Refuse,
    /// The find is reported (and logged by plimsolld) but does not stop anything.
    Audit,
}

impl Mode {
    /// `refuse` or `audit`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Refuse => "refuse",
            Mode::Audit => "audit",
        }
    }
}

/// How an entry matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matcher {
    /// A file whose whole content has this size and SHA-256.
    File {
        /// SHA-256 of the whole file.
        sha256: [u8; 32],
        /// Its size in bytes.
        size: u64,
    },
    /// Any `length` consecutive bytes with this SHA-256, found by the `gear-v1` prefilter.
    Run {
        /// SHA-256 of the run.
        sha256: [u8; 32],
        /// The run's length in bytes, from 16 to 65536.
        length: usize,
        /// 24-bit `gear-v1` prefilter of the run.
        prefilter: u32,
    },
}

/// One entry of a withheld set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Unique name of the entry (`[A-Za-z0-9._:/@+-]`, 1 to 128 characters).
    pub id: String,
    /// What a find does.
    pub mode: Mode,
    /// How it matches.
    pub matcher: Matcher,
    /// Free text for people (never the material).
    pub note: Option<String>,
}

impl Entry {
    /// A whole-file entry from the file's bytes, read once as a stream.
    pub fn whole_file(id: &str, mode: Mode, mut content: impl Read) -> std::io::Result<Entry> {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        let mut buf = vec![0u8; 64 << 10];
        let mut size = 0u64;
        loop {
            let n = content.read(&mut buf)?;
            if n == 0 {
                break;
            }
            ctx.update(&buf[..n]);
            size += n as u64;
        }
        let mut sha256 = [0u8; 32];
        sha256.copy_from_slice(ctx.finish().as_ref());
        Ok(Entry {
            id: id.to_owned(),
            mode,
            matcher: Matcher::File { sha256, size },
            note: None,
        })
    }

    /// A run entry from the value itself (which is hashed here and not kept).
    pub fn run(id: &str, mode: Mode, value: &[u8]) -> Result<Entry, SetError> {
        if !(MIN_RUN..=MAX_RUN).contains(&value.len()) {
            return Err(SetError::Invalid(format!(
                "entry {id}: a run must be {MIN_RUN} to {MAX_RUN} bytes long, this value has {}",
                value.len()
            )));
        }
        Ok(Entry {
            id: id.to_owned(),
            mode,
            matcher: Matcher::Run {
                sha256: matcher::sha256(value),
                length: value.len(),
                prefilter: matcher::prefilter_of(value),
            },
            note: None,
        })
    }
}

/// A withheld set could not be read, parsed or changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The content is not a valid set.
    #[error("{0}")]
    Invalid(String),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetFile {
    format: String,
    version: u32,
    prefilter: String,
    entries: Vec<EntryFile>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryFile {
    id: String,
    mode: Mode,
    #[serde(rename = "match")]
    kind: String,
    sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    length: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prefilter: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

/// A loaded, validated and compiled withheld set.
#[derive(Debug, Clone)]
pub struct WithheldSet {
    entries: Vec<Entry>,
    pub(crate) runs: std::sync::Arc<RunIndex>,
    pub(crate) files: FileIndex,
}

fn valid_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/@+-".contains(&b))
}

fn parse_sha(id: &str, s: &str) -> Result<[u8; 32], SetError> {
    let mut out = [0u8; 32];
    if s.len() != 64 || s.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(SetError::Invalid(format!(
            "entry {id}: sha256 must be 64 lowercase hex digits"
        )));
    }
    hex::decode_to_slice(s, &mut out)
        .map_err(|_| SetError::Invalid(format!("entry {id}: sha256 is not hex")))?;
    Ok(out)
}

impl WithheldSet {
    /// An empty set (finds nothing; unreadable files are still reported).
    pub fn empty() -> WithheldSet {
        WithheldSet::from_entries(Vec::new()).expect("an empty set is valid")
    }

    /// Builds a set from entries, checking ids are valid and unique.
    pub fn from_entries(entries: Vec<Entry>) -> Result<WithheldSet, SetError> {
        let mut seen = HashSet::new();
        let mut runs = Vec::new();
        let mut files = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            if !valid_id(&e.id) {
                return Err(SetError::Invalid(format!(
                    "entry {:?}: id must be 1 to 128 of A-Z a-z 0-9 . _ : / @ + -",
                    e.id
                )));
            }
            if !seen.insert(e.id.clone()) {
                return Err(SetError::Invalid(format!("entry {}: id is repeated", e.id)));
            }
            match &e.matcher {
                Matcher::File { sha256, size } => files.push((i, *size, *sha256)),
                Matcher::Run {
                    sha256,
                    length,
                    prefilter,
                } => {
                    if !(MIN_RUN..=MAX_RUN).contains(length) {
                        return Err(SetError::Invalid(format!(
                            "entry {}: length must be {MIN_RUN} to {MAX_RUN}",
                            e.id
                        )));
                    }
                    if *prefilter > 0x00FF_FFFF {
                        return Err(SetError::Invalid(format!(
                            "entry {}: prefilter must be a 24-bit number",
                            e.id
                        )));
                    }
                    runs.push((i, *length, *sha256, *prefilter));
                }
            }
        }
        Ok(WithheldSet {
            runs: std::sync::Arc::new(RunIndex::new(&runs)),
            files: FileIndex::new(&files),
            entries,
        })
    }

    /// Parses a set from its JSON text.
    pub fn from_json(bytes: &[u8]) -> Result<WithheldSet, SetError> {
        let f: SetFile = serde_json::from_slice(bytes)
            .map_err(|e| SetError::Invalid(format!("not a withheld set: {e}")))?;
        crate::file::check_header(&f.format, SET_FORMAT, f.version, SET_VERSION)
            .map_err(SetError::Invalid)?;
        if f.prefilter != PREFILTER {
            return Err(SetError::Invalid(format!(
                "prefilter {:?} is not supported (this build knows {PREFILTER:?})",
                f.prefilter
            )));
        }
        let mut entries = Vec::with_capacity(f.entries.len());
        for e in f.entries {
            let sha256 = parse_sha(&e.id, &e.sha256)?;
            let matcher = match (e.kind.as_str(), e.size, e.length, e.prefilter) {
                ("file", Some(size), None, None) => Matcher::File { sha256, size },
                ("run", None, Some(length), Some(prefilter)) => Matcher::Run {
                    sha256,
                    length,
                    prefilter,
                },
                ("file", ..) => {
                    return Err(SetError::Invalid(format!(
                        "entry {}: a file entry has size and no length or prefilter",
                        e.id
                    )))
                }
                ("run", ..) => {
                    return Err(SetError::Invalid(format!(
                        "entry {}: a run entry has length and prefilter and no size",
                        e.id
                    )))
                }
                (other, ..) => {
                    return Err(SetError::Invalid(format!(
                        "entry {}: match {other:?} is not file or run",
                        e.id
                    )))
                }
            };
            entries.push(Entry {
                id: e.id,
                mode: e.mode,
                matcher,
                note: e.note,
            });
        }
        WithheldSet::from_entries(entries)
    }

    /// Reads and parses a set file.
    pub fn load(path: &Path) -> Result<WithheldSet, SetError> {
        let bytes = std::fs::read(path).map_err(|source| SetError::Io {
            path: path.display().to_string(),
            source,
        })?;
        WithheldSet::from_json(&bytes)
            .map_err(|e| SetError::Invalid(format!("{}: {e}", path.display())))
    }

    /// The set as JSON text (stable field order, one entry per line block).
    pub fn to_json(&self) -> String {
        let f = SetFile {
            format: SET_FORMAT.into(),
            version: SET_VERSION,
            prefilter: PREFILTER.into(),
            entries: self
                .entries
                .iter()
                .map(|e| match &e.matcher {
                    Matcher::File { sha256, size } => EntryFile {
                        id: e.id.clone(),
                        mode: e.mode,
                        kind: "file".into(),
                        sha256: hex::encode(sha256),
                        size: Some(*size),
                        length: None,
                        prefilter: None,
                        note: e.note.clone(),
                    },
                    Matcher::Run {
                        sha256,
                        length,
                        prefilter,
                    } => EntryFile {
                        id: e.id.clone(),
                        mode: e.mode,
                        kind: "run".into(),
                        sha256: hex::encode(sha256),
                        size: None,
                        length: Some(*length),
                        prefilter: Some(*prefilter),
                        note: e.note.clone(),
                    },
                })
                .collect(),
        };
        let mut s = serde_json::to_string_pretty(&f).expect("a set serialises");
        s.push('\n');
        s
    }

    /// Writes the set atomically (a temporary file beside it, then a rename).
    pub fn save(&self, path: &Path) -> Result<(), SetError> {
        crate::file::write_atomic(path, self.to_json().as_bytes()).map_err(|source| SetError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// Adds one entry (its id must be new).
    pub fn add(&mut self, entry: Entry) -> Result<(), SetError> {
        let mut entries = self.entries.clone();
        entries.push(entry);
        *self = WithheldSet::from_entries(entries)?;
        Ok(())
    }

    /// The entries, in file order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// True when every entry is audit-only (unreadable files still fail a scan).
    pub fn audit_only(&self) -> bool {
        self.entries.iter().all(|e| e.mode == Mode::Audit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_never_holds_the_value() {
        let mut set = WithheldSet::empty();
        set.add(Entry::run("canary-1", Mode::Refuse, b"secret-canary-value-123").unwrap())
            .unwrap();
        set.add(Entry::whole_file("answers", Mode::Audit, &b"42\n"[..]).unwrap())
            .unwrap();
        let text = set.to_json();
        assert!(!text.contains("secret-canary"));
        let back = WithheldSet::from_json(text.as_bytes()).unwrap();
        assert_eq!(back.entries(), set.entries());
        assert!(!back.audit_only());
    }

    #[test]
    fn rejects_bad_sets_with_a_message_naming_the_entry() {
        let mut set = WithheldSet::empty();
        set.add(Entry::run("dup", Mode::Refuse, b"0123456789abcdefXYZ").unwrap())
            .unwrap();
        let e = set
            .add(Entry::run("dup", Mode::Audit, b"0123456789abcdefXYZ").unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("dup"), "{e}");
        assert!(Entry::run("short", Mode::Refuse, b"too short").is_err());
        for bad in [
            r#"{"format":"x","version":1,"prefilter":"gear-v1","entries":[]}"#,
            r#"{"format":"plimsoll-withheld-set","version":2,"prefilter":"gear-v1","entries":[]}"#,
            r#"{"format":"plimsoll-withheld-set","version":1,"prefilter":"gear-v1","entries":[{"id":"a","mode":"refuse","match":"file","sha256":"00","size":1}]}"#,
            r#"{"format":"plimsoll-withheld-set","version":1,"prefilter":"gear-v1","entries":[],"extra":1}"#,
            r#"{"format":"plimsoll-withheld-set","version":1,"prefilter":"gear-v1","entries":[{"id":"a","mode":"maybe","match":"file","sha256":"00","size":1}]}"#,
            "not json",
        ] {
            assert!(WithheldSet::from_json(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
