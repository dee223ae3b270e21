//! Call files (`SetCallFiles`): files the embedder writes into every `run_code` call, fresh
//! or in a session, before the call's own files.
//!
//! They are set as a whole (`--call-files DIR` at startup, or [`CallFiles::set`] from the
//! embedder's code at any time); a call sees the set current when it starts. A call's own
//! file at the same path is refused with an error naming the path: neither side silently
//! overwrites the other.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, RwLock};

use plimsoll_core::pb;
use plimsoll_core::validate::{check_relative_path, MAX_PROJECT_BYTES, MAX_PROJECT_FILES};

/// Why a set of call files was refused.
#[derive(Debug, thiserror::Error)]
pub enum CallFilesError {
    /// A path the protocol refuses.
    #[error("call file {0}")]
    BadPath(#[from] plimsoll_core::validate::BadPath),
    /// The same path twice.
    #[error("call file {0:?} is given twice")]
    Duplicate(String),
    /// More files or bytes than one request may carry.
    #[error("{files} call files of {bytes} bytes: a call carries at most {MAX_PROJECT_FILES} files and {MAX_PROJECT_BYTES} bytes in all, so call files must leave room for the call's own")]
    TooLarge {
        /// How many files.
        files: usize,
        /// Their total content size.
        bytes: usize,
    },
    /// The directory could not be read.
    #[error("--call-files {0}")]
    Dir(#[from] plimsoll_client::files::TreeError),
}

/// The current call files, shared by every clone (one per MCP connection).
#[derive(Debug, Clone, Default)]
pub struct CallFiles(Arc<RwLock<Arc<Vec<pb::ProjectFile>>>>);

impl CallFiles {
    /// No call files.
    pub fn new() -> CallFiles {
        CallFiles::default()
    }

    /// Call files read from every regular text file under `dir` (relative paths).
    pub fn from_dir(dir: &Path) -> Result<CallFiles, CallFilesError> {
        let files = plimsoll_client::files::read_tree(dir)?;
        let c = CallFiles::new();
        c.set(files)?;
        Ok(c)
    }

    /// Replaces the call files (checked first: on an error the old set stays). Calls that
    /// already started keep the set they began with.
    pub fn set(&self, mut files: Vec<pb::ProjectFile>) -> Result<(), CallFilesError> {
        let mut seen = BTreeSet::new();
        for f in &files {
            check_relative_path(&f.path)?;
            if !seen.insert(f.path.as_str()) {
                return Err(CallFilesError::Duplicate(f.path.clone()));
            }
        }
        let bytes: usize = files.iter().map(|f| f.content.len()).sum();
        if files.len() >= MAX_PROJECT_FILES || bytes >= MAX_PROJECT_BYTES {
            return Err(CallFilesError::TooLarge {
                files: files.len(),
                bytes,
            });
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(files);
        Ok(())
    }

    /// The set a call starting now uses.
    pub fn current(&self) -> Arc<Vec<pb::ProjectFile>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(p: &str) -> pb::ProjectFile {
        pb::ProjectFile {
            path: p.into(),
            content: "x".into(),
        }
    }

    #[test]
    fn set_checks_before_replacing() {
        let c = CallFiles::new();
        c.set(vec![file("b.txt"), file("a/c.py")]).unwrap();
        let paths: Vec<_> = c.current().iter().map(|f| f.path.clone()).collect();
        assert_eq!(paths, ["a/c.py", "b.txt"]);
        let e = c.set(vec![file("../etc/passwd")]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("call file path \"../etc/passwd\""),
            "{e}"
        );
        let e = c.set(vec![file("a"), file("a")]).unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
        assert_eq!(c.current().len(), 2, "a refused set leaves the old one");
        let many: Vec<_> = (0..MAX_PROJECT_FILES)
            .map(|i| file(&format!("f{i}")))
            .collect();
        assert!(matches!(c.set(many), Err(CallFilesError::TooLarge { .. })));
    }

    #[test]
    fn clones_share_one_set() {
        let c = CallFiles::new();
        let d = c.clone();
        d.set(vec![file("x")]).unwrap();
        assert_eq!(c.current().len(), 1);
    }
}
