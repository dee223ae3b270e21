//! Reading a project directory into `ProjectFile`s: regular files only, relative `/`
//! paths, UTF-8 text only, in a stable (sorted) order so the request digest is stable.

use std::fs;
use std::path::Path;

use anyhow::{bail, Context};
use plimsoll_core::pb;
use plimsoll_core::validate::check_relative_path;

/// Reads every regular file under `dir` (recursively). `.git` directories are skipped;
/// symbolic links and other non-regular entries are skipped with a warning, never followed.
/// A file that is not UTF-8 text is refused: the protocol carries project files as text.
pub fn read_project(dir: &Path) -> anyhow::Result<Vec<pb::ProjectFile>> {
    let meta = fs::metadata(dir).with_context(|| format!("--project {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("--project {}: not a directory", dir.display());
    }
    let mut files = Vec::new();
    walk(dir, "", &mut files)?;
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

fn walk(dir: &Path, prefix: &str, out: &mut Vec<pb::ProjectFile>) -> anyhow::Result<()> {
    let entries =
        fs::read_dir(dir).with_context(|| format!("--project: cannot list {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("--project: cannot list {}", dir.display()))?;
        let full = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            bail!(
                "--project: file name {} is not UTF-8; rename it or move it out of the project",
                full.display()
            );
        };
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        let ty = entry
            .file_type()
            .with_context(|| format!("--project: cannot stat {}", full.display()))?;
        if ty.is_dir() {
            if name == ".git" {
                continue;
            }
            walk(&full, &rel, out)?;
        } else if ty.is_file() {
            check_relative_path(&rel).map_err(|e| anyhow::anyhow!("--project: {rel}: {e}"))?;
            let bytes = fs::read(&full)
                .with_context(|| format!("--project: cannot read {}", full.display()))?;
            let content = String::from_utf8(bytes).map_err(|_| {
                anyhow::anyhow!(
                    "--project: {} is not UTF-8 text; only text files can be sent in a project",
                    full.display()
                )
            })?;
            out.push(pb::ProjectFile { path: rel, content });
        } else {
            tracing::warn!(path = %full.display(), "skipping a project entry that is not a regular file or directory (symbolic links are not followed)");
        }
    }
    Ok(())
}

/// Parses a timeout: milliseconds (`1500`, `1500ms`), seconds (`5s`) or minutes (`2m`).
pub fn parse_timeout(s: &str) -> Result<i32, String> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1u64)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000)
    } else {
        (s, 1)
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 5000, 500ms, 5s or 2m"))?;
    let ms = n.checked_mul(scale).filter(|ms| *ms <= i32::MAX as u64);
    match ms {
        Some(0) => Err(
            "the timeout must be more than 0 (leave --timeout out for the daemon's default)".into(),
        ),
        Some(ms) => Ok(ms as i32),
        None => Err(format!("{s:?} is too long")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts() {
        assert_eq!(parse_timeout("1500"), Ok(1500));
        assert_eq!(parse_timeout("250ms"), Ok(250));
        assert_eq!(parse_timeout("5s"), Ok(5000));
        assert_eq!(parse_timeout("2m"), Ok(120_000));
        assert!(parse_timeout("0").is_err());
        assert!(parse_timeout("5h").is_err());
        assert!(parse_timeout("-1s").is_err());
        assert!(parse_timeout("99999999999").is_err());
    }

    #[test]
    fn reads_text_files_sorted_and_refuses_binary() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("src/lib")).unwrap();
        fs::create_dir_all(d.path().join(".git")).unwrap();
        fs::write(d.path().join(".git/index"), [0xff, 0xfe]).unwrap();
        fs::write(d.path().join("src/lib/a.js"), "a").unwrap();
        fs::write(d.path().join("package.json"), "{}").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("link")).unwrap();
        let files = read_project(d.path()).unwrap();
        let paths: Vec<_> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["package.json", "src/lib/a.js"]);
        assert_eq!(files[1].content, "a");

        fs::write(d.path().join("blob.bin"), [0u8, 0xff, 0x80]).unwrap();
        let e = read_project(d.path()).unwrap_err().to_string();
        assert!(e.contains("blob.bin") && e.contains("not UTF-8"), "{e}");
    }

    #[test]
    fn refuses_a_missing_directory() {
        let e = read_project(Path::new("/nonexistent/plimsoll-project")).unwrap_err();
        assert!(format!("{e:#}").contains("--project /nonexistent/plimsoll-project"));
    }
}
