//! What providers' startup smoke tests share when they read a project's report: one step's
//! output, the network interfaces `/proc/net/dev` lists, and the descriptors a run's first
//! process holds (no provider states its tier while a run inherits one it did not pass).

use plimsoll_core::pb;

/// Step `i`'s standard output, trimmed (empty when the step did not run).
pub fn step_stdout(p: &pb::ProjectResult, i: usize) -> String {
    p.steps
        .get(i)
        .map(|s| String::from_utf8_lossy(&s.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Network interfaces listed in `/proc/net/dev` (the lines after the two headers).
pub fn interfaces(proc_net_dev: &str) -> Vec<String> {
    proc_net_dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split_once(':').map(|(n, _)| n.trim().to_owned()))
        .filter(|n| !n.is_empty())
        .collect()
}

/// The first checks of a smoke report whose steps 0 to 2 print `plimsoll-smoke-42` in
/// JavaScript, Python and shell: the report must have all `steps` (else why it stopped,
/// with the last step's error output), and the languages whose step printed the line.
pub fn languages(p: &pb::ProjectResult, steps: usize) -> Result<Vec<String>, String> {
    if p.steps.len() < steps {
        return Err(format!(
            "the smoke run stopped after {} of {steps} steps ({}): {}",
            p.steps.len(),
            p.outcome_detail,
            p.steps
                .last()
                .map(|s| String::from_utf8_lossy(&s.stderr).into_owned())
                .unwrap_or_default()
        ));
    }
    Ok(["javascript", "python", "shell"]
        .iter()
        .enumerate()
        .filter(|(i, _)| step_stdout(p, *i) == "plimsoll-smoke-42")
        .map(|(_, l)| (*l).to_owned())
        .collect())
}

/// A shell command that lists the descriptors of the shell running it, one `… N -> target`
/// line each, and fails when it cannot. `ls -l` lists the table from a process of its own
/// (not the last command, so the shell forks it), so the listing's own directory is not in
/// it. Under gVisor `ls` cannot stat `/proc/<pid>/fd` (`EINVAL`, on stderr); a child shell
/// then reads the table (the glob's directory and `readlink`'s pipes are the child's, not
/// the shell's). No redirection on `ls`: dash applies it in the shell itself and keeps the
/// saved descriptor (at 10) while `ls` runs, which `ls` would then list.
pub const DESCRIPTOR_LISTING: &str = "{ ls -l /proc/$$/fd || sh -c 'for f in /proc/$1/fd/*; do echo \"fd ${f##*/} -> $(readlink \"$f\")\"; done' sh $$; }";

/// The step that lists the descriptors of the step's own shell ([`DESCRIPTOR_LISTING`]),
/// then a closing line. The shell's table is what every process of the run starts from.
pub const DESCRIPTOR_STEP: &str = "{ ls -l /proc/$$/fd || sh -c 'for f in /proc/$1/fd/*; do echo \"fd ${f##*/} -> $(readlink \"$f\")\"; done' sh $$; } && echo descriptors-listed";

/// One open descriptor of a process: its number and where `/proc/<pid>/fd/<n>` points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenDescriptor {
    /// The descriptor's number.
    pub fd: i32,
    /// Its `readlink` target (a path, `pipe:[…]`, `socket:[…]`, …).
    pub target: String,
}

/// Reads what [`DESCRIPTOR_STEP`] printed. An error when the listing did not finish (`ls`
/// missing, `/proc` unreadable): an unread table proves nothing.
pub fn listed_descriptors(output: &str) -> Result<Vec<OpenDescriptor>, String> {
    if output.lines().last() != Some("descriptors-listed") {
        return Err(format!(
            "the run's descriptors could not be listed (`{DESCRIPTOR_STEP}` printed {output:?})"
        ));
    }
    Ok(output
        .lines()
        .filter_map(|l| {
            let (before, target) = l.split_once(" -> ")?;
            let fd = before.split_whitespace().last()?.parse().ok()?;
            Some(OpenDescriptor {
                fd,
                target: target.to_owned(),
            })
        })
        .collect())
}

/// Checks that a process of a run holds no descriptor beyond 0, 1, 2 and `passed`; the
/// error names each other one with its target, which the provider's startup error repeats.
pub fn check_descriptors(open: &[OpenDescriptor], passed: &[i32]) -> Result<(), String> {
    let extra: Vec<String> = open
        .iter()
        .filter(|d| !(0..=2).contains(&d.fd) && !passed.contains(&d.fd))
        .map(|d| format!("{} ({})", d.fd, d.target))
        .collect();
    if extra.is_empty() {
        return Ok(());
    }
    Err(format!(
        "a run inherits descriptors it was not given: {}; plimsolld (or what started it) holds \
         them without close-on-exec, and code inside could read or write through them \
         (docs/plimsolld.md, \"Descriptor hygiene\")",
        extra.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTED: &str = "total 0\n\
        lr-x------ 1 1000 1000 64 Dec  5 12:00 0 -> /dev/null\n\
        l-wx------ 1 1000 1000 64 Dec  5 12:00 1 -> pipe:[1234]\n\
        l-wx------ 1 1000 1000 64 Dec  5 12:00 2 -> pipe:[1235]\n\
        descriptors-listed\n";

    #[test]
    fn the_step_is_the_listing_then_its_closing_line() {
        assert_eq!(
            DESCRIPTOR_STEP,
            format!("{DESCRIPTOR_LISTING} && echo descriptors-listed")
        );
    }

    /// The fallback's lines (gVisor's) read like `ls -l`'s.
    #[test]
    fn the_child_shells_lines_are_read_too() {
        let open = listed_descriptors(
            "fd 0 -> host:[1]\nfd 1 -> host:[2]\nfd 2 -> host:[3]\nfd 7 -> /root/secret\ndescriptors-listed",
        )
        .unwrap();
        assert_eq!(open.len(), 4);
        assert!(check_descriptors(&open, &[])
            .unwrap_err()
            .contains("7 (/root/secret)"));
    }

    #[test]
    fn the_standard_streams_alone_pass() {
        let open = listed_descriptors(LISTED.trim()).unwrap();
        assert_eq!(open.len(), 3);
        assert_eq!(open[1].target, "pipe:[1234]");
        check_descriptors(&open, &[]).unwrap();
    }

    #[test]
    fn an_extra_descriptor_is_refused_by_number_and_target() {
        let listed = LISTED.replace(
            "descriptors-listed",
            "lrwx------ 1 1000 1000 64 Dec  5 12:00 7 -> /root/secret file\n\
             lrwx------ 1 1000 1000 64 Dec  5 12:00 3 -> socket:[99]\ndescriptors-listed",
        );
        let open = listed_descriptors(listed.trim()).unwrap();
        let e = check_descriptors(&open, &[]).unwrap_err();
        assert!(e.contains("7 (/root/secret file)"), "{e}");
        assert!(e.contains("3 (socket:[99])"), "{e}");
        // A descriptor the wall names on purpose passes; the other is still named.
        let e = check_descriptors(&open, &[3]).unwrap_err();
        assert!(!e.contains("socket") && e.contains("7 ("), "{e}");
        check_descriptors(&open, &[3, 7]).unwrap();
    }

    #[test]
    fn an_unfinished_listing_proves_nothing() {
        assert!(listed_descriptors("ls: cannot access '/proc/9/fd'").is_err());
        assert!(listed_descriptors("").is_err());
    }
}
