//! A fake Kubernetes API server and agent-sandbox controller, for the agentsandbox
//! provider's tests and `cargo xtask bench agentsandbox` (never in plimsolld).
//!
//! The server speaks real HTTP/1.1 and JSON on a loopback port, for exactly the endpoints
//! plimsolld uses: get SandboxTemplate, get SandboxWarmPool, list NetworkPolicies, and
//! create/get/delete SandboxClaim. The controller gives each new claim a pod: a REAL
//! `plimsoll-sandboxd-tls` + `plimsoll-sandboxd` pair started from built binaries, on its
//! own loopback address (127.x.y.z) with certificates generated here, and fills in the
//! claim's status once the pod accepts TCP (as a `tcpSocket` readiness probe would).
//! Deleting the claim kills the pod's process group.
//!
//! With per-pod identity ([`FakeClusterOptions::per_pod`]) each pod gets its own
//! certificate from the cluster's CA carrying its own loopback address as an IP subject
//! alternative name, written as cert-manager's CSI driver writes it (`tls.crt`, `tls.key`,
//! `ca.crt`, mode 0440, behind a `..data` symlink swapped on renewal); with client
//! certificates on, every pod's terminator requires plimsolld's client certificate
//! (`PLIMSOLL_SANDBOXD_CLIENT_CA`). [`PodMode`] makes pods misbehave: serve another pod's
//! certificate, one without the IP, or answer a claim's address from another pod.
//!
//! It must only ever listen on, and point plimsolld at, loopback addresses.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use plimsoll_agentsandbox::config::AgentSandboxConfig;
use plimsoll_agentsandbox::crd::{GROUP, VERSION};
use plimsoll_agentsandbox::readback::{SECRET_MOUNT, TERMINATOR};

use crate::ca::Ca;
use crate::net::free_port;

/// The namespace of the fake cluster's objects.
pub const NAMESPACE: &str = "plimsoll-sandboxes";
/// The fake template's name.
pub const TEMPLATE: &str = "plimsoll-sandboxd";
/// The fake warm pool's name.
pub const WARM_POOL: &str = "plimsoll-pool";
/// The token the fake pods accept (written to the cluster's token file).
pub const TOKEN: &str = "fake-cluster-sandboxd-token-0123456789";

/// A CA and one server certificate signed by it, as PEM.
#[derive(Clone)]
pub struct Pki {
    /// The CA certificate.
    pub ca_pem: String,
    /// The server certificate.
    pub cert_pem: String,
    /// The server key.
    pub key_pem: String,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pki(<pem>)")
    }
}

impl Pki {
    /// A fresh CA and a server certificate for `server_name`, signed by it.
    pub fn generate(server_name: &str) -> Pki {
        // A name of its own per CA: two CAs with one name would make a foreign pod look
        // like a bad signature from the expected issuer instead of an unknown issuer.
        let ca = Ca::unique("plimsoll fake-cluster CA");
        let leaf = ca.leaf(&[server_name]);
        Pki {
            ca_pem: ca.pem(),
            cert_pem: leaf.cert_pem,
            key_pem: leaf.key_pem,
        }
    }
}

/// What the controller does with the next claims.
#[derive(Debug, Clone)]
pub enum PodMode {
    /// Give each claim a pod serving the cluster's certificate (its own, with per-pod
    /// identity).
    Serve,
    /// Never make a claim Ready (an empty pool that never fills).
    NeverReady,
    /// Give each claim a cold-started pod serving this certificate instead.
    ServeCert(Pki),
    /// Give each claim a cold-started pod serving another living pod's own certificate and
    /// key (a pod holding a neighbour's key).
    OtherPodCert,
    /// Give each claim a cold-started pod serving a certificate of the cluster's CA that
    /// carries the server name but no IP address.
    CertWithoutIp,
    /// Report an address in the claim's status at which a relay forwards every connection
    /// to another pod of the deployment (same CA, its own correct certificate for its own
    /// address): a pod network that rewrites where connections go.
    Redirect,
}

/// What a new pod serves.
enum PodCert<'a> {
    /// The cluster's shared certificate, or with per-pod identity its own.
    Own,
    /// This pair.
    Pki(&'a Pki),
    /// A per-pod certificate of the cluster's CA for this address.
    ForIp(Ipv4Addr),
    /// A certificate of the cluster's CA with the server name only.
    NameOnly,
}

/// What the fake saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Claims created.
    pub created: u64,
    /// Claims deleted (that existed).
    pub deleted: u64,
    /// Claims that exist now.
    pub live: usize,
    /// Pods started (warm and cold).
    pub pods_started: u64,
}

/// How the fake cluster is set up.
#[derive(Debug, Clone)]
pub struct FakeClusterOptions {
    /// The SandboxTemplate served.
    pub template: Value,
    /// The SandboxWarmPool served.
    pub warm_pool: Value,
    /// The NetworkPolicies listed in the namespace.
    pub policies: Vec<Value>,
    /// Where the built `plimsoll-sandboxd-tls` and `plimsoll-sandboxd` are.
    pub bin_dir: PathBuf,
    /// Pods kept started and ready ahead of claims.
    pub warm: usize,
    /// Pods run sandboxd with `--session` (as the template then says), for sessions.
    pub session: bool,
    /// Each pod serves its own certificate carrying its address (cert-manager's CSI
    /// driver), and the provider checks it (`SANDBOX_AGENTSANDBOX_POD_IDENTITY=ip`).
    pub per_pod_identity: bool,
    /// Pods require a client certificate from the cluster's client CA, and the provider
    /// presents one.
    pub client_certs: bool,
    /// A file every pod's terminator starts holding open at descriptor 7 without
    /// close-on-exec, as a process the pod's runtime leaked a descriptor to would (the
    /// escape suite's inherited-descriptor check).
    pub pods_hold: Option<PathBuf>,
}

impl FakeClusterOptions {
    /// A cluster whose template, pool and NetworkPolicy pass the read-back, with the
    /// gVisor runtime class (tier `kernel`) and one warm pod.
    pub fn conforming(bin_dir: PathBuf) -> FakeClusterOptions {
        FakeClusterOptions {
            template: conforming_template(),
            warm_pool: json!({
                "apiVersion": format!("{GROUP}/{VERSION}"), "kind": "SandboxWarmPool",
                "metadata": {"name": WARM_POOL, "namespace": NAMESPACE},
                "spec": {"replicas": 1, "sandboxTemplateRef": {"name": TEMPLATE}},
            }),
            policies: vec![conforming_policy()],
            bin_dir,
            warm: 1,
            session: false,
            per_pod_identity: false,
            client_certs: false,
            pods_hold: None,
        }
    }

    /// [`FakeClusterOptions::conforming`] with per-pod identity and mutual TLS: the
    /// template mounts a CSI certificate volume and gives the terminator its client CA
    /// ([`per_pod_template`]), each pod serves a certificate for its own address, and
    /// every terminator requires plimsolld's client certificate.
    pub fn per_pod(bin_dir: PathBuf) -> FakeClusterOptions {
        let mut o = FakeClusterOptions::conforming(bin_dir);
        o.template = per_pod_template();
        o.per_pod_identity = true;
        o.client_certs = true;
        o
    }

    /// [`FakeClusterOptions::conforming`] for sessions: the template's and the pods'
    /// sandboxd run with `--session`.
    pub fn sessions(bin_dir: PathBuf) -> FakeClusterOptions {
        let mut o = FakeClusterOptions::conforming(bin_dir);
        if let Some(args) =
            o.template["spec"]["podTemplate"]["spec"]["containers"][0]["args"].as_array_mut()
        {
            args.push(json!("--session"));
        }
        o.session = true;
        o
    }
}

/// A template that passes the read-back (runtime class `gvisor`).
pub fn conforming_template() -> Value {
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"), "kind": "SandboxTemplate",
        "metadata": {"name": TEMPLATE, "namespace": NAMESPACE},
        "spec": {
            "networkPolicyManagement": "Unmanaged",
            "podTemplate": {
                "metadata": {"labels": {"app.kubernetes.io/name": "plimsoll-sandboxd"}},
                "spec": {
                    "runtimeClassName": "gvisor",
                    "automountServiceAccountToken": false,
                    "containers": [{
                        "name": "sandboxd",
                        "image": "registry.example.invalid/plimsoll/agentsandbox@sha256:0000000000000000000000000000000000000000000000000000000000000000",
                        "command": [TERMINATOR],
                        "args": ["--listen-host=127.0.0.1", "--grpc-port=9091",
                                 "--token-file=/etc/plimsoll/sandboxd-token/token", "--root-dir=/workspace",
                                 "--run-as=65532:65532"],
                        "ports": [{"name": "sandboxd-tls", "containerPort": 9090, "protocol": "TCP"}],
                        "securityContext": {"runAsUser": 0, "runAsNonRoot": false, "allowPrivilegeEscalation": false,
                            "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"]}},
                        "volumeMounts": [
                            {"name": "sandboxd-tls", "mountPath": SECRET_MOUNT, "readOnly": true},
                            {"name": "sandboxd-token", "mountPath": "/etc/plimsoll/sandboxd-token", "readOnly": true}
                        ]
                    }],
                    "volumes": [
                        {"name": "sandboxd-tls", "secret": {"secretName": "plimsoll-sandboxd-tls", "defaultMode": 256}},
                        {"name": "sandboxd-token", "secret": {"secretName": "plimsoll-sandboxd-token", "defaultMode": 256}}
                    ]
                }
            }
        }
    })
}

/// Where the per-pod template mounts the client CA ConfigMap.
pub const CLIENT_CA_MOUNT: &str = "/etc/plimsoll/sandboxd-client-ca";

/// [`conforming_template`] with per-pod identity and mutual TLS: the volume at the TLS
/// mount is cert-manager's CSI driver issuing a 24-hour certificate for `${POD_IP}`, and
/// the terminator is given its client CA through `PLIMSOLL_SANDBOXD_CLIENT_CA`, a
/// read-only ConfigMap.
pub fn per_pod_template() -> Value {
    let mut t = conforming_template();
    let pod = &mut t["spec"]["podTemplate"]["spec"];
    pod["volumes"][0] = json!({"name": "sandboxd-tls", "csi": {
    "driver": "csi.cert-manager.io", "readOnly": true,
    "volumeAttributes": {
        "csi.cert-manager.io/issuer-name": "plimsoll-sandboxd-ca",
        "csi.cert-manager.io/issuer-kind": "Issuer",
        "csi.cert-manager.io/ip-sans": "${POD_IP}",
        "csi.cert-manager.io/duration": "24h",
        "csi.cert-manager.io/renew-before": "8h"
    }}});
    if let Some(v) = pod["volumes"].as_array_mut() {
        v.push(json!({"name": "sandboxd-client-ca",
            "configMap": {"name": "plimsoll-sandboxd-client-ca"}}));
    }
    let c = &mut pod["containers"][0];
    c["env"] = json!([{"name": plimsoll_tls::CLIENT_CA_VAR,
        "value": format!("{CLIENT_CA_MOUNT}/ca.crt")}]);
    if let Some(m) = c["volumeMounts"].as_array_mut() {
        m.push(
            json!({"name": "sandboxd-client-ca", "mountPath": CLIENT_CA_MOUNT, "readOnly": true}),
        );
    }
    t
}

/// A NetworkPolicy that passes the read-back: ingress only to TCP 9090, no egress.
pub fn conforming_policy() -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "plimsoll-sandboxd", "namespace": NAMESPACE},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "plimsoll-sandboxd"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{
                "from": [{
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "plimsoll"}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "plimsolld"}}
                }],
                "ports": [{"protocol": "TCP", "port": 9090}]
            }],
            "egress": []
        }
    })
}

/// Builds `plimsoll-sandboxd` and `plimsoll-sandboxd-tls` (once per process) into the
/// target directory the running executable lives in, and returns that profile directory.
///
/// Integration tests of this crate cannot use `CARGO_BIN_EXE_*` for another package's
/// binaries, so they run `cargo build -p …` for the same profile and target directory
/// (a no-op when the binaries are fresh, as under `cargo test --workspace`).
pub fn sandboxd_binaries() -> Result<PathBuf, String> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        // The package that builds the `plimsoll-sandboxd` binary (the library owns the
        // name `plimsoll-sandboxd`).
        built(
            &["plimsoll-sandboxd-bin", "plimsoll-sandboxd-tls"],
            &["plimsoll-sandboxd", "plimsoll-sandboxd-tls"],
        )
    })
    .clone()
}

/// Runs `cargo build -p` of `packages` for the profile and target directory the running
/// executable lives in; returns that profile directory once every one of `bins` is there.
pub(crate) fn built(packages: &[&str], bins: &[&str]) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // target/<profile>/deps/<test> → target/<profile>
    let profile_dir = exe
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "deps"))
        .and_then(Path::parent)
        .or_else(|| exe.parent())
        .ok_or("cannot locate the target directory")?
        .to_owned();
    let target_dir = profile_dir
        .parent()
        .ok_or("cannot locate the target directory")?;
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.current_dir(&workspace).args(["build", "--quiet"]);
    for p in packages {
        cmd.args(["-p", p]);
    }
    cmd.arg("--target-dir").arg(target_dir);
    if release {
        cmd.arg("--release");
    }
    let out = cmd.output().map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo build of {packages:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    for b in bins {
        if !profile_dir.join(b).is_file() {
            return Err(format!("{} was not built", profile_dir.join(b).display()));
        }
    }
    Ok(profile_dir)
}

/// A pod: a running terminator (which runs sandboxd) on its own loopback address.
struct Pod {
    name: String,
    ip: Ipv4Addr,
    pgid: i32,
    tls_dir: PathBuf,
    /// The address the claim's status states, when it is not the pod's own
    /// ([`PodMode::Redirect`]), and the relay that forwards it.
    stated: Option<(Ipv4Addr, tokio::task::JoinHandle<()>)>,
    _child: tokio::process::Child,
}

impl Pod {
    fn kill(&self) {
        use nix::sys::signal::{killpg, Signal};
        let _ = killpg(nix::unistd::Pid::from_raw(self.pgid), Signal::SIGKILL);
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.kill();
        if let Some((_, relay)) = &self.stated {
            relay.abort();
        }
    }
}

struct State {
    template: Value,
    warm_pool: Value,
    policies: Vec<Value>,
    claims: BTreeMap<String, Value>,
    bound: HashMap<String, Pod>,
    warm: VecDeque<Pod>,
    mode: PodMode,
    counts: Counts,
    requests: Vec<String>,
    resource_version: u64,
}

struct Inner {
    state: Mutex<State>,
    dir: PathBuf,
    bin_dir: PathBuf,
    pki: Pki,
    /// The CA behind `pki`, which signs per-pod certificates.
    ca: Ca,
    per_pod: bool,
    /// The client CA file the pods require a certificate from (mutual TLS).
    client_ca_file: Option<PathBuf>,
    /// That CA, which issues renewed client certificates.
    client_ca: Option<Ca>,
    port: u16,
    warm_target: usize,
    token_file: PathBuf,
    session: bool,
    pods_hold: Option<PathBuf>,
}

/// The fake cluster: API server, controller and pods.
pub struct FakeCluster {
    inner: Arc<Inner>,
    api_addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for FakeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeCluster")
            .field("api", &self.api_addr)
            .field("pod_port", &self.inner.port)
            .finish()
    }
}

fn lock(inner: &Inner) -> std::sync::MutexGuard<'_, State> {
    inner.state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Loopback addresses for pods: 127.<100 + pid % 100>.y.z, distinct within a process.
fn next_pod_ip() -> Ipv4Addr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let second = 100 + (std::process::id() % 100) as u8;
    Ipv4Addr::new(127, second, ((n / 250) % 250) as u8, (n % 250) as u8 + 2)
}

impl FakeCluster {
    /// Starts the API server, writes the kubeconfig, CA and token files, and starts the
    /// warm pods.
    pub async fn start(opts: FakeClusterOptions) -> std::io::Result<FakeCluster> {
        let dir = tempfile::Builder::new()
            .prefix("plimsoll-fake-cluster")
            .tempdir()?;
        let ca = Ca::unique("plimsoll fake-cluster CA");
        let leaf = ca.leaf(&[plimsoll_tls::DEFAULT_SERVER_NAME]);
        let pki = Pki {
            ca_pem: ca.pem(),
            cert_pem: leaf.cert_pem,
            key_pem: leaf.key_pem,
        };
        std::fs::write(dir.path().join("ca.pem"), &pki.ca_pem)?;
        let (client_ca, client_ca_file) = if opts.client_certs {
            // plimsolld's client certificate, from a CA of its own (the pods' client CA).
            let client_ca = Ca::unique("plimsoll fake-cluster client CA");
            let client = client_ca.client_leaf("plimsolld.plimsoll.invalid");
            std::fs::write(dir.path().join("client-ca.pem"), client_ca.pem())?;
            std::fs::write(dir.path().join("client.crt"), &client.cert_pem)?;
            std::fs::write(dir.path().join("client.key"), &client.key_pem)?;
            (Some(client_ca), Some(dir.path().join("client-ca.pem")))
        } else {
            (None, None)
        };
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, format!("{TOKEN}\n"))?;
        {
            use std::os::unix::fs::PermissionsExt;
            // As the kubelet mounts the Secret (defaultMode 0400): only sandboxd's user reads
            // it. The cluster's folder is passable but not listable, so a run's user can reach
            // its pod's working directory and nothing else by name.
            std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o400))?;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let api_addr = listener.local_addr()?;
        std::fs::write(
            dir.path().join("kubeconfig"),
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{api_addr}\n\
                 contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: {NAMESPACE}\n\
                 current-context: fake\nusers:\n- name: fake\n  user: {{}}\n"
            ),
        )?;
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                template: opts.template,
                warm_pool: opts.warm_pool,
                policies: opts.policies,
                claims: BTreeMap::new(),
                bound: HashMap::new(),
                warm: VecDeque::new(),
                mode: PodMode::Serve,
                counts: Counts::default(),
                requests: Vec::new(),
                resource_version: 1,
            }),
            dir: dir.path().to_owned(),
            bin_dir: opts.bin_dir,
            pki,
            ca,
            per_pod: opts.per_pod_identity,
            client_ca_file,
            client_ca,
            port: free_port(),
            warm_target: opts.warm,
            token_file,
            session: opts.session,
            pods_hold: opts.pods_hold.clone(),
        });
        let app = axum::Router::new().fallback({
            let inner = inner.clone();
            move |method: Method, uri: Uri, body: Bytes| {
                let inner = inner.clone();
                async move { handle(&inner, method, uri, body) }
            }
        });
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        for _ in 0..opts.warm {
            let pod = start_pod(&inner, PodCert::Own).await?;
            lock(&inner).warm.push_back(pod);
        }
        Ok(FakeCluster {
            inner,
            api_addr,
            server,
            _dir: dir,
        })
    }

    /// The kubeconfig pointing at the fake API server.
    pub fn kubeconfig(&self) -> PathBuf {
        self.inner.dir.join("kubeconfig")
    }

    /// The CA file whose CA signed the pods' certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.inner.dir.join("ca.pem")
    }

    /// The token file the pods accept.
    pub fn token_file(&self) -> PathBuf {
        self.inner.token_file.clone()
    }

    /// The folder holding one folder per pod ever started (`<pod>/tmp` is the pod's
    /// temporary folder).
    pub fn pods_dir(&self) -> PathBuf {
        self.inner.dir.join("pods")
    }

    /// plimsolld's client certificate and key (with client certificates on).
    pub fn client_pair(&self) -> Option<plimsoll_tls::ClientPair> {
        self.inner
            .client_ca_file
            .as_ref()
            .map(|_| plimsoll_tls::ClientPair {
                cert_file: self.inner.dir.join("client.crt"),
                key_file: self.inner.dir.join("client.key"),
            })
    }

    /// Renews plimsolld's client certificate in place (a fresh key and certificate from
    /// the cluster's client CA, see [`FakeCluster::install_client_pair`]); returns the new
    /// certificate's DER. `None` without client certificates.
    pub fn renew_client_pair(&self) -> Option<Vec<u8>> {
        let leaf = self
            .inner
            .client_ca
            .as_ref()?
            .client_leaf("plimsolld.plimsoll.invalid");
        self.install_client_pair(&leaf)?;
        Some(leaf.der)
    }

    /// Writes `leaf` as plimsolld's client certificate and key, each file replaced by a
    /// rename, as a Secret update lands. `None` without client certificates.
    pub fn install_client_pair(&self, leaf: &crate::ca::Leaf) -> Option<()> {
        let pair = self.client_pair()?;
        for (path, body) in [
            (&pair.key_file, &leaf.key_pem),
            (&pair.cert_file, &leaf.cert_pem),
        ] {
            let tmp = path.with_extension("new");
            std::fs::write(&tmp, body).ok()?;
            std::fs::rename(&tmp, path).ok()?;
        }
        Some(())
    }

    /// The CA file the pods' terminators check client certificates against.
    pub fn client_ca_file(&self) -> Option<PathBuf> {
        self.inner.client_ca_file.clone()
    }

    /// The calls every pod's sandboxd received so far (each logs one line per call that
    /// reached its token check), counted over the logs of every pod ever started, living
    /// or killed.
    pub fn sandboxd_calls(&self) -> usize {
        self.pod_logs().matches("sandboxd call received").count()
    }

    /// Every pod's log so far (the terminator's and sandboxd's lines), living or killed.
    pub fn pod_logs(&self) -> String {
        let Ok(rd) = std::fs::read_dir(self.pods_dir()) else {
            return String::new();
        };
        rd.filter_map(Result::ok)
            .filter_map(|e| std::fs::read_to_string(e.path().join("pod.log")).ok())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Renews every living pod's per-pod certificate in place (a fresh key and
    /// certificate for the same address, written as the CSI driver writes a renewal) and
    /// returns each pod's TLS address with the DER of its new certificate.
    pub fn rotate_pod_certs(&self) -> Vec<(SocketAddr, Vec<u8>)> {
        let s = lock(&self.inner);
        let mut out = Vec::new();
        for pod in s.bound.values().chain(s.warm.iter()) {
            let leaf = self.inner.ca.leaf(&[&pod.ip.to_string()]);
            if write_csi(
                &pod.tls_dir,
                &leaf.cert_pem,
                &leaf.key_pem,
                &self.inner.pki.ca_pem,
            )
            .is_ok()
            {
                out.push((SocketAddr::from((pod.ip, self.inner.port)), leaf.der));
            }
        }
        out
    }

    /// A scratch directory inside the cluster's temporary directory, writable by the runs'
    /// users too (mode 1777, as /tmp), so a test's code can leave a marker there.
    pub fn scratch(&self) -> PathBuf {
        crate::shared_folder(&self.inner.dir, "scratch")
    }

    /// The port every pod's terminator listens on (the provider's `sandboxd_port`).
    pub fn pod_port(&self) -> u16 {
        self.inner.port
    }

    /// The API server's address.
    pub fn api_addr(&self) -> SocketAddr {
        self.api_addr
    }

    /// A provider configuration pointing at this cluster: its kubeconfig, CA file, token
    /// file and pod port, and a 10 s claim timeout.
    pub fn provider_config(&self) -> AgentSandboxConfig {
        let mut c = AgentSandboxConfig::new(self.ca_file(), self.token_file());
        c.namespace = NAMESPACE.into();
        c.template = TEMPLATE.into();
        c.warm_pool = WARM_POOL.into();
        c.kubeconfig = Some(self.kubeconfig());
        c.sandboxd_port = self.pod_port();
        c.claim_timeout = Duration::from_secs(10);
        if self.inner.per_pod {
            c.pod_identity = plimsoll_tls::PodIdentity::Ip;
        }
        c.client_cert = self.client_pair();
        c
    }

    /// Environment pairs for plimsolld's configuration pointing at this cluster (the pod
    /// port still has to be set on the typed configuration).
    pub fn env_pairs(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = vec![
            ("SANDBOX_PROVIDER".into(), "agentsandbox".into()),
            (
                "SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE".into(),
                self.ca_file().display().to_string(),
            ),
            (
                "SANDBOX_AGENTSANDBOX_SANDBOXD_TOKEN_FILE".into(),
                self.token_file().display().to_string(),
            ),
            ("SANDBOX_AGENTSANDBOX_NAMESPACE".into(), NAMESPACE.into()),
            ("SANDBOX_AGENTSANDBOX_TEMPLATE".into(), TEMPLATE.into()),
            ("SANDBOX_AGENTSANDBOX_WARM_POOL".into(), WARM_POOL.into()),
            (
                "SANDBOX_AGENTSANDBOX_KUBECONFIG".into(),
                self.kubeconfig().display().to_string(),
            ),
        ];
        if self.inner.per_pod {
            v.push(("SANDBOX_AGENTSANDBOX_POD_IDENTITY".into(), "ip".into()));
        }
        if let Some(p) = self.client_pair() {
            v.push((
                "SANDBOX_AGENTSANDBOX_CLIENT_CERT_FILE".into(),
                p.cert_file.display().to_string(),
            ));
            v.push((
                "SANDBOX_AGENTSANDBOX_CLIENT_KEY_FILE".into(),
                p.key_file.display().to_string(),
            ));
        }
        v
    }

    /// Changes what the controller does with the next claims.
    pub fn set_mode(&self, mode: PodMode) {
        lock(&self.inner).mode = mode;
    }

    /// Replaces the served template.
    pub fn set_template(&self, template: Value) {
        lock(&self.inner).template = template;
    }

    /// Replaces the listed NetworkPolicies.
    pub fn set_policies(&self, policies: Vec<Value>) {
        lock(&self.inner).policies = policies;
    }

    /// What the fake saw so far.
    pub fn counts(&self) -> Counts {
        let s = lock(&self.inner);
        Counts {
            live: s.claims.len(),
            ..s.counts
        }
    }

    /// Every request served, as `METHOD /path`.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.inner).requests.clone()
    }

    /// Kills the pods bound to claims (their claims stay), as a node failure would; returns
    /// how many.
    pub fn kill_claimed_pods(&self) -> usize {
        let s = lock(&self.inner);
        for p in s.bound.values() {
            p.kill();
        }
        s.bound.len()
    }

    /// Waits (at most 60 s) until the warm pool holds its target number of ready pods, so
    /// the next claim is served warm.
    pub async fn wait_warm(&self) -> bool {
        for _ in 0..1200 {
            if lock(&self.inner).warm.len() >= self.inner.warm_target {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Starts a pod outside any claim (serving the cluster's certificate) and returns its
    /// TLS address; it lives until [`FakeCluster::shutdown`]. For baselines that talk to a
    /// pod without Kubernetes in the way.
    pub async fn standalone_pod(&self) -> std::io::Result<SocketAddr> {
        let pod = start_pod(&self.inner, PodCert::Own).await?;
        let addr = SocketAddr::from((pod.ip, self.inner.port));
        lock(&self.inner)
            .bound
            .insert(format!("standalone-{}", pod.name), pod);
        Ok(addr)
    }

    /// Stops the API server and kills every pod (dropping the cluster does the same).
    pub async fn shutdown(self) {
        drop(self);
    }
}

impl Drop for FakeCluster {
    /// Kills every pod's process group and stops the API server, so a test that panics
    /// leaves nothing running. A pod still starting in a task at this moment is killed when
    /// that task is dropped with the runtime (`kill_on_drop`), and its sandboxd dies with it
    /// (the terminator's parent-death signal).
    fn drop(&mut self) {
        self.server.abort();
        let mut s = lock(&self.inner);
        s.bound.clear();
        s.warm.clear();
    }
}

/// The user a new pod's code runs as (`--run-as`): distinct per pod, unused by anyone else.
/// `None` when the tests do not run as root, which changing users needs; pods then run the
/// code as sandboxd's own user, which the shipped template's read-back refuses.
pub fn run_user() -> Option<u32> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // 61000-64999, away from the ids distributions hand out, different per test process.
    Some(61_000 + (std::process::id() % 40) * 100 + n % 100)
}

/// Writes a certificate volume the way cert-manager's CSI driver does: the files in a
/// fresh timestamped directory (mode 0440), a `..data` symlink swapped to it in one
/// rename, and `tls.crt`, `tls.key`, `ca.crt` as symlinks through `..data`.
fn write_csi(dir: &Path, cert_pem: &str, key_pem: &str, ca_pem: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let stamp = format!("..{}", hex::encode(rand::random::<[u8; 6]>()));
    let data = dir.join(&stamp);
    std::fs::create_dir_all(&data)?;
    for (name, body) in [
        ("tls.crt", cert_pem),
        ("tls.key", key_pem),
        ("ca.crt", ca_pem),
    ] {
        let f = data.join(name);
        std::fs::write(&f, body)?;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o440))?;
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&stamp, &tmp)?;
    let old = std::fs::read_link(dir.join("..data")).ok();
    std::fs::rename(&tmp, dir.join("..data"))?;
    for name in ["tls.crt", "tls.key", "ca.crt"] {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link)?;
        }
    }
    if let Some(old) = old {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
    Ok(())
}

/// Starts a pod serving what `cert` says and waits until it accepts TCP on its TLS port.
async fn start_pod(inner: &Arc<Inner>, cert: PodCert<'_>) -> std::io::Result<Pod> {
    use std::process::Stdio;
    let ip = next_pod_ip();
    let name = format!("{WARM_POOL}-{}", hex::encode(rand::random::<[u8; 3]>()));
    let dir = inner.dir.join("pods").join(&name);
    let tls = dir.join("tls");
    let root = dir.join("root");
    // The pod's own temporary folder (the terminator makes its private socket directory
    // there), removed with the cluster even when the pod is killed.
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tls)?;
    std::fs::create_dir_all(&root)?;
    std::fs::create_dir_all(&tmp)?;
    {
        // As Kubernetes makes an emptyDir: writable by everyone, without the sticky bit.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o777))?;
    }
    let per_pod_leaf = |names: &[&str]| {
        let l = inner.ca.leaf(names);
        (l.cert_pem, l.key_pem)
    };
    let (cert_pem, key_pem) = match cert {
        PodCert::Pki(p) => (p.cert_pem.clone(), p.key_pem.clone()),
        PodCert::Own if inner.per_pod => per_pod_leaf(&[&ip.to_string()]),
        PodCert::Own => (inner.pki.cert_pem.clone(), inner.pki.key_pem.clone()),
        PodCert::ForIp(other) => per_pod_leaf(&[&other.to_string()]),
        PodCert::NameOnly => per_pod_leaf(&[plimsoll_tls::DEFAULT_SERVER_NAME]),
    };
    if inner.per_pod {
        write_csi(&tls, &cert_pem, &key_pem, &inner.pki.ca_pem)?;
    } else {
        std::fs::write(tls.join("tls.crt"), &cert_pem)?;
        std::fs::write(tls.join("tls.key"), &key_pem)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tls.join("tls.key"), std::fs::Permissions::from_mode(0o400))?;
    }
    let log = std::fs::File::create(dir.join("pod.log"))?;
    let listen = SocketAddr::from((ip, inner.port));
    let upstream = SocketAddr::from((ip, inner.port + 1));
    let mut args = vec![
        "--listen-host=127.0.0.1".to_owned(),
        "--grpc-port=9091".to_owned(),
        format!("--token-file={}", inner.token_file.display()),
        format!("--root-dir={}", root.display()),
    ];
    if inner.session {
        args.push("--session".to_owned());
    }
    if let Some(id) = run_user() {
        // As in the shipped template, the code runs as a user of its own. Pods here share
        // one PID namespace, and sandboxd kills every process of its run user after each
        // run, so each pod gets a user no other pod has.
        args.push(format!("--run-as={id}:{id}"));
    }
    let terminator = inner.bin_dir.join("plimsoll-sandboxd-tls");
    let mut cmd = match &inner.pods_hold {
        None => tokio::process::Command::new(&terminator),
        Some(held) => {
            let mut c = tokio::process::Command::new("sh");
            c.arg("-c")
                .arg(format!("exec \"$0\" \"$@\" 7<>'{}'", held.display()))
                .arg(&terminator);
            c
        }
    };
    if let Some(ca) = &inner.client_ca_file {
        cmd.env(plimsoll_tls::CLIENT_CA_VAR, ca);
    }
    let mut child = cmd
        .args(args)
        .env("PLIMSOLL_SANDBOXD_TLS_LISTEN", listen.to_string())
        .env("PLIMSOLL_SANDBOXD_TLS_DIR", &tls)
        .env("PLIMSOLL_SANDBOXD_TLS_UPSTREAM", upstream.to_string())
        .env("TMPDIR", &tmp)
        // Renewals are seen within a fifth of a second (the default is two).
        .env("PLIMSOLL_SANDBOXD_TLS_RELOAD_INTERVAL_MS", "200")
        .env(
            "PLIMSOLL_SANDBOXD_BIN",
            inner.bin_dir.join("plimsoll-sandboxd"),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().unwrap_or(0) as i32;
    lock(inner).counts.pods_started += 1;
    let pod = |child| Pod {
        name: name.clone(),
        ip,
        pgid: pid,
        tls_dir: tls.clone(),
        stated: None,
        _child: child,
    };
    for _ in 0..600 {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.join("pod.log")).unwrap_or_default();
            return Err(std::io::Error::other(format!(
                "fake pod {name} exited ({status}) before it was ready:\n{log}"
            )));
        }
        if tokio::net::TcpStream::connect(listen).await.is_ok() {
            return Ok(pod(child));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let p = pod(child);
    drop(p);
    Err(std::io::Error::other(format!(
        "fake pod {name} did not accept on {listen} within 30 s"
    )))
}

/// The controller's answer to a new claim.
async fn bind_claim(inner: Arc<Inner>, claim: String) {
    let mode = lock(&inner).mode.clone();
    let pod = match mode {
        PodMode::NeverReady => {
            set_claim_status(
                &inner,
                &claim,
                json!({"conditions": [{
                "type": "Ready", "status": "False", "reason": "SandboxNotReady",
                "message": "no warm pod is ready"}]}),
            );
            return;
        }
        PodMode::Serve => {
            let warm = lock(&inner).warm.pop_front();
            match warm {
                Some(p) => {
                    tokio::spawn(replenish(inner.clone()));
                    Ok(p)
                }
                None => start_pod(&inner, PodCert::Own).await,
            }
        }
        PodMode::ServeCert(pki) => start_pod(&inner, PodCert::Pki(&pki)).await,
        PodMode::OtherPodCert => match neighbours_pair(&inner) {
            Some(pki) => start_pod(&inner, PodCert::Pki(&pki)).await,
            None => start_pod(&inner, PodCert::ForIp(next_pod_ip())).await,
        },
        PodMode::CertWithoutIp => start_pod(&inner, PodCert::NameOnly).await,
        PodMode::Redirect => match start_pod(&inner, PodCert::Own).await {
            Ok(mut p) => {
                let stated = next_pod_ip();
                match relay(
                    SocketAddr::from((stated, inner.port)),
                    SocketAddr::from((p.ip, inner.port)),
                )
                .await
                {
                    Ok(task) => {
                        p.stated = Some((stated, task));
                        Ok(p)
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        },
    };
    let pod = match pod {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "fake controller could not start a pod");
            return;
        }
    };
    let mut s = lock(&inner);
    if !s.claims.contains_key(&claim) {
        return; // deleted meanwhile; dropping the pod kills it
    }
    let stated = pod.stated.as_ref().map_or(pod.ip, |(ip, _)| *ip);
    let status = json!({
        "conditions": [{"type": "Ready", "status": "True", "reason": "SandboxReady"}],
        "sandbox": {"name": pod.name, "podIPs": [stated.to_string()]},
    });
    s.resource_version += 1;
    let rv = s.resource_version.to_string();
    if let Some(c) = s.claims.get_mut(&claim) {
        c["status"] = status;
        c["metadata"]["resourceVersion"] = json!(rv);
    }
    s.bound.insert(claim, pod);
}

async fn replenish(inner: Arc<Inner>) {
    if lock(&inner).warm.len() >= inner.warm_target {
        return;
    }
    match start_pod(&inner, PodCert::Own).await {
        Ok(p) => lock(&inner).warm.push_back(p),
        Err(e) => tracing::error!(error = %e, "fake controller could not replenish the pool"),
    }
}

/// The certificate and key a living pod serves (read from its certificate volume).
fn neighbours_pair(inner: &Inner) -> Option<Pki> {
    let s = lock(inner);
    let pod = s.warm.front().or_else(|| s.bound.values().next())?;
    Some(Pki {
        ca_pem: inner.pki.ca_pem.clone(),
        cert_pem: std::fs::read_to_string(pod.tls_dir.join("tls.crt")).ok()?,
        key_pem: std::fs::read_to_string(pod.tls_dir.join("tls.key")).ok()?,
    })
}

/// A TCP relay from `from` to `to` (both loopback): every connection accepted at `from`
/// is copied both ways to a new connection to `to`. Stops when the task is aborted.
async fn relay(from: SocketAddr, to: SocketAddr) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(from).await?;
    Ok(tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        while let Ok((mut a, _)) = listener.accept().await {
            conns.spawn(async move {
                if let Ok(mut b) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
                }
            });
        }
    }))
}

fn set_claim_status(inner: &Inner, claim: &str, status: Value) {
    let mut s = lock(inner);
    if let Some(c) = s.claims.get_mut(claim) {
        c["status"] = status;
    }
}

fn json_response(code: StatusCode, v: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(v).unwrap_or_default(),
    )
        .into_response()
}

fn status(code: StatusCode, reason: &str, message: String) -> Response {
    json_response(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code.as_u16()}),
    )
}

fn handle(inner: &Arc<Inner>, method: Method, uri: Uri, body: Bytes) -> Response {
    let path = uri.path().to_owned();
    lock(inner).requests.push(format!("{method} {path}"));
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let not_found = || {
        status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{path} not found"),
        )
    };
    let ext = ["apis", GROUP, VERSION, "namespaces", NAMESPACE];
    let net = ["apis", "networking.k8s.io", "v1", "namespaces", NAMESPACE];
    if parts.len() >= 6 && parts[..5] == net && parts[5] == "networkpolicies" {
        if parts.len() == 6 && method == Method::GET {
            let items = lock(inner).policies.clone();
            return json_response(
                StatusCode::OK,
                &json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicyList",
                        "metadata": {"resourceVersion": "1"}, "items": items}),
            );
        }
        return not_found();
    }
    if parts.len() < 6 || parts[..5] != ext {
        return not_found();
    }
    let name = parts.get(6).copied();
    match (method, parts[5], name) {
        (Method::GET, "sandboxtemplates", Some(n)) => {
            let t = lock(inner).template.clone();
            if t["metadata"]["name"] == n {
                json_response(StatusCode::OK, &t)
            } else {
                not_found()
            }
        }
        (Method::GET, "sandboxwarmpools", Some(n)) => {
            let p = lock(inner).warm_pool.clone();
            if p["metadata"]["name"] == n {
                json_response(StatusCode::OK, &p)
            } else {
                not_found()
            }
        }
        (Method::POST, "sandboxclaims", None) => {
            let mut claim: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
            };
            let Some(cname) = claim["metadata"]["name"].as_str().map(str::to_owned) else {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "metadata.name is required".into(),
                );
            };
            if claim["spec"]["warmPoolRef"]["name"].as_str().is_none() {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "spec.warmPoolRef.name is required".into(),
                );
            }
            let mut s = lock(inner);
            if s.claims.contains_key(&cname) {
                return status(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    format!("sandboxclaims {cname:?} already exists"),
                );
            }
            s.resource_version += 1;
            claim["metadata"]["uid"] = json!(format!("uid-{}", s.resource_version));
            claim["metadata"]["resourceVersion"] = json!(s.resource_version.to_string());
            claim["metadata"]["creationTimestamp"] = json!(plimsoll_agentsandbox::crd::rfc3339(
                std::time::SystemTime::now()
            ));
            s.claims.insert(cname.clone(), claim.clone());
            s.counts.created += 1;
            drop(s);
            tokio::spawn(bind_claim(inner.clone(), cname));
            json_response(StatusCode::CREATED, &claim)
        }
        (Method::GET, "sandboxclaims", Some(n)) => match lock(inner).claims.get(n) {
            Some(c) => json_response(StatusCode::OK, c),
            None => not_found(),
        },
        (Method::DELETE, "sandboxclaims", Some(n)) => {
            let mut s = lock(inner);
            match s.claims.remove(n) {
                Some(c) => {
                    s.counts.deleted += 1;
                    let pod = s.bound.remove(n);
                    drop(s);
                    drop(pod);
                    json_response(StatusCode::OK, &c)
                }
                None => not_found(),
            }
        }
        _ => not_found(),
    }
}
