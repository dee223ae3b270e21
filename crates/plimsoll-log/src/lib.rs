//! plimsoll-log: the one logging setup every plimsoll binary shares. Logs go to stderr,
//! plain text on a terminal and JSON lines otherwise, unless `--log-format` says which.
//! `RUST_LOG` filters (default `info`). It never decides what is logged, only how.
//! [`flags`] holds the one command-line convention the binaries share beside it: Go-style
//! single-dash long flags. [`fds`] is what every binary does before anything else: mark the
//! descriptors it inherited close-on-exec, so no run sees them (and the spawn-side step that
//! holds for libraries embedded elsewhere).

#[allow(unsafe_code)]
pub mod fds;
pub mod flags;

use std::io::IsTerminal;

/// The `--log-format` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber at level `info`. `None` picks text on a terminal, JSON
/// otherwise.
pub fn init(format: Option<LogFormat>) {
    init_at(format, "info")
}

/// Like [`init`], with another default level (`RUST_LOG` still wins). The caller's CLI uses
/// `warn`, so its embedded daemon's startup lines do not bury the answer.
pub fn init_at(format: Option<LogFormat>, default_level: &str) {
    let format = format.unwrap_or(if std::io::stderr().is_terminal() {
        LogFormat::Text
    } else {
        LogFormat::Json
    });
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_level.into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal, never in a file or a pipe.
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
