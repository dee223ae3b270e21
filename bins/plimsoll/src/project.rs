//! The project directory (`--project DIR`, read by `plimsoll_client::files`) and the
//! `--timeout` duration.

use std::path::Path;

use plimsoll_core::pb;

/// Reads every regular text file under `dir` ([`plimsoll_client::files::read_tree`]), the
/// error prefixed with the flag that named it.
pub fn read_project(dir: &Path) -> anyhow::Result<Vec<pb::ProjectFile>> {
    plimsoll_client::files::read_tree(dir).map_err(|e| anyhow::anyhow!("--project {e}"))
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
    fn refuses_a_missing_directory() {
        let e = read_project(Path::new("/nonexistent/plimsoll-project")).unwrap_err();
        assert!(format!("{e:#}").contains("--project /nonexistent/plimsoll-project"));
    }
}
