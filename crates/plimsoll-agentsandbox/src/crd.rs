//! What plimsolld knows about the agent-sandbox objects it reads and writes
//! (`extensions.agents.x-k8s.io/v1beta1`): the API resources, the claim it creates, and
//! how a claim's status is read. Objects are handled as JSON (`DynamicObject`), so a field
//! plimsolld does not use can never make a read fail.

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kube::api::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};

/// The API group of the agent-sandbox extensions.
pub const GROUP: &str = "extensions.agents.x-k8s.io";
/// The version plimsolld speaks (storage version since agent-sandbox v0.5.0).
pub const VERSION: &str = "v1beta1";

/// Label put on every claim plimsolld creates.
pub const MANAGED_BY_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "plimsolld");

/// Label the agent-sandbox controller stamps on every pod of a template; its value is
/// [`name_hash`] of the template's name. The controller's own NetworkPolicy selects it.
pub const TEMPLATE_REF_HASH_LABEL: &str = "agents.x-k8s.io/sandbox-template-ref-hash";

/// Claim `Ready` reasons after which the claim will never become Ready.
pub const TERMINAL_REASONS: [&str; 8] = [
    "TemplateNotFound",
    "WarmPoolNotFound",
    "InvalidMetadata",
    "EnvVarsInjectionRejected",
    "VolumeClaimTemplatesError",
    "ClaimExpired",
    "SandboxExpired",
    "AdoptionConflict",
];

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, kind), plural)
}

/// `SandboxTemplate`.
pub fn template_resource() -> ApiResource {
    resource("SandboxTemplate", "sandboxtemplates")
}

/// `SandboxWarmPool`.
pub fn warm_pool_resource() -> ApiResource {
    resource("SandboxWarmPool", "sandboxwarmpools")
}

/// `SandboxClaim`.
pub fn claim_resource() -> ApiResource {
    resource("SandboxClaim", "sandboxclaims")
}

/// The agent-sandbox controller's name hash: 32-bit FNV-1a of the name's bytes, as eight
/// lower-case hex digits.
pub fn name_hash(name: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

/// A fresh claim name: `plimsoll-` and 12 random hex digits. plimsolld names its claims
/// itself (no `generateName`) so it can delete one even when the create call's answer was
/// lost.
pub fn new_claim_name() -> String {
    let bytes: [u8; 6] = rand::random();
    format!("plimsoll-{}", hex::encode(bytes))
}

/// The claim plimsolld creates for one run: on `warm_pool`, expiring (and deleted by the
/// controller) at `expires` in case plimsolld dies before it deletes the claim itself.
pub fn claim_object(name: &str, namespace: &str, warm_pool: &str, expires: SystemTime) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "SandboxClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": { MANAGED_BY_LABEL.0: MANAGED_BY_LABEL.1 },
        },
        "spec": {
            "warmPoolRef": { "name": warm_pool },
            "lifecycle": {
                "shutdownTime": rfc3339(expires),
                "shutdownPolicy": "Delete",
            },
        },
    })
}

/// What a claim's status says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimState {
    /// Not Ready yet (the reason, if any).
    Pending(Option<String>),
    /// Ready, bound to this sandbox at this address.
    Ready {
        /// The Sandbox (and pod) name.
        sandbox: String,
        /// The pod address plimsolld dials.
        ip: IpAddr,
    },
    /// Will never become Ready (the reason and message).
    Failed(String),
}

/// Reads a claim's status: `Ready=True` with an address in `status.sandbox.podIPs` is
/// Ready (IPv4 preferred, IPv4-mapped IPv6 unwrapped); a terminal reason is Failed.
pub fn claim_state(claim: &Value) -> ClaimState {
    let status = &claim["status"];
    let ready = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"));
    let reason = ready.and_then(|c| c["reason"].as_str()).map(str::to_owned);
    let is_ready = ready.is_some_and(|c| c["status"] == "True");
    if !is_ready {
        if let Some(r) = reason.as_deref().filter(|r| TERMINAL_REASONS.contains(r)) {
            let msg = ready.and_then(|c| c["message"].as_str()).unwrap_or("");
            return ClaimState::Failed(if msg.is_empty() {
                r.to_owned()
            } else {
                format!("{r}: {msg}")
            });
        }
        return ClaimState::Pending(reason);
    }
    let ips: Vec<IpAddr> = status["sandbox"]["podIPs"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str())
                .filter_map(|s| s.parse::<IpAddr>().ok())
                .map(|ip| match ip {
                    IpAddr::V6(v6) => v6
                        .to_ipv4_mapped()
                        .map(IpAddr::V4)
                        .unwrap_or(IpAddr::V6(v6)),
                    v4 => v4,
                })
                .collect()
        })
        .unwrap_or_default();
    let ip = ips
        .iter()
        .find(|ip| ip.is_ipv4())
        .or_else(|| ips.first())
        .copied();
    match (ip, status["sandbox"]["name"].as_str()) {
        (Some(ip), name) => ClaimState::Ready {
            sandbox: name.unwrap_or("").to_owned(),
            ip,
        },
        (None, _) => ClaimState::Pending(Some("Ready without a pod address yet".into())),
    }
}

/// Formats a time as RFC 3339 UTC with seconds (`2026-09-01T12:00:00Z`).
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_hash_matches_the_controller() {
        // Values checked against the controller's NameHash (reference notes).
        assert_eq!(name_hash("plimsoll-sandboxd"), "ae1d591d");
        assert_eq!(name_hash("plimsoll-pool"), "5319ef12");
    }

    #[test]
    fn rfc3339_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_788_264_296);
        assert_eq!(rfc3339(t), "2026-09-01T12:04:56Z");
    }

    #[test]
    fn claim_names_are_valid_and_distinct() {
        let a = new_claim_name();
        assert!(crate::config::is_dns_label_or_subdomain(&a), "{a}");
        assert_eq!(a.len(), "plimsoll-".len() + 12);
        assert_ne!(a, new_claim_name());
    }

    #[test]
    fn the_claim_names_the_pool_and_expires() {
        let c = claim_object("plimsoll-1", "ns", "pool", UNIX_EPOCH);
        assert_eq!(c["spec"]["warmPoolRef"]["name"], "pool");
        assert_eq!(c["apiVersion"], "extensions.agents.x-k8s.io/v1beta1");
        assert_eq!(c["spec"]["lifecycle"]["shutdownPolicy"], "Delete");
        assert_eq!(
            c["spec"]["lifecycle"]["shutdownTime"],
            "1970-01-01T00:00:00Z"
        );
    }

    #[test]
    fn claim_status_reading() {
        let pending = json!({"status": {}});
        assert_eq!(claim_state(&pending), ClaimState::Pending(None));
        let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "SandboxNotReady"}]}});
        assert_eq!(
            claim_state(&not_ready),
            ClaimState::Pending(Some("SandboxNotReady".into()))
        );
        let failed = json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "WarmPoolNotFound", "message": "no pool x"}]}});
        assert_eq!(
            claim_state(&failed),
            ClaimState::Failed("WarmPoolNotFound: no pool x".into())
        );
        let ready = json!({"status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "sandbox": {"name": "pool-abc", "podIPs": ["fd00::7", "::ffff:10.0.0.7"]}}});
        assert_eq!(
            claim_state(&ready),
            ClaimState::Ready {
                sandbox: "pool-abc".into(),
                ip: "10.0.0.7".parse().unwrap()
            }
        );
        let ready_no_ip = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}], "sandbox": {"name": "x"}}});
        assert!(matches!(
            claim_state(&ready_no_ip),
            ClaimState::Pending(Some(_))
        ));
    }
}
