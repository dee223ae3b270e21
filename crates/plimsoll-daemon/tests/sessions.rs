//! The session table and the three session calls, through the real gRPC listener and the
//! real client library, on a scripted session provider: its calls answer what their code
//! says (`fail` may have run without an answer, `refuse` ran nothing, `disk` ends the
//! session, `sleep:N` takes N ms), so every end reason and failure path can be produced
//! on purpose. The real providers' behaviour (sweeps, files, interpreters) is tested
//! against the process provider in `sessions_process.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use plimsoll_client::{Client, ClientError, ClientOptions, Session};
use plimsoll_core::pb::{self, session_run_request::Payload};
use plimsoll_core::{not_dispatched_reason, session_ended, Reason, Refusal, Tier};
use plimsoll_daemon::server::start_with;
use plimsoll_daemon::RunningDaemon;
use plimsoll_provider::{
    Answer, Facts, Provider, ProviderError, ProviderSession, ProviderStartError, SessionAnswer,
    SessionCallOutcome, SessionEndCause, SessionEnded, SessionProvider, SessionSpec, SessionWork,
    Work,
};
use plimsoll_testkit::daemon::{authed, client, Setup};

#[derive(Default)]
struct Counts {
    opened: AtomicUsize,
    closed: AtomicUsize,
    suspended: AtomicUsize,
    calls: AtomicUsize,
}

struct Scripted(Arc<Counts>);

struct ScriptedSession(Arc<Counts>);

#[async_trait::async_trait]
impl Provider for Scripted {
    fn facts(&self) -> Facts {
        Facts {
            name: "scripted".into(),
            tier: Some(Tier::Process),
            languages: vec!["javascript".into(), "shell".into()],
            supports_project: true,
            max_timeout_ms: 300_000,
            ..Default::default()
        }
    }
    async fn start(&self) -> Result<(), ProviderStartError> {
        Ok(())
    }
    async fn ready(&self) -> bool {
        true
    }
    async fn run(&self, _: Work, _: Duration) -> Result<Answer, ProviderError> {
        Err(Refusal::unsupported("runs are not scripted").into())
    }
    fn sessions(&self) -> Option<&dyn SessionProvider> {
        Some(self)
    }
}

#[async_trait::async_trait]
impl SessionProvider for Scripted {
    async fn open(&self, _: SessionSpec) -> Result<Box<dyn ProviderSession>, ProviderError> {
        self.0.opened.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(ScriptedSession(self.0.clone())))
    }
}

fn js_answer(out: &str) -> SessionAnswer {
    SessionAnswer::Run(Answer::Javascript(pb::JavaScriptResult {
        stdout: out.as_bytes().to_vec(),
        ..Default::default()
    }))
}

#[async_trait::async_trait]
impl ProviderSession for ScriptedSession {
    async fn call(&self, work: SessionWork, _: Duration) -> SessionCallOutcome {
        self.0.calls.fetch_add(1, Ordering::SeqCst);
        let ok = |a| SessionCallOutcome {
            answer: Ok(a),
            ended: None,
        };
        match work {
            SessionWork::Run(Work::Project(p)) => {
                ok(SessionAnswer::Run(Answer::Project(pb::ProjectResult {
                    outcome: pb::ProjectOutcome::Completed as i32,
                    steps: p
                        .steps
                        .iter()
                        .map(|s| pb::StepResult {
                            command: s.clone(),
                            // The startup smoke test's descriptor listing: a clean table.
                            stdout: if s == plimsoll_provider::smoke::DESCRIPTOR_STEP {
                                b"total 0\nlr-x------ 1 0 0 64 Dec  5 12:00 0 -> /dev/null\ndescriptors-listed\n".to_vec()
                            } else {
                                Vec::new()
                            },
                            exit_code: s
                                .strip_prefix("exit ")
                                .and_then(|n| n.parse().ok())
                                .unwrap_or(0),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })))
            }
            SessionWork::Cell(c) => ok(SessionAnswer::Cell(pb::CellResult {
                stdout: if c.code.ends_with("+ 1") {
                    b"42\n".to_vec()
                } else {
                    Vec::new()
                },
                ..Default::default()
            })),
            SessionWork::Run(Work::Javascript(js)) => match js.code.as_str() {
                "fail" => SessionCallOutcome {
                    answer: Err(ProviderError::Failed(
                        "the scripted call lost its answer".into(),
                    )),
                    ended: None,
                },
                "refuse" => SessionCallOutcome {
                    answer: Err(Refusal::environment("the scripted call ran nothing").into()),
                    ended: None,
                },
                "boundary" => SessionCallOutcome {
                    answer: Ok(js_answer("left something\n")),
                    ended: Some(SessionEnded {
                        cause: SessionEndCause::BoundaryFailed,
                        detail: "the sweep could not prove that no process of the call is left"
                            .into(),
                    }),
                },
                "changed" => SessionCallOutcome {
                    answer: Err(Refusal::environment("the read-back found another sandbox").into()),
                    ended: Some(SessionEnded {
                        cause: SessionEndCause::SandboxChanged,
                        detail: "the working directory was replaced".into(),
                    }),
                },
                "disk" => SessionCallOutcome {
                    answer: Ok(js_answer("wrote too much\n")),
                    ended: Some(SessionEnded {
                        cause: SessionEndCause::DiskExceeded,
                        detail: "the session's files take 2 MiB, over its 1 MiB".into(),
                    }),
                },
                code => {
                    if let Some(ms) = code.strip_prefix("sleep:") {
                        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
                    }
                    ok(js_answer(code))
                }
            },
        }
    }
    async fn suspend(&self) {
        self.0.suspended.fetch_add(1, Ordering::SeqCst);
    }
    async fn close(&self) {
        self.0.closed.fetch_add(1, Ordering::SeqCst);
    }
}

struct Fixture {
    daemon: RunningDaemon,
    counts: Arc<Counts>,
    setup: Setup,
}

impl Fixture {
    /// Room for four sessions, all of which one caller may hold (these tests open several
    /// as one caller; the default per-caller cap would be one).
    async fn start(extra: &[(&str, &str)]) -> Fixture {
        let mut pairs = vec![
            ("SANDBOX_MAX_SESSIONS", "4"),
            ("SANDBOX_MAX_SESSIONS_PER_CALLER", "4"),
        ];
        pairs.extend_from_slice(extra);
        Fixture::with(&pairs).await
    }
    /// Exactly `pairs` (and the callers).
    async fn with(pairs: &[(&str, &str)]) -> Fixture {
        let setup = Setup::new(&[("alice", &[]), ("bob", &[])]);
        let cfg = setup.config(pairs).expect("config");
        let counts = Arc::new(Counts::default());
        let daemon = start_with(cfg, Arc::new(Scripted(counts.clone())))
            .await
            .expect("the daemon starts");
        // The startup smoke test used one session; count from here.
        for c in [&counts.opened, &counts.closed, &counts.calls] {
            c.store(0, Ordering::SeqCst);
        }
        Fixture {
            daemon,
            counts,
            setup,
        }
    }
    async fn client(&self, who: usize) -> Client {
        Client::connect(
            &format!("http://{}", self.daemon.rpc_addr()),
            ClientOptions {
                token: Some(self.setup.token(who).to_owned()),
                ca_file: None,
            },
        )
        .await
        .expect("connect")
    }
}

fn open() -> pb::OpenSessionRequest {
    pb::OpenSessionRequest {
        protocol: 5,
        ..Default::default()
    }
}

fn call(code: &str) -> pb::SessionRunRequest {
    pb::SessionRunRequest {
        protocol: 5,
        timeout_ms: 20_000,
        payload: Some(Payload::Javascript(pb::JavaScriptRun {
            code: code.into(),
            grant_profile: String::new(),
        })),
        ..Default::default()
    }
}

fn raw_call(id: &str, code: &str) -> pb::SessionRunRequest {
    pb::SessionRunRequest {
        session_id: id.into(),
        ..call(code)
    }
}

fn refused(e: &ClientError) -> Option<Reason> {
    e.not_dispatched()
}

#[tokio::test]
async fn calls_chain_and_close_answers_the_counts() {
    let f = Fixture::start(&[]).await;
    let mut c = f.client(0).await;
    let mut s = c.open_session(open()).await.unwrap();
    assert_eq!(s.opened().sandbox, "scripted");
    assert_eq!(s.opened().isolation, "process");
    let mut digests = Vec::new();
    for i in 1..=3u64 {
        let a = c
            .session_run(&mut s, call(&format!("call {i}")))
            .await
            .unwrap();
        let rec = a.run.unwrap().record.unwrap();
        assert_eq!(rec.session, s.fingerprint());
        assert_eq!(rec.sequence, i);
        assert_eq!(
            rec.previous_sha256,
            digests.last().cloned().unwrap_or_default()
        );
        digests.push(rec.record_sha256);
    }
    // The id is never the fingerprint, and the fingerprint is its SHA-256.
    assert_ne!(s.id(), s.fingerprint());
    let closed = c.close_session(&s).await.unwrap();
    assert_eq!(closed.calls, 3);
    assert_eq!(closed.last_record_sha256, digests[2]);
    assert_eq!(closed.ended(), pb::SessionEnd::Closed);
    assert_eq!(f.counts.closed.load(Ordering::SeqCst), 1);
    // A second close collects the same counts from the tombstone.
    let again = c.close_session(&s).await.unwrap();
    assert_eq!((again.calls, again.ended()), (3, pb::SessionEnd::Closed));
    // A call on the closed session is refused, marked, naming the end.
    let e = c.session_run(&mut s, call("late")).await.unwrap_err();
    assert_eq!(refused(&e), Some(Reason::Request));
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn another_callers_id_gets_the_same_not_found_as_an_unknown_one() {
    let f = Fixture::start(&[]).await;
    let mut alice = f.client(0).await;
    let s = alice.open_session(open()).await.unwrap();
    let mut raw = client(&f.daemon).await;
    let bob = f.setup.token(1);
    let theirs = raw
        .session_run(authed(raw_call(s.id(), "x"), bob))
        .await
        .unwrap_err();
    let unknown = raw
        .session_run(authed(raw_call(&"0".repeat(32), "x"), bob))
        .await
        .unwrap_err();
    let malformed = raw
        .session_run(authed(raw_call("not-an-id", "x"), bob))
        .await
        .unwrap_err();
    for st in [&theirs, &unknown, &malformed] {
        assert_eq!(st.code(), tonic::Code::NotFound);
        assert_eq!(st.message(), unknown.message());
        assert_eq!(not_dispatched_reason(st), Some(Reason::Request));
        assert_eq!(
            session_ended(st).unwrap().reason(),
            pb::SessionEnd::NotFound
        );
    }
    let close = raw
        .close_session(authed(
            pb::CloseSessionRequest {
                protocol: 5,
                session_id: s.id().into(),
            },
            bob,
        ))
        .await
        .unwrap_err();
    assert_eq!(close.code(), tonic::Code::NotFound);
    // Bob's attempts touched nothing of Alice's session.
    assert_eq!(f.counts.calls.load(Ordering::SeqCst), 0);
    assert_eq!(alice.close_session(&s).await.unwrap().calls, 0);
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn one_call_runs_one_waits_a_third_is_refused_capacity() {
    let f = Fixture::start(&[]).await;
    let mut c = f.client(0).await;
    let s = c.open_session(open()).await.unwrap();
    let token = f.setup.token(0).to_owned();
    let addr = f.daemon.rpc_addr();
    let send = |code: &'static str| {
        let (id, token) = (s.id().to_owned(), token.clone());
        tokio::spawn(async move {
            let mut raw = plimsoll_core::pb::sandbox_service_client::SandboxServiceClient::connect(
                format!("http://{addr}"),
            )
            .await
            .unwrap();
            raw.session_run(authed(raw_call(&id, code), &token)).await
        })
    };
    let running = send("sleep:800");
    tokio::time::sleep(Duration::from_millis(150)).await;
    let waiting = send("sleep:1");
    tokio::time::sleep(Duration::from_millis(150)).await;
    let third = send("sleep:1").await.unwrap().unwrap_err();
    assert_eq!(third.code(), tonic::Code::ResourceExhausted);
    assert_eq!(not_dispatched_reason(&third), Some(Reason::Capacity));
    let first = running.await.unwrap().unwrap().into_inner();
    let second = waiting.await.unwrap().unwrap().into_inner();
    assert_eq!(first.run.unwrap().record.unwrap().sequence, 1);
    assert_eq!(second.run.unwrap().record.unwrap().sequence, 2);
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn a_lost_answer_is_an_unanswered_record_and_the_session_goes_on() {
    let f = Fixture::start(&[]).await;
    let mut c = f.client(0).await;
    let mut s = c.open_session(open()).await.unwrap();
    c.session_run(&mut s, call("first")).await.unwrap();
    let e = c.session_run(&mut s, call("fail")).await.unwrap_err();
    let ClientError::Unanswered { record, status } = &e else {
        panic!("expected an unanswered record, got {e}")
    };
    assert_eq!(status.code(), tonic::Code::Internal);
    assert_eq!(not_dispatched_reason(status), None);
    assert_eq!(record.version, 3);
    assert_eq!(record.unanswered, "internal");
    assert!(record.result_sha256.is_empty());
    assert_eq!(record.sequence, 2);
    // A refusal that ran nothing is not counted.
    let r = c.session_run(&mut s, call("refuse")).await.unwrap_err();
    assert_eq!(refused(&r), Some(Reason::Environment));
    let third = c.session_run(&mut s, call("third")).await.unwrap();
    let rec = third.run.unwrap().record.unwrap();
    assert_eq!(rec.sequence, 3);
    assert_eq!(rec.previous_sha256, record.record_sha256);
    assert_eq!(c.close_session(&s).await.unwrap().calls, 3);
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn an_unfollowable_chain_refuses_later_calls_before_sending() {
    let f = Fixture::start(&[]).await;
    let mut c = f.client(0).await;
    let mut s = c.open_session(open()).await.unwrap();
    c.session_run(&mut s, call("one")).await.unwrap();
    // The caller's stored position is one call behind the daemon's: the next answer is
    // not the link this client expects.
    let mut stale = Session::resume(s.id().into(), s.opened().clone(), 0, String::new());
    let e = c.session_run(&mut stale, call("two")).await.unwrap_err();
    assert!(
        matches!(
            &e,
            ClientError::Check {
                error: plimsoll_core::check::CheckError::Chain {
                    field: "sequence",
                    ..
                },
                ..
            }
        ),
        "{e}"
    );
    let before = f.counts.calls.load(Ordering::SeqCst);
    let e = c.session_run(&mut stale, call("three")).await.unwrap_err();
    assert!(matches!(e, ClientError::ChainLost { .. }), "{e}");
    assert_eq!(refused(&e), Some(Reason::Request));
    assert_eq!(
        f.counts.calls.load(Ordering::SeqCst),
        before,
        "nothing was sent"
    );
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn a_provider_end_is_answered_then_refuses_and_is_collectable() {
    let f = Fixture::start(&[]).await;
    let mut c = f.client(0).await;
    let mut s = c.open_session(open()).await.unwrap();
    let a = c.session_run(&mut s, call("disk")).await.unwrap();
    assert_eq!(a.ended(), pb::SessionEnd::DiskExceeded);
    assert!(a.end_detail.contains("MiB"));
    assert!(
        a.run.is_some(),
        "the call that ended the session is still answered"
    );
    let e = c.session_run(&mut s, call("after")).await.unwrap_err();
    let ClientError::Refused { status, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        session_ended(status).unwrap().reason(),
        pb::SessionEnd::DiskExceeded
    );
    let closed = c.close_session(&s).await.unwrap();
    assert_eq!(
        (closed.calls, closed.ended()),
        (1, pb::SessionEnd::DiskExceeded)
    );
    assert_eq!(f.counts.closed.load(Ordering::SeqCst), 1);
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn caps_refuse_capacity_and_an_owner_replaces_its_least_recently_used() {
    let f = Fixture::start(&[
        ("SANDBOX_MAX_SESSIONS", "3"),
        ("SANDBOX_MAX_SESSIONS_PER_CALLER", "2"),
        ("SANDBOX_MAX_SESSIONS_PER_OWNER", "2"),
    ])
    .await;
    let (mut alice, mut bob) = (f.client(0).await, f.client(1).await);
    let owned = |o: &str| pb::OpenSessionRequest {
        owner: o.into(),
        ..open()
    };
    let mut a1 = alice.open_session(owned("user-1")).await.unwrap();
    let mut a2 = alice.open_session(owned("user-1")).await.unwrap();
    // a1 is used after a2, so a2 is the least recently used.
    alice.session_run(&mut a2, call("x")).await.unwrap();
    alice.session_run(&mut a1, call("x")).await.unwrap();
    let a3 = alice.open_session(owned("user-1")).await.unwrap();
    let e = alice.session_run(&mut a2, call("x")).await.unwrap_err();
    let ClientError::Refused { status, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(
        session_ended(status).unwrap().reason(),
        pb::SessionEnd::Replaced
    );
    alice
        .session_run(&mut a1, call("still here"))
        .await
        .unwrap();
    // Per caller: alice holds a1 and a3.
    let e = alice.open_session(owned("user-2")).await.unwrap_err();
    assert_eq!(refused(&e), Some(Reason::Capacity));
    // Daemon-wide: three open.
    let _b1 = bob.open_session(open()).await.unwrap();
    let e = bob.open_session(open()).await.unwrap_err();
    assert_eq!(refused(&e), Some(Reason::Capacity));
    // A malformed owner is a request refusal.
    let e = bob.open_session(owned("no spaces")).await.unwrap_err();
    assert_eq!(refused(&e), Some(Reason::Request));
    let _ = a3;
    f.daemon.shutdown().await;
    assert_eq!(
        f.counts.closed.load(Ordering::SeqCst),
        4,
        "shutdown closed every session"
    );
}

#[tokio::test]
async fn per_caller_cap_defaults_to_a_quarter_of_the_sessions() {
    // No SANDBOX_MAX_SESSIONS_PER_CALLER: a quarter of 8 is 2 per caller.
    let f = Fixture::with(&[("SANDBOX_MAX_SESSIONS", "8")]).await;
    let (mut alice, mut bob) = (f.client(0).await, f.client(1).await);
    let a1 = alice.open_session(open()).await.unwrap();
    let a2 = alice.open_session(open()).await.unwrap();
    let e = alice.open_session(open()).await.unwrap_err();
    assert_eq!(refused(&e), Some(Reason::Capacity), "{e}");
    assert!(
        e.to_string()
            .contains("its limit (SANDBOX_MAX_SESSIONS_PER_CALLER)"),
        "{e}"
    );
    // Another caller still opens; Describe states the cap.
    let b1 = bob.open_session(open()).await.unwrap();
    let d = bob.describe().await.unwrap();
    assert_eq!(d.max_sessions_per_caller, 2);
    // Closing one frees alice's slot.
    alice.close_session(&a1).await.unwrap();
    let a3 = alice.open_session(open()).await.unwrap();
    let _ = (a2, a3, b1);
    f.daemon.shutdown().await;

    // An explicit 0 is the opt-out: no cap of its own beyond SANDBOX_MAX_SESSIONS.
    let f = Fixture::with(&[
        ("SANDBOX_MAX_SESSIONS", "4"),
        ("SANDBOX_MAX_SESSIONS_PER_CALLER", "0"),
    ])
    .await;
    let mut alice = f.client(0).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(alice.open_session(open()).await.unwrap());
    }
    let e = alice.open_session(open()).await.unwrap_err();
    assert_eq!(refused(&e), Some(Reason::Capacity), "{e}");
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn lifetime_and_unclaimed_end_sessions_and_idle_suspends() {
    let f = Fixture::start(&[("SANDBOX_SESSION_IDLE_MS", "1000")]).await;
    let mut c = f.client(0).await;
    let mut short = c
        .open_session(pb::OpenSessionRequest {
            lifetime_ms: 1200,
            ..open()
        })
        .await
        .unwrap();
    c.session_run(&mut short, call("named")).await.unwrap();
    let unclaimed = c.open_session(open()).await.unwrap();
    let mut named = c.open_session(open()).await.unwrap();
    c.session_run(&mut named, call("named")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let closed = c.close_session(&short).await.unwrap();
    assert_eq!(closed.ended(), pb::SessionEnd::Expired);
    let closed = c.close_session(&unclaimed).await.unwrap();
    assert_eq!(closed.ended(), pb::SessionEnd::Unclaimed);
    assert!(
        f.counts.suspended.load(Ordering::SeqCst) >= 1,
        "the named idle session was suspended"
    );
    // A suspended session resumes on its next call.
    let a = c.session_run(&mut named, call("again")).await.unwrap();
    assert_eq!(a.run.unwrap().record.unwrap().sequence, 2);
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn bad_opens_and_calls_are_marked_refusals() {
    let f = Fixture::start(&[]).await;
    let mut c = f.client(0).await;
    for (req, reason) in [
        (
            pb::OpenSessionRequest {
                minimum_isolation: "container".into(),
                ..open()
            },
            Reason::Isolation,
        ),
        (
            pb::OpenSessionRequest {
                languages: vec!["cobol".into()],
                ..open()
            },
            Reason::Request,
        ),
        (
            pb::OpenSessionRequest {
                idle_timeout_ms: 10,
                ..open()
            },
            Reason::Request,
        ),
        (
            pb::OpenSessionRequest {
                protocol: 4,
                ..open()
            },
            Reason::Protocol,
        ),
    ] {
        let e = c.open_session(req).await.unwrap_err();
        assert_eq!(refused(&e), Some(reason), "{e}");
    }
    let mut s = c.open_session(open()).await.unwrap();
    let floor = pb::SessionRunRequest {
        minimum_isolation: "kernel".into(),
        ..call("x")
    };
    let e = c.session_run(&mut s, floor).await.unwrap_err();
    assert_eq!(refused(&e), Some(Reason::Isolation));
    let granted = pb::SessionRunRequest {
        payload: Some(Payload::Javascript(pb::JavaScriptRun {
            code: "x".into(),
            grant_profile: "memory".into(),
        })),
        ..call("x")
    };
    assert_eq!(
        refused(&c.session_run(&mut s, granted).await.unwrap_err()),
        Some(Reason::Unsupported)
    );
    let python = pb::SessionRunRequest {
        payload: Some(Payload::Cell(pb::CellRun {
            language: "python".into(),
            code: "1".into(),
            files: Vec::new(),
        })),
        ..call("x")
    };
    assert_eq!(
        refused(&c.session_run(&mut s, python).await.unwrap_err()),
        Some(Reason::Unsupported)
    );
    let empty = pb::SessionRunRequest {
        payload: None,
        ..call("x")
    };
    assert_eq!(
        refused(&c.session_run(&mut s, empty).await.unwrap_err()),
        Some(Reason::Request)
    );
    // A cell through Run is refused as a request.
    let mut raw = client(&f.daemon).await;
    let cell_run = pb::RunRequest {
        protocol: 5,
        payload: Some(pb::run_request::Payload::Cell(pb::CellRun {
            language: "javascript".into(),
            code: "1".into(),
            files: Vec::new(),
        })),
        ..Default::default()
    };
    let st = raw
        .run(authed(cell_run, f.setup.token(0)))
        .await
        .unwrap_err();
    assert_eq!(not_dispatched_reason(&st), Some(Reason::Request));
    // None of the refusals was counted.
    assert_eq!(f.counts.calls.load(Ordering::SeqCst), 0);
    assert_eq!(c.close_session(&s).await.unwrap().calls, 0);
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn describe_states_sessions() {
    let f = Fixture::start(&[
        ("SANDBOX_MAX_SESSIONS_PER_CALLER", "2"),
        ("SANDBOX_SESSION_LIFETIME_MS", "60000"),
    ])
    .await;
    let d = f.client(0).await.describe().await.unwrap();
    assert!(d.supports_sessions);
    assert_eq!(d.session_lifetime_ms, 60_000);
    assert_eq!(d.session_idle_timeout_ms, 300_000);
    assert_eq!(d.max_sessions_per_caller, 2);
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn sessions_off_answer_unsupported_and_a_provider_without_sessions_does_not_start() {
    let setup = Setup::tester();
    let daemon = setup.start(&[]).await;
    let mut c = Client::connect(
        &format!("http://{}", daemon.rpc_addr()),
        ClientOptions {
            token: Some(setup.token(0).into()),
            ca_file: None,
        },
    )
    .await
    .unwrap();
    let e = c.open_session(open()).await.unwrap_err();
    assert_eq!(refused(&e), Some(Reason::Unsupported));
    assert!(!c.describe().await.unwrap().supports_sessions);
    daemon.shutdown().await;
    // The disabled provider keeps no sessions.
    let cfg = setup
        .config(&[("SANDBOX_PROVIDER", ""), ("SANDBOX_MAX_SESSIONS", "2")])
        .unwrap();
    let err = plimsoll_daemon::start(cfg).await.err().expect("refused");
    assert_eq!(err.exit_code(), 2, "{err}");
    assert!(err.to_string().contains("SANDBOX_MAX_SESSIONS"), "{err}");
}

#[tokio::test]
async fn boundary_failed_and_sandbox_changed_end_the_session() {
    let f = Fixture::start(&[]).await;
    let mut c = f.client(0).await;
    let mut s = c.open_session(open()).await.unwrap();
    let a = c.session_run(&mut s, call("boundary")).await.unwrap();
    assert_eq!(a.ended(), pb::SessionEnd::BoundaryFailed);
    assert_eq!(
        c.close_session(&s).await.unwrap().ended(),
        pb::SessionEnd::BoundaryFailed
    );
    // A read-back difference: the call ran nothing (marked, not counted) and the session ends.
    let mut s = c.open_session(open()).await.unwrap();
    let e = c.session_run(&mut s, call("changed")).await.unwrap_err();
    let ClientError::Refused { reason, status } = &e else {
        panic!("{e}")
    };
    assert_eq!(*reason, Reason::Environment);
    assert_eq!(
        session_ended(status).unwrap().reason(),
        pb::SessionEnd::SandboxChanged
    );
    let closed = c.close_session(&s).await.unwrap();
    assert_eq!(
        (closed.calls, closed.ended()),
        (0, pb::SessionEnd::SandboxChanged)
    );
    f.daemon.shutdown().await;
}
