//! What the runner adds over spawning the same program directly: runs `sh -c true` and a
//! trivial node snippet many times each way and prints the medians.
//!
//! `cargo run --release -p plimsoll-runner --example overhead [-- ROUNDS]`

use std::time::Duration;

use plimsoll_core::pb;
use plimsoll_runner::{processes_with_tag, Limits, RunEnv, Runner, RunnerConfig};
use tokio::process::Command;
use tokio::time::Instant;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let root = std::env::temp_dir().join(format!("plimsoll-overhead-{}", std::process::id()));
    let runner = Runner::new(RunnerConfig {
        root_dir: root.clone(),
        limits: Limits::default(),
        default_timeout: Duration::from_secs(30),
    })
    .expect("runner");
    let env = RunEnv::default();
    let t = Duration::from_secs(30);

    let project = pb::ProjectRun {
        steps: vec!["true".into()],
        ..Default::default()
    };
    let js = pb::JavaScriptRun {
        code: "console.log(1)".into(),
        grant_profile: String::new(),
    };
    let (mut sh_direct, mut sh_runner, mut js_direct, mut js_runner) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let s = Instant::now();
        Command::new("sh")
            .args(["-c", "true"])
            .output()
            .await
            .unwrap();
        sh_direct.push(s.elapsed());
        let s = Instant::now();
        runner.project(&project, t, &env).await.unwrap();
        sh_runner.push(s.elapsed());
        let s = Instant::now();
        Command::new("node")
            .args(["-e", "console.log(1)"])
            .output()
            .await
            .unwrap();
        js_direct.push(s.elapsed());
        let s = Instant::now();
        runner.javascript(&js, t, &env).await.unwrap();
        js_runner.push(s.elapsed());
    }
    let (a, b) = (median(sh_direct), median(sh_runner));
    println!(
        "sh -c true   direct {:7.2} ms   runner {:7.2} ms   added {:6.2} ms",
        ms(a),
        ms(b),
        ms(b) - ms(a)
    );
    let (a, b) = (median(js_direct), median(js_runner));
    println!(
        "node snippet direct {:7.2} ms   runner {:7.2} ms   added {:6.2} ms",
        ms(a),
        ms(b),
        ms(b) - ms(a)
    );
    let mut scans = Vec::new();
    for _ in 0..rounds {
        let s = Instant::now();
        processes_with_tag("0000");
        scans.push(s.elapsed());
    }
    println!("one /proc scan {:7.2} ms", ms(median(scans)));
    let _ = std::fs::remove_dir_all(root);
}
