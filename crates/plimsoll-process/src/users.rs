//! Host users for the process provider's runs when plimsolld is root: each run or session
//! holds a user of its own from `SANDBOX_PROCESS_USER`'s range, claimed across processes
//! ([`plimsoll_provider::users`], shared with the bwrap provider), so the process limit
//! (`RLIMIT_NPROC`, counted per real user) counts one run and the end of one run (every
//! process of its user killed) never reaches another's.

use std::path::Path;

pub use plimsoll_provider::users::{parse, Slot, Users, USER_RANGE};
use plimsoll_runner::RunAs;

/// Whether plimsolld runs as root.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The runner's view of a held user.
pub fn run_as(slot: &Slot) -> RunAs {
    let (uid, gid) = slot.ids();
    RunAs { uid, gid }
}

/// Makes `state_dir` and the provider's folders below it searchable by the runs' users
/// (`o+x`, never read), and checks every directory above it: `Err` names the ones they
/// cannot search.
pub fn open_the_way(state_dir: &Path, own: &[&Path]) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    for dir in std::iter::once(state_dir).chain(own.iter().copied()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let m = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mode = m.permissions().mode() & 0o7777;
        if mode & 0o001 == 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o001))
                .map_err(|e| format!("cannot allow search (o+x) on {}: {e}", dir.display()))?;
        }
    }
    let canonical =
        std::fs::canonicalize(state_dir).map_err(|e| format!("{}: {e}", state_dir.display()))?;
    let blocked: Vec<String> = canonical
        .ancestors()
        .skip(1)
        .filter_map(|d| {
            let mode = std::fs::metadata(d).ok()?.permissions().mode();
            (mode & 0o001 == 0).then(|| format!("{} ({:04o})", d.display(), mode & 0o7777))
        })
        .collect();
    if blocked.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the runs' users cannot reach the state directory {}: no search permission for others on {}; allow it (chmod o+x) or set PLIMSOLL_STATE_DIR elsewhere",
        state_dir.display(),
        blocked.join(", ")
    ))
}

/// Tasks (processes and threads) whose real user is `uid`: what `RLIMIT_NPROC` counts.
pub fn tasks_of(uid: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut n = 0u64;
    for e in entries.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        };
        if field("Uid:") == Some(u64::from(uid)) {
            n += field("Threads:").unwrap_or(1);
        }
    }
    n
}
