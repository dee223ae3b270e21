//! cargo xtask: the project's build and measurement tasks, in Rust instead of a Makefile.
//! Each task is one module; this file only dispatches. It never runs as part of the daemon,
//! and its benchmarks only ever target loopback addresses.

mod bench;
mod dist;
mod images;
mod pages;

const TASKS: &str = "\
tasks:
  dist                 static builds of plimsoll-sandboxd-tls and plimsoll-sandboxd into target/dist/
  bench sandboxd-tls   the TLS terminator against direct plaintext and stunnel4 (loopback)
  images               the Docker provider's sandbox image, without a registry (debootstrap)
  pages [--records]    the generated parts of docs/learn/ (program outputs; with --records, new signed records)
  bench process        plimsolld (process provider) against spawning the same program directly
  bench sessions       a call in an open session against a single run (process provider); open time; idle memory
  bench quickjs        plimsolld (quickjs provider) against `node -e` and the process provider
  bench docker         Docker provider run latency (warm pool, none) against `docker run`
  bench bwrap          bwrap provider added latency over a direct spawn, against the process provider and
                       the Docker warm pool; runs per second at concurrency 8
  bench agentsandbox   claim-to-result latency through the fake Kubernetes API server, by phase
  bench scan           the ship scan on a generated 1 GiB image against a decompress-only baseline;
                       hostile inputs (bombs, nested windows) against 64 MiB peak RSS (--hostile-only)
  bench attest         records signed and verified per second; verify of a 100,000-run bundle against reading and hashing it
  bench grants         specgen time and peak RSS on a GitHub-sized OpenAPI document; broker latency ratio
  bench pages          check.html's time to verify its five records (WebCrypto, pure JS) against the Rust verifier; page weight
  bench mcp            run_code through plimsoll-mcp --daemon against Client::run and `plimsoll run --addr`; idle RSS";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("dist") => dist::run(&args[1..]),
        Some("images") => images::run_task(&args[1..]),
        Some("pages") => pages::run(&args[1..]),
        Some("bench") => {
            let rest: Vec<&str> = args.iter().skip(2).map(String::as_str).collect();
            bench::run(args.get(1).map(String::as_str), &rest, TASKS)
        }
        Some("help") | Some("--help") | Some("-h") | None => {
            println!("{TASKS}");
            Ok(())
        }
        Some(other) => anyhow::bail!("unknown task {other:?}\n{TASKS}"),
    }
}
