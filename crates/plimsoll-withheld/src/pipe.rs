//! Run matching on a thread of its own: the reading side (tar walk, decompression, whole-file
//! hashing) hands decoded bytes to the matcher through a bounded channel, so on two cores the
//! two halves of a scan overlap instead of taking turns.
//!
//! One matcher thread serves every stream ("lane") of a scan, in the order the bytes were read.
//! The reading side copies each chunk once into a staging buffer of [`STAGE`] bytes; at most
//! [`IN_FLIGHT`] staged buffers wait in the channel, so the memory between the halves is
//! bounded (about 2 MiB, plus as many spare buffers kept for reuse). A lane's results are read
//! back under its own lock: a member's range is attributed only once the matcher has consumed
//! every byte up to the member's end (see `walk::Space`), which gives the same findings as
//! matching inline.
//!
//! Small scans (a file in memory, the fuzz targets, a git history) match inline: starting a
//! thread would cost more than it saves.

use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::matcher::{RunHit, RunIndex, RunState};

/// Bytes staged before a chunk is handed to the matcher.
pub(crate) const STAGE: usize = 64 << 10;
/// Staged chunks that may wait for the matcher.
const IN_FLIGHT: usize = 32;
/// Most unresolved run hits one stream keeps.
const MAX_PENDING: usize = 100_000;

/// One decoded stream's matching state and the confirmed runs no member has claimed yet.
#[derive(Debug)]
pub(crate) struct Lane {
    run: RunState,
    /// Confirmed runs (overlapping runs of one entry merged), oldest first.
    pub(crate) pending: Vec<RunHit>,
    hits: Vec<RunHit>,
    confirm_factor: u64,
}

impl Lane {
    pub(crate) fn new(index: &RunIndex, confirm_factor: u64) -> Lane {
        Lane {
            run: RunState::new(index),
            pending: Vec::new(),
            hits: Vec::new(),
            confirm_factor,
        }
    }

    /// Bytes matched so far.
    pub(crate) fn pos(&self) -> u64 {
        self.run.pos()
    }

    /// True once the confirmation budget was spent (the rest was not matched).
    pub(crate) fn over_budget(&self) -> bool {
        self.run.over_budget
    }

    pub(crate) fn feed(&mut self, index: &RunIndex, chunk: &[u8]) {
        let budget = self
            .confirm_factor
            .saturating_mul(self.run.pos() + chunk.len() as u64)
            .saturating_add(64 << 20);
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
}

/// A lane the matcher thread feeds.
pub(crate) type SharedLane = Arc<Mutex<Lane>>;

pub(crate) fn lock(lane: &SharedLane) -> MutexGuard<'_, Lane> {
    // A poisoned lane means the matcher thread panicked; the next send reports that.
    lane.lock().unwrap_or_else(|p| p.into_inner())
}

enum Job {
    Feed(SharedLane, Vec<u8>),
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
                        Job::Feed(lane, mut buf) => {
                            lock(&lane).feed(&ix, &buf);
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

    /// Queues `buf` for `lane`; blocks while [`IN_FLIGHT`] chunks wait.
    pub(crate) fn send(&self, lane: &SharedLane, buf: Vec<u8>) {
        let jobs = self.jobs.as_ref().expect("open until dropped");
        jobs.send(Job::Feed(Arc::clone(lane), buf)).expect(GONE);
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
