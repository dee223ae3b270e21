//! The provider: startup (CA file, token, Kubernetes client, read-back, smoke test) and one
//! run (claim, wait Ready, TLS 1.3 to the pod, execute, delete the claim whatever
//! happened).

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use plimsoll_core::pb;
use plimsoll_core::sandboxd_pb::{execute_request, execute_response, ExecuteRequest};
use plimsoll_core::validate::MAX_TIMEOUT_MS;
use plimsoll_core::Refusal;
use plimsoll_provider::{Answer, Facts, Provider, ProviderError, ProviderStartError, Work};
use plimsoll_sandboxd::{CallError, SandboxdClient, Token};
use plimsoll_tls::{ClientTls, PodIdentity};

use crate::config::AgentSandboxConfig;
use crate::crd::{self, ClaimState};
use crate::readback::{self, ReadBack};

const NAME: &str = "agentsandbox";

/// How long the claim may outlive its run before the controller deletes it on its own (a
/// backstop for a plimsolld that died before deleting it).
const CLAIM_EXPIRY_MARGIN: Duration = Duration::from_secs(120);

/// The steps of the smoke test's project: one shell command with a known answer.
const SMOKE_STEP: &str = "echo plimsoll-smoke";

fn start_error(message: impl Into<String>) -> ProviderStartError {
    ProviderStartError::new(NAME, message)
}

/// Where the time of one run went.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Phases {
    /// The claim's name.
    pub claim: String,
    /// The pod address dialed, once the claim was Ready.
    pub pod: Option<SocketAddr>,
    /// From creating the claim to reading it Ready with an address.
    pub claim_wait: Option<Duration>,
    /// TCP connect, TLS 1.3 handshake and the HTTP/2 channel.
    pub tls_connect: Option<Duration>,
    /// The sandboxd call(s).
    pub run: Option<Duration>,
    /// Deleting the claim.
    pub delete: Option<Duration>,
    /// Whether the claim was deleted (or was already gone).
    pub deleted: bool,
}

/// Why a run (or the smoke test) did not produce an answer.
#[derive(Debug)]
enum RunError {
    /// No pod could be had; nothing ran.
    Claim(Refusal),
    /// The pod could not be reached or confirmed over TLS; nothing was sent.
    Connect(CallError),
    /// The call failed: refused (marked) or may have run.
    Call(CallError),
    /// sandboxd answered, but not with what was asked.
    Answer(String),
}

impl RunError {
    fn into_provider_error(self, pod: &str) -> ProviderError {
        match self {
            RunError::Claim(r) => ProviderError::Refused(r),
            RunError::Connect(e) | RunError::Call(e) => match e.refusal() {
                Some(r) => ProviderError::Refused(r),
                None => ProviderError::Failed(format!("pod {pod}: {e}")),
            },
            RunError::Answer(m) => ProviderError::Failed(format!("pod {pod}: {m}")),
        }
    }
}

/// Files re-read when one of them changes (by modification time, size and inode), keeping
/// the last good value if the new content is unusable: the CA file, the client
/// certificate pair and the token rotate without a restart.
struct Reloading<T> {
    paths: Vec<PathBuf>,
    what: &'static str,
    load: Loader<T>,
    current: Mutex<(T, Vec<Option<Stamp>>)>,
}

type Stamp = (SystemTime, u64, u64);

/// Reads and checks the files' content.
type Loader<T> = Box<dyn Fn() -> Result<T, LoadError> + Send + Sync>;

/// Why files could not be loaded, and whether the same bytes may load later (a
/// certificate not valid yet becomes valid with time, so it is tried again at every use
/// instead of waiting for the files to change).
struct LoadError {
    message: String,
    retry: bool,
}

impl LoadError {
    fn of(message: impl std::fmt::Display) -> LoadError {
        LoadError {
            message: message.to_string(),
            retry: false,
        }
    }
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

impl<T: Clone> Reloading<T> {
    fn open(
        paths: Vec<PathBuf>,
        what: &'static str,
        load: Loader<T>,
    ) -> Result<Reloading<T>, String> {
        let st = paths.iter().map(|p| stamp(p)).collect();
        let first = load().map_err(|e| e.message)?;
        Ok(Reloading {
            paths,
            what,
            load,
            current: Mutex::new((first, st)),
        })
    }

    fn get(&self) -> T {
        let st: Vec<Option<Stamp>> = self.paths.iter().map(|p| stamp(p)).collect();
        let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if st.iter().all(Option::is_some) && st != cur.1 {
            let files = self
                .paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ");
            match (self.load)() {
                Ok(v) => {
                    tracing::info!(files = %files, "{} reloaded", self.what);
                    *cur = (v, st);
                }
                Err(e) => {
                    tracing::error!(files = %files, error = %e.message,
                        "{} changed but cannot be used; keeping the previous one", self.what);
                    // A pair not valid yet is tried again at the next use; anything else
                    // waits for the files to change.
                    if !e.retry {
                        cur.1 = st;
                    }
                }
            }
        }
        cur.0.clone()
    }
}

struct Started {
    claims: Api<DynamicObject>,
    pools: Api<DynamicObject>,
    facts: Facts,
}

/// The Kubernetes agent-sandbox provider: each run gets its own pod from a warm pool,
/// reached over TLS 1.3 on port 9090.
pub struct AgentSandboxProvider {
    cfg: AgentSandboxConfig,
    tls: Reloading<ClientTls>,
    token: Option<Reloading<Token>>,
    started: OnceLock<Started>,
}

impl std::fmt::Debug for AgentSandboxProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSandboxProvider")
            .field("cfg", &self.cfg)
            .field("started", &self.started.get().is_some())
            .finish()
    }
}

impl AgentSandboxProvider {
    /// Reads the CA file and the token file (each error names its variable and file).
    /// Nothing touches the cluster until [`Provider::start`].
    pub fn new(cfg: AgentSandboxConfig) -> Result<AgentSandboxProvider, ProviderStartError> {
        let spec = cfg.client_spec();
        let tls = Reloading::open(
            spec.files(),
            "TLS client (CA file, client certificate)",
            Box::new(move || ClientTls::build(&spec).map_err(|e| client_tls_error(&spec, e))),
        )
        .map_err(start_error)?;
        let token = match &cfg.token_file {
            None => None,
            Some(path) => {
                let p = path.clone();
                Some(
                    Reloading::open(
                        vec![path.clone()],
                        "sandboxd token file",
                        Box::new(move || Token::read_file(&p).map_err(LoadError::of)),
                    )
                    .map_err(|e| {
                        start_error(format!("SANDBOX_AGENTSANDBOX_SANDBOXD_TOKEN_FILE: {e}"))
                    })?,
                )
            }
        };
        Ok(AgentSandboxProvider {
            cfg,
            tls,
            token,
            started: OnceLock::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &AgentSandboxConfig {
        &self.cfg
    }

    async fn client(&self) -> Result<kube::Client, ProviderStartError> {
        let mut config = match &self.cfg.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                    start_error(format!(
                        "SANDBOX_AGENTSANDBOX_KUBECONFIG={}: {e}",
                        path.display()
                    ))
                })?;
                kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                    .await
                    .map_err(|e| {
                        start_error(format!(
                            "SANDBOX_AGENTSANDBOX_KUBECONFIG={}: {e}",
                            path.display()
                        ))
                    })?
            }
            None => kube::Config::infer().await.map_err(|e| {
                start_error(format!(
                    "no Kubernetes API configuration: {e}; run plimsolld in the cluster with a service account, or set KUBECONFIG or SANDBOX_AGENTSANDBOX_KUBECONFIG"
                ))
            })?,
        };
        config.connect_timeout = Some(Duration::from_secs(10));
        config.read_timeout = Some(Duration::from_secs(30));
        config.write_timeout = Some(Duration::from_secs(30));
        kube::Client::try_from(config)
            .map_err(|e| start_error(format!("cannot build the Kubernetes client: {e}")))
    }

    /// Reads the template, its warm pool and the namespace's NetworkPolicies and checks
    /// them ([`readback::read_back`]). Each failure names the object and what to fix.
    async fn read_back(&self, client: &kube::Client) -> Result<ReadBack, ProviderStartError> {
        let ns = &self.cfg.namespace;
        let templates: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), ns, &crd::template_resource());
        let pools: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), ns, &crd::warm_pool_resource());
        let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
            Api::namespaced(client.clone(), ns);
        let template = get_named(
            &templates,
            &self.cfg.template,
            "SandboxTemplate",
            "SANDBOX_AGENTSANDBOX_TEMPLATE",
            ns,
        )
        .await?;
        let pool = get_named(
            &pools,
            &self.cfg.warm_pool,
            "SandboxWarmPool",
            "SANDBOX_AGENTSANDBOX_WARM_POOL",
            ns,
        )
        .await?;
        let list = policies.list(&ListParams::default()).await.map_err(|e| {
            start_error(format!(
                "cannot list NetworkPolicies in namespace {ns}: {e}; plimsolld's role needs list on networkpolicies"
            ))
        })?;
        let policies: Vec<serde_json::Value> = list
            .items
            .iter()
            .filter_map(|p| serde_json::to_value(p).ok())
            .collect();
        let template_json = serde_json::to_value(&template).unwrap_or_default();
        let pool_json = serde_json::to_value(&pool).unwrap_or_default();
        let mut rb = readback::read_back_with(
            &self.cfg.template,
            &template_json,
            Some((&self.cfg.warm_pool, &pool_json)),
            &policies,
            &self.cfg.channel(),
        );
        if self.cfg.sessions {
            rb.drifts.extend(readback::session_drifts(&template_json));
        }
        Ok(rb)
    }

    /// One run with where its time went. [`Provider::run`] is this without the phases.
    pub async fn run_timed(
        &self,
        work: Work,
        timeout: Duration,
    ) -> (Result<Answer, ProviderError>, Phases) {
        let Some(started) = self.started.get() else {
            return (
                Err(Refusal::unsupported(
                    "the agentsandbox provider has not passed its startup checks",
                )
                .into()),
                Phases::default(),
            );
        };
        let (out, phases) = self
            .with_pod(started, timeout, move |client| async move {
                client
                    .run(work, timeout, Vec::new())
                    .await
                    .map_err(RunError::Call)
            })
            .await;
        let pod = phases.pod.map_or_else(
            || phases.claim.clone(),
            |a| format!("{} ({a})", phases.claim),
        );
        (out.map_err(|e| e.into_provider_error(&pod)), phases)
    }

    /// Claims a pod, waits for it, connects over TLS, runs `f` with the channel and
    /// deletes the claim whatever happened (also when this future is dropped).
    async fn with_pod<T, F, Fut>(
        &self,
        started: &Started,
        run_timeout: Duration,
        f: F,
    ) -> (Result<T, RunError>, Phases)
    where
        F: FnOnce(SandboxdClient) -> Fut,
        Fut: Future<Output = Result<T, RunError>>,
    {
        let name = crd::new_claim_name();
        let mut phases = Phases {
            claim: name.clone(),
            ..Default::default()
        };
        let mut guard = ClaimGuard {
            api: started.claims.clone(),
            name: name.clone(),
            armed: true,
        };
        let out = self
            .claimed(started, &name, run_timeout, &mut phases, &mut guard, f)
            .await;
        if guard.armed {
            let t = Instant::now();
            phases.deleted = delete_claim(&started.claims, &name).await;
            phases.delete = Some(t.elapsed());
            guard.armed = false;
        } else {
            // The create call was answered with a refusal: there is no claim to delete.
            phases.deleted = true;
        }
        tracing::debug!(claim = %name, pod = ?phases.pod, claim_wait = ?phases.claim_wait,
            tls_connect = ?phases.tls_connect, run = ?phases.run, delete = ?phases.delete, "agentsandbox run phases");
        (out, phases)
    }

    async fn claimed<T, F, Fut>(
        &self,
        started: &Started,
        name: &str,
        run_timeout: Duration,
        phases: &mut Phases,
        guard: &mut ClaimGuard,
        f: F,
    ) -> Result<T, RunError>
    where
        F: FnOnce(SandboxdClient) -> Fut,
        Fut: Future<Output = Result<T, RunError>>,
    {
        let client = self
            .claim_and_connect(started, name, run_timeout, phases, guard)
            .await?;
        let t2 = Instant::now();
        let out = f(client).await;
        phases.run = Some(t2.elapsed());
        out
    }

    /// Creates the claim `name` (expiring `hold` past its Ready wait), waits for its pod
    /// and connects to it over TLS.
    async fn claim_and_connect(
        &self,
        started: &Started,
        name: &str,
        hold: Duration,
        phases: &mut Phases,
        guard: &mut ClaimGuard,
    ) -> Result<SandboxdClient, RunError> {
        let ns = &self.cfg.namespace;
        let t0 = Instant::now();
        let expires = SystemTime::now() + self.cfg.claim_timeout + hold + CLAIM_EXPIRY_MARGIN;
        let obj: DynamicObject =
            serde_json::from_value(crd::claim_object(name, ns, &self.cfg.warm_pool, expires))
                .map_err(|e| {
                    RunError::Claim(Refusal::capacity(format!(
                        "cannot build the SandboxClaim: {e}"
                    )))
                })?;
        if let Err(e) = started.claims.create(&PostParams::default(), &obj).await {
            if matches!(&e, kube::Error::Api(s) if s.code < 500) {
                guard.armed = false;
            }
            return Err(RunError::Claim(Refusal::capacity(format!(
                "cannot create a SandboxClaim on warm pool {ns}/{}: {e}",
                self.cfg.warm_pool
            ))));
        }
        let ip = self.wait_ready(started, name, t0).await?;
        phases.claim_wait = Some(t0.elapsed());
        let addr = SocketAddr::new(ip, self.cfg.sandboxd_port);
        phases.pod = Some(addr);
        let tls = self.tls.get();
        let token = self.token.as_ref().map(Reloading::get);
        let t1 = Instant::now();
        let client = SandboxdClient::connect_tls_with(&tls, addr, token.as_ref())
            .await
            .map_err(RunError::Connect)?;
        phases.tls_connect = Some(t1.elapsed());
        Ok(client)
    }

    /// A claim held for a session of `lifetime`, its pod and a channel to it. The claim
    /// is deleted when the guard is dropped or [`ClaimGuard::delete`]d.
    pub(crate) async fn claim_for_session(
        &self,
        lifetime: Duration,
    ) -> Result<(ClaimGuard, SandboxdClient, SocketAddr), ProviderError> {
        let Some(started) = self.started.get() else {
            return Err(Refusal::unsupported(
                "the agentsandbox provider has not passed its startup checks",
            )
            .into());
        };
        let name = crd::new_claim_name();
        let mut phases = Phases {
            claim: name.clone(),
            ..Default::default()
        };
        let mut guard = ClaimGuard {
            api: started.claims.clone(),
            name: name.clone(),
            armed: true,
        };
        match self
            .claim_and_connect(started, &name, lifetime, &mut phases, &mut guard)
            .await
        {
            Ok(client) => Ok((guard, client, phases.pod.expect("connected to a pod"))),
            Err(e) => {
                guard.delete().await;
                let pod = phases
                    .pod
                    .map_or_else(|| name.clone(), |a| format!("{name} ({a})"));
                Err(e.into_provider_error(&pod))
            }
        }
    }

    /// The warm pool sessions and runs claim from.
    pub(crate) fn warm_pool(&self) -> String {
        format!("{}/{}", self.cfg.namespace, self.cfg.warm_pool)
    }

    async fn wait_ready(
        &self,
        started: &Started,
        name: &str,
        t0: Instant,
    ) -> Result<IpAddr, RunError> {
        let deadline = t0 + self.cfg.claim_timeout;
        let mut pause = Duration::from_millis(5);
        let mut last = String::from("no status yet");
        loop {
            match started.claims.get(name).await {
                Ok(obj) => match crd::claim_state(&obj.data) {
                    ClaimState::Ready { ip, .. } => return Ok(ip),
                    ClaimState::Failed(reason) => {
                        return Err(RunError::Claim(Refusal::capacity(format!(
                            "SandboxClaim {}/{name} on warm pool {} cannot become Ready: {reason}",
                            self.cfg.namespace, self.cfg.warm_pool
                        ))))
                    }
                    ClaimState::Pending(r) => {
                        if let Some(r) = r {
                            last = r;
                        }
                    }
                },
                Err(e) => last = format!("reading it failed: {e}"),
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(RunError::Claim(Refusal::capacity(format!(
                    "SandboxClaim {}/{name} was not Ready within {} ms ({last}); warm pool {} has no pod to give; try again later",
                    self.cfg.namespace,
                    self.cfg.claim_timeout.as_millis(),
                    self.cfg.warm_pool
                ))));
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(self.cfg.claim_poll_max);
        }
    }

    /// The smoke test: one real run over the TLS path, returning the languages sandboxd
    /// proved. A TLS failure names the CA file and the server name.
    async fn smoke_test(&self, started: &Started) -> Result<Vec<String>, ProviderStartError> {
        let project = pb::ProjectRun {
            // Then the run's descriptors: none beyond 0, 1 and 2 (none of the terminator's or
            // sandboxd's) may reach the code.
            steps: vec![
                SMOKE_STEP.into(),
                plimsoll_provider::smoke::DESCRIPTOR_STEP.into(),
            ],
            ..Default::default()
        };
        let (out, phases) = self
            .with_pod(started, Duration::from_secs(30), |client| async move {
                let health = client.health().await.map_err(RunError::Call)?;
                let resp = client
                    .execute(ExecuteRequest {
                        timeout_ms: 30_000,
                        payload: Some(execute_request::Payload::Project(project)),
                        ..Default::default()
                    })
                    .await
                    .map_err(RunError::Call)?;
                match resp.result {
                    Some(execute_response::Result::Project(p))
                        if p.steps.first().is_some_and(|s| {
                            s.exit_code == 0 && s.stdout == b"plimsoll-smoke\n"
                        }) =>
                    {
                        use plimsoll_provider::smoke::{
                            check_descriptors, listed_descriptors, step_stdout,
                        };
                        listed_descriptors(&step_stdout(&p, 1))
                            .and_then(|open| check_descriptors(&open, &[]))
                            .map_err(RunError::Answer)?;
                        Ok(health.languages)
                    }
                    other => Err(RunError::Answer(format!(
                        "the smoke test's `{SMOKE_STEP}` did not answer as expected: {other:?}"
                    ))),
                }
            })
            .await;
        let ca = self.cfg.ca_file.display();
        let name = &self.cfg.server_name;
        out.map_err(|e| match e {
            RunError::Claim(r) => start_error(format!(
                "smoke test: no pod from SandboxWarmPool {}/{}: {}; check that the pool has ready pods",
                self.cfg.namespace, self.cfg.warm_pool, r.message
            )),
            RunError::Connect(e) => {
                let must = match self.cfg.pod_identity {
                    PodIdentity::Shared => format!("carry the name SANDBOX_AGENTSANDBOX_SANDBOXD_SERVER_NAME={name}"),
                    PodIdentity::Ip => "carry the pod's own IP as an IP subject alternative name (SANDBOX_AGENTSANDBOX_POD_IDENTITY=ip)".to_owned(),
                };
                let client = match &self.cfg.client_cert {
                    Some(p) => format!(
                        "; and the pods' PLIMSOLL_SANDBOXD_CLIENT_CA must hold the CA of SANDBOX_AGENTSANDBOX_CLIENT_CERT_FILE={}",
                        p.cert_file.display()
                    ),
                    None => String::new(),
                };
                start_error(format!(
                    "smoke test: the pod at {} could not be confirmed over TLS, so nothing was sent: {e}. \
                     The pods' certificate must chain to a CA in SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE={ca} \
                     and {must}{client}",
                    phases.pod.map_or("?".into(), |a| a.to_string())
                ))
            }
            RunError::Call(e) if e.not_dispatched() == Some(plimsoll_core::Reason::Permission) => start_error(match &self.cfg.token_file {
                Some(f) => format!(
                    "smoke test: sandboxd refused the token from SANDBOX_AGENTSANDBOX_SANDBOXD_TOKEN_FILE={}: {e}; it must match a line of the pods' --token-file",
                    f.display()
                ),
                None => format!(
                    "smoke test: sandboxd refused a call without a token: {e}; without a token plimsolld relies on the pods' terminator requiring its client certificate (PLIMSOLL_SANDBOXD_CLIENT_CA), which then forwards through sandboxd's own socket; check that the pods' terminator has it, or set SANDBOX_AGENTSANDBOX_SANDBOXD_TOKEN_FILE to the token of the pods' --token-file"
                ),
            }),
            RunError::Call(e) => start_error(format!("smoke test: the call to sandboxd over TLS failed: {e}")),
            RunError::Answer(m) => start_error(format!("smoke test: {m}")),
        })
    }
}

/// Says which variable's file is at fault, and marks a client certificate that is not
/// valid yet for another try.
fn client_tls_error(spec: &plimsoll_tls::ClientSpec, e: plimsoll_tls::ClientTlsError) -> LoadError {
    use plimsoll_tls::ClientTlsError as E;
    match (&e, &spec.client_cert) {
        (E::ClientPair { .. } | E::ClientRead { .. }, Some(pair)) => LoadError {
            retry: matches!(&e, E::ClientPair { source, .. } if matches!(**source, plimsoll_tls::PairError::NotYetValid { .. })),
            message: format!(
                "SANDBOX_AGENTSANDBOX_CLIENT_CERT_FILE={} / SANDBOX_AGENTSANDBOX_CLIENT_KEY_FILE={}: {e}; they must hold plimsolld's client certificate (PEM chain, leaf first, inside its validity) and its matching private key",
                pair.cert_file.display(),
                pair.key_file.display()
            ),
        },
        _ => LoadError::of(format!(
            "SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE={}: {e}; it must hold the PEM CA certificate(s) (certificates only) that signed the pods' sandboxd certificate",
            spec.ca_file.display()
        )),
    }
}

async fn get_named(
    api: &Api<DynamicObject>,
    name: &str,
    kind: &str,
    var: &str,
    ns: &str,
) -> Result<DynamicObject, ProviderStartError> {
    match api.get_opt(name).await {
        Ok(Some(o)) => Ok(o),
        Ok(None) => Err(start_error(format!(
            "{var}: {kind} {ns}/{name} does not exist; apply k8s/ (or set {var} and SANDBOX_AGENTSANDBOX_NAMESPACE to yours)"
        ))),
        Err(e) => Err(start_error(format!(
            "cannot read {kind} {ns}/{name}: {e}; plimsolld's role needs get on {}",
            match kind {
                "SandboxTemplate" => "sandboxtemplates",
                _ => "sandboxwarmpools",
            }
        ))),
    }
}

/// Deletes a claim, retrying briefly; a claim already gone counts as deleted.
async fn delete_claim(api: &Api<DynamicObject>, name: &str) -> bool {
    for attempt in 0..3u32 {
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => return true,
            Err(kube::Error::Api(s)) if s.code == 404 => return true,
            Err(e) => {
                tracing::warn!(claim = %name, attempt, error = %e, "deleting the SandboxClaim failed");
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt + 1))).await;
            }
        }
    }
    tracing::error!(claim = %name, "the SandboxClaim could not be deleted; its lifecycle.shutdownTime will remove it");
    false
}

/// Deletes the claim in the background if the run's future is dropped before it could.
pub(crate) struct ClaimGuard {
    api: Api<DynamicObject>,
    name: String,
    armed: bool,
}

impl ClaimGuard {
    /// Deletes the claim now (a claim whose create was refused has none to delete).
    pub(crate) async fn delete(mut self) {
        if self.armed {
            self.armed = false;
            delete_claim(&self.api, &self.name).await;
        }
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (api, name) = (self.api.clone(), std::mem::take(&mut self.name));
            rt.spawn(async move {
                delete_claim(&api, &name).await;
            });
        }
    }
}

#[async_trait::async_trait]
impl Provider for AgentSandboxProvider {
    fn facts(&self) -> Facts {
        match self.started.get() {
            Some(s) => s.facts.clone(),
            None => Facts {
                name: NAME.into(),
                ..Default::default()
            },
        }
    }

    fn sessions(&self) -> Option<&dyn plimsoll_provider::SessionProvider> {
        Some(self)
    }

    async fn start(&self) -> Result<(), ProviderStartError> {
        if self.started.get().is_some() {
            return Ok(());
        }
        let client = self.client().await?;
        let rb = self.read_back(&client).await?;
        if !rb.drifts.is_empty() {
            let list: Vec<String> = rb.drifts.iter().map(|d| format!("  - {d}")).collect();
            return Err(start_error(format!(
                "SandboxTemplate {}/{} (with its warm pool and NetworkPolicies) differs from what plimsolld requires in {} place(s); fix each and restart (docs/agent-sandbox.md):\n{}",
                self.cfg.namespace,
                self.cfg.template,
                rb.drifts.len(),
                list.join("\n")
            )));
        }
        let ns = &self.cfg.namespace;
        let claims = Api::namespaced_with(client.clone(), ns, &crd::claim_resource());
        let pools = Api::namespaced_with(client, ns, &crd::warm_pool_resource());
        let environment = rb
            .image
            .clone()
            .filter(|i| i.contains("@sha256:"))
            .unwrap_or_default();
        if environment.is_empty() {
            tracing::warn!(image = ?rb.image, "the template's image is not pinned by digest; results state no environment identity");
        }
        let mut probe = Started {
            claims,
            pools,
            facts: Facts {
                name: NAME.into(),
                tier: Some(rb.tier),
                environment,
                supports_project: true,
                max_timeout_ms: MAX_TIMEOUT_MS,
                ..Default::default()
            },
        };
        let languages = self.smoke_test(&probe).await?;
        probe.facts.languages = languages;
        tracing::info!(template = %self.cfg.template, warm_pool = %self.cfg.warm_pool, namespace = %ns,
            runtime_class = ?rb.runtime_class, isolation = %rb.tier, languages = ?probe.facts.languages,
            ca_file = %self.cfg.ca_file.display(), server_name = %self.cfg.server_name,
            pod_identity = %self.cfg.pod_identity, client_certificate = self.cfg.client_cert.is_some(),
            "agentsandbox provider: read-back and TLS smoke test passed");
        let _ = self.started.set(probe);
        Ok(())
    }

    async fn ready(&self) -> bool {
        let Some(s) = self.started.get() else {
            return false;
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(2), s.pools.get_opt(&self.cfg.warm_pool))
                .await,
            Ok(Ok(Some(_)))
        )
    }

    async fn run(&self, work: Work, timeout: Duration) -> Result<Answer, ProviderError> {
        self.run_timed(work, timeout).await.0
    }
}
