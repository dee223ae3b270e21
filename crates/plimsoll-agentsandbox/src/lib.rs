//! plimsoll-agentsandbox: the Kubernetes agent-sandbox provider. Each run claims a pod from
//! a kubernetes-sigs/agent-sandbox warm pool (`SandboxClaim`, `extensions.agents.x-k8s.io/v1beta1`),
//! reaches its sandboxd through the pod's TLS terminator on port 9090 (TLS 1.3, a chain to
//! the operator's CA file, the configured server name), runs, and deletes the claim.
//! Startup reads the template and its NetworkPolicies back and refuses any difference,
//! then makes one real run over the TLS path. Sessions (`session`) hold one claim and one
//! channel for all their calls, and delete the claim at their end.
//!
//! It must never send a byte to a pod that has not completed the TLS handshake, never
//! consult the system's root certificates for that channel, never report "not dispatched"
//! for a run that may have started, never leave a claim behind when it can delete it,
//! and never log the sandboxd token.

pub mod config;
pub mod crd;
pub mod provider;
pub mod readback;
pub mod session;

pub use config::AgentSandboxConfig;
pub use plimsoll_provider::ConfigError;
pub use provider::{AgentSandboxProvider, Phases};
pub use readback::{read_back, Drift, DriftKind, ReadBack};
