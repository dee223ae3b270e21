//! Shared by the bwrap provider's tests: a started provider with a state directory the
//! sandboxes' host user can reach, and payload helpers.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use plimsoll_bwrap::{BwrapConfig, BwrapProvider};
use plimsoll_core::pb;
use plimsoll_provider::{Answer, Provider, Shared, Work};

/// `bwrap` on PATH, or `None` after printing SKIPPED (a failure under `.ci/run`, which
/// installs bubblewrap and sets PLIMSOLL_REQUIRE_BWRAP).
pub fn bwrap() -> Option<PathBuf> {
    if !plimsoll_testkit::bwrap::installed() {
        return None;
    }
    plimsoll_bwrap::host::on_path("bwrap").or_else(|| Some(PathBuf::from("/usr/bin/bwrap")))
}

/// A folder the sandboxes' host user can reach, and the state directory in it.
pub fn state_dir() -> (tempfile::TempDir, PathBuf) {
    let d = plimsoll_testkit::bwrap::folder();
    let s = d.path().join("state");
    (d, s)
}

/// sandboxd, copied where the sandboxes' host user can reach it.
pub fn sandboxd(dir: &Path) -> PathBuf {
    plimsoll_testkit::bwrap::sandboxd_in(dir)
}

/// The provider's configuration for tests: sandboxd copied beside the state directory.
pub fn config(state: &Path) -> BwrapConfig {
    let shared = Shared {
        state_dir: state.to_owned(),
        ..Shared::default()
    };
    let mut c = BwrapConfig::new(&shared);
    c.sandboxd = Some(sandboxd(
        state.parent().expect("the state directory's folder"),
    ));
    c
}

/// A provider that passed its startup checks.
pub async fn started(c: BwrapConfig) -> BwrapProvider {
    let p = BwrapProvider::new(c).unwrap();
    if let Err(e) = p.start().await {
        panic!("bwrap provider did not start: {e}");
    }
    p
}

pub fn js(code: &str) -> Work {
    Work::Javascript(pb::JavaScriptRun {
        code: code.into(),
        ..Default::default()
    })
}

pub fn project(steps: &[&str]) -> Work {
    Work::Project(pb::ProjectRun {
        files: vec![],
        steps: steps.iter().map(|s| (*s).to_owned()).collect(),
        artifacts: vec![],
        grant_profile: String::new(),
    })
}

pub fn as_project(a: Answer) -> pb::ProjectResult {
    match a {
        Answer::Project(p) => p,
        other => panic!("expected a project result, got {other:?}"),
    }
}

pub fn as_js(a: Answer) -> pb::JavaScriptResult {
    match a {
        Answer::Javascript(j) => j,
        other => panic!("expected a snippet result, got {other:?}"),
    }
}

pub fn stdout(p: &pb::ProjectResult, i: usize) -> String {
    String::from_utf8_lossy(&p.steps[i].stdout)
        .trim()
        .to_owned()
}

pub const T: Duration = Duration::from_secs(30);
