//! The accept loop's pause after an error (50 ms doubling to 1 s) and its log limit.

use std::time::{Duration, Instant};

/// The pause after a failed accept: 50 ms, doubled on each failure in a row up to 1 s, back
/// to 50 ms after an accept succeeds. Out of descriptors (EMFILE), a listener that retried
/// at once would spin a core and starve the connections that could free one.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Backoff {
    /// The first pause.
    pub const FIRST: Duration = Duration::from_millis(50);
    /// The longest pause.
    pub const MAX: Duration = Duration::from_secs(1);

    /// A fresh schedule.
    pub fn new() -> Backoff {
        Backoff { next: Self::FIRST }
    }

    /// The pause after one more failure in a row.
    pub fn failed(&mut self) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(Self::MAX);
        d
    }

    /// An accept succeeded: the next failure pauses [`Backoff::FIRST`] again.
    pub fn succeeded(&mut self) {
        self.next = Self::FIRST;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

/// At most one log line per interval; the next line that gets through says how many were
/// left out before it.
#[derive(Debug)]
pub struct LogLimit {
    every: Duration,
    last: Option<Instant>,
    dropped: u64,
}

impl LogLimit {
    /// One line per `every`.
    pub fn new(every: Duration) -> LogLimit {
        LogLimit {
            every,
            last: None,
            dropped: 0,
        }
    }

    /// `Some(dropped_before)` when a line may be written now.
    pub fn admit(&mut self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.duration_since(t) < self.every => {
                self.dropped += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.dropped))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_back_off_50ms_doubling_to_1s_and_reset_on_success() {
        let mut b = Backoff::new();
        let ms: Vec<u128> = (0..8).map(|_| b.failed().as_millis()).collect();
        assert_eq!(ms, [50, 100, 200, 400, 800, 1000, 1000, 1000]);
        b.succeeded();
        assert_eq!(b.failed(), Duration::from_millis(50));
        assert_eq!(b.failed(), Duration::from_millis(100));
    }

    #[test]
    fn the_log_limit_admits_one_line_per_interval_and_counts_the_rest() {
        let mut l = LogLimit::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(l.admit_at(t0), Some(0));
        assert_eq!(l.admit_at(t0 + Duration::from_millis(10)), None);
        assert_eq!(l.admit_at(t0 + Duration::from_millis(900)), None);
        assert_eq!(l.admit_at(t0 + Duration::from_millis(1000)), Some(2));
        assert_eq!(l.admit_at(t0 + Duration::from_millis(1001)), None);
    }
}
