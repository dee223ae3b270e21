//! sandboxd's Landlock layer (`--landlock`): before anything runs, sandboxd restricts
//! itself, and so every program it starts, to the file system of a sandbox it expects to be
//! in (the bwrap provider's layout). A second layer under the mount namespace: where the
//! mounts already make a path read-only this changes nothing; where they leave it writable it
//! narrows what may be done there.
//!
//! | beneath | allowed |
//! |---|---|
//! | `/` | listing directories |
//! | `/usr`, `/etc`, `/bin`, `/sbin`, `/lib*`, sandboxd's own executable | reading and executing |
//! | `/proc`, `/run` | reading |
//! | the runs' root directory, `/tmp`, `/dev` | reading and writing, never executing |
//! | the directory of sandboxd's socket | reading, and creating a socket |
//!
//! So nothing written by a run can be executed (as Docker's `noexec` mounts), and nothing in
//! the run's channel directory can be replaced. The kernel applies what it supports (best
//! effort); [`Status`] says what held.

use std::path::Path;

use landlock::{
    path_beneath_rules, Access, AccessFs, BitFlags, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, ABI,
};

/// The newest Landlock ABI whose rights the rules use.
const ABI_USED: ABI = ABI::V5;

/// What the kernel enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Every right the rules handle.
    Full,
    /// Some of them (an older Landlock ABI).
    Partial,
    /// None: the kernel has no Landlock.
    None,
}

/// Restricts the calling thread and its future children (call it before any other thread
/// starts). `root_dir` is where runs write, `socket_dir` where sandboxd's socket is created.
pub fn restrict(root_dir: &Path, socket_dir: Option<&Path>) -> Result<Status, String> {
    let all = AccessFs::from_all(ABI_USED);
    let read_exec = AccessFs::from_read(ABI_USED);
    let read: BitFlags<AccessFs> = AccessFs::ReadFile | AccessFs::ReadDir;
    let write_no_exec = all & !BitFlags::from(AccessFs::Execute);
    let exe = std::env::current_exe().ok();
    let system: Vec<&Path> = [
        "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    ]
    .iter()
    .map(Path::new)
    .chain(exe.as_deref())
    .collect();
    let e = |e: landlock::RulesetError| format!("landlock: {e}");
    let mut ruleset = Ruleset::default()
        .handle_access(all)
        .map_err(e)?
        .create()
        .map_err(e)?
        .add_rules(path_beneath_rules(["/"], AccessFs::ReadDir))
        .map_err(e)?
        .add_rules(path_beneath_rules(system, read_exec))
        .map_err(e)?
        .add_rules(path_beneath_rules(["/proc", "/run"], read))
        .map_err(e)?
        .add_rules(path_beneath_rules(
            [root_dir, Path::new("/tmp"), Path::new("/dev")],
            write_no_exec,
        ))
        .map_err(e)?;
    if let Some(dir) = socket_dir {
        ruleset = ruleset
            .add_rules(path_beneath_rules([dir], read | AccessFs::MakeSock))
            .map_err(e)?;
    }
    let status = ruleset.restrict_self().map_err(e)?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Status::Full,
        RulesetStatus::PartiallyEnforced => Status::Partial,
        RulesetStatus::NotEnforced => Status::None,
    })
}
