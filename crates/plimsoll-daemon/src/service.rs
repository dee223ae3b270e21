//! The protocol 5 service: on every call, in this order, authenticate (the interceptor),
//! check the protocol, validate, check the floor, admit, dispatch, stamp the record.
//!
//! Nothing is admitted before every check passed, and every refusal before dispatch
//! carries the not-dispatched mark. An error after dispatch carries no mark.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use plimsoll_core::pb::run_request::Payload;
use plimsoll_core::pb::run_response::Result as RunResult;
use plimsoll_core::pb::sandbox_service_server::SandboxService;
use plimsoll_core::{digest, pb, validate, Refusal, PROTOCOL};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::auth::Principal;
use crate::config::Resources;
use crate::metrics::Metrics;
use crate::provider::{Answer, Provider, ProviderError, Work};
use crate::sessions::SessionTable;

mod session_calls;

/// Shared state of one daemon.
pub struct Service {
    provider: Arc<dyn Provider>,
    admission: Arc<Semaphore>,
    max_concurrent: usize,
    default_timeout: Duration,
    resources: Resources,
    draining: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    grants: plimsoll_grants::Grants,
    sessions: Option<Arc<SessionTable>>,
}

impl Service {
    /// A service dispatching to `provider`.
    pub fn new(
        provider: Arc<dyn Provider>,
        max_concurrent: usize,
        default_timeout: Duration,
        resources: Resources,
        draining: Arc<AtomicBool>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Service {
            provider,
            admission: Arc::new(Semaphore::new(max_concurrent)),
            max_concurrent,
            default_timeout,
            resources,
            draining,
            metrics,
            grants: plimsoll_grants::Grants::empty(),
            sessions: None,
        }
    }

    /// Serves sessions from `table` (without it, the session calls answer `unsupported`).
    pub fn with_sessions(mut self, table: Arc<SessionTable>) -> Self {
        self.sessions = Some(table);
        self
    }

    /// The grant profiles runs may name (none by default: every grant is refused).
    pub fn with_grants(mut self, grants: plimsoll_grants::Grants) -> Self {
        self.grants = grants;
        self
    }
}

/// The one refusal for a profile that does not exist and one the caller may not use, so a
/// caller cannot probe which profiles exist.
fn grant_unavailable(profile: &str) -> Refusal {
    Refusal::permission(format!(
        "grant profile {profile:?} is not available to this caller"
    ))
}

fn unix_ms_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A trace id is kept only in the form `[A-Za-z0-9._:-]{1,64}`; anything else is dropped.
fn clean_trace_id(t: &str) -> Option<&str> {
    let ok = !t.is_empty()
        && t.len() <= 64
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".:_-".contains(&b));
    ok.then_some(t)
}

fn principal_of<T>(req: &Request<T>) -> Result<Principal, Refusal> {
    // The interceptor always inserts one; a missing one means the service was mounted
    // without it, which must never serve.
    req.extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| Refusal::unauthenticated("the request was not authenticated"))
}

/// A provider's answer as the response's result.
fn run_result(a: Answer) -> RunResult {
    match a {
        Answer::Javascript(j) => RunResult::Javascript(j),
        Answer::Project(p) => RunResult::Project(p),
    }
}

/// An answer before its record is stamped: the provider's evidence and the result.
fn response(facts: &crate::provider::Facts, elapsed_ms: i64, result: RunResult) -> pb::RunResponse {
    pb::RunResponse {
        sandbox: facts.name.clone(),
        isolation: facts.tier.map_or("", |t| t.as_str()).to_owned(),
        duration_ms: elapsed_ms,
        record: None,
        software_identity: facts.software_identity.clone(),
        environment: facts.environment.clone(),
        result: Some(result),
    }
}

impl Service {
    /// A software rule the provider's identity is not in is refused `environment`.
    fn software_allowed(
        &self,
        rule: Option<&pb::SoftwareRule>,
        facts: &crate::provider::Facts,
    ) -> Result<(), Refusal> {
        if let Some(rule) = rule.filter(|r| !r.mode.is_empty()) {
            if facts.software_identity.is_empty()
                || !rule.identities.contains(&facts.software_identity)
            {
                return Err(Refusal::environment(format!(
                    "the {} provider's software identity {:?} is not in the request's rule",
                    facts.name, facts.software_identity
                )));
            }
        }
        Ok(())
    }

    fn checks(
        &self,
        caller: &Principal,
        req: &pb::RunRequest,
    ) -> Result<(Work, Duration, Option<plimsoll_grants::RunGrant>), Refusal> {
        Refusal::check_protocol(req.protocol, PROTOCOL)?;
        let env = validate::validate_run(req)?;
        let facts = self.provider.facts();
        let Some(tier) = facts.tier else {
            return Err(Refusal::disabled(
                "no provider is configured (the disabled provider runs nothing); the operator must set SANDBOX_PROVIDER",
            ));
        };
        let work = match &req.payload {
            Some(Payload::Javascript(js)) => Work::Javascript(js.clone()),
            Some(Payload::Project(p)) if facts.supports_project => Work::Project(p.clone()),
            Some(Payload::Project(_)) => {
                return Err(Refusal::unsupported(format!(
                    "the {} provider does not run projects",
                    facts.name
                )))
            }
            Some(Payload::Module(_)) => {
                return Err(Refusal::unsupported(
                    "module payloads are not offered by this daemon",
                ))
            }
            Some(Payload::Cell(_)) | None => {
                return Err(Refusal::request("the request carries no runnable payload"))
            }
        };
        let profile = match &work {
            Work::Javascript(js) => &js.grant_profile,
            Work::Project(p) => &p.grant_profile,
        };
        let grant = if profile.is_empty() {
            None
        } else {
            // Unknown and not-allowed profiles share one message, so a caller cannot probe names.
            let grant = self
                .grants
                .grant(profile, &caller.id)
                .ok_or_else(|| grant_unavailable(profile))?;
            if !facts.supports_grants {
                return Err(Refusal::unsupported(format!(
                    "the {} provider does not offer grants",
                    facts.name
                )));
            }
            Some(grant)
        };
        if !tier.meets(env.floor) {
            return Err(Refusal::isolation(format!(
                "the request's floor is {} and the {} provider runs at {}; nothing ran",
                env.floor.as_str(),
                facts.name,
                tier
            )));
        }
        self.software_allowed(req.software_rule.as_ref(), &facts)?;
        if self.draining.load(Ordering::SeqCst) {
            return Err(Refusal::capacity(
                "the daemon is shutting down; send the run elsewhere or later",
            ));
        }
        // The one place a language the provider did not prove is refused: last, as the
        // providers did at dispatch, so every other refusal keeps its precedence.
        if matches!(work, Work::Javascript(_)) && !facts.languages.iter().any(|l| l == "javascript")
        {
            return Err(Refusal::unsupported(format!(
                "node did not pass the {} provider's startup check; javascript is unavailable",
                facts.name
            )));
        }
        let ceiling = Duration::from_millis(facts.max_timeout_ms.max(1).into());
        let timeout = env
            .timeout_ms
            .map_or(self.default_timeout, |ms| Duration::from_millis(ms.into()))
            .min(ceiling);
        Ok((work, timeout, grant))
    }

    async fn run_checked(
        &self,
        caller: &Principal,
        req: &pb::RunRequest,
    ) -> Result<pb::RunResponse, Status> {
        let started_unix_ms = unix_ms_now();
        let t0 = Instant::now();
        let kind = digest::payload_kind(req.payload.as_ref());
        let trace_id = clean_trace_id(&req.trace_id).unwrap_or("");
        let refuse = |r: Refusal| {
            self.metrics.refused(r.reason);
            tracing::info!(target: "plimsoll::audit", caller = %caller.id, op = kind, trace_id, refused = %r.reason,
                detail = %r.message, "run refused, nothing ran");
            r.to_status()
        };
        let (work, timeout, grant) = self.checks(caller, req).map_err(refuse)?;
        let checked = t0.elapsed();
        let _permit = self.admission.clone().try_acquire_owned().map_err(|_| {
            refuse(Refusal::capacity(format!(
                "{} runs are in flight, the daemon's limit (SANDBOX_MAX_CONCURRENT); retry later",
                self.max_concurrent
            )))
        })?;
        self.metrics.inflight(1);
        let outcome = match &grant {
            None => self.provider.run(work, timeout).await,
            Some(g) => self.provider.run_granted(work, timeout, g.clone()).await,
        };
        // The broker's trace: route templates, statuses and counts only.
        let (grant_profile, grant_trace) =
            grant.as_ref().map_or((String::new(), String::new()), |g| {
                (g.profile_name().to_owned(), g.trace().summary())
            });
        self.metrics.inflight(-1);
        let ran = t0.elapsed();
        let elapsed_ms = ran.as_millis() as i64;
        let facts = self.provider.facts();
        let answer = match outcome {
            Ok(a) => a,
            Err(ProviderError::Refused(r)) => {
                if !grant_profile.is_empty() {
                    tracing::info!(target: "plimsoll::audit", caller = %caller.id, op = kind, trace_id,
                        grant = %grant_profile, grant_trace = %grant_trace, "grant calls of a refused run");
                }
                return Err(refuse(r));
            }
            Err(ProviderError::Failed(msg)) => {
                self.metrics.failed();
                tracing::error!(target: "plimsoll::audit", caller = %caller.id, op = kind, trace_id, provider = %facts.name,
                    duration_ms = elapsed_ms, error = %msg, grant = %grant_profile, grant_trace = %grant_trace,
                    "run failed after dispatch; the code may have run");
                return Err(Status::internal(format!(
                    "the run failed after dispatch and the code may have run: {msg}"
                )));
            }
        };
        let tier = facts.tier.map_or("", |t| t.as_str());
        let mut resp = response(&facts, elapsed_ms, run_result(answer));
        digest::stamp(
            req,
            &mut resp,
            &facts.policy,
            started_unix_ms,
            started_unix_ms + elapsed_ms,
        );
        self.metrics.answered(elapsed_ms as u64);
        let rec = resp.record.as_ref().expect("stamped");
        let (exit_code, outcome) = match &resp.result {
            Some(RunResult::Javascript(j)) => (
                j.exit_code,
                if j.timed_out {
                    "timed_out"
                } else {
                    "completed"
                },
            ),
            Some(RunResult::Project(p)) => (
                p.steps.last().map_or(0, |s| s.exit_code),
                pb::ProjectOutcome::try_from(p.outcome).map_or("unspecified", |o| match o {
                    pb::ProjectOutcome::Completed => "completed",
                    pb::ProjectOutcome::SetupFailed => "setup_failed",
                    pb::ProjectOutcome::TimedOut => "timed_out",
                    pb::ProjectOutcome::ProtocolError => "protocol_error",
                    pb::ProjectOutcome::Unspecified => "unspecified",
                }),
            ),
            _ => (0, "unspecified"),
        };
        tracing::info!(target: "plimsoll::audit", caller = %caller.id, op = kind, trace_id, provider = %facts.name,
            isolation = tier, outcome, exit_code, duration_ms = elapsed_ms, request_sha256 = %rec.request_sha256,
            result_sha256 = %rec.result_sha256, record_sha256 = %rec.record_sha256, grant = %grant_profile,
            grant_trace = %grant_trace, "run answered");
        // Where the daemon's time went, for `cargo xtask bench process`.
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        tracing::debug!(target: "plimsoll_daemon::phases", checks_us = us(checked),
            provider_us = us(ran.saturating_sub(checked)), answer_us = us(t0.elapsed().saturating_sub(ran)),
            total_us = us(t0.elapsed()), "run phases");
        Ok(resp)
    }

    fn describe_response(&self) -> pb::DescribeResponse {
        let f = self.provider.facts();
        let env = pb::PayloadEnvironment {
            identity: f.environment.clone(),
            max_timeout_ms: f.max_timeout_ms,
            software_identity: f.software_identity.clone(),
            languages: f.languages.clone(),
        };
        pb::DescribeResponse {
            sandbox: f.name.clone(),
            isolation: f.tier.map_or("none", |t| t.as_str()).to_owned(),
            supports_project: f.supports_project,
            supports_javascript_grants: f.supports_grants && !self.grants.is_empty(),
            supports_project_grants: f.supports_grants
                && f.supports_project
                && !self.grants.is_empty(),
            protocol: PROTOCOL,
            javascript_environment: Some(env.clone()),
            project_environment: f.supports_project.then_some(env),
            resources: Some(pb::RunResources {
                memory_mb: self.resources.memory_mb,
                cpus: self.resources.cpus,
                pids: self.resources.pids,
                disk_mb: self.resources.disk_mb,
            }),
            policy: f.policy.clone(),
            max_concurrent: self.max_concurrent as u32,
            ..self.describe_sessions(&f)
        }
    }

    /// What `Describe` states of sessions (all zero when they are off).
    fn describe_sessions(&self, f: &crate::provider::Facts) -> pb::DescribeResponse {
        let Some(table) = self.sessions.as_ref() else {
            return pb::DescribeResponse::default();
        };
        let s = table.settings();
        let ms = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
        pb::DescribeResponse {
            supports_sessions: s.enabled() && self.provider.sessions().is_some(),
            session_lifetime_ms: ms(s.lifetime),
            session_idle_timeout_ms: ms(s.idle),
            session_environment: Some(pb::PayloadEnvironment {
                identity: f.environment.clone(),
                max_timeout_ms: f.max_timeout_ms,
                software_identity: f.software_identity.clone(),
                languages: f.languages.clone(),
            }),
            max_sessions_per_caller: s.per_caller as u32,
            max_sessions_per_owner: s.per_owner as u32,
            ..Default::default()
        }
    }
}

#[tonic::async_trait]
impl SandboxService for Service {
    async fn run(
        &self,
        request: Request<pb::RunRequest>,
    ) -> Result<Response<pb::RunResponse>, Status> {
        let caller = principal_of(&request)?;
        let req = request.into_inner();
        self.run_checked(&caller, &req).await.map(Response::new)
    }

    async fn describe(
        &self,
        request: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeResponse>, Status> {
        principal_of(&request)?;
        Ok(Response::new(self.describe_response()))
    }

    async fn open_session(
        &self,
        request: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<pb::OpenSessionResponse>, Status> {
        let caller = principal_of(&request)?;
        self.open_session_checked(&caller, request.get_ref())
            .await
            .map(Response::new)
    }

    async fn session_run(
        &self,
        request: Request<pb::SessionRunRequest>,
    ) -> Result<Response<pb::SessionRunResponse>, Status> {
        let caller = principal_of(&request)?;
        self.session_run_checked(&caller, request.get_ref())
            .await
            .map(Response::new)
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        let caller = principal_of(&request)?;
        self.close_session_checked(&caller, request.get_ref())
            .await
            .map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::clean_trace_id;

    #[test]
    fn trace_ids() {
        assert_eq!(clean_trace_id("t-1:a.b_c"), Some("t-1:a.b_c"));
        assert_eq!(clean_trace_id(""), None);
        assert_eq!(clean_trace_id("a b"), None);
        assert_eq!(clean_trace_id(&"x".repeat(65)), None);
    }
}
