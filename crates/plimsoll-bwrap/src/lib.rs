//! plimsoll-bwrap: the `bwrap` provider, a container-tier wall without a daemon. Each run
//! (and each session) is one `bwrap` (bubblewrap) sandbox with new user, PID, network
//! (loopback only), IPC, UTS and cgroup namespaces, no capabilities, a seccomp filter
//! plimsoll builds ([`seccomp`], shared with the Docker provider's profile), a read-only view of the system directories and fresh,
//! bounded `/tmp` and `/work`. `plimsoll-sandboxd` is the sandbox's program: plimsolld talks
//! to it over a Unix socket in the run's own directory, as the Docker provider does.
//!
//! Tier `container` is stated only after the startup smoke test proved every property
//! from inside a real sandbox (and who runs it, from the host); otherwise plimsolld does not
//! start, and the message names what is missing. See docs/bwrap.md.

pub mod cgroup;
mod command;
mod config;
pub mod evidence;
pub mod host;
mod provider;
pub mod sandbox;
mod session;

pub use plimsoll_provider::seccomp;

pub use command::{system_entries, Spec, SystemEntry, CHANNEL_DIR, GRANT_SOCKET_NAME, WORK_DIR};
pub use config::{
    is_root, BwrapConfig, DEFAULT_DISK_MB, DEFAULT_PIDS, DEFAULT_POOL, DEFAULT_PROCESS_MEMORY_MB,
    DEFAULT_USER, NAME, TMP_MB, VARIABLES,
};
pub use provider::{environment, BwrapProvider, DEADLINE_GRACE};
