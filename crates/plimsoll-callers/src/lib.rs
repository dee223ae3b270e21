//! plimsoll-callers: the caller registry. Reads, checks and writes the callers file
//! (`PLIMSOLL_CLIENTS_FILE`): one entry per caller with its id, the SHA-256 fingerprint of
//! its bearer token, and its scopes; and answers "which caller holds this token?".
//!
//! It must never store, log or print a token: only fingerprints reach the file, and a new
//! token leaves this crate exactly once, as the return value of [`CallersFile::add`].
//!
//! The parser is strict on purpose. A callers file decides who may run code, so a typo
//! (an unknown field, a padded id, a short fingerprint, a repeated scope) is refused with a
//! message naming the file and the problem rather than guessed at.

use std::collections::HashSet;
use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use ring::digest::{digest, SHA256};
use ring::rand::{SecureRandom, SystemRandom};

/// The scope every RPC of `plimsoll.v1.SandboxService` requires.
pub const SCOPE_RUN: &str = "code:run";

/// The scope (and reserved id) that stands for "everything".
const WILDCARD: &str = "*";

/// One caller: who it is, the fingerprint of its token, and what it may do.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Caller {
    /// The caller's name, as audit lines and grants name it. Never empty, never `*`.
    pub id: String,
    /// Lowercase hex SHA-256 of the caller's bearer token (64 characters).
    pub token_sha256: String,
    /// What the caller may do, e.g. [`SCOPE_RUN`]; `*` grants every scope.
    pub scopes: Vec<String>,
}

impl Caller {
    /// Whether this caller holds `scope` (`*` grants every scope).
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.iter().any(|s| s == scope || s == WILDCARD)
    }
}

/// The callers file as it is stored: `{"clients": [...]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallersFile {
    /// Every caller, in file order.
    pub clients: Vec<Caller>,
}

/// What is wrong inside a callers file (or with a caller about to be added).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// Not the expected JSON: a syntax error, an unknown or missing field, or trailing data.
    #[error("{0}")]
    Json(String),
    /// A caller with an empty id.
    #[error("caller #{index} has an empty id")]
    EmptyId {
        /// Position of the caller in the file, from 1.
        index: usize,
    },
    /// An id with surrounding whitespace or a control character.
    #[error("caller id {id:?} has surrounding whitespace or a control character")]
    BadId {
        /// The id as written.
        id: String,
    },
    /// The id `*`, which is reserved.
    #[error("caller id \"*\" is reserved")]
    ReservedId,
    /// Two callers with one id.
    #[error("caller id {id:?} appears more than once")]
    DuplicateId {
        /// The repeated id.
        id: String,
    },
    /// A fingerprint that is not 64 hex characters.
    #[error("caller {id:?}: token_sha256 must be 64 hexadecimal characters (the SHA-256 of the token), got {len} characters")]
    BadFingerprint {
        /// The caller whose fingerprint is wrong.
        id: String,
        /// Its length in characters.
        len: usize,
    },
    /// Two callers share one fingerprint, so one token would authenticate as both.
    #[error("callers {first:?} and {second:?} have the same token_sha256")]
    DuplicateFingerprint {
        /// The caller listed first.
        first: String,
        /// The caller listed later.
        second: String,
    },
    /// A caller with no scope at all; it could call nothing (revoke it instead).
    #[error("caller {id:?} has no scopes")]
    NoScopes {
        /// The caller.
        id: String,
    },
    /// A scope that is empty or contains whitespace or a control character.
    #[error("caller {id:?}: scope {scope:?} is empty or contains whitespace")]
    BadScope {
        /// The caller.
        id: String,
        /// The scope as written.
        scope: String,
    },
    /// A scope listed twice for one caller.
    #[error("caller {id:?}: scope {scope:?} is listed more than once")]
    RepeatedScope {
        /// The caller.
        id: String,
        /// The repeated scope.
        scope: String,
    },
}

/// Where a problem was found: a named file, or text handed to [`CallersFile::parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin(pub Option<PathBuf>);

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(p) => write!(f, "callers file {}", p.display()),
            None => f.write_str("callers file"),
        }
    }
}

/// Why a callers file could not be read, written or used. Every message names the file
/// (when there is one) and the problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallersError {
    /// The file could not be read.
    #[error("callers file {}: cannot read: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The file could not be written.
    #[error("callers file {}: cannot write: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The target is a symbolic link or not a regular file; it is never written through.
    #[error("callers file {}: refusing to write: it {why}", path.display())]
    Target {
        /// The file.
        path: PathBuf,
        /// What the target is.
        why: &'static str,
    },
    /// The contents are not a valid callers file.
    #[error("{origin}: {problem}")]
    Invalid {
        /// The file, when known.
        origin: Origin,
        /// What is wrong.
        problem: Problem,
    },
    /// `add` with an id the file already holds.
    #[error("callers file: caller {0:?} already exists; revoke it first to issue a new token")]
    Exists(String),
    /// `revoke` with an id the file does not hold.
    #[error("callers file: no caller {0:?}")]
    UnknownCaller(String),
    /// A registry with no caller would refuse every call.
    #[error("callers file lists no caller, so every call would be refused; add one with `plimsoll callers add`")]
    Empty,
}

impl CallersError {
    fn invalid(problem: Problem) -> Self {
        CallersError::Invalid {
            origin: Origin(None),
            problem,
        }
    }

    fn at(self, path: &Path) -> Self {
        match self {
            CallersError::Invalid { problem, .. } => CallersError::Invalid {
                origin: Origin(Some(path.to_owned())),
                problem,
            },
            other => other,
        }
    }
}

/// Lowercase hex SHA-256 of the token's bytes: what the callers file stores.
pub fn fingerprint(token: &str) -> String {
    hex::encode(digest(&SHA256, token.as_bytes()).as_ref())
}

/// A new token: 32 bytes from the operating system's CSPRNG, as 64 lowercase hex characters.
///
/// # Panics
/// If the operating system's random source fails, which leaves no safe way to make a token.
pub fn generate_token() -> String {
    let mut bytes = [0u8; 32];
    SystemRandom::new()
        .fill(&mut bytes)
        .expect("the operating system's random source failed");
    hex::encode(bytes)
}

fn check_id(id: &str, index: usize) -> Result<(), Problem> {
    if id.is_empty() {
        return Err(Problem::EmptyId { index });
    }
    if id.trim() != id || id.chars().any(char::is_control) {
        return Err(Problem::BadId { id: id.to_owned() });
    }
    if id == WILDCARD {
        return Err(Problem::ReservedId);
    }
    Ok(())
}

fn check_scopes(id: &str, scopes: &[String]) -> Result<(), Problem> {
    if scopes.is_empty() {
        return Err(Problem::NoScopes { id: id.to_owned() });
    }
    let mut seen = HashSet::new();
    for s in scopes {
        if s.is_empty() || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Problem::BadScope {
                id: id.to_owned(),
                scope: s.clone(),
            });
        }
        if !seen.insert(s.as_str()) {
            return Err(Problem::RepeatedScope {
                id: id.to_owned(),
                scope: s.clone(),
            });
        }
    }
    Ok(())
}

/// Lower-cases a fingerprint and checks it is 64 hex characters.
fn normalize_fingerprint(id: &str, fp: &str) -> Result<String, Problem> {
    let lower = fp.to_ascii_lowercase();
    if lower.len() == 64 && lower.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(lower)
    } else {
        Err(Problem::BadFingerprint {
            id: id.to_owned(),
            len: fp.chars().count(),
        })
    }
}

impl CallersFile {
    /// Parses and checks callers-file text. Fingerprints are lower-cased; everything else
    /// must already be exact. An empty list is allowed here (so `callers add` can start
    /// from nothing) but [`Registry::new`] refuses it.
    pub fn parse(text: &str) -> Result<CallersFile, CallersError> {
        let mut file: CallersFile = serde_json::from_str(text)
            .map_err(|e| CallersError::invalid(Problem::Json(e.to_string())))?;
        file.normalize().map_err(CallersError::invalid)?;
        Ok(file)
    }

    /// Reads and parses the callers file at `path`.
    pub fn load(path: &Path) -> Result<CallersFile, CallersError> {
        let text = fs::read_to_string(path).map_err(|source| CallersError::Read {
            path: path.to_owned(),
            source,
        })?;
        CallersFile::parse(&text).map_err(|e| e.at(path))
    }

    /// Writes the file atomically: checks the contents, refuses a symlink or non-regular
    /// target, writes a temporary file (mode 0600) beside it, fsyncs, renames it over the
    /// target and fsyncs the directory.
    pub fn save(&self, path: &Path) -> Result<(), CallersError> {
        let mut checked = self.clone();
        checked
            .normalize()
            .map_err(|p| CallersError::invalid(p).at(path))?;
        let write_err = |source| CallersError::Write {
            path: path.to_owned(),
            source,
        };
        match fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(CallersError::Target {
                    path: path.to_owned(),
                    why: "is a symbolic link",
                })
            }
            Ok(m) if !m.is_file() => {
                return Err(CallersError::Target {
                    path: path.to_owned(),
                    why: "is not a regular file",
                })
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(write_err(e)),
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let mut text =
            serde_json::to_string_pretty(&checked).map_err(|e| write_err(io::Error::other(e)))?;
        text.push('\n');

        // tempfile creates the file with mode 0600; set it again so the promise does not
        // rest on a library default.
        let mut tmp = tempfile::Builder::new()
            .prefix(".plimsoll-callers-")
            .suffix(".tmp")
            .tempfile_in(dir)
            .map_err(write_err)?;
        {
            use std::os::unix::fs::PermissionsExt;
            tmp.as_file()
                .set_permissions(fs::Permissions::from_mode(0o600))
                .map_err(write_err)?;
        }
        tmp.write_all(text.as_bytes()).map_err(write_err)?;
        tmp.as_file().sync_all().map_err(write_err)?;
        tmp.persist(path).map_err(|e| write_err(e.error))?;
        fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(write_err)?;
        Ok(())
    }

    /// Adds a caller and returns its new token (the only time the token exists outside
    /// the caller's hands). `scopes` defaults to [`SCOPE_RUN`] when empty.
    pub fn add(&mut self, id: &str, scopes: &[String]) -> Result<String, CallersError> {
        check_id(id, self.clients.len() + 1).map_err(CallersError::invalid)?;
        if self.clients.iter().any(|c| c.id == id) {
            return Err(CallersError::Exists(id.to_owned()));
        }
        let scopes = if scopes.is_empty() {
            vec![SCOPE_RUN.to_owned()]
        } else {
            scopes.to_vec()
        };
        check_scopes(id, &scopes).map_err(CallersError::invalid)?;
        let taken: HashSet<String> = self
            .clients
            .iter()
            .map(|c| c.token_sha256.to_ascii_lowercase())
            .collect();
        // A collision of 256-bit random tokens will not happen; the loop keeps the
        // "one fingerprint, one caller" rule true even so.
        let (token, fp) = loop {
            let token = generate_token();
            let fp = fingerprint(&token);
            if !taken.contains(&fp) {
                break (token, fp);
            }
        };
        self.clients.push(Caller {
            id: id.to_owned(),
            token_sha256: fp,
            scopes,
        });
        Ok(token)
    }

    /// Removes the caller `id`; an unknown id is an error.
    pub fn revoke(&mut self, id: &str) -> Result<(), CallersError> {
        let before = self.clients.len();
        self.clients.retain(|c| c.id != id);
        if self.clients.len() == before {
            return Err(CallersError::UnknownCaller(id.to_owned()));
        }
        Ok(())
    }

    /// Checks every rule and lower-cases fingerprints in place.
    fn normalize(&mut self) -> Result<(), Problem> {
        let mut ids: HashSet<String> = HashSet::new();
        let mut fps: Vec<(String, String)> = Vec::new();
        for (i, c) in self.clients.iter_mut().enumerate() {
            check_id(&c.id, i + 1)?;
            if !ids.insert(c.id.clone()) {
                return Err(Problem::DuplicateId { id: c.id.clone() });
            }
            c.token_sha256 = normalize_fingerprint(&c.id, &c.token_sha256)?;
            if let Some((first, _)) = fps.iter().find(|(_, fp)| *fp == c.token_sha256) {
                return Err(Problem::DuplicateFingerprint {
                    first: first.clone(),
                    second: c.id.clone(),
                });
            }
            fps.push((c.id.clone(), c.token_sha256.clone()));
            check_scopes(&c.id, &c.scopes)?;
        }
        Ok(())
    }
}

/// Compares two digests without an early exit, so the time taken does not say how many
/// leading bytes matched.
fn digests_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    std::hint::black_box(diff) == 0
}

/// The callers a daemon accepts, read once at startup.
#[derive(Debug, Clone)]
pub struct Registry {
    callers: Vec<(Caller, [u8; 32])>,
}

impl Registry {
    /// Builds the registry from a checked file; refuses a file with no caller.
    pub fn new(file: CallersFile) -> Result<Registry, CallersError> {
        let mut file = file;
        file.normalize().map_err(CallersError::invalid)?;
        if file.clients.is_empty() {
            return Err(CallersError::Empty);
        }
        let callers = file
            .clients
            .into_iter()
            .map(|c| {
                let mut fp = [0u8; 32];
                // normalize() proved 64 hex characters.
                hex::decode_to_slice(&c.token_sha256, &mut fp)
                    .expect("fingerprint checked by normalize");
                (c, fp)
            })
            .collect();
        Ok(Registry { callers })
    }

    /// The caller whose fingerprint matches `token`, compared in constant time against
    /// every caller; `None` when the token is unknown or empty.
    pub fn authenticate(&self, token: &str) -> Option<&Caller> {
        if token.is_empty() {
            return None;
        }
        let mut presented = [0u8; 32];
        presented.copy_from_slice(digest(&SHA256, token.as_bytes()).as_ref());
        let mut found = None;
        for (caller, fp) in &self.callers {
            if digests_equal(&presented, fp) && found.is_none() {
                found = Some(caller);
            }
        }
        found
    }

    /// How many callers the registry holds.
    pub fn len(&self) -> usize {
        self.callers.len()
    }

    /// Whether the registry holds no caller (never true for a registry from [`Registry::new`]).
    pub fn is_empty(&self) -> bool {
        self.callers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FP_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const FP_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn one(id: &str, fp: &str, scopes: &str) -> String {
        format!(r#"{{"clients":[{{"id":{id:?},"token_sha256":{fp:?},"scopes":{scopes}}}]}}"#)
    }

    fn problem(text: &str) -> Problem {
        match CallersFile::parse(text) {
            Err(CallersError::Invalid { problem, .. }) => problem,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn parses_a_good_file_and_lowercases_fingerprints() {
        let upper = FP_A.to_ascii_uppercase();
        let f = CallersFile::parse(&one("ci", &upper, r#"["code:run","*"]"#)).unwrap();
        assert_eq!(f.clients[0].token_sha256, FP_A);
        assert_eq!(f.clients[0].scopes, vec!["code:run", "*"]);
    }

    #[test]
    fn empty_list_parses_but_registry_refuses_it() {
        let f = CallersFile::parse(r#"{"clients":[]}"#).unwrap();
        assert!(f.clients.is_empty());
        assert!(matches!(Registry::new(f), Err(CallersError::Empty)));
    }

    #[test]
    fn refuses_unknown_fields_missing_fields_and_trailing_data() {
        let extra =
            r#"{"clients":[{"id":"a","token_sha256":"AA","scopes":["code:run"],"paid":1}]}"#;
        assert!(matches!(problem(extra), Problem::Json(m) if m.contains("unknown field")));
        assert!(matches!(
            problem(r#"{"clients":[],"other":1}"#),
            Problem::Json(m) if m.contains("unknown field")
        ));
        assert!(matches!(
            problem(r#"{"clients":[{"id":"a","scopes":["code:run"]}]}"#),
            Problem::Json(m) if m.contains("missing field")
        ));
        assert!(matches!(
            problem(r#"{"clients":[]} {"clients":[]}"#),
            Problem::Json(m) if m.contains("trailing")
        ));
        assert!(matches!(problem(""), Problem::Json(_)));
    }

    #[test]
    fn refuses_bad_ids() {
        assert_eq!(
            problem(&one("", FP_A, r#"["code:run"]"#)),
            Problem::EmptyId { index: 1 }
        );
        for padded in [" ci", "ci ", "\tci", "c\ni"] {
            assert!(matches!(
                problem(&one(padded, FP_A, r#"["code:run"]"#)),
                Problem::BadId { .. }
            ));
        }
        assert_eq!(
            problem(&one("*", FP_A, r#"["code:run"]"#)),
            Problem::ReservedId
        );
        let dup = format!(
            r#"{{"clients":[{{"id":"a","token_sha256":"{FP_A}","scopes":["code:run"]}},{{"id":"a","token_sha256":"{FP_B}","scopes":["code:run"]}}]}}"#
        );
        assert_eq!(problem(&dup), Problem::DuplicateId { id: "a".into() });
    }

    #[test]
    fn refuses_bad_fingerprints() {
        for bad in [
            &FP_A[..63],
            &format!("{FP_A}a"),
            &FP_A.replace('a', "g"),
            "",
        ] {
            assert!(matches!(
                problem(&one("ci", bad, r#"["code:run"]"#)),
                Problem::BadFingerprint { .. }
            ));
        }
        let padded = format!(" {}", &FP_A[1..]);
        assert!(matches!(
            problem(&one("ci", &padded, r#"["code:run"]"#)),
            Problem::BadFingerprint { .. }
        ));
        // One fingerprint for two callers, even when written in different cases.
        let shared = format!(
            r#"{{"clients":[{{"id":"a","token_sha256":"{FP_A}","scopes":["code:run"]}},{{"id":"b","token_sha256":"{}","scopes":["code:run"]}}]}}"#,
            FP_A.to_ascii_uppercase()
        );
        assert_eq!(
            problem(&shared),
            Problem::DuplicateFingerprint {
                first: "a".into(),
                second: "b".into()
            }
        );
    }

    #[test]
    fn refuses_bad_scopes() {
        assert!(matches!(
            problem(&one("ci", FP_A, "[]")),
            Problem::NoScopes { .. }
        ));
        for bad in [
            r#"[""]"#,
            r#"[" code:run"]"#,
            r#"["code:run "]"#,
            r#"["code: run"]"#,
        ] {
            assert!(matches!(
                problem(&one("ci", FP_A, bad)),
                Problem::BadScope { .. }
            ));
        }
        assert!(matches!(
            problem(&one("ci", FP_A, r#"["code:run","code:run"]"#)),
            Problem::RepeatedScope { .. }
        ));
    }

    #[test]
    fn messages_name_the_file_and_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("callers.json");
        fs::write(&path, one("*", FP_A, r#"["code:run"]"#)).unwrap();
        let msg = CallersFile::load(&path).unwrap_err().to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains("reserved"), "{msg}");
        let missing = dir.path().join("absent.json");
        let msg = CallersFile::load(&missing).unwrap_err().to_string();
        assert!(
            msg.contains("absent.json") && msg.contains("cannot read"),
            "{msg}"
        );
    }

    #[test]
    fn add_issues_a_token_whose_fingerprint_authenticates() {
        let mut f = CallersFile::default();
        let token = f.add("ci", &[]).unwrap();
        assert_eq!(token.len(), 64);
        assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(f.clients[0].scopes, vec![SCOPE_RUN]);
        assert_eq!(f.clients[0].token_sha256, fingerprint(&token));
        assert_ne!(f.clients[0].token_sha256, token);
        let other = f.add("ops", &["*".to_owned()]).unwrap();
        assert_ne!(token, other);

        let reg = Registry::new(f.clone()).unwrap();
        assert_eq!(reg.len(), 2);
        assert!(!reg.is_empty());
        let ci = reg.authenticate(&token).unwrap();
        assert_eq!(ci.id, "ci");
        assert!(ci.has_scope(SCOPE_RUN) && !ci.has_scope("admin"));
        let ops = reg.authenticate(&other).unwrap();
        assert!(ops.has_scope("admin") && ops.has_scope(SCOPE_RUN));
        assert!(reg.authenticate("").is_none());
        assert!(reg.authenticate(&generate_token()).is_none());
        // The fingerprint itself is not a token.
        assert!(reg.authenticate(&f.clients[0].token_sha256).is_none());
    }

    #[test]
    fn add_refuses_existing_and_bad_ids_and_scopes() {
        let mut f = CallersFile::default();
        f.add("ci", &[]).unwrap();
        assert!(matches!(f.add("ci", &[]), Err(CallersError::Exists(id)) if id == "ci"));
        assert!(matches!(
            f.add("*", &[]),
            Err(CallersError::Invalid {
                problem: Problem::ReservedId,
                ..
            })
        ));
        assert!(matches!(
            f.add(" x", &[]),
            Err(CallersError::Invalid {
                problem: Problem::BadId { .. },
                ..
            })
        ));
        assert!(matches!(
            f.add("x", &["a".into(), "a".into()]),
            Err(CallersError::Invalid {
                problem: Problem::RepeatedScope { .. },
                ..
            })
        ));
        assert_eq!(f.clients.len(), 1);
    }

    #[test]
    fn revoke_removes_and_refuses_unknown() {
        let mut f = CallersFile::default();
        let token = f.add("ci", &[]).unwrap();
        f.add("ops", &[]).unwrap();
        f.revoke("ci").unwrap();
        assert!(matches!(f.revoke("ci"), Err(CallersError::UnknownCaller(id)) if id == "ci"));
        let reg = Registry::new(f).unwrap();
        assert!(reg.authenticate(&token).is_none());
        assert_eq!(reg.len(), 1);
    }

    #[test]
    fn registry_rechecks_a_hand_built_file() {
        let f = CallersFile {
            clients: vec![Caller {
                id: "ci".into(),
                token_sha256: "short".into(),
                scopes: vec![SCOPE_RUN.into()],
            }],
        };
        assert!(matches!(
            Registry::new(f),
            Err(CallersError::Invalid {
                problem: Problem::BadFingerprint { .. },
                ..
            })
        ));
    }

    #[test]
    fn save_load_round_trip_mode_0600_and_no_token_in_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("callers.json");
        let mut f = CallersFile::default();
        let t1 = f.add("ci", &[]).unwrap();
        let t2 = f.add("ops", &["code:run".into(), "admin".into()]).unwrap();
        f.save(&path).unwrap();

        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let text = fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&t1) && !text.contains(&t2));
        assert!(text.contains(&fingerprint(&t1)));

        let back = CallersFile::load(&path).unwrap();
        assert_eq!(back, f);

        // Overwriting an existing file keeps it 0600 even if it was wider before.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let mut back = back;
        back.revoke("ci").unwrap();
        back.save(&path).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(CallersFile::load(&path).unwrap().clients.len(), 1);
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn save_refuses_symlinks_and_non_regular_targets() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.json");
        fs::write(&real, "keep").unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let f = CallersFile::default();
        let err = f.save(&link).unwrap_err();
        assert!(matches!(err, CallersError::Target { .. }), "{err}");
        assert!(err.to_string().contains("symbolic link"));
        assert_eq!(fs::read_to_string(&real).unwrap(), "keep");

        let sub = dir.path().join("adir");
        fs::create_dir(&sub).unwrap();
        assert!(matches!(f.save(&sub), Err(CallersError::Target { .. })));
    }

    #[test]
    fn save_refuses_an_invalid_hand_built_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("callers.json");
        let f = CallersFile {
            clients: vec![Caller {
                id: "*".into(),
                token_sha256: FP_A.into(),
                scopes: vec![SCOPE_RUN.into()],
            }],
        };
        assert!(f.save(&path).is_err());
        assert!(!path.exists());
    }

    #[test]
    fn fingerprint_is_sha256_hex() {
        // SHA-256("abc"), FIPS 180-2 appendix B.1.
        assert_eq!(
            fingerprint("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
