//! Where configuration comes from: the process environment in production, a map in tests
//! (`plimsoll_config`'s sources, re-exported here for the daemon's callers).
//!
//! [`ProcessEnv`] is the only reader of the process environment; tests never set variables.

pub use plimsoll_config::{EnvSource, MapEnv, ProcessEnv};
