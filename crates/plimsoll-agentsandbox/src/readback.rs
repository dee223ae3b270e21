//! The startup read-back: what the SandboxTemplate, its warm pool and the NetworkPolicies
//! that select its pods actually say, compared with what the TLS channel needs. Every
//! difference is listed (each with a stable kind name), and any one refuses startup.
//!
//! This is a pure function of the objects as JSON, so the same code checks the live cluster
//! at startup and the shipped `k8s/` manifests in the tests.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Component, Path};

use k8s_openapi::api::core::v1::{Container, EnvVar, PodSecurityContext, PodTemplateSpec, Volume};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use plimsoll_core::Tier;
use serde_json::Value;

use crate::crd::{name_hash, TEMPLATE_REF_HASH_LABEL};

/// The container command the template must run: the TLS terminator.
pub const TERMINATOR: &str = "/usr/local/bin/plimsoll-sandboxd-tls";
/// Where the TLS Secret must be mounted, read-only.
pub const SECRET_MOUNT: &str = "/etc/plimsoll/sandboxd-tls";
/// The Secret volume's mode: 0400 (256 in JSON).
pub const SECRET_MODE: i32 = 0o400;
/// The one port ingress may reach: the terminator's TLS listener.
pub const TLS_PORT: i32 = 9090;
/// sandboxd's flags that must appear, literally, once each.
pub const REQUIRED_FLAGS: [&str; 2] = plimsoll_tls::supervise::REQUIRED_FLAGS;
/// The flag that makes sandboxd run the code as a user of its own (`--run-as=UID:GID`).
pub const RUN_AS_FLAG: &str = "--run-as";
/// The capabilities the terminator's container may add after dropping `ALL`: what sandboxd,
/// as uid 0, needs to hand a run its files, start it as the run's user, kill it and clean up.
pub const ALLOWED_CAPABILITIES: [&str; 6] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "KILL",
    "SETGID",
    "SETUID",
];

/// cert-manager's CSI driver: it makes each pod's key on its node and has cert-manager issue
/// a certificate for it (`SANDBOX_AGENTSANDBOX_POD_IDENTITY=ip`).
pub const CSI_DRIVER: &str = "csi.cert-manager.io";
/// The prefix of the CSI driver's volume attributes.
pub const CSI_ATTRIBUTE_PREFIX: &str = "csi.cert-manager.io/";
/// The per-pod certificate's IP SAN, exactly as written in the template: the pod's own
/// address, which plimsolld dials and checks.
pub const POD_IP_SANS: &str = "${POD_IP}";
/// The longest a per-pod certificate may be issued for, in seconds (24 hours): a key or
/// certificate taken from a pod is worthless within a day.
pub const MAX_POD_CERT_SECS: u64 = 24 * 3600;
/// The terminator's certificate directory variable; in per-pod mode it must be unset or
/// [`SECRET_MOUNT`], where the CSI volume is.
pub const TLS_DIR_VAR: &str = plimsoll_tls::terminator::env::DIR;
/// The terminator's variable naming the CA file a client certificate must chain to (the
/// same name as `plimsoll_tls::CLIENT_CA_VAR`).
pub const CLIENT_CA_VAR: &str = plimsoll_tls::CLIENT_CA_VAR;

/// What kind of difference was found. The names are stable: they appear in startup
/// errors and operators may search for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DriftKind {
    /// The template (or warm pool) could not be read as an agent-sandbox object.
    Template,
    /// No container runs the terminator as its command.
    Command,
    /// `--listen-host=127.0.0.1` is missing or different.
    ListenHost,
    /// `--grpc-port=9091` is missing or different.
    GrpcPort,
    /// sandboxd was told to serve a Unix socket, or to accept calls without a token.
    SandboxdFlags,
    /// Nothing is mounted at `/etc/plimsoll/sandboxd-tls`, or it is a `subPath` mount.
    SecretMount,
    /// The mount is not read-only.
    ReadOnly,
    /// The mounted volume is not a Secret volume.
    SecretVolume,
    /// The Secret volume's mode is not 0400.
    DefaultMode,
    /// Ingress to the pods is allowed to something other than TCP 9090.
    NetworkPolicy,
    /// The pod shares the node's network, PID or IPC namespace.
    HostNamespace,
    /// A container is privileged or may gain privileges, or keeps capabilities beyond
    /// [`ALLOWED_CAPABILITIES`].
    Privileged,
    /// The code would share a user or group with sandboxd and the terminator (`--run-as`
    /// missing, or the pod's `runAsUser`/`fsGroup` equal to the run's), or sandboxd could
    /// not change users (`runAsNonRoot`, a non-zero `runAsUser`).
    RunAs,
    /// The warm pool does not use the template.
    WarmPool,
    /// Sessions are on and sandboxd does not run with `--session`.
    Session,
    /// Per-pod identity: the volume at `/etc/plimsoll/sandboxd-tls` is not a CSI volume of
    /// [`CSI_DRIVER`].
    CsiVolume,
    /// Per-pod identity: the CSI volume's `ip-sans` is not exactly [`POD_IP_SANS`].
    IpSans,
    /// Per-pod identity: no `issuer-name`, or an `issuer-kind` other than `Issuer` or
    /// `ClusterIssuer`.
    Issuer,
    /// Per-pod identity: `certificate-file`/`privatekey-file` name other files than the
    /// `tls.crt`/`tls.key` the terminator reads.
    CertFiles,
    /// Per-pod identity: `fs-group` is set, which would make the key readable to a group.
    FsGroup,
    /// `key-usages` asks for `client auth`: a pod's certificate could then pass as
    /// plimsolld's client certificate wherever the two CAs are one.
    KeyUsages,
    /// Per-pod identity: `is-ca` is not false.
    IsCa,
    /// Per-pod identity: `pkcs12-enable` is not false.
    Pkcs12,
    /// Per-pod identity: `duration` is missing, not a duration, or longer than 24 hours.
    CertDuration,
    /// Per-pod identity: `reuse-private-key` is not false.
    ReusePrivateKey,
    /// Per-pod identity: the terminator is pointed at another certificate directory.
    TlsDir,
    /// The terminator's client CA (`PLIMSOLL_SANDBOXD_CLIENT_CA`) is missing or not a file
    /// of a read-only ConfigMap, Secret or projected mount, or is set while plimsolld has no
    /// client certificate.
    ClientCa,
}

impl DriftKind {
    /// The stable name shown in brackets in startup errors.
    pub fn as_str(self) -> &'static str {
        match self {
            DriftKind::Template => "template",
            DriftKind::Command => "command",
            DriftKind::ListenHost => "listen-host",
            DriftKind::GrpcPort => "grpc-port",
            DriftKind::SandboxdFlags => "sandboxd-flags",
            DriftKind::SecretMount => "secret-mount",
            DriftKind::ReadOnly => "read-only",
            DriftKind::SecretVolume => "secret-volume",
            DriftKind::DefaultMode => "default-mode",
            DriftKind::NetworkPolicy => "network-policy",
            DriftKind::HostNamespace => "host-namespace",
            DriftKind::Privileged => "privileged",
            DriftKind::RunAs => "run-as",
            DriftKind::WarmPool => "warm-pool",
            DriftKind::Session => "session",
            DriftKind::CsiVolume => "csi-volume",
            DriftKind::IpSans => "ip-sans",
            DriftKind::Issuer => "issuer",
            DriftKind::CertFiles => "cert-files",
            DriftKind::FsGroup => "fs-group",
            DriftKind::KeyUsages => "key-usages",
            DriftKind::IsCa => "is-ca",
            DriftKind::Pkcs12 => "pkcs12",
            DriftKind::CertDuration => "cert-duration",
            DriftKind::ReusePrivateKey => "reuse-private-key",
            DriftKind::TlsDir => "tls-dir",
            DriftKind::ClientCa => "client-ca",
        }
    }
}

impl fmt::Display for DriftKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One difference between what was read back and what is required.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    /// Its kind.
    pub kind: DriftKind,
    /// What was found and what is required.
    pub message: String,
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.kind, self.message)
    }
}

fn drift(kind: DriftKind, message: impl Into<String>) -> Drift {
    Drift {
        kind,
        message: message.into(),
    }
}

/// The result of reading a template back.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadBack {
    /// Every difference (empty means the template passes).
    pub drifts: Vec<Drift>,
    /// `spec.podTemplate.spec.runtimeClassName` as read.
    pub runtime_class: Option<String>,
    /// The tier that runtime class gives.
    pub tier: Tier,
    /// The terminator container's image, as written in the template.
    pub image: Option<String>,
    /// The labels the template's pods carry (the template's own plus the controller's
    /// template hash), which NetworkPolicies were matched against.
    pub pod_labels: BTreeMap<String, String>,
}

impl ReadBack {
    /// Whether the kind was found.
    pub fn has(&self, kind: DriftKind) -> bool {
        self.drifts.iter().any(|d| d.kind == kind)
    }
}

/// The tier a `runtimeClassName` gives: gVisor (`gvisor…`, `runsc…`) is `kernel`, Kata
/// (`kata…`) is `vm`, none or `runc` is `container`. Any other name is stated as
/// `container`: a pod is at least a container, and plimsolld never claims a tier it cannot
/// name the evidence for.
pub fn tier_of_runtime_class(class: Option<&str>) -> Tier {
    let Some(c) = class.map(str::to_ascii_lowercase) else {
        return Tier::Container;
    };
    if c.contains("gvisor") || c.starts_with("runsc") {
        Tier::Kernel
    } else if c.contains("kata") {
        Tier::Vm
    } else {
        Tier::Container
    }
}

/// What plimsolld's channel to the pods is configured to prove, which decides what the
/// template must carry: a per-pod certificate volume (cert-manager's CSI driver) instead of
/// the shared Secret, and the terminator's client CA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Channel {
    /// `SANDBOX_AGENTSANDBOX_POD_IDENTITY`.
    pub pod_identity: plimsoll_tls::PodIdentity,
    /// plimsolld presents a client certificate (`SANDBOX_AGENTSANDBOX_CLIENT_CERT_FILE`),
    /// so the terminator must require one (`PLIMSOLL_SANDBOXD_CLIENT_CA`).
    pub client_certs: bool,
}

/// Reads a template back against the requirements of the default channel (one shared
/// certificate, no client certificates): [`read_back_with`] with [`Channel::default`].
/// `warm_pool` is the pool's name and object (checked to use this template); `policies` are
/// the NetworkPolicies of the template's namespace (those selecting its pods are checked).
pub fn read_back(
    template_name: &str,
    template: &Value,
    warm_pool: Option<(&str, &Value)>,
    policies: &[Value],
) -> ReadBack {
    read_back_with(
        template_name,
        template,
        warm_pool,
        policies,
        &Channel::default(),
    )
}

/// Reads a template back against the requirements of `channel`: with
/// [`plimsoll_tls::PodIdentity::Ip`] the certificate directory must be a cert-manager CSI
/// volume issuing each pod a short-lived certificate for its own IP; with `client_certs`
/// the terminator must require a client certificate from a CA file of its own.
pub fn read_back_with(
    template_name: &str,
    template: &Value,
    warm_pool: Option<(&str, &Value)>,
    policies: &[Value],
    channel: &Channel,
) -> ReadBack {
    let mut out = ReadBack {
        drifts: Vec::new(),
        runtime_class: None,
        tier: Tier::Container,
        image: None,
        pod_labels: BTreeMap::new(),
    };
    if let Some((pool_name, pool)) = warm_pool {
        match pool["spec"]["sandboxTemplateRef"]["name"].as_str() {
            Some(t) if t == template_name => {}
            other => out.drifts.push(drift(
                DriftKind::WarmPool,
                format!(
                    "SandboxWarmPool {pool_name} uses template {}, not {template_name}; set its spec.sandboxTemplateRef.name to {template_name}",
                    other.map_or("(none)".to_owned(), |t| format!("{t:?}"))
                ),
            )),
        }
    }
    let pod: PodTemplateSpec = match template["spec"]["podTemplate"].clone() {
        Value::Null => {
            out.drifts.push(drift(
                DriftKind::Template,
                format!("SandboxTemplate {template_name} has no spec.podTemplate"),
            ));
            return out;
        }
        v => match serde_json::from_value(v) {
            Ok(p) => p,
            Err(e) => {
                out.drifts.push(drift(
                    DriftKind::Template,
                    format!("SandboxTemplate {template_name}: spec.podTemplate is not a valid pod template: {e}"),
                ));
                return out;
            }
        },
    };
    out.pod_labels = pod
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    out.pod_labels
        .insert(TEMPLATE_REF_HASH_LABEL.to_owned(), name_hash(template_name));
    let spec = pod.spec.unwrap_or_default();
    out.runtime_class = spec.runtime_class_name.clone();
    out.tier = tier_of_runtime_class(out.runtime_class.as_deref());

    if spec.share_process_namespace == Some(true) {
        out.drifts.push(drift(
            DriftKind::HostNamespace,
            "the pod sets shareProcessNamespace: true; the code would see every container's processes (and, as root, their /proc files); remove it",
        ));
    }
    for (flag, on) in [
        ("hostNetwork", spec.host_network),
        ("hostPID", spec.host_pid),
        ("hostIPC", spec.host_ipc),
    ] {
        if on == Some(true) {
            out.drifts.push(drift(
                DriftKind::HostNamespace,
                format!("the pod sets {flag}: true; a sandbox pod must not share the node's namespaces (remove it)"),
            ));
        }
    }
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        if let Some(sc) = &c.security_context {
            if sc.privileged == Some(true) {
                out.drifts.push(drift(
                    DriftKind::Privileged,
                    format!(
                        "container {} is privileged; remove securityContext.privileged",
                        c.name
                    ),
                ));
            }
        }
    }

    let terminators: Vec<&Container> = spec
        .containers
        .iter()
        .filter(|c| argv(c).first().map(String::as_str) == Some(TERMINATOR))
        .collect();
    if terminators.is_empty() {
        let found: Vec<String> = spec
            .containers
            .iter()
            .map(|c| match argv(c).first() {
                Some(cmd) => format!("{}: {cmd}", c.name),
                None => format!("{}: (no command; the image's entrypoint)", c.name),
            })
            .collect();
        out.drifts.push(drift(
            DriftKind::Command,
            format!(
                "no container's command is {TERMINATOR} (found {}); set command: [{TERMINATOR}] followed by sandboxd's flags",
                if found.is_empty() { "no containers".to_owned() } else { found.join(", ") }
            ),
        ));
    }
    for c in &terminators {
        out.image = out.image.take().or_else(|| c.image.clone());
        let args: Vec<String> = argv(c).into_iter().skip(1).collect();
        out.drifts.extend(flag_drifts(&c.name, &args));
        let volumes = spec.volumes.clone().unwrap_or_default();
        out.drifts
            .extend(mount_drifts(c, &volumes, channel.pod_identity));
        if channel.pod_identity == plimsoll_tls::PodIdentity::Ip {
            out.drifts.extend(tls_dir_drifts(c));
        }
        out.drifts
            .extend(client_ca_drifts(c, &volumes, channel.client_certs));
        out.drifts
            .extend(user_drifts(c, &args, spec.security_context.as_ref()));
    }

    let ports = named_ports(&spec.containers);
    let managed = template["spec"]["networkPolicyManagement"].as_str() != Some("Unmanaged");
    if managed {
        // The controller writes the template's own policy (or, without one, its default,
        // which admits the sandbox router on every port) to `<template>-network-policy`.
        match template["spec"].get("networkPolicy") {
            None | Some(Value::Null) => out.drifts.push(drift(
                DriftKind::NetworkPolicy,
                "networkPolicyManagement is Managed and the template states no spec.networkPolicy, so the controller's default policy applies, which allows ingress on every port; state ingress to TCP 9090 only (or set Unmanaged and ship your own NetworkPolicy)",
            )),
            Some(np) => {
                let source = format!("SandboxTemplate {template_name} spec.networkPolicy");
                match np.get("egress") {
                    Some(Value::Array(rules)) if rules.is_empty() => {}
                    _ => out.drifts.push(drift(
                        DriftKind::NetworkPolicy,
                        format!("{source} does not state egress: [] (no egress at all); code in a sandbox must reach nothing"),
                    )),
                }
                match serde_json::from_value::<Option<Vec<NetworkPolicyIngressRule>>>(np["ingress"].clone()) {
                    Ok(rules) => out.drifts.extend(ingress_drifts(
                        &source,
                        rules.as_deref().unwrap_or_default(),
                        &ports,
                        &out.pod_labels,
                    )),
                    Err(e) => out.drifts.push(drift(
                        DriftKind::NetworkPolicy,
                        format!("SandboxTemplate {template_name} spec.networkPolicy.ingress is not valid: {e}"),
                    )),
                }
            }
        }
    }
    let mut selecting = 0;
    let mut egress_denied = false;
    for p in policies {
        let np: NetworkPolicy = match serde_json::from_value(p.clone()) {
            Ok(np) => np,
            Err(e) => {
                out.drifts.push(drift(
                    DriftKind::NetworkPolicy,
                    format!(
                        "NetworkPolicy {} cannot be read: {e}",
                        p["metadata"]["name"].as_str().unwrap_or("?")
                    ),
                ));
                continue;
            }
        };
        let name = np.metadata.name.clone().unwrap_or_default();
        let Some(spec) = np.spec else { continue };
        let selector = spec.pod_selector.clone().unwrap_or_default();
        if !selects(&selector, &out.pod_labels) {
            continue;
        }
        // Without policyTypes, a policy governs egress only when it has egress rules.
        let egress_rules = spec.egress.as_deref().unwrap_or_default();
        let governs_egress = match &spec.policy_types {
            Some(t) => t.iter().any(|t| t == "Egress"),
            None => !egress_rules.is_empty(),
        };
        if governs_egress {
            if egress_rules.is_empty() {
                egress_denied = true;
            }
            out.drifts.extend(egress_drifts(
                &format!("NetworkPolicy {name}"),
                egress_rules,
            ));
        }
        // Without policyTypes, a policy always governs ingress.
        let ingress = spec
            .policy_types
            .as_ref()
            .is_none_or(|t| t.iter().any(|t| t == "Ingress"));
        if !ingress {
            continue;
        }
        selecting += 1;
        out.drifts.extend(ingress_drifts(
            &format!("NetworkPolicy {name}"),
            spec.ingress.as_deref().unwrap_or_default(),
            &ports,
            &out.pod_labels,
        ));
    }
    if !managed && !egress_denied {
        out.drifts.push(drift(
            DriftKind::NetworkPolicy,
            "no NetworkPolicy selecting the template's pods denies their egress, so code in a sandbox can reach the cluster (another pod's sandboxd among it); add policyTypes: [Ingress, Egress] with egress: []",
        ));
    }
    if selecting == 0 {
        let labels: Vec<String> = out
            .pod_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        out.drifts.push(drift(
            DriftKind::NetworkPolicy,
            format!(
                "no NetworkPolicy with policy type Ingress selects the template's pods (labels {}), so every port is open to the cluster; apply one that allows ingress only to TCP 9090",
                labels.join(",")
            ),
        ));
    }
    out
}

/// The container's full argument vector: `command` then `args`.
fn argv(c: &Container) -> Vec<String> {
    c.command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .cloned()
        .collect()
}

/// The flag that makes sandboxd keep one session for every call (sessions need it).
pub const SESSION_FLAG: &str = "--session";

/// With sessions on, every terminator container's sandboxd must run with `--session`: a
/// session's pod serves all its calls from one working directory, and a one-shot run's pod
/// (used once, then deleted) is unaffected by it.
pub fn session_drifts(template: &Value) -> Vec<Drift> {
    let containers = template["spec"]["podTemplate"]["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    containers
        .iter()
        .filter(|c| {
            c["command"]
                .as_array()
                .and_then(|a| a.first())
                .and_then(Value::as_str)
                == Some(TERMINATOR)
        })
        .filter(|c| {
            let argv = [&c["command"], &c["args"]];
            !argv
                .iter()
                .filter_map(|v| v.as_array())
                .flatten()
                .any(|v| v.as_str() == Some(SESSION_FLAG))
        })
        .map(|c| {
            drift(
                DriftKind::Session,
                format!(
                    "container {}: sessions are on (SANDBOX_MAX_SESSIONS > 0) and sandboxd's arguments lack {SESSION_FLAG}; add it, or set SANDBOX_MAX_SESSIONS=0",
                    c["name"].as_str().unwrap_or("?")
                ),
            )
        })
        .collect()
}

/// sandboxd's flags after the terminator, checked with the terminator's own rules (each
/// required flag once, literally), every difference reported.
pub fn flag_drifts(container: &str, args: &[String]) -> Vec<Drift> {
    let mut out = Vec::new();
    for (flag, required, kind) in [
        ("--listen-host", REQUIRED_FLAGS[0], DriftKind::ListenHost),
        ("--grpc-port", REQUIRED_FLAGS[1], DriftKind::GrpcPort),
    ] {
        let mentions: Vec<&String> = args
            .iter()
            .filter(|a| *a == flag || a.starts_with(&format!("{flag}=")))
            .collect();
        let problem = match mentions.as_slice() {
            [only] if only.as_str() == required => continue,
            [] => "is missing".to_owned(),
            [only] => format!("is {only:?}"),
            many => format!("is given {} times", many.len()),
        };
        out.push(drift(
            kind,
            format!("container {container}: sandboxd's {flag} {problem}; the arguments must include {required} exactly once"),
        ));
    }
    for (flag, why) in [
        (
            "--unix-socket",
            "behind the terminator sandboxd serves TCP on 127.0.0.1:9091",
        ),
        (
            "--insecure-no-token",
            "sandboxd must require the token (--token-file)",
        ),
        (
            plimsoll_tls::supervise::TERMINATOR_SOCKET_FLAG,
            "the terminator gives sandboxd its socket itself, in a directory of its own, when PLIMSOLL_SANDBOXD_CLIENT_CA is set",
        ),
    ] {
        if let Some(a) = args
            .iter()
            .find(|a| *a == flag || a.starts_with(&format!("{flag}=")))
        {
            out.push(drift(
                DriftKind::SandboxdFlags,
                format!("container {container}: remove {a:?}: {why}"),
            ));
        }
    }
    out
}

fn mount_drifts(
    c: &Container,
    volumes: &[Volume],
    identity: plimsoll_tls::PodIdentity,
) -> Vec<Drift> {
    let per_pod = identity == plimsoll_tls::PodIdentity::Ip;
    let mut out = Vec::new();
    let mounts: Vec<_> = c
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| m.mount_path.trim_end_matches('/') == SECRET_MOUNT)
        .collect();
    let Some(m) = mounts.first() else {
        let what = if per_pod {
            "the cert-manager CSI volume (SANDBOX_AGENTSANDBOX_POD_IDENTITY=ip)"
        } else {
            "the kubernetes.io/tls Secret"
        };
        out.push(drift(
            DriftKind::SecretMount,
            format!("container {}: nothing is mounted at {SECRET_MOUNT}; mount {what} there, readOnly: true", c.name),
        ));
        return out;
    };
    if m.read_only != Some(true) {
        out.push(drift(
            DriftKind::ReadOnly,
            format!(
                "container {}: the mount at {SECRET_MOUNT} is not read-only; set readOnly: true",
                c.name
            ),
        ));
    }
    if m.sub_path.as_deref().is_some_and(|s| !s.is_empty())
        || m.sub_path_expr.as_deref().is_some_and(|s| !s.is_empty())
    {
        let what = if per_pod {
            "renewed certificate"
        } else {
            "rotated Secret"
        };
        out.push(drift(
            DriftKind::SecretMount,
            format!("container {}: the mount at {SECRET_MOUNT} uses subPath, which never sees a {what}; mount the whole volume", c.name),
        ));
    }
    let Some(v) = volumes.iter().find(|v| v.name == m.name) else {
        out.push(drift(
            if per_pod { DriftKind::CsiVolume } else { DriftKind::SecretVolume },
            format!("container {}: the mount at {SECRET_MOUNT} names volume {:?}, which the pod does not define", c.name, m.name),
        ));
        return out;
    };
    if per_pod {
        out.extend(csi_drifts(v));
        return out;
    }
    if let Some(csi) = &v.csi {
        out.push(drift(
            DriftKind::SecretVolume,
            format!("volume {} mounted at {SECRET_MOUNT} is a CSI volume (driver {:?}), which gives each pod a certificate of its own, and plimsolld is in shared mode, where every pod serves one Secret's certificate; set SANDBOX_AGENTSANDBOX_POD_IDENTITY=ip for per-pod certificates, or use secret: {{secretName: …}}", v.name, csi.driver),
        ));
        return out;
    }
    let Some(secret) = &v.secret else {
        out.push(drift(
            DriftKind::SecretVolume,
            format!("volume {} mounted at {SECRET_MOUNT} is not a Secret volume; use secret: {{secretName: …}}", v.name),
        ));
        return out;
    };
    if secret.secret_name.as_deref().unwrap_or("").is_empty() {
        out.push(drift(
            DriftKind::SecretVolume,
            format!("volume {} names no secretName", v.name),
        ));
    }
    match secret.default_mode {
        Some(SECRET_MODE) => {}
        Some(mode) => out.push(drift(
            DriftKind::DefaultMode,
            format!("volume {}: defaultMode is {mode:#o} ({mode} decimal); it must be 0400 (256 decimal in JSON)", v.name),
        )),
        None => out.push(drift(
            DriftKind::DefaultMode,
            format!("volume {}: defaultMode is not set (Kubernetes then uses 0644); set defaultMode: 256 (octal 0400)", v.name),
        )),
    }
    for item in secret.items.iter().flatten() {
        if let Some(mode) = item.mode.filter(|m| *m != SECRET_MODE) {
            out.push(drift(
                DriftKind::DefaultMode,
                format!(
                    "volume {}: item {} has mode {mode:#o}; it must be 0400 or unset",
                    v.name, item.key
                ),
            ));
        }
    }
    out
}

/// What kind of volume this is (`secret`, `csi`, `emptyDir`, …), for messages.
fn volume_kind(v: &Volume) -> String {
    match serde_json::to_value(v) {
        Ok(Value::Object(o)) => o
            .keys()
            .find(|k| *k != "name")
            .cloned()
            .unwrap_or_else(|| "empty".to_owned()),
        _ => "unknown".to_owned(),
    }
}

/// The per-pod certificate volume: cert-manager's CSI driver, read-only, issuing for the
/// pod's own IP from a named issuer, for at most a day, a fresh key each time, written as
/// `tls.crt`/`tls.key` readable only to root (no `fs-group`), never a CA.
fn csi_drifts(v: &Volume) -> Vec<Drift> {
    let name = &v.name;
    let Some(csi) = &v.csi else {
        return vec![drift(
            DriftKind::CsiVolume,
            format!("volume {name} mounted at {SECRET_MOUNT} is a {} volume; with SANDBOX_AGENTSANDBOX_POD_IDENTITY=ip each pod needs its own certificate for its IP: use csi: {{driver: {CSI_DRIVER}, readOnly: true, volumeAttributes: {{csi.cert-manager.io/issuer-name: …, csi.cert-manager.io/ip-sans: \"{POD_IP_SANS}\", csi.cert-manager.io/duration: 24h}}}}", volume_kind(v)),
        )];
    };
    let mut out = Vec::new();
    if csi.driver != CSI_DRIVER {
        out.push(drift(
            DriftKind::CsiVolume,
            format!("volume {name}: the CSI driver is {:?}; it must be {CSI_DRIVER} (cert-manager's csi-driver, which makes each pod's key on its node and has it certified for the pod's IP)", csi.driver),
        ));
    }
    if csi.read_only != Some(true) {
        out.push(drift(
            DriftKind::ReadOnly,
            format!(
                "volume {name}: the CSI volume's readOnly is {}; set csi.readOnly: true",
                csi.read_only
                    .map_or("not set".to_owned(), |r| r.to_string())
            ),
        ));
    }
    let attrs = csi.volume_attributes.clone().unwrap_or_default();
    // The driver treats an empty value as unset (it fills in its default).
    let get = |key: &str| {
        attrs
            .get(&format!("{CSI_ATTRIBUTE_PREFIX}{key}"))
            .filter(|v| !v.is_empty())
            .map(String::as_str)
    };
    let attr = |key: &str| format!("volume {name}: {CSI_ATTRIBUTE_PREFIX}{key}");
    match get("ip-sans") {
        Some(POD_IP_SANS) => {}
        found => out.push(drift(
            DriftKind::IpSans,
            format!(
                "{} is {}; it must be exactly \"{POD_IP_SANS}\" (the pod's own address, the one plimsolld dials and checks in the certificate)",
                attr("ip-sans"),
                found.map_or("not set".to_owned(), |v| format!("{v:?}"))
            ),
        )),
    }
    if get("issuer-name").is_none_or(|v| v.trim().is_empty()) {
        out.push(drift(
            DriftKind::Issuer,
            format!("{} is not set; name the cert-manager Issuer whose CA plimsolld trusts (SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE)", attr("issuer-name")),
        ));
    }
    if let Some(kind) = get("issuer-kind").filter(|k| !["Issuer", "ClusterIssuer"].contains(k)) {
        out.push(drift(
            DriftKind::Issuer,
            format!(
                "{} is {kind:?}; it must be Issuer (the default) or ClusterIssuer",
                attr("issuer-kind")
            ),
        ));
    }
    if let Some(usages) = get("key-usages").filter(|u| {
        u.split(',')
            .any(|x| x.trim().eq_ignore_ascii_case("client auth"))
    }) {
        out.push(drift(
            DriftKind::KeyUsages,
            format!(
                "{} is {usages:?}; a pod's certificate must not be usable as a client certificate (it could pass as plimsolld's where the two CAs are one): remove client auth",
                attr("key-usages")
            ),
        ));
    }
    for (key, file) in [
        ("certificate-file", "tls.crt"),
        ("privatekey-file", "tls.key"),
    ] {
        if let Some(found) = get(key).filter(|f| *f != file) {
            out.push(drift(
                DriftKind::CertFiles,
                format!(
                    "{} is {found:?}; the terminator reads {file}: remove it or set it to {file}",
                    attr(key)
                ),
            ));
        }
    }
    // Strict: any fs-group at all, even empty.
    if let Some(group) = attrs.get(&format!("{CSI_ATTRIBUTE_PREFIX}fs-group")) {
        out.push(drift(
            DriftKind::FsGroup,
            format!("{} is {group:?}, which makes the key readable to that group, and the code runs as a user and group of its own (--run-as) that must never read it; remove it (the driver then writes the files 0440, owned by root)", attr("fs-group")),
        ));
    }
    for (key, kind, why) in [
        (
            "is-ca",
            DriftKind::IsCa,
            "a pod's certificate must not be a CA (its key could certify any address)",
        ),
        (
            "pkcs12-enable",
            DriftKind::Pkcs12,
            "the terminator reads PEM files, and a keystore is one more copy of the key",
        ),
        (
            "reuse-private-key",
            DriftKind::ReusePrivateKey,
            "every renewal must make a new key",
        ),
    ] {
        if let Some(found) = get(key).filter(|v| *v != "false") {
            out.push(drift(
                kind,
                format!(
                    "{} is {found:?}; {why}: remove it or set \"false\"",
                    attr(key)
                ),
            ));
        }
    }
    let max_hours = MAX_POD_CERT_SECS / 3600;
    let problem = match get("duration") {
        None => Some(format!("is not set, so cert-manager issues for 90 days (2160h); set it to at most {max_hours}h")),
        Some(d) => match parse_go_duration(d) {
            None => Some(format!("is {d:?}, which is not a duration (write it as Go does: 24h, 1h30m, 90m, 3600s)")),
            Some(ns) if ns <= 0 => Some(format!("is {d:?}; it must be positive and at most {max_hours}h")),
            Some(ns) if ns > i128::from(MAX_POD_CERT_SECS) * 1_000_000_000 => Some(format!(
                "is {d:?} ({:.1} hours); it must be at most {max_hours}h, so a certificate taken from a pod is worthless within a day",
                ns as f64 / 3.6e12
            )),
            Some(_) => None,
        },
    };
    if let Some(problem) = problem {
        out.push(drift(
            DriftKind::CertDuration,
            format!("{} {problem}", attr("duration")),
        ));
    }
    out
}

/// A Go duration (`time.ParseDuration`: `24h`, `1h30m`, `1.5h`, `90m`, `3600s`, `300ms`, an
/// optional sign, `0`), in nanoseconds; `None` when it is not one.
pub fn parse_go_duration(s: &str) -> Option<i128> {
    let (negative, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let digits = |r: &str| r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let (whole, r) = rest.split_at(digits(rest));
        let (fraction, r) = match r.strip_prefix('.') {
            Some(r) => r.split_at(digits(r)),
            None => ("", r),
        };
        if whole.is_empty() && fraction.is_empty() {
            return None;
        }
        let (unit, r) = r.split_at(
            r.find(|c: char| c == '.' || c.is_ascii_digit())
                .unwrap_or(r.len()),
        );
        let scale: i128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            _ => return None,
        };
        let mut value = if whole.is_empty() {
            0
        } else {
            whole.parse::<i128>().ok()?.checked_mul(scale)?
        };
        // Nanoseconds are the finest unit: further digits cannot count.
        let fraction = &fraction[..fraction.len().min(18)];
        if !fraction.is_empty() {
            let f: i128 = fraction.parse().ok()?;
            value = value.checked_add(f * scale / 10i128.pow(fraction.len() as u32))?;
        }
        total = total.checked_add(value)?;
        rest = r;
    }
    Some(if negative { -total } else { total })
}

/// The container's entries for one variable.
fn env_entries<'a>(c: &'a Container, name: &str) -> Vec<&'a EnvVar> {
    c.env.iter().flatten().filter(|e| e.name == name).collect()
}

/// Per-pod identity: the terminator must read the CSI volume's directory (the default).
fn tls_dir_drifts(c: &Container) -> Vec<Drift> {
    env_entries(c, TLS_DIR_VAR)
        .into_iter()
        .filter_map(|e| {
            let found = match (&e.value_from, e.value.as_deref()) {
                (Some(_), _) => "set from valueFrom".to_owned(),
                (None, Some(v)) if Path::new(v) == Path::new(SECRET_MOUNT) => return None,
                (None, v) => format!("{:?}", v.unwrap_or("")),
            };
            Some(drift(
                DriftKind::TlsDir,
                format!("container {}: {TLS_DIR_VAR} is {found}, so the terminator would not serve the pod's own certificate mounted at {SECRET_MOUNT}; remove it (the default is {SECRET_MOUNT})", c.name),
            ))
        })
        .collect()
}

/// With client certificates, the terminator must be given a CA file to check them against
/// (`PLIMSOLL_SANDBOXD_CLIENT_CA`): a literal absolute path to a file of a read-only
/// ConfigMap, Secret or projected mount of its own, never the certificate directory, whose
/// `ca.crt` is the CA of every pod's certificate. Without them, the template must not set it.
fn client_ca_drifts(c: &Container, volumes: &[Volume], client_certs: bool) -> Vec<Drift> {
    let bad = |problem: String| {
        vec![drift(
            DriftKind::ClientCa,
            format!("container {}: {problem}", c.name),
        )]
    };
    let entries = env_entries(c, CLIENT_CA_VAR);
    if !client_certs {
        if entries.is_empty() {
            return Vec::new();
        }
        return bad(format!("{CLIENT_CA_VAR} is set, so the pods require a client certificate, and plimsolld has none configured; set SANDBOX_AGENTSANDBOX_CLIENT_CERT_FILE and SANDBOX_AGENTSANDBOX_CLIENT_KEY_FILE, or remove {CLIENT_CA_VAR} from the template"));
    }
    let need = format!("set {CLIENT_CA_VAR} to a file of a read-only ConfigMap mount, e.g. value: /etc/plimsoll/sandboxd-client-ca/ca.crt with the ConfigMap plimsoll-sandboxd-client-ca mounted there, readOnly: true");
    let e = match entries.as_slice() {
        [] => return bad(format!("plimsolld presents a client certificate (SANDBOX_AGENTSANDBOX_CLIENT_CERT_FILE) and the terminator's env has no {CLIENT_CA_VAR}, so the pods would not ask for one; {need}")),
        [one] => *one,
        many => return bad(format!("{CLIENT_CA_VAR} is given {} times; give it once", many.len())),
    };
    if e.value_from.is_some() {
        return bad(format!(
            "{CLIENT_CA_VAR} is set from valueFrom, which the read-back cannot check; {need}"
        ));
    }
    let path = e.value.as_deref().unwrap_or("");
    if !path.starts_with('/')
        || Path::new(path)
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return bad(format!(
            "{CLIENT_CA_VAR} is {path:?}, not an absolute path without . or ..; {need}"
        ));
    }
    if Path::new(path).starts_with(SECRET_MOUNT) {
        return bad(format!("{CLIENT_CA_VAR} is {path:?}, in {SECRET_MOUNT}, the pod's own certificate directory, whose CA is every pod's; trusting it for clients would let pods in; keep the client CA in a mount of its own: {need}"));
    }
    // The deepest mount holding the file is where it comes from.
    let Some(m) = c
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| {
            Path::new(path)
                .strip_prefix(&m.mount_path)
                .is_ok_and(|rest| rest.components().next().is_some())
        })
        .max_by_key(|m| Path::new(&m.mount_path).components().count())
    else {
        return bad(format!("{CLIENT_CA_VAR} is {path:?}, which lies in no volume mount of the container, so its contents cannot be read back; {need}"));
    };
    let mut out = Vec::new();
    let mp = &m.mount_path;
    if m.read_only != Some(true) {
        out.extend(bad(format!("the mount at {mp} holding {CLIENT_CA_VAR} ({path}) is not read-only; set readOnly: true")));
    }
    if m.sub_path.as_deref().is_some_and(|s| !s.is_empty())
        || m.sub_path_expr.as_deref().is_some_and(|s| !s.is_empty())
    {
        out.extend(bad(format!("the mount at {mp} holding {CLIENT_CA_VAR} uses subPath, which never sees a changed CA; mount the whole volume")));
    }
    let tls_volume = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|t| Path::new(&t.mount_path) == Path::new(SECRET_MOUNT))
        .map(|t| t.name.as_str());
    match volumes.iter().find(|v| v.name == m.name) {
        None => out.extend(bad(format!("the mount at {mp} holding {CLIENT_CA_VAR} names volume {:?}, which the pod does not define", m.name))),
        Some(v) if tls_volume == Some(v.name.as_str()) => out.extend(bad(format!("the mount at {mp} holding {CLIENT_CA_VAR} is volume {}, the one mounted at {SECRET_MOUNT}; keep the client CA in a volume of its own: {need}", v.name))),
        Some(v) if v.config_map.is_none() && v.secret.is_none() && v.projected.is_none() => out.extend(bad(format!("the mount at {mp} holding {CLIENT_CA_VAR} is volume {} ({}); use a configMap volume (the CA certificate is public), a secret or a projected volume: {need}", v.name, volume_kind(v)))),
        Some(_) => {}
    }
    out.extend(socket_dir_drifts(c));
    out
}

/// With client certificates the terminator makes sandboxd's socket directory in its
/// temporary folder (`TMPDIR`, else `/tmp`): that folder must be writable, so with a
/// read-only root file system it must be a mount that is not read-only.
fn socket_dir_drifts(c: &Container) -> Vec<Drift> {
    let tmpdir = env_entries(c, "TMPDIR")
        .first()
        .and_then(|e| e.value.clone())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "/tmp".to_owned());
    let read_only_root = c
        .security_context
        .as_ref()
        .and_then(|s| s.read_only_root_filesystem)
        == Some(true);
    let writable_mount = c
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.read_only != Some(true) && Path::new(&tmpdir).starts_with(&m.mount_path));
    if !read_only_root || writable_mount {
        return Vec::new();
    }
    vec![drift(
        DriftKind::ClientCa,
        format!(
            "container {}: with {CLIENT_CA_VAR} the terminator makes sandboxd's socket directory in {tmpdir} (TMPDIR, else /tmp), which is not writable: the root file system is read-only and no writable volume is mounted there; mount an emptyDir at {tmpdir}",
            c.name
        ),
    )]
}

/// Named container ports: name → (port, protocol).
fn named_ports(containers: &[Container]) -> BTreeMap<String, (i32, String)> {
    containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            p.name.clone().map(|n| {
                (
                    n,
                    (
                        p.container_port,
                        p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    ),
                )
            })
        })
        .collect()
}

/// Every ingress rule must name ports, every port must be TCP 9090, and every rule must
/// admit only named pods (plimsolld's), never an address block, every pod, or the sandbox
/// pods themselves.
fn ingress_drifts(
    source: &str,
    rules: &[NetworkPolicyIngressRule],
    named: &BTreeMap<String, (i32, String)>,
    sandbox_labels: &BTreeMap<String, String>,
) -> Vec<Drift> {
    let mut out = Vec::new();
    let need = "ingress must be allowed only to TCP 9090";
    for (i, rule) in rules.iter().enumerate() {
        let n = i + 1;
        out.extend(peer_drifts(
            &format!("{source} ingress rule {n}"),
            rule.from.as_deref().unwrap_or_default(),
            sandbox_labels,
        ));
        let ports = rule.ports.as_deref().unwrap_or_default();
        if ports.is_empty() {
            out.push(drift(
                DriftKind::NetworkPolicy,
                format!("{source} ingress rule {n} allows every port; {need}"),
            ));
            continue;
        }
        for p in ports {
            let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
            let problem = match &p.port {
                None => Some(format!("allows every {proto} port")),
                Some(IntOrString::Int(port)) => match p.end_port {
                    Some(end) if end != *port => Some(format!("allows {proto} ports {port}-{end}")),
                    _ if *port != TLS_PORT || proto != "TCP" => {
                        Some(format!("allows {proto} port {port}"))
                    }
                    _ => None,
                },
                Some(IntOrString::String(name)) => match named.get(name) {
                    Some((port, pproto))
                        if *port == TLS_PORT && *pproto == "TCP" && proto == "TCP" =>
                    {
                        None
                    }
                    Some((port, _)) => Some(format!("allows {proto} port {name:?} ({port})")),
                    None => Some(format!(
                        "allows {proto} port {name:?}, which no container of the template declares"
                    )),
                },
            };
            if let Some(problem) = problem {
                out.push(drift(
                    DriftKind::NetworkPolicy,
                    format!("{source} ingress rule {n} {problem}; {need}"),
                ));
            }
        }
    }
    out
}

/// Who an ingress rule admits: only pods picked by a non-empty pod selector that does not
/// pick the sandbox pods, in the policy's namespace or in namespaces a non-empty selector
/// picks.
fn peer_drifts(
    rule: &str,
    from: &[NetworkPolicyPeer],
    sandbox_labels: &BTreeMap<String, String>,
) -> Vec<Drift> {
    let need = "admit only plimsolld's pods (from: podSelector with plimsolld's labels, and a namespaceSelector naming its namespace)";
    let bad = |problem: String| {
        drift(
            DriftKind::NetworkPolicy,
            format!("{rule} {problem}; {need}"),
        )
    };
    if from.is_empty() {
        return vec![bad("admits every source".to_owned())];
    }
    let mut out = Vec::new();
    for (j, peer) in from.iter().enumerate() {
        let m = j + 1;
        if let Some(block) = &peer.ip_block {
            out.push(bad(format!(
                "peer {m} admits the address block {}",
                block.cidr
            )));
            continue;
        }
        // Only labels name who is admitted: an expression such as `DoesNotExist` on a label
        // nobody sets selects everything while looking narrow.
        if peer.namespace_selector.as_ref().is_some_and(is_empty) {
            out.push(bad(format!("peer {m} admits pods of every namespace")));
        } else if peer
            .namespace_selector
            .as_ref()
            .is_some_and(|n| !by_labels(n))
        {
            out.push(bad(format!(
                "peer {m} picks namespaces by expressions only (matchExpressions can select every namespace); name plimsolld's namespace with matchLabels"
            )));
        }
        match &peer.pod_selector {
            None => out.push(bad(format!(
                "peer {m} admits every pod of the namespaces it selects"
            ))),
            Some(sel) if is_empty(sel) => out.push(bad(format!("peer {m} admits every pod"))),
            Some(sel) if !by_labels(sel) => out.push(bad(format!(
                "peer {m} picks pods by expressions only (matchExpressions can select every pod); name plimsolld's pods with matchLabels"
            ))),
            Some(sel) if selects(sel, sandbox_labels) => out.push(bad(format!(
                "peer {m} admits the sandbox pods themselves, so code in one sandbox could reach another's sandboxd"
            ))),
            Some(_) => {}
        }
    }
    out
}

/// A sandbox pod may reach nothing: every egress rule is a hole.
fn egress_drifts(source: &str, rules: &[NetworkPolicyEgressRule]) -> Vec<Drift> {
    (1..=rules.len())
        .map(|n| {
            drift(
                DriftKind::NetworkPolicy,
                format!("{source} egress rule {n} allows traffic out of the sandbox pods; state egress: [] so code in a sandbox reaches nothing"),
            )
        })
        .collect()
}

/// Whether a selector names at least one label with `matchLabels`.
fn by_labels(sel: &LabelSelector) -> bool {
    sel.match_labels.as_ref().is_some_and(|m| !m.is_empty())
}

fn is_empty(sel: &LabelSelector) -> bool {
    sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && sel.match_expressions.as_ref().is_none_or(|e| e.is_empty())
}

/// The run's user and group from `--run-as=UID:GID` (or `--run-as UID:GID`), when given
/// once and well formed, neither 0.
fn run_as_of(args: &[String]) -> Result<(i64, i64), String> {
    let mut values = Vec::new();
    for (i, a) in args.iter().enumerate() {
        if let Some(v) = a.strip_prefix(&format!("{RUN_AS_FLAG}=")) {
            values.push(v.to_owned());
        } else if a == RUN_AS_FLAG {
            values.push(args.get(i + 1).cloned().unwrap_or_default());
        }
    }
    let v = match values.as_slice() {
        [] => return Err("is missing".to_owned()),
        [one] => one,
        many => return Err(format!("is given {} times", many.len())),
    };
    let parsed = v
        .split_once(':')
        .and_then(|(u, g)| Some((u.parse::<i64>().ok()?, g.parse::<i64>().ok()?)));
    match parsed {
        Some((u, g)) if u > 0 && g > 0 => Ok((u, g)),
        _ => Err(format!("is {v:?}, not UID:GID with neither 0")),
    }
}

/// The code must run as a user and group of its own, which only a root sandboxd with a few
/// capabilities can arrange; the container must not be able to gain more.
fn user_drifts(c: &Container, args: &[String], pod: Option<&PodSecurityContext>) -> Vec<Drift> {
    let mut out = Vec::new();
    let name = &c.name;
    let sc = c.security_context.as_ref();
    match run_as_of(args) {
        Err(problem) => out.push(drift(
            DriftKind::RunAs,
            format!("container {name}: sandboxd's {RUN_AS_FLAG} {problem}; without a user of its own the code could read the TLS key, the token and the memory of the terminator and sandboxd: add {RUN_AS_FLAG}=65532:65532"),
        )),
        Ok((uid, gid)) => {
            let run_as_user = sc.and_then(|s| s.run_as_user).or(pod.and_then(|p| p.run_as_user));
            if run_as_user == Some(uid) {
                out.push(drift(
                    DriftKind::RunAs,
                    format!("container {name}: runAsUser {uid} is also the run's user ({RUN_AS_FLAG}); sandboxd and the code must not share a user"),
                ));
            }
            if pod.and_then(|p| p.fs_group) == Some(gid) {
                out.push(drift(
                    DriftKind::RunAs,
                    format!("fsGroup {gid} is the run's group ({RUN_AS_FLAG}), so the code could read the mounted Secrets; remove fsGroup"),
                ));
            }
            if pod.and_then(|p| p.supplemental_groups.as_ref()).is_some_and(|g| g.contains(&gid)) {
                out.push(drift(
                    DriftKind::RunAs,
                    format!("supplementalGroups holds the run's group {gid}; remove it"),
                ));
            }
        }
    }
    let run_as_user = sc
        .and_then(|s| s.run_as_user)
        .or(pod.and_then(|p| p.run_as_user));
    if run_as_user.is_some_and(|u| u != 0) {
        out.push(drift(
            DriftKind::RunAs,
            format!("container {name}: runAsUser is {}; sandboxd must start as uid 0 (with only the capabilities {}) to run the code as another user", run_as_user.unwrap_or_default(), ALLOWED_CAPABILITIES.join(", ")),
        ));
    }
    let non_root = sc
        .and_then(|s| s.run_as_non_root)
        .or(pod.and_then(|p| p.run_as_non_root));
    if non_root == Some(true) {
        out.push(drift(
            DriftKind::RunAs,
            format!("container {name}: runAsNonRoot is true; sandboxd must start as uid 0 to run the code as another user (set runAsUser: 0 and runAsNonRoot: false)"),
        ));
    }
    if sc.and_then(|s| s.allow_privilege_escalation) != Some(false) {
        out.push(drift(
            DriftKind::Privileged,
            format!("container {name}: allowPrivilegeEscalation is not false; set it to false"),
        ));
    }
    let caps = sc.and_then(|s| s.capabilities.as_ref());
    if !caps
        .and_then(|c| c.drop.as_ref())
        .is_some_and(|d| d.iter().any(|c| c == "ALL"))
    {
        out.push(drift(
            DriftKind::Privileged,
            format!("container {name}: capabilities.drop does not hold ALL; drop ALL and add back only {}", ALLOWED_CAPABILITIES.join(", ")),
        ));
    }
    let extra: Vec<&String> = caps
        .and_then(|c| c.add.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| !ALLOWED_CAPABILITIES.contains(&c.trim_start_matches("CAP_")))
        .collect();
    if !extra.is_empty() {
        out.push(drift(
            DriftKind::Privileged,
            format!(
                "container {name}: capabilities.add holds {extra:?}; only {} may be added",
                ALLOWED_CAPABILITIES.join(", ")
            ),
        ));
    }
    out
}

/// Whether a label selector selects a pod with these labels (an empty selector selects
/// every pod).
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_exprs = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let got = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => got.is_some_and(|v| values.contains(v)),
            "NotIn" => got.is_none_or(|v| !values.contains(v)),
            "Exists" => got.is_some(),
            "DoesNotExist" => got.is_none(),
            _ => false,
        }
    });
    by_labels && by_exprs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template() -> Value {
        json!({
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxTemplate",
            "metadata": {"name": "t", "namespace": "ns"},
            "spec": {
                "networkPolicyManagement": "Unmanaged",
                "podTemplate": {
                    "metadata": {"labels": {"app": "sbx"}},
                    "spec": {
                        "runtimeClassName": "gvisor",
                        "containers": [{
                            "name": "sandboxd",
                            "image": "img@sha256:00",
                            "command": [TERMINATOR],
                            "args": ["--listen-host=127.0.0.1", "--grpc-port=9091", "--token-file=/t/token", "--run-as=65532:65532"],
                            "ports": [{"name": "tls", "containerPort": 9090}],
                            "securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": false,
                                "capabilities": {"drop": ["ALL"], "add": ["SETUID", "SETGID", "KILL"]}},
                            "volumeMounts": [{"name": "tls", "mountPath": SECRET_MOUNT, "readOnly": true}]
                        }],
                        "volumes": [{"name": "tls", "secret": {"secretName": "s", "defaultMode": 256}}]
                    }
                }
            }
        })
    }

    fn policy(ports: Value) -> Value {
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"podSelector": {"matchLabels": {"app": "sbx"}},
                     "policyTypes": ["Ingress", "Egress"],
                     "ingress": [{"from": [plimsolld()], "ports": ports}]}
        })
    }

    /// The one peer a sandbox pod admits: plimsolld's pods in plimsolld's namespace.
    fn plimsolld() -> Value {
        json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "plimsoll"}},
               "podSelector": {"matchLabels": {"app": "plimsolld"}}})
    }

    fn good_policy() -> Value {
        policy(json!([{"protocol": "TCP", "port": 9090}]))
    }

    fn kinds(r: &ReadBack) -> Vec<DriftKind> {
        r.drifts.iter().map(|d| d.kind).collect()
    }

    #[test]
    fn a_conforming_template_passes_with_its_tier() {
        let pool = json!({"spec": {"sandboxTemplateRef": {"name": "t"}}});
        let r = read_back("t", &template(), Some(("pool", &pool)), &[good_policy()]);
        assert!(r.drifts.is_empty(), "{:?}", r.drifts);
        assert_eq!(r.tier, Tier::Kernel);
        assert_eq!(r.image.as_deref(), Some("img@sha256:00"));
        assert_eq!(r.pod_labels[TEMPLATE_REF_HASH_LABEL], name_hash("t"));
    }

    const IP_CLIENT: Channel = Channel {
        pod_identity: plimsoll_tls::PodIdentity::Ip,
        client_certs: true,
    };

    /// [`template`] with a per-pod certificate (cert-manager's CSI volume at the certificate
    /// directory) and the terminator's client CA from a read-only ConfigMap mount.
    fn ip_template() -> Value {
        let mut t = template();
        let spec = &mut t["spec"]["podTemplate"]["spec"];
        spec["volumes"] = json!([
            {"name": "tls", "csi": {"driver": "csi.cert-manager.io", "readOnly": true,
                "volumeAttributes": {
                    "csi.cert-manager.io/issuer-name": "plimsoll-sandboxd-ca",
                    "csi.cert-manager.io/issuer-kind": "Issuer",
                    "csi.cert-manager.io/ip-sans": "${POD_IP}",
                    "csi.cert-manager.io/duration": "24h",
                    "csi.cert-manager.io/renew-before": "8h",
                    "csi.cert-manager.io/key-algorithm": "ECDSA"}}},
            {"name": "client-ca", "configMap": {"name": "plimsoll-sandboxd-client-ca"}}
        ]);
        let c = &mut spec["containers"][0];
        c["env"] =
            json!([{"name": CLIENT_CA_VAR, "value": "/etc/plimsoll/sandboxd-client-ca/ca.crt"}]);
        c["volumeMounts"] = json!([
            {"name": "tls", "mountPath": SECRET_MOUNT, "readOnly": true},
            {"name": "client-ca", "mountPath": "/etc/plimsoll/sandboxd-client-ca", "readOnly": true}
        ]);
        t
    }

    fn csi_attr(t: &mut Value) -> &mut Value {
        &mut t["spec"]["podTemplate"]["spec"]["volumes"][0]["csi"]["volumeAttributes"]
    }

    fn set_attr(t: &mut Value, key: &str, value: &str) {
        csi_attr(t)[format!("csi.cert-manager.io/{key}")] = json!(value);
    }

    fn remove_attr(t: &mut Value, key: &str) {
        csi_attr(t)
            .as_object_mut()
            .unwrap()
            .remove(&format!("csi.cert-manager.io/{key}"));
    }

    fn client_ca_env(t: &mut Value) -> &mut Value {
        &mut t["spec"]["podTemplate"]["spec"]["containers"][0]["env"]
    }

    #[test]
    fn a_conforming_per_pod_template_with_client_certificates_passes() {
        let pool = json!({"spec": {"sandboxTemplateRef": {"name": "t"}}});
        let r = read_back_with(
            "t",
            &ip_template(),
            Some(("pool", &pool)),
            &[good_policy()],
            &IP_CLIENT,
        );
        assert!(r.drifts.is_empty(), "{:?}", r.drifts);
        assert_eq!(r.tier, Tier::Kernel);
        // The default channel is read_back's.
        assert_eq!(
            read_back("t", &template(), None, &[good_policy()]),
            read_back_with(
                "t",
                &template(),
                None,
                &[good_policy()],
                &Channel::default()
            )
        );
        // Other durations within a day, and an explicit ClusterIssuer, pass too.
        for d in ["1h30m", "90m", "3600s", "86400s", "23h59m60s", "1.5h"] {
            let mut t = ip_template();
            set_attr(&mut t, "duration", d);
            set_attr(&mut t, "issuer-kind", "ClusterIssuer");
            set_attr(&mut t, "certificate-file", "tls.crt");
            set_attr(&mut t, "is-ca", "false");
            let r = read_back_with("t", &t, None, &[good_policy()], &IP_CLIENT);
            assert!(r.drifts.is_empty(), "{d}: {:?}", r.drifts);
        }
        // The terminator may be told its default directory.
        let mut t = ip_template();
        client_ca_env(&mut t)
            .as_array_mut()
            .unwrap()
            .push(json!({"name": TLS_DIR_VAR, "value": "/etc/plimsoll/sandboxd-tls/"}));
        let r = read_back_with("t", &t, None, &[good_policy()], &IP_CLIENT);
        assert!(r.drifts.is_empty(), "{:?}", r.drifts);
    }

    #[test]
    fn each_per_pod_identity_drift_is_named_with_what_was_found() {
        // (kind, what the message must name, the edit)
        type Named = (DriftKind, &'static str, Box<dyn Fn(&mut Value)>);
        let cases: Vec<Named> = vec![
            (
                DriftKind::CsiVolume,
                "a secret volume",
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["volumes"][0] =
                        json!({"name": "tls", "secret": {"secretName": "s", "defaultMode": 256}})
                }),
            ),
            (
                DriftKind::CsiVolume,
                "\"secrets-store.csi.k8s.io\"",
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["volumes"][0]["csi"]["driver"] =
                        json!("secrets-store.csi.k8s.io")
                }),
            ),
            (
                DriftKind::ReadOnly,
                "readOnly is false",
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["volumes"][0]["csi"]["readOnly"] = json!(false)
                }),
            ),
            (
                DriftKind::ReadOnly,
                "readOnly is not set",
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["volumes"][0]["csi"]
                        .as_object_mut()
                        .unwrap()
                        .remove("readOnly");
                }),
            ),
            (
                DriftKind::ReadOnly,
                "not read-only",
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]["volumeMounts"][0]
                        ["readOnly"] = json!(false)
                }),
            ),
            (
                DriftKind::SecretMount,
                "subPath",
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]["volumeMounts"][0]
                        ["subPath"] = json!("tls.crt")
                }),
            ),
            (
                DriftKind::IpSans,
                "\"10.0.0.7\"",
                Box::new(|t| set_attr(t, "ip-sans", "10.0.0.7")),
            ),
            (
                DriftKind::IpSans,
                "\"${POD_IP},10.0.0.7\"",
                Box::new(|t| set_attr(t, "ip-sans", "${POD_IP},10.0.0.7")),
            ),
            (
                DriftKind::IpSans,
                "ip-sans is not set",
                Box::new(|t| remove_attr(t, "ip-sans")),
            ),
            (
                DriftKind::Issuer,
                "issuer-name is not set",
                Box::new(|t| remove_attr(t, "issuer-name")),
            ),
            (
                DriftKind::Issuer,
                "issuer-name is not set",
                Box::new(|t| set_attr(t, "issuer-name", " ")),
            ),
            (
                DriftKind::Issuer,
                "\"AWSPCAIssuer\"",
                Box::new(|t| set_attr(t, "issuer-kind", "AWSPCAIssuer")),
            ),
            (
                DriftKind::CertFiles,
                "\"cert.pem\"",
                Box::new(|t| set_attr(t, "certificate-file", "cert.pem")),
            ),
            (
                DriftKind::CertFiles,
                "\"key.pem\"",
                Box::new(|t| set_attr(t, "privatekey-file", "key.pem")),
            ),
            (
                DriftKind::FsGroup,
                "\"65532\"",
                Box::new(|t| set_attr(t, "fs-group", "65532")),
            ),
            (
                DriftKind::FsGroup,
                "fs-group is \"\"",
                Box::new(|t| set_attr(t, "fs-group", "")),
            ),
            (
                DriftKind::KeyUsages,
                "\"server auth,client auth\"",
                Box::new(|t| set_attr(t, "key-usages", "server auth,client auth")),
            ),
            (
                DriftKind::IsCa,
                "\"true\"",
                Box::new(|t| set_attr(t, "is-ca", "true")),
            ),
            (
                DriftKind::Pkcs12,
                "\"true\"",
                Box::new(|t| set_attr(t, "pkcs12-enable", "true")),
            ),
            (
                DriftKind::ReusePrivateKey,
                "\"true\"",
                Box::new(|t| set_attr(t, "reuse-private-key", "true")),
            ),
            (
                DriftKind::CertDuration,
                "\"48h\" (48.0 hours)",
                Box::new(|t| set_attr(t, "duration", "48h")),
            ),
            (
                DriftKind::CertDuration,
                "\"24h0m1s\"",
                Box::new(|t| set_attr(t, "duration", "24h0m1s")),
            ),
            (
                DriftKind::CertDuration,
                "\"2160h\"",
                Box::new(|t| set_attr(t, "duration", "2160h")),
            ),
            (
                DriftKind::CertDuration,
                "\"1d\", which is not a duration",
                Box::new(|t| set_attr(t, "duration", "1d")),
            ),
            (
                DriftKind::CertDuration,
                "\"-1h\"",
                Box::new(|t| set_attr(t, "duration", "-1h")),
            ),
            (
                DriftKind::CertDuration,
                "duration is not set",
                Box::new(|t| remove_attr(t, "duration")),
            ),
            (
                DriftKind::TlsDir,
                "\"/tmp/tls\"",
                Box::new(|t| {
                    client_ca_env(t)
                        .as_array_mut()
                        .unwrap()
                        .push(json!({"name": TLS_DIR_VAR, "value": "/tmp/tls"}))
                }),
            ),
            (
                DriftKind::TlsDir,
                "valueFrom",
                Box::new(|t| {
                    client_ca_env(t)
                        .as_array_mut()
                        .unwrap()
                        .push(json!({"name": TLS_DIR_VAR,
                        "valueFrom": {"configMapKeyRef": {"name": "x", "key": "dir"}}}))
                }),
            ),
        ];
        for (kind, found, edit) in cases {
            let mut t = ip_template();
            edit(&mut t);
            let r = read_back_with("t", &t, None, &[good_policy()], &IP_CLIENT);
            assert_eq!(kinds(&r), vec![kind], "{found}: {:?}", r.drifts);
            let shown = r.drifts[0].to_string();
            assert!(
                shown.starts_with(&format!("[{}] ", kind.as_str())),
                "{shown}"
            );
            assert!(shown.contains(found), "{found} not in: {shown}");
        }
    }

    #[test]
    fn the_client_ca_must_be_a_file_of_a_read_only_configmap_mount() {
        type Named = (&'static str, Box<dyn Fn(&mut Value)>);
        let mount = |f: fn(&mut Value)| {
            Box::new(move |t: &mut Value| {
                f(&mut t["spec"]["podTemplate"]["spec"]["containers"][0]["volumeMounts"][1])
            }) as Box<dyn Fn(&mut Value)>
        };
        let value = |v: &'static str| {
            Box::new(move |t: &mut Value| client_ca_env(t)[0]["value"] = json!(v))
                as Box<dyn Fn(&mut Value)>
        };
        let cases: Vec<Named> = vec![
            (
                "has no PLIMSOLL_SANDBOXD_CLIENT_CA",
                Box::new(|t| *client_ca_env(t) = json!([])),
            ),
            (
                "given 2 times",
                Box::new(|t| {
                    let again = client_ca_env(t)[0].clone();
                    client_ca_env(t).as_array_mut().unwrap().push(again)
                }),
            ),
            (
                "valueFrom",
                Box::new(|t| {
                    client_ca_env(t)[0] = json!({"name": CLIENT_CA_VAR,
                        "valueFrom": {"configMapKeyRef": {"name": "x", "key": "path"}}})
                }),
            ),
            ("\"ca.crt\", not an absolute path", value("ca.crt")),
            (
                "\"/etc/plimsoll/sandboxd-client-ca/../sandboxd-tls/ca.crt\", not an absolute path",
                value("/etc/plimsoll/sandboxd-client-ca/../sandboxd-tls/ca.crt"),
            ),
            (
                "\"/etc/plimsoll/sandboxd-tls/ca.crt\", in /etc/plimsoll/sandboxd-tls",
                value("/etc/plimsoll/sandboxd-tls/ca.crt"),
            ),
            (
                "\"/etc/ssl/certs/ca.crt\", which lies in no volume mount",
                value("/etc/ssl/certs/ca.crt"),
            ),
            (
                "\"/etc/plimsoll/sandboxd-client-ca\", which lies in no volume mount",
                value("/etc/plimsoll/sandboxd-client-ca"),
            ),
            (
                "the mount at /etc/plimsoll/sandboxd-client-ca holding PLIMSOLL_SANDBOXD_CLIENT_CA (/etc/plimsoll/sandboxd-client-ca/ca.crt) is not read-only",
                mount(|m| m["readOnly"] = json!(false)),
            ),
            ("uses subPath", mount(|m| m["subPath"] = json!("ca.crt"))),
            (
                "names volume \"nowhere\", which the pod does not define",
                mount(|m| m["name"] = json!("nowhere")),
            ),
            (
                "is volume tls, the one mounted at /etc/plimsoll/sandboxd-tls",
                mount(|m| m["name"] = json!("tls")),
            ),
            (
                "is volume client-ca (emptyDir)",
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["volumes"][1] =
                        json!({"name": "client-ca", "emptyDir": {}})
                }),
            ),
        ];
        for (found, edit) in cases {
            let mut t = ip_template();
            edit(&mut t);
            let r = read_back_with("t", &t, None, &[good_policy()], &IP_CLIENT);
            assert_eq!(
                kinds(&r),
                vec![DriftKind::ClientCa],
                "{found}: {:?}",
                r.drifts
            );
            assert!(
                r.drifts[0].message.contains(found),
                "{found} not in: {}",
                r.drifts[0]
            );
        }
        // A Secret or projected volume holds a CA file as well as a ConfigMap.
        for source in [
            json!({"secret": {"secretName": "ca", "defaultMode": 256}}),
            json!({"projected": {"sources": [{"configMap": {"name": "ca"}}]}}),
        ] {
            let mut t = ip_template();
            let mut v = source.clone();
            v["name"] = json!("client-ca");
            t["spec"]["podTemplate"]["spec"]["volumes"][1] = v;
            let r = read_back_with("t", &t, None, &[good_policy()], &IP_CLIENT);
            assert!(r.drifts.is_empty(), "{source}: {:?}", r.drifts);
        }
        // The client CA is checked in shared mode too.
        let mut t = template();
        let shared_client = Channel {
            pod_identity: plimsoll_tls::PodIdentity::Shared,
            client_certs: true,
        };
        let r = read_back_with("t", &t, None, &[good_policy()], &shared_client);
        assert_eq!(kinds(&r), vec![DriftKind::ClientCa], "{:?}", r.drifts);
        // And a template that asks for client certificates plimsolld does not have fails.
        t["spec"]["podTemplate"]["spec"]["containers"][0]["env"] =
            json!([{"name": CLIENT_CA_VAR, "value": "/etc/ca/ca.crt"}]);
        let r = read_back("t", &t, None, &[good_policy()]);
        assert_eq!(kinds(&r), vec![DriftKind::ClientCa], "{:?}", r.drifts);
        assert!(
            r.drifts[0]
                .message
                .contains("plimsolld has none configured"),
            "{}",
            r.drifts[0]
        );
    }

    #[test]
    fn per_pod_volumes_and_modes_must_agree() {
        // A CSI volume while plimsolld is in shared mode.
        let mut t = ip_template();
        *client_ca_env(&mut t) = json!([]);
        let r = read_back("t", &t, None, &[good_policy()]);
        assert_eq!(kinds(&r), vec![DriftKind::SecretVolume], "{:?}", r.drifts);
        assert!(
            r.drifts[0]
                .message
                .contains("set SANDBOX_AGENTSANDBOX_POD_IDENTITY=ip"),
            "{}",
            r.drifts[0]
        );
        // The shared template while plimsolld expects per-pod certificates: a CSI volume is
        // required, and the Secret checks do not apply.
        let ip = Channel {
            pod_identity: plimsoll_tls::PodIdentity::Ip,
            client_certs: false,
        };
        let r = read_back_with("t", &template(), None, &[good_policy()], &ip);
        assert_eq!(kinds(&r), vec![DriftKind::CsiVolume], "{:?}", r.drifts);
        // Nothing at the certificate directory names the CSI volume in per-pod mode.
        let mut t = ip_template();
        t["spec"]["podTemplate"]["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] =
            json!("/etc/tls");
        let r = read_back_with("t", &t, None, &[good_policy()], &IP_CLIENT);
        assert_eq!(kinds(&r), vec![DriftKind::SecretMount], "{:?}", r.drifts);
        assert!(
            r.drifts[0].message.contains("CSI volume"),
            "{}",
            r.drifts[0]
        );
        // Every difference at once, each with its own kind.
        let mut t = ip_template();
        for (k, v) in [
            ("ip-sans", "10.1.2.3"),
            ("fs-group", "0"),
            ("duration", "720h"),
            ("is-ca", "true"),
        ] {
            set_attr(&mut t, k, v);
        }
        let mut k = kinds(&read_back_with("t", &t, None, &[good_policy()], &IP_CLIENT));
        k.sort();
        assert_eq!(
            k,
            vec![
                DriftKind::IpSans,
                DriftKind::FsGroup,
                DriftKind::IsCa,
                DriftKind::CertDuration
            ]
        );
    }

    #[test]
    fn go_durations() {
        let h = 3_600_000_000_000i128;
        for (s, ns) in [
            ("24h", 24 * h),
            ("1h30m", 3 * h / 2),
            ("90m", 3 * h / 2),
            ("3600s", h),
            ("1.5h", 3 * h / 2),
            (".5h", h / 2),
            ("1.h", h),
            ("300ms", 300_000_000),
            ("2us", 2_000),
            ("2\u{b5}s", 2_000),
            ("7ns", 7),
            ("0", 0),
            ("+2h", 2 * h),
            ("-1h", -h),
            ("1h0.5m1s", h + 31_000_000_000),
        ] {
            assert_eq!(parse_go_duration(s), Some(ns), "{s}");
        }
        for s in [
            "", "1", "1d", "h", ".", ".h", "1h 30m", "24H", "-", "1e3s", "0x10s",
        ] {
            assert_eq!(parse_go_duration(s), None, "{s:?}");
        }
    }

    /// One template edit and the drift it must cause.
    type Case = (DriftKind, Box<dyn Fn(&mut Value)>);

    #[test]
    fn each_drift_is_named() {
        let cases: Vec<Case> = vec![
            (
                DriftKind::Command,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]["command"] =
                        json!(["/usr/local/bin/plimsoll-sandboxd"])
                }),
            ),
            (
                DriftKind::Command,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]
                        .as_object_mut()
                        .unwrap()
                        .remove("command");
                }),
            ),
            (
                DriftKind::ListenHost,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]["args"][0] =
                        json!("--listen-host=0.0.0.0")
                }),
            ),
            (
                DriftKind::GrpcPort,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]["args"][1] =
                        json!("--grpc-port=9090")
                }),
            ),
            (
                DriftKind::SandboxdFlags,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]["args"][2] =
                        json!("--insecure-no-token")
                }),
            ),
            (
                DriftKind::SecretMount,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]["volumeMounts"][0]
                        ["mountPath"] = json!("/etc/tls")
                }),
            ),
            (
                DriftKind::SecretMount,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]["volumeMounts"][0]
                        ["subPath"] = json!("tls.crt")
                }),
            ),
            (
                DriftKind::ReadOnly,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]["volumeMounts"][0]
                        ["readOnly"] = json!(false)
                }),
            ),
            (
                DriftKind::DefaultMode,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["volumes"][0]["secret"]["defaultMode"] =
                        json!(420)
                }),
            ),
            (
                DriftKind::DefaultMode,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["volumes"][0]["secret"]["defaultMode"] =
                        json!(400)
                }),
            ),
            (
                DriftKind::SecretVolume,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["volumes"][0] =
                        json!({"name": "tls", "emptyDir": {}})
                }),
            ),
            (
                DriftKind::HostNamespace,
                Box::new(|t| t["spec"]["podTemplate"]["spec"]["hostNetwork"] = json!(true)),
            ),
            (
                DriftKind::HostNamespace,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["shareProcessNamespace"] = json!(true)
                }),
            ),
            (
                DriftKind::Privileged,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]["securityContext"]
                        ["privileged"] = json!(true)
                }),
            ),
            (
                DriftKind::NetworkPolicy,
                Box::new(|t| t["spec"]["networkPolicyManagement"] = json!("Managed")),
            ),
        ];
        for (kind, edit) in cases {
            let mut t = template();
            edit(&mut t);
            let r = read_back("t", &t, None, &[good_policy()]);
            assert_eq!(kinds(&r), vec![kind], "{:?}", r.drifts);
            assert!(r.drifts[0]
                .to_string()
                .starts_with(&format!("[{}]", kind.as_str())));
        }
    }

    #[test]
    fn every_difference_is_listed_at_once() {
        let mut t = template();
        let c = &mut t["spec"]["podTemplate"]["spec"]["containers"][0];
        c["args"] = json!(["--token-file=/t/token"]);
        c["volumeMounts"][0]["readOnly"] = json!(false);
        t["spec"]["podTemplate"]["spec"]["volumes"][0]["secret"]["defaultMode"] = json!(420);
        let r = read_back("t", &t, None, &[]);
        let mut k = kinds(&r);
        k.sort();
        assert_eq!(
            k,
            vec![
                DriftKind::ListenHost,
                DriftKind::GrpcPort,
                DriftKind::ReadOnly,
                DriftKind::DefaultMode,
                // Nothing selects the pods: neither ingress nor egress is governed.
                DriftKind::NetworkPolicy,
                DriftKind::NetworkPolicy,
                DriftKind::RunAs,
            ]
        );
    }

    #[test]
    fn policies_allowing_more_than_tls_are_refused() {
        for ports in [
            json!([{"port": 9090}, {"port": 8080}]),
            json!([{"protocol": "UDP", "port": 9090}]),
            json!([{"port": 9090, "endPort": 9100}]),
            json!([{"protocol": "TCP"}]),
            json!([]),
            json!([{"port": "metrics"}]),
        ] {
            let r = read_back("t", &template(), None, &[policy(ports.clone())]);
            assert!(r.has(DriftKind::NetworkPolicy), "{ports}: passed");
        }
        // A named port that is the TLS port is fine; so is a policy with a `from`.
        let r = read_back("t", &template(), None, &[policy(json!([{"port": "tls"}]))]);
        assert!(r.drifts.is_empty(), "{:?}", r.drifts);
        // Any other selecting policy that opens more is found too (policies add up).
        let wide =
            json!({"metadata": {"name": "wide"}, "spec": {"podSelector": {}, "ingress": [{}]}});
        let r = read_back("t", &template(), None, &[good_policy(), wide]);
        assert!(!r.drifts.is_empty());
        for d in &r.drifts {
            assert_eq!(d.kind, DriftKind::NetworkPolicy);
            assert!(d.message.contains("wide"), "{d}");
        }
        // A policy that selects other pods does not count.
        let other = json!({"metadata": {"name": "o"}, "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{}]}});
        let r = read_back("t", &template(), None, &[good_policy(), other]);
        assert!(r.drifts.is_empty(), "{:?}", r.drifts);
    }

    #[test]
    fn policies_admitting_anyone_but_plimsolld_or_allowing_egress_are_refused() {
        let with_from = |from: Value| {
            let mut p = good_policy();
            p["spec"]["ingress"][0]["from"] = from;
            p
        };
        let cases = [
            ("no from", {
                let mut p = good_policy();
                p["spec"]["ingress"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("from");
                p
            }),
            ("empty from", with_from(json!([]))),
            (
                "address block",
                with_from(json!([{"ipBlock": {"cidr": "0.0.0.0/0"}}])),
            ),
            ("every pod", with_from(json!([{"podSelector": {}}]))),
            (
                "a namespace's every pod",
                with_from(json!([{"namespaceSelector": {"matchLabels": {"a": "b"}}}])),
            ),
            (
                "every namespace",
                with_from(
                    json!([{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "plimsolld"}}}]),
                ),
            ),
            (
                "the sandbox pods",
                with_from(json!([plimsolld(), {"podSelector": {"matchLabels": {"app": "sbx"}}}])),
            ),
            (
                "namespaces by expression",
                with_from(
                    json!([{"namespaceSelector": {"matchExpressions": [{"key": "nobody-sets-this", "operator": "DoesNotExist"}]},
                    "podSelector": {"matchLabels": {"app": "plimsolld"}}}]),
                ),
            ),
            (
                "pods by expression",
                with_from(
                    json!([{"podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}}]),
                ),
            ),
            ("egress allowed", {
                let mut p = good_policy();
                p["spec"]["egress"] = json!([{"ports": [{"port": 53, "protocol": "UDP"}]}]);
                p
            }),
            ("egress not governed", {
                let mut p = good_policy();
                p["spec"]["policyTypes"] = json!(["Ingress"]);
                p
            }),
        ];
        for (what, p) in cases {
            let r = read_back("t", &template(), None, &[p]);
            assert!(r.has(DriftKind::NetworkPolicy), "{what}: passed");
            assert!(
                r.drifts.iter().all(|d| d.kind == DriftKind::NetworkPolicy),
                "{what}: {:?}",
                r.drifts
            );
        }
        // A second policy that only denies egress completes an ingress-only one.
        let mut ingress_only = good_policy();
        ingress_only["spec"]["policyTypes"] = json!(["Ingress"]);
        let deny = json!({"metadata": {"name": "deny-egress"}, "spec": {
            "podSelector": {"matchLabels": {"app": "sbx"}}, "policyTypes": ["Egress"]}});
        let r = read_back("t", &template(), None, &[ingress_only, deny]);
        assert!(r.drifts.is_empty(), "{:?}", r.drifts);
    }

    #[test]
    fn the_code_must_run_as_a_user_of_its_own() {
        let edit = |f: &dyn Fn(&mut Value)| {
            let mut t = template();
            f(&mut t);
            let r = read_back("t", &t, None, &[good_policy()]);
            (kinds(&r), r.drifts)
        };
        type Named = (&'static str, DriftKind, Box<dyn Fn(&mut Value)>);
        let cases: Vec<Named> = vec![
            (
                "no --run-as",
                DriftKind::RunAs,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]["args"][3] =
                        json!("--root-dir=/w");
                }),
            ),
            (
                "uid 0",
                DriftKind::RunAs,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]["args"][3] =
                        json!("--run-as=0:65532");
                }),
            ),
            (
                "not numeric",
                DriftKind::RunAs,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]["args"][3] =
                        json!("--run-as=nobody");
                }),
            ),
            (
                "fsGroup is the run's group",
                DriftKind::RunAs,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["securityContext"] = json!({"fsGroup": 65532});
                }),
            ),
            (
                "non-root sandboxd",
                DriftKind::RunAs,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["securityContext"] =
                        json!({"runAsNonRoot": true});
                }),
            ),
            (
                "sandboxd as another uid",
                DriftKind::RunAs,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]["securityContext"]
                        ["runAsUser"] = json!(1000);
                }),
            ),
            (
                "escalation allowed",
                DriftKind::Privileged,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]["securityContext"]
                        ["allowPrivilegeEscalation"] = json!(true);
                }),
            ),
            (
                "capabilities kept",
                DriftKind::Privileged,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]["securityContext"]
                        ["capabilities"]["drop"] = json!([]);
                }),
            ),
            (
                "ptrace added",
                DriftKind::Privileged,
                Box::new(|t| {
                    t["spec"]["podTemplate"]["spec"]["containers"][0]["securityContext"]
                        ["capabilities"]["add"] = json!(["SETUID", "SYS_PTRACE"]);
                }),
            ),
        ];
        for (what, kind, f) in cases {
            let (k, drifts) = edit(&*f);
            assert!(k.contains(&kind), "{what}: {drifts:?}");
            assert!(k.iter().all(|x| *x == kind), "{what}: {drifts:?}");
        }
    }

    #[test]
    fn the_controllers_managed_policy_is_matched_by_template_hash() {
        let mut t = template();
        t["spec"]["networkPolicyManagement"] = json!("Managed");
        t["spec"]["networkPolicy"] = json!({"ingress": [{"from": [plimsolld()],
            "ports": [{"protocol": "TCP", "port": 9090}]}], "egress": []});
        let managed = json!({"metadata": {"name": "t-network-policy"}, "spec": {
            "podSelector": {"matchLabels": {TEMPLATE_REF_HASH_LABEL: name_hash("t")}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [plimsolld()], "ports": [{"protocol": "TCP", "port": 9090}]}]}});
        let r = read_back("t", &t, None, std::slice::from_ref(&managed));
        assert!(r.drifts.is_empty(), "{:?}", r.drifts);
        t["spec"]["networkPolicy"]["ingress"][0]["ports"][0]["port"] = json!(22);
        let r = read_back("t", &t, None, &[managed]);
        assert!(r.has(DriftKind::NetworkPolicy));
    }

    #[test]
    fn the_warm_pool_must_use_the_template() {
        let pool = json!({"spec": {"sandboxTemplateRef": {"name": "other"}}});
        let r = read_back("t", &template(), Some(("pool", &pool)), &[good_policy()]);
        assert_eq!(kinds(&r), vec![DriftKind::WarmPool]);
    }

    #[test]
    fn tiers_from_runtime_classes() {
        assert_eq!(tier_of_runtime_class(None), Tier::Container);
        assert_eq!(tier_of_runtime_class(Some("runc")), Tier::Container);
        assert_eq!(tier_of_runtime_class(Some("gvisor")), Tier::Kernel);
        assert_eq!(tier_of_runtime_class(Some("runsc")), Tier::Kernel);
        assert_eq!(tier_of_runtime_class(Some("kata-qemu")), Tier::Vm);
        assert_eq!(tier_of_runtime_class(Some("kata-vm-isolation")), Tier::Vm);
        assert_eq!(tier_of_runtime_class(Some("crun")), Tier::Container);
    }

    #[test]
    fn flag_rules_agree_with_the_terminator() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        for args in [
            s(&["--listen-host=127.0.0.1", "--grpc-port=9091"]),
            s(&[
                "--grpc-port=9091",
                "--root-dir=/w",
                "--listen-host=127.0.0.1",
            ]),
            s(&["--listen-host=127.0.0.1"]),
            s(&["--listen-host", "127.0.0.1", "--grpc-port=9091"]),
            s(&[
                "--listen-host=127.0.0.1",
                "--listen-host=127.0.0.1",
                "--grpc-port=9091",
            ]),
            s(&[
                "--listen-host=127.0.0.1",
                "--grpc-port=9091",
                "--unix-socket=/x",
            ]),
            s(&[
                "--listen-host=127.0.0.1",
                "--grpc-port=9091",
                "--terminator-socket=/tmp/x/s.sock",
            ]),
            s(&["--listen-host=0.0.0.0", "--grpc-port=9091"]),
        ] {
            let ours = flag_drifts("c", &args).is_empty();
            let theirs = plimsoll_tls::supervise::check_sandboxd_flags(&args).is_ok();
            assert_eq!(ours, theirs, "{args:?}");
        }
    }

    #[test]
    fn selectors() {
        let labels: BTreeMap<String, String> =
            [("app".to_owned(), "x".to_owned())].into_iter().collect();
        let sel = |v: Value| -> LabelSelector { serde_json::from_value(v).unwrap() };
        assert!(selects(&sel(json!({})), &labels));
        assert!(selects(&sel(json!({"matchLabels": {"app": "x"}})), &labels));
        assert!(!selects(
            &sel(json!({"matchLabels": {"app": "y"}})),
            &labels
        ));
        assert!(selects(
            &sel(
                json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["x", "z"]}]})
            ),
            &labels
        ));
        assert!(!selects(
            &sel(
                json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["x"]}]})
            ),
            &labels
        ));
        assert!(selects(
            &sel(json!({"matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]})),
            &labels
        ));
        assert!(!selects(
            &sel(json!({"matchExpressions": [{"key": "b", "operator": "Exists"}]})),
            &labels
        ));
    }

    #[test]
    fn with_client_certificates_the_terminator_needs_a_writable_temporary_folder() {
        let channel = IP_CLIENT;
        let mut t = ip_template();
        let c = &mut t["spec"]["podTemplate"]["spec"]["containers"][0];
        c["securityContext"]["readOnlyRootFilesystem"] = json!(true);
        let drifts = |t: &Value| {
            read_back_with("t", t, None, &[good_policy()], &channel)
                .drifts
                .into_iter()
                .filter(|d| d.message.contains("socket directory"))
                .collect::<Vec<_>>()
        };
        let found = drifts(&t);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].kind, DriftKind::ClientCa);
        assert!(found[0].message.contains("/tmp"), "{}", found[0].message);
        // An emptyDir at /tmp fixes it; so does a TMPDIR inside a writable mount.
        let mut fixed = t.clone();
        fixed["spec"]["podTemplate"]["spec"]["containers"][0]["volumeMounts"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "tmp", "mountPath": "/tmp"}));
        assert!(drifts(&fixed).is_empty());
        let mut elsewhere = t.clone();
        let c = &mut elsewhere["spec"]["podTemplate"]["spec"]["containers"][0];
        c["env"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "TMPDIR", "value": "/scratch/t"}));
        c["volumeMounts"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "scratch", "mountPath": "/scratch"}));
        assert!(drifts(&elsewhere).is_empty());
        // A read-only mount there does not.
        elsewhere["spec"]["podTemplate"]["spec"]["containers"][0]["volumeMounts"]
            .as_array_mut()
            .unwrap()
            .last_mut()
            .unwrap()["readOnly"] = json!(true);
        assert_eq!(drifts(&elsewhere).len(), 1);
    }
}
