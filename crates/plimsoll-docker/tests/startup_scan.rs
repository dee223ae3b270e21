//! plimsolld's startup ship scan (`PLIMSOLL_WITHHELD_SET`) against the real engine: a test
//! image is committed from the local sandbox image (`cargo xtask images` builds
//! `plimsoll/sandbox:latest`; nothing is pulled) with a withheld file, a binary carrying a
//! withheld value and an encrypted zip written into it, then plimsolld is started on it with
//! refuse-mode and audit-mode sets and with known lists for other and for this image ID.
//!
//! Without an engine or the image these tests skip with a message, unless
//! `PLIMSOLL_REQUIRE_DOCKER=1` (CI), when they fail.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::query_parameters::{
    CommitContainerOptions, ListContainersOptions, RemoveImageOptions, UploadToContainerOptions,
};
use bollard::Docker;
use plimsoll_core::pb;
use plimsoll_testkit::net::free_addr;
use plimsoll_withheld::{Entry, KnownImages, Mode, WithheldSet};

mod support;
use support::{engine, IMAGE as BASE, SOCKET};
/// Where the test files go inside the image (tar names carry no leading slash).
const DIR: &str = "opt/plimsoll-scan-test";
/// A value that must never ship, embedded in a larger binary file.
const CANARY: &[u8] = b"canary:startup-scan-7f3e91c2d4b8";

fn answers() -> Vec<u8> {
    b"answer key, round 3: 1-c 2-a 3-d 4-b 5-b\n".repeat(40)
}

/// 64 KiB of deterministic noise with [`CANARY`] in the middle.
fn tool_binary() -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut v: Vec<u8> = (0..65_536)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    v.splice(40_000..40_000, CANARY.iter().copied());
    v
}

/// A zip whose one stored member is marked encrypted (general purpose bit 0): the scan
/// recognises it and cannot read it (`format:zip-encrypted`).
fn encrypted_zip() -> Vec<u8> {
    let name = b"private/notes.txt";
    let data = b"\x8a\x11\x5c\x02ciphertext-that-is-not-readable-without-the-password\x00";
    let crc = 0x1234_5678u32;
    let mut out = Vec::new();
    let le16 = |v: &mut Vec<u8>, x: u16| v.extend_from_slice(&x.to_le_bytes());
    let le32 = |v: &mut Vec<u8>, x: u32| v.extend_from_slice(&x.to_le_bytes());
    le32(&mut out, 0x0403_4b50);
    for x in [20u16, 1, 0, 0, 0x21] {
        le16(&mut out, x);
    }
    for x in [crc, data.len() as u32, data.len() as u32] {
        le32(&mut out, x);
    }
    le16(&mut out, name.len() as u16);
    le16(&mut out, 0);
    out.extend_from_slice(name);
    out.extend_from_slice(data);
    let cd_offset = out.len() as u32;
    let mut cd = Vec::new();
    le32(&mut cd, 0x0201_4b50);
    for x in [20u16, 20, 1, 0, 0, 0x21] {
        le16(&mut cd, x);
    }
    for x in [crc, data.len() as u32, data.len() as u32] {
        le32(&mut cd, x);
    }
    le16(&mut cd, name.len() as u16);
    cd.extend_from_slice(&[0u8; 8]);
    le32(&mut cd, 0);
    le32(&mut cd, 0);
    cd.extend_from_slice(name);
    out.extend_from_slice(&cd);
    le32(&mut out, 0x0605_4b50);
    le32(&mut out, 0);
    le16(&mut out, 1);
    le16(&mut out, 1);
    le32(&mut out, cd.len() as u32);
    le32(&mut out, cd_offset);
    le16(&mut out, 0);
    out
}

/// A ustar archive of directories (`name/`) and regular files, as `PUT /archive` takes it.
fn tar_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in entries {
        let dir = name.ends_with('/');
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        let octal = |h: &mut [u8; 512], at: usize, width: usize, v: u64| {
            let s = format!("{v:0w$o}\0", w = width - 1);
            h[at..at + width].copy_from_slice(s.as_bytes());
        };
        octal(&mut h, 100, 8, if dir { 0o755 } else { 0o644 });
        octal(&mut h, 108, 8, 0);
        octal(&mut h, 116, 8, 0);
        octal(&mut h, 124, 12, if dir { 0 } else { data.len() as u64 });
        octal(&mut h, 136, 12, 1_700_000_000);
        h[156] = if dir { b'5' } else { b'0' };
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
        octal(&mut h, 148, 7, sum);
        h[155] = b' ';
        out.extend_from_slice(&h);
        if !dir {
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
    }
    out.resize(out.len() + 1024, 0);
    out
}

/// A test image committed from [`BASE`] with the test files in one new layer. Removed by
/// [`TestImage::remove`], or on drop if the test panicked first.
struct TestImage {
    tag: String,
    id: String,
    /// The new layer's diff ID (how a finding names its layer).
    layer: String,
    removed: bool,
}

impl TestImage {
    async fn build(d: &Docker) -> TestImage {
        let created = d
            .create_container(
                None::<bollard::query_parameters::CreateContainerOptions>,
                bollard::models::ContainerCreateBody {
                    image: Some(BASE.into()),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let (answers, tool, zip) = (answers(), tool_binary(), encrypted_zip());
        let tar = tar_of(&[
            ("opt/", b""),
            (&format!("{DIR}/"), b""),
            (&format!("{DIR}/answers.txt"), &answers),
            (&format!("{DIR}/tool.bin"), &tool),
            (&format!("{DIR}/locked.zip"), &zip),
        ]);
        d.upload_to_container(
            &created.id,
            Some(UploadToContainerOptions {
                path: "/".into(),
                ..Default::default()
            }),
            bollard::body_full(tar.into()),
        )
        .await
        .unwrap();
        let repo = format!("plimsoll-test/startup-scan-{}", std::process::id());
        let committed = d
            .commit_container(
                CommitContainerOptions {
                    container: Some(created.id.clone()),
                    repo: Some(repo.clone()),
                    tag: Some("t".into()),
                    ..Default::default()
                },
                bollard::models::ContainerConfig::default(),
            )
            .await
            .unwrap();
        plimsoll_docker::engine::remove(d, &created.id).await;
        let tag = format!("{repo}:t");
        let inspect = d.inspect_image(&tag).await.unwrap();
        let id = inspect.id.unwrap();
        assert_eq!(id, committed.id, "the committed image's ID");
        let layer = inspect.root_fs.unwrap().layers.unwrap().pop().unwrap();
        TestImage {
            tag,
            id,
            layer,
            removed: false,
        }
    }

    async fn remove(mut self, d: &Docker) {
        d.remove_image(
            &self.tag,
            Some(RemoveImageOptions {
                force: true,
                ..Default::default()
            }),
            None,
        )
        .await
        .unwrap();
        assert!(
            d.inspect_image(&self.id).await.is_err(),
            "image {} still on the engine",
            self.id
        );
        self.removed = true;
    }
}

impl Drop for TestImage {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        let tag = self.tag.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                if let Ok(d) = plimsoll_docker::provider::connect(Path::new(SOCKET)) {
                    let _ = d
                        .remove_image(
                            &tag,
                            Some(RemoveImageOptions {
                                force: true,
                                ..Default::default()
                            }),
                            None,
                        )
                        .await;
                }
            });
        })
        .join();
    }
}

fn set(mode: Mode) -> WithheldSet {
    let mut s = WithheldSet::empty();
    s.add(Entry::whole_file("answer-key", mode, &answers()[..]).unwrap())
        .unwrap();
    s.add(Entry::run("canary", mode, CANARY).unwrap()).unwrap();
    s
}

fn config(
    state: &Path,
    image: &str,
    addr: SocketAddr,
    set: &Path,
    known: Option<&Path>,
) -> plimsoll_daemon::Config {
    let addr = addr.to_string();
    let mut pairs = vec![
        ("PLIMSOLL_ADDR", addr.as_str()),
        ("PLIMSOLL_METRICS_ADDR", "off"),
        ("PLIMSOLL_INSECURE", "1"),
        ("PLIMSOLL_STATE_DIR", state.to_str().unwrap()),
        ("SANDBOX_PROVIDER", "docker"),
        ("SANDBOX_DOCKER_IMAGE", image),
        ("SANDBOX_DOCKER_RUNTIME", support::runtime().as_str()),
        ("PLIMSOLL_WITHHELD_SET", set.to_str().unwrap()),
    ];
    if let Some(k) = known {
        pairs.push(("PLIMSOLL_WITHHELD_KNOWN_FILE", k.to_str().unwrap()));
    }
    plimsoll_daemon::Config::from_env(&plimsoll_daemon::env::MapEnv::from_pairs(pairs)).unwrap()
}

/// Starts plimsolld and expects the startup scan to refuse: the error, after checking that
/// the RPC port never accepted a connection.
async fn refused(cfg: plimsoll_daemon::Config) -> String {
    let addr = cfg.addr;
    let Err(e) = plimsoll_daemon::start(cfg).await else {
        panic!("plimsolld started and served an image the scan must refuse")
    };
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_err(),
        "something accepts on {addr} after a refused start"
    );
    let m = e.to_string();
    assert!(
        matches!(e, plimsoll_daemon::StartError::Withheld(_)),
        "not a scan refusal: {m}"
    );
    assert!(m.starts_with("PLIMSOLL_WITHHELD_SET: "), "{m}");
    never_the_bytes(&m);
    eprintln!("refused as expected: {m}");
    m
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// How many containers the engine created from `image` (its ID or tag) since `since` (Unix
/// seconds), from the engine's event log.
async fn creates_of(d: &Docker, image: &[&str], since: i64) -> usize {
    use futures_util::StreamExt;
    let opts = bollard::query_parameters::EventsOptions {
        since: Some(since.to_string()),
        until: Some((unix_now() + 1).to_string()),
        filters: Some(std::collections::HashMap::from([
            ("type".to_owned(), vec!["container".to_owned()]),
            ("event".to_owned(), vec!["create".to_owned()]),
        ])),
    };
    let events: Vec<_> = d.events(Some(opts)).collect().await;
    events
        .into_iter()
        .map(|e| e.expect("the engine's event log"))
        .filter(|e| {
            e.actor
                .as_ref()
                .and_then(|a| a.attributes.as_ref())
                .and_then(|a| a.get("image"))
                .is_some_and(|i| image.contains(&i.as_str()))
        })
        .count()
}

/// Containers (running or not) of one image.
async fn containers_of(d: &Docker, image_id: &str) -> Vec<String> {
    let filters =
        std::collections::HashMap::from([("ancestor".to_owned(), vec![image_id.to_owned()])]);
    d.list_containers(Some(ListContainersOptions {
        all: true,
        filters: Some(filters),
        ..Default::default()
    }))
    .await
    .unwrap()
    .into_iter()
    .filter_map(|c| c.id)
    .collect()
}

/// Neither the withheld value nor any of the withheld file's text appears.
fn never_the_bytes(text: &str) {
    assert!(
        !text.contains(std::str::from_utf8(CANARY).unwrap()),
        "the withheld value leaked: {text}"
    );
    assert!(
        !text.contains("1-c 2-a"),
        "the withheld file leaked: {text}"
    );
}

/// Captures what the daemon logs while the returned guard lives (on this thread).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let w = self.clone();
        let sub = tracing_subscriber::fmt()
            .json()
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::set_default(sub)
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn the_startup_scan_refuses_withheld_and_unknown_unreadable_files_and_logs_audit_finds() {
    let Some(d) = engine().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let img = TestImage::build(&d).await;
    let answers_path = format!("{DIR}/answers.txt");
    let tool_path = format!("{DIR}/tool.bin");

    let refuse_set = dir.path().join("refuse.json");
    set(Mode::Refuse).save(&refuse_set).unwrap();
    let audit_set = dir.path().join("audit.json");
    set(Mode::Audit).save(&audit_set).unwrap();

    // 1. Refuse mode: startup stops before anything serves; the message names the image ID,
    //    each entry, the layer and the path, and the encrypted zip; never the bytes. The
    //    daemon is given the tag: what it scans is the ID the provider resolved.
    let since = unix_now();
    let m = refused(config(&state, &img.tag, free_addr(), &refuse_set, None)).await;
    // The scan comes before the provider's smoke test: no container of the refused image
    // was ever created, not even for a moment (the engine's event log says so).
    assert_eq!(creates_of(&d, &[&img.id, &img.tag], since).await, 0);
    for want in [
        img.id.as_str(),
        "answer-key",
        "canary",
        img.layer.as_str(),
        answers_path.as_str(),
        tool_path.as_str(),
        "locked.zip",
        "format:zip-encrypted",
        "plimsoll-withheld known-unreadable",
    ] {
        assert!(m.contains(want), "{want:?} missing from: {m}");
    }
    // The provider that started for the refused daemon left no container of the image.
    assert_eq!(containers_of(&d, &img.id).await, Vec::<String>::new());

    // 2. Audit mode, no known list: the encrypted zip alone still stops startup.
    let m = refused(config(&state, &img.id, free_addr(), &audit_set, None)).await;
    assert!(m.contains("unknown-unreadable"), "{m}");
    assert!(m.contains("locked.zip") && m.contains(&img.id), "{m}");
    assert!(
        !m.contains("answer-key"),
        "an audit find is not a refusal: {m}"
    );

    // The known list the operator writes after looking at the file (what
    // `plimsoll-withheld known-unreadable` writes): this image's unreadable files.
    let docker = plimsoll_withheld::connect_docker().await.unwrap();
    let report = plimsoll_withheld::scan_engine_image(
        &docker,
        &img.id,
        &set(Mode::Audit),
        &KnownImages::empty(),
        &plimsoll_withheld::Limits::default(),
    )
    .await
    .unwrap();
    assert_eq!(report.image_id, img.id);
    let items = report.known_items();
    assert_eq!(items.len(), 1, "{items:?}");
    assert!(items[0].path.contains("locked.zip"), "{items:?}");
    assert_eq!(items[0].reason, "format:zip-encrypted");

    // 3. The same list under another image's ID (the base image's) does not cover it.
    let base_id = d.inspect_image(BASE).await.unwrap().id.unwrap();
    assert_ne!(base_id, img.id);
    let other_known = dir.path().join("known-other.json");
    let mut k = KnownImages::empty();
    k.set_image(&base_id, items.clone());
    k.save(&other_known).unwrap();
    let m = refused(config(
        &state,
        &img.id,
        free_addr(),
        &audit_set,
        Some(&other_known),
    ))
    .await;
    assert!(m.contains("locked.zip"), "{m}");

    // 4. Listed for this image ID: the audit set passes, audit finds are logged (no bytes),
    //    and plimsolld serves.
    let known = dir.path().join("known-images.json");
    let mut k = KnownImages::empty();
    k.set_image(&img.id, items);
    k.save(&known).unwrap();
    let logs = Logs::default();
    let guard = logs.capture();
    let daemon = plimsoll_daemon::start(config(
        &state,
        &img.id,
        free_addr(),
        &audit_set,
        Some(&known),
    ))
    .await
    .unwrap_or_else(|e| panic!("the listed file should let plimsolld start: {e}"));
    drop(guard);
    let log = logs.text();
    never_the_bytes(&log);
    let audit_lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("audit mode") && l.contains("\"WARN\""))
        .collect();
    for want in ["answer-key", "canary"] {
        assert!(
            audit_lines
                .iter()
                .any(|l| l.contains(want) && l.contains(&img.id) && l.contains(&img.layer)),
            "no audit warning for {want}: {log}"
        );
    }
    assert!(log.contains("withheld scan passed"), "{log}");
    let mut client = pb::sandbox_service_client::SandboxServiceClient::connect(format!(
        "http://{}",
        daemon.rpc_addr()
    ))
    .await
    .unwrap();
    let desc = client
        .describe(pb::DescribeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(desc.sandbox, "docker");
    daemon.shutdown().await;
    assert_eq!(containers_of(&d, &img.id).await, Vec::<String>::new());

    // 5. The known list never excuses a refuse-mode find.
    let m = refused(config(
        &state,
        &img.id,
        free_addr(),
        &refuse_set,
        Some(&known),
    ))
    .await;
    assert!(m.contains("answer-key") && !m.contains("locked.zip"), "{m}");

    img.remove(&d).await;
}

#[tokio::test]
async fn a_clean_image_starts_with_a_set() {
    let Some(d) = engine().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let set_path = dir.path().join("refuse.json");
    set(Mode::Refuse).save(&set_path).unwrap();
    let base_id = d.inspect_image(BASE).await.unwrap().id.unwrap();
    let daemon = plimsoll_daemon::start(config(
        &dir.path().join("state"),
        BASE,
        free_addr(),
        &set_path,
        None,
    ))
    .await
    .unwrap_or_else(|e| panic!("{BASE} ({base_id}) should pass the scan: {e}"));
    daemon.shutdown().await;
}
