//! plimsoll-daemon: plimsolld's engine. It authenticates callers, checks the protocol and
//! the floor, admits runs under the concurrency limit, dispatches them to one provider,
//! and stamps each answer with its run record.
//!
//! It never signs anything, never logs code, output or tokens, and never runs a payload
//! whose refusal it has already decided.

pub mod auth;
pub mod config;
pub mod doors;
pub mod embedded;
pub mod env;
pub mod metrics;
pub mod provider;
pub mod server;
pub mod service;
pub mod sessions;

pub use config::{Config, ProviderConfig};
pub use server::{start, start_until, RunningDaemon, StartError};
