//! The real `plimsolld` binary's standard gRPC doors, seen by an independent client: gRPC's
//! own Python packages (`grpcio`, `grpcio-health-checking`, `grpcio-reflection`) run
//! `grpc_doors.py`, kept beside this file, against the plain and the TLS listener, with no
//! token: health answers `SERVING`, reflection lists `plimsoll.v1.SandboxService` and its
//! `Run`, and `SandboxService` itself still refuses the token-less call.

use std::path::Path;
use std::process::Command;

use plimsoll_testkit::plimsolld::Plimsolld;

const BIN: &str = env!("CARGO_BIN_EXE_plimsolld");
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/grpc_doors.py");

fn callers(dir: &Path) -> String {
    let mut file = plimsoll_callers::CallersFile::default();
    file.add("tester", &[]).unwrap();
    let path = dir.join("callers.json");
    file.save(&path).unwrap();
    path.to_str().unwrap().to_owned()
}

/// plimsolld serving with `vars` and a callers file; its `host:port`.
fn serve(dir: &Path, vars: &[(&str, &str)]) -> (Plimsolld, String) {
    let callers = callers(dir);
    let mut all = vec![("PLIMSOLL_CLIENTS_FILE", callers.as_str())];
    all.extend_from_slice(vars);
    let mut p = Plimsolld::spawn(BIN, dir, &all);
    let addr = p
        .serving()
        .unwrap_or_else(|| panic!("plimsolld did not serve:\n{}", p.log()));
    let addr = addr.trim_start_matches("http://").to_owned();
    (p, addr)
}

/// The script's JSON answer about `addr`.
fn doors(python: &Path, addr: &str, extra: &[&str]) -> serde_json::Value {
    let out = Command::new(python)
        .arg(SCRIPT)
        .arg(addr)
        .args(extra)
        .output()
        .expect("run the Python client");
    assert!(
        out.status.success(),
        "grpc_doors.py failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "grpc_doors.py printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// What every listener with reflection on answers, whatever its transport.
fn assert_open_doors(v: &serde_json::Value) {
    assert_eq!(v["health"][""], "SERVING", "{v}");
    assert_eq!(v["health"]["plimsoll.v1.SandboxService"], "SERVING", "{v}");
    let services = v["reflection"]["services"].as_array().expect("a list");
    for s in ["plimsoll.v1.SandboxService", "grpc.health.v1.Health"] {
        assert!(services.iter().any(|x| x == s), "{s} not listed: {v}");
    }
    let methods = v["reflection"]["methods"].as_array().expect("methods");
    assert!(methods.iter().any(|m| m == "Run"), "{v}");
    let v1 = v["reflection_v1"].as_array().expect("a v1 list");
    assert!(v1.iter().any(|x| x == "plimsoll.v1.SandboxService"), "{v}");
    // Health and reflection are outside the authenticator; SandboxService is not.
    assert_eq!(v["describe"], "UNAUTHENTICATED", "{v}");
}

#[test]
fn grpcio_probes_health_and_lists_the_service_through_reflection() {
    let Some(python) =
        plimsoll_testkit::python::interpreter(&["grpc", "grpc_health", "grpc_reflection"])
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (mut p, addr) = serve(dir.path(), &[]);
    assert_open_doors(&doors(&python, &addr, &[]));
    assert!(p.stop().success(), "{}", p.log());

    // Reflection turned off: its services are not there (UNIMPLEMENTED), health still is.
    let (mut p, addr) = serve(dir.path(), &[("PLIMSOLL_REFLECTION", "0")]);
    let v = doors(&python, &addr, &[]);
    assert_eq!(v["health"][""], "SERVING", "{v}");
    assert_eq!(v["reflection"], "UNIMPLEMENTED", "{v}");
    assert_eq!(v["reflection_v1"], "UNIMPLEMENTED", "{v}");
    assert_eq!(v["describe"], "UNAUTHENTICATED", "{v}");
    assert!(p.stop().success(), "{}", p.log());
}

#[test]
fn grpcio_reaches_both_doors_on_the_tls_listener() {
    let Some(python) =
        plimsoll_testkit::python::interpreter(&["grpc", "grpc_health", "grpc_reflection"])
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ca = plimsoll_testkit::ca::Ca::unique("grpc doors CA");
    let leaf = ca.leaf(&["plimsolld.test"]);
    let (ca_file, cert, key) = (
        dir.path().join("ca.pem"),
        dir.path().join("tls.crt"),
        dir.path().join("tls.key"),
    );
    ca.write(&ca_file);
    std::fs::write(&cert, &leaf.cert_pem).unwrap();
    std::fs::write(&key, &leaf.key_pem).unwrap();
    let (mut p, addr) = serve(
        dir.path(),
        &[
            ("PLIMSOLL_TLS_CERT", cert.to_str().unwrap()),
            ("PLIMSOLL_TLS_KEY", key.to_str().unwrap()),
        ],
    );
    let tls = [
        "--ca",
        ca_file.to_str().unwrap(),
        "--server-name",
        "plimsolld.test",
    ];
    assert_open_doors(&doors(&python, &addr, &tls));
    assert!(p.stop().success(), "{}", p.log());
}
