//! The three session calls: `OpenSession`, `SessionRun`, `CloseSession`.
//!
//! Order on `OpenSession`: protocol → envelope (floor, rule, lifetimes, languages, owner)
//! → sessions on → provider configured → floor vs tier → rule vs software identity →
//! draining → places (daemon, caller, owner; owner replacement) → a concurrency slot for
//! the open → provider open → registered.
//!
//! Order on `SessionRun`: protocol → payload → sessions on → the id (unknown, or another
//! caller's: the same `NOT_FOUND`) → ended → grant (never in sessions) → floor vs tier at
//! open → rule vs identity at open → language proven → draining → turn (one running, one
//! waiting) → ended while waiting → lifetime → a concurrency slot → the call → record
//! chained → the session's end, if the call ended it.
//!
//! Every refusal before the call carries the not-dispatched mark and is not counted in the
//! chain. A call that failed after it may have run is counted, and its error carries the
//! version-3 record (`UnansweredCall`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use plimsoll_core::digest::{self, SessionEvidence};
use plimsoll_core::pb::session_run_request::Payload as SessionPayload;
use plimsoll_core::{pb, unanswered_status, validate, Reason, Refusal, PROTOCOL};
use plimsoll_provider::{ProviderError, SessionAnswer, SessionSpec, SessionWork, Work};
use tonic::Status;

use super::{clean_trace_id, unix_ms_now, Service};
use crate::auth::Principal;
use crate::sessions::{Entry, Lookup, NewSession, SessionTable};

/// The answer to an id that names no session of this caller.
fn not_found() -> Status {
    Refusal::new(
        Reason::Request,
        tonic::Code::NotFound,
        "no open session of this caller has that id (unknown, another caller's, or forgotten by a restart)",
    )
    .to_status_with(Some((pb::SessionEnd::NotFound, "")))
}

/// The answer to a call on a session that has ended.
fn ended(reason: pb::SessionEnd, detail: &str) -> Status {
    Refusal::new(
        Reason::Request,
        tonic::Code::FailedPrecondition,
        format!(
            "the session has ended ({}{}{detail}); open a new one",
            reason.as_str_name(),
            if detail.is_empty() { "" } else { ": " }
        ),
    )
    .to_status_with(Some((reason, detail)))
}

fn sessions_off() -> Refusal {
    Refusal::unsupported(
        "sessions are off on this daemon (SANDBOX_MAX_SESSIONS is 0); use Run, or ask the operator to enable them",
    )
}

impl Service {
    fn table(&self) -> Result<&Arc<SessionTable>, Refusal> {
        self.sessions.as_ref().ok_or_else(sessions_off)
    }

    fn refused(&self, caller: &Principal, op: &str, r: Refusal) -> Refusal {
        self.metrics.refused(r.reason);
        tracing::info!(target: "plimsoll::audit", caller = %caller.id, op, refused = %r.reason,
            detail = %r.message, "session request refused, nothing ran");
        r
    }

    pub(super) async fn open_session_checked(
        &self,
        caller: &Principal,
        req: &pb::OpenSessionRequest,
    ) -> Result<pb::OpenSessionResponse, Status> {
        let refuse = |r: Refusal| self.refused(caller, "open_session", r).to_status();
        Refusal::check_protocol(req.protocol, PROTOCOL).map_err(refuse)?;
        let env = validate::validate_open(req).map_err(refuse)?;
        let table = self.table().map_err(refuse)?;
        let facts = self.provider.facts();
        let Some(tier) = facts.tier else {
            return Err(refuse(Refusal::disabled(
                "no provider is configured; the operator must set SANDBOX_PROVIDER",
            )));
        };
        let Some(opener) = self.provider.sessions() else {
            return Err(refuse(Refusal::unsupported(format!(
                "the {} provider does not keep sessions",
                facts.name
            ))));
        };
        if !tier.meets(env.floor) {
            return Err(refuse(Refusal::isolation(format!(
                "the request's floor is {} and the {} provider's sessions run at {tier}; nothing ran",
                env.floor.as_str(),
                facts.name
            ))));
        }
        self.software_allowed(req.software_rule.as_ref(), &facts)
            .map_err(refuse)?;
        if self.draining.load(Ordering::SeqCst) {
            return Err(refuse(Refusal::capacity(
                "the daemon is shutting down; open the session elsewhere or later",
            )));
        }
        // A hint for a language the provider did not prove is dropped, not refused.
        let languages: Vec<String> = env
            .languages
            .into_iter()
            .filter(|l| facts.languages.contains(l))
            .collect();
        let (reservation, victims) = table.reserve(&caller.id, &req.owner).map_err(refuse)?;
        let _permit = self.admission.clone().try_acquire_owned().map_err(|_| {
            refuse(Refusal::capacity(format!(
                "{} runs are in flight, the daemon's limit (SANDBOX_MAX_CONCURRENT); retry later",
                self.max_concurrent
            )))
        })?;
        for v in victims {
            table
                .end(
                    &v,
                    pb::SessionEnd::Replaced,
                    "the owner opened a new session at its cap (SANDBOX_MAX_SESSIONS_PER_OWNER)",
                )
                .await;
        }
        let settings = table.settings();
        let lifetime = env
            .lifetime_ms
            .map_or(settings.lifetime, |ms| Duration::from_millis(ms.into()))
            .min(settings.lifetime);
        let idle_timeout = match env.idle_timeout_ms {
            Some(ms) if settings.idle.is_zero() => Duration::from_millis(ms.into()),
            Some(ms) => Duration::from_millis(ms.into()).min(settings.idle),
            None => settings.idle,
        };
        let session = opener
            .open(SessionSpec {
                languages,
                disk_mb: settings.disk_mb,
                lifetime,
            })
            .await
            .map_err(|e| match e {
                ProviderError::Refused(r) => refuse(r),
                ProviderError::Failed(msg) => {
                    self.metrics.failed();
                    tracing::error!(target: "plimsoll::audit", caller = %caller.id, op = "open_session",
                        error = %msg, "session open failed");
                    Status::internal(format!("the session could not be opened: {msg}"))
                }
            })?;
        let evidence = SessionEvidence {
            provider: facts.name.clone(),
            isolation: tier.as_str().to_owned(),
            environment: facts.environment.clone(),
            software_identity: facts.software_identity.clone(),
            policy: facts.policy.clone(),
        };
        let expires_unix_ms = unix_ms_now() + lifetime.as_millis() as i64;
        let entry = table.register(
            reservation,
            NewSession {
                principal: caller.id.clone(),
                owner: req.owner.clone(),
                evidence,
                tier,
                languages: facts.languages.clone(),
                lifetime,
                idle_timeout,
                session,
            },
        );
        let trace_id = clean_trace_id(&req.trace_id).unwrap_or("");
        tracing::info!(target: "plimsoll::audit", caller = %caller.id, op = "open_session", trace_id,
            session = %entry.fingerprint, provider = %facts.name, isolation = tier.as_str(),
            lifetime_ms = lifetime.as_millis() as u64, "session opened");
        Ok(pb::OpenSessionResponse {
            session_id: SessionTable::id_of(&entry).to_owned(),
            session: entry.fingerprint.clone(),
            sandbox: facts.name,
            isolation: tier.as_str().to_owned(),
            expires_unix_ms,
            idle_timeout_ms: u32::try_from(idle_timeout.as_millis()).unwrap_or(u32::MAX),
            software_identity: facts.software_identity,
        })
    }

    /// The checks on a call that need its session.
    fn call_checks(
        &self,
        entry: &Entry,
        req: &pb::SessionRunRequest,
        floor: plimsoll_core::Floor,
    ) -> Result<SessionWork, Refusal> {
        let facts = self.provider.facts();
        let work = match req.payload.clone() {
            Some(SessionPayload::Javascript(js)) => {
                if !js.grant_profile.is_empty() {
                    return Err(Refusal::unsupported(
                        "grants are not offered in sessions on this daemon; send the granted call as a Run",
                    ));
                }
                SessionWork::Run(Work::Javascript(js))
            }
            Some(SessionPayload::Project(p)) => {
                if !p.grant_profile.is_empty() {
                    return Err(Refusal::unsupported(
                        "grants are not offered in sessions on this daemon; send the granted call as a Run",
                    ));
                }
                if !facts.supports_project {
                    return Err(Refusal::unsupported(format!(
                        "the {} provider does not run projects",
                        facts.name
                    )));
                }
                SessionWork::Run(Work::Project(p))
            }
            Some(SessionPayload::Cell(c)) => SessionWork::Cell(c),
            None => return Err(Refusal::request("the call carries no payload")),
        };
        if !entry.tier.meets(floor) {
            return Err(Refusal::isolation(format!(
                "the call's floor is {} and the session runs at {}; nothing ran",
                floor.as_str(),
                entry.tier
            )));
        }
        if let Some(rule) = req.software_rule.as_ref().filter(|r| !r.mode.is_empty()) {
            let id = &entry.evidence.software_identity;
            if id.is_empty() || !rule.identities.contains(id) {
                return Err(Refusal::environment(format!(
                    "the session's software identity {id:?} is not in the call's rule"
                )));
            }
        }
        let language = match &work {
            SessionWork::Run(Work::Javascript(_)) => Some("javascript"),
            SessionWork::Cell(c) => Some(c.language.as_str()),
            SessionWork::Run(Work::Project(_)) => None,
        };
        if let Some(l) = language.filter(|l| !entry.languages.iter().any(|p| p == l)) {
            return Err(Refusal::unsupported(format!(
                "{l} did not pass the {} provider's startup check; it is unavailable in this session",
                entry.evidence.provider
            )));
        }
        if self.draining.load(Ordering::SeqCst) {
            return Err(Refusal::capacity(
                "the daemon is shutting down; the session will end",
            ));
        }
        Ok(work)
    }

    pub(super) async fn session_run_checked(
        &self,
        caller: &Principal,
        req: &pb::SessionRunRequest,
    ) -> Result<pb::SessionRunResponse, Status> {
        let started_unix_ms = unix_ms_now();
        let t0 = StdInstant::now();
        let refuse = |r: Refusal| self.refused(caller, "session_run", r).to_status();
        Refusal::check_protocol(req.protocol, PROTOCOL).map_err(refuse)?;
        let env = validate::validate_session_call(req).map_err(refuse)?;
        let table = self.table().map_err(refuse)?;
        let entry = match table.lookup(&req.session_id, &caller.id) {
            Lookup::Live(e) => e,
            Lookup::Ended(t) => return Err(ended(t.reason, &t.detail)),
            Lookup::NotFound => return Err(not_found()),
        };
        let work = self.call_checks(&entry, req, env.floor).map_err(refuse)?;
        let turn = entry.take_turn().await.map_err(refuse)?;
        if let Some((reason, detail)) = turn.ended() {
            return Err(ended(reason, &detail));
        }
        if entry.remaining().is_zero() {
            let (reason, detail) = table
                .end_in_turn(
                    &entry,
                    pb::SessionEnd::Expired,
                    "the session's lifetime is over",
                )
                .await;
            return Err(ended(reason, &detail));
        }
        let _permit = self.admission.clone().try_acquire_owned().map_err(|_| {
            refuse(Refusal::capacity(format!(
                "{} runs are in flight, the daemon's limit (SANDBOX_MAX_CONCURRENT); retry later",
                self.max_concurrent
            )))
        })?;
        let facts = self.provider.facts();
        let ceiling = Duration::from_millis(facts.max_timeout_ms.max(1).into());
        let timeout = env
            .timeout_ms
            .map_or(self.default_timeout, |ms| Duration::from_millis(ms.into()))
            .min(ceiling)
            .min(entry.remaining());
        turn.resume();
        let link = turn.next_link();
        self.metrics.inflight(1);
        let outcome = turn.session().call(work, timeout).await;
        self.metrics.inflight(-1);
        let elapsed_ms = t0.elapsed().as_millis() as i64;
        let as_run = digest::session_call_as_run(req);
        let kind = digest::payload_kind(as_run.payload.as_ref());
        let trace_id = clean_trace_id(&req.trace_id).unwrap_or("");
        // The provider's end first, then the lifetime's: the first end stands. The session
        // ends only once this call is counted, so its tombstone holds the call.
        let mut wanted_end = outcome
            .ended
            .as_ref()
            .map(|e| (e.cause.to_wire(), e.detail.clone()));
        if wanted_end.is_none() && entry.remaining().is_zero() {
            wanted_end = Some((
                pb::SessionEnd::Expired,
                "the session's lifetime is over".to_owned(),
            ));
        }
        let end_now = |wanted: Option<(pb::SessionEnd, String)>| async {
            match wanted {
                Some((reason, detail)) => Some(table.end_in_turn(&entry, reason, &detail).await),
                None => None,
            }
        };
        let answer = match outcome.answer {
            Ok(a) => a,
            Err(ProviderError::Refused(r)) => {
                let end = end_now(wanted_end).await;
                let ended_ref = end.as_ref().map(|(r, d)| (*r, d.as_str()));
                return Err(self
                    .refused(caller, "session_run", r)
                    .to_status_with(ended_ref));
            }
            Err(ProviderError::Failed(msg)) => {
                self.metrics.failed();
                let rec = digest::unanswered_record(
                    &as_run,
                    &entry.evidence,
                    "internal",
                    (started_unix_ms, started_unix_ms + elapsed_ms),
                    &link,
                );
                turn.executed(&rec.record_sha256);
                tracing::error!(target: "plimsoll::audit", caller = %caller.id, op = kind, trace_id,
                    session = %entry.fingerprint, sequence = link.sequence, error = %msg,
                    record_sha256 = %rec.record_sha256, "session call failed after dispatch; the code may have run");
                let end = end_now(wanted_end).await;
                let ended_ref = end.as_ref().map(|(r, d)| (*r, d.as_str()));
                return Err(unanswered_status(
                    tonic::Code::Internal,
                    &format!(
                        "the session call failed after dispatch and the code may have run: {msg}"
                    ),
                    rec,
                    ended_ref,
                ));
            }
        };
        let result = match answer {
            SessionAnswer::Run(a) => super::run_result(a),
            SessionAnswer::Cell(c) => pb::run_response::Result::Cell(c),
        };
        let mut resp = super::response(&facts, elapsed_ms, result);
        resp.isolation = entry.evidence.isolation.clone();
        digest::stamp_linked(
            &as_run,
            &mut resp,
            &entry.evidence.policy,
            (started_unix_ms, started_unix_ms + elapsed_ms),
            &link,
        );
        let rec = resp.record.as_ref().expect("stamped");
        turn.executed(&rec.record_sha256);
        self.metrics.answered(elapsed_ms as u64);
        tracing::info!(target: "plimsoll::audit", caller = %caller.id, op = kind, trace_id,
            session = %entry.fingerprint, sequence = link.sequence, provider = %facts.name,
            duration_ms = elapsed_ms, request_sha256 = %rec.request_sha256,
            result_sha256 = %rec.result_sha256, record_sha256 = %rec.record_sha256,
            "session call answered");
        let end = end_now(wanted_end).await;
        let (ended, end_detail) = end.unwrap_or((pb::SessionEnd::Unspecified, String::new()));
        Ok(pb::SessionRunResponse {
            run: Some(resp),
            ended: ended as i32,
            end_detail,
        })
    }

    pub(super) async fn close_session_checked(
        &self,
        caller: &Principal,
        req: &pb::CloseSessionRequest,
    ) -> Result<pb::CloseSessionResponse, Status> {
        let refuse = |r: Refusal| self.refused(caller, "close_session", r).to_status();
        Refusal::check_protocol(req.protocol, PROTOCOL).map_err(refuse)?;
        let table = self.table().map_err(refuse)?;
        match table.lookup(&req.session_id, &caller.id) {
            Lookup::NotFound => Err(not_found()),
            Lookup::Ended(t) => Ok(pb::CloseSessionResponse {
                session: t.fingerprint,
                calls: t.calls,
                last_record_sha256: t.last_sha256,
                ended: t.reason as i32,
            }),
            Lookup::Live(entry) => {
                let (reason, _) = table
                    .end(&entry, pb::SessionEnd::Closed, "closed by its caller")
                    .await;
                let (calls, last) = entry.counts();
                Ok(pb::CloseSessionResponse {
                    session: entry.fingerprint.clone(),
                    calls,
                    last_record_sha256: last,
                    ended: reason as i32,
                })
            }
        }
    }
}
