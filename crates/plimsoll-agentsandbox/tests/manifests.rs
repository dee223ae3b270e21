//! The shipped `k8s/` manifests always pass plimsolld's own read-back, grant only the verbs
//! plimsolld uses, and never carry a real key. YAML is read with `serde-saphyr` (YAML 1.2,
//! maintained), the same parser kube uses for kubeconfig files.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use plimsoll_agentsandbox::readback::{self, SECRET_MODE};
use plimsoll_agentsandbox::AgentSandboxProvider;
use plimsoll_core::Tier;
use plimsoll_provider::Provider;
use plimsoll_testkit::fake_cluster::{self as fake, FakeCluster, FakeClusterOptions};
use serde_json::Value;

fn k8s_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../k8s")
}

/// Every document of every YAML file under k8s/ (recursively), with its file name.
fn documents() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut dirs = vec![k8s_dir()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "yaml") {
                let text = std::fs::read_to_string(&p).unwrap();
                let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
                    .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                let name = p.strip_prefix(k8s_dir()).unwrap().display().to_string();
                out.extend(
                    docs.into_iter()
                        .filter(|d| !d.is_null())
                        .map(|d| (name.clone(), d)),
                );
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
