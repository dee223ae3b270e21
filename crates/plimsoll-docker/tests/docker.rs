//! The Docker provider against the real engine and the real sandbox image
//! (`cargo xtask images` builds `plimsoll/sandbox:latest`).
//!
//! Without an engine or the image these tests skip with a message, unless
//! `PLIMSOLL_REQUIRE_DOCKER=1` (CI), when they fail.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bollard::query_parameters::{CommitContainerOptions, RemoveImageOptions, TagImageOptions};
use bollard::Docker;
use plimsoll_core::pb::{self, run_request::Payload, run_response::Result as R};
use plimsoll_core::Reason;
use plimsoll_docker::engine::{containers_labelled, LABEL_INSTANCE};
use plimsoll_docker::{DockerConfig, DockerProvider, Runtime};
use plimsoll_provider::{Answer, Provider, ProviderError, Work};
use support::{gvisor, tier};

#[macro_use]
mod support;
use support::{config, IMAGE};

async fn started(c: DockerConfig) -> DockerProvider {
    let p = DockerProvider::new(c).unwrap();
    p.start().await.unwrap();
    p
}

fn js(code: &str) -> Work {
    Work::Javascript(pb::JavaScriptRun {
        code: code.into(),
        grant_profile: String::new(),
    })
}

fn project(steps: &[&str]) -> Work {
    Work::Project(pb::ProjectRun {
        files: vec![],
        steps: steps.iter().map(|s| (*s).to_owned()).collect(),
        artifacts: vec![],
        grant_profile: String::new(),
    })
}

fn as_js(a: Answer) -> pb::JavaScriptResult {
    match a {
        Answer::Javascript(j) => j,
        other => panic!("expected a javascript result, got {other:?}"),
    }
}

fn as_project(a: Answer) -> pb::ProjectResult {
    match a {
        Answer::Project(p) => p,
        other => panic!("expected a project result, got {other:?}"),
    }
}

fn stdout(p: &pb::ProjectResult, i: usize) -> String {
    String::from_utf8_lossy(&p.steps[i].stdout)
        .trim()
        .to_owned()
}

async fn labelled(d: &Docker, instance: &str) -> Vec<String> {
    containers_labelled(d, LABEL_INSTANCE, instance)
        .await
        .unwrap()
}

#[tokio::test]
async fn javascript_python_and_shell_run_in_a_container() {
    let _d = need_engine!();
    let dir = tempfile::tempdir().unwrap();
    let p = started(config(dir.path())).await;
    let f = p.facts();
    assert_eq!(f.name, "docker");
    assert_eq!(f.tier, Some(tier()));
    assert!(
        f.environment.starts_with("docker-image:sha256:"),
        "{}",
        f.environment
    );
    assert_eq!(f.environment, support::environment(&p.image_id()));
    for l in ["javascript", "python", "shell"] {
        assert!(
            f.languages.iter().any(|x| x == l),
            "{l} not proven: {:?}",
            f.languages
        );
    }
    assert!(
        f.policy.starts_with("docker-lockdown:sha256:"),
        "{}",
        f.policy
    );

    let j = as_js(
        p.run(js("console.log(6 * 7)"), Duration::from_secs(20))
            .await
            .unwrap(),
    );
    assert_eq!(j.stdout, b"42\n");
    assert_eq!(j.exit_code, 0);

    let r = as_project(
        p.run(
            project(&[
                "python3 -c \"import sys; print(sys.version_info.major * 14)\"",
                "echo $((6 * 7)) > out.txt && cat out.txt",
            ]),
            Duration::from_secs(20),
        )
        .await
        .unwrap(),
    );
    assert_eq!(r.outcome, pb::ProjectOutcome::Completed as i32, "{r:?}");
    assert_eq!(stdout(&r, 0), "42");
    assert_eq!(stdout(&r, 1), "42");
    p.shutdown().await;
    assert!(labelled(&_d, p.instance_id()).await.is_empty());
}

#[tokio::test]
async fn hardening_is_proven_from_inside_the_container() {
    let _d = need_engine!();
    let dir = tempfile::tempdir().unwrap();
    let p = started(config(dir.path())).await;
    let r = as_project(
        p.run(
            project(&[
                // 0: the root filesystem is read-only (and /usr too), and mounted so.
                "touch /plimsoll-probe 2>&1; echo rc=$?; touch /usr/plimsoll-probe 2>/dev/null; echo rc=$?; awk '$2 == \"/\" {split($4, o, \",\"); print \"root-mount=\" o[1]}' /proc/mounts",
                // 1: no interface but lo, by two sources.
                "ls /sys/class/net; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
                // 2: not root.
                "id -u; id -g",
                // 3: empty capability sets.
                "grep -E '^Cap(Prm|Eff|Bnd):' /proc/self/status",
                // 4: a program can still write where runs are meant to.
                "echo ok > here.txt && cat here.txt && echo tmp > /tmp/x && cat /tmp/x",
                // 5: no new privileges, in /proc/self/status and from prctl itself.
                "grep -E '^NoNewPrivs:' /proc/self/status || echo 'NoNewPrivs: absent'; python3 -c \"import ctypes; print('prctl', ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))\"",
                // 6: the writable mounts are noexec.
                "cp /bin/true /tmp/t && /tmp/t; echo rc=$?",
                // 7: there is no route anywhere: connecting out fails at once.
                "python3 -c \"import socket\ntry:\n socket.create_connection(('1.1.1.1', 53), timeout=3)\n print('connected')\nexcept OSError as e:\n print('no-network', e.errno)\"",
            ]),
            Duration::from_secs(30),
        )
        .await
        .unwrap(),
    );
    assert_eq!(r.steps.len(), 8, "{r:?}");
    let root = stdout(&r, 0);
    assert!(!root.contains("rc=0"), "{root}");
    assert!(root.ends_with("root-mount=ro"), "{root}");
    if gvisor() {
        // gVisor checks permissions before the mount's read-only flag: the guest user is
        // told "Permission denied" where Linux says "Read-only file system".
        assert!(root.contains("Permission denied"), "{root}");
    } else {
        assert!(root.contains("Read-only file system"), "{root}");
    }
    let net: Vec<String> = stdout(&r, 1).lines().map(str::to_owned).collect();
    assert!(!net.is_empty());
    assert!(net.iter().all(|i| i == "lo"), "interfaces: {net:?}");
    if gvisor() {
        // gVisor's sysfs has no network class: /proc/net/dev is the one source.
        let err = String::from_utf8_lossy(&r.steps[1].stderr);
        assert!(err.contains("/sys/class/net"), "{err}");
    }
    let ids: Vec<u32> = stdout(&r, 2).lines().map(|l| l.parse().unwrap()).collect();
    assert!(ids.iter().all(|i| *i != 0), "uid/gid {ids:?}");
    let caps = stdout(&r, 3);
    assert_eq!(caps.lines().count(), 3, "{caps}");
    for line in caps.lines() {
        let v = line.split(':').nth(1).unwrap().trim();
        assert!(v.chars().all(|c| c == '0'), "{line}");
    }
    assert_eq!(stdout(&r, 4), "ok\ntmp");
    let nnp = stdout(&r, 5);
    assert!(nnp.ends_with("prctl 1"), "{nnp}");
    if gvisor() {
        // gVisor's /proc/self/status has no NoNewPrivs line; prctl answers for its kernel.
        assert!(nnp.starts_with("NoNewPrivs: absent"), "{nnp}");
    } else {
        assert!(nnp.starts_with("NoNewPrivs:\t1"), "{nnp}");
    }
    let exec = stdout(&r, 6);
    assert!(
        !exec.ends_with("rc=0"),
        "a copied binary ran from /tmp: {exec}"
    );
    assert!(stdout(&r, 7).starts_with("no-network"), "{}", stdout(&r, 7));
    p.shutdown().await;
}

/// The hardening test above tries one writable mount; this one asks the kernel's own mount
/// table for every mount the run's user can write to, requires `noexec` on each, and tries
/// a copied binary on each; and it reads the seccomp mode the container runs under.
#[tokio::test]
async fn every_writable_mount_is_noexec_and_seccomp_filters_the_container() {
    let _d = need_engine!();
    let dir = tempfile::tempdir().unwrap();
    let p = started(config(dir.path())).await;
    let r = as_project(
        p.run(
            project(&[
                // 0: every mount this user can write to: mount point, type, options, and
                // what is mounted there (a directory, a file, or a device with its numbers).
                r#"while read -r dev mnt fs opts rest; do if [ -w "$mnt" ]; then if [ -d "$mnt" ]; then k=dir; elif [ -c "$mnt" ]; then k=char-$(stat -c %t:%T "$mnt"); elif [ -f "$mnt" ]; then k=file; else k=other; fi; echo "$mnt $fs $opts $k"; fi; done < /proc/self/mounts; true"#,
                // 1: a copied binary on each writable directory mount does not run.
                r#"while read -r dev mnt fs opts rest; do if [ -d "$mnt" ] && [ -w "$mnt" ]; then f="$mnt/.plimsoll-exec-$$"; cp /bin/true "$f" && "$f"; echo "$mnt rc=$?"; rm -f "$f"; fi; done < /proc/self/mounts; true"#,
                // 2: the seccomp mode (2: filter) and how many filters are installed.
                "grep -E '^Seccomp(_filters)?:' /proc/self/status",
                // 3: where runs work.
                "pwd",
            ]),
            Duration::from_secs(30),
        )
        .await
        .unwrap(),
    );
    assert_eq!(r.steps.len(), 4, "{r:?}");
    let writable: Vec<Vec<String>> = stdout(&r, 0)
        .lines()
        .map(|l| l.split(' ').map(str::to_owned).collect())
        .collect();
    let points: Vec<&str> = writable.iter().map(|m| m[0].as_str()).collect();
    // Not vacuous: the places runs write to are among them.
    let cwd = stdout(&r, 3);
    assert!(points.contains(&"/tmp"), "{points:?}");
    assert!(
        points.iter().any(|m| cwd.starts_with(m) && *m != "/"),
        "the working directory {cwd} is on none of {points:?}"
    );
    for m in &writable {
        // Docker masks files such as /proc/keys by mounting /dev/null (char 1:3) over them:
        // writable, but nothing written there is kept, so nothing can be run from it.
        if m[3] == "char-1:3" {
            continue;
        }
        assert!(
            m[2].split(',').any(|o| o == "noexec"),
            "writable mount {} ({}, {}) is not noexec: {}",
            m[0],
            m[1],
            m[3],
            m[2]
        );
    }
    let tried: Vec<String> = stdout(&r, 1).lines().map(|l| l.trim().to_owned()).collect();
    assert!(!tried.is_empty());
    for line in &tried {
        assert!(!line.ends_with(" rc=0"), "a copied binary ran: {line}");
    }
    let seccomp = stdout(&r, 2);
    if gvisor() {
        // The difference, stated: runsc does not apply the container's OCI seccomp profile
        // (it would need `--oci-seccomp`, under which this runsc cannot start sandboxd's
        // threads; docs/docker.md), so the code's view is mode 0. gVisor's own filter sits
        // between its kernel and the host, where the code never calls directly.
        assert!(seccomp.lines().any(|l| l == "Seccomp:\t0"), "{seccomp}");
    } else {
        assert!(seccomp.lines().any(|l| l == "Seccomp:\t2"), "{seccomp}");
        let filters: u32 = seccomp
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp_filters:"))
            .map_or(0, |n| n.trim().parse().unwrap());
        assert!(filters >= 1, "{seccomp}");
    }
    p.shutdown().await;
}

#[tokio::test]
async fn a_fork_bomb_is_stopped_by_the_pids_limit() {
    let _d = need_engine!();
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    // Under gVisor the same limit holds inside gVisor's kernel (sandboxd's
    // `--max-processes`), where the fork fails with EAGAIN as it does under runc.
    c.pids = 48;
    let p = started(c).await;
    let code = "import os, time\nn = 0\ntry:\n    while n < 10000:\n        pid = os.fork()\n        if pid == 0:\n            time.sleep(60)\n            os._exit(0)\n        n += 1\n    print('unbounded', n)\nexcept OSError as e:\n    print('stopped', n, e.errno)\n";
    let bomb = || {
        Work::Project(pb::ProjectRun {
            files: vec![pb::ProjectFile {
                path: "bomb.py".into(),
                content: code.into(),
            }],
            steps: vec!["python3 bomb.py".into()],
            artifacts: vec![],
            grant_profile: String::new(),
        })
    };
    let r = as_project(p.run(bomb(), Duration::from_secs(30)).await.unwrap());
    let out = stdout(&r, 0);
    let mut words = out.split_whitespace();
    assert_eq!(
        words.next(),
        Some("stopped"),
        "{out} / {:?}",
        String::from_utf8_lossy(&r.steps[0].stderr)
    );
    let n: u32 = words.next().unwrap().parse().unwrap();
    assert!(n < 48, "{n} processes forked under a limit of 48");
    // EAGAIN: the kernel refused the fork.
    assert_eq!(words.next(), Some("11"), "{out}");
    p.shutdown().await;
}

#[tokio::test]
async fn the_memory_limit_is_enforced() {
    let _d = need_engine!();
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    // Under gVisor the limit also holds gVisor's own kernel, so it needs more room, and a
    // program is bounded inside gVisor by its address space (384 MiB at most here, what
    // node needs to start): the 400 MiB allocation fails with MemoryError there instead
    // of the OOM killer stopping the whole sandbox with the run's answer.
    c.memory_mb = if gvisor() { 192 } else { 96 };
    let p = started(c).await;
    let r = as_project(
        p.run(
            project(&[
                "python3 -c \"b = bytearray(64 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); print('small ok')\"",
                "python3 -c \"b = bytearray(400 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); print('big ok')\"",
            ]),
            Duration::from_secs(60),
        )
        .await
        .unwrap(),
    );
    assert_eq!(stdout(&r, 0), "small ok", "{r:?}");
    assert_eq!(r.steps.len(), 2, "{r:?}");
    assert_ne!(stdout(&r, 1), "big ok", "400 MiB fit under a 96 MiB limit");
    // Killed by the kernel's OOM killer (SIGKILL) or refused the allocation (MemoryError).
    let big = &r.steps[1];
    assert!(
        big.exit_code == 137 || String::from_utf8_lossy(&big.stderr).contains("MemoryError"),
        "exit {} stderr {}",
        big.exit_code,
        String::from_utf8_lossy(&big.stderr)
    );
    p.shutdown().await;
}

#[tokio::test]
async fn output_caps_hold() {
    let _d = need_engine!();
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.output_bytes = 1000;
    let p = started(c).await;
    let j = as_js(
        p.run(
            js("process.stdout.write('x'.repeat(100000))"),
            Duration::from_secs(20),
        )
        .await
        .unwrap(),
    );
    assert_eq!(j.stdout.len(), 1000);
    assert!(j.stdout_truncated);
    p.shutdown().await;
}

#[tokio::test]
async fn a_deadline_kills_the_container() {
    let d = need_engine!();
    let dir = tempfile::tempdir().unwrap();
    let p = started(config(dir.path())).await;

    // The runner's own deadline: the answer says timed out, and by then the container is
    // dead; it is removed right after.
    let j = as_js(
        p.run(
            js("require('child_process').spawn('sleep', ['1000'], {detached: true}); while (true) {}"),
            Duration::from_secs(2),
        )
        .await
        .unwrap(),
    );
    assert!(j.timed_out);
    assert_eq!(j.exit_code, 124);
    p.settle().await;
    assert!(labelled(&d, p.instance_id()).await.is_empty());

    // The provider's own deadline: a container that stops answering (paused here) is killed
    // at the deadline plus the grace, and the run fails as "may have run".
    let inst = p.instance_id().to_owned();
    let runs_dir = dir.path().join("docker").join("instances").join(&inst);
    let d2 = d.clone();
    let pauser = tokio::spawn(async move {
        for _ in 0..500 {
            if let Some(id) = containers_labelled(&d2, LABEL_INSTANCE, &inst)
                .await
                .unwrap()
                .first()
            {
                // Pause only once the run's program is up: sandboxd has opened its socket
                // (its startup language probe, which also runs node, is over) and node
                // runs. Pausing a container that is still starting would test the
                // start-up timeout instead.
                let socket_open = walk_has(&runs_dir, plimsoll_docker::engine::SOCKET_NAME);
                let running = socket_open && runs_node(&d2, id).await;
                if running {
                    d2.pause_container(id).await.unwrap();
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    });
    let e = p
        .run(js("setTimeout(() => {}, 60000)"), Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(pauser.await.unwrap(), "no container to pause");
    match e {
        ProviderError::Failed(m) => assert!(m.contains("was killed"), "{m}"),
        other => panic!("expected a may-have-run failure, got {other:?}"),
    }
    p.settle().await;
    assert!(labelled(&d, p.instance_id()).await.is_empty());
    p.shutdown().await;
}

#[tokio::test]
async fn a_tag_repointed_after_startup_does_not_change_what_runs() {
    let d = need_engine!();
    let tag_repo = format!("plimsoll-test/repoint-{}", std::process::id());
    let tag = format!("{tag_repo}:t");
    d.tag_image(
        IMAGE,
        Some(TagImageOptions {
            repo: Some(tag_repo.clone()),
            tag: Some("t".into()),
        }),
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.image = tag.clone();
    let p = started(c).await;
    let original = p.image_id();

    // A different image under the same tag: it holds a marker file.
    let body = bollard::models::ContainerCreateBody {
        image: Some(original.clone()),
        user: Some("0".into()),
        entrypoint: Some(vec!["/bin/sh".into(), "-c".into()]),
        cmd: Some(vec!["echo repointed > /etc/plimsoll-marker".into()]),
        ..Default::default()
    };
    let made = d
        .create_container(
            None::<bollard::query_parameters::CreateContainerOptions>,
            body,
        )
        .await
        .unwrap();
    d.start_container(&made.id, None).await.unwrap();
    let mut wait = d.wait_container(&made.id, None);
    use futures_util::StreamExt;
    while wait.next().await.is_some() {}
    let committed = d
        .commit_container(
            CommitContainerOptions {
                container: Some(made.id.clone()),
                repo: Some(tag_repo.clone()),
                tag: Some("t".into()),
                ..Default::default()
            },
            bollard::models::ContainerConfig::default(),
        )
        .await
        .unwrap();
    plimsoll_docker::engine::remove(&d, &made.id).await;
    let now = d.inspect_image(&tag).await.unwrap().id.unwrap();
    assert_ne!(now, original, "the tag was not re-pointed");
    assert_eq!(now, committed.id);

    let r = as_project(
        p.run(
            project(&["cat /etc/plimsoll-marker 2>/dev/null || echo original"]),
            Duration::from_secs(20),
        )
        .await
        .unwrap(),
    );
    assert_eq!(stdout(&r, 0), "original");
    assert_eq!(p.facts().environment, support::environment(&original));
    p.shutdown().await;
    d.remove_image(&tag, None::<RemoveImageOptions>, None)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_loader_choosing_variable_is_refused() {
    let d = need_engine!();
    let dir = tempfile::tempdir().unwrap();
    let p = started(config(dir.path())).await;
    for name in ["LD_PRELOAD", "NODE_OPTIONS", "PYTHONPATH", "BASH_ENV"] {
        let e = p
            .run_with_env(
                js("console.log('ran')"),
                Duration::from_secs(10),
                vec![(name.into(), "/tmp/evil".into())],
            )
            .await
            .unwrap_err();
        match e {
            ProviderError::Refused(r) => {
                assert_eq!(r.reason, Reason::Request, "{name}");
                assert!(r.message.contains(name), "{}", r.message);
            }
            other => panic!("{name}: expected a refusal, got {other:?}"),
        }
    }
    // A harmless extra is passed to the program.
    let j = as_js(
        p.run_with_env(
            js("console.log(process.env.PLIMSOLL_TEST_EXTRA)"),
            Duration::from_secs(20),
            vec![("PLIMSOLL_TEST_EXTRA".into(), "hello".into())],
        )
        .await
        .unwrap(),
    );
    assert_eq!(j.stdout, b"hello\n");
    p.shutdown().await;

    // An image whose ENV would choose what sandboxd loads is refused at startup.
    let created = d
        .create_container(
            None::<bollard::query_parameters::CreateContainerOptions>,
            bollard::models::ContainerCreateBody {
                image: Some(IMAGE.into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let repo = format!("plimsoll-test/ldpreload-{}", std::process::id());
    d.commit_container(
        CommitContainerOptions {
            container: Some(created.id.clone()),
            repo: Some(repo.clone()),
            tag: Some("t".into()),
            changes: Some("ENV LD_PRELOAD=/tmp/evil.so".into()),
            ..Default::default()
        },
        bollard::models::ContainerConfig::default(),
    )
    .await
    .unwrap();
    plimsoll_docker::engine::remove(&d, &created.id).await;
    let mut c = config(dir.path());
    c.image = format!("{repo}:t");
    let e = DockerProvider::new(c).unwrap().start().await.unwrap_err();
    assert!(e.message.contains("LD_PRELOAD"), "{e}");
    d.remove_image(&format!("{repo}:t"), None::<RemoveImageOptions>, None)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_missing_engine_is_a_clear_startup_error() {
    // Needs no engine: that is the point.
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.docker_host = Some("unix:///nonexistent/plimsoll/docker.sock".into());
    // bollard checks that the socket exists when the client is made; either step may say so.
    let e = match DockerProvider::new(c) {
        Ok(p) => p.start().await.unwrap_err(),
        Err(e) => e,
    };
    assert_eq!(e.provider, "docker");
    assert!(e.message.contains("cannot reach the Docker engine"), "{e}");
    assert!(
        e.message.contains("/nonexistent/plimsoll/docker.sock"),
        "{e}"
    );
    assert!(e.message.contains("DOCKER_HOST"), "{e}");

    let mut c = config(dir.path());
    c.docker_host = Some("tcp://127.0.0.1:2375".into());
    let e = DockerProvider::new(c).unwrap_err();
    assert!(e.message.contains("DOCKER_HOST"), "{e}");
}

#[tokio::test]
async fn runsc_is_refused_unless_the_engine_has_it_and_gvisor_is_proven() {
    let d = need_engine!();
    let dir = tempfile::tempdir().unwrap();
    // A runtime the engine does not list: refused before any container, naming what to add.
    let mut c = config(dir.path());
    c.runtime = Runtime::Runsc;
    c.runtime_name = Some("plimsoll-unregistered-runsc".into());
    let p = DockerProvider::new(c).unwrap();
    let e = p.start().await.unwrap_err();
    for part in [
        "SANDBOX_DOCKER_RUNTIME=runsc",
        "does not list runtime \"plimsoll-unregistered-runsc\"",
        "/etc/docker/daemon.json",
        "\"--network=none\", \"--host-uds=all\"",
    ] {
        assert!(e.message.contains(part), "{part} missing from: {e}");
    }
    assert_eq!(p.facts().tier, None, "a tier was claimed without proof");
    assert!(labelled(&d, p.instance_id()).await.is_empty());

    let listed = d
        .info()
        .await
        .unwrap()
        .runtimes
        .unwrap_or_default()
        .contains_key("runsc");
    if !listed {
        let why = "the engine does not list runsc (the runsc half); run .ci/register-runsc";
        plimsoll_testkit::docker::gate::<()>(Err(why.to_owned()));
        return;
    }
    // The registered runsc: gVisor proven from inside, tier `kernel`, the runtime named in
    // the environment identity.
    let mut c = config(dir.path());
    c.runtime = Runtime::Runsc;
    let p = started(c).await;
    let f = p.facts();
    assert_eq!(f.tier, Some(plimsoll_core::Tier::Kernel));
    assert_eq!(
        f.environment,
        format!("docker-image:{};runtime=runsc", p.image_id())
    );
    assert!(f.supports_grants);
    // What the code sees is gVisor's kernel, not the host's.
    let r = as_project(
        p.run(
            project(&["cat /proc/version", "dmesg | head -n 1"]),
            Duration::from_secs(30),
        )
        .await
        .unwrap(),
    );
    let host = std::fs::read_to_string("/proc/version").unwrap();
    assert_ne!(stdout(&r, 0), host.trim());
    assert!(stdout(&r, 1).contains("Starting gVisor"), "{r:?}");
    p.shutdown().await;
}

/// Registers a runtime with the engine through the script CI uses; `None` when this machine
/// cannot (no runsc, not root) and the run does not require it.
fn register_runtime(name: &str, args: &[&str], runsc: Option<&str>) -> Option<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.ci/register-runsc");
    let mut cmd = Command::new(script);
    cmd.arg(name).arg("--").args(args);
    if let Some(path) = runsc {
        cmd.env("RUNSC", path);
    }
    let out = cmd.output().unwrap();
    if out.status.success() {
        return Some(());
    }
    let why = String::from_utf8_lossy(&out.stderr);
    plimsoll_testkit::docker::gate(Err(format!(
        ".ci/register-runsc {name} failed (cannot register runtime {name}): {why}"
    )))
}

#[tokio::test]
async fn a_runsc_runtime_without_its_arguments_is_a_clear_startup_error() {
    let d = need_engine!();
    let dir = tempfile::tempdir().unwrap();
    let start = |name: &str| {
        let mut c = config(dir.path());
        c.runtime = Runtime::Runsc;
        c.runtime_name = Some(name.into());
        DockerProvider::new(c).unwrap()
    };
    // No arguments at all: gVisor's network on, and sandboxd's socket invisible to the host.
    if register_runtime("runsc-bare", &[], None).is_none() {
        return;
    }
    let p = start("runsc-bare");
    let e = p.start().await.unwrap_err();
    for part in [
        "SANDBOX_DOCKER_RUNTIME=runsc",
        "runtime \"runsc-bare\"",
        "add --network=none",
        "--host-uds=all (it has --host-uds=none",
        "/etc/docker/daemon.json",
        "SIGHUP",
    ] {
        assert!(e.message.contains(part), "{part} missing from: {e}");
    }
    assert_eq!(p.facts().tier, None);
    assert!(labelled(&d, p.instance_id()).await.is_empty());

    // The network off but no host socket: the channel cannot work, and it says so.
    register_runtime("runsc-nouds", &["--network=none"], None).unwrap();
    let e = start("runsc-nouds").start().await.unwrap_err();
    assert!(
        e.message.contains("--host-uds=all (it has --host-uds=none"),
        "{e}"
    );
    assert!(!e.message.contains("add --network=none"), "{e}");

    // Sockets allowed but the network left to runsc's default.
    register_runtime("runsc-net", &["--host-uds=all"], None).unwrap();
    let e = start("runsc-net").start().await.unwrap_err();
    assert!(e.message.contains("add --network=none"), "{e}");
    assert!(!e.message.contains("--host-uds=all (it"), "{e}");

    // A runtime named like runsc that runs runc is no gVisor.
    register_runtime("runsc-runc", &["--network=none"], Some("/usr/bin/runc")).unwrap();
    let e = start("runsc-runc").start().await.unwrap_err();
    assert!(e.message.contains("not an executable named runsc"), "{e}");

    // `--host-uds=create` is the narrowest setting for the channel: it serves, tier `kernel`,
    // but code cannot reach a host socket, so no grants are offered.
    register_runtime(
        "runsc-create",
        &["--network=none", "--host-uds=create"],
        None,
    )
    .unwrap();
    let p = start("runsc-create");
    p.start().await.unwrap();
    assert_eq!(p.facts().tier, Some(plimsoll_core::Tier::Kernel));
    assert!(!p.facts().supports_grants);
    let j = as_js(
        p.run(js("console.log('through create')"), Duration::from_secs(30))
            .await
            .unwrap(),
    );
    assert_eq!(j.stdout, b"through create\n");
    p.shutdown().await;
    assert!(labelled(&d, p.instance_id()).await.is_empty());
}

#[tokio::test]
async fn the_warm_pool_uses_each_container_once_and_refills() {
    let d = need_engine!();
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.pool = 2;
    let p = started(c).await;
    assert_eq!(p.wait_pool(2, Duration::from_secs(60)).await, 2);
    let before: Vec<String> = labelled(&d, p.instance_id()).await;
    assert_eq!(before.len(), 2);
    // Each run leaves a marker in /tmp; a reused container would show the previous one.
    for _ in 0..3 {
        let r = as_project(
            p.run(
                project(&["ls /tmp/plimsoll-used 2>/dev/null && echo reused || echo fresh; touch /tmp/plimsoll-used"]),
                Duration::from_secs(20),
            )
            .await
            .unwrap(),
        );
        assert_eq!(stdout(&r, 0), "fresh");
    }
    p.settle().await;
    assert_eq!(p.wait_pool(2, Duration::from_secs(60)).await, 2);
    let after = labelled(&d, p.instance_id()).await;
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(
        after.iter().all(|a| !before.contains(a)),
        "a pool container was kept after use"
    );
    p.shutdown().await;
    assert!(labelled(&d, p.instance_id()).await.is_empty());
}

#[tokio::test]
async fn a_second_daemons_containers_survive_the_first_ones_reconciliation() {
    let d = need_engine!();
    let dir = tempfile::tempdir().unwrap();
    let mut c1 = config(dir.path());
    c1.pool = 1;
    let first = started(c1).await;
    assert_eq!(first.wait_pool(1, Duration::from_secs(60)).await, 1);
    let mine = labelled(&d, first.instance_id()).await;
    assert_eq!(mine.len(), 1);

    // Same state directory, same engine, started while the first one lives.
    let second = started(config(dir.path())).await;
    assert_eq!(labelled(&d, first.instance_id()).await, mine);
    // And with another state directory.
    let other = tempfile::tempdir().unwrap();
    let third = started(config(other.path())).await;
    assert_eq!(labelled(&d, first.instance_id()).await, mine);
    // The survivor still serves from its pool.
    let j = as_js(
        first
            .run(js("console.log('alive')"), Duration::from_secs(20))
            .await
            .unwrap(),
    );
    assert_eq!(j.stdout, b"alive\n");
    for p in [first, second, third] {
        p.shutdown().await;
    }
}

// ---- through plimsolld ------------------------------------------------------------------

fn request(payload: Payload) -> pb::RunRequest {
    pb::RunRequest {
        protocol: 5,
        timeout_ms: 30_000,
        payload: Some(payload),
        ..Default::default()
    }
}

#[tokio::test]
async fn plimsolld_serves_javascript_python_and_shell_from_docker() {
    use plimsoll_core::pb::sandbox_service_client::SandboxServiceClient;
    let d = need_engine!();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let env = plimsoll_daemon::env::MapEnv::from_pairs([
        ("PLIMSOLL_ADDR", "127.0.0.1:0"),
        ("PLIMSOLL_METRICS_ADDR", "off"),
        ("PLIMSOLL_INSECURE", "1"),
        ("PLIMSOLL_STATE_DIR", state.to_str().unwrap()),
        ("SANDBOX_PROVIDER", "docker"),
        ("SANDBOX_DOCKER_IMAGE", IMAGE),
        ("SANDBOX_DOCKER_POOL", "1"),
        ("SANDBOX_DOCKER_RUNTIME", support::runtime().as_str()),
        ("SANDBOX_MIN_ISOLATION", "container"),
    ]);
    let cfg = plimsoll_daemon::Config::from_env(&env).unwrap();
    let daemon = plimsoll_daemon::start(cfg).await.unwrap();
    let mut client = SandboxServiceClient::connect(format!("http://{}", daemon.rpc_addr()))
        .await
        .unwrap();

    let desc = client
        .describe(pb::DescribeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(desc.sandbox, "docker");
    assert_eq!(desc.isolation, tier().as_str());
    let env_id = desc
        .javascript_environment
        .as_ref()
        .unwrap()
        .identity
        .clone();
    assert!(env_id.starts_with("docker-image:sha256:"), "{env_id}");
    assert_eq!(env_id.ends_with(";runtime=runsc"), gvisor(), "{env_id}");

    let req = request(Payload::Javascript(pb::JavaScriptRun {
        code: "console.log([1, 2, 3].map(x => x * 14).join(','))".into(),
        grant_profile: String::new(),
    }));
    let resp = client.run(req.clone()).await.unwrap().into_inner();
    plimsoll_core::check::check_answer(&req, &resp).unwrap();
    assert_eq!(resp.sandbox, "docker");
    assert_eq!(resp.isolation, tier().as_str());
    assert_eq!(resp.environment, env_id);
    assert_eq!(resp.record.as_ref().unwrap().environment, env_id);
    let Some(R::Javascript(j)) = resp.result else {
        panic!("no javascript result")
    };
    assert_eq!(j.stdout, b"14,28,42\n");

    let req = request(Payload::Project(pb::ProjectRun {
        files: vec![pb::ProjectFile {
            path: "data.txt".into(),
            content: "6 7".into(),
        }],
        steps: vec![
            "python3 -c \"a, b = open('data.txt').read().split(); print(int(a) * int(b))\"".into(),
            "set -- $(cat data.txt); echo $(($1 * $2)) > out.txt".into(),
        ],
        artifacts: vec!["out.txt".into()],
        grant_profile: String::new(),
    }));
    let resp = client.run(req.clone()).await.unwrap().into_inner();
    plimsoll_core::check::check_answer(&req, &resp).unwrap();
    let Some(R::Project(p)) = resp.result else {
        panic!("no project result")
    };
    assert_eq!(p.outcome, pb::ProjectOutcome::Completed as i32, "{p:?}");
    assert_eq!(String::from_utf8_lossy(&p.steps[0].stdout), "42\n");
    assert_eq!(p.artifacts[0].content, b"42\n");

    // A `kernel` floor: served under gVisor (proven at startup); above what runc proves, so
    // refused before anything runs.
    let mut req = request(Payload::Javascript(pb::JavaScriptRun {
        code: "console.log('floor met')".into(),
        grant_profile: String::new(),
    }));
    req.minimum_isolation = "kernel".into();
    if gvisor() {
        let resp = client.run(req.clone()).await.unwrap().into_inner();
        plimsoll_core::check::check_answer(&req, &resp).unwrap();
        assert_eq!(resp.isolation, "kernel");
        assert_eq!(resp.record.as_ref().unwrap().isolation, "kernel");
        let Some(R::Javascript(j)) = resp.result else {
            panic!("no javascript result")
        };
        assert_eq!(j.stdout, b"floor met\n");
    } else {
        let e = client.run(req).await.unwrap_err();
        assert_eq!(
            plimsoll_core::not_dispatched_reason(&e),
            Some(Reason::Isolation)
        );
        assert!(e.message().contains("kernel"), "{e}");
    }

    let instance = only_instance(&state.join("docker"));
    daemon.shutdown().await;
    // Dropping the provider removes its pool, from a thread of its own: wait for it.
    let mut left = labelled(&d, &instance).await;
    for _ in 0..100 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        left = labelled(&d, &instance).await;
    }
    assert!(left.is_empty(), "containers left behind: {left:?}");
}

#[tokio::test]
async fn plimsolld_refuses_to_start_on_a_missing_engine() {
    let dir = tempfile::tempdir().unwrap();
    let env = plimsoll_daemon::env::MapEnv::from_pairs([
        ("PLIMSOLL_ADDR", "127.0.0.1:0"),
        ("PLIMSOLL_METRICS_ADDR", "off"),
        ("PLIMSOLL_INSECURE", "1"),
        ("PLIMSOLL_STATE_DIR", dir.path().to_str().unwrap()),
        ("SANDBOX_PROVIDER", "docker"),
        ("SANDBOX_DOCKER_IMAGE", IMAGE),
        ("DOCKER_HOST", "unix:///nonexistent/docker.sock"),
    ]);
    let cfg = plimsoll_daemon::Config::from_env(&env).unwrap();
    let Err(e) = plimsoll_daemon::start(cfg).await else {
        panic!("started without an engine")
    };
    let m = e.to_string();
    assert!(
        m.contains("cannot reach the Docker engine at unix:///nonexistent/docker.sock"),
        "{m}"
    );
}

/// Whether a `node` process runs in the container, read from inside it through
/// `docker exec` (under gVisor `docker top` lists the host's processes, not the guest's).
async fn runs_node(d: &Docker, id: &str) -> bool {
    use bollard::exec::{CreateExecOptions, StartExecResults};
    use futures_util::StreamExt;
    let script = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < \"$f\"; echo; done 2>/dev/null";
    let Ok(exec) = d
        .create_exec(
            id,
            CreateExecOptions {
                cmd: Some(vec!["sh", "-c", script]),
                attach_stdout: Some(true),
                attach_stderr: Some(false),
                ..Default::default()
            },
        )
        .await
    else {
        return false;
    };
    let Ok(StartExecResults::Attached { mut output, .. }) = d.start_exec(&exec.id, None).await
    else {
        return false;
    };
    let mut text = String::new();
    while let Some(Ok(chunk)) = output.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
    }
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .any(|prog| prog == "node" || prog.ends_with("/node"))
}

/// Whether a file named `name` exists anywhere under `dir`.
fn walk_has(dir: &Path, name: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        let p = e.path();
        e.file_name() == name || (p.is_dir() && walk_has(&p, name))
    })
}

fn only_instance(state: &Path) -> String {
    let locks: Vec<String> = std::fs::read_dir(state.join("instances"))
        .unwrap()
        .filter_map(|e| {
            e.unwrap()
                .file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".lock"))
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(locks.len(), 1, "{locks:?}");
    locks[0].clone()
}

// ---- SIGKILL and restart, with the daemon as a real process ----------------------------

/// Not a test of its own: the body of the daemon process that
/// `sigkill_and_restart_leaves_no_orphan` starts (this test binary, re-executed).
#[tokio::test]
#[ignore = "helper process for sigkill_and_restart_leaves_no_orphan"]
async fn daemon_process() {
    let env = plimsoll_daemon::env::ProcessEnv;
    let cfg = plimsoll_daemon::Config::from_env(&env).expect("configuration");
    let daemon = plimsoll_daemon::start(cfg).await.expect("daemon start");
    println!("READY {}", daemon.rpc_addr());
    std::future::pending::<()>().await;
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_daemon(state: &Path, pool: &str) -> Daemon {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "daemon_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("PLIMSOLL_ADDR", "127.0.0.1:0")
        .env("PLIMSOLL_METRICS_ADDR", "off")
        .env("PLIMSOLL_INSECURE", "1")
        .env("PLIMSOLL_STATE_DIR", state)
        .env("SANDBOX_PROVIDER", "docker")
        .env("SANDBOX_DOCKER_IMAGE", IMAGE)
        .env("SANDBOX_DOCKER_POOL", pool)
        .env("SANDBOX_DOCKER_RUNTIME", support::runtime().as_str())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(out).lines();
    loop {
        match lines.next() {
            // The test harness may print "test daemon_process ... " on the same line.
            Some(Ok(l)) if l.contains("READY ") => break,
            Some(Ok(_)) => continue,
            other => panic!("the daemon process ended before serving: {other:?}"),
        }
    }
    Daemon(child)
}

#[tokio::test]
async fn sigkill_and_restart_leaves_no_orphan() {
    let d = need_engine!();
    let dir = tempfile::tempdir().unwrap();
    let state: PathBuf = dir.path().join("state");
    let first = tokio::task::spawn_blocking({
        let s = state.clone();
        move || spawn_daemon(&s, "2")
    })
    .await
    .unwrap();
    let killed = only_instance(&state.join("docker"));
    let mut left = Vec::new();
    for _ in 0..600 {
        left = labelled(&d, &killed).await;
        if left.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        left.len() >= 2,
        "the first daemon never filled its pool: {left:?}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.0.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    drop(first);
    // SIGKILL left its containers running.
    assert!(labelled(&d, &killed).await.len() >= 2);

    let second = tokio::task::spawn_blocking({
        let s = state.clone();
        move || spawn_daemon(&s, "0")
    })
    .await
    .unwrap();
    assert!(
        labelled(&d, &killed).await.is_empty(),
        "containers of the killed daemon survived the restart"
    );
    assert!(!state
        .join("docker/instances")
        .join(format!("{killed}.lock"))
        .exists());
    let survivor = only_instance(&state.join("docker"));
    assert_ne!(survivor, killed);
    drop(second);
    // Clean up what the second (also killed) daemon may have left.
    for id in labelled(&d, &survivor).await {
        plimsoll_docker::engine::remove(&d, &id).await;
    }
}
