//! Reading a directory into `ProjectFile`s (a project, or the call files of `plimsoll-mcp`):
//! regular files only, relative `/` paths, UTF-8 text only, in a stable (sorted) order so the
//! request digest is stable.

use std::fs;
use std::path::{Path, PathBuf};

use plimsoll_core::pb;
use plimsoll_core::validate::check_relative_path;

/// Why a directory could not be read into files. The message names the path and what to
/// do; callers prefix the flag that named the directory.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// An I/O failure on `path`.
    #[error("{}: {what}: {source}", path.display())]
    Io {
        /// The directory or file.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// The path named is not a directory.
    #[error("{}: not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// A name that is not UTF-8.
    #[error("file name {} is not UTF-8; rename it or move it out of the directory", .0.display())]
    NotUtf8Name(PathBuf),
    /// Content that is not UTF-8.
    #[error("{} is not UTF-8 text; only text files can be sent", .0.display())]
    NotText(PathBuf),
    /// A relative path the protocol refuses.
    #[error("{0}")]
    BadPath(#[from] plimsoll_core::validate::BadPath),
}

/// Reads every regular file under `dir` (recursively). `.git` directories are skipped;
/// symbolic links and other non-regular entries are skipped with a warning, never followed.
/// A file that is not UTF-8 text is refused: the protocol carries files as text.
pub fn read_tree(dir: &Path) -> Result<Vec<pb::ProjectFile>, TreeError> {
    let meta = fs::metadata(dir).map_err(|source| TreeError::Io {
        path: dir.to_owned(),
        what: "cannot open",
        source,
    })?;
    if !meta.is_dir() {
        return Err(TreeError::NotADirectory(dir.to_owned()));
    }
    let mut files = Vec::new();
    walk(dir, "", &mut files)?;
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

fn walk(dir: &Path, prefix: &str, out: &mut Vec<pb::ProjectFile>) -> Result<(), TreeError> {
    let io = |what, source| TreeError::Io {
        path: dir.to_owned(),
        what,
        source,
    };
    for entry in fs::read_dir(dir).map_err(|e| io("cannot list", e))? {
        let entry = entry.map_err(|e| io("cannot list", e))?;
        let full = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            return Err(TreeError::NotUtf8Name(full));
        };
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        let ty = entry
            .file_type()
            .map_err(|e| io("cannot stat an entry", e))?;
        if ty.is_dir() {
            if name == ".git" {
                continue;
            }
            walk(&full, &rel, out)?;
        } else if ty.is_file() {
            check_relative_path(&rel)?;
            let bytes = fs::read(&full).map_err(|source| TreeError::Io {
                path: full.clone(),
                what: "cannot read",
                source,
            })?;
            let content = String::from_utf8(bytes).map_err(|_| TreeError::NotText(full))?;
            out.push(pb::ProjectFile { path: rel, content });
        } else {
            tracing::warn!(path = %full.display(), "skipping an entry that is not a regular file or directory (symbolic links are not followed)");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_text_files_sorted_and_refuses_binary() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("src/lib")).unwrap();
        fs::create_dir_all(d.path().join(".git")).unwrap();
        fs::write(d.path().join(".git/index"), [0xff, 0xfe]).unwrap();
        fs::write(d.path().join("src/lib/a.js"), "a").unwrap();
        fs::write(d.path().join("package.json"), "{}").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("link")).unwrap();
        let files = read_tree(d.path()).unwrap();
        let paths: Vec<_> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["package.json", "src/lib/a.js"]);
        assert_eq!(files[1].content, "a");

        fs::write(d.path().join("blob.bin"), [0u8, 0xff, 0x80]).unwrap();
        let e = read_tree(d.path()).unwrap_err().to_string();
        assert!(e.contains("blob.bin") && e.contains("not UTF-8"), "{e}");
    }

    #[test]
    fn refuses_a_missing_directory() {
        let e = read_tree(Path::new("/nonexistent/plimsoll-project")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/nonexistent/plimsoll-project: cannot open"),
            "{e}"
        );
    }
}
