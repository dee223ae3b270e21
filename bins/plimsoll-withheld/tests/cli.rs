//! The CLI as release scripts call it: exit codes 0/1/2/3, the single-dash flags, the three
//! output formats, `known-unreadable` and `add`, against the real engine (images built here)
//! and against saved archives.

#[path = "../../../crates/plimsoll-withheld/tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::{Command, Output};

use plimsoll_testkit::docker::engine_answers;
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_plimsoll-withheld");
const VALUE: &[u8] = b"canary:cli-test-value-5e11b0c4d2";

fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env("TMPDIR", dir.join("tmp"))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

/// `<cmd> -set withheld.json -known <known> <image>` in `dir`.
fn run_known(dir: &Path, cmd: &str, known: &str, image: &str) -> Output {
    run(dir, &[cmd, "-set", "withheld.json", "-known", known, image])
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn text(o: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A work dir with `withheld.json` (built with `add`, single-dash flags) holding a refuse or
/// audit run entry for VALUE and a whole-file entry.
fn workdir(mode: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("tmp")).unwrap();
    std::fs::write(dir.path().join("value.txt"), [VALUE, b"\n"].concat()).unwrap();
    std::fs::write(dir.path().join("answers.txt"), b"1-a 2-b 3-c\n".repeat(30)).unwrap();
    let o = run(
        dir.path(),
        &[
            "add",
            "-set",
            "withheld.json",
            "-id",
            "canary",
            "-mode",
            mode,
            "-value-file",
            "value.txt",
        ],
    );
    assert_eq!(code(&o), 0, "{}", text(&o));
    let o = run(
        dir.path(),
        &[
            "add",
            "--set",
            "withheld.json",
            "--id",
            "answers",
            "--mode",
            mode,
            "--file",
            "answers.txt",
        ],
    );
    assert_eq!(code(&o), 0, "{}", text(&o));
    let set = std::fs::read_to_string(dir.path().join("withheld.json")).unwrap();
    assert!(
        !set.contains(std::str::from_utf8(VALUE).unwrap()),
        "the set must not hold the value"
    );
    dir
}

fn layer_with(files: &[T<'_>]) -> Vec<u8> {
    tar_of(files)
}

#[test]
fn add_refuses_bad_input_with_exit_2() {
    let dir = workdir("refuse");
    let o = run(
        dir.path(),
        &[
            "add",
            "-set",
            "withheld.json",
            "-id",
            "canary",
            "-mode",
            "audit",
            "-file",
            "answers.txt",
        ],
    );
    assert_eq!(code(&o), 2, "a repeated id: {}", text(&o));
    std::fs::write(dir.path().join("short.txt"), b"short\n").unwrap();
    let o = run(
        dir.path(),
        &[
            "add",
            "-set",
            "withheld.json",
            "-id",
            "s",
            "-mode",
            "audit",
            "-value-file",
            "short.txt",
        ],
    );
    assert_eq!(code(&o), 2, "{}", text(&o));
    assert!(text(&o).contains("16"), "{}", text(&o));
}

#[test]
fn usage_and_bad_files_exit_2_unreadable_images_exit_3() {
    let dir = workdir("refuse");
    let p = dir.path();
    let o = run(p, &["scan-image", "img"]);
    assert_eq!(code(&o), 2, "no -set: {}", text(&o));
    std::fs::write(p.join("bad.json"), b"{not json").unwrap();
    let o = run(p, &["scan-image", "-set", "bad.json", "img"]);
    assert_eq!(code(&o), 2, "{}", text(&o));
    assert!(text(&o).contains("bad.json"), "{}", text(&o));
    let o = run_known(p, "scan-image", "bad.json", "img");
    assert_eq!(code(&o), 2, "{}", text(&o));
    let o = run(
        p,
        &[
            "scan-image",
            "-set",
            "withheld.json",
            "-format",
            "yaml",
            "img",
        ],
    );
    assert_eq!(code(&o), 2, "{}", text(&o));
    std::fs::write(p.join("garbage.tar"), noise(5000, 1)).unwrap();
    let o = run(p, &["scan-image", "-set", "withheld.json", "garbage.tar"]);
    assert_eq!(code(&o), 3, "{}", text(&o));
    let o = run(p, &["--help"]);
    assert_eq!(code(&o), 0);
    assert!(text(&o).contains("Exit codes"), "{}", text(&o));
    let o = run(p, &["--version"]);
    assert_eq!(code(&o), 0);
}

#[test]
fn archive_scan_exit_codes_formats_and_nothing_written() {
    let dir = workdir("refuse");
    let p = dir.path();
    let mut bin = noise(200_000, 3);
    bin.splice(1000..1000, VALUE.iter().copied());
    let evil = "../../../../../../tmp/plimsoll-withheld-cli-evil";
    let layer = layer_with(&[T::File("bin/tool", bin), T::File(evil, b"x".to_vec())]);
    let (archive, id) = docker_save("x:1", &[layer], "cli-archive");
    std::fs::write(p.join("image.tar"), &archive).unwrap();
    let mut before: Vec<_> = std::fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    before.sort();

    let o = run(p, &["scan-image", "-set", "withheld.json", "image.tar"]);
    assert_eq!(code(&o), 1, "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        out.contains(&id) && out.contains("refuse canary") && out.contains("bin/tool"),
        "{out}"
    );
    assert!(!text(&o).contains(std::str::from_utf8(VALUE).unwrap()));

    let o = run(
        p,
        &[
            "scan-image",
            "-set",
            "withheld.json",
            "-format",
            "json",
            "docker-archive:image.tar",
        ],
    );
    assert_eq!(code(&o), 1, "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["images"][0]["image_id"], id.as_str());
    assert_eq!(v["images"][0]["verdict"], "refuse");
    assert_eq!(v["images"][0]["findings"][0]["entry_id"], "canary");

    let o = run(
        p,
        &[
            "scan-image",
            "--set=withheld.json",
            "--format=sarif",
            "image.tar",
        ],
    );
    assert_eq!(code(&o), 1, "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["version"], "2.1.0");
    assert_eq!(v["runs"][0]["results"][0]["level"], "error");

    // Nothing was written: not in the working directory, not in TMPDIR, not at the traversal.
    let mut after: Vec<_> = std::fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    after.sort();
    assert_eq!(before, after);
    assert_eq!(std::fs::read_dir(p.join("tmp")).unwrap().count(), 0);
    assert!(!Path::new("/tmp/plimsoll-withheld-cli-evil").exists());
}

#[test]
fn audit_only_unknown_unreadable_exits_1_until_listed_and_a_rebuild_needs_a_new_list() {
    let dir = workdir("audit");
    let p = dir.path();
    let layer = layer_with(&[
        T::File("data/locked.7z", seven_zip()),
        T::File("data/x", VALUE.to_vec()),
    ]);
    let (archive, id) = docker_save("x:1", std::slice::from_ref(&layer), "cli-known");
    std::fs::write(p.join("a.tar"), &archive).unwrap();
    let o = run(p, &["scan-image", "-set", "withheld.json", "a.tar"]);
    assert_eq!(code(&o), 1, "{}", text(&o));
    assert!(text(&o).contains("format:7z"), "{}", text(&o));
    let o = run_known(p, "known-unreadable", "known-images.json", "a.tar");
    assert_eq!(code(&o), 0, "{}", text(&o));
    let k = std::fs::read_to_string(p.join("known-images.json")).unwrap();
    assert!(k.contains(&id) && k.contains("data/locked.7z"), "{k}");
    let o = run_known(p, "scan-image", "known-images.json", "a.tar");
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("audit canary"),
        "{}",
        text(&o)
    );

    let (rebuilt, id2) = docker_save("x:2", &[layer], "cli-known-rebuilt");
    assert_ne!(id, id2);
    std::fs::write(p.join("b.tar"), &rebuilt).unwrap();
    let o = run_known(p, "scan-image", "known-images.json", "b.tar");
    assert_eq!(code(&o), 1, "{}", text(&o));
}

#[test]
fn engine_images_refuse_list_and_rebuild() {
    if !engine_answers() {
        return;
    }
    // Refuse: a value in a file a later layer deletes.
    let dir = workdir("refuse");
    let p = dir.path();
    let l1 = layer_with(&[T::Dir("app/"), T::File("app/secret.txt", VALUE.to_vec())]);
    let l2 = layer_with(&[T::Dir("app/"), T::File("app/.wh.secret.txt", Vec::new())]);
    let (img, _) = LoadedImage::load(p, "cli-refuse", &[l1.clone(), l2]);
    let o = run(p, &["scan-image", "-set", "withheld.json", &img.tag]);
    assert_eq!(code(&o), 1, "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(out.contains(&img.id), "{out}");
    assert!(
        out.contains(&format!("sha256:{}", sha256_hex(&l1))) && out.contains("app/secret.txt"),
        "{out}"
    );

    // Audit-only set with an unreadable file: 1, then listed: 0, then rebuilt: 1.
    let dir = workdir("audit");
    let p = dir.path();
    let layer = layer_with(&[T::File("data/locked.7z", seven_zip())]);
    let (a, _) = LoadedImage::load(p, "cli-audit-a", std::slice::from_ref(&layer));
    let o = run(
        p,
        &[
            "scan-image",
            "-set",
            "withheld.json",
            &format!("docker:{}", a.tag),
        ],
    );
    assert_eq!(code(&o), 1, "{}", text(&o));
    // `<cmd> -set withheld.json -known known-images.json <image>` exits with `want`.
    let with_known = |cmd: &str, image: &str, want: i32| {
        let args = [
            cmd,
            "-set",
            "withheld.json",
            "-known",
            "known-images.json",
            image,
        ];
        let o = run(p, &args);
        assert_eq!(code(&o), want, "{cmd} {image}: {}", text(&o));
    };
    with_known("known-unreadable", &a.tag, 0);
    with_known("scan-image", &a.tag, 0);
    let (b, _) = LoadedImage::load(p, "cli-audit-b", &[layer]);
    with_known("scan-image", &b.tag, 1);

    // An image the engine does not hold: 3.
    let o = run(
        p,
        &[
            "scan-image",
            "-set",
            "withheld.json",
            &format!("docker:{}", unique("plimsoll-absent")),
        ],
    );
    assert_eq!(code(&o), 3, "{}", text(&o));
}
