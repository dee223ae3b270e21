//! Run matching on a thread of its own: the reading side (tar walk, decompression, whole-file
//! hashing) hands decoded bytes to the matcher through a bounded channel, so on two cores the
//! two halves of a scan overlap instead of taking turns.
//!
//! One matcher thread serves every stream ("lane") of a scan, in the order the bytes were read.
//! The reading side copies each chunk once into a staging buffer of [`STAGE`] bytes; at most
//! [`IN_FLIGHT`] staged buffers wait in the channel, so the memory between the halves is
//! bounded (about 2 MiB, plus as many spare buffers kept for reuse). A member that ends is
//! sent with the chunk as a [`Claim`] at the offset where the reading side stood, and the
//! matcher claims its runs exactly there, so every claim sees the confirmed runs that matching
//! inline would have seen at that point: the findings are the same. The reading side collects
//! what was claimed when it can take the lane's lock without waiting, and at the stream's end.
//!
//! Small scans (a file in memory, the fuzz targets, a git history) match inline: starting a
//! thread would cost more than it saves.

use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::matcher::{Budget, RunHit, RunIndex, RunState};

/// Bytes staged before a chunk is handed to the matcher.
pub(crate) const STAGE: usize = 64 << 10;
/// Staged chunks that may wait for the matcher.
const IN_FLIGHT: usize = 32;
/// Most unresolved run hits one stream keeps.
const MAX_PENDING: usize = 100_000;

/// A member range of a lane that ended `at` bytes into a staged chunk: its runs are claimed
/// for `path` once the matcher has matched up to there.
#[derive(Debug)]
pub(crate) struct Claim {
    pub at: usize,
    pub start: u64,
    pub end: u64,
    pub path: String,
    /// Its place in the reading order (when the member ended).
    pub order: u64,
}

/// A run the matcher claimed for a member: (path, entry, order).
pub(crate) type Claimed = (String, usize, u64);

/// One decoded stream's matching state and the confirmed runs no member has claimed yet.
#[derive(Debug)]
pub(crate) struct Lane {
    run: RunState,
    /// Confirmed runs (overlapping runs of one entry merged), oldest first.
    pub(crate) pending: Vec<RunHit>,
    /// Runs claimed on the matcher thread, not yet collected by the reading side.
    pub(crate) claimed: Vec<Claimed>,
    hits: Vec<RunHit>,
    confirm_factor: u64,
}

impl Lane {
    pub(crate) fn new(index: &RunIndex, confirm_factor: u64) -> Lane {
        Lane {
            run: RunState::new(index),
            pending: Vec::new(),
            claimed: Vec::new(),
            hits: Vec::new(),
            confirm_factor,
        }
    }

    /// True once the confirmation budget was spent (the rest was not matched).
    pub(crate) fn over_budget(&self) -> bool {
        self.run.over_budget
    }

    pub(crate) fn feed(&mut self, index: &RunIndex, chunk: &[u8]) {
        let budget = Budget {
            factor: self.confirm_factor,
            allowance: 64 << 20,
        };
        self.hits.clear();
        let mut hits = std::mem::take(&mut self.hits);
        self.run.feed(index, chunk, budget, &mut hits);
        for h in hits.drain(..) {
            if let Some(last) = self
                .pending
                .iter_mut()
                .rev()
                .take(4)
                .find(|p| p.entry == h.entry)
            {
                if h.start < last.end {
                    last.end = last.end.max(h.end);
                    continue;
                }
            }
            if self.pending.len() < MAX_PENDING {
                self.pending.push(h);
            }
        }
        self.hits = hits;
    }

    /// Takes every pending run inside `[start, end)` out, handing each entry found once to
    /// `found` (in the order the runs were confirmed).
    pub(crate) fn take_inside(&mut self, start: u64, end: u64, mut found: impl FnMut(usize)) {
        if self.pending.is_empty() {
            return;
        }
        let mut seen: Vec<usize> = Vec::new();
        self.pending.retain(|h| {
            if h.start >= start && h.end <= end {
                if !seen.contains(&h.entry) {
                    seen.push(h.entry);
                    found(h.entry);
                }
                false
            } else {
                true
            }
        });
    }

    /// Feeds `chunk`, claiming each of `claims` at its offset.
    fn feed_claiming(&mut self, index: &RunIndex, chunk: &[u8], claims: Vec<Claim>) {
        let mut from = 0;
        for c in claims {
            let at = c.at.clamp(from, chunk.len());
            self.feed(index, &chunk[from..at]);
            from = at;
            let mut claimed = std::mem::take(&mut self.claimed);
            self.take_inside(c.start, c.end, |entry| {
                claimed.push((c.path.clone(), entry, c.order));
            });
            self.claimed = claimed;
        }
        self.feed(index, &chunk[from..]);
    }
}

/// A lane the matcher thread feeds.
pub(crate) type SharedLane = Arc<Mutex<Lane>>;

pub(crate) fn lock(lane: &SharedLane) -> MutexGuard<'_, Lane> {
    // A poisoned lane means the matcher thread panicked; the next send reports that.
    lane.lock().unwrap_or_else(|p| p.into_inner())
}

enum Job {
    Feed(SharedLane, Vec<u8>, Vec<Claim>),
    /// Answered once every job sent before it is done.
    Sync(SyncSender<()>),
}

/// The matcher thread of one scan. Dropping it ends the thread after the queued work.
pub(crate) struct Pipe {
    index: Arc<RunIndex>,
    jobs: Option<SyncSender<Job>>,
    spare: Receiver<Vec<u8>>,
    thread: Option<JoinHandle<()>>,
}

const GONE: &str = "the scan's matcher thread ended early (it panicked)";

impl Pipe {
    pub(crate) fn start(index: Arc<RunIndex>) -> std::io::Result<Pipe> {
        let (jobs, rx) = mpsc::sync_channel::<Job>(IN_FLIGHT);
        let (spare_tx, spare) = mpsc::sync_channel::<Vec<u8>>(IN_FLIGHT + 2);
        let ix = Arc::clone(&index);
        let thread = std::thread::Builder::new()
            .name("withheld-match".into())
            .spawn(move || {
                for job in rx {
                    match job {
                        Job::Feed(lane, mut buf, claims) => {
                            lock(&lane).feed_claiming(&ix, &buf, claims);
                            buf.clear();
                            let _ = spare_tx.try_send(buf);
                        }
                        Job::Sync(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })?;
        Ok(Pipe {
            index,
            jobs: Some(jobs),
            spare,
            thread: Some(thread),
        })
    }

    pub(crate) fn index(&self) -> &RunIndex {
        &self.index
    }

    /// An empty buffer of [`STAGE`] capacity, reused where one came back.
    pub(crate) fn buffer(&self) -> Vec<u8> {
        self.spare
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(STAGE))
    }

    /// Queues `buf` and the members that ended in it for `lane`; blocks while [`IN_FLIGHT`]
    /// chunks wait.
    pub(crate) fn send(&self, lane: &SharedLane, buf: Vec<u8>, claims: Vec<Claim>) {
        let jobs = self.jobs.as_ref().expect("open until dropped");
        jobs.send(Job::Feed(Arc::clone(lane), buf, claims))
            .expect(GONE);
    }

    /// Returns once the matcher has done every chunk queued before this call.
    pub(crate) fn sync(&self) {
        let (tx, rx) = mpsc::sync_channel(1);
        let jobs = self.jobs.as_ref().expect("open until dropped");
        jobs.send(Job::Sync(tx)).expect(GONE);
        rx.recv().expect(GONE);
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
