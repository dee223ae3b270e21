//! What providers' startup smoke tests share when they read a project's report: one step's
//! output, and the network interfaces `/proc/net/dev` lists.

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
