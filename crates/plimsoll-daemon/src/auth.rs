//! Caller authentication, done on the request headers before the body is decoded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use plimsoll_core::Refusal;
use tonic::{Request, Status};

use crate::config::CallerAuth;
use crate::metrics::Metrics;

/// The authenticated caller of a request (stored in the request's extensions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The caller's id from the callers file, or `anon` in insecure mode.
    pub id: String,
}

/// Checks `authorization: Bearer <token>` against the registry, and the `code:run` scope.
/// Clones share one table, which [`Authenticator::replace`] swaps whole (a reload of the
/// callers file): a request is checked against the old table or the new one, never a mix.
#[derive(Debug, Clone)]
pub struct Authenticator {
    auth: Arc<RwLock<Arc<CallerAuth>>>,
    last_log: Arc<AtomicU64>,
    epoch: Instant,
    metrics: Arc<Metrics>,
}

impl Authenticator {
    /// An authenticator for `auth`.
    pub fn new(auth: CallerAuth, metrics: Arc<Metrics>) -> Self {
        Authenticator {
            auth: Arc::new(RwLock::new(Arc::new(auth))),
            last_log: Arc::new(AtomicU64::new(0)),
            epoch: Instant::now(),
            metrics,
        }
    }

    /// Puts `auth` in place of the table every clone checks against, from the next request.
    pub fn replace(&self, auth: CallerAuth) {
        let mut slot = self.auth.write().unwrap_or_else(|e| e.into_inner());
        *slot = Arc::new(auth);
    }

    /// Logs a refused credential at most once every 30 seconds, never the token itself.
    fn log_refusal(&self, why: &str) {
        let now = self.epoch.elapsed().as_secs() + 30;
        let last = self.last_log.load(Ordering::Relaxed);
        if now >= last + 30
            && self
                .last_log
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                reason = why,
                "refused a caller credential (further refusals within 30 s are not logged)"
            );
        }
    }

    /// Authenticates one request's headers.
    pub fn check(&self, metadata: &tonic::metadata::MetadataMap) -> Result<Principal, Refusal> {
        let auth = self.auth.read().unwrap_or_else(|e| e.into_inner()).clone();
        let registry = match &*auth {
            CallerAuth::Insecure => return Ok(Principal { id: "anon".into() }),
            CallerAuth::Registry(r) => r,
        };
        let header = metadata.get("authorization").and_then(|v| v.to_str().ok());
        let token = header.and_then(|h| {
            let mut parts = h.split_ascii_whitespace();
            match (parts.next(), parts.next(), parts.next()) {
                (Some(scheme), Some(token), None) if scheme.eq_ignore_ascii_case("bearer") => {
                    Some(token)
                }
                _ => None,
            }
        });
        let Some(token) = token else {
            self.log_refusal("missing bearer token");
            return Err(Refusal::unauthenticated(
                "missing bearer token; send `authorization: Bearer <token>`",
            ));
        };
        let Some(caller) = registry.authenticate(token) else {
            self.log_refusal("unknown token");
            return Err(Refusal::unauthenticated(
                "invalid token; ask the operator for a token in the callers file",
            ));
        };
        if !caller.has_scope(plimsoll_callers::SCOPE_RUN) {
            self.log_refusal("token lacks scope");
            return Err(Refusal::permission(format!(
                "the token lacks the required scope {:?}",
                plimsoll_callers::SCOPE_RUN
            )));
        }
        Ok(Principal {
            id: caller.id.clone(),
        })
    }

    /// A tonic interceptor: runs before the request body is decoded.
    pub fn intercept(&self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let principal = self.check(req.metadata()).map_err(|r| {
            self.metrics.refused(r.reason);
            r.to_status()
        })?;
        req.extensions_mut().insert(principal);
        Ok(req)
    }
}
