//! `cargo xtask bench …`: one module per benchmark, plus what they share: reading flags
//! ([`Args`]), statistics ([`stats`]), verdicts ([`verdict`]) and peak memory ([`mem`]).
//! Every benchmark measures against a named baseline in the same run and reports a missed
//! target as a verdict, never as an error.

pub mod agentsandbox;
pub mod attest;
pub mod bwrap;
pub mod docker;
pub mod grants;
pub mod mcp;
pub mod mem;
pub mod pages;
pub mod process;
pub mod quickjs;
pub mod scan;
pub mod sessions;
pub mod stats;
pub mod tls;

use anyhow::Context;

/// Runs `cargo xtask bench <name> <args>`; `tasks` is the task list printed for an unknown
/// name.
pub fn run(name: Option<&str>, args: &[&str], tasks: &str) -> anyhow::Result<()> {
    match name {
        Some("sandboxd-tls") => tls::run(args),
        Some("process") => process::run(args),
        Some("quickjs") => quickjs::run(args),
        Some("docker") => docker::run(args),
        Some("bwrap") => bwrap::run(args),
        Some("agentsandbox") => agentsandbox::run(args),
        Some("grants") => grants::run(args),
        Some("scan") => scan::run(args),
        Some("sessions") => sessions::run(args),
        Some("attest") => attest::run(args),
        Some("mcp") => mcp::run(args),
        Some("pages") => pages::run(args),
        other => anyhow::bail!("unknown benchmark {other:?}\n{tasks}"),
    }
}

/// The words a benchmark prints for a met and a missed target.
#[derive(Debug, Clone, Copy)]
pub struct Words {
    /// Printed when the target is met.
    pub met: &'static str,
    /// Printed when it is missed.
    pub missed: &'static str,
}

/// `PASS` / `MISS` (process, quickjs).
pub const PASS_MISS: Words = Words {
    met: "PASS",
    missed: "MISS",
};
/// `MET` / `MISSED` (docker).
pub const MET_MISSED: Words = Words {
    met: "MET",
    missed: "MISSED",
};
/// `[met]` / `[MISSED]` (sandboxd-tls).
pub const BRACKETED: Words = Words {
    met: "[met]",
    missed: "[MISSED]",
};

/// The verdict on a target: `words.met` when `ok`, else `words.missed`.
pub fn verdict(ok: bool, words: Words) -> &'static str {
    if ok {
        words.met
    } else {
        words.missed
    }
}

/// A benchmark's arguments, read flag by flag, with its usage text for errors.
#[derive(Debug)]
pub struct Args<'a> {
    it: std::slice::Iter<'a, &'a str>,
    usage: &'static str,
}

impl<'a> Args<'a> {
    /// Reads `args`; `usage` is appended to every error.
    pub fn new(args: &'a [&'a str], usage: &'static str) -> Args<'a> {
        Args {
            it: args.iter(),
            usage,
        }
    }

    /// The next flag, or `None` at the end.
    pub fn flag(&mut self) -> Option<&'a str> {
        self.it.next().copied()
    }

    /// The value that follows flag `name`.
    pub fn value(&mut self, name: &str) -> anyhow::Result<&'a str> {
        let usage = self.usage;
        self.it
            .next()
            .copied()
            .with_context(|| format!("{name} needs a value\n{usage}"))
    }

    /// The value that follows flag `name`, parsed.
    pub fn parsed<T>(&mut self, name: &str) -> anyhow::Result<T>
    where
        T: std::str::FromStr,
        T::Err: std::error::Error + Send + Sync + 'static,
    {
        Ok(self.value(name)?.parse()?)
    }

    /// The error for an argument the benchmark does not know.
    pub fn unknown(&self, arg: &str) -> anyhow::Error {
        anyhow::anyhow!("unknown argument {arg:?}\n{}", self.usage)
    }
}
