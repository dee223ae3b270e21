//! Request validation: bounds and path rules checked before anything is admitted.
//!
//! Every failure here is a `request` refusal: nothing ran.

use crate::pb;
use crate::pb::run_request::Payload;
use crate::refusal::Refusal;
use crate::tier::Floor;

/// Largest JavaScript snippet.
pub const MAX_CODE_BYTES: usize = 256 * 1024;
/// Most files in a project.
pub const MAX_PROJECT_FILES: usize = 200;
/// Largest total file content in a project.
pub const MAX_PROJECT_BYTES: usize = 4 * 1024 * 1024;
/// Most steps in a project.
pub const MAX_PROJECT_STEPS: usize = 20;
/// Longest step command line.
pub const MAX_STEP_BYTES: usize = 16 * 1024;
/// Most artifacts a project may ask for.
pub const MAX_PROJECT_ARTIFACTS: usize = 100;
/// Longest relative path.
pub const MAX_PATH_BYTES: usize = 1024;
/// Longest grant profile name.
pub const MAX_GRANT_PROFILE_BYTES: usize = 128;
/// Largest encoded request the daemon decodes.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024 * 1024;
/// The ceiling on any run's deadline.
pub const MAX_TIMEOUT_MS: u32 = 5 * 60 * 1000;

/// A path that may not be written or read inside a run's working directory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("path {path:?} {why}")]
pub struct BadPath {
    /// The offending path (as given).
    pub path: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// Checks that `p` is a clean relative path: non-empty, not absolute, no `.` or `..`
/// component, no empty component, no backslash, no control character, bounded length.
pub fn check_relative_path(p: &str) -> Result<(), BadPath> {
    let bad = |why| {
        Err(BadPath {
            path: p.to_owned(),
            why,
        })
    };
    if p.is_empty() {
        return bad("is empty");
    }
    if p.len() > MAX_PATH_BYTES {
        return bad("is longer than 1024 bytes");
    }
    if p.starts_with('/') {
        return bad("is absolute; paths are relative to the run's working directory");
    }
    if p.contains('\\') {
        return bad("contains a backslash");
    }
    if p.chars().any(char::is_control) {
        return bad("contains a control character");
    }
    for comp in p.split('/') {
        match comp {
            "" => return bad("has an empty component"),
            "." | ".." => return bad("has a '.' or '..' component"),
            _ => {}
        }
    }
    Ok(())
}

fn no_nul(what: &str, s: &str) -> Result<(), Refusal> {
    if s.contains('\0') {
        return Err(Refusal::request(format!("{what} contains a NUL byte")));
    }
    Ok(())
}

fn check_files(files: &[pb::ProjectFile]) -> Result<(), Refusal> {
    if files.len() > MAX_PROJECT_FILES {
        return Err(Refusal::request(format!(
            "{} files; at most {MAX_PROJECT_FILES} are allowed",
            files.len()
        )));
    }
    let total: usize = files.iter().map(|f| f.content.len()).sum();
    if total > MAX_PROJECT_BYTES {
        return Err(Refusal::request(format!(
            "files hold {total} bytes; at most {MAX_PROJECT_BYTES} are allowed"
        )));
    }
    let mut seen = std::collections::HashSet::new();
    for f in files {
        check_relative_path(&f.path).map_err(|e| Refusal::request(format!("file {e}")))?;
        if !seen.insert(f.path.as_str()) {
            return Err(Refusal::request(format!(
                "file path {:?} appears twice",
                f.path
            )));
        }
    }
    Ok(())
}

fn check_grant_profile(name: &str) -> Result<(), Refusal> {
    if name.len() > MAX_GRANT_PROFILE_BYTES {
        return Err(Refusal::request("grant_profile is longer than 128 bytes"));
    }
    Ok(())
}

/// What validation learned about a run request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope {
    /// The parsed floor.
    pub floor: Floor,
    /// The deadline to apply: `timeout_ms` clamped to `1..=MAX_TIMEOUT_MS`, or `None`
    /// when the request leaves it to the provider's default.
    pub timeout_ms: Option<u32>,
}

/// Validates the envelope (floor, timeout, software rule) and the payload of a `Run`.
/// The protocol number is checked before this, by `Refusal::check_protocol`.
pub fn validate_run(r: &pb::RunRequest) -> Result<Envelope, Refusal> {
    if matches!(r.payload, Some(Payload::Cell(_))) {
        return Err(Refusal::request(
            "a cell runs only in a session (SessionRun), not through Run",
        ));
    }
    validate_payload(r)
}

/// Validates a `SessionRun` (as the `RunRequest` it digests like): a cell is allowed, a
/// module is not. The session id is looked up by the daemon, not here.
pub fn validate_session_call(r: &pb::SessionRunRequest) -> Result<Envelope, Refusal> {
    validate_payload(&crate::digest::session_call_as_run(r))
}

/// The cell languages a session may keep an interpreter for.
pub const CELL_LANGUAGES: [&str; 2] = ["javascript", "python"];

/// Checks an owner (`[A-Za-z0-9._:-]{1,64}`, or empty for none).
pub fn check_owner(owner: &str) -> Result<(), Refusal> {
    let ok = owner.len() <= 64
        && owner
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".:_-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Refusal::request(
            "owner must be 1 to 64 characters of A-Z a-z 0-9 . _ : - (or empty)",
        ))
    }
}

/// What validation learned about an `OpenSession`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenEnvelope {
    /// The parsed floor.
    pub floor: Floor,
    /// The lifetime the caller asked for (`None`: the daemon's maximum).
    pub lifetime_ms: Option<u32>,
    /// The idle timeout the caller asked for (`None`: the daemon's maximum).
    pub idle_timeout_ms: Option<u32>,
    /// The language hints, each one of [`CELL_LANGUAGES`] or `shell`, without repeats.
    pub languages: Vec<String>,
}

/// Validates an `OpenSession` request's envelope: floor, software rule, lifetime and idle
/// timeout (a non-zero idle timeout is at least one second), language hints, owner.
pub fn validate_open(r: &pb::OpenSessionRequest) -> Result<OpenEnvelope, Refusal> {
    let floor = Floor::parse(&r.minimum_isolation)
        .map_err(|e| Refusal::request(format!("minimum_isolation: {e}")))?;
    if let Some(rule) = &r.software_rule {
        check_software_rule(rule)?;
    }
    if r.idle_timeout_ms != 0 && r.idle_timeout_ms < 1000 {
        return Err(Refusal::request(
            "idle_timeout_ms must be 0 (the daemon's) or at least 1000",
        ));
    }
    let mut languages: Vec<String> = Vec::new();
    for l in &r.languages {
        if !CELL_LANGUAGES.contains(&l.as_str()) && l != "shell" {
            return Err(Refusal::request(format!(
                "language {l:?} is not javascript, python or shell"
            )));
        }
        if !languages.contains(l) {
            languages.push(l.clone());
        }
    }
    check_owner(&r.owner)?;
    Ok(OpenEnvelope {
        floor,
        lifetime_ms: (r.lifetime_ms > 0).then_some(r.lifetime_ms),
        idle_timeout_ms: (r.idle_timeout_ms > 0).then_some(r.idle_timeout_ms),
        languages,
    })
}

fn validate_payload(r: &pb::RunRequest) -> Result<Envelope, Refusal> {
    let floor = Floor::parse(&r.minimum_isolation)
        .map_err(|e| Refusal::request(format!("minimum_isolation: {e}")))?;
    if let Some(rule) = &r.software_rule {
        check_software_rule(rule)?;
    }
    let timeout_ms = (r.timeout_ms > 0).then(|| (r.timeout_ms as u32).min(MAX_TIMEOUT_MS));
    match &r.payload {
        None => {
            return Err(Refusal::request(
                "the request carries no payload; send javascript or project",
            ))
        }
        Some(Payload::Cell(c)) => {
            if !CELL_LANGUAGES.contains(&c.language.as_str()) {
                return Err(Refusal::request(format!(
                    "cell.language {:?} is not javascript or python",
                    c.language
                )));
            }
            check_code("cell.code", &c.code)?;
            check_files(&c.files)?;
        }
        Some(Payload::Module(_)) => {}
        Some(Payload::Javascript(js)) => {
            check_code("javascript.code", &js.code)?;
            check_grant_profile(&js.grant_profile)?;
        }
        Some(Payload::Project(p)) => {
            check_grant_profile(&p.grant_profile)?;
            check_files(&p.files)?;
            if p.steps.is_empty() || p.steps.len() > MAX_PROJECT_STEPS {
                return Err(Refusal::request(format!(
                    "{} steps; a project needs 1 to {MAX_PROJECT_STEPS}",
                    p.steps.len()
                )));
            }
            for (i, s) in p.steps.iter().enumerate() {
                if s.trim().is_empty() || s.len() > MAX_STEP_BYTES {
                    return Err(Refusal::request(format!(
                        "step {} is empty or longer than {MAX_STEP_BYTES} bytes",
                        i + 1
                    )));
                }
                no_nul("a step", s)?;
            }
            if p.artifacts.len() > MAX_PROJECT_ARTIFACTS {
                return Err(Refusal::request(format!(
                    "{} artifacts; at most {MAX_PROJECT_ARTIFACTS}",
                    p.artifacts.len()
                )));
            }
            let mut seen = std::collections::HashSet::new();
            for a in &p.artifacts {
                check_relative_path(a).map_err(|e| Refusal::request(format!("artifact {e}")))?;
                if !seen.insert(a.as_str()) {
                    return Err(Refusal::request(format!(
                        "artifact path {a:?} appears twice"
                    )));
                }
            }
        }
    }
    Ok(Envelope { floor, timeout_ms })
}

fn check_code(name: &str, code: &str) -> Result<(), Refusal> {
    if code.is_empty() {
        return Err(Refusal::request(format!("{name} is empty")));
    }
    if code.len() > MAX_CODE_BYTES {
        return Err(Refusal::request(format!(
            "{name} is {} bytes; at most {MAX_CODE_BYTES}",
            code.len()
        )));
    }
    no_nul(name, code)
}

fn check_software_rule(rule: &pb::SoftwareRule) -> Result<(), Refusal> {
    match rule.mode.as_str() {
        "" if rule.identities.is_empty() => Ok(()),
        "" => Err(Refusal::request(
            "software_rule lists identities but states no mode",
        )),
        "exact" if rule.identities.len() == 1 => Ok(()),
        "exact" => Err(Refusal::request(
            "software_rule mode exact needs exactly one identity",
        )),
        "approved" if (1..=32).contains(&rule.identities.len()) => {
            if rule
                .identities
                .iter()
                .any(|i| i.is_empty() || i.len() > 256 || i.contains('\0'))
            {
                return Err(Refusal::request(
                    "software_rule identities must be 1 to 256 bytes without NUL",
                ));
            }
            Ok(())
        }
        "approved" => Err(Refusal::request(
            "software_rule mode approved needs 1 to 32 identities",
        )),
        other => Err(Refusal::request(format!(
            "software_rule mode {other:?} is not exact or approved"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        for good in ["a", "a/b.txt", "dir/.hidden", "x..y"] {
            assert!(check_relative_path(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "./a",
            "a/.",
            "a\\b",
            "a\nb",
        ] {
            assert!(check_relative_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn timeout_is_clamped_but_kept() {
        let r = pb::RunRequest {
            protocol: 5,
            timeout_ms: i32::MAX,
            payload: Some(Payload::Javascript(pb::JavaScriptRun {
                code: "1".into(),
                grant_profile: String::new(),
            })),
            ..Default::default()
        };
        assert_eq!(validate_run(&r).unwrap().timeout_ms, Some(MAX_TIMEOUT_MS));
    }
}
