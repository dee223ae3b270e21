//! The provider's typed configuration, parsed from the `SANDBOX_AGENTSANDBOX_*` variables
//! ([`VARIABLES`]) through the environment source plimsolld hands over (so tests never touch
//! the process environment), and the hardened-mode safeguard only this provider has.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use plimsoll_provider::{
    ConfigError, EnvSource, Provider, ProviderSetup, ProviderStartError, Shared, Variable, Vars,
};
use plimsoll_tls::{ClientPair, ClientSpec, PodIdentity};

/// The provider's name.
pub const NAME: &str = "agentsandbox";

/// The port plimsolld dials on every pod: the terminator's TLS listener.
pub const SANDBOXD_PORT: u16 = 9090;

/// Namespace used when `SANDBOX_AGENTSANDBOX_NAMESPACE` is unset (the shipped `k8s/`).
pub const DEFAULT_NAMESPACE: &str = "plimsoll-sandboxes";
/// SandboxTemplate used when `SANDBOX_AGENTSANDBOX_TEMPLATE` is unset (the shipped `k8s/`).
pub const DEFAULT_TEMPLATE: &str = "plimsoll-sandboxd";
/// SandboxWarmPool used when `SANDBOX_AGENTSANDBOX_WARM_POOL` is unset (the shipped `k8s/`).
pub const DEFAULT_WARM_POOL: &str = "plimsoll-pool";
/// How long a run waits for its claim to become Ready by default.
pub const DEFAULT_CLAIM_TIMEOUT: Duration = Duration::from_secs(60);

/// Every variable this provider reads, with one line of help (plimsolld lists them in
/// `--help`).
pub const VARIABLES: &[Variable] = &[
    (
        "SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE",
        "PEM CA certificates the pod certificate must chain to (required)",
    ),
    (
        "SANDBOX_AGENTSANDBOX_SANDBOXD_SERVER_NAME",
        "name checked in the pod certificate (default sandboxd.plimsoll.invalid)",
    ),
    (
        "SANDBOX_AGENTSANDBOX_SANDBOXD_TOKEN_FILE",
        "the sandboxd token plimsolld presents (required unless client certificates are on)",
    ),
    (
        POD_IDENTITY,
        "shared (default: one certificate for every pod, checked by name) or ip (each pod's certificate must carry the IP dialed)",
    ),
    (
        CLIENT_CERT_FILE,
        "plimsolld's client certificate (PEM chain) for mutual TLS to the pods; re-read on change",
    ),
    (
        CLIENT_KEY_FILE,
        "the client certificate's private key (PEM); set together with the certificate",
    ),
    (
        "SANDBOX_AGENTSANDBOX_NAMESPACE",
        "namespace of the warm pool (default plimsoll-sandboxes)",
    ),
    (
        "SANDBOX_AGENTSANDBOX_TEMPLATE",
        "SandboxTemplate name (default plimsoll-sandboxd)",
    ),
    (
        "SANDBOX_AGENTSANDBOX_WARM_POOL",
        "SandboxWarmPool name (default plimsoll-pool)",
    ),
    (
        "SANDBOX_AGENTSANDBOX_KUBECONFIG",
        "kubeconfig file for the Kubernetes API (default: in-cluster, then KUBECONFIG)",
    ),
    (
        "SANDBOX_AGENTSANDBOX_CLAIM_TIMEOUT_MS",
        "how long a run waits for its SandboxClaim to be Ready (default 60000); then capacity",
    ),
    (
        ENCRYPTED_POD_NETWORK,
        "operator's statement that the pod network is authenticated and encrypted",
    ),
];

/// The operator's statement hardened mode needs unless per-pod identity and client
/// certificates are both on.
const ENCRYPTED_POD_NETWORK: &str = "SANDBOX_AGENTSANDBOX_ENCRYPTED_POD_NETWORK";
/// What a pod's certificate must prove besides its chain: `shared` or `ip`.
const POD_IDENTITY: &str = "SANDBOX_AGENTSANDBOX_POD_IDENTITY";
/// plimsolld's client certificate for mutual TLS.
const CLIENT_CERT_FILE: &str = "SANDBOX_AGENTSANDBOX_CLIENT_CERT_FILE";
/// Its key.
const CLIENT_KEY_FILE: &str = "SANDBOX_AGENTSANDBOX_CLIENT_KEY_FILE";

/// Everything the agent-sandbox provider needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSandboxConfig {
    /// PEM CA certificates the pod certificate must chain to (never the system's roots).
    pub ca_file: PathBuf,
    /// The name checked in the pod certificate.
    pub server_name: String,
    /// The file holding the sandboxd token plimsolld presents (first non-empty line).
    /// `None` only with a client certificate: calls then carry no token.
    pub token_file: Option<PathBuf>,
    /// What a pod's certificate must prove besides its chain to the CA file.
    pub pod_identity: PodIdentity,
    /// plimsolld's client certificate and key (mutual TLS), re-read when they change.
    pub client_cert: Option<ClientPair>,
    /// Namespace of the template, warm pool and claims.
    pub namespace: String,
    /// The SandboxTemplate read back at startup.
    pub template: String,
    /// The SandboxWarmPool claims are made on.
    pub warm_pool: String,
    /// An explicit kubeconfig; `None` means in-cluster configuration, then `KUBECONFIG`.
    pub kubeconfig: Option<PathBuf>,
    /// How long a run waits for its claim to become Ready before it is refused as
    /// `capacity`.
    pub claim_timeout: Duration,
    /// The longest pause between two reads of a claim while waiting for it.
    pub claim_poll_max: Duration,
    /// The port dialed on each pod. Always 9090 in production; there is no variable for
    /// it. Test hook: tests that run many fake pods on one machine set it through this
    /// field.
    pub sandboxd_port: u16,
    /// `SANDBOX_AGENTSANDBOX_ENCRYPTED_POD_NETWORK`: the operator's statement that the pod
    /// network is authenticated and encrypted (hardened mode needs it).
    pub encrypted_pod_network: bool,
    /// Sessions are on (`SANDBOX_MAX_SESSIONS` > 0): the template's sandboxd must then run
    /// with `--session`, since a session's pod serves every call of it.
    pub sessions: bool,
}

impl AgentSandboxConfig {
    /// A configuration with the defaults, for the given CA and token files.
    pub fn new(ca_file: impl Into<PathBuf>, token_file: impl Into<PathBuf>) -> AgentSandboxConfig {
        AgentSandboxConfig {
            ca_file: ca_file.into(),
            server_name: plimsoll_tls::DEFAULT_SERVER_NAME.to_owned(),
            token_file: Some(token_file.into()),
            pod_identity: PodIdentity::Shared,
            client_cert: None,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            template: DEFAULT_TEMPLATE.to_owned(),
            warm_pool: DEFAULT_WARM_POOL.to_owned(),
            kubeconfig: None,
            claim_timeout: DEFAULT_CLAIM_TIMEOUT,
            claim_poll_max: Duration::from_millis(250),
            sandboxd_port: SANDBOXD_PORT,
            encrypted_pod_network: false,
            sessions: false,
        }
    }

    /// Reads the `SANDBOX_AGENTSANDBOX_*` variables (unset or empty means the default). The
    /// CA file and the token file are required.
    pub fn read(env: &dyn EnvSource) -> Result<AgentSandboxConfig, ConfigError> {
        let v = Vars::new(env);
        let ca_file = v.string("SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE").ok_or_else(|| ConfigError::new(
            "SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE",
            "is required with SANDBOX_PROVIDER=agentsandbox: set it to a PEM file holding the \
             CA certificate(s) the pods' sandboxd certificate chains to (see docs/agent-sandbox.md)",
        ))?;
        let cert = v.path(CLIENT_CERT_FILE);
        let key = v.path(CLIENT_KEY_FILE);
        let client_cert = match (cert, key) {
            (Some(cert_file), Some(key_file)) => Some(ClientPair { cert_file, key_file }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::new(
                    CLIENT_KEY_FILE,
                    format!("is required when {CLIENT_CERT_FILE} is set: the client certificate's private key (PEM)"),
                ))
            }
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    CLIENT_CERT_FILE,
                    format!("is required when {CLIENT_KEY_FILE} is set: the client certificate (PEM chain, leaf first)"),
                ))
            }
        };
        let token_file = v.path("SANDBOX_AGENTSANDBOX_SANDBOXD_TOKEN_FILE");
        if token_file.is_none() && client_cert.is_none() {
            return Err(ConfigError::new(
                "SANDBOX_AGENTSANDBOX_SANDBOXD_TOKEN_FILE",
                format!("is required with SANDBOX_PROVIDER=agentsandbox unless client certificates are on \
                 ({CLIENT_CERT_FILE} and {CLIENT_KEY_FILE}): set it to the file holding the sandboxd token \
                 (the same token the pods' --token-file holds)"),
            ));
        }
        let pod_identity = match v.string(POD_IDENTITY) {
            None => PodIdentity::Shared,
            Some(s) => PodIdentity::parse(&s).ok_or_else(|| {
                ConfigError::new(
                    POD_IDENTITY,
                    format!("{s:?} is not a pod identity mode; use shared (one certificate for every pod) or ip (each pod's certificate carries its IP)"),
                )
            })?,
        };
        let mut c = AgentSandboxConfig::new(ca_file, PathBuf::new());
        c.token_file = token_file;
        c.pod_identity = pod_identity;
        c.client_cert = client_cert;
        if let Some(name) = v.string("SANDBOX_AGENTSANDBOX_SANDBOXD_SERVER_NAME") {
            if !rustls_name_ok(&name) {
                return Err(ConfigError::new(
                    "SANDBOX_AGENTSANDBOX_SANDBOXD_SERVER_NAME",
                    format!("{name:?} is not a DNS name; use the name in the pods' certificate"),
                ));
            }
            c.server_name = name;
        }
        for (name, slot) in [
            ("SANDBOX_AGENTSANDBOX_NAMESPACE", &mut c.namespace),
            ("SANDBOX_AGENTSANDBOX_TEMPLATE", &mut c.template),
            ("SANDBOX_AGENTSANDBOX_WARM_POOL", &mut c.warm_pool),
        ] {
            if let Some(value) = v.string(name) {
                if !is_dns_label_or_subdomain(&value) {
                    return Err(ConfigError::new(
                        name,
                        format!("{value:?} is not a Kubernetes object name (lower-case letters, digits, '-' and '.')"),
                    ));
                }
                *slot = value;
            }
        }
        c.kubeconfig = v.path("SANDBOX_AGENTSANDBOX_KUBECONFIG");
        c.claim_timeout = v.millis(
            "SANDBOX_AGENTSANDBOX_CLAIM_TIMEOUT_MS",
            DEFAULT_CLAIM_TIMEOUT,
        )?;
        c.encrypted_pod_network = v.bool(ENCRYPTED_POD_NETWORK)?;
        Ok(c)
    }
}

impl ProviderSetup for AgentSandboxConfig {
    const NAME: &'static str = NAME;
    const VARIABLES: &'static [Variable] = VARIABLES;

    fn from_env(env: &dyn EnvSource, shared: &Shared) -> Result<Self, ConfigError> {
        let mut c = AgentSandboxConfig::read(env)?;
        c.sessions = shared.sessions;
        Ok(c)
    }

    /// The statement is a boolean like every other, checked whatever the provider.
    fn check_unselected(env: &dyn EnvSource, _: &str) -> Result<(), ConfigError> {
        Vars::new(env).bool(ENCRYPTED_POD_NETWORK).map(|_| ())
    }

    fn build(&self) -> Result<Arc<dyn Provider>, ProviderStartError> {
        Ok(Arc::new(crate::AgentSandboxProvider::new(self.clone())?))
    }

    /// With per-pod identity, the statement is no longer needed, but client certificates
    /// are (a pod that proves its address is only half the channel); without it, the
    /// statement still is.
    fn hardened_gaps(&self) -> Vec<String> {
        match self.pod_identity {
            PodIdentity::Ip if self.client_cert.is_some() => Vec::new(),
            PodIdentity::Ip => vec![format!(
                "{CLIENT_CERT_FILE} is not set; with {POD_IDENTITY}=ip hardened mode needs mutual TLS too: set it and {CLIENT_KEY_FILE} to plimsolld's client certificate, and PLIMSOLL_SANDBOXD_CLIENT_CA in the pods"
            )],
            PodIdentity::Shared if self.encrypted_pod_network => Vec::new(),
            PodIdentity::Shared => vec![format!(
                "{ENCRYPTED_POD_NETWORK} is not 1; with one certificate shared by every pod, hardened mode needs your statement that the pod network is authenticated and encrypted (or per-pod identity: {POD_IDENTITY}=ip with client certificates)"
            )],
        }
    }
}

impl AgentSandboxConfig {
    /// The TLS client spec: the CA file, the server name, the pod identity and the client
    /// certificate.
    pub fn client_spec(&self) -> ClientSpec {
        ClientSpec {
            ca_file: self.ca_file.clone(),
            server_name: self.server_name.clone(),
            identity: self.pod_identity,
            client_cert: self.client_cert.clone(),
        }
    }

    /// What the template must carry for this channel (read-back).
    pub fn channel(&self) -> crate::readback::Channel {
        crate::readback::Channel {
            pod_identity: self.pod_identity,
            client_certs: self.client_cert.is_some(),
        }
    }
}

fn rustls_name_ok(name: &str) -> bool {
    rustls_pki_types::ServerName::try_from(name.to_owned()).is_ok()
}

/// A Kubernetes object name: at most 253 characters of `[a-z0-9.-]`, starting and ending
/// with a letter or digit.
pub fn is_dns_label_or_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> plimsoll_config::MapEnv {
        plimsoll_config::MapEnv::from_pairs(pairs.iter().copied())
    }

    const BASE: [(&str, &str); 2] = [
        (
            "SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE",
            "/etc/plimsoll/ca.pem",
        ),
        (
            "SANDBOX_AGENTSANDBOX_SANDBOXD_TOKEN_FILE",
            "/etc/plimsoll/token",
        ),
    ];

    #[test]
    fn the_ca_file_is_required_and_named() {
        let e = AgentSandboxConfig::read(&env(&[BASE[1]])).unwrap_err();
        assert_eq!(e.name, "SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE");
        assert!(e.message.contains("required"), "{e}");
        let e = AgentSandboxConfig::read(&env(&[BASE[0]])).unwrap_err();
        assert_eq!(e.name, "SANDBOX_AGENTSANDBOX_SANDBOXD_TOKEN_FILE");
    }

    #[test]
    fn defaults_match_the_shipped_manifests_and_the_contract() {
        let c = AgentSandboxConfig::read(&env(&BASE)).unwrap();
        assert_eq!(c.server_name, "sandboxd.plimsoll.invalid");
        assert_eq!(c.sandboxd_port, 9090);
        assert_eq!(c.namespace, "plimsoll-sandboxes");
        assert_eq!(c.template, "plimsoll-sandboxd");
        assert_eq!(c.warm_pool, "plimsoll-pool");
        assert_eq!(c.kubeconfig, None);
        assert_eq!(c.claim_timeout, Duration::from_secs(60));
    }

    #[test]
    fn bad_values_name_their_variable() {
        for (k, v) in [
            ("SANDBOX_AGENTSANDBOX_SANDBOXD_SERVER_NAME", "not a name"),
            ("SANDBOX_AGENTSANDBOX_NAMESPACE", "Upper"),
            ("SANDBOX_AGENTSANDBOX_TEMPLATE", "-x"),
            ("SANDBOX_AGENTSANDBOX_WARM_POOL", "a/b"),
            ("SANDBOX_AGENTSANDBOX_CLAIM_TIMEOUT_MS", "0"),
            ("SANDBOX_AGENTSANDBOX_CLAIM_TIMEOUT_MS", "soon"),
        ] {
            let mut pairs = BASE.to_vec();
            pairs.push((k, v));
            let e = AgentSandboxConfig::read(&env(&pairs)).unwrap_err();
            assert_eq!(e.name, k, "{k}={v}: {e}");
        }
    }

    #[test]
    fn explicit_values_are_taken() {
        let mut pairs = BASE.to_vec();
        pairs.extend([
            (
                "SANDBOX_AGENTSANDBOX_SANDBOXD_SERVER_NAME",
                "pods.example.internal",
            ),
            ("SANDBOX_AGENTSANDBOX_KUBECONFIG", "/tmp/kc"),
            ("SANDBOX_AGENTSANDBOX_CLAIM_TIMEOUT_MS", "1500"),
        ]);
        let c = AgentSandboxConfig::read(&env(&pairs)).unwrap();
        assert_eq!(c.server_name, "pods.example.internal");
        assert_eq!(c.kubeconfig, Some(PathBuf::from("/tmp/kc")));
        assert_eq!(c.claim_timeout, Duration::from_millis(1500));
    }

    #[test]
    fn pod_identity_and_client_certificates_are_read_and_checked() {
        let mut pairs = BASE.to_vec();
        pairs.push((POD_IDENTITY, "ip"));
        pairs.push((CLIENT_CERT_FILE, "/c/tls.crt"));
        pairs.push((CLIENT_KEY_FILE, "/c/tls.key"));
        let c = AgentSandboxConfig::read(&env(&pairs)).unwrap();
        assert_eq!(c.pod_identity, PodIdentity::Ip);
        assert_eq!(
            c.client_cert,
            Some(ClientPair {
                cert_file: "/c/tls.crt".into(),
                key_file: "/c/tls.key".into()
            })
        );
        assert_eq!(c.client_spec().files().len(), 3);
        assert!(c.channel().client_certs);

        // The token file is optional once a client certificate is set, and only then.
        let no_token = [
            BASE[0],
            (CLIENT_CERT_FILE, "/c/tls.crt"),
            (CLIENT_KEY_FILE, "/c/tls.key"),
        ];
        let c = AgentSandboxConfig::read(&env(&no_token)).unwrap();
        assert_eq!(c.token_file, None);
        let e = AgentSandboxConfig::read(&env(&[BASE[0]])).unwrap_err();
        assert_eq!(e.name, "SANDBOX_AGENTSANDBOX_SANDBOXD_TOKEN_FILE");
        assert!(e.message.contains(CLIENT_CERT_FILE), "{e}");

        for (extra, named) in [
            (vec![(POD_IDENTITY, "pod")], POD_IDENTITY),
            (vec![(CLIENT_CERT_FILE, "/c/tls.crt")], CLIENT_KEY_FILE),
            (vec![(CLIENT_KEY_FILE, "/c/tls.key")], CLIENT_CERT_FILE),
        ] {
            let mut pairs = BASE.to_vec();
            pairs.extend(extra);
            let e = AgentSandboxConfig::read(&env(&pairs)).unwrap_err();
            assert_eq!(e.name, named, "{e}");
        }
    }

    #[test]
    fn hardened_mode_needs_the_statement_unless_per_pod_identity_with_client_certificates() {
        let pair = ClientPair {
            cert_file: "/c".into(),
            key_file: "/k".into(),
        };
        for (identity, client, statement, gap) in [
            (
                PodIdentity::Shared,
                false,
                false,
                Some(ENCRYPTED_POD_NETWORK),
            ),
            (
                PodIdentity::Shared,
                true,
                false,
                Some(ENCRYPTED_POD_NETWORK),
            ),
            (PodIdentity::Shared, false, true, None),
            (PodIdentity::Ip, false, false, Some(CLIENT_CERT_FILE)),
            (PodIdentity::Ip, false, true, Some(CLIENT_CERT_FILE)),
            (PodIdentity::Ip, true, false, None),
        ] {
            let mut c = AgentSandboxConfig::new("/ca", "/t");
            c.pod_identity = identity;
            c.client_cert = client.then(|| pair.clone());
            c.encrypted_pod_network = statement;
            let gaps = c.hardened_gaps();
            match gap {
                None => assert!(gaps.is_empty(), "{identity} {client} {statement}: {gaps:?}"),
                Some(name) => {
                    assert_eq!(gaps.len(), 1, "{gaps:?}");
                    assert!(
                        gaps[0].starts_with(name),
                        "{identity} {client} {statement}: {gaps:?}"
                    );
                }
            }
        }
    }
}
