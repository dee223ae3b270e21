//! The in-process daemon: a temporary folder with a callers file, the environment pairs a
//! test daemon starts from (loopback RPC on a free port, no metrics listener, the state in
//! the folder), a configuration built from them through `Config::from_env`, and a daemon
//! started from it; plus the client calls the tests make against it.

use std::path::{Path, PathBuf};

use plimsoll_core::pb::sandbox_service_client::SandboxServiceClient;
use plimsoll_core::pb::{self, run_request::Payload};
use plimsoll_daemon::config::{Config, ConfigError};
use plimsoll_daemon::env::MapEnv;
use plimsoll_daemon::server::RunningDaemon;
use tonic::transport::Channel;

/// A folder holding a callers file and the daemon's state.
#[derive(Debug)]
pub struct Setup {
    dir: tempfile::TempDir,
    tokens: Vec<String>,
}

impl Setup {
    /// A folder whose callers file lists `callers` (name and scopes), in order.
    pub fn new(callers: &[(&str, &[&str])]) -> Setup {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let mut file = plimsoll_callers::CallersFile::default();
        let tokens = callers
            .iter()
            .map(|(name, scopes)| {
                let scopes: Vec<String> = scopes.iter().map(|s| s.to_string()).collect();
                file.add(name, &scopes).expect("add a caller")
            })
            .collect();
        file.save(&dir.path().join("callers.json"))
            .expect("save the callers file");
        Setup { dir, tokens }
    }

    /// One caller, `tester`, with no scopes.
    pub fn tester() -> Setup {
        Setup::new(&[("tester", &[])])
    }

    /// The token of the `i`th caller.
    pub fn token(&self, i: usize) -> &str {
        &self.tokens[i]
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The callers file.
    pub fn callers_file(&self) -> PathBuf {
        self.path().join("callers.json")
    }

    /// The daemon's environment: loopback RPC on a free port, no metrics listener, the
    /// callers file, the state in `state/`, the process provider; then `extra` (a later
    /// pair wins).
    pub fn pairs(&self, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut pairs: Vec<(String, String)> = [
            ("PLIMSOLL_ADDR", "127.0.0.1:0".to_owned()),
            ("PLIMSOLL_METRICS_ADDR", "off".to_owned()),
            (
                "PLIMSOLL_CLIENTS_FILE",
                self.callers_file().display().to_string(),
            ),
            (
                "PLIMSOLL_STATE_DIR",
                self.path().join("state").display().to_string(),
            ),
            ("SANDBOX_PROVIDER", "process".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        pairs.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        pairs
    }

    /// The configuration [`Setup::pairs`] gives.
    pub fn config(&self, extra: &[(&str, &str)]) -> Result<Config, ConfigError> {
        config_from(&self.pairs(extra))
    }

    /// A daemon started from [`Setup::config`]; panics if it does not start.
    pub async fn start(&self, extra: &[(&str, &str)]) -> RunningDaemon {
        let cfg = self.config(extra).expect("the test configuration");
        plimsoll_daemon::server::start(cfg)
            .await
            .expect("the daemon starts")
    }
}

/// A configuration from environment pairs, read the way plimsolld reads its environment.
pub fn config_from(pairs: &[(String, String)]) -> Result<Config, ConfigError> {
    Config::from_env(&MapEnv::from_pairs(
        pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
    ))
}

/// A client of the daemon's RPC listener.
pub async fn client(daemon: &RunningDaemon) -> SandboxServiceClient<Channel> {
    SandboxServiceClient::connect(format!("http://{}", daemon.rpc_addr()))
        .await
        .expect("connect to the daemon")
}

/// `msg` with `token` as its bearer token.
pub fn authed<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("a header value"),
    );
    r
}

/// A protocol 5 JavaScript run of `code` under `grant_profile` (empty: none).
pub fn js_request(code: &str, grant_profile: &str, timeout_ms: i32) -> pb::RunRequest {
    pb::RunRequest {
        protocol: 5,
        timeout_ms,
        payload: Some(Payload::Javascript(pb::JavaScriptRun {
            code: code.into(),
            grant_profile: grant_profile.into(),
        })),
        ..Default::default()
    }
}
