//! cargo xtask: the project's build and measurement tasks (`ci`, `bench`, `dist`), in Rust
//! instead of a Makefile. It never runs as part of the daemon.

mod bench_grants;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match (
        args.first().map(String::as_str),
        args.get(1).map(String::as_str),
    ) {
        (Some("bench"), Some("grants")) => {
            let rest: Vec<&str> = args[2..].iter().map(String::as_str).collect();
            bench_grants::run(&rest)
        }
        _ => anyhow::bail!("unknown task {args:?}; tasks: bench grants"),
    }
}
