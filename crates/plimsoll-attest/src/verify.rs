//! The line-by-line bundle verifier shared by [`crate::bundle::verify_bundle`] and the
//! appender's reading of an existing bundle (which skips signatures).

use std::borrow::Cow;
use std::collections::HashMap;

use plimsoll_core::check::{check_run_linked, check_unanswered_run, CheckError};
use plimsoll_core::digest::ChainLink;
use plimsoll_core::pb;
use prost::Message as _;
use serde::Deserialize;

use crate::bundle::{BundleError, Checkpoint, Entry, StoredRun, Summary, MAX_LINE};
use crate::dsse::{Envelope, RawEnvelope};
use crate::keys::PublicKey;
use crate::statement::{decode_statement, Statement};
use crate::{gojson, AttestError};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEntry<'a> {
    #[serde(default, borrow)]
    request: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    response: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    envelope: Option<RawEnvelope<'a>>,
    #[serde(default, borrow)]
    link: Option<RawEnvelope<'a>>,
}

impl<'a> RawEntry<'a> {
    /// The link and the envelope, for a pass that checks only signatures.
    pub(crate) fn envelopes(self) -> (Option<RawEnvelope<'a>>, Option<RawEnvelope<'a>>) {
        (self.link, self.envelope)
    }
}

pub(crate) fn sha256_hex(b: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, b))
}

/// Where a session's chain stands.
#[derive(Debug, Clone, Default)]
pub(crate) struct ChainState {
    pub(crate) calls: u64,
    pub(crate) last: String,
    pub(crate) closed_at: Option<u64>,
    pub(crate) first_line: u64,
}

pub(crate) struct Verifier<'k> {
    /// None: signatures are not checked (the appender reading its own bundle).
    key: Option<&'k PublicKey>,
    pub(crate) index: u64,
    pub(crate) previous: String,
    pub(crate) last_checkpoint: bool,
    pub(crate) sessions: HashMap<String, ChainState>,
    pub(crate) summary: Summary,
}

fn err(line: u64, what: impl Into<String>) -> BundleError {
    BundleError::Line {
        line,
        what: what.into(),
    }
}

fn check_err(line: u64, e: CheckError) -> BundleError {
    err(line, format!("stored exchange fails the client check: {e}"))
}

/// The first field by which two records differ.
fn record_difference(a: &pb::RunRecord, b: &pb::RunRecord) -> &'static str {
    macro_rules! cmp {
        ($($f:ident),*) => { $( if a.$f != b.$f { return stringify!($f); } )* };
    }
    cmp!(
        version,
        request_sha256,
        result_sha256,
        provider,
        isolation,
        environment,
        policy,
        started_unix_ms,
        ended_unix_ms,
        session,
        sequence,
        previous_sha256,
        record_sha256,
        software_identity,
        software_rule_id,
        unanswered
    );
    "(none)"
}

impl<'k> Verifier<'k> {
    pub(crate) fn new(key: Option<&'k PublicKey>) -> Self {
        Verifier {
            key,
            index: 0,
            previous: String::new(),
            last_checkpoint: false,
            sessions: HashMap::new(),
            summary: Summary::default(),
        }
    }

    fn verify_env<'e>(
        &self,
        n: u64,
        env: &'e Envelope,
        what: &str,
    ) -> Result<&'e [u8], BundleError> {
        match self.key {
            Some(k) => env
                .verify(k)
                .map_err(|e| err(n, format!("{what} does not verify: {e}"))),
            None => Ok(&env.payload),
        }
    }

    /// Checks the next line (without its newline).
    pub(crate) fn line(&mut self, line: &[u8]) -> Result<(), BundleError> {
        let n = self.index + 1;
        if line.len() > MAX_LINE {
            return Err(err(n, format!("longer than {MAX_LINE} bytes")));
        }
        if line.is_empty() {
            return Err(err(n, "empty line"));
        }
        let raw: RawEntry =
            serde_json::from_slice(line).map_err(|e| err(n, format!("not a bundle entry: {e}")))?;
        let dec = |s: Option<Cow<'_, str>>, what: &str| -> Result<Vec<u8>, BundleError> {
            match s {
                None => Ok(Vec::new()),
                Some(s) => gojson::decode_base64(&s)
                    .map_err(|e| err(n, format!("{what} is not std base64: {e}"))),
            }
        };
        let env_err = |e: AttestError| err(n, e.to_string());
        let entry = Entry {
            request: dec(raw.request, "request")?,
            response: dec(raw.response, "response")?,
            envelope: raw
                .envelope
                .map(|e| e.decode())
                .transpose()
                .map_err(env_err)?,
        };
        let Some(link_env) = raw.link.map(|e| e.decode()).transpose().map_err(env_err)? else {
            return Err(err(n, "no link"));
        };

        // Byte-identical to the canonical encoding.
        let (canonical, content_len) = entry.write_line(&link_env);
        if canonical.as_bytes() != line {
            let at = canonical
                .bytes()
                .zip(line.iter())
                .position(|(a, b)| a != *b)
                .unwrap_or(canonical.len().min(line.len()));
            return Err(err(
                n,
                format!("not the canonical Go JSON encoding of its entry (differs at byte {at})"),
            ));
        }

        // The link.
        if link_env.signatures.len() != 1 {
            return Err(err(
                n,
                format!(
                    "the link carries {} signatures, expected exactly one",
                    link_env.signatures.len()
                ),
            ));
        }
        let payload = self.verify_env(n, &link_env, "the link")?;
        let (link, subject) = match decode_statement(payload) {
            Ok(Statement::Link(l, s)) => (l, s),
            Ok(_) => return Err(err(n, "the link holds no bundle-link statement")),
            Err(e) => return Err(err(n, format!("link: {e}"))),
        };
        if link.index != n {
            return Err(err(
                n,
                format!("link index is {}, expected {n}", link.index),
            ));
        }
        if link.previous_sha256 != self.previous {
            return Err(err(
                n,
                if n == 1 {
                    "link previous_sha256 is not empty on the first line".to_owned()
                } else {
                    format!("link previous_sha256 does not match line {}", n - 1)
                },
            ));
        }
        if subject != link.subject() {
            return Err(err(n, "the link's subject digest is not what it links"));
        }
        // One pass over the line gives both digests: the content is the line up to where
        // `link` starts, closed by `}` (the line is canonical, so this is exact).
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        let split = content_len - 1;
        ctx.update(&line[..split]);
        let mut content_ctx = ctx.clone();
        content_ctx.update(b"}");
        let entry_sha256 = hex::encode(content_ctx.finish());
        ctx.update(&line[split..]);
        let line_sha256 = hex::encode(ctx.finish());
        if link.checkpoint {
            if !entry.request.is_empty() || !entry.response.is_empty() || entry.envelope.is_some() {
                return Err(err(n, "a checkpoint line carries an entry"));
            }
            if !link.entry_sha256.is_empty() {
                return Err(err(n, "a checkpoint link carries entry_sha256"));
            }
            if link.lines != n - 1 {
                return Err(err(
                    n,
                    format!(
                        "checkpoint counts {} lines before it, there are {}",
                        link.lines,
                        n - 1
                    ),
                ));
            }
            self.summary.checkpoints.push(Checkpoint {
                index: n,
                line_sha256: line_sha256.clone(),
            });
        } else {
            if link.lines != 0 {
                return Err(err(n, "a non-checkpoint link carries lines"));
            }
            if link.entry_sha256 != entry_sha256 {
                return Err(err(n, "link entry_sha256 does not match the entry"));
            }
            let Some(env) = &entry.envelope else {
                return Err(err(n, "an entry without an envelope"));
            };
            self.entry(n, &entry, env)?;
        }
        self.index = n;
        self.previous = line_sha256;
        self.last_checkpoint = link.checkpoint;
        self.summary.lines = n;
        Ok(())
    }

    /// The chain state of session `fingerprint`, first seen at line `n` if it is new.
    fn session(&mut self, fingerprint: &str, n: u64) -> &mut ChainState {
        self.sessions
            .entry(fingerprint.to_owned())
            .or_insert(ChainState {
                first_line: n,
                ..Default::default()
            })
    }

    fn entry(&mut self, n: u64, entry: &Entry, env: &Envelope) -> Result<(), BundleError> {
        let payload = self.verify_env(n, env, "the envelope")?;
        let statement = decode_statement(payload).map_err(|e| err(n, format!("envelope: {e}")))?;
        match statement {
            Statement::Link(..) => Err(err(n, "the envelope holds a bundle-link statement")),
            Statement::Close(c) => {
                if !entry.request.is_empty() || !entry.response.is_empty() {
                    return Err(err(n, "a session close carries an exchange"));
                }
                let state = self.session(&c.session, n);
                if let Some(at) = state.closed_at {
                    return Err(err(
                        n,
                        format!(
                            "a second close of session {} (closed at line {at})",
                            c.session
                        ),
                    ));
                }
                if c.calls != state.calls || c.last_record_sha256 != state.last {
                    return Err(err(
                        n,
                        format!(
                            "the close of session {} counts {} calls ending in {:?}, the bundle holds {} ending in {:?}",
                            c.session, c.calls, c.last_record_sha256, state.calls, state.last
                        ),
                    ));
                }
                state.closed_at = Some(n);
                Ok(())
            }
            Statement::Record(rec) => self.record(n, entry, *rec),
        }
    }

    fn record(&mut self, n: u64, entry: &Entry, rec: pb::RunRecord) -> Result<(), BundleError> {
        if rec.version == 1 {
            return Err(err(
                n,
                "a version 1 record (bundles hold versions 2 and 3 only)",
            ));
        }
        if entry.request.is_empty() {
            return Err(err(n, "a record without its request"));
        }
        let req = pb::RunRequest::decode(entry.request.as_slice())
            .map_err(|e| err(n, format!("request is not a protobuf RunRequest: {e}")))?;
        let unanswered = rec.version == 3;
        let resp = if unanswered {
            if !entry.response.is_empty() {
                return Err(err(n, "an unanswered (version 3) record with a response"));
            }
            None
        } else {
            if entry.response.is_empty() {
                return Err(err(
                    n,
                    "an answered (version 2) record without its response",
                ));
            }
            let resp = pb::RunResponse::decode(entry.response.as_slice())
                .map_err(|e| err(n, format!("response is not a protobuf RunResponse: {e}")))?;
            match &resp.record {
                None => return Err(err(n, "the stored response carries no record")),
                Some(stored) if *stored != rec => {
                    return Err(err(
                        n,
                        format!(
                            "the stored response's record differs from the signed record in {}",
                            record_difference(stored, &rec)
                        ),
                    ))
                }
                Some(_) => {}
            }
            Some(resp)
        };
        if rec.session.is_empty() {
            if unanswered {
                return Err(err(n, "an unanswered record outside a session"));
            }
            let resp = resp.expect("answered");
            check_run_linked(&req, &resp, &ChainLink::default()).map_err(|e| check_err(n, e))?;
            self.summary.runs += 1;
            self.summary
                .request_digests
                .push(rec.request_sha256.clone());
            self.summary.single_runs.push(StoredRun {
                line: n,
                request: req,
                request_sha256: rec.request_sha256,
                result_sha256: rec.result_sha256,
            });
            return Ok(());
        }
        let state = self.session(&rec.session, n);
        if let Some(at) = state.closed_at {
            return Err(err(
                n,
                format!(
                    "a call of session {} after its close at line {at}",
                    rec.session
                ),
            ));
        }
        let expected = ChainLink {
            session: rec.session.clone(),
            sequence: state.calls + 1,
            previous_sha256: state.last.clone(),
        };
        match &resp {
            Some(resp) => check_run_linked(&req, resp, &expected),
            None => check_unanswered_run(&req, &rec, &expected, None),
        }
        .map_err(|e| check_err(n, e))?;
        state.calls += 1;
        state.last = rec.record_sha256;
        self.summary.session_calls += 1;
        if unanswered {
            self.summary.unanswered += 1;
        }
        self.summary.request_digests.push(rec.request_sha256);
        Ok(())
    }

    /// The end of the bundle: a checkpoint last, every session closed.
    pub(crate) fn finish(mut self) -> Result<Summary, BundleError> {
        if self.index == 0 {
            return Err(BundleError::Incomplete {
                line: 1,
                what: "the bundle is empty".into(),
            });
        }
        if !self.last_checkpoint {
            return Err(BundleError::Incomplete {
                line: self.index,
                what: "the bundle does not end in a checkpoint".into(),
            });
        }
        if let Some((fp, s)) = self
            .sessions
            .iter()
            .filter(|(_, s)| s.closed_at.is_none())
            .min_by_key(|(_, s)| s.first_line)
        {
            return Err(err(
                s.first_line,
                format!("session {fp} (first seen here) is never closed"),
            ));
        }
        self.summary.sessions = self.sessions.len() as u64;
        Ok(self.summary)
    }
}
