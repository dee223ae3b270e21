//! A descriptor a supervisor, wrapper or CI pipe leaves open when it starts a plimsoll
//! program (`sh -c 'exec plimsolld' 7<>secret`): a 0600 file at fd [`FD`], the run step
//! that lists the run's descriptors and tries to read and write that one, and the checks
//! that the run saw nothing and the file is unchanged.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The descriptor number the supervisor leaves open.
pub const FD: i32 = 7;

/// A project step (shell) that lists its shell's descriptors, then reads and writes
/// [`FD`]; it always ends with `probe-end`.
/// It starts with [`plimsoll_provider::smoke::DESCRIPTOR_LISTING`] (checked below), which
/// also lists under gVisor.
pub const PROBE: &str = "{ ls -l /proc/$$/fd || sh -c 'for f in /proc/$1/fd/*; do echo \"fd ${f##*/} -> $(readlink \"$f\")\"; done' sh $$; }; echo probe-read; cat <&7; echo probe-wrote-this >&7; echo probe-end";

/// The supervisor's file's name.
const SECRET_NAME: &str = "supervisor-secret";

/// A 0600 file only its owner can read, holding a line no run may print.
#[derive(Debug)]
pub struct Secret {
    /// Where it is.
    pub path: PathBuf,
    content: String,
}

impl Secret {
    /// Writes the file in `dir` with mode 0600.
    pub fn new(dir: &Path) -> Secret {
        let path = dir.join(SECRET_NAME);
        let content = format!("supervisor-secret-{}\n", std::process::id());
        std::fs::write(&path, &content).expect("write the secret");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .expect("chmod 0600");
        Secret { path, content }
    }

    /// The arguments that start a program with the file open read-write at [`FD`], without
    /// close-on-exec, as `sh -c 'exec "$0" "$@"' 7<>file` does: append the program and its
    /// arguments (a prefix for `Plimsolld::spawn_as`).
    pub fn prefix(&self) -> Vec<String> {
        vec![
            "sh".to_owned(),
            "-c".to_owned(),
            format!(
                "exec \"$0\" \"$@\" {FD}<>'{}'",
                self.path.display().to_string().replace('\'', "'\\''")
            ),
        ]
    }

    /// `bin` started with the file open at [`FD`]; add its arguments.
    pub fn command(&self, bin: impl AsRef<std::ffi::OsStr>) -> Command {
        let prefix = self.prefix();
        let mut c = Command::new(&prefix[0]);
        c.args(&prefix[1..]).arg(bin);
        c
    }

    /// Panics unless the file still holds exactly what was written.
    pub fn assert_unchanged(&self) {
        let now = std::fs::read_to_string(&self.path).expect("read the secret");
        assert_eq!(
            now, self.content,
            "a run wrote through the inherited descriptor"
        );
    }

    /// Panics unless [`PROBE`]'s output (stdout and stderr together) shows it ran to the
    /// end without fd [`FD`] in the listing and without the file's content.
    pub fn assert_unreached(&self, output: &str) {
        assert!(
            output.contains("probe-end"),
            "the probe did not run: {output}"
        );
        assert!(
            output.contains(" 0 -> ") || output.contains(" 1 -> "),
            "the probe listed no descriptor at all: {output}"
        );
        assert!(
            !output.lines().any(|l| l.contains(&format!(" {FD} -> "))),
            "the run holds fd {FD}: {output}"
        );
        assert!(
            !output.contains(self.content.trim()),
            "the run read the supervisor's file: {output}"
        );
        self.assert_unchanged();
    }
}

/// Whether process `pid` holds the supervisor's file (a [`Secret`]) open at [`FD`], read
/// from `/proc` by the test; `None` when its descriptors cannot be read (another user's, or
/// gone). A descriptor of the process's own at that number (a socket, an epoll) is not it.
pub fn holds_fd(pid: u32) -> Option<bool> {
    let dir = format!("/proc/{pid}/fd");
    std::fs::read_dir(&dir).ok()?;
    Some(
        std::fs::read_link(format!("{dir}/{FD}"))
            .is_ok_and(|t| t.file_name() == Some(std::ffi::OsStr::new(SECRET_NAME))),
    )
}

/// The children of process `pid` (from the kernel's `children` files).
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_probe_lists_as_the_smoke_tests_do() {
        assert!(super::PROBE.starts_with(plimsoll_provider::smoke::DESCRIPTOR_LISTING));
    }
}
