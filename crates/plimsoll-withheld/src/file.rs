//! What the withheld set and the known-unreadable list share as files: the versioned header
//! check, and the atomic write (a temporary file of mode 0600 beside the target, fsynced,
//! renamed over it, then the directory fsynced; a symbolic link or a non-regular target is
//! refused, never followed or replaced).

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Checks a versioned file's `format` and `version`; the error says what was found and what
/// this build reads.
pub(crate) fn check_header(
    format: &str,
    want_format: &str,
    version: u32,
    want_version: u32,
) -> Result<(), String> {
    if format != want_format {
        return Err(format!("format is {format:?}, expected {want_format:?}"));
    }
    if version != want_version {
        return Err(format!(
            "version {version} is not supported (this build reads {want_version})"
        ));
    }
    Ok(())
}

/// Writes `bytes` to `path` so that a reader sees the old file or the new one, never half a
/// file, and the new one survives a crash once this returns. Refuses (`InvalidInput`) a
/// target that is a symbolic link or not a regular file.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the target is a symbolic link",
            ))
        }
        Ok(m) if !m.is_file() => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the target is not a regular file",
            ))
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let (mut f, tmp) = create_temp(dir, &name)?;
    let result = (|| {
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// A new file of mode 0600 in `dir` (never an existing one: `O_EXCL`, no link followed).
fn create_temp(dir: &Path, name: &str) -> io::Result<(fs::File, std::path::PathBuf)> {
    let mut last = None;
    for _ in 0..16 {
        let suffix = hex::encode(ring_random()?);
        let tmp = dir.join(format!(".{name}.{suffix}.tmp"));
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
        {
            Ok(f) => {
                // The mode is set again so the promise does not rest on the umask.
                use std::os::unix::fs::PermissionsExt;
                f.set_permissions(fs::Permissions::from_mode(0o600))?;
                return Ok((f, tmp));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no temporary name was free")))
}

fn ring_random() -> io::Result<[u8; 8]> {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 8];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| io::Error::other("no random bytes for a temporary name"))?;
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn headers_name_what_was_found() {
        assert!(check_header("a", "a", 1, 1).is_ok());
        let e = check_header("b", "a", 1, 1).unwrap_err();
        assert!(e.contains("\"b\"") && e.contains("\"a\""), "{e}");
        let e = check_header("a", "a", 2, 1).unwrap_err();
        assert!(e.contains("version 2") && e.contains("reads 1"), "{e}");
    }

    #[test]
    fn writes_replace_the_file_with_mode_0600_and_leave_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("set.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let mode = fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn symbolic_links_and_non_regular_targets_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.json");
        fs::write(&real, b"keep").unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = write_atomic(&link, b"x").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert_eq!(fs::read(&real).unwrap(), b"keep");
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        let e = write_atomic(dir.path(), b"x").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }
}
