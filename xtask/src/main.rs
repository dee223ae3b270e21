//! cargo xtask: the project's build and measurement tasks (`ci`, `bench`, `dist`), in Rust
//! instead of a Makefile. It never runs as part of the daemon.

fn main() -> anyhow::Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
    anyhow::bail!("unknown task {task:?}; tasks: (none yet)")
}
