//! What the broker records about a run's calls: route templates, statuses and sizes.
//!
//! A trace never holds a raw path, a query string, a header, a body or the credential: the
//! route is a template the operator wrote (or `unmatched`), the method one of the five a
//! grant can name (or `OTHER`).

use serde::Serialize;

use crate::route::Method;

/// At most this many calls are kept per run; the rest are counted in [`Trace::dropped`].
pub const MAX_ROWS: usize = 256;

/// The route name recorded for a call no granted template matched.
pub const UNMATCHED: &str = "unmatched";

/// What became of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Forwarded; the upstream's answer was passed back.
    Forwarded,
    /// Refused by the broker; nothing reached the upstream.
    Refused,
    /// Forwarded, but the upstream failed, timed out or answered too much.
    Failed,
}

/// One call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Call {
    /// The method (`OTHER` for one a grant cannot name).
    pub method: &'static str,
    /// The matched route template, or [`UNMATCHED`].
    pub route: String,
    /// The status the sandbox got.
    pub status: u16,
    /// The upstream's status, when it answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_status: Option<u16>,
    /// What became of it.
    pub outcome: Outcome,
    /// Why the broker refused or failed it (a stable name such as `not_granted`,
    /// `traversal`, `calls_per_run`, `response_too_large`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// Request body bytes.
    pub request_bytes: u64,
    /// Response body bytes passed back.
    pub response_bytes: u64,
}

/// A run's trace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Trace {
    /// The grant profile.
    pub profile: String,
    /// The calls, in order (at most [`MAX_ROWS`]).
    pub calls: Vec<Call>,
    /// Calls not kept because the trace was full.
    pub dropped: u64,
    /// Calls forwarded (upstream reached).
    pub forwarded: u64,
    /// Calls refused by the broker.
    pub refused: u64,
    /// Connections that did not present the run's relay secret (not calls; not in `calls`).
    pub unauthenticated: u64,
}

/// The name a trace records for a method as sent.
pub fn method_name(m: &str) -> &'static str {
    Method::parse(m).map_or("OTHER", Method::as_str)
}

impl Trace {
    pub(crate) fn push(&mut self, call: Call) {
        match call.outcome {
            Outcome::Refused => self.refused += 1,
            Outcome::Forwarded | Outcome::Failed => self.forwarded += 1,
        }
        if self.calls.len() < MAX_ROWS {
            self.calls.push(call);
        } else {
            self.dropped += 1;
        }
    }

    /// One line for the audit log: each distinct (method, route, status, outcome) with its
    /// count, in first-seen order, e.g. `POST /v1/memories 201 x1; refused GET unmatched 403 x2`.
    pub fn summary(&self) -> String {
        let mut groups: Vec<(String, u64)> = Vec::new();
        for c in &self.calls {
            let key = match c.outcome {
                Outcome::Forwarded => format!("{} {} {}", c.method, c.route, c.status),
                Outcome::Refused => format!(
                    "refused {} {} {} {}",
                    c.method,
                    c.route,
                    c.status,
                    c.reason.unwrap_or("")
                ),
                Outcome::Failed => format!(
                    "failed {} {} {} {}",
                    c.method,
                    c.route,
                    c.status,
                    c.reason.unwrap_or("")
                ),
            };
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, n)) => *n += 1,
                None => groups.push((key, 1)),
            }
        }
        let mut parts: Vec<String> = groups
            .into_iter()
            .map(|(k, n)| format!("{} x{n}", k.trim_end()))
            .collect();
        if self.dropped > 0 {
            parts.push(format!("{} more not kept", self.dropped));
        }
        if self.unauthenticated > 0 {
            parts.push(format!("{} without the relay secret", self.unauthenticated));
        }
        if parts.is_empty() {
            "no calls".into()
        } else {
            parts.join("; ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(route: &str, status: u16, outcome: Outcome, reason: Option<&'static str>) -> Call {
        Call {
            method: "GET",
            route: route.into(),
            status,
            upstream_status: None,
            outcome,
            reason,
            request_bytes: 0,
            response_bytes: 0,
        }
    }

    #[test]
    fn summary_groups_and_caps() {
        let mut t = Trace::default();
        assert_eq!(t.summary(), "no calls");
        t.push(call("/a/{id}", 200, Outcome::Forwarded, None));
        t.push(call("/a/{id}", 200, Outcome::Forwarded, None));
        t.push(call(UNMATCHED, 403, Outcome::Refused, Some("not_granted")));
        assert_eq!(
            t.summary(),
            "GET /a/{id} 200 x2; refused GET unmatched 403 not_granted x1"
        );
        for _ in 0..MAX_ROWS {
            t.push(call("/a/{id}", 200, Outcome::Forwarded, None));
        }
        assert_eq!(t.calls.len(), MAX_ROWS);
        assert_eq!(t.dropped, 3);
        assert_eq!((t.forwarded, t.refused), (MAX_ROWS as u64 + 2, 1));
        assert!(t.summary().ends_with("3 more not kept"));
        assert_eq!(method_name("GET"), "GET");
        assert_eq!(method_name("BREW"), "OTHER");
    }
}
