//! The shipped `k8s/` manifests always pass plimsolld's own read-back, grant only the verbs
//! plimsolld uses, and never carry a real key; so does the per-pod identity overlay
//! (`k8s/per-pod-identity/`), applied to the base here as kustomize applies it. YAML is read
//! with `serde-saphyr` (YAML 1.2, maintained), the same parser kube uses for kubeconfig files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use plimsoll_agentsandbox::readback::{self, Channel, DriftKind, SECRET_MODE};
use plimsoll_agentsandbox::AgentSandboxProvider;
use plimsoll_core::Tier;
use plimsoll_provider::Provider;
use plimsoll_testkit::fake_cluster::{self as fake, FakeCluster, FakeClusterOptions};
use serde_json::Value;

fn k8s_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../k8s")
}

/// The per-pod identity overlay, a kustomization of its own on top of the base.
fn overlay_dir() -> PathBuf {
    k8s_dir().join("per-pod-identity")
}

/// Every document of one YAML file.
fn read_yaml(p: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// Every document of every YAML file of the base: under k8s/ (recursively), except the
/// per-pod identity overlay, with its file name.
fn documents() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut dirs = vec![k8s_dir()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                if p != overlay_dir() {
                    dirs.push(p);
                }
            } else if p.extension().is_some_and(|x| x == "yaml") {
                let name = p.strip_prefix(k8s_dir()).unwrap().display().to_string();
                out.extend(read_yaml(&p).into_iter().map(|d| (name.clone(), d)));
            }
        }
    }
    out
}

fn find<'a>(docs: &'a [(String, Value)], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|(_, d)| d["kind"] == kind)
        .map(|(_, d)| d)
        .collect()
}

#[test]
fn the_shipped_manifests_pass_the_read_back() {
    let docs = documents();
    let templates = find(&docs, "SandboxTemplate");
    assert_eq!(templates.len(), 1);
    let t = templates[0];
    let pool = find(&docs, "SandboxWarmPool")[0];
    let policies: Vec<Value> = find(&docs, "NetworkPolicy").into_iter().cloned().collect();
    let name = t["metadata"]["name"].as_str().unwrap();
    let pool_name = pool["metadata"]["name"].as_str().unwrap();
    let r = readback::read_back(name, t, Some((pool_name, pool)), &policies);
    assert!(
        r.drifts.is_empty(),
        "k8s/ fails the read-back: {:#?}",
        r.drifts
    );
    assert_eq!(r.tier, Tier::Kernel);
    // The names are the provider's defaults.
    let d = plimsoll_agentsandbox::config::AgentSandboxConfig::new("/ca", "/t");
    assert_eq!(
        (name, pool_name),
        (d.template.as_str(), d.warm_pool.as_str())
    );
    assert_eq!(t["metadata"]["namespace"], d.namespace.as_str());
    // YAML 1.2 reads `0400` as 400: the files must say 256.
    assert_eq!(
        t["spec"]["podTemplate"]["spec"]["volumes"][0]["secret"]["defaultMode"],
        SECRET_MODE
    );
}

#[test]
fn a_drifted_copy_of_the_shipped_template_fails() {
    // The test above can fail: the same files with one flag changed do not pass.
    let docs = documents();
    let mut t = find(&docs, "SandboxTemplate")[0].clone();
    t["spec"]["podTemplate"]["spec"]["containers"][0]["args"][0] = "--listen-host=0.0.0.0".into();
    let policies: Vec<Value> = find(&docs, "NetworkPolicy").into_iter().cloned().collect();
    let r = readback::read_back("plimsoll-sandboxd", &t, None, &policies);
    assert!(r.has(readback::DriftKind::ListenHost), "{:?}", r.drifts);
}

#[test]
fn rbac_grants_only_the_verbs_plimsolld_uses() {
    let docs = documents();
    let roles = find(&docs, "Role");
    assert_eq!(roles.len(), 1);
    assert!(
        find(&docs, "ClusterRole").is_empty(),
        "nothing cluster-wide"
    );
    let mut granted = BTreeSet::new();
    for rule in roles[0]["rules"].as_array().unwrap() {
        for g in rule["apiGroups"].as_array().unwrap() {
            for r in rule["resources"].as_array().unwrap() {
                for v in rule["verbs"].as_array().unwrap() {
                    granted.insert(format!(
                        "{}/{} {}",
                        g.as_str().unwrap(),
                        r.as_str().unwrap(),
                        v.as_str().unwrap()
                    ));
                }
            }
        }
    }
    let used: BTreeSet<String> = [
        "extensions.agents.x-k8s.io/sandboxtemplates get",
        "extensions.agents.x-k8s.io/sandboxwarmpools get",
        "extensions.agents.x-k8s.io/sandboxclaims create",
        "extensions.agents.x-k8s.io/sandboxclaims get",
        "extensions.agents.x-k8s.io/sandboxclaims delete",
        "networking.k8s.io/networkpolicies list",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(granted, used);
}

#[test]
fn the_example_secrets_hold_no_key_and_are_not_applied() {
    let docs = documents();
    let tls: Vec<&(String, Value)> = docs
        .iter()
        .filter(|(_, d)| d["kind"] == "Secret" && d["type"] == "kubernetes.io/tls")
        .collect();
    assert_eq!(tls.len(), 1);
    for (file, d) in docs.iter().filter(|(_, d)| d["kind"] == "Secret") {
        assert!(file.ends_with(".example.yaml"), "{file} ships a Secret");
        let text = serde_json::to_string(d).unwrap();
        assert!(!text.contains("BEGIN"), "{file} holds PEM material");
        assert!(text.contains("PLACEHOLDER"), "{file}");
    }
    let k = find(&docs, "Kustomization")[0];
    for r in k["resources"].as_array().unwrap() {
        let r = r.as_str().unwrap();
        assert!(
            k8s_dir().join(r).is_file(),
            "kustomization lists missing {r}"
        );
        assert!(!r.contains("example"), "kustomization applies {r}");
    }
    // The shipped TLS Secret is the one the template mounts.
    let t = find(&docs, "SandboxTemplate")[0];
    assert_eq!(
        t["spec"]["podTemplate"]["spec"]["volumes"][0]["secret"]["secretName"],
        tls[0].1["metadata"]["name"]
    );
}

#[test]
fn the_deployment_sets_only_variables_plimsolld_reads() {
    let docs = documents();
    let dep = find(&docs, "Deployment")[0];
    let env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    let names: Vec<&str> = env.iter().map(|e| e["name"].as_str().unwrap()).collect();
    for n in &names {
        assert!(
            plimsoll_daemon::config::VARIABLES
                .iter()
                .any(|(k, _)| k == n),
            "{n} is not a variable plimsolld reads"
        );
    }
    for required in [
        "SANDBOX_PROVIDER",
        "SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE",
        "SANDBOX_AGENTSANDBOX_SANDBOXD_TOKEN_FILE",
        "SANDBOX_AGENTSANDBOX_ENCRYPTED_POD_NETWORK",
    ] {
        assert!(names.contains(&required), "{required}");
    }
    // plimsolld's pods are what the sandboxes' NetworkPolicy admits.
    let np = find(&docs, "NetworkPolicy")[0];
    let from = &np["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"];
    for (k, v) in from.as_object().unwrap() {
        assert_eq!(&dep["spec"]["template"]["metadata"]["labels"][k], v);
    }
}

#[tokio::test]
async fn plimsolld_starts_against_the_shipped_manifests_served_by_the_fake_api() {
    let docs = documents();
    let mut o = FakeClusterOptions::conforming(fake::sandboxd_binaries().unwrap());
    o.template = find(&docs, "SandboxTemplate")[0].clone();
    o.warm_pool = find(&docs, "SandboxWarmPool")[0].clone();
    o.policies = find(&docs, "NetworkPolicy").into_iter().cloned().collect();
    let c = FakeCluster::start(o).await.unwrap();
    let p = AgentSandboxProvider::new(c.provider_config()).unwrap();
    p.start().await.expect("the shipped manifests pass startup");
    assert_eq!(p.facts().tier, Some(Tier::Kernel));
    // The shipped image is a tag, not a digest: no environment identity is claimed.
    assert_eq!(p.facts().environment, "");
    c.shutdown().await;
}

// The per-pod identity overlay (k8s/per-pod-identity/).

const IP_WITH_CLIENT_CERTS: Channel = Channel {
    pod_identity: plimsoll_tls::PodIdentity::Ip,
    client_certs: true,
};

fn kustomization(dir: &Path) -> Value {
    let docs = read_yaml(&dir.join("kustomization.yaml"));
    assert_eq!(docs.len(), 1);
    assert_eq!(docs[0]["kind"], "Kustomization");
    docs[0].clone()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("{v} is not a list"))
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// A JSON merge patch (RFC 7386): objects merge key by key, `null` removes a key, anything
/// else (lists included) replaces the target.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let t = target.as_object_mut().unwrap();
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// One reference token of a JSON pointer, unescaped.
fn token(t: &str) -> String {
    t.replace("~1", "/").replace("~0", "~")
}

/// A JSON patch (RFC 6902): `test`, `add`, `remove` and `replace`, each failing as the RFC
/// says (a failed `test` fails the whole patch, as it fails `kubectl kustomize`).
fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), String> {
    for op in ops
        .as_array()
        .ok_or("a JSON patch is a list of operations")?
    {
        let path = op["path"].as_str().ok_or(format!("{op}: no path"))?;
        let (parent, last) = path
            .rsplit_once('/')
            .ok_or(format!("{path}: not a pointer"))?;
        let last = token(last);
        match op["op"].as_str() {
            Some("test") => {
                if doc.pointer(path) != Some(&op["value"]) {
                    return Err(format!(
                        "test {path} == {} failed: found {:?}",
                        op["value"],
                        doc.pointer(path)
                    ));
                }
            }
            Some("replace") => {
                *doc.pointer_mut(path)
                    .ok_or(format!("{path}: no such value"))? = op["value"].clone();
            }
            Some("remove") => match doc.pointer_mut(parent) {
                Some(Value::Array(a)) => {
                    let i: usize = last.parse().map_err(|_| format!("{path}: not an index"))?;
                    if i >= a.len() {
                        return Err(format!("{path}: out of range"));
                    }
                    a.remove(i);
                }
                Some(Value::Object(o)) => {
                    o.remove(&last).ok_or(format!("{path}: no such key"))?;
                }
                _ => return Err(format!("{path}: no such value")),
            },
            Some("add") => {
                let value = op["value"].clone();
                match doc.pointer_mut(parent) {
                    Some(Value::Array(a)) if last == "-" => a.push(value),
                    Some(Value::Array(a)) => {
                        let i: usize = last.parse().map_err(|_| format!("{path}: not an index"))?;
                        if i > a.len() {
                            return Err(format!("{path}: out of range"));
                        }
                        a.insert(i, value);
                    }
                    Some(Value::Object(o)) => {
                        o.insert(last, value);
                    }
                    _ => return Err(format!("{path}: no such parent")),
                }
            }
            other => return Err(format!("{path}: operation {other:?} not supported here")),
        }
    }
    Ok(())
}

fn is_kind(d: &Value, kind: &str, name: &str) -> bool {
    d["kind"] == kind && d["metadata"]["name"] == name
}

/// The overlay as `kubectl kustomize` builds it: every resource it lists (the base's files
/// and its own), then each patch: a file without a target is a merge patch of the one object
/// of its kind and name; one with a target is a JSON patch of the one object it names.
fn overlay_documents() -> Vec<Value> {
    let k = kustomization(&overlay_dir());
    let mut docs: Vec<Value> = strings(&k["resources"])
        .iter()
        .flat_map(|r| read_yaml(&overlay_dir().join(r)))
        .collect();
    for p in k["patches"].as_array().unwrap() {
        let file = overlay_dir().join(p["path"].as_str().unwrap());
        let patch = read_yaml(&file);
        assert_eq!(patch.len(), 1, "{}", file.display());
        let (kind, name) = match p.get("target") {
            Some(t) => (&t["kind"], &t["name"]),
            None => (&patch[0]["kind"], &patch[0]["metadata"]["name"]),
        };
        let (kind, name) = (kind.as_str().unwrap(), name.as_str().unwrap());
        let mut targets: Vec<&mut Value> =
            docs.iter_mut().filter(|d| is_kind(d, kind, name)).collect();
        assert_eq!(targets.len(), 1, "{}: {kind} {name}", file.display());
        if p.get("target").is_some() {
            json_patch(targets[0], &patch[0]).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        } else {
            merge_patch(targets[0], &patch[0]);
        }
    }
    docs
}

fn one<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| is_kind(d, kind, name)).collect();
    assert_eq!(found.len(), 1, "{kind} {name}");
    found[0]
}

fn overlay_template(docs: &[Value]) -> &Value {
    one(docs, "SandboxTemplate", "plimsoll-sandboxd")
}

fn read_back_overlay(docs: &[Value], template: &Value, channel: &Channel) -> readback::ReadBack {
    let pool = one(docs, "SandboxWarmPool", "plimsoll-pool");
    let policies: Vec<Value> = docs
        .iter()
        .filter(|d| d["kind"] == "NetworkPolicy")
        .cloned()
        .collect();
    readback::read_back_with(
        "plimsoll-sandboxd",
        template,
        Some(("plimsoll-pool", pool)),
        &policies,
        channel,
    )
}

#[test]
fn the_per_pod_overlay_passes_the_read_back_with_client_certificates() {
    let docs = overlay_documents();
    let t = overlay_template(&docs);
    let r = read_back_overlay(&docs, t, &IP_WITH_CLIENT_CERTS);
    assert!(
        r.drifts.is_empty(),
        "k8s/per-pod-identity/ fails the read-back: {:#?}",
        r.drifts
    );
    assert_eq!(r.tier, Tier::Kernel);
    // The overlay is what makes the difference: the base's template fails in per-pod mode,
    // and the overlay's in the base's mode.
    let base = documents();
    let base_t = find(&base, "SandboxTemplate")[0];
    let r = read_back_overlay(&docs, base_t, &IP_WITH_CLIENT_CERTS);
    assert!(
        r.has(DriftKind::CsiVolume) && r.has(DriftKind::ClientCa),
        "{:?}",
        r.drifts
    );
    let r = read_back_overlay(&docs, t, &Channel::default());
    assert!(
        r.has(DriftKind::SecretVolume) && r.has(DriftKind::ClientCa),
        "{:?}",
        r.drifts
    );
}

#[test]
fn the_read_back_refuses_each_drift_in_the_overlays_csi_volume() {
    let docs = overlay_documents();
    type Case = (&'static str, DriftKind, Box<dyn Fn(&mut Value)>);
    let attr = |key: &'static str, value: &'static str| {
        Box::new(move |csi: &mut Value| {
            csi["volumeAttributes"][format!("csi.cert-manager.io/{key}")] = value.into()
        }) as Box<dyn Fn(&mut Value)>
    };
    let cases: Vec<Case> = vec![
        ("ip-sans", DriftKind::IpSans, attr("ip-sans", "10.0.0.7")),
        (
            "driver",
            DriftKind::CsiVolume,
            Box::new(|csi| csi["driver"] = "secrets-store.csi.k8s.io".into()),
        ),
        (
            "readOnly",
            DriftKind::ReadOnly,
            Box::new(|csi| csi["readOnly"] = false.into()),
        ),
        ("fs-group", DriftKind::FsGroup, attr("fs-group", "65532")),
        ("duration", DriftKind::CertDuration, attr("duration", "48h")),
        (
            "issuer-name",
            DriftKind::Issuer,
            Box::new(|csi| {
                csi["volumeAttributes"]
                    .as_object_mut()
                    .unwrap()
                    .remove("csi.cert-manager.io/issuer-name");
            }),
        ),
        (
            "certificate-file",
            DriftKind::CertFiles,
            attr("certificate-file", "cert.pem"),
        ),
    ];
    for (what, kind, edit) in cases {
        let mut t = overlay_template(&docs).clone();
        let volumes = t["spec"]["podTemplate"]["spec"]["volumes"]
            .as_array_mut()
            .unwrap();
        let tls = volumes
            .iter_mut()
            .find(|v| v["name"] == "sandboxd-tls")
            .unwrap();
        edit(&mut tls["csi"]);
        let r = read_back_overlay(&docs, &t, &IP_WITH_CLIENT_CERTS);
        let kinds: Vec<DriftKind> = r.drifts.iter().map(|d| d.kind).collect();
        assert_eq!(kinds, vec![kind], "{what}: {:?}", r.drifts);
    }
}

#[test]
fn the_overlay_lists_every_file_of_its_folder_and_the_whole_base() {
    let k = kustomization(&overlay_dir());
    let resources = strings(&k["resources"]);
    let (base, own): (Vec<&String>, Vec<&String>) =
        resources.iter().partition(|r| r.starts_with("../"));
    // The base, file by file (kustomize refuses `../`, the directory holding the overlay).
    let base: Vec<String> = base
        .iter()
        .map(|r| r.trim_start_matches("../").to_owned())
        .collect();
    assert_eq!(base, strings(&kustomization(&k8s_dir())["resources"]));
    // Its own files: every one listed, and nothing listed that is not there.
    let mut listed: BTreeSet<String> = own.into_iter().cloned().collect();
    for p in k["patches"].as_array().unwrap() {
        assert!(listed.insert(p["path"].as_str().unwrap().to_owned()), "{p}");
    }
    listed.insert("kustomization.yaml".to_owned());
    let present: BTreeSet<String> = std::fs::read_dir(overlay_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listed, present);
    // It ships no Secret: cert-manager writes them.
    for r in &resources {
        for d in read_yaml(&overlay_dir().join(r)) {
            assert_ne!(d["kind"], "Secret", "{r}");
        }
    }
}

#[test]
fn the_overlays_deployment_presents_a_client_certificate_and_makes_no_statement() {
    let docs = overlay_documents();
    let dep = one(&docs, "Deployment", "plimsolld");
    let c = &dep["spec"]["template"]["spec"]["containers"][0];
    let env: BTreeMap<&str, &str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap(),
                e["value"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        env.len(),
        c["env"].as_array().unwrap().len(),
        "a variable twice"
    );
    for n in env.keys() {
        assert!(
            plimsoll_daemon::config::VARIABLES
                .iter()
                .any(|(k, _)| k == n),
            "{n} is not a variable plimsolld reads"
        );
    }
    assert_eq!(env["SANDBOX_AGENTSANDBOX_POD_IDENTITY"], "ip");
    let cert = env["SANDBOX_AGENTSANDBOX_CLIENT_CERT_FILE"];
    let key = env["SANDBOX_AGENTSANDBOX_CLIENT_KEY_FILE"];
    assert_eq!(cert, "/etc/plimsoll/sandboxd-client/tls.crt");
    assert_eq!(key, "/etc/plimsoll/sandboxd-client/tls.key");
    assert!(!env.contains_key("SANDBOX_AGENTSANDBOX_ENCRYPTED_POD_NETWORK"));
    // The base's does say it: the patch removed it, not a missing line.
    let base = documents();
    let base_env =
        &find(&base, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"];
    assert!(base_env
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "SANDBOX_AGENTSANDBOX_ENCRYPTED_POD_NETWORK"));
    assert_eq!(env.len(), base_env.as_array().unwrap().len() + 2);
    assert!(env.contains_key("SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE"));
    // Both files come from the client certificate's Secret, mounted read-only.
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/etc/plimsoll/sandboxd-client")
        .expect("the client certificate is mounted");
    assert_eq!(mount["readOnly"], true);
    let volume = dep["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(volume["secret"]["defaultMode"], SECRET_MODE);
    let client = one(&docs, "Certificate", "plimsolld-sandboxd-client");
    assert_eq!(volume["secret"]["secretName"], client["spec"]["secretName"]);
    assert_eq!(
        client["metadata"]["namespace"],
        dep["metadata"]["namespace"]
    );
}

#[test]
fn the_overlays_certificates_are_issued_as_the_pods_and_plimsolld_expect() {
    let docs = overlay_documents();
    // plimsolld's client certificate: client auth only, at most a day.
    let client = one(&docs, "Certificate", "plimsolld-sandboxd-client");
    assert_eq!(client["metadata"]["namespace"], "plimsoll");
    assert_eq!(client["spec"]["secretName"], "plimsolld-sandboxd-client");
    let usages = strings(&client["spec"]["usages"]);
    assert!(usages.iter().any(|u| u == "client auth"), "{usages:?}");
    assert!(!usages.iter().any(|u| u == "server auth"), "{usages:?}");
    let day = 24 * 3_600 * 1_000_000_000i128;
    let duration = client["spec"]["duration"].as_str().unwrap();
    assert!(readback::parse_go_duration(duration).is_some_and(|d| d > 0 && d <= day));
    // Each issuer signs with a CA the overlay makes, in its own namespace: the client CA in
    // plimsolld's, the pods' CA in the sandboxes'; two CAs, not one.
    let ca_of = |issuer: &Value, namespace: &str| -> String {
        assert_eq!(issuer["kind"], "Issuer", "{issuer}");
        let name = issuer["name"].as_str().unwrap();
        let i = docs
            .iter()
            .find(|d| is_kind(d, "Issuer", name) && d["metadata"]["namespace"] == namespace)
            .unwrap_or_else(|| panic!("no Issuer {namespace}/{name}"));
        let secret = i["spec"]["ca"]["secretName"].as_str().unwrap();
        let ca = docs
            .iter()
            .find(|d| {
                d["kind"] == "Certificate"
                    && d["metadata"]["namespace"] == namespace
                    && d["spec"]["secretName"] == secret
            })
            .unwrap_or_else(|| panic!("no CA Certificate for {namespace}/{secret}"));
        assert_eq!(ca["spec"]["isCA"], true);
        format!("{namespace}/{secret}")
    };
    let client_ca = ca_of(&client["spec"]["issuerRef"], "plimsoll");
    let t = overlay_template(&docs);
    let tls = t["spec"]["podTemplate"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "sandboxd-tls")
        .unwrap();
    let attrs = &tls["csi"]["volumeAttributes"];
    let issuer = serde_json::json!({"kind": attrs["csi.cert-manager.io/issuer-kind"],
        "name": attrs["csi.cert-manager.io/issuer-name"]});
    let pods_ca = ca_of(&issuer, "plimsoll-sandboxes");
    assert_ne!(client_ca, pods_ca);
    // The pods' CA is the one ../cert-manager/ca-issuer.yaml bootstraps (same objects), so a
    // deployment that began with it keeps its CA and plimsolld's CA file.
    let bootstrap = documents();
    for d in docs.iter().filter(|d| {
        d["apiVersion"] == "cert-manager.io/v1"
            && d["metadata"]["namespace"] == "plimsoll-sandboxes"
    }) {
        let same = bootstrap.iter().find(|(f, b)| {
            f.starts_with("cert-manager")
                && b["kind"] == d["kind"]
                && b["metadata"] == d["metadata"]
        });
        assert_eq!(same.map(|(_, b)| b), Some(d), "{}", d["metadata"]);
    }
}

/// Lists that kustomize's fallback merges element by element, keyed by the first of these
/// that every element has (kyaml's `AssociativeSequenceKeys`).
const ASSOCIATIVE_KEYS: [&str; 7] = [
    "mountPath",
    "devicePath",
    "ip",
    "type",
    "topologyKey",
    "name",
    "containerPort",
];

fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_nulls).collect()),
        v => v.clone(),
    }
}

/// The other reading of a strategic-merge-style patch: objects merge, `null` removes, and a
/// list of objects that all carry one of [`ASSOCIATIVE_KEYS`] merges element by element
/// (new elements last); other lists are replaced.
fn merge_by_key(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else if let Some(tv) = t.get_mut(k) {
                    merge_by_key(tv, v);
                } else {
                    t.insert(k.clone(), without_nulls(v));
                }
            }
        }
        (Value::Array(t), Value::Array(p)) => {
            let key = ASSOCIATIVE_KEYS
                .into_iter()
                .find(|k| t.iter().chain(p).all(|e| e.get(k).is_some()));
            match key {
                Some(key) => {
                    for pe in p {
                        match t.iter_mut().find(|te| te[key] == pe[key]) {
                            Some(te) => merge_by_key(te, pe),
                            None => t.push(without_nulls(pe)),
                        }
                    }
                }
                None => *t = p.iter().map(without_nulls).collect(),
            }
        }
        (t, p) => *t = without_nulls(p),
    }
}

#[test]
fn the_template_patch_means_the_same_replacing_or_merging_lists() {
    let base = find(&documents(), "SandboxTemplate")[0].clone();
    let patch = read_yaml(&overlay_dir().join("sandboxtemplate-patch.yaml"));
    let mut replaced = base.clone();
    merge_patch(&mut replaced, &patch[0]);
    let mut merged = base.clone();
    merge_by_key(&mut merged, &patch[0]);
    assert_eq!(without_nulls(&replaced), without_nulls(&merged));
    // It repeats the base's container and volumes unchanged, but for what it is about: the
    // client CA variable and mount, and the certificate volume.
    let spec = |t: &Value, what: &str| t["spec"]["podTemplate"]["spec"][what].clone();
    let mut c = spec(&replaced, "containers")[0].clone();
    let c = c.as_object_mut().unwrap();
    assert!(base["spec"]["podTemplate"]["spec"]["containers"][0]
        .get("env")
        .is_none());
    c.remove("env").expect("the client CA variable");
    let mounts = c["volumeMounts"].as_array_mut().unwrap();
    assert_eq!(mounts.pop().unwrap()["name"], "sandboxd-client-ca");
    assert_eq!(
        Value::Object(c.clone()),
        spec(&base, "containers")[0],
        "the patch's container differs from sandboxtemplate.yaml's"
    );
    assert_eq!(spec(&replaced, "containers").as_array().unwrap().len(), 1);
    let unchanged = |t: &Value| -> Vec<Value> {
        spec(t, "volumes")
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["name"] != "sandboxd-tls" && v["name"] != "sandboxd-client-ca")
            .cloned()
            .collect()
    };
    assert_eq!(unchanged(&replaced), unchanged(&base));
}

#[test]
fn kubectl_kustomize_builds_the_overlay_as_these_tests_do() {
    let run = |args: &[&str]| {
        std::process::Command::new("kubectl")
            .arg("kustomize")
            .args(args)
            .arg(overlay_dir())
            .output()
    };
    let Ok(out) = run(&["--load-restrictor=LoadRestrictionsNone"]) else {
        eprintln!("kubectl is not installed: the overlay was not built with kustomize");
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap())
        .expect("kustomize's output is YAML");
    let key = |d: &Value| {
        format!(
            "{} {}/{}",
            d["kind"].as_str().unwrap(),
            d["metadata"]["namespace"].as_str().unwrap_or(""),
            d["metadata"]["name"].as_str().unwrap()
        )
    };
    let built: BTreeMap<String, Value> = built
        .into_iter()
        .filter(|d| !d.is_null())
        .map(|d| (key(&d), d))
        .collect();
    let ours: BTreeMap<String, Value> = overlay_documents()
        .into_iter()
        .map(|d| (key(&d), d))
        .collect();
    assert_eq!(
        built.keys().collect::<Vec<_>>(),
        ours.keys().collect::<Vec<_>>()
    );
    for (k, d) in &built {
        assert_eq!(d, &ours[k], "{k}");
    }
    // Without the flag kustomize refuses the base's files, as the overlay's comment says.
    let out = run(&[]).unwrap();
    assert!(!out.status.success());
}

#[tokio::test]
async fn plimsolld_starts_against_the_per_pod_overlay_served_by_the_fake_api() {
    let docs = overlay_documents();
    let mut o = FakeClusterOptions::per_pod(fake::sandboxd_binaries().unwrap());
    o.template = overlay_template(&docs).clone();
    o.warm_pool = one(&docs, "SandboxWarmPool", "plimsoll-pool").clone();
    o.policies = docs
        .iter()
        .filter(|d| d["kind"] == "NetworkPolicy")
        .cloned()
        .collect();
    let c = FakeCluster::start(o).await.unwrap();
    let cfg = c.provider_config();
    assert_eq!(cfg.pod_identity, plimsoll_tls::PodIdentity::Ip);
    assert!(cfg.client_cert.is_some());
    let p = AgentSandboxProvider::new(cfg).unwrap();
    p.start()
        .await
        .expect("the overlay's manifests pass startup in per-pod mode");
    assert_eq!(p.facts().tier, Some(Tier::Kernel));
    c.shutdown().await;
}
