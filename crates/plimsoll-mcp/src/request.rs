//! From `run_code`'s arguments and the call files to the request plimsolld receives.
//!
//! - A fresh JavaScript snippet with no files is a `JavaScriptRun` (QuickJS or node,
//!   whichever the provider has). Anything else fresh is a project: the call files, then
//!   the call's own files, then the code in `.run_code.<ext>`, run by one step
//!   (`node`, `python3` or `sh`).
//! - In a session, Python and JavaScript are cells (one kept interpreter, so variables
//!   persist) carrying the call files and the call's own; shell is a project step in the
//!   session's directory.
//!
//! The request is then checked exactly as plimsolld will check it (`plimsoll-core`'s
//! validation and the daemon's size limit), so a call the daemon would refuse is refused
//! here with the same message, before anything is sent.

use std::collections::BTreeMap;

use plimsoll_core::pb;
use plimsoll_core::validate::{validate_run, validate_session_call, MAX_REQUEST_BYTES};
use plimsoll_core::PROTOCOL;
use prost::Message;

use crate::args::{Language, RunCode};

/// Why a call could not be turned into a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The call's own file is at a call file's path.
    #[error("files[{0:?}]: this server writes a call file at that path into every call; send your file under another path (the call files are read-only for calls)")]
    CallFileCollision(String),
    /// The call's own file is at the path the code itself is written to.
    #[error(
        "files[{0:?}]: that path holds the code of this call; send your file under another path"
    )]
    CodeFileCollision(String),
    /// The daemon would refuse the request (`request`): the message is its own.
    #[error("{0}")]
    Invalid(String),
    /// The encoded request is larger than plimsolld accepts.
    #[error("the request would be {size} bytes; plimsolld accepts at most {MAX_REQUEST_BYTES} (send fewer or smaller files)")]
    TooLarge {
        /// The encoded size.
        size: usize,
    },
}

/// The file the code of a project-backed call is written to.
pub fn code_file(language: Language) -> &'static str {
    match language {
        Language::Javascript => ".run_code.js",
        Language::Python => ".run_code.py",
        Language::Shell => ".run_code.sh",
    }
}

fn interpreter(language: Language) -> &'static str {
    match language {
        Language::Javascript => "node",
        Language::Python => "python3",
        Language::Shell => "sh",
    }
}

/// The call files followed by the call's own, refusing a path both name (or the code
/// file's, when `code_path` is given).
pub fn merge_files(
    call_files: &[pb::ProjectFile],
    own: Option<&BTreeMap<String, String>>,
    code_path: Option<&str>,
) -> Result<Vec<pb::ProjectFile>, BuildError> {
    let mut files = call_files.to_vec();
    for (path, content) in own.into_iter().flatten() {
        if call_files.iter().any(|f| &f.path == path) {
            return Err(BuildError::CallFileCollision(path.clone()));
        }
        if Some(path.as_str()) == code_path {
            return Err(BuildError::CodeFileCollision(path.clone()));
        }
        files.push(pb::ProjectFile {
            path: path.clone(),
            content: content.clone(),
        });
    }
    Ok(files)
}

fn project(a: &RunCode, call_files: &[pb::ProjectFile]) -> Result<pb::ProjectRun, BuildError> {
    let code_path = code_file(a.language);
    if call_files.iter().any(|f| f.path == code_path) {
        return Err(BuildError::Invalid(format!(
            "the call files hold {code_path}, the path this server writes the code to; the operator must rename that call file"
        )));
    }
    let mut files = merge_files(call_files, a.files.as_ref(), Some(code_path))?;
    files.push(pb::ProjectFile {
        path: code_path.to_owned(),
        content: a.code.clone(),
    });
    Ok(pb::ProjectRun {
        files,
        steps: vec![format!("{} {code_path}", interpreter(a.language))],
        artifacts: Vec::new(),
        grant_profile: String::new(),
    })
}

fn check_size(m: &impl Message) -> Result<(), BuildError> {
    let size = m.encoded_len();
    if size > MAX_REQUEST_BYTES {
        return Err(BuildError::TooLarge { size });
    }
    Ok(())
}

/// The floor on the wire (empty for none).
fn floor(a: &RunCode) -> String {
    a.minimum_isolation
        .map(|t| t.as_str().to_owned())
        .unwrap_or_default()
}

/// The `Run` request for a call outside any session.
pub fn fresh(a: &RunCode, call_files: &[pb::ProjectFile]) -> Result<pb::RunRequest, BuildError> {
    use pb::run_request::Payload;
    let no_files = call_files.is_empty() && a.files.as_ref().is_none_or(|f| f.is_empty());
    let payload = if a.language == Language::Javascript && no_files {
        Payload::Javascript(pb::JavaScriptRun {
            code: a.code.clone(),
            grant_profile: String::new(),
        })
    } else {
        Payload::Project(project(a, call_files)?)
    };
    let req = pb::RunRequest {
        protocol: PROTOCOL,
        minimum_isolation: floor(a),
        trace_id: String::new(),
        timeout_ms: a.timeout_ms.map_or(0, |t| t as i32),
        software_rule: None,
        payload: Some(payload),
    };
    check_size(&req)?;
    validate_run(&req).map_err(|r| BuildError::Invalid(r.message))?;
    Ok(req)
}

/// The `SessionRun` request for a call in a session (the client fills in the id).
pub fn in_session(
    a: &RunCode,
    call_files: &[pb::ProjectFile],
) -> Result<pb::SessionRunRequest, BuildError> {
    use pb::session_run_request::Payload;
    let payload = match a.language {
        Language::Shell => Payload::Project(project(a, call_files)?),
        lang => Payload::Cell(pb::CellRun {
            language: lang.as_str().to_owned(),
            code: a.code.clone(),
            files: merge_files(call_files, a.files.as_ref(), None)?,
        }),
    };
    let req = pb::SessionRunRequest {
        protocol: PROTOCOL,
        minimum_isolation: floor(a),
        trace_id: String::new(),
        timeout_ms: a.timeout_ms.map_or(0, |t| t as i32),
        // A well-formed placeholder so validation sees the request as the daemon will.
        session_id: "0".repeat(32),
        software_rule: None,
        payload: Some(payload),
    };
    check_size(&req)?;
    validate_session_call(&req).map_err(|r| BuildError::Invalid(r.message))?;
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::run_request::Payload as P;
    use pb::session_run_request::Payload as S;

    fn call(language: Language, files: &[(&str, &str)]) -> RunCode {
        RunCode {
            language,
            code: "print(1)".into(),
            files: (!files.is_empty()).then(|| {
                files
                    .iter()
                    .map(|(p, c)| (p.to_string(), c.to_string()))
                    .collect()
            }),
            session: None,
            timeout_ms: Some(2000),
            minimum_isolation: None,
        }
    }

    fn cf(p: &str) -> pb::ProjectFile {
        pb::ProjectFile {
            path: p.into(),
            content: "call".into(),
        }
    }

    #[test]
    fn fresh_payloads() {
        let r = fresh(&call(Language::Javascript, &[]), &[]).unwrap();
        assert!(matches!(r.payload, Some(P::Javascript(_))));
        assert_eq!(r.timeout_ms, 2000);
        let r = fresh(&call(Language::Javascript, &[]), &[cf("data.json")]).unwrap();
        let Some(P::Project(p)) = r.payload else {
            panic!()
        };
        assert_eq!(p.steps, ["node .run_code.js"]);
        let paths: Vec<_> = p.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            ["data.json", ".run_code.js"],
            "call files first, code last"
        );
        let r = fresh(
            &call(Language::Python, &[("in.txt", "own")]),
            &[cf("data.json")],
        )
        .unwrap();
        let Some(P::Project(p)) = r.payload else {
            panic!()
        };
        assert_eq!(p.steps, ["python3 .run_code.py"]);
        let paths: Vec<_> = p.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["data.json", "in.txt", ".run_code.py"]);
    }

    #[test]
    fn session_payloads() {
        let r = in_session(&call(Language::Python, &[("a", "b")]), &[cf("c")]).unwrap();
        let Some(S::Cell(c)) = r.payload else {
            panic!()
        };
        assert_eq!(c.language, "python");
        assert_eq!(c.files.len(), 2);
        let r = in_session(&call(Language::Shell, &[]), &[]).unwrap();
        let Some(S::Project(p)) = r.payload else {
            panic!()
        };
        assert_eq!(p.steps, ["sh .run_code.sh"]);
    }

    #[test]
    fn collisions_and_limits_are_refused_before_sending() {
        let e = fresh(
            &call(Language::Python, &[("data.json", "mine")]),
            &[cf("data.json")],
        )
        .unwrap_err();
        assert_eq!(e, BuildError::CallFileCollision("data.json".into()));
        let e = in_session(
            &call(Language::Python, &[("data.json", "mine")]),
            &[cf("data.json")],
        )
        .unwrap_err();
        assert!(e.to_string().contains("call file at that path"), "{e}");
        let e = fresh(&call(Language::Python, &[(".run_code.py", "x")]), &[]).unwrap_err();
        assert!(matches!(e, BuildError::CodeFileCollision(_)), "{e}");
        let e = fresh(&call(Language::Shell, &[("../x", "y")]), &[]).unwrap_err();
        assert!(e.to_string().contains("../x"), "{e}");
        let big = "x".repeat(5 * 1024 * 1024);
        let e = fresh(&call(Language::Python, &[("big", &big)]), &[]).unwrap_err();
        assert!(matches!(e, BuildError::Invalid(_)), "{e}");
        let huge = "x".repeat(MAX_REQUEST_BYTES);
        let mut a = call(Language::Javascript, &[]);
        a.code = huge;
        let e = fresh(&a, &[]).unwrap_err();
        assert!(matches!(e, BuildError::TooLarge { .. }), "{e}");
    }
}
