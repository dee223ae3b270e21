//! The daemon's session table: which sessions are open, whose they are, their caps,
//! lifetimes, idle timeouts and chain positions, and the ended sessions' final counts.
//!
//! # Choices where the specification is silent
//!
//! - **Identity.** A session id is 128 random bits in lowercase hex, known to the caller
//!   only: it is never logged and never in a record. Logs and records carry its
//!   fingerprint (hex SHA-256 of the id). A session belongs to the principal that opened it;
//!   any other caller naming it is answered exactly as for an unknown id (`NOT_FOUND`).
//! - **Caps.** `SANDBOX_MAX_SESSIONS` counts open sessions and sessions being opened,
//!   daemon-wide; `SANDBOX_MAX_SESSIONS_PER_CALLER` per principal (unset: a quarter of
//!   `SANDBOX_MAX_SESSIONS`, at least 1, so no one caller holds every slot by default; an
//!   explicit `0` is the operator's opt-out, no cap of its own, which hardened mode refuses);
//!   `SANDBOX_MAX_SESSIONS_PER_OWNER` per (principal, owner), where at the cap the owner's
//!   least-recently-used sessions with no call running or waiting are ended `REPLACED` to
//!   make room (not enough of them: refused `capacity`, nothing ended). An open with no
//!   owner is not counted against any owner.
//! - **Turns.** One call runs at a time; at most one more waits (FIFO); a third is refused
//!   `capacity`. A close waits for the running call, then ends the session; a call that was
//!   waiting behind it is refused as ended.
//! - **Time.** Lifetime, idle and the tombstones' ten minutes are measured on the monotonic
//!   clock (`tokio::time::Instant`); only `expires_unix_ms` in the open answer is stamped
//!   from the wall clock. A call's deadline is cut to what is left of the lifetime. A
//!   session past its lifetime ends `EXPIRED` once no call is running (a call in progress
//!   is answered first, with `ended` set).
//! - **Idle.** After the idle timeout without a call, a session no request named since it
//!   was opened ends `UNCLAIMED`; a named one is suspended (`ProviderSession::suspend`,
//!   which does nothing for providers that cannot pause) and resumed by its next call. An
//!   idle timeout of 0 (`SANDBOX_SESSION_IDLE_MS=0`) never suspends, and a never-named
//!   session then ends `UNCLAIMED` after five minutes.
//! - **Tombstones.** An ended session's fingerprint, call count, last record digest and end
//!   reason stay collectable by its principal (`CloseSession`) for ten minutes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use plimsoll_config::{ConfigError, Variable, Vars};
use plimsoll_core::digest::{session_fingerprint, ChainLink, SessionEvidence};
use plimsoll_core::{pb, Refusal, Tier};
use plimsoll_provider::ProviderSession;
use tokio::time::Instant;

/// The session variables plimsolld reads.
pub const SESSION_VARIABLES: &[Variable] = &[
    (
        "SANDBOX_MAX_SESSIONS",
        "sessions open at once, daemon-wide; 0 (default) turns sessions off",
    ),
    (
        "SANDBOX_MAX_SESSIONS_PER_CALLER",
        "sessions one caller may hold open (default: a quarter of SANDBOX_MAX_SESSIONS, at least 1; 0 = no cap beyond SANDBOX_MAX_SESSIONS, refused in hardened mode)",
    ),
    (
        "SANDBOX_MAX_SESSIONS_PER_OWNER",
        "sessions one owner of one caller may hold; at the cap its least-recently-used idle session is replaced (0 = no cap)",
    ),
    (
        "SANDBOX_SESSION_LIFETIME_MS",
        "longest a session lives, in ms (default 1800000; 1000 to 43200000); a request may only shorten it",
    ),
    (
        "SANDBOX_SESSION_IDLE_MS",
        "idle time before a session is suspended, in ms (default 300000; 0 never suspends, else at least 1000); a request may only shorten it",
    ),
    (
        "SANDBOX_SESSION_DISK_MB",
        "MiB a session's files may take, measured after each call (default 1024; 0 = not measured)",
    ),
    (
        "SANDBOX_SESSION_POOL",
        "docker: never-used session containers kept ready (default 0; at most SANDBOX_MAX_SESSIONS)",
    ),
];

/// How long an ended session's final counts stay collectable.
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(600);
/// When a session never named by a request ends `UNCLAIMED` if it never suspends.
pub const UNCLAIMED_WITHOUT_IDLE: Duration = Duration::from_secs(300);
/// How often the table looks for expired, idle and unclaimed sessions.
pub const SWEEP_EVERY: Duration = Duration::from_millis(200);

const MAX_LIFETIME_MS: u32 = 12 * 60 * 60 * 1000;

/// The session settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSettings {
    /// Open sessions daemon-wide; 0 turns sessions off.
    pub max_sessions: usize,
    /// Per principal; 0 = no cap of its own. Read from the environment it defaults to
    /// [`default_per_caller`]; [`SessionSettings::default`] keeps 0 for daemons built in code
    /// with one caller (the embedded daemon).
    pub per_caller: usize,
    /// Per (principal, owner); 0 = no cap.
    pub per_owner: usize,
    /// The longest lifetime.
    pub lifetime: Duration,
    /// The longest idle timeout; zero never suspends.
    pub idle: Duration,
    /// MiB a session's files may take (0 = not measured).
    pub disk_mb: u32,
    /// Docker: never-used session containers kept ready.
    pub pool: usize,
}

impl Default for SessionSettings {
    fn default() -> Self {
        SessionSettings {
            max_sessions: 0,
            per_caller: 0,
            per_owner: 0,
            lifetime: Duration::from_secs(30 * 60),
            idle: Duration::from_secs(5 * 60),
            disk_mb: 1024,
            pool: 0,
        }
    }
}

impl SessionSettings {
    /// Reads [`SESSION_VARIABLES`].
    pub fn from_vars(v: &Vars<'_>) -> Result<SessionSettings, ConfigError> {
        let d = SessionSettings::default();
        let lifetime_ms: u32 = v.number("SANDBOX_SESSION_LIFETIME_MS", 30 * 60 * 1000)?;
        if !(1000..=MAX_LIFETIME_MS).contains(&lifetime_ms) {
            return Err(ConfigError::new(
                "SANDBOX_SESSION_LIFETIME_MS",
                "must be between 1000 (1 s) and 43200000 (12 h)",
            ));
        }
        let idle_ms: u32 = v.number("SANDBOX_SESSION_IDLE_MS", 5 * 60 * 1000)?;
        if idle_ms != 0 && !(1000..=MAX_LIFETIME_MS).contains(&idle_ms) {
            return Err(ConfigError::new(
                "SANDBOX_SESSION_IDLE_MS",
                "must be 0 (never suspend) or between 1000 and 43200000",
            ));
        }
        let disk_mb: u32 = v.number("SANDBOX_SESSION_DISK_MB", d.disk_mb)?;
        if disk_mb > 1_048_576 {
            return Err(ConfigError::new(
                "SANDBOX_SESSION_DISK_MB",
                "must be at most 1048576",
            ));
        }
        let max_sessions: usize = v.number("SANDBOX_MAX_SESSIONS", 0)?;
        let pool: usize = v.number("SANDBOX_SESSION_POOL", 0)?;
        if pool > max_sessions {
            return Err(ConfigError::new(
                "SANDBOX_SESSION_POOL",
                format!("{pool} is more than SANDBOX_MAX_SESSIONS ({max_sessions}); a pool never holds more containers than sessions may be open"),
            ));
        }
        Ok(SessionSettings {
            max_sessions,
            pool,
            per_caller: v.number(
                "SANDBOX_MAX_SESSIONS_PER_CALLER",
                default_per_caller(max_sessions),
            )?,
            per_owner: v.number("SANDBOX_MAX_SESSIONS_PER_OWNER", 0)?,
            lifetime: Duration::from_millis(lifetime_ms.into()),
            idle: Duration::from_millis(idle_ms.into()),
            disk_mb,
        })
    }

    /// Whether sessions are on.
    pub fn enabled(&self) -> bool {
        self.max_sessions > 0
    }
}

/// The per-caller cap when `SANDBOX_MAX_SESSIONS_PER_CALLER` is unset: a quarter of
/// `max_sessions`, at least 1, so one caller cannot hold every session slot for the
/// sessions' whole lifetime unless the operator says so (an explicit `0`).
pub fn default_per_caller(max_sessions: usize) -> usize {
    (max_sessions / 4).max(1)
}

/// A fresh session id: 128 random bits, lowercase hex.
pub fn new_session_id() -> String {
    use rand::RngCore;
    let mut b = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut b);
    hex::encode(b)
}

/// What changes as a session is used.
#[derive(Debug)]
struct EntryState {
    calls: u64,
    last_sha256: String,
    last_used: Instant,
    named: bool,
    suspended: bool,
    ended: Option<(pb::SessionEnd, String)>,
}

/// One open session.
pub struct Entry {
    id: String,
    /// The fingerprint (what logs and records carry).
    pub fingerprint: String,
    /// The principal that opened it.
    pub principal: String,
    owner: String,
    /// What the session stated at open (an unanswered record's evidence).
    pub evidence: SessionEvidence,
    /// The tier measured at open.
    pub tier: Tier,
    /// Languages proven at open.
    pub languages: Vec<String>,
    /// The end of its lifetime.
    pub expires_at: Instant,
    /// Its idle timeout (zero: never suspends).
    pub idle_timeout: Duration,
    state: Mutex<EntryState>,
    turn: tokio::sync::Mutex<()>,
    queued: AtomicUsize,
    closed: AtomicBool,
    session: Box<dyn ProviderSession>,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The id is a capability: never printed.
        f.debug_struct("Entry")
            .field("fingerprint", &self.fingerprint)
            .field("principal", &self.principal)
            .finish_non_exhaustive()
    }
}

/// What the open handler hands the table.
pub struct NewSession {
    /// The principal.
    pub principal: String,
    /// The owner (empty: none).
    pub owner: String,
    /// Evidence at open.
    pub evidence: SessionEvidence,
    /// Tier at open.
    pub tier: Tier,
    /// Languages proven at open.
    pub languages: Vec<String>,
    /// The clamped lifetime.
    pub lifetime: Duration,
    /// The clamped idle timeout.
    pub idle_timeout: Duration,
    /// The provider's session.
    pub session: Box<dyn ProviderSession>,
}

/// A call's turn in its session: held while the call runs; dropping it lets the next go.
pub struct Turn<'a> {
    entry: &'a Entry,
    _guard: tokio::sync::MutexGuard<'a, ()>,
    _slot: QueueSlot<'a>,
}

impl Turn<'_> {
    /// The link the next executed call gets.
    pub fn next_link(&self) -> ChainLink {
        let st = self.entry.state.lock().expect("session state");
        ChainLink {
            session: self.entry.fingerprint.clone(),
            sequence: st.calls + 1,
            previous_sha256: st.last_sha256.clone(),
        }
    }
    /// Counts an executed call (answered or unanswered) whose record digest is `sha`.
    pub fn executed(&self, sha: &str) {
        let mut st = self.entry.state.lock().expect("session state");
        st.calls += 1;
        st.last_sha256 = sha.to_owned();
        st.last_used = Instant::now();
    }
    /// Why the session has ended, if it has.
    pub fn ended(&self) -> Option<(pb::SessionEnd, String)> {
        self.entry.ended()
    }
    /// Marks the session in use now and resumes it if it was suspended.
    pub fn resume(&self) -> bool {
        let mut st = self.entry.state.lock().expect("session state");
        st.last_used = Instant::now();
        std::mem::replace(&mut st.suspended, false)
    }
    /// The provider's session.
    pub fn session(&self) -> &dyn ProviderSession {
        self.entry.session.as_ref()
    }
}

struct QueueSlot<'a>(&'a AtomicUsize);
impl Drop for QueueSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Entry {
    /// The session id (compared, never logged).
    fn id(&self) -> &str {
        &self.id
    }

    fn ended(&self) -> Option<(pb::SessionEnd, String)> {
        self.state.lock().expect("session state").ended.clone()
    }

    /// Waits for this call's turn: refused `capacity` when one call runs and another already
    /// waits. The turn is held until the returned value is dropped.
    pub async fn take_turn(&self) -> Result<Turn<'_>, Refusal> {
        if self.queued.fetch_add(1, Ordering::SeqCst) >= 2 {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(Refusal::capacity(
                "a call is running in this session and another is waiting; one call runs at a time, retry after the answer",
            ));
        }
        let slot = QueueSlot(&self.queued);
        let guard = self.turn.lock().await;
        Ok(Turn {
            entry: self,
            _guard: guard,
            _slot: slot,
        })
    }

    /// The number of executed calls and the last record digest.
    pub fn counts(&self) -> (u64, String) {
        let st = self.state.lock().expect("session state");
        (st.calls, st.last_sha256.clone())
    }

    /// Time left of the lifetime.
    pub fn remaining(&self) -> Duration {
        self.expires_at.saturating_duration_since(Instant::now())
    }

    fn busy(&self) -> bool {
        self.queued.load(Ordering::SeqCst) > 0
    }
}

/// An ended session's final counts.
#[derive(Debug, Clone)]
pub struct Tombstone {
    principal: String,
    /// The fingerprint.
    pub fingerprint: String,
    /// Executed calls.
    pub calls: u64,
    /// The last record digest.
    pub last_sha256: String,
    /// Why it ended.
    pub reason: pb::SessionEnd,
    /// What was found.
    pub detail: String,
    at: Instant,
}

/// What naming a session id finds.
pub enum Lookup {
    /// An open session of this caller.
    Live(Arc<Entry>),
    /// One of this caller's sessions that ended less than ten minutes ago.
    Ended(Tombstone),
    /// Nothing this caller may see.
    NotFound,
}

#[derive(Default)]
struct Inner {
    live: HashMap<String, Arc<Entry>>,
    ended: HashMap<String, Tombstone>,
    /// Opens in progress: (principal, owner) of each.
    opening: Vec<(String, String)>,
}

/// A place reserved for a session being opened; released when dropped unless the session
/// was registered.
pub struct Reservation<'a> {
    table: &'a SessionTable,
    key: Option<(String, String)>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let mut inner = self.table.inner.lock().expect("session table");
            if let Some(i) = inner.opening.iter().position(|k| *k == key) {
                inner.opening.swap_remove(i);
            }
        }
    }
}

/// The daemon's sessions.
pub struct SessionTable {
    settings: SessionSettings,
    inner: Mutex<Inner>,
}

impl SessionTable {
    /// An empty table.
    pub fn new(settings: SessionSettings) -> SessionTable {
        SessionTable {
            settings,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &SessionSettings {
        &self.settings
    }

    /// Sessions open now.
    pub fn open_count(&self) -> usize {
        self.inner.lock().expect("session table").live.len()
    }

    /// Reserves a place for `principal`'s new session of `owner`, checking the three caps.
    /// At the owner cap, returns the sessions to end `REPLACED` first (their ends are the
    /// caller's to carry out, with [`SessionTable::end`]).
    pub fn reserve(
        &self,
        principal: &str,
        owner: &str,
    ) -> Result<(Reservation<'_>, Vec<Arc<Entry>>), Refusal> {
        let mut inner = self.inner.lock().expect("session table");
        let s = &self.settings;
        let mine = |p: &str, o: Option<&str>| {
            inner
                .live
                .values()
                .filter(|e| e.principal == p && o.is_none_or(|o| e.owner == o))
                .count()
                + inner
                    .opening
                    .iter()
                    .filter(|(ip, io)| ip == p && o.is_none_or(|o| io == o))
                    .count()
        };
        let mut victims: Vec<Arc<Entry>> = Vec::new();
        if s.per_owner > 0 && !owner.is_empty() {
            let held = mine(principal, Some(owner));
            if held >= s.per_owner {
                let need = held + 1 - s.per_owner;
                let mut idle: Vec<&Arc<Entry>> = inner
                    .live
                    .values()
                    .filter(|e| e.principal == principal && e.owner == owner && !e.busy())
                    .collect();
                idle.sort_by_key(|e| e.state.lock().expect("session state").last_used);
                if idle.len() < need {
                    return Err(Refusal::capacity(format!(
                        "this owner holds {held} sessions (SANDBOX_MAX_SESSIONS_PER_OWNER is {}) and none is idle to replace; close one or retry later",
                        s.per_owner
                    )));
                }
                victims = idle.into_iter().take(need).cloned().collect();
            }
        }
        let freed = victims.len();
        let total = inner.live.len() + inner.opening.len() - freed;
        if total >= s.max_sessions {
            return Err(Refusal::capacity(format!(
                "{total} sessions are open, the daemon's limit (SANDBOX_MAX_SESSIONS); close one or retry later"
            )));
        }
        if s.per_caller > 0 && mine(principal, None) - freed >= s.per_caller {
            return Err(Refusal::capacity(format!(
                "this caller holds {} sessions, its limit (SANDBOX_MAX_SESSIONS_PER_CALLER); close one first",
                s.per_caller
            )));
        }
        // The victims are no longer named or counted from here on; their ends follow.
        for v in &victims {
            inner.live.remove(v.id());
        }
        let key = (principal.to_owned(), owner.to_owned());
        inner.opening.push(key.clone());
        Ok((
            Reservation {
                table: self,
                key: Some(key),
            },
            victims,
        ))
    }

    /// Registers an opened session under a fresh id; returns the id and the entry.
    pub fn register(&self, reservation: Reservation<'_>, new: NewSession) -> Arc<Entry> {
        let id = new_session_id();
        let now = Instant::now();
        let entry = Arc::new(Entry {
            fingerprint: session_fingerprint(&id),
            id: id.clone(),
            principal: new.principal,
            owner: new.owner,
            evidence: new.evidence,
            tier: new.tier,
            languages: new.languages,
            expires_at: now + new.lifetime,
            idle_timeout: new.idle_timeout,
            state: Mutex::new(EntryState {
                calls: 0,
                last_sha256: String::new(),
                last_used: now,
                named: false,
                suspended: false,
                ended: None,
            }),
            turn: tokio::sync::Mutex::new(()),
            queued: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            session: new.session,
        });
        let mut inner = self.inner.lock().expect("session table");
        inner.live.insert(id, entry.clone());
        drop(inner);
        drop(reservation);
        entry
    }

    /// The session id of an entry, for the open answer only.
    pub fn id_of(entry: &Entry) -> &str {
        entry.id()
    }

    /// Finds `id` for `principal`, and marks a live session as named.
    pub fn lookup(&self, id: &str, principal: &str) -> Lookup {
        let inner = self.inner.lock().expect("session table");
        if let Some(e) = inner.live.get(id).filter(|e| e.principal == principal) {
            e.state.lock().expect("session state").named = true;
            return Lookup::Live(e.clone());
        }
        match inner.ended.get(id).filter(|t| t.principal == principal) {
            Some(t) => Lookup::Ended(t.clone()),
            None => Lookup::NotFound,
        }
    }

    /// Ends `entry` with `reason` (the first end wins): it is no longer named at once, a
    /// call waiting for its turn is refused, the running call (if any) is answered first,
    /// then its counts become a tombstone and the provider's session is closed. Returns the
    /// reason that stands.
    pub async fn end(
        &self,
        entry: &Arc<Entry>,
        reason: pb::SessionEnd,
        detail: &str,
    ) -> (pb::SessionEnd, String) {
        let stands = self.mark_ended(entry, reason, detail);
        let _turn = entry.turn.lock().await;
        self.finish(entry, stands).await
    }

    /// [`SessionTable::end`] by the holder of the session's turn (a call that ended it, or
    /// the sweep), which must not wait for itself.
    pub async fn end_in_turn(
        &self,
        entry: &Arc<Entry>,
        reason: pb::SessionEnd,
        detail: &str,
    ) -> (pb::SessionEnd, String) {
        let stands = self.mark_ended(entry, reason, detail);
        self.finish(entry, stands).await
    }

    fn mark_ended(
        &self,
        entry: &Arc<Entry>,
        reason: pb::SessionEnd,
        detail: &str,
    ) -> (pb::SessionEnd, String) {
        let stands = {
            let mut st = entry.state.lock().expect("session state");
            st.ended
                .get_or_insert_with(|| (reason, detail.to_owned()))
                .clone()
        };
        self.inner
            .lock()
            .expect("session table")
            .live
            .remove(entry.id());
        stands
    }

    async fn finish(
        &self,
        entry: &Arc<Entry>,
        stands: (pb::SessionEnd, String),
    ) -> (pb::SessionEnd, String) {
        let (calls, last_sha256) = entry.counts();
        self.inner.lock().expect("session table").ended.insert(
            entry.id().to_owned(),
            Tombstone {
                principal: entry.principal.clone(),
                fingerprint: entry.fingerprint.clone(),
                calls,
                last_sha256,
                reason: stands.0,
                detail: stands.1.clone(),
                at: Instant::now(),
            },
        );
        if !entry.closed.swap(true, Ordering::SeqCst) {
            entry.session.close().await;
            tracing::info!(target: "plimsoll::audit", session = %entry.fingerprint, caller = %entry.principal,
                calls, reason = stands.0.as_str_name(), "session ended");
        }
        stands
    }

    /// One look at every session: ends the expired and the unclaimed ones, suspends the
    /// idle ones, forgets tombstones older than ten minutes. Sessions with a call running or
    /// waiting are left alone.
    pub async fn sweep(&self) {
        let now = Instant::now();
        let entries: Vec<Arc<Entry>> = {
            let mut inner = self.inner.lock().expect("session table");
            inner
                .ended
                .retain(|_, t| now.saturating_duration_since(t.at) < TOMBSTONE_TTL);
            inner.live.values().cloned().collect()
        };
        for e in entries {
            // A session with a call running or waiting is left alone; holding its turn
            // keeps a call from starting while it is ended or suspended.
            if e.busy() {
                continue;
            }
            let Ok(_turn) = e.turn.try_lock() else {
                continue;
            };
            if now >= e.expires_at {
                self.end_in_turn(
                    &e,
                    pb::SessionEnd::Expired,
                    "the session's lifetime is over",
                )
                .await;
                continue;
            }
            let (idle_for, named, suspended) = {
                let st = e.state.lock().expect("session state");
                (
                    now.saturating_duration_since(st.last_used),
                    st.named,
                    st.suspended,
                )
            };
            let unclaimed_after = if e.idle_timeout.is_zero() {
                UNCLAIMED_WITHOUT_IDLE
            } else {
                e.idle_timeout
            };
            if !named && idle_for >= unclaimed_after {
                self.end_in_turn(
                    &e,
                    pb::SessionEnd::Unclaimed,
                    "no request named the session before its first idle timeout",
                )
                .await;
            } else if named && !suspended && !e.idle_timeout.is_zero() && idle_for >= e.idle_timeout
            {
                e.state.lock().expect("session state").suspended = true;
                e.session.suspend().await;
            }
        }
    }

    /// Ends every open session `SHUTDOWN` (plimsolld is stopping).
    pub async fn shutdown(&self) {
        let entries: Vec<Arc<Entry>> = {
            let inner = self.inner.lock().expect("session table");
            inner.live.values().cloned().collect()
        };
        for e in entries {
            self.end(&e, pb::SessionEnd::Shutdown, "plimsolld is stopping")
                .await;
        }
    }
}

pub mod smoke;
