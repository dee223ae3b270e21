//! Peak memory: fields of `/proc/<pid>/status` (`VmHWM`, the peak resident set; `VmRSS`),
//! and waiting for a child while sampling its peak.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// The kB value of `field` (`VmHWM`, `VmRSS`, …) in `/proc/<pid>/status`, or `None` when the
/// process or the line is gone.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    field_kib(&text, field)
}

/// The kB value of `field` in the text of a `/proc/<pid>/status` file.
pub fn field_kib(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        l.strip_prefix(field)?
            .strip_prefix(':')?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()
    })
}

/// The peak resident set (`VmHWM`, KiB) of `pid` so far.
pub fn vm_hwm(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM")
}

/// What [`wait_sampling`] saw.
#[derive(Debug)]
pub struct Sampled {
    /// How the child exited; `None` when it was killed at the limit.
    pub status: Option<ExitStatus>,
    /// Its peak resident set (KiB), if it was ever sampled.
    pub peak_kib: Option<u64>,
    /// From `start` until it exited or was killed.
    pub wall: Duration,
}

/// Waits for `child`, sampling its `VmHWM` every `every`; kills it once `limit` has passed
/// since `start`.
pub fn wait_sampling(
    child: &mut Child,
    start: Instant,
    every: Duration,
    limit: Option<Duration>,
) -> std::io::Result<Sampled> {
    let pid = child.id();
    let mut peak: Option<u64> = None;
    loop {
        if let Some(k) = vm_hwm(pid) {
            peak = Some(peak.unwrap_or(0).max(k));
        }
        if let Some(st) = child.try_wait()? {
            return Ok(Sampled {
                status: Some(st),
                peak_kib: peak,
                wall: start.elapsed(),
            });
        }
        if limit.is_some_and(|l| start.elapsed() > l) {
            child.kill()?;
            let _ = child.wait()?;
            return Ok(Sampled {
                status: None,
                peak_kib: peak,
                wall: start.elapsed(),
            });
        }
        std::thread::sleep(every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields() {
        let text = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t1024 kB\n";
        assert_eq!(field_kib(text, "VmHWM"), Some(2048));
        assert_eq!(field_kib(text, "VmRSS"), Some(1024));
        assert_eq!(field_kib(text, "VmPeak"), None);
        assert!(vm_hwm(std::process::id()).is_some_and(|k| k > 0));
    }
}
