//! Scans through the real Docker Engine: images built in the test from scratch (layer tars
//! written here, `docker load`ed under unique tags, removed at the end), compared with the same
//! scans of the saved archive and of an OCI layout, without the engine.

mod support;

use plimsoll_testkit::docker::engine_answers;
use plimsoll_withheld::{
    connect_docker, scan_archive, scan_engine_image, Entry, KnownImages, Limits, Mode, ScanError,
    Verdict, WithheldSet,
};
use support::*;

const CANARY: &[u8] = b"canary:engine-test-value-9d41c0aa";

fn answers() -> Vec<u8> {
    b"the answers: 1-b 2-d 3-a 4-c\n".repeat(64)
}

fn set(mode: Mode) -> WithheldSet {
    let mut s = WithheldSet::empty();
    s.add(Entry::whole_file("answer-key", mode, &answers()[..]).unwrap())
        .unwrap();
    s.add(Entry::run("canary", mode, CANARY).unwrap()).unwrap();
    s
}

fn layers() -> Vec<Vec<u8>> {
    let mut bin = noise(1 << 20, 42);
    bin.splice(777_777..777_777, CANARY.iter().copied());
    let zip = zip_of(&[Z::deflated("inner/answers.txt", &answers())]);
    let l1 = tar_of(&[
        T::Dir("app/"),
        T::File("app/answers.txt", answers()),
        T::File("app/tool", bin),
        T::File("app/pkg.tar.gz", gzip(&tar_of(&[T::File("lib.zip", zip)]))),
        T::File("app/locked.7z", seven_zip()),
        T::File("app/big.gz", gzip(&vec![0u8; 3 << 20])),
    ]);
    let l2 = tar_of(&[T::Dir("app/"), T::File("app/.wh.answers.txt", Vec::new())]);
    vec![l1, l2]
}

type Summary = (Vec<(String, String, String)>, Vec<(String, String, u64)>);

fn summary(r: &plimsoll_withheld::ScanReport) -> Summary {
    let mut f: Vec<_> = r
        .findings
        .iter()
        .map(|f| (f.path.clone(), f.entry_id.clone(), f.kind.to_owned()))
        .collect();
    let mut u: Vec<_> = r
        .unreadable
        .iter()
        .map(|u| (u.path.clone(), u.reason.clone(), u.size))
        .collect();
    f.sort();
    u.sort();
    (f, u)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_scan_finds_what_the_archive_and_oci_scans_find() {
    if !engine_answers() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let layers = layers();
    let (img, archive) = LoadedImage::load(dir.path(), "engine-scan", &layers);
    let docker = connect_docker().await.unwrap();
    let set = set(Mode::Refuse);
    let limits = Limits {
        max_member_decoded: 1 << 20,
        ..Limits::default()
    };
    let r = scan_engine_image(&docker, &img.tag, &set, &KnownImages::empty(), &limits)
        .await
        .unwrap();
    assert_eq!(r.image_id, img.id);
    assert_eq!(r.verdict(), Verdict::Refuse);
    let diff1 = format!("sha256:{}", sha256_hex(&layers[0]));
    assert_eq!(r.layers[0], diff1);
    let (finds, unread) = summary(&r);
    for want in [
        ("app/answers.txt", "answer-key", "file"),
        ("app/tool", "canary", "run"),
        (
            "app/pkg.tar.gz!lib.zip!inner/answers.txt",
            "answer-key",
            "file",
        ),
    ] {
        assert!(
            finds
                .iter()
                .any(|(p, e, k)| (p.as_str(), e.as_str(), k.as_str()) == want),
            "{want:?} not in {finds:?}"
        );
    }
    assert!(
        r.findings.iter().all(|f| f.layer == diff1),
        "{:?}",
        r.findings
    );
    assert!(
        unread.contains(&(
            "app/locked.7z".into(),
            "format:7z".into(),
            seven_zip().len() as u64
        )),
        "{unread:?}"
    );
    assert!(
        unread
            .iter()
            .any(|(p, r, _)| p == "app/big.gz" && r == "limit:member-size"),
        "{unread:?}"
    );

    // The same scan of the saved archive and of an OCI layout, without the engine.
    let from_file = &scan_archive(&archive, &set, &KnownImages::empty(), &limits).unwrap()[0];
    assert_eq!(from_file.image_id, r.image_id);
    assert_eq!(summary(from_file), summary(&r), "{:?}", from_file.findings);
    let oci = dir.path().join("oci");
    let digest = oci_layout(&oci, &layers, &img.tag);
    let from_oci = &scan_archive(&oci, &set, &KnownImages::empty(), &limits).unwrap()[0];
    assert_eq!(digest, r.image_id);
    // gzip keeps incompressible data in stored blocks, so the run also appears verbatim in
    // the compressed blob itself: reported there too (path "", the blob), and nowhere else.
    let (mut oci_finds, oci_unread) = summary(from_oci);
    oci_finds.retain(|(p, e, _)| !(p.is_empty() && e == "canary"));
    assert_eq!((oci_finds, oci_unread), summary(&r));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_lists_bind_the_image_id_and_a_rebuild_needs_a_new_list() {
    if !engine_answers() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let l = tar_of(&[
        T::File("data/locked.7z", seven_zip()),
        T::File("data/ok", b"ok".to_vec()),
    ]);
    let (img, _) = LoadedImage::load(dir.path(), "known-a", std::slice::from_ref(&l));
    let docker = connect_docker().await.unwrap();
    let set = set(Mode::Audit);
    let limits = Limits::default();
    let r = scan_engine_image(&docker, &img.id, &set, &KnownImages::empty(), &limits)
        .await
        .unwrap();
    assert_eq!(
        r.verdict(),
        Verdict::UnknownUnreadable,
        "audit-only sets fail on unknown unreadable files"
    );
    let mut known = KnownImages::empty();
    known.set_image(&r.image_id, r.known_items());
    let r2 = scan_engine_image(&docker, &img.id, &set, &known, &limits)
        .await
        .unwrap();
    assert_eq!(r2.verdict(), Verdict::Clean);
    assert!(r2.unreadable.iter().all(|u| u.known));

    // Rebuilt (another config), same files: another ID, the list does not carry over.
    let (img2, _) = LoadedImage::load(dir.path(), "known-b", &[l]);
    assert_ne!(img2.id, img.id);
    let r3 = scan_engine_image(&docker, &img2.id, &set, &known, &limits)
        .await
        .unwrap();
    assert_eq!(r3.verdict(), Verdict::UnknownUnreadable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_is_an_engine_error() {
    if !engine_answers() {
        return;
    }
    let docker = connect_docker().await.unwrap();
    let err = scan_engine_image(
        &docker,
        &format!("plimsoll-withheld-test/{}:absent", unique("missing")),
        &WithheldSet::empty(),
        &KnownImages::empty(),
        &Limits::default(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ScanError::Engine(_)), "{err}");
}
