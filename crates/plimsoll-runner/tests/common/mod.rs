//! Helpers shared by the runner's integration tests.

/// Whether a pid is gone (or only a zombie waiting to be reaped).
pub fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            let rest = &stat[stat.rfind(')').unwrap() + 1..];
            matches!(rest.split_whitespace().next(), Some("Z") | Some("X"))
        }
    }
}
