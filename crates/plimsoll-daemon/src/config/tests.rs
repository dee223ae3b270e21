//! The configuration's tests: every variable read through `Config::from_env`, with the
//! providers' own reading behind it.

use super::*;
use crate::env::MapEnv;

fn docker_of(c: &Config) -> &plimsoll_docker::DockerConfig {
    match &c.provider {
        ProviderConfig::Docker(d) => d,
        other => panic!("not docker: {other:?}"),
    }
}

#[test]
fn booleans() {
    for off in ["", "0", "false"] {
        assert!(!parse_bool("X", Some(off)).unwrap());
    }
    for on in ["1", "true"] {
        assert!(parse_bool("X", Some(on)).unwrap());
    }
    let e = parse_bool("PLIMSOLL_HARDENED", Some("yes")).unwrap_err();
    assert_eq!(e.name, "PLIMSOLL_HARDENED");
}

#[test]
fn no_auth_is_refused_with_the_fix() {
    let e = Config::from_env(&MapEnv::default()).unwrap_err();
    assert_eq!(e.name, "PLIMSOLL_CLIENTS_FILE");
    assert!(e.message.contains("plimsoll callers add"));
}

#[test]
fn withheld_scan_settings_are_read_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let set_path = dir.path().join("withheld.json");
    let mut set = plimsoll_withheld::WithheldSet::empty();
    set.add(
        plimsoll_withheld::Entry::run(
            "canary",
            plimsoll_withheld::Mode::Refuse,
            b"canary-value-for-config-test",
        )
        .unwrap(),
    )
    .unwrap();
    set.save(&set_path).unwrap();
    let known_path = dir.path().join("known-images.json");
    plimsoll_withheld::KnownImages::empty()
        .save(&known_path)
        .unwrap();
    let (set_s, known_s) = (set_path.to_str().unwrap(), known_path.to_str().unwrap());
    let docker = [
        ("PLIMSOLL_INSECURE", "1"),
        ("SANDBOX_PROVIDER", "docker"),
        ("SANDBOX_DOCKER_IMAGE", "plimsoll/sandbox:latest"),
    ];
    let with = |extra: &[(&'static str, &str)]| {
        let mut p: Vec<(&str, &str)> = docker.to_vec();
        p.extend_from_slice(extra);
        Config::from_env(&MapEnv::from_pairs(p))
    };
    assert!(docker_of(&with(&[]).unwrap()).withheld.is_none());
    let c = with(&[
        ("PLIMSOLL_WITHHELD_SET", set_s),
        ("PLIMSOLL_WITHHELD_KNOWN_FILE", known_s),
    ])
    .unwrap();
    let w = docker_of(&c).withheld.clone().unwrap();
    assert_eq!(w.set.entries().len(), 1);
    assert_eq!(w.known_file.as_deref(), Some(known_path.as_path()));
    let c = with(&[("PLIMSOLL_WITHHELD_SET", set_s)]).unwrap();
    let w = docker_of(&c).withheld.clone().unwrap();
    assert!(w.known_file.is_none());

    // A missing or malformed file names its variable.
    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, b"{\"format\":\"nope\"}").unwrap();
    let g = garbage.to_str().unwrap();
    for (extra, name) in [
        (
            vec![("PLIMSOLL_WITHHELD_SET", "/nonexistent/withheld.json")],
            "PLIMSOLL_WITHHELD_SET",
        ),
        (vec![("PLIMSOLL_WITHHELD_SET", g)], "PLIMSOLL_WITHHELD_SET"),
        (
            vec![
                ("PLIMSOLL_WITHHELD_SET", set_s),
                ("PLIMSOLL_WITHHELD_KNOWN_FILE", "/nonexistent/known.json"),
            ],
            "PLIMSOLL_WITHHELD_KNOWN_FILE",
        ),
        (
            vec![
                ("PLIMSOLL_WITHHELD_SET", set_s),
                ("PLIMSOLL_WITHHELD_KNOWN_FILE", g),
            ],
            "PLIMSOLL_WITHHELD_KNOWN_FILE",
        ),
        // A known file alone would scan nothing.
        (
            vec![("PLIMSOLL_WITHHELD_KNOWN_FILE", known_s)],
            "PLIMSOLL_WITHHELD_KNOWN_FILE",
        ),
    ] {
        let e = with(&extra).unwrap_err();
        assert_eq!(e.name, name, "{extra:?}: {e}");
    }

    // Another provider would scan nothing: a set is a startup error naming the variable.
    for provider in ["process", "agentsandbox", "disabled"] {
        let mut p = vec![
            ("PLIMSOLL_INSECURE", "1"),
            ("SANDBOX_PROVIDER", provider),
            ("PLIMSOLL_WITHHELD_SET", set_s),
        ];
        if provider == "agentsandbox" {
            p.push(("SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE", set_s));
            p.push(("SANDBOX_AGENTSANDBOX_SANDBOXD_TOKEN_FILE", set_s));
        }
        let e = Config::from_env(&MapEnv::from_pairs(p)).unwrap_err();
        assert_eq!(e.name, "PLIMSOLL_WITHHELD_SET", "{provider}: {e}");
        assert!(e.message.contains("nothing would be scanned"), "{e}");
    }
}

#[test]
fn quickjs_takes_only_its_own_limits_and_worker() {
    let env = |extra: &[(&'static str, &'static str)]| {
        let mut p = vec![("PLIMSOLL_INSECURE", "1"), ("SANDBOX_PROVIDER", "quickjs")];
        p.extend_from_slice(extra);
        Config::from_env(&MapEnv::from_pairs(p))
    };
    let ok = env(&[("SANDBOX_MEMORY_MB", "32")]).unwrap();
    let ProviderConfig::QuickJs(q) = &ok.provider else {
        panic!("not quickjs: {:?}", ok.provider)
    };
    // No worker named: plimsolld re-executes itself.
    assert_eq!(
        (q.memory_mb, q.worker.clone()),
        (32, plimsoll_quickjs::WorkerCommand::current_exe().unwrap())
    );
    assert_eq!(ok.run_resources().memory_mb, 32);
    for name in ["SANDBOX_CPUS", "SANDBOX_PIDS", "SANDBOX_DISK_MB"] {
        let e = env(&[(name, "1")]).unwrap_err();
        assert_eq!(e.name, name);
        assert!(e.message.contains("quickjs"), "{e}");
    }
    let e = env(&[("SANDBOX_QUICKJS_WORKER", "/nonexistent/worker")]).unwrap_err();
    assert_eq!(e.name, "SANDBOX_QUICKJS_WORKER");
    let e = Config::from_env(&MapEnv::from_pairs([
        ("PLIMSOLL_INSECURE", "1"),
        ("SANDBOX_PROVIDER", "process"),
        ("SANDBOX_QUICKJS_WORKER", "/bin/true"),
    ]))
    .unwrap_err();
    assert!(e.message.contains("SANDBOX_PROVIDER is process"), "{e}");
    let e = env(&[]).map(|_| ()).and(
        Config::from_env(&MapEnv::from_pairs([
            ("PLIMSOLL_INSECURE", "1"),
            ("SANDBOX_PROVIDER", "wasm"),
        ]))
        .map(|_| ()),
    );
    assert!(e.unwrap_err().message.contains("quickjs, process"));
}

#[test]
fn process_grants_need_one_caller_or_the_trust_statement() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, ids: &[&str]| {
        let mut f = plimsoll_callers::CallersFile::default();
        for id in ids {
            f.add(id, &[]).unwrap();
        }
        let p = dir.path().join(name);
        f.save(&p).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let (one, two) = (file("one.json", &["a"]), file("two.json", &["a", "b"]));
    let grants = dir.path().join("grants.json");
    std::fs::write(
        &grants,
        br#"{"version":1,"profiles":{"p":{"base_url":"http://127.0.0.1:9","routes":[],"allowed_callers":["a"]}}}"#,
    )
    .unwrap();
    let no_profiles = dir.path().join("none.json");
    std::fs::write(&no_profiles, br#"{"version":1,"profiles":{}}"#).unwrap();
    let (g, n) = (grants.to_str().unwrap(), no_profiles.to_str().unwrap());
    let cfg = |provider: &str, callers: &str, grants: &str, trust: &str| {
        let mut p = vec![
            ("SANDBOX_PROVIDER", provider),
            ("PLIMSOLL_CLIENTS_FILE", callers),
            ("PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS", trust),
            ("SANDBOX_DOCKER_IMAGE", "sha256:abc"),
        ];
        if !grants.is_empty() {
            p.push(("PLIMSOLL_GRANTS_FILE", grants));
        }
        Config::from_env(&MapEnv::from_pairs(p))
    };
    // Refused: the one line names the grants file, the callers file and the statement.
    let e = cfg("process", &two, g, "").unwrap_err();
    assert_eq!(e.name, "PLIMSOLL_GRANTS_FILE");
    for needed in [
        "SANDBOX_PROVIDER=process",
        "2 callers in PLIMSOLL_CLIENTS_FILE",
        two.as_str(),
        "PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS=1",
    ] {
        assert!(e.message.contains(needed), "{needed:?}: {e}");
    }
    assert_eq!(cfg("process", &two, g, "0").unwrap_err(), e);
    // Accepted: the statement, one caller, no profile, no grants file, another provider.
    let c = cfg("process", &two, g, "1").unwrap();
    assert!(c.process_grants_trust_all_callers);
    cfg("process", &one, g, "").unwrap();
    cfg("process", &two, n, "").unwrap();
    cfg("process", &two, "", "").unwrap();
    cfg("docker", &two, g, "").unwrap();
    // Insecure mode has one caller (`anon`).
    Config::from_env(&MapEnv::from_pairs([
        ("PLIMSOLL_INSECURE", "1"),
        ("SANDBOX_PROVIDER", "process"),
        ("PLIMSOLL_GRANTS_FILE", g),
    ]))
    .unwrap();
    // The statement is a boolean like every other.
    let e = cfg("process", &two, g, "yes").unwrap_err();
    assert_eq!(e.name, "PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS");
}

#[test]
fn insecure_only_on_loopback() {
    let ok = Config::from_env(&MapEnv::from_pairs([("PLIMSOLL_INSECURE", "1")])).unwrap();
    assert!(matches!(ok.auth, CallerAuth::Insecure));
    assert!(matches!(ok.provider, ProviderConfig::Disabled));
    let e = Config::from_env(&MapEnv::from_pairs([
        ("PLIMSOLL_INSECURE", "1"),
        ("PLIMSOLL_ADDR", "0.0.0.0:8746"),
    ]))
    .unwrap_err();
    assert_eq!(e.name, "PLIMSOLL_INSECURE");
}

#[test]
fn bad_values_name_their_variable() {
    for (k, v) in [
        ("SANDBOX_PROVIDER", "lambda"),
        ("SANDBOX_MIN_ISOLATION", "none"),
        ("SANDBOX_MAX_CONCURRENT", "many"),
        ("SANDBOX_MAX_CONCURRENT", "0"),
        ("PLIMSOLL_ADDR", "nowhere"),
        ("SANDBOX_CPUS", "-1"),
    ] {
        let e = Config::from_env(&MapEnv::from_pairs([("PLIMSOLL_INSECURE", "1"), (k, v)]))
            .unwrap_err();
        assert_eq!(e.name, k, "{k}={v}: {e}");
    }
}

#[test]
fn docker_settings_are_read_and_checked() {
    let base = [("PLIMSOLL_INSECURE", "1"), ("SANDBOX_PROVIDER", "docker")];
    let e = Config::from_env(&MapEnv::from_pairs(base)).unwrap_err();
    assert_eq!(e.name, "SANDBOX_DOCKER_IMAGE");
    let mut pairs = base.to_vec();
    pairs.extend([
        ("SANDBOX_DOCKER_IMAGE", "sha256:abc"),
        ("SANDBOX_DOCKER_RUNTIME", "runsc"),
        ("SANDBOX_DOCKER_POOL", "3"),
        ("SANDBOX_MEMORY_MB", "128"),
        ("PLIMSOLL_STATE_DIR", "/var/lib/plimsoll"),
        ("DOCKER_HOST", "unix:///run/docker.sock"),
    ]);
    let c = Config::from_env(&MapEnv::from_pairs(pairs.clone())).unwrap();
    let d = docker_of(&c);
    assert_eq!(d.image, "sha256:abc");
    assert_eq!(d.runtime, plimsoll_docker::Runtime::Runsc);
    assert_eq!((d.pool, d.memory_mb), (3, 128));
    assert_eq!(d.state_dir, PathBuf::from("/var/lib/plimsoll/docker"));
    assert_eq!(d.docker_host.as_deref(), Some("unix:///run/docker.sock"));
    // The seccomp profile: plimsoll's by default, the engine's on request, or a file.
    assert_eq!(d.seccomp, plimsoll_docker::Seccomp::Plimsoll);
    for (v, want) in [
        ("engine", plimsoll_docker::Seccomp::EngineDefault),
        (
            "/etc/p.json",
            plimsoll_docker::Seccomp::File(PathBuf::from("/etc/p.json")),
        ),
    ] {
        let mut p = pairs.clone();
        p.push(("SANDBOX_DOCKER_SECCOMP", v));
        let c = Config::from_env(&MapEnv::from_pairs(p)).unwrap();
        assert_eq!(docker_of(&c).seccomp, want, "{v}");
    }
    for (k, v) in [
        ("SANDBOX_DOCKER_RUNTIME", "kata"),
        ("SANDBOX_DOCKER_POOL", "lots"),
        ("SANDBOX_DOCKER_SECCOMP", "unconfined"),
        ("SANDBOX_DISK_MB", "8"),
    ] {
        let mut p = pairs.clone();
        p.push((k, v));
        let e = Config::from_env(&MapEnv::from_pairs(p)).unwrap_err();
        assert_eq!(e.name, k, "{k}={v}: {e}");
    }
    // Another provider: the docker settings are still checked, but not built.
    let c = Config::from_env(&MapEnv::from_pairs([
        ("PLIMSOLL_INSECURE", "1"),
        ("SANDBOX_PROVIDER", "process"),
        ("SANDBOX_DOCKER_POOL", "2"),
    ]))
    .unwrap();
    assert!(!matches!(c.provider, ProviderConfig::Docker(_)));
}

#[test]
fn unknown_names_are_reported() {
    let env = MapEnv::from_pairs([
        ("PLIMSOLL_INSECURE", "1"),
        ("SANDBOX_MAX_CONCURENT", "3"),
        ("HOME", "/"),
    ]);
    assert_eq!(
        unknown_variables(&env),
        vec!["SANDBOX_MAX_CONCURENT".to_owned()]
    );
}

#[test]
fn session_settings_are_read_and_checked() {
    let cfg = |pairs: &[(&str, &str)]| {
        let mut all = vec![("PLIMSOLL_INSECURE", "1")];
        all.extend_from_slice(pairs);
        Config::from_env(&MapEnv::from_pairs(all))
    };
    let c = cfg(&[
        ("SANDBOX_PROVIDER", "docker"),
        ("SANDBOX_DOCKER_IMAGE", "sha256:0123"),
        ("SANDBOX_MAX_SESSIONS", "4"),
        ("SANDBOX_SESSION_POOL", "2"),
        ("SANDBOX_SESSION_LIFETIME_MS", "60000"),
    ])
    .unwrap();
    assert_eq!((c.sessions.max_sessions, c.sessions.pool), (4, 2));
    assert_eq!(c.sessions.lifetime, Duration::from_secs(60));
    assert_eq!(docker_of(&c).session_pool, 2);
    assert!(c.shared.sessions);
    for (pairs, name) in [
        (
            &[("SANDBOX_MAX_SESSIONS", "1"), ("SANDBOX_SESSION_POOL", "2")][..],
            "SANDBOX_SESSION_POOL",
        ),
        (
            &[
                ("SANDBOX_PROVIDER", "process"),
                ("SANDBOX_MAX_SESSIONS", "2"),
                ("SANDBOX_SESSION_POOL", "1"),
            ][..],
            "SANDBOX_SESSION_POOL",
        ),
        (
            &[("SANDBOX_SESSION_LIFETIME_MS", "10")][..],
            "SANDBOX_SESSION_LIFETIME_MS",
        ),
        (
            &[("SANDBOX_SESSION_IDLE_MS", "10")][..],
            "SANDBOX_SESSION_IDLE_MS",
        ),
        (
            &[("SANDBOX_MAX_SESSIONS", "many")][..],
            "SANDBOX_MAX_SESSIONS",
        ),
    ] {
        assert_eq!(cfg(pairs).unwrap_err().name, name, "{pairs:?}");
    }
}

#[test]
fn per_caller_cap_is_a_quarter_unless_set_and_zero_opts_out() {
    let per_caller = |pairs: &[(&str, &str)]| {
        let mut all = vec![("PLIMSOLL_INSECURE", "1"), ("SANDBOX_PROVIDER", "process")];
        all.extend_from_slice(pairs);
        Config::from_env(&MapEnv::from_pairs(all))
            .unwrap()
            .sessions
            .per_caller
    };
    for (max, want) in [("1", 1), ("3", 1), ("4", 1), ("8", 2), ("9", 2), ("64", 16)] {
        assert_eq!(per_caller(&[("SANDBOX_MAX_SESSIONS", max)]), want, "{max}");
    }
    let set = |v| {
        per_caller(&[
            ("SANDBOX_MAX_SESSIONS", "8"),
            ("SANDBOX_MAX_SESSIONS_PER_CALLER", v),
        ])
    };
    assert_eq!(set("0"), 0, "an explicit 0 is no cap of its own");
    assert_eq!(set("5"), 5);
    assert_eq!(set(" "), 2, "blank is unset");
    // `plimsolld --help` states the default.
    let help = plimsoll_config::help(&[crate::sessions::SESSION_VARIABLES]);
    assert!(
        help.contains("default: a quarter of SANDBOX_MAX_SESSIONS, at least 1"),
        "{help}"
    );
}

#[test]
fn reflection_is_on_unless_hardened_and_an_explicit_value_wins() {
    let dir = tempfile::tempdir().unwrap();
    let callers = dir.path().join("callers.json");
    let mut f = plimsoll_callers::CallersFile::default();
    f.add("a", &[]).unwrap();
    f.save(&callers).unwrap();
    let callers = callers.to_str().unwrap();
    let reflection = |pairs: &[(&str, &str)]| {
        let mut all = vec![("PLIMSOLL_CLIENTS_FILE", callers)];
        all.extend_from_slice(pairs);
        Config::from_env(&MapEnv::from_pairs(all)).map(|c| c.reflection)
    };
    assert!(reflection(&[]).unwrap());
    assert!(reflection(&[("PLIMSOLL_REFLECTION", " ")]).unwrap());
    assert!(!reflection(&[("PLIMSOLL_REFLECTION", "0")]).unwrap());
    assert!(reflection(&[("PLIMSOLL_REFLECTION", "true")]).unwrap());
    // Hardened mode: off by default (blank is unset), on only when named.
    let h = ("PLIMSOLL_HARDENED", "1");
    assert!(!reflection(&[h]).unwrap());
    assert!(!reflection(&[h, ("PLIMSOLL_REFLECTION", "")]).unwrap());
    assert!(!reflection(&[h, ("PLIMSOLL_REFLECTION", "false")]).unwrap());
    assert!(reflection(&[h, ("PLIMSOLL_REFLECTION", "1")]).unwrap());
    let e = reflection(&[("PLIMSOLL_REFLECTION", "on")]).unwrap_err();
    assert_eq!(e.name, "PLIMSOLL_REFLECTION");
    // The variable is known: not reported as unknown, and `--help` lists it.
    let env = MapEnv::from_pairs([("PLIMSOLL_REFLECTION", "0")]);
    assert!(unknown_variables(&env).is_empty());
    assert!(variables_help().contains("PLIMSOLL_REFLECTION"));
}
