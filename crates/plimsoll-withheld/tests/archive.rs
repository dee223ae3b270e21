//! Scans without an engine: `docker save` archives and OCI layouts built in the test, nested
//! formats, unreadable files, limits, and malformed input.

mod support;

use plimsoll_withheld::walk::scan_file_bytes;
use plimsoll_withheld::{
    render_json, render_sarif, render_text, scan_archive, scan_archive_bytes, Entry, KnownImages,
    Limits, Mode, ScanError, Verdict, WithheldSet,
};
use support::*;

const CANARY: &[u8] = b"canary:7f3a9c1e-withheld-value-0042";

fn answers() -> Vec<u8> {
    b"question 1: b\nquestion 2: d\nquestion 3: a\n".repeat(40)
}

fn set_with(mode_file: Mode, mode_run: Mode) -> WithheldSet {
    let mut s = WithheldSet::empty();
    s.add(Entry::whole_file("answer-key", mode_file, &answers()[..]).unwrap())
        .unwrap();
    s.add(Entry::run("canary-1", mode_run, CANARY).unwrap())
        .unwrap();
    s
}

fn refuse_set() -> WithheldSet {
    set_with(Mode::Refuse, Mode::Refuse)
}

/// Layer 1 ships the answer key; layer 2 deletes it with a whiteout.
fn deleted_layers() -> Vec<Vec<u8>> {
    let l1 = tar_of(&[
        T::Dir("app/"),
        T::File("app/answers.txt", answers()),
        T::File("app/readme.txt", b"hello".to_vec()),
    ]);
    let l2 = tar_of(&[T::Dir("app/"), T::File("app/.wh.answers.txt", Vec::new())]);
    vec![l1, l2]
}

#[test]
fn a_file_deleted_by_an_upper_layer_is_found_in_an_archive_and_an_oci_layout() {
    let dir = tempfile::tempdir().unwrap();
    let layers = deleted_layers();
    let (archive, id) = docker_save("x:1", &layers, "deleted");
    let path = dir.path().join("image.tar");
    std::fs::write(&path, &archive).unwrap();
    let set = refuse_set();
    let reports = scan_archive(&path, &set, &KnownImages::empty(), &Limits::default()).unwrap();
    assert_eq!(reports.len(), 1);
    let r = &reports[0];
    assert_eq!(r.image_id, id);
    assert_eq!(r.verdict(), Verdict::Refuse);
    let diff1 = format!("sha256:{}", sha256_hex(&layers[0]));
    assert!(
        r.findings.iter().any(|f| f.layer == diff1
            && f.path == "app/answers.txt"
            && f.entry_id == "answer-key"
            && f.kind == "file"),
        "{:?}",
        r.findings
    );
    assert_eq!(r.layers.len(), 2);

    let oci = dir.path().join("oci");
    let config_digest = oci_layout(&oci, &layers, "deleted");
    let reports = scan_archive(&oci, &set, &KnownImages::empty(), &Limits::default()).unwrap();
    assert_eq!(reports[0].image_id, config_digest);
    assert_eq!(config_digest, id, "same config, same ID");
    let gz1 = format!("sha256:{}", sha256_hex(&gzip(&layers[0])));
    assert!(
        reports[0]
            .findings
            .iter()
            .any(|f| f.layer == gz1 && f.path == "app/answers.txt"),
        "{:?}",
        reports[0].findings
    );
    assert!(
        reports[0].unreadable.is_empty(),
        "{:?}",
        reports[0].unreadable
    );
}

#[test]
fn a_file_inside_a_zip_inside_a_tar_gz_is_found() {
    let zip = zip_of(&[
        Z::deflated("keys/answers.txt", &answers()),
        Z::stored("keys/readme", b"nothing here"),
    ]);
    let inner = tar_of(&[T::File("pkg/lib.zip", zip)]);
    let layer = tar_of(&[T::File("dist/bundle.tar.gz", gzip(&inner))]);
    let (archive, _) = docker_save("x:1", &[layer], "nested");
    let set = refuse_set();
    let r =
        &scan_archive_bytes(&archive, &set, &KnownImages::empty(), &Limits::default()).unwrap()[0];
    assert!(
        r.findings.iter().any(
            |f| f.path == "dist/bundle.tar.gz!pkg/lib.zip!keys/answers.txt"
                && f.entry_id == "answer-key"
        ),
        "{:?}",
        r.findings
    );
    assert!(r.unreadable.is_empty(), "{:?}", r.unreadable);
}

#[test]
fn a_value_embedded_in_a_larger_binary_is_found_in_every_wrapping() {
    let mut bin = noise(3 << 20, 5);
    bin.splice(1_234_567..1_234_567, CANARY.iter().copied());
    let set = refuse_set();
    let lim = Limits::default();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("bin/tool", bin.clone(), "bin/tool"),
        ("bin/tool.zst", zstd(&bin), "bin/tool.zst"),
        ("bin/tool.bz2", bzip2(&bin), "bin/tool.bz2"),
        ("bin/tool.xz", xz(&bin), "bin/tool.xz"),
        (
            "lib/app.jar",
            zip_of(&[Z::stored("a.txt", b"x"), Z::stored("tool", &bin)]),
            "lib/app.jar!tool",
        ),
        (
            "lib/app2.jar",
            zip_of(&[Z {
                descriptor: true,
                ..Z::deflated("tool", &bin)
            }]),
            "lib/app2.jar!tool",
        ),
    ];
    for (name, bytes, want) in cases {
        let layer = tar_of(&[T::File(name, bytes)]);
        let scan = scan_file_bytes("layer", &layer, &set, &lim);
        assert!(
            scan.findings
                .iter()
                .any(|(p, id, whole)| p == &format!("layer!{want}") && id == "canary-1" && !whole),
            "{name}: {:?} {:?}",
            scan.findings,
            scan.unreadable
        );
        assert!(scan.unreadable.is_empty(), "{name}: {:?}", scan.unreadable);
    }
    // A near miss is not a find.
    let mut near = bin.clone();
    let at = 1_234_567 + 5;
    near[at] ^= 0x20;
    let scan = scan_file_bytes("x", &near, &set, &lim);
    assert!(scan.findings.is_empty(), "{:?}", scan.findings);
}

#[test]
fn an_encrypted_zip_and_a_7z_are_unreadable_and_fail_an_audit_only_set() {
    let enc = zip_of(&[
        Z::stored("open.txt", b"fine"),
        Z {
            encrypted: true,
            ..Z::stored("secret.txt", b"ciphertext-ish bytes")
        },
    ]);
    let layer = tar_of(&[
        T::File("data/a.zip", enc),
        T::File("data/b.7z", seven_zip()),
    ]);
    let (archive, _) = docker_save("x:1", &[layer], "unreadable");
    let set = set_with(Mode::Audit, Mode::Audit);
    assert!(set.audit_only());
    let r =
        &scan_archive_bytes(&archive, &set, &KnownImages::empty(), &Limits::default()).unwrap()[0];
    let got: Vec<_> = r
        .unreadable
        .iter()
        .map(|u| (u.path.as_str(), u.reason.as_str(), u.size))
        .collect();
    assert!(
        got.contains(&("data/a.zip!secret.txt", "format:zip-encrypted", 20)),
        "{got:?}"
    );
    assert!(
        got.contains(&("data/b.7z", "format:7z", seven_zip().len() as u64)),
        "{got:?}"
    );
    assert_eq!(r.verdict(), Verdict::UnknownUnreadable);
    assert!(r.verdict().refuses());

    // Listed for this image: the scan passes; a rebuilt image (another ID) does not.
    let mut known = KnownImages::empty();
    known.set_image(&r.image_id, r.known_items());
    let again = &scan_archive_bytes(&archive, &set, &known, &Limits::default()).unwrap()[0];
    assert_eq!(again.verdict(), Verdict::Clean);
    let layer2 = tar_of(&[
        T::File(
            "data/a.zip",
            zip_of(&[Z {
                encrypted: true,
                ..Z::stored("secret.txt", b"ciphertext-ish bytes")
            }]),
        ),
        T::File("data/b.7z", seven_zip()),
    ]);
    let (rebuilt, id2) = docker_save("x:2", &[layer2], "unreadable-rebuilt");
    assert_ne!(id2, r.image_id);
    let r2 = &scan_archive_bytes(&rebuilt, &set, &known, &Limits::default()).unwrap()[0];
    assert_eq!(r2.verdict(), Verdict::UnknownUnreadable);
}

#[test]
fn limits_make_files_unreadable_with_a_limit_reason() {
    let set = refuse_set();
    let big = vec![0u8; 4 << 20];
    let mut lim = Limits {
        max_member_decoded: 1 << 20,
        ..Limits::default()
    };
    let scan = scan_file_bytes("big.gz", &gzip(&big), &set, &lim);
    assert!(
        scan.unreadable
            .iter()
            .any(|(p, r, s)| p == "big.gz" && r == "limit:member-size" && *s > 0),
        "{:?}",
        scan.unreadable
    );
    lim = Limits {
        ratio_floor: 1 << 20,
        max_ratio: 50,
        ..Limits::default()
    };
    let scan = scan_file_bytes("zeros.gz", &gzip(&big), &set, &lim);
    assert!(
        scan.unreadable.iter().any(|(_, r, _)| r == "limit:ratio"),
        "{:?}",
        scan.unreadable
    );
    lim = Limits {
        max_depth: 2,
        ..Limits::default()
    };
    let deep = gzip(&gzip(&gzip(&answers())));
    let scan = scan_file_bytes("deep.gz", &deep, &set, &lim);
    assert!(
        scan.unreadable.iter().any(|(_, r, _)| r == "limit:depth"),
        "{:?}",
        scan.unreadable
    );
    // Within the default depth the same file is opened all the way.
    let scan = scan_file_bytes("deep.gz", &deep, &set, &Limits::default());
    assert!(scan.findings.iter().any(|(_, id, _)| id == "answer-key"));
}

#[test]
fn a_decompression_bomb_stops_at_the_ratio_limit() {
    let set = refuse_set();
    // 64 MiB of zeros in a few hundred bytes of bzip2.
    let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::best());
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..64 {
        std::io::Write::write_all(&mut e, &chunk).unwrap();
    }
    let bomb = e.finish().unwrap();
    assert!(bomb.len() < 4096, "{}", bomb.len());
    let layer = tar_of(&[
        T::File("bomb.bz2", bomb.clone()),
        T::File("after.txt", answers()),
    ]);
    let scan = scan_file_bytes("layer", &layer, &set, &Limits::default());
    assert!(
        scan.unreadable.iter().any(|(p, r, s)| p == "layer!bomb.bz2"
            && r == "limit:ratio"
            && *s == bomb.len() as u64),
        "{:?}",
        scan.unreadable
    );
    // The file after the bomb is still read.
    assert!(scan.findings.iter().any(|(p, _, _)| p == "layer!after.txt"));
}

#[test]
fn malformed_input_gives_clear_errors_or_reasons() {
    let set = refuse_set();
    let lim = Limits::default();
    let known = KnownImages::empty();

    // A truncated export is not an image.
    let (archive, _) = docker_save("x:1", &deleted_layers(), "trunc");
    let err = scan_archive_bytes(&archive[..archive.len() / 2], &set, &known, &lim).unwrap_err();
    assert!(matches!(err, ScanError::BadImage(_)), "{err}");
    assert!(
        err.to_string().contains("truncated") || err.to_string().contains("manifest"),
        "{err}"
    );
    // Garbage is not an image.
    let err = scan_archive_bytes(&noise(10_000, 3), &set, &known, &lim).unwrap_err();
    assert!(matches!(err, ScanError::BadImage(_)), "{err}");

    // Inside a layer: a truncated tar.gz, a tar with an absurd size field.
    let inner = tar_of(&[T::File("x.bin", noise(100_000, 9))]);
    let gz = gzip(&inner);
    let mut absurd = tar_of(&[T::File("y.bin", b"abc".to_vec())]);
    absurd[124..136].copy_from_slice(b"77777777777\0");
    let sum: u32 = absurd[..512]
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u32::from(b)
            }
        })
        .sum();
    absurd[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let layer = tar_of(&[
        T::File("cut.tar.gz", gz[..gz.len() / 2].to_vec()),
        T::File("absurd.tar", absurd),
        T::File("ok.txt", answers()),
    ]);
    let scan = scan_file_bytes("layer", &layer, &set, &lim);
    let reasons: Vec<_> = scan
        .unreadable
        .iter()
        .map(|(p, r, _)| (p.as_str(), r.as_str()))
        .collect();
    assert!(
        reasons.iter().any(|(p, r)| *p == "layer!cut.tar.gz"
            && (*r == "format:gzip-corrupt" || *r == "format:tar-truncated")),
        "{reasons:?}"
    );
    assert!(
        reasons.contains(&("layer!absurd.tar", "format:tar-truncated")),
        "{reasons:?}"
    );
    assert!(scan.findings.iter().any(|(p, _, _)| p == "layer!ok.txt"));

    // Traversal names and symlink loops are only labels: found, nothing written, no error.
    let target = std::env::temp_dir().join(unique("plimsoll-withheld-traversal"));
    let evil = format!("../../../../../..{}", target.display());
    let layer = tar_of(&[
        T::Symlink("loop/a", "b"),
        T::Symlink("loop/b", "a"),
        T::Symlink("loop/self", "../loop/self"),
        T::File(&evil, answers()),
    ]);
    let (archive, _) = docker_save("x:1", &[layer], "evil");
    let r = &scan_archive_bytes(&archive, &set, &known, &lim).unwrap()[0];
    assert!(
        r.findings
            .iter()
            .any(|f| f.path.ends_with(&target.display().to_string())),
        "{:?}",
        r.findings
    );
    assert!(r.unreadable.is_empty(), "{:?}", r.unreadable);
    assert!(!target.exists());
}

#[test]
fn a_compressed_docker_save_is_read_and_reports_never_hold_the_value() {
    let mut bin = noise(100_000, 11);
    bin.splice(500..500, CANARY.iter().copied());
    let layer = tar_of(&[T::File("bin/tool", bin), T::File("data/b.7z", seven_zip())]);
    let (archive, id) = docker_save("x:1", &[layer], "gz-save");
    let set = set_with(Mode::Refuse, Mode::Audit);
    let reports = scan_archive_bytes(
        &gzip(&archive),
        &set,
        &KnownImages::empty(),
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(reports[0].image_id, id);
    assert!(reports[0]
        .findings
        .iter()
        .any(|f| f.entry_id == "canary-1" && f.mode == Mode::Audit));
    let text = render_text(&reports);
    let json = render_json(&reports).to_string();
    let sarif = render_sarif(&reports);
    let needle = String::from_utf8_lossy(CANARY).into_owned();
    for out in [&text, &json, &sarif.to_string()] {
        assert!(!out.contains(&needle), "the value leaked: {out}");
    }
    assert!(
        text.contains("canary-1") && text.contains("bin/tool"),
        "{text}"
    );
    assert_eq!(sarif["version"], "2.1.0");
    let results = sarif["runs"][0]["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{sarif}");
    assert!(results
        .iter()
        .any(|r| r["level"] == "warning" && r["ruleId"] == "withheld/canary-1"));
    assert!(results
        .iter()
        .any(|r| r["level"] == "error" && r["ruleId"] == "unreadable"));
}

/// Matching on the scan's own thread (a saved archive file) finds exactly what matching
/// inline (the same archive in memory) finds, attributed to the same paths in the same order:
/// many small members ending while the matcher still lags, values across the matcher's
/// 64 KiB staging boundaries, halves of a value in two adjacent members (a tar header lies
/// between them: not a find), nested compressed streams and a zip, in plain and gzip layers.
#[test]
fn threaded_matching_finds_what_inline_matching_finds() {
    let mut small = Vec::new();
    for i in 0..400u64 {
        let mut d = noise(600 + (i as usize * 37) % 900, 100 + i);
        if i % 7 == 0 {
            let at = (i as usize * 13) % (d.len() - CANARY.len());
            d[at..at + CANARY.len()].copy_from_slice(CANARY);
        }
        small.push((format!("s/{i:04}.bin"), d));
    }
    // Halves of a value in two adjacent members: neither holds it whole.
    let mut left = noise(1536 - 20, 7);
    left.extend_from_slice(&CANARY[..20]);
    let mut right = CANARY[20..].to_vec();
    right.extend(noise(300, 8));
    // One large file with the value around every 64 KiB boundary of the first 1 MiB.
    let mut big = noise(3 << 20, 9);
    for k in 1..16usize {
        let at = k * 65_536 - 7 - k;
        big[at..at + CANARY.len()].copy_from_slice(CANARY);
    }
    let mut nested = noise(200_000, 10);
    nested[150_000..150_000 + CANARY.len()].copy_from_slice(CANARY);
    let inner_tar = tar_of(&[T::File("deep/x.bin", nested.clone())]);
    let mut entries: Vec<T<'_>> = small
        .iter()
        .map(|(n, d)| T::File(n.as_str(), d.clone()))
        .collect();
    entries.push(T::File("split/a", left));
    entries.push(T::File("split/b", right));
    entries.push(T::File("big/blob", big));
    entries.push(T::File("nested/x.tar.gz", gzip(&inner_tar)));
    entries.push(T::File("nested/x.zst", zstd(&nested)));
    entries.push(T::File(
        "lib/app.jar",
        zip_of(&[Z::stored("a", &nested), Z::deflated("b", &nested)]),
    ));
    entries.push(T::File("answers.txt", answers()));
    let layer1 = tar_of(&entries);
    let layer2 = tar_of(&[T::File("again/blob", noise(70_000, 12))]);
    let set = refuse_set();
    let lim = Limits::default();
    let dir = tempfile::tempdir().unwrap();
    // As saved (plain layers), then as a registry serves them (gzip layers: every member of
    // a layer lives in the layer's own decoded stream).
    for (how, layers) in [
        ("plain layers", vec![layer1.clone(), layer2.clone()]),
        ("gzip layers", vec![gzip(&layer1), gzip(&layer2)]),
    ] {
        let (archive, _) = docker_save("x:1", &layers, "threaded");
        let path = dir.path().join("image.tar");
        std::fs::write(&path, &archive).unwrap();
        let oci = dir.path().join(format!("oci-{}", how.len()));
        oci_layout(&oci, &layers, "threaded");
        let off = Limits {
            match_thread: false,
            ..Limits::default()
        };
        let no = KnownImages::empty();
        let threaded = scan_archive(&path, &set, &no, &lim).unwrap();
        let inline = scan_archive_bytes(&archive, &set, &no, &lim).unwrap();
        let file_inline = scan_archive(&path, &set, &no, &off).unwrap();
        let oci_threaded = scan_archive(&oci, &set, &no, &lim).unwrap();
        let oci_inline = scan_archive(&oci, &set, &no, &off).unwrap();
        let finds = |r: &[plimsoll_withheld::ScanReport]| -> Vec<String> {
            r[0].findings
                .iter()
                .map(|f| format!("{} {} {}", f.layer, f.path, f.entry_id))
                .collect()
        };
        assert_eq!(finds(&file_inline), finds(&inline), "{how}: file inline");
        let (ot, oi) = (finds(&oci_threaded), finds(&oci_inline));
        assert_eq!(
            ot, oi,
            "{how}: OCI layout, threaded and inline findings differ"
        );
        assert!(oi.len() >= 65, "{how}: OCI layout findings: {oi:#?}");
        let (t, i) = (finds(&threaded), finds(&inline));
        // 58 small files, the big blob, the file inside the .tar.gz, the .tar.gz and the .zst
        // themselves (noise is stored, not compressed, so the value shows in their raw bytes
        // too), 2 zip members and the answer key; with gzip layers the layer blob itself as
        // well (its stored blocks show the values of the files inside).
        let want = if how == "plain layers" { 65 } else { 66 };
        assert_eq!(i.len(), want, "{how}: inline findings: {i:#?}");
        assert_eq!(t, i, "{how}: threaded and inline findings differ");
        assert!(
            i.iter().any(|f| f.contains(" big/blob canary-1"))
                && !i.iter().any(|f| f.contains("split/")),
            "{how}: {i:#?}"
        );
        assert_eq!(
            format!("{:?}", threaded[0].unreadable),
            format!("{:?}", inline[0].unreadable),
            "{how}"
        );
    }
}

/// A run of one repeated byte that ends a member, where the next tar header goes on with the
/// same byte: the matcher merges overlapping confirmed runs, so a member must be claimed at
/// the point of the stream where it ended, not later. Threaded and inline agree, for the
/// saved archive file and for an OCI layout.
#[test]
fn a_member_ending_in_a_repeated_run_keeps_its_finding_when_threaded() {
    let a16 = [b'A'; 16];
    let mut set = WithheldSet::empty();
    set.add(Entry::run("sixteen-a", Mode::Refuse, &a16[..]).unwrap())
        .unwrap();
    let names: Vec<String> = (0..6).map(|i| format!("{}{i}", "A".repeat(40))).collect();
    let mut entries = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let mut d = noise(512 * (i + 2) - 16, 40 + i as u64);
        d.extend_from_slice(&a16);
        entries.push(T::File(n.as_str(), d));
    }
    let layer = tar_of(&entries);
    let (archive, _) = docker_save("x:1", std::slice::from_ref(&layer), "runs");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("image.tar");
    std::fs::write(&path, &archive).unwrap();
    let oci = dir.path().join("oci");
    oci_layout(&oci, &[layer], "runs");
    let off = Limits {
        match_thread: false,
        ..Limits::default()
    };
    let no = KnownImages::empty();
    let finds = |r: Vec<plimsoll_withheld::ScanReport>| -> Vec<String> {
        r[0].findings
            .iter()
            .map(|f| format!("{} {}", f.path, f.entry_id))
            .collect()
    };
    let lim = Limits::default();
    let inline = finds(scan_archive(&path, &set, &no, &off).unwrap());
    assert!(
        names[..5]
            .iter()
            .all(|n| inline.contains(&format!("{n} sixteen-a"))),
        "inline: {inline:#?}"
    );
    assert_eq!(finds(scan_archive(&path, &set, &no, &lim).unwrap()), inline);
    assert_eq!(
        finds(scan_archive(&oci, &set, &no, &lim).unwrap()),
        finds(scan_archive(&oci, &set, &no, &off).unwrap()),
        "OCI layout"
    );
}
