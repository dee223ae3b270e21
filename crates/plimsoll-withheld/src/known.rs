//! The known-unreadable lists (`known-images.json`): for each image content ID, the files an
//! operator has looked at and acknowledged as unread. Listing acknowledges unread bytes, not
//! that they hold no secret.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The `format` field of a known file.
pub const KNOWN_FORMAT: &str = "plimsoll-withheld-known";
/// The only known-file version this build reads and writes.
pub const KNOWN_VERSION: u32 = 1;

/// One acknowledged unreadable file. All four fields must match for the item to cover a file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KnownItem {
    /// The layer (its digest), `config` or `export`, as the scan names it.
    pub layer: String,
    /// The path, with `!` between an archive and a path inside it.
    pub path: String,
    /// `format:<name>` or `limit:<name>`.
    pub reason: String,
    /// The whole file's size in bytes.
    pub size: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ImageList {
    items: Vec<KnownItem>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KnownFile {
    format: String,
    version: u32,
    images: BTreeMap<String, ImageList>,
}

/// A known file could not be read, parsed or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KnownError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The content is not a valid known file.
    #[error("{0}")]
    Invalid(String),
}

/// Known-unreadable lists keyed by image content ID (`sha256:<hex>`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KnownImages {
    images: BTreeMap<String, Vec<KnownItem>>,
}

impl KnownImages {
    /// No lists: every unreadable file is unknown.
    pub fn empty() -> KnownImages {
        KnownImages::default()
    }

    /// Parses a known file's JSON text.
    pub fn from_json(bytes: &[u8]) -> Result<KnownImages, KnownError> {
        let f: KnownFile = serde_json::from_slice(bytes)
            .map_err(|e| KnownError::Invalid(format!("not a known-images file: {e}")))?;
        crate::file::check_header(&f.format, KNOWN_FORMAT, f.version, KNOWN_VERSION)
            .map_err(KnownError::Invalid)?;
        for id in f.images.keys() {
            if !valid_image_id(id) {
                return Err(KnownError::Invalid(format!(
                    "image key {id:?} is not a content ID (sha256:<64 hex>)"
                )));
            }
        }
        Ok(KnownImages {
            images: f.images.into_iter().map(|(k, v)| (k, v.items)).collect(),
        })
    }

    /// Reads a known file.
    pub fn load(path: &Path) -> Result<KnownImages, KnownError> {
        let bytes = std::fs::read(path).map_err(|source| KnownError::Io {
            path: path.display().to_string(),
            source,
        })?;
        KnownImages::from_json(&bytes)
            .map_err(|e| KnownError::Invalid(format!("{}: {e}", path.display())))
    }

    /// Reads a known file, or starts empty when it does not exist yet.
    pub fn load_or_empty(path: &Path) -> Result<KnownImages, KnownError> {
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(KnownImages::empty()),
            _ => KnownImages::load(path),
        }
    }

    /// The file's JSON text (images and items sorted, so rewrites diff cleanly).
    pub fn to_json(&self) -> String {
        let f = KnownFile {
            format: KNOWN_FORMAT.into(),
            version: KNOWN_VERSION,
            images: self
                .images
                .iter()
                .map(|(k, v)| (k.clone(), ImageList { items: v.clone() }))
                .collect(),
        };
        let mut s = serde_json::to_string_pretty(&f).expect("a known file serialises");
        s.push('\n');
        s
    }

    /// Writes the file atomically.
    pub fn save(&self, path: &Path) -> Result<(), KnownError> {
        crate::file::write_atomic(path, self.to_json().as_bytes()).map_err(|source| {
            KnownError::Io {
                path: path.display().to_string(),
                source,
            }
        })
    }

    /// The list for one image, if it has one.
    pub fn items(&self, image_id: &str) -> Option<&[KnownItem]> {
        self.images.get(image_id).map(Vec::as_slice)
    }

    /// Whether an unreadable file of this image is on its list.
    pub fn covers(&self, image_id: &str, item: &KnownItem) -> bool {
        self.items(image_id)
            .is_some_and(|list| list.binary_search(item).is_ok() || list.contains(item))
    }

    /// Replaces one image's list (the others are untouched).
    pub fn set_image(&mut self, image_id: &str, mut items: Vec<KnownItem>) {
        items.sort();
        items.dedup();
        self.images.insert(image_id.to_owned(), items);
    }

    /// Image IDs that have a list.
    pub fn image_ids(&self) -> impl Iterator<Item = &str> {
        self.images.keys().map(String::as_str)
    }
}

/// `sha256:` followed by 64 lowercase hex digits.
pub fn valid_image_id(id: &str) -> bool {
    id.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID_A: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const ID_B: &str = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn item(path: &str, size: u64) -> KnownItem {
        KnownItem {
            layer: "sha256:11".into(),
            path: path.into(),
            reason: "format:7z".into(),
            size,
        }
    }

    #[test]
    fn items_bind_every_field_and_images_are_separate() {
        let mut k = KnownImages::empty();
        k.set_image(ID_A, vec![item("a.7z", 10)]);
        assert!(k.covers(ID_A, &item("a.7z", 10)));
        assert!(!k.covers(ID_A, &item("a.7z", 11)));
        assert!(!k.covers(ID_B, &item("a.7z", 10)));
        let back = KnownImages::from_json(k.to_json().as_bytes()).unwrap();
        assert_eq!(back, k);
    }

    #[test]
    fn save_and_rewrite_one_image_only() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("known-images.json");
        let mut k = KnownImages::load_or_empty(&p).unwrap();
        k.set_image(ID_A, vec![item("a.7z", 10)]);
        k.set_image(ID_B, vec![item("b.7z", 20)]);
        k.save(&p).unwrap();
        let mut k2 = KnownImages::load(&p).unwrap();
        k2.set_image(ID_A, vec![]);
        k2.save(&p).unwrap();
        let k3 = KnownImages::load(&p).unwrap();
        assert_eq!(k3.items(ID_A), Some(&[][..]));
        assert_eq!(k3.items(ID_B).unwrap(), &[item("b.7z", 20)]);
    }

    #[test]
    fn rejects_bad_files() {
        for bad in [
            r#"{"format":"plimsoll-withheld-known","version":1,"images":{"latest":{"items":[]}}}"#,
            r#"{"format":"plimsoll-withheld-known","version":9,"images":{}}"#,
            r#"[]"#,
        ] {
            assert!(KnownImages::from_json(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
