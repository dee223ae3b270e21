//! Bundles (reference §3.11): JSON Lines of `{"request","response","envelope","link"}`
//! entries, every line linked to the previous one by a signed bundle-link statement, every
//! invocation ended by a signed checkpoint; the [`Appender`] that writes them crash-safely,
//! [`verify_bundle`] that checks them offline and [`verify_expected`] for `-expect`.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use plimsoll_core::check::{check_answer, check_session_answer, check_unanswered, CheckError};
use plimsoll_core::digest::{session_call_as_run, session_fingerprint, ChainLink, SessionEvidence};
use plimsoll_core::pb;
use prost::Message as _;
use ring::rand::{SecureRandom as _, SystemRandom};

use crate::dsse::Envelope;
use crate::gojson::Object;
use crate::keys::{PublicKey, SigningKey};
use crate::statement::{link_statement, Link};
use crate::verify::{sha256_hex, ChainState, RawEntry, Verifier};
use crate::{sign_close, sign_record, AttestError};

/// The longest line read or verified (64 MiB).
pub const MAX_LINE: usize = 64 << 20;

/// Why a bundle does not verify, or why an append was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BundleError {
    /// The first broken line (1-based) and what is wrong with it.
    #[error("line {line}: {what}")]
    Line {
        /// The 1-based line number.
        line: u64,
        /// What is wrong.
        what: String,
    },
    /// The bundle does not end in a checkpoint (`line` is its last line, 1 if empty).
    #[error("line {line}: incomplete: {what}")]
    Incomplete {
        /// The last line, or 1 for an empty bundle.
        line: u64,
        /// What is missing.
        what: String,
    },
    /// The bundle does not hold exactly the expected request digests.
    #[error("expect: {0}")]
    Expect(String),
    /// The appender refused (file mode, a session's chain, a closed session...).
    #[error("refused: {0}")]
    Refused(String),
    /// The exchange failed the client check; it is not signed (the code may have run).
    #[error("not recorded: {0}")]
    Check(#[from] CheckError),
    /// The record could not be signed.
    #[error("not recorded: {0}")]
    Attest(#[from] AttestError),
    /// Reading or writing the bundle failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: io::Error,
    },
}

impl BundleError {
    /// The line an error names, if any.
    pub fn line(&self) -> Option<u64> {
        match self {
            BundleError::Line { line, .. } | BundleError::Incomplete { line, .. } => Some(*line),
            _ => None,
        }
    }
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> BundleError {
    let context = context.into();
    move |source| BundleError::Io { context, source }
}

/// A checkpoint line: its index and line digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The 1-based line number.
    pub index: u64,
    /// SHA-256 (hex) of the line as stored, without the newline.
    pub line_sha256: String,
}

/// A single run stored in a bundle, for replay.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRun {
    /// Its line.
    pub line: u64,
    /// The request as sent.
    pub request: pb::RunRequest,
    /// The request digest.
    pub request_sha256: String,
    /// The signed result digest to compare a replay with.
    pub result_sha256: String,
}

/// What a verified bundle holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Lines in the bundle.
    pub lines: u64,
    /// Single runs.
    pub runs: u64,
    /// Session calls (answered and unanswered).
    pub session_calls: u64,
    /// Of those, unanswered (version 3) calls.
    pub unanswered: u64,
    /// Sessions (each closed exactly once).
    pub sessions: u64,
    /// Every checkpoint, in order.
    pub checkpoints: Vec<Checkpoint>,
    /// The request digest of every run and call, in bundle order.
    pub request_digests: Vec<String>,
    /// Every single run, for replay.
    pub single_runs: Vec<StoredRun>,
}

/// A bundle entry without its link: binary protobuf exchange and the envelope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entry {
    /// The binary protobuf `RunRequest` (session calls in RunRequest form); empty = absent.
    pub request: Vec<u8>,
    /// The binary protobuf `RunResponse`; empty = absent (unanswered calls, closes).
    pub response: Vec<u8>,
    /// The DSSE envelope over the record or the session close.
    pub envelope: Option<Envelope>,
}

impl Entry {
    /// An exchange as stored: `req` (a session call through `session_call_as_run`), the
    /// answer if there was one, the envelope if it could be signed.
    pub fn exchange(
        req: &pb::RunRequest,
        resp: Option<&pb::RunResponse>,
        envelope: Option<Envelope>,
    ) -> Self {
        Entry {
            request: req.encode_to_vec(),
            response: resp.map(|r| r.encode_to_vec()).unwrap_or_default(),
            envelope,
        }
    }

    /// A single run as [`write_unsealed`] should keep it when it could not be appended:
    /// the exchange, and the signed record if the exchange passes the client check (a
    /// failing one is kept unsigned, never signed).
    pub fn unsealed_run(key: &SigningKey, req: &pb::RunRequest, resp: &pb::RunResponse) -> Self {
        let envelope = match (check_answer(req, resp), &resp.record) {
            (Ok(()), Some(rec)) => sign_record(key, rec).ok(),
            _ => None,
        };
        Entry::exchange(req, Some(resp), envelope)
    }

    /// The entry's JSON without `link` (what the content digest covers).
    pub fn content_json(&self) -> String {
        let mut out = String::with_capacity(
            (self.request.len() + self.response.len()) * 4 / 3
                + self
                    .envelope
                    .as_ref()
                    .map_or(0, |e| e.payload.len() * 4 / 3 + 300)
                + 1200,
        );
        let mut o = Object::new(&mut out);
        if !self.request.is_empty() {
            o.bytes("request", &self.request);
        }
        if !self.response.is_empty() {
            o.bytes("response", &self.response);
        }
        if let Some(env) = &self.envelope {
            env.write_json(o.key("envelope"));
        }
        o.end();
        out
    }

    /// The stored line (without newline) and the length of the content JSON it starts
    /// with (minus the closing brace, the content is the line's prefix).
    pub(crate) fn write_line(&self, link: &Envelope) -> (String, usize) {
        let mut line = self.content_json();
        let content_len = line.len();
        line.pop();
        if content_len > 2 {
            line.push(',');
        }
        line.push_str("\"link\":");
        link.write_json(&mut line);
        line.push('}');
        (line, content_len)
    }

    /// The stored line (without newline): `content` (from [`Entry::content_json`]) with
    /// `link` as its last member.
    pub fn line_json(content: &str, link: &Envelope) -> String {
        let mut line = content[..content.len() - 1].to_owned();
        if content.len() > 2 {
            line.push(',');
        }
        line.push_str("\"link\":");
        link.write_json(&mut line);
        line.push('}');
        line
    }
}

/// Verifies a whole bundle with the harness's public key (reference §3.11), line by line:
/// link chain, canonical bytes, signatures, the client check of every stored exchange,
/// session chains and closes, and a checkpoint at the end.
pub fn verify_bundle(bytes: &[u8], key: &PublicKey) -> Result<Summary, BundleError> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    if workers < 2 || bytes.len() < PARALLEL_FROM {
        return verify_lines(bytes, Some(key));
    }
    // Signatures are most of the work and independent of each other: worker threads check
    // every envelope's signatures over contiguous chunks while this thread checks
    // everything else in order. The first broken line wins, whichever pass found it (on
    // the same line, the ordered pass's finding is reported).
    std::thread::scope(|s| {
        let chunks: Vec<_> = chunks(bytes, workers)
            .into_iter()
            .map(|(first_line, chunk)| s.spawn(move || first_bad_signature(chunk, first_line, key)))
            .collect();
        let ordered = verify_lines(bytes, None);
        let signature = chunks
            .into_iter()
            .filter_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .min_by_key(|(line, _)| *line);
        match (ordered, signature) {
            (Err(e), Some((line, sig))) if e.line().is_some_and(|l| line < l) => Err(sig),
            (Err(e), _) => Err(e),
            (Ok(_), Some((_, sig))) => Err(sig),
            (Ok(summary), None) => Ok(summary),
        }
    })
}

/// Bundles smaller than this are verified on one thread.
const PARALLEL_FROM: usize = 1 << 20;

/// Every line in order: with `key`, signatures too; without, everything but signatures.
fn verify_lines(bytes: &[u8], key: Option<&PublicKey>) -> Result<Summary, BundleError> {
    let mut v = Verifier::new(key);
    let mut rest = bytes;
    while !rest.is_empty() {
        let n = v.index + 1;
        let Some(end) = rest.iter().position(|&b| b == b'\n') else {
            if rest.len() > MAX_LINE {
                return Err(BundleError::Line {
                    line: n,
                    what: format!("longer than {MAX_LINE} bytes"),
                });
            }
            return Err(BundleError::Incomplete {
                line: n,
                what: "the last line has no newline (a partial append)".into(),
            });
        };
        v.line(&rest[..end])?;
        rest = &rest[end + 1..];
    }
    v.finish()
}

/// `bytes` cut into about `n` pieces at line ends, each with its first line's number.
fn chunks(bytes: &[u8], n: usize) -> Vec<(u64, &[u8])> {
    let mut out = Vec::with_capacity(n);
    let (mut start, mut line) = (0usize, 1u64);
    for i in 1..=n {
        let mut end = if i == n {
            bytes.len()
        } else {
            (bytes.len() * i / n).max(start)
        };
        if end < bytes.len() {
            end = bytes[end..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(bytes.len(), |p| end + p + 1);
        }
        let chunk = &bytes[start..end];
        out.push((line, chunk));
        line += chunk.iter().filter(|&&b| b == b'\n').count() as u64;
        start = end;
    }
    out
}

/// The first line of `chunk` whose link or envelope signature does not verify, with the
/// error the ordered pass would give. Lines that do not parse are left to that pass.
fn first_bad_signature(
    chunk: &[u8],
    first_line: u64,
    key: &PublicKey,
) -> Option<(u64, BundleError)> {
    for (i, line) in chunk.split(|&b| b == b'\n').enumerate() {
        let n = first_line + i as u64;
        if line.is_empty() || line.len() > MAX_LINE {
            continue;
        }
        let Ok(raw) = serde_json::from_slice::<RawEntry>(line) else {
            continue;
        };
        let (link, envelope) = raw.envelopes();
        for (env, what) in [(link, "the link"), (envelope, "the envelope")] {
            let Some(Ok(env)) = env.map(|e| e.decode()) else {
                continue;
            };
            if what == "the link" && env.signatures.len() != 1 {
                continue;
            }
            if let Err(e) = env.verify(key) {
                let what = format!("{what} does not verify: {e}");
                return Some((n, BundleError::Line { line: n, what }));
            }
        }
    }
    None
}

/// What `-expect FILE` or `-expect-count N` asks of a bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Exactly these request digests, with multiplicity.
    Digests(Vec<String>),
    /// Exactly this many runs and calls.
    Count(u64),
}

impl Expect {
    /// Parses an expect file: one request digest per line (the first whitespace-separated
    /// token, the rest of the line ignored), blank lines ignored.
    pub fn parse_digests(text: &str) -> Result<Self, BundleError> {
        let mut out = Vec::new();
        for (i, l) in text.lines().enumerate() {
            let Some(tok) = l.split_whitespace().next() else {
                continue;
            };
            let tok = tok.to_ascii_lowercase();
            if tok.len() != 64 || !tok.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(BundleError::Expect(format!(
                    "expect file line {}: {tok:?} is not a SHA-256 hex digest",
                    i + 1
                )));
            }
            out.push(tok);
        }
        Ok(Expect::Digests(out))
    }
}

/// Checks that a verified bundle holds exactly what `expect` names.
pub fn verify_expected(summary: &Summary, expect: &Expect) -> Result<(), BundleError> {
    match expect {
        Expect::Count(n) => {
            let got = summary.request_digests.len() as u64;
            if got != *n {
                return Err(BundleError::Expect(format!(
                    "expected {n} runs and calls, the bundle holds {got}"
                )));
            }
        }
        Expect::Digests(want) => {
            let mut counts: HashMap<&str, i64> = HashMap::new();
            for d in want {
                *counts.entry(d.as_str()).or_default() += 1;
            }
            for d in &summary.request_digests {
                let c = counts.entry(d.as_str()).or_default();
                *c -= 1;
                if *c < 0 {
                    return Err(BundleError::Expect(format!(
                        "request {d} is in the bundle more often than expected (extra)"
                    )));
                }
            }
            if let Some(d) = want.iter().find(|d| counts[d.as_str()] > 0) {
                return Err(BundleError::Expect(format!(
                    "request {d} is expected but missing from the bundle ({} missing)",
                    counts[d.as_str()]
                )));
            }
        }
    }
    Ok(())
}

/// What [`Appender::open`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenReport {
    /// Whether the file was created.
    pub created: bool,
    /// Complete lines already in the bundle.
    pub lines: u64,
    /// Bytes of a partial last line that were truncated away (0 if none).
    pub truncated_bytes: u64,
}

/// Appends signed entries to a bundle file, holding an exclusive `flock` on it.
pub struct Appender {
    file: Flock<File>,
    key: SigningKey,
    len: u64,
    index: u64,
    previous: String,
    sessions: HashMap<String, ChainState>,
    broken: bool,
}

impl std::fmt::Debug for Appender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Appender")
            .field("key", &self.key)
            .field("len", &self.len)
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl Appender {
    /// Opens (or creates, mode 0600) the bundle at `path`, locks it, reads what is there
    /// (links, canonical form, session chains; not signatures) and truncates a partial last
    /// line. An existing file readable or writable by group or others is refused unless
    /// `shared`.
    pub fn open(
        path: &Path,
        key: SigningKey,
        shared: bool,
    ) -> Result<(Self, OpenReport), BundleError> {
        let shown = path.display().to_string();
        let (file, created) = match OpenOptions::new()
            .read(true)
            .append(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            Ok(f) => (f, true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => (
                OpenOptions::new()
                    .read(true)
                    .append(true)
                    .open(path)
                    .map_err(io_err(format!("open {shown}")))?,
                false,
            ),
            Err(e) => return Err(io_err(format!("create {shown}"))(e)),
        };
        let meta = file.metadata().map_err(io_err(format!("stat {shown}")))?;
        if !meta.is_file() {
            return Err(BundleError::Refused(format!(
                "{shown} is not a regular file"
            )));
        }
        let mode = meta.permissions().mode() & 0o777;
        if !created && mode & 0o077 != 0 && !shared {
            return Err(BundleError::Refused(format!(
                "{shown} has mode {mode:04o}: group or others can access it: chmod 600 it, or say it is meant to be shared (--shared-bundle)"
            )));
        }
        let mut file = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, e)| io_err(format!("lock {shown}"))(io::Error::from(e)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(io_err(format!("read {shown}")))?;

        let mut v = Verifier::new(None);
        let mut rest: &[u8] = &bytes;
        let mut good = 0usize;
        let mut last: &[u8] = &[];
        while !rest.is_empty() {
            let end = rest.iter().position(|&b| b == b'\n');
            let is_last = end.is_none_or(|e| e + 1 == rest.len());
            let Some(end) = end else { break };
            let line = &rest[..end];
            if is_last && serde_json::from_slice::<RawEntry<'_>>(line).is_err() {
                break;
            }
            v.line(line)?;
            last = line;
            good += end + 1;
            rest = &rest[end + 1..];
        }
        // Signatures are not re-checked on open (that is `verify_bundle`'s job), but the
        // last line must be this key's: a bundle is verified against one key, and lines
        // appended under another would make it unverifiable.
        if !last.is_empty() {
            let link = serde_json::from_slice::<RawEntry<'_>>(last)
                .ok()
                .and_then(|raw| raw.envelopes().0)
                .and_then(|l| l.decode().ok());
            if link.is_none_or(|l| l.verify(&key.public()).is_err()) {
                return Err(BundleError::Refused(format!(
                    "the last line of {shown} is not signed by key {}: append with the key that wrote it, or start a new bundle",
                    key.key_id()
                )));
            }
        }
        let truncated = (bytes.len() - good) as u64;
        if truncated > 0 {
            file.set_len(good as u64)
                .and_then(|_| file.sync_all())
                .map_err(io_err(format!("truncate the partial last line of {shown}")))?;
        }
        let report = OpenReport {
            created,
            lines: v.index,
            truncated_bytes: truncated,
        };
        Ok((
            Appender {
                file,
                key,
                len: good as u64,
                index: v.index,
                previous: v.previous,
                sessions: v.sessions,
                broken: false,
            },
            report,
        ))
    }

    /// The number of lines in the bundle.
    pub fn lines(&self) -> u64 {
        self.index
    }

    /// Checks a single run's exchange on this copy (`check_answer`), signs its record and
    /// appends it. A failing check (including a tier below the floor) is not signed.
    pub fn append_run(
        &mut self,
        req: &pb::RunRequest,
        resp: &pb::RunResponse,
    ) -> Result<Checkpoint, BundleError> {
        check_answer(req, resp)?;
        let rec = resp.record.as_ref().ok_or(CheckError::NoRecord)?;
        let env = sign_record(&self.key, rec)?;
        self.append(&Entry::exchange(req, Some(resp), Some(env)), None)
    }

    fn chain(&self, fp: &str) -> Result<ChainLink, BundleError> {
        let state = self.sessions.get(fp).cloned().unwrap_or_default();
        if let Some(at) = state.closed_at {
            return Err(BundleError::Refused(format!(
                "session {fp} was closed at line {at}"
            )));
        }
        Ok(ChainLink {
            session: fp.to_owned(),
            sequence: state.calls + 1,
            previous_sha256: state.last,
        })
    }

    fn advance(&mut self, fp: &str, record_sha256: &str) {
        let first = self.index;
        let s = self.sessions.entry(fp.to_owned()).or_insert(ChainState {
            first_line: first,
            ..Default::default()
        });
        s.calls += 1;
        s.last = record_sha256.to_owned();
    }

    /// Checks a session call's answer as the next link of the session's chain (as this
    /// appender follows it), signs and appends it in RunRequest form.
    pub fn append_session_call(
        &mut self,
        req: &pb::SessionRunRequest,
        resp: &pb::RunResponse,
    ) -> Result<Checkpoint, BundleError> {
        let fp = session_fingerprint(&req.session_id);
        let expected = self.chain(&fp)?;
        check_session_answer(req, resp, &expected)?;
        let rec = resp.record.as_ref().ok_or(CheckError::NoRecord)?;
        let env = sign_record(&self.key, rec)?;
        let at = self.append(
            &Entry::exchange(&session_call_as_run(req), Some(resp), Some(env)),
            None,
        )?;
        self.advance(&fp, &rec.record_sha256);
        Ok(at)
    }

    /// Checks an unanswered (version 3) record against the chain and what the session
    /// stated at open (`check_unanswered`), signs and appends it without a response.
    pub fn append_unanswered(
        &mut self,
        req: &pb::SessionRunRequest,
        rec: &pb::RunRecord,
        opened: &SessionEvidence,
    ) -> Result<Checkpoint, BundleError> {
        let fp = session_fingerprint(&req.session_id);
        let expected = self.chain(&fp)?;
        check_unanswered(req, rec, &expected, opened)?;
        let env = sign_record(&self.key, rec)?;
        let at = self.append(
            &Entry::exchange(&session_call_as_run(req), None, Some(env)),
            None,
        )?;
        self.advance(&fp, &rec.record_sha256);
        Ok(at)
    }

    /// Compares the daemon's close answer with the chain this appender followed, then
    /// signs and appends the session-close statement. A mismatch is refused, not signed.
    pub fn append_close(
        &mut self,
        close: &pb::CloseSessionResponse,
    ) -> Result<Checkpoint, BundleError> {
        let expected = self.chain(&close.session)?;
        let calls = expected.sequence - 1;
        if close.calls != calls || close.last_record_sha256 != expected.previous_sha256 {
            return Err(BundleError::Refused(format!(
                "the daemon counts {} calls ending in {:?} for session {}, the bundle holds {} ending in {:?}",
                close.calls, close.last_record_sha256, close.session, calls, expected.previous_sha256
            )));
        }
        let env = sign_close(&self.key, close);
        let entry = Entry {
            envelope: Some(env),
            ..Default::default()
        };
        let at = self.append(&entry, None)?;
        let first = at.index;
        self.sessions
            .entry(close.session.clone())
            .or_insert(ChainState {
                first_line: first,
                ..Default::default()
            })
            .closed_at = Some(at.index);
        Ok(at)
    }

    /// Appends a checkpoint (one per invocation) and returns its index and line digest.
    pub fn checkpoint(&mut self) -> Result<Checkpoint, BundleError> {
        let lines = self.index;
        self.append(&Entry::default(), Some(lines))
    }

    /// Writes one line (entry + signed link + newline) with one `write_all`, then fsyncs;
    /// on failure truncates back to the previous length.
    fn append(
        &mut self,
        entry: &Entry,
        checkpoint: Option<u64>,
    ) -> Result<Checkpoint, BundleError> {
        if self.broken {
            return Err(BundleError::Refused(
                "an earlier append failed and could not be undone; reopen the bundle".into(),
            ));
        }
        let index = self.index + 1;
        let content = entry.content_json();
        let link = match checkpoint {
            Some(lines) => Link {
                index,
                previous_sha256: self.previous.clone(),
                checkpoint: true,
                lines,
                ..Default::default()
            },
            None => Link {
                index,
                previous_sha256: self.previous.clone(),
                entry_sha256: sha256_hex(content.as_bytes()),
                ..Default::default()
            },
        };
        let link_env = Envelope::sign(&self.key, link_statement(&link));
        let line = Entry::line_json(&content, &link_env);
        if line.len() > MAX_LINE {
            return Err(BundleError::Refused(format!(
                "the line would be {} bytes, more than {MAX_LINE}",
                line.len()
            )));
        }
        let line_sha256 = sha256_hex(line.as_bytes());
        let mut buf = line.into_bytes();
        buf.push(b'\n');
        if let Err(e) = self
            .file
            .write_all(&buf)
            .and_then(|_| self.file.sync_data())
        {
            if self
                .file
                .set_len(self.len)
                .and_then(|_| self.file.sync_all())
                .is_err()
            {
                self.broken = true;
            }
            return Err(io_err("append to the bundle")(e));
        }
        self.len += buf.len() as u64;
        self.index = index;
        self.previous = line_sha256.clone();
        Ok(Checkpoint { index, line_sha256 })
    }
}

/// Writes `entry` (no link) as one JSON line to a new file
/// `<bundle>.unsealed-<UTC time>-<random>.jsonl` (mode 0600) next to the bundle, for a
/// record that could not be appended; returns its path.
pub fn write_unsealed(bundle: &Path, entry: &Entry) -> io::Result<PathBuf> {
    let mut rnd = [0u8; 6];
    SystemRandom::new()
        .fill(&mut rnd)
        .map_err(|_| io::Error::other("the system random source failed"))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(io::Error::other)?;
    let mut name = bundle.as_os_str().to_owned();
    name.push(format!(
        ".unsealed-{}-{}.jsonl",
        utc_stamp(now.as_secs()),
        hex::encode(rnd)
    ));
    let path = PathBuf::from(name);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    let mut line = entry.content_json().into_bytes();
    line.push(b'\n');
    f.write_all(&line)?;
    f.sync_all()?;
    Ok(path)
}

/// `YYYYMMDDTHHMMSSZ` for seconds since the epoch (UTC, proleptic Gregorian).
fn utc_stamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(utc_stamp(1_796_181_514), "20261202T031834Z");
    }

    #[test]
    fn expect_files_parse() {
        let d = "a".repeat(64);
        let text = format!("{d}  first run\n\n   \n{} x\n", d.to_uppercase());
        assert_eq!(
            Expect::parse_digests(&text).unwrap(),
            Expect::Digests(vec![d.clone(), d])
        );
        assert!(Expect::parse_digests("abc\n").is_err());
    }
}

#[cfg(test)]
mod perf {
    use super::*;
    use crate::verify::Verifier;
    use std::time::Instant;

    /// `cargo test -p plimsoll-attest --release -- --ignored perf --nocapture`: builds a
    /// bundle of `PLIMSOLL_PERF_RUNS` (default 20,000) single runs in memory and compares
    /// verification with reading + SHA-256 of every line.
    #[test]
    #[ignore]
    fn perf_verify_against_hashing() {
        let n: u64 = std::env::var("PLIMSOLL_PERF_RUNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        let key = SigningKey::generate().unwrap();
        let mut bundle = Vec::new();
        let mut previous = String::new();
        let t = Instant::now();
        for i in 0..=n {
            let index = i + 1;
            let (content, link) = if i < n {
                let req = pb::RunRequest {
                    protocol: 5,
                    timeout_ms: 5000,
                    payload: Some(pb::run_request::Payload::Javascript(pb::JavaScriptRun {
                        code: format!("console.log({i}); // {}", "x".repeat(200)),
                        ..Default::default()
                    })),
                    ..Default::default()
                };
                let mut resp = pb::RunResponse {
                    sandbox: "process".into(),
                    isolation: "process".into(),
                    result: Some(pb::run_response::Result::Javascript(pb::JavaScriptResult {
                        stdout: format!("{i}\n{}", "y".repeat(300)).into_bytes(),
                        ..Default::default()
                    })),
                    ..Default::default()
                };
                plimsoll_core::digest::stamp(&req, &mut resp, "", 1, 2);
                let env = sign_record(&key, resp.record.as_ref().unwrap()).unwrap();
                let content = Entry::exchange(&req, Some(&resp), Some(env)).content_json();
                let link = Link {
                    index,
                    previous_sha256: previous.clone(),
                    entry_sha256: sha256_hex(content.as_bytes()),
                    ..Default::default()
                };
                (content, link)
            } else {
                let link = Link {
                    index,
                    previous_sha256: previous.clone(),
                    checkpoint: true,
                    lines: n,
                    ..Default::default()
                };
                ("{}".to_owned(), link)
            };
            let line = Entry::line_json(&content, &Envelope::sign(&key, link_statement(&link)));
            previous = sha256_hex(line.as_bytes());
            bundle.extend_from_slice(line.as_bytes());
            bundle.push(b'\n');
        }
        eprintln!(
            "built {} lines, {} bytes in {:?}",
            n + 1,
            bundle.len(),
            t.elapsed()
        );

        let t = Instant::now();
        let mut count = 0;
        for l in bundle.split(|&b| b == b'\n') {
            count += sha256_hex(l).len();
        }
        let hashing = t.elapsed();
        assert!(count > 0);

        let t = Instant::now();
        let mut v = Verifier::new(None);
        for l in bundle[..bundle.len() - 1].split(|&b| b == b'\n') {
            v.line(l).unwrap();
        }
        let unsigned = t.elapsed();

        let t = Instant::now();
        let s = verify_bundle(&bundle, &key.public()).unwrap();
        let full = t.elapsed();
        assert_eq!(s.runs, n);
        eprintln!(
            "sha256 of every line: {hashing:?}; verify without signatures: {unsigned:?} ({:.1}x); full verify: {full:?} ({:.1}x)",
            unsigned.as_secs_f64() / hashing.as_secs_f64(),
            full.as_secs_f64() / hashing.as_secs_f64()
        );
    }
}
