//! Data that no magic number at offset 0 names (issue 10, findings 3 and 6): git objects and
//! packs made by `git`, zip archives after a header made by `python3 -m zipapp` and `zipfile`,
//! PNG and PDF flate streams; and the decoding limits on layer blobs, zip members with a data
//! descriptor, nested bombs and nested decoder windows.

mod support;

use std::path::Path;
use std::process::Command;

use plimsoll_withheld::walk::{scan_file_bytes, FileScan};
use plimsoll_withheld::{Entry, Limits, Mode, WithheldSet};
use support::*;

const CANARY: &[u8] = b"canary:7f3a9c1e-withheld-value-0042";

fn answers() -> Vec<u8> {
    b"question 1: b\nquestion 2: d\nquestion 3: a\n".repeat(40)
}

fn answers2() -> Vec<u8> {
    let mut a = answers();
    a.extend_from_slice(b"question 4: c -- added in the second version\n");
    a
}

fn set() -> WithheldSet {
    let mut s = WithheldSet::empty();
    s.add(Entry::whole_file("answer-key", Mode::Refuse, &answers()[..]).unwrap())
        .unwrap();
    s.add(Entry::whole_file("answer-key-2", Mode::Refuse, &answers2()[..]).unwrap())
        .unwrap();
    s.add(Entry::run("canary-1", Mode::Refuse, CANARY).unwrap())
        .unwrap();
    s
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn git(dir: &Path, args: &[&str]) -> String {
    run(Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(["-c", "commit.gpgsign=false", "-c", "gc.auto=0"])
        .args(args))
}

/// A layer tar holding every file under `dir`, named from `prefix`.
fn layer_of(dir: &Path, prefix: &str) -> Vec<u8> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                let rel = e.path().strip_prefix(dir).unwrap().display().to_string();
                files.push((format!("{prefix}{rel}"), std::fs::read(e.path()).unwrap()));
            }
        }
    }
    files.sort();
    let entries: Vec<T<'_>> = files.iter().map(|(n, b)| T::File(n, b.clone())).collect();
    tar_of(&entries)
}

fn found(scan: &FileScan, id: &str, path_has: &str) -> bool {
    scan.findings
        .iter()
        .any(|(p, e, _)| e == id && p.contains(path_has))
}

fn tool_with_canary() -> Vec<u8> {
    let mut bin = noise(200_000, 21);
    bin.splice(77_777..77_777, CANARY.iter().copied());
    bin
}

#[test]
fn a_withheld_file_in_a_git_repository_is_found_in_loose_objects_and_in_a_pack_with_deltas() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    git(repo, &["init", "-q"]);
    std::fs::write(repo.join("answers.txt"), answers()).unwrap();
    std::fs::write(repo.join("tool.bin"), tool_with_canary()).unwrap();
    git(repo, &["add", "."]);
    git(repo, &["commit", "-q", "-m", "one"]);
    // The working tree is not shipped: only .git is in the layer.
    std::fs::remove_file(repo.join("answers.txt")).unwrap();
    std::fs::remove_file(repo.join("tool.bin")).unwrap();
    let set = set();
    let lim = Limits::default();

    let layer = layer_of(&repo.join(".git"), "app/.git/");
    let scan = scan_file_bytes("layer", &layer, &set, &lim);
    assert!(
        found(&scan, "answer-key", "layer!app/.git/objects/"),
        "loose: {:?} {:?}",
        scan.findings,
        scan.unreadable
    );
    assert!(
        scan.findings
            .iter()
            .any(|(p, e, whole)| e == "answer-key" && *whole && p.contains("/objects/")),
        "a whole-file find: {:?}",
        scan.findings
    );
    assert!(found(&scan, "canary-1", "layer!app/.git/objects/"));
    assert!(scan.unreadable.is_empty(), "{:?}", scan.unreadable);

    // A second version, then a pack: one version becomes a delta against the other.
    git(repo, &["checkout", "-q", "--", "."]);
    std::fs::write(repo.join("answers.txt"), answers2()).unwrap();
    git(repo, &["commit", "-q", "-a", "-m", "two"]);
    git(repo, &["gc", "-q", "--aggressive", "--prune=now"]);
    let pack_dir = repo.join(".git/objects/pack");
    let idx = std::fs::read_dir(&pack_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "idx"))
        .expect("git gc wrote a pack");
    let verify = git(repo, &["verify-pack", "-v", idx.to_str().unwrap()]);
    let deltas = verify
        .lines()
        .filter(|l| l.contains(" blob ") && l.split_whitespace().count() == 7)
        .count();
    assert!(deltas >= 1, "the pack holds a delta blob:\n{verify}");
    let loose = std::fs::read_dir(repo.join(".git/objects"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().len() == 2)
        .count();
    assert_eq!(loose, 0, "gc packed every object");

    let layer = layer_of(&repo.join(".git"), "app/.git/");
    let scan = scan_file_bytes("layer", &layer, &set, &lim);
    for id in ["answer-key", "answer-key-2", "canary-1"] {
        assert!(
            found(&scan, id, ".pack!object@"),
            "{id} in the pack: {:?} {:?}",
            scan.findings,
            scan.unreadable
        );
    }
    assert!(scan.unreadable.is_empty(), "{:?}", scan.unreadable);

    // With no room to hold a base, the delta is unreadable, never passed.
    let tight = Limits {
        max_git_object: 16,
        ..Limits::default()
    };
    let scan = scan_file_bytes("layer", &layer, &set, &tight);
    assert!(
        scan.unreadable
            .iter()
            .any(|(p, r, _)| p.contains(".pack!object@") && r.starts_with("limit:git-")),
        "{:?}",
        scan.unreadable
    );
}

/// A real `python3 -m zipapp` archive (compressed, with a shebang) of `__main__.py` and the
/// withheld answers, written as `dir/out`.
fn zipapp(dir: &std::path::Path, main_py: &str, out: &str) -> std::path::PathBuf {
    let src = dir.join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("__main__.py"), main_py).unwrap();
    std::fs::write(src.join("answers.txt"), answers()).unwrap();
    let pyz = dir.join(out);
    run(Command::new("python3")
        .args(["-m", "zipapp"])
        .arg(&src)
        .arg("-o")
        .arg(&pyz)
        .args(["-p", "/usr/bin/env python3", "-c"]));
    pyz
}

#[test]
fn a_zip_after_a_header_is_opened_zipapp_and_self_extracting() {
    let dir = tempfile::tempdir().unwrap();
    let pyz = zipapp(dir.path(), "print('hello from the pyz')\n", "app.pyz");
    let out = run(Command::new("python3").arg(&pyz));
    assert_eq!(out.trim(), "hello from the pyz");
    let pyz_bytes = std::fs::read(&pyz).unwrap();
    assert!(pyz_bytes.starts_with(b"#!/usr/bin/env python3\n"));

    // A self-extracting layout: an executable, then a deflated zip (offsets unadjusted).
    let zip = dir.path().join("payload.zip");
    run(Command::new("python3").args([
        "-c",
        "import sys, zipfile\n\
         with zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED) as z:\n\
         \x20   z.writestr('keys/answers.txt', open(sys.argv[2], 'rb').read())\n",
        zip.to_str().unwrap(),
        dir.path().join("src/answers.txt").to_str().unwrap(),
    ]));
    let mut sfx = std::fs::read("/bin/true").unwrap();
    sfx.extend_from_slice(&std::fs::read(&zip).unwrap());
    let sfx_path = dir.path().join("setup.bin");
    std::fs::write(&sfx_path, &sfx).unwrap();
    let listed = run(Command::new("python3")
        .args(["-m", "zipfile", "-l"])
        .arg(&sfx_path));
    assert!(listed.contains("keys/answers.txt"), "{listed}");

    let layer = tar_of(&[
        T::File("opt/app.pyz", pyz_bytes),
        T::File("opt/setup.bin", sfx.clone()),
    ]);
    let set = set();
    let scan = scan_file_bytes("layer", &layer, &set, &Limits::default());
    assert!(
        scan.findings
            .iter()
            .any(|(p, e, w)| p == "layer!opt/app.pyz!answers.txt" && e == "answer-key" && *w),
        "{:?} {:?}",
        scan.findings,
        scan.unreadable
    );
    assert!(
        found(&scan, "answer-key", "layer!opt/setup.bin!keys/answers.txt"),
        "{:?} {:?}",
        scan.findings,
        scan.unreadable
    );
    assert!(scan.unreadable.is_empty(), "{:?}", scan.unreadable);

    // A zip whose first local header is not plausible: its end record is still where
    // extractors look, so the file is unreadable rather than passed.
    let mut odd = sfx;
    let at = odd.len() - std::fs::read(&zip).unwrap().len();
    odd[at + 4] = 200; // version needed to extract
    let scan = scan_file_bytes("setup.bin", &odd, &set, &Limits::default());
    assert!(
        scan.unreadable
            .iter()
            .any(|(p, r, _)| p == "setup.bin" && r == "format:zip-unreached"),
        "{:?}",
        scan.unreadable
    );
}

fn zlib(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut e, b).unwrap();
    e.finish().unwrap()
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let mut h = crc32fast::Hasher::new();
    h.update(kind);
    h.update(data);
    out.extend_from_slice(&h.finalize().to_be_bytes());
}

/// A grey 8-bit PNG whose pixels are `pixels` (rows of `width`), IDAT split in three chunks,
/// with a zTXt chunk holding `text`.
fn png(width: u32, pixels: &[u8], text: &[u8]) -> Vec<u8> {
    let rows = pixels.len() as u32 / width;
    let mut raw = Vec::new();
    for r in pixels.chunks(width as usize) {
        raw.push(0); // filter: none
        raw.extend_from_slice(r);
    }
    let idat = zlib(&raw);
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&rows.to_be_bytes());
    ihdr.extend_from_slice(&[8, 0, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    let mut ztxt = b"Comment\0\0".to_vec();
    ztxt.extend_from_slice(&zlib(text));
    chunk(&mut out, b"zTXt", &ztxt);
    let third = idat.len() / 3;
    chunk(&mut out, b"IDAT", &idat[..third]);
    chunk(&mut out, b"IDAT", &idat[third..2 * third]);
    chunk(&mut out, b"IDAT", &idat[2 * third..]);
    chunk(&mut out, b"IEND", b"");
    out
}

#[test]
fn png_and_pdf_flate_streams_are_decoded_and_other_pdf_filters_are_unreadable() {
    let set = set();
    let lim = Limits::default();
    let width = 1000u32;
    // Compressible pixels, so the canary is not kept verbatim in a stored deflate block.
    let mut pixels: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8 / 8).collect();
    pixels[123_456..123_456 + CANARY.len()].copy_from_slice(CANARY);
    let img = png(width, &pixels, &answers());
    assert!(
        !img.windows(CANARY.len()).any(|w| w == CANARY),
        "the canary is not in the PNG's bytes as they are"
    );
    // The canary sits inside one row (rows are 1000 bytes, it starts at 456 of row 123).
    let scan = scan_file_bytes("img.png", &img, &set, &lim);
    assert!(
        found(&scan, "canary-1", "img.png"),
        "{:?} {:?}",
        scan.findings,
        scan.unreadable
    );
    assert!(found(&scan, "answer-key", "img.png"), "{:?}", scan.findings);
    assert!(scan.unreadable.is_empty(), "{:?}", scan.unreadable);
    // A PNG cut short is unreadable with its reason.
    let scan = scan_file_bytes("cut.png", &img[..img.len() / 2], &set, &lim);
    assert!(
        scan.unreadable
            .iter()
            .any(|(p, r, _)| p == "cut.png" && r.starts_with("format:png")),
        "{:?}",
        scan.unreadable
    );
    // A clean noise PNG gives no find and no unreadable (no false alarm).
    let scan = scan_file_bytes("n.png", &png(500, &noise(100_000, 5), b"x"), &set, &lim);
    assert!(
        scan.findings.is_empty() && scan.unreadable.is_empty(),
        "{scan:?}"
    );

    // PDF: a FlateDecode content stream.
    let mut content = b"BT /F1 12 Tf 72 712 Td (".to_vec();
    content.extend_from_slice(CANARY);
    content.extend_from_slice(b") Tj ET\n");
    content.extend_from_slice(&b"0 0 m 100 100 l S\n".repeat(50));
    let z = zlib(&content);
    assert!(!z.windows(CANARY.len()).any(|w| w == CANARY));
    let mut pdf =
        b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n"
            .to_vec();
    pdf.extend_from_slice(
        format!(
            "4 0 obj\n<< /Length {} /Filter /FlateDecode >>\nstream\n",
            z.len()
        )
        .as_bytes(),
    );
    pdf.extend_from_slice(&z);
    pdf.extend_from_slice(b"\nendstream\nendobj\ntrailer\n<< /Root 1 0 R >>\n%%EOF\n");
    let scan = scan_file_bytes("doc.pdf", &pdf, &set, &lim);
    assert!(
        found(&scan, "canary-1", "doc.pdf"),
        "{:?} {:?}",
        scan.findings,
        scan.unreadable
    );
    assert!(scan.unreadable.is_empty(), "{:?}", scan.unreadable);
    // A filter the scan does not decode makes the PDF unreadable, never passed.
    let mut a85 = pdf.clone();
    let at = pdf.windows(12).position(|w| w == b"/FlateDecode").unwrap();
    a85.splice(
        at..at + 12,
        b"[/ASCII85Decode /FlateDecode]".iter().copied(),
    );
    let scan = scan_file_bytes("a85.pdf", &a85, &set, &lim);
    assert!(
        scan.unreadable
            .iter()
            .any(|(p, r, _)| p == "a85.pdf" && r == "format:pdf-filter"),
        "{:?}",
        scan.unreadable
    );
}

#[test]
fn random_and_text_files_raise_no_false_alarms() {
    // Zlib and zip candidates turn up in random bytes; none may become a find or a report.
    let set = set();
    let lim = Limits::default();
    for seed in 0..8 {
        let scan = scan_file_bytes("r.bin", &noise(4 << 20, 100 + seed), &set, &lim);
        assert!(
            scan.unreadable.is_empty(),
            "seed {seed}: {:?}",
            scan.unreadable
        );
        assert!(scan.findings.is_empty());
    }
    let text = b"x^2 + PK\x03\x04 is not a zip; xx\x9c is not zlib\n".repeat(10_000);
    let scan = scan_file_bytes("t.txt", &text, &set, &lim);
    assert!(scan.unreadable.is_empty(), "{:?}", scan.unreadable);
}

fn zeros_zip_member(n: usize, descriptor: bool) -> Vec<u8> {
    let zeros = vec![0u8; n];
    zip_of(&[Z {
        descriptor,
        ..Z::deflated("zeros", &zeros)
    }])
}

#[test]
fn ratio_and_size_limits_hold_for_layer_blobs_and_zip_members_with_a_data_descriptor() {
    let set = set();
    let lim = Limits {
        ratio_floor: 1 << 20,
        max_ratio: 100,
        ..Limits::default()
    };
    // A zip member with a data descriptor (no sizes in its local header).
    let z = zeros_zip_member(8 << 20, true);
    let scan = scan_file_bytes("d.zip", &z, &set, &lim);
    assert!(
        scan.unreadable
            .iter()
            .any(|(p, r, _)| p == "d.zip!zeros" && r == "limit:ratio"),
        "{:?}",
        scan.unreadable
    );

    // A layer blob (an export member) that is a bomb: 64 MiB of zeros in a zstd tar.
    let zeros = vec![0u8; 64 << 20];
    let layer = zstd(&tar_of(&[T::File("zeros.bin", zeros)]));
    let (archive, _) = docker_save("x:1", &[layer], "layer-bomb");
    let r = &plimsoll_withheld::scan_archive_bytes(
        &archive,
        &set,
        &plimsoll_withheld::KnownImages::empty(),
        &Limits::default(),
    )
    .unwrap()[0];
    assert!(
        r.unreadable.iter().any(|u| u.reason == "limit:ratio"),
        "{:?}",
        r.unreadable
    );
    // The layer size limit holds for layer blobs too.
    let small = Limits {
        max_layer_decoded: 1 << 20,
        ..Limits::default()
    };
    let r = &plimsoll_withheld::scan_archive_bytes(
        &archive,
        &set,
        &plimsoll_withheld::KnownImages::empty(),
        &small,
    )
    .unwrap()[0];
    assert!(
        r.unreadable.iter().any(|u| u.reason == "limit:layer-size"),
        "{:?}",
        r.unreadable
    );
}

#[test]
fn a_zip_member_stopped_by_a_limit_is_skipped_not_decoded_on() {
    let set = set();
    let lim = Limits {
        ratio_floor: 1 << 20,
        max_ratio: 100,
        ..Limits::default()
    };
    // 32 MiB of zeros, deflated, its compressed tail broken: decoding on past the limit would
    // reach the break and report the member corrupt (or its CRC wrong).
    let mut z = zeros_zip_member(32 << 20, false);
    let data_end = z.windows(4).position(|w| w == b"PK\x01\x02").unwrap();
    for b in &mut z[data_end - 64..data_end - 8] {
        *b ^= 0x5a;
    }
    let scan = scan_file_bytes("z.zip", &z, &set, &lim);
    assert_eq!(
        scan.unreadable,
        vec![("z.zip!zeros".to_owned(), "limit:ratio".to_owned(), 32 << 20)],
    );
    // With a data descriptor the member's end is only known by decoding it: the zip stops.
    let z = zeros_zip_member(32 << 20, true);
    let scan = scan_file_bytes("d.zip", &z, &set, &lim);
    let reasons: Vec<_> = scan
        .unreadable
        .iter()
        .map(|(p, r, _)| (p.as_str(), r.as_str()))
        .collect();
    assert_eq!(
        reasons,
        vec![
            ("d.zip!zeros", "limit:ratio"),
            ("d.zip", "limit:zip-member")
        ]
    );
}

#[test]
fn a_compressed_export_that_is_a_bomb_stops_at_the_ratio_limit() {
    let set = set();
    let layer = tar_of(&[T::File("app/answers.txt", answers())]);
    let (mut archive, _) = docker_save("x:1", &[layer], "export-bomb");
    // 64 MiB of zeros after the export's end: readers stop at the end of the tar, but the
    // stream goes on, and draining it would take as long as it decodes.
    archive.resize(archive.len() + (64 << 20), 0);
    let lim = Limits {
        ratio_floor: 1 << 20,
        max_ratio: 100,
        ..Limits::default()
    };
    let err = plimsoll_withheld::scan_archive_bytes(
        &zstd(&archive),
        &set,
        &plimsoll_withheld::KnownImages::empty(),
        &lim,
    )
    .unwrap_err();
    assert!(err.to_string().contains("limit:ratio"), "{err}");
}

#[test]
fn a_nested_zip_bomb_stops_at_the_ratio_of_all_decoders_after_few_files() {
    // 42.zip style: each level holds 16 copies of the level below, every level alone far
    // below the ratio limit; five levels decode to 16^4 x 4 MiB = 256 GiB.
    let mut level = zeros_zip_member(4 << 20, false);
    for _ in 0..4 {
        let names: Vec<String> = (0..16).map(|i| format!("l{i}.zip")).collect();
        let members: Vec<Z<'_>> = names.iter().map(|n| Z::deflated(n, &level)).collect();
        level = zip_of(&members);
    }
    assert!(level.len() < 1 << 20, "{}", level.len());
    let set = set();
    let scan = scan_file_bytes("42.zip", &level, &set, &Limits::default());
    assert!(
        scan.unreadable.iter().any(|(_, r, _)| r == "limit:ratio"),
        "{:?}",
        scan.unreadable
    );
    // Stopped after a few hundred files, not the 65,536 leaves (an operation count, not time).
    assert!(scan.files < 2_000, "{} files read", scan.files);
}

/// zstd with a 16 MiB window declared in the frame header (streamed, no content size).
fn zstd_big_window(b: &[u8]) -> Vec<u8> {
    let mut e = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    e.set_parameter(zstd::zstd_safe::CParameter::WindowLog(24))
        .unwrap();
    e.include_contentsize(false).unwrap();
    std::io::Write::write_all(&mut e, b).unwrap();
    e.finish().unwrap()
}

#[test]
fn nested_decoder_windows_share_one_memory_budget() {
    let set = set();
    let mut inner = answers();
    for _ in 0..4 {
        inner = zstd_big_window(&inner);
    }
    assert_eq!(&inner[..4], &[0x28, 0xb5, 0x2f, 0xfd]);
    // Four nested 16 MiB windows are more than the 40 MiB decoder memory.
    let scan = scan_file_bytes("deep.zst", &inner, &set, &Limits::default());
    assert!(
        scan.unreadable
            .iter()
            .any(|(p, r, _)| p == "deep.zst" && r == "limit:decoder-memory"),
        "{:?}",
        scan.unreadable
    );
    // With room for all four, the file inside is found.
    let roomy = Limits {
        max_decoder_memory: 80 << 20,
        ..Limits::default()
    };
    let scan = scan_file_bytes("deep.zst", &inner, &set, &roomy);
    assert!(
        found(&scan, "answer-key", "deep.zst"),
        "{:?}",
        scan.unreadable
    );
    assert!(scan.unreadable.is_empty(), "{:?}", scan.unreadable);
}

#[test]
fn mutated_git_packs_zipapps_and_pngs_give_reasons_never_a_panic() {
    // Real artifacts, then deterministic byte flips and cuts: every outcome is a find, a
    // `format:`/`limit:` reason or nothing, never a panic or an untagged internal error.
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("r");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("a.txt"), answers()).unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "one"]);
    std::fs::write(repo.join("a.txt"), answers2()).unwrap();
    git(&repo, &["commit", "-q", "-a", "-m", "two"]);
    git(&repo, &["gc", "-q", "--aggressive", "--prune=now"]);
    let pack = std::fs::read_dir(repo.join(".git/objects/pack"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "pack"))
        .unwrap();
    let pyz = zipapp(dir.path(), "print(1)\n", "a.pyz");
    let mut pixels: Vec<u8> = (0..20_000u32).map(|i| (i % 13) as u8).collect();
    pixels[5_000..5_000 + CANARY.len()].copy_from_slice(CANARY);
    let loose = zlib(&[&b"blob 1720\0"[..], &answers()].concat());
    let inputs = [
        std::fs::read(&pack).unwrap(),
        std::fs::read(&pyz).unwrap(),
        png(200, &pixels, &answers()),
        loose,
    ];
    let set = set();
    let lim = Limits {
        max_member_decoded: 16 << 20,
        max_total_decoded: 64 << 20,
        ..Limits::default()
    };
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for input in &inputs {
        for round in 0..300 {
            let mut m = input.clone();
            let flips = 1 + next() % 4;
            for _ in 0..flips {
                let at = (next() % m.len() as u64) as usize;
                m[at] ^= (next() % 255 + 1) as u8;
            }
            if round % 5 == 0 {
                let keep = (next() % m.len() as u64) as usize;
                m.truncate(keep.max(1));
            }
            let scan = scan_file_bytes("m", &m, &set, &lim);
            for (p, r, _) in &scan.unreadable {
                assert!(p.starts_with('m'), "{p}");
                assert!(
                    (r.starts_with("format:") || r.starts_with("limit:"))
                        && !r.starts_with("format:internal"),
                    "{r}"
                );
            }
        }
    }
}
