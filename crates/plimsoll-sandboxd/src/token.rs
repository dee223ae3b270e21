//! The sandboxd token: what plimsolld presents (`authorization: Bearer …`) and what sandboxd
//! accepts (one token, or two during a rotation), compared in constant time.
//!
//! sandboxd keeps only SHA-256 digests of the tokens it accepts; no token is ever logged.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Shortest token accepted: shorter ones are guessable.
pub const MIN_TOKEN_LEN: usize = 16;

/// Why a token or token file is unusable. Messages never contain the token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// The file could not be read.
    #[error("token file {path}: cannot read it: {source}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file holds no token.
    #[error("token file {path}: holds no token")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The file holds more than two tokens.
    #[error(
        "token file {path}: holds {count} tokens; at most two (old and new, during a rotation)"
    )]
    TooMany {
        /// The file.
        path: PathBuf,
        /// How many lines with tokens.
        count: usize,
    },
    /// A token has characters that cannot travel in a header, or is too short.
    #[error("{origin}: token on line {line} is unusable: {why}")]
    Invalid {
        /// The file, or "token" for a token given directly.
        origin: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        why: &'static str,
    },
}

fn check_token(t: &str) -> Result<(), &'static str> {
    if t.len() < MIN_TOKEN_LEN {
        return Err("shorter than 16 characters");
    }
    if !t.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err("only visible ASCII characters (no spaces) are allowed");
    }
    Ok(())
}

/// A token plimsolld presents. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// Checks the token: at least [`MIN_TOKEN_LEN`] visible ASCII characters.
    pub fn new(token: impl Into<String>) -> Result<Token, TokenError> {
        let t = token.into();
        check_token(&t).map_err(|why| TokenError::Invalid {
            origin: "token".into(),
            line: 1,
            why,
        })?;
        Ok(Token(t))
    }

    /// Reads the token plimsolld presents from a file: its first non-empty line (during a
    /// rotation the file may hold the new token and the old; the first is presented).
    pub fn read_file(path: &Path) -> Result<Token, TokenError> {
        let set = read_lines(path)?;
        let first = set.into_iter().next().ok_or_else(|| TokenError::Empty {
            path: path.to_owned(),
        })?;
        Ok(Token(first))
    }

    /// The token text, for building the header. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

fn read_lines(path: &Path) -> Result<Vec<String>, TokenError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenError::Unreadable {
        path: path.to_owned(),
        source,
    })?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        check_token(t).map_err(|why| TokenError::Invalid {
            origin: format!("token file {}", path.display()),
            line: i + 1,
            why,
        })?;
        out.push(t.to_owned());
    }
    Ok(out)
}

type Digest = [u8; 32];

fn digest(t: &[u8]) -> Digest {
    let mut d = [0u8; 32];
    d.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, t).as_ref());
    d
}

/// The tokens sandboxd accepts (one, or two during a rotation), held as SHA-256 digests.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenSet {
    digests: Vec<Digest>,
}

impl std::fmt::Debug for TokenSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenSet({} token(s))", self.digests.len())
    }
}

impl TokenSet {
    /// Reads the token file: one token per line, one or two tokens, blank lines ignored.
    pub fn read_file(path: &Path) -> Result<TokenSet, TokenError> {
        let lines = read_lines(path)?;
        match lines.len() {
            0 => Err(TokenError::Empty {
                path: path.to_owned(),
            }),
            1 | 2 => Ok(TokenSet {
                digests: lines.iter().map(|l| digest(l.as_bytes())).collect(),
            }),
            n => Err(TokenError::TooMany {
                path: path.to_owned(),
                count: n,
            }),
        }
    }

    /// A set holding exactly `tokens`.
    pub fn of(tokens: &[&Token]) -> TokenSet {
        TokenSet {
            digests: tokens.iter().map(|t| digest(t.0.as_bytes())).collect(),
        }
    }

    /// How many tokens are accepted.
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// Whether no token is accepted (never true for a set read from a file).
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Whether `presented` is one of the tokens. The presented token is hashed, and every
    /// configured digest is compared in full, so the time taken says nothing about which
    /// bytes matched.
    pub fn verify(&self, presented: &[u8]) -> bool {
        let p = digest(presented);
        let mut ok = 0u8;
        for d in &self.digests {
            let diff = d
                .iter()
                .zip(p.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            ok |= u8::from(diff == 0);
        }
        ok == 1
    }
}

/// The token file sandboxd was started with, re-read periodically so a rotation (write the
/// new token as a second line, switch plimsolld, then drop the old line) needs no restart.
/// A file that becomes unreadable or invalid is logged and the previous tokens are kept.
#[derive(Debug)]
pub struct TokenFile {
    path: PathBuf,
    current: RwLock<Arc<TokenSet>>,
}

impl TokenFile {
    /// Reads the file; an unusable file is a startup error.
    pub fn open(path: &Path) -> Result<Arc<TokenFile>, TokenError> {
        let set = TokenSet::read_file(path)?;
        Ok(Arc::new(TokenFile {
            path: path.to_owned(),
            current: RwLock::new(Arc::new(set)),
        }))
    }

    /// The accepted tokens now.
    pub fn tokens(&self) -> Arc<TokenSet> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Re-reads the file. `Ok(true)` when the accepted tokens changed; an error keeps the
    /// previous tokens.
    pub fn refresh(&self) -> Result<bool, TokenError> {
        let next = TokenSet::read_file(&self.path)?;
        let mut cur = self.current.write().unwrap_or_else(|p| p.into_inner());
        if **cur == next {
            return Ok(false);
        }
        *cur = Arc::new(next);
        Ok(true)
    }

    /// Re-reads the file every `interval` until the runtime stops, logging changes and
    /// failures (a failure is logged once until the file changes again).
    pub fn spawn_refresh(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut last_error: Option<String> = None;
            loop {
                tokio::time::sleep(interval).await;
                match me.refresh() {
                    Ok(changed) => {
                        last_error = None;
                        if changed {
                            tracing::info!(
                                "token file {} re-read: {} token(s) accepted",
                                me.path.display(),
                                me.tokens().len()
                            );
                        }
                    }
                    Err(e) => {
                        let text = e.to_string();
                        if last_error.as_deref() != Some(&text) {
                            tracing::error!("{text}; keeping the previous tokens");
                            last_error = Some(text);
                        }
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbb";

    #[test]
    fn one_or_two_tokens_verify() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("token");
        std::fs::write(&f, format!("{A}\n")).unwrap();
        let s = TokenSet::read_file(&f).unwrap();
        assert!(s.verify(A.as_bytes()));
        assert!(!s.verify(B.as_bytes()));
        assert!(!s.verify(b""));
        std::fs::write(&f, format!("{A}\n\n{B}\n")).unwrap();
        let s = TokenSet::read_file(&f).unwrap();
        assert!(s.verify(A.as_bytes()) && s.verify(B.as_bytes()));
        assert!(!s.verify(&A.as_bytes()[1..]));
    }

    #[test]
    fn bad_files_are_named_and_never_echo_the_token() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("token");
        std::fs::write(&f, "\n \n").unwrap();
        assert!(matches!(
            TokenSet::read_file(&f),
            Err(TokenError::Empty { .. })
        ));
        std::fs::write(&f, format!("{A}\n{B}\n{A}x\n")).unwrap();
        assert!(matches!(
            TokenSet::read_file(&f),
            Err(TokenError::TooMany { count: 3, .. })
        ));
        std::fs::write(&f, "tiny-secret\n").unwrap();
        let e = TokenSet::read_file(&f).unwrap_err().to_string();
        assert!(
            e.contains("token file") && !e.contains("tiny-secret"),
            "{e}"
        );
        std::fs::write(&f, "a-long-enough secret with spaces\n").unwrap();
        let e = TokenSet::read_file(&f).unwrap_err().to_string();
        assert!(e.contains("visible ASCII") && !e.contains("secret"), "{e}");
        let missing = d.path().join("missing");
        assert!(TokenSet::read_file(&missing)
            .unwrap_err()
            .to_string()
            .contains("missing"));
        assert_eq!(format!("{:?}", Token::new(A).unwrap()), "Token(<redacted>)");
    }

    #[test]
    fn refresh_picks_up_rotation_and_keeps_old_on_error() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("token");
        std::fs::write(&f, A).unwrap();
        let tf = TokenFile::open(&f).unwrap();
        std::fs::write(&f, format!("{A}\n{B}")).unwrap();
        assert!(tf.refresh().unwrap());
        assert!(tf.tokens().verify(B.as_bytes()));
        std::fs::write(&f, "").unwrap();
        assert!(tf.refresh().is_err());
        assert!(tf.tokens().verify(A.as_bytes()) && tf.tokens().verify(B.as_bytes()));
        assert!(!tf.refresh().is_ok_and(|c| c));
    }
}
