//! plimsoll-docker: the Docker provider. Each run gets its own locked-down container of one
//! image, pinned by content ID at startup, with plimsoll-sandboxd as the entrypoint,
//! reached over a Unix socket in a per-run host directory (the container has no network).
//!
//! Tier from evidence: runc gives `container`; runsc gives `kernel` only after the engine
//! lists the runtime and a startup run inside a container sees gVisor's kernel, not the
//! host's. Every container carries `io.plimsoll.instance` (random per daemon start) and
//! `io.plimsoll.run`; a start removes only containers of ended starts recorded in its own
//! state directory. A warm pool keeps containers started ahead, each used once.
//!
//! It must never run an image by a tag that could move, never claim a tier it did not
//! prove, never touch a container it did not label, never mount more of the host than the
//! per-run channel directory, and never report "not dispatched" for a run that may have
//! started.

pub mod config;
pub mod engine;
pub mod error;
pub mod evidence;
pub mod provider;
pub mod scan;
pub mod state;

pub use config::{DockerConfig, Runtime, Seccomp};
pub use error::Error;
pub use provider::{DockerProvider, DEADLINE_GRACE};
