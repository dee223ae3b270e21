//! Prometheus counters, rendered as text format 0.0.4. Labels are fixed names, never
//! caller-supplied strings.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use plimsoll_core::Reason;

/// The daemon's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    runs_answered: AtomicU64,
    runs_failed: AtomicU64,
    refusals: [AtomicU64; 7],
    inflight: AtomicI64,
    run_millis_total: AtomicU64,
}

fn reason_index(r: Reason) -> usize {
    Reason::ALL.iter().position(|x| *x == r).unwrap_or(0)
}

impl Metrics {
    /// A run was answered with a result.
    pub fn answered(&self, millis: u64) {
        self.runs_answered.fetch_add(1, Ordering::Relaxed);
        self.run_millis_total.fetch_add(millis, Ordering::Relaxed);
    }
    /// A run failed after it may have started.
    pub fn failed(&self) {
        self.runs_failed.fetch_add(1, Ordering::Relaxed);
    }
    /// A call was refused before anything ran.
    pub fn refused(&self, r: Reason) {
        self.refusals[reason_index(r)].fetch_add(1, Ordering::Relaxed);
    }
    /// Runs in flight changed by `delta`.
    pub fn inflight(&self, delta: i64) {
        self.inflight.fetch_add(delta, Ordering::Relaxed);
    }
    /// Runs in flight now.
    pub fn inflight_now(&self) -> i64 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// The text exposition.
    pub fn render(&self, provider: &str, tier: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# HELP plimsoll_info The provider and the tier it proved at startup."
        );
        let _ = writeln!(s, "# TYPE plimsoll_info gauge");
        let _ = writeln!(
            s,
            "plimsoll_info{{provider=\"{provider}\",isolation=\"{tier}\",protocol=\"{}\"}} 1",
            plimsoll_core::PROTOCOL
        );
        let _ = writeln!(s, "# HELP plimsoll_runs_total Runs answered with a result.");
        let _ = writeln!(s, "# TYPE plimsoll_runs_total counter");
        let _ = writeln!(
            s,
            "plimsoll_runs_total {}",
            self.runs_answered.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            s,
            "# HELP plimsoll_runs_failed_total Runs that failed after they may have started."
        );
        let _ = writeln!(s, "# TYPE plimsoll_runs_failed_total counter");
        let _ = writeln!(
            s,
            "plimsoll_runs_failed_total {}",
            self.runs_failed.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            s,
            "# HELP plimsoll_refused_total Calls refused before anything ran, by reason."
        );
        let _ = writeln!(s, "# TYPE plimsoll_refused_total counter");
        for r in Reason::ALL {
            let _ = writeln!(
                s,
                "plimsoll_refused_total{{reason=\"{r}\"}} {}",
                self.refusals[reason_index(r)].load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(s, "# HELP plimsoll_inflight Runs in flight.");
        let _ = writeln!(s, "# TYPE plimsoll_inflight gauge");
        let _ = writeln!(s, "plimsoll_inflight {}", self.inflight_now());
        let _ = writeln!(
            s,
            "# HELP plimsoll_run_seconds_total Time spent in answered runs."
        );
        let _ = writeln!(s, "# TYPE plimsoll_run_seconds_total counter");
        let _ = writeln!(
            s,
            "plimsoll_run_seconds_total {:.3}",
            self.run_millis_total.load(Ordering::Relaxed) as f64 / 1000.0
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_counts() {
        let m = Metrics::default();
        m.answered(1500);
        m.refused(Reason::Isolation);
        m.refused(Reason::Isolation);
        let text = m.render("process", "process");
        assert!(text.contains("plimsoll_runs_total 1\n"));
        assert!(text.contains("plimsoll_refused_total{reason=\"isolation\"} 2\n"));
        assert!(text.contains("plimsoll_run_seconds_total 1.500\n"));
    }
}
