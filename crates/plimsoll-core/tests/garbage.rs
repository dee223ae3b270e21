//! Garbage in, no panic out: deterministic pseudo-random bytes and field values fed to the
//! request path (`decode_request` → `validate_run` → `request_digest`) and to the record
//! path (`stamp` → `check_answer`). The fuzz targets in `fuzz/` explore the same functions
//! without bounds; these run in every `cargo test`.

use plimsoll_core::check::{check_answer, CheckError};
use plimsoll_core::codec::decode_request;
use plimsoll_core::pb::run_request::Payload;
use plimsoll_core::pb::run_response::Result as RunResult;
use plimsoll_core::validate::{validate_run, MAX_REQUEST_BYTES};
use plimsoll_core::{digest, not_dispatched_reason, pb, Reason, Tier};
use prost::Message;

/// xorshift64*: tiny, deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn bool(&mut self) -> bool {
        self.next() & 1 == 1
    }
    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max + 1);
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// Mostly ASCII (including controls, `/`, `.` and NUL), sometimes any scalar value.
    fn string(&mut self, max: usize) -> String {
        let n = self.below(max + 1);
        (0..n)
            .map(|_| {
                if self.below(8) == 0 {
                    char::from_u32(self.next() as u32 % 0x11_0000).unwrap_or('\u{fffd}')
                } else {
                    const SET: &[u8] = b"ab./-_ \0\n\\..x/";
                    if self.bool() {
                        SET[self.below(SET.len())] as char
                    } else {
                        (self.next() % 128) as u8 as char
                    }
                }
            })
            .collect()
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
}

const TIERS: &[&str] = &["", "process", "container", "kernel", "vm", "none", "VM"];

fn random_request(r: &mut Rng) -> pb::RunRequest {
    let files = |r: &mut Rng| {
        (0..r.below(4))
            .map(|_| pb::ProjectFile {
                path: r.string(12),
                content: r.string(40),
            })
            .collect::<Vec<_>>()
    };
    let payload = match r.below(5) {
        0 => None,
        1 => Some(Payload::Javascript(pb::JavaScriptRun {
            code: r.string(40),
            grant_profile: if r.bool() { String::new() } else { r.string(8) },
        })),
        2 => Some(Payload::Project(pb::ProjectRun {
            files: files(r),
            steps: (0..r.below(4)).map(|_| r.string(20)).collect(),
            artifacts: (0..r.below(3)).map(|_| r.string(12)).collect(),
            grant_profile: String::new(),
        })),
        3 => Some(Payload::Module(pb::ModuleRun {
            model: r.string(10),
            rows: (0..r.below(3))
                .map(|_| pb::ModuleRow {
                    values: (0..r.below(4)).map(|_| f64::from_bits(r.next())).collect(),
                })
                .collect(),
            end_time: f64::from_bits(r.next()),
            step: f64::from_bits(r.next()),
        })),
        _ => Some(Payload::Cell(pb::CellRun {
            language: r.string(8),
            code: r.string(30),
            files: files(r),
        })),
    };
    pb::RunRequest {
        protocol: if r.bool() { 5 } else { r.next() as u32 % 8 },
        minimum_isolation: r.pick(TIERS).to_owned(),
        trace_id: r.string(10),
        timeout_ms: r.next() as i32,
        software_rule: r.bool().then(|| pb::SoftwareRule {
            mode: r.pick(&["", "exact", "approved", "other"]).to_owned(),
            identities: (0..r.below(3)).map(|_| r.string(10)).collect(),
        }),
        payload,
    }
}

/// Garbage, or a valid request's bytes with a few bytes overwritten, cut or extended.
fn random_body(r: &mut Rng) -> Vec<u8> {
    if r.below(3) == 0 {
        return r.bytes(300);
    }
    let mut b = random_request(r).encode_to_vec();
    for _ in 0..r.below(4) {
        if !b.is_empty() {
            let i = r.below(b.len());
            b[i] = r.next() as u8;
        }
    }
    match r.below(4) {
        0 if !b.is_empty() => b.truncate(r.below(b.len())),
        1 => b.extend(r.bytes(20)),
        _ => {}
    }
    b
}

#[test]
fn garbage_bodies_are_refused_or_decoded_never_a_panic() {
    let mut r = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut decoded, mut valid, mut refused) = (0, 0, 0);
    for _ in 0..4000 {
        let body = random_body(&mut r);
        match decode_request::<pb::RunRequest>(body.len(), &body[..]) {
            Ok(req) => {
                decoded += 1;
                match validate_run(&req) {
                    Ok(_) => valid += 1,
                    Err(refusal) => {
                        assert_eq!(refusal.reason, Reason::Request, "{}", refusal.message);
                        assert_eq!(
                            not_dispatched_reason(&refusal.to_status()),
                            Some(Reason::Request)
                        );
                    }
                }
                let d = digest::request_digest(&req);
                assert_eq!(d.len(), 64);
                assert_eq!(d, digest::request_digest(&req));
                // Re-encoding is lossless for the digest (bytes compared: rows may hold NaN).
                let again: pb::RunRequest = decode_request(0, &req.encode_to_vec()[..]).unwrap();
                assert_eq!(again.encode_to_vec(), req.encode_to_vec());
                assert_eq!(digest::request_digest(&again), d);
            }
            Err(refusal) => {
                refused += 1;
                assert_eq!(refusal.reason, Reason::Request);
                assert!(refusal.message.contains("decoded"), "{}", refusal.message);
                assert_eq!(
                    not_dispatched_reason(&refusal.to_status()),
                    Some(Reason::Request)
                );
            }
        }
    }
    // The mix must reach every branch, or the test proves little.
    assert!(
        decoded > 400 && valid > 50 && refused > 500,
        "decoded {decoded}, valid {valid}, refused {refused}"
    );
}

#[test]
fn an_oversized_body_is_refused_before_decoding() {
    let r = decode_request::<pb::RunRequest>(MAX_REQUEST_BYTES + 1, &[0u8; 0][..]).unwrap_err();
    assert_eq!(r.reason, Reason::Request);
    assert!(r.message.contains("bytes"), "{}", r.message);
}

fn random_result(r: &mut Rng) -> RunResult {
    // Every kind carries at least one output byte, so a flip always has a target.
    let out = |r: &mut Rng| {
        let mut b = r.bytes(64);
        b.push(r.next() as u8);
        b
    };
    match r.below(4) {
        0 => RunResult::Javascript(pb::JavaScriptResult {
            stdout: out(r),
            stderr: r.bytes(16),
            exit_code: r.next() as i32,
            timed_out: r.bool(),
            stdout_truncated: r.bool(),
            stderr_truncated: r.bool(),
            advice: Vec::new(),
        }),
        1 => RunResult::Project(pb::ProjectResult {
            steps: (0..=r.below(3))
                .map(|_| pb::StepResult {
                    command: r.string(12),
                    stdout: out(r),
                    stderr: r.bytes(16),
                    exit_code: r.next() as i32,
                    timed_out: r.bool(),
                    duration_ms: r.next() as i64,
                    stdout_truncated: r.bool(),
                    stderr_truncated: r.bool(),
                })
                .collect(),
            outcome: r.below(5) as i32,
            artifacts: (0..r.below(3))
                .map(|_| pb::Artifact {
                    path: r.string(10),
                    content: r.bytes(30),
                })
                .collect(),
            outcome_detail: r.string(20),
            artifacts_truncated: r.bool(),
            advice: Vec::new(),
        }),
        2 => RunResult::Module(pb::ModuleResult {
            runs: (0..r.below(3))
                .map(|_| pb::ModuleRowResult {
                    status: r.next() as i32,
                    outputs: (0..r.below(4)).map(|_| f64::from_bits(r.next())).collect(),
                })
                .collect(),
            width: r.next() as i32,
            outcome: r.below(5) as i32,
            outcome_detail: r.string(10),
            stdout: out(r),
            stderr: r.bytes(8),
        }),
        _ => RunResult::Cell(pb::CellResult {
            stdout: out(r),
            stderr: r.bytes(16),
            exit_code: r.next() as i32,
            timed_out: r.bool(),
            stdout_truncated: r.bool(),
            stderr_truncated: r.bool(),
            interpreter_started: r.bool(),
            interpreter_ended: r.bool(),
        }),
    }
}

/// The first stdout byte of whatever kind of result this is.
fn stdout_byte(resp: &mut pb::RunResponse) -> &mut u8 {
    let b = match resp.result.as_mut().unwrap() {
        RunResult::Javascript(j) => &mut j.stdout,
        RunResult::Project(p) => &mut p.steps[0].stdout,
        RunResult::Module(m) => &mut m.stdout,
        RunResult::Cell(c) => &mut c.stdout,
    };
    b.first_mut().unwrap()
}

#[test]
fn stamped_answers_pass_the_check_and_a_flipped_stdout_byte_fails_it() {
    let mut r = Rng(0xD1B5_4A32_D192_ED03);
    for i in 0..2000 {
        let mut req = random_request(&mut r);
        // A floor the answer's tier meets (invalid floors are refused before any run).
        let floor = Tier::ALL[r.below(4)];
        req.minimum_isolation = if r.bool() {
            floor.to_string()
        } else {
            String::new()
        };
        let tier = Tier::ALL[floor as usize + r.below(4 - floor as usize)];
        let mut resp = pb::RunResponse {
            sandbox: r.pick(&["process", "docker", "agentsandbox"]).to_owned(),
            isolation: tier.to_string(),
            duration_ms: r.next() as i64,
            record: None,
            software_identity: if r.bool() {
                String::new()
            } else {
                r.string(20)
            },
            environment: r.string(20),
            result: Some(random_result(&mut r)),
        };
        // A daemon runs only under an identity the request's rule allows (else it refuses
        // before running): the answer's identity is one of the rule's.
        if let Some(rule) = req.software_rule.as_mut().filter(|r| !r.mode.is_empty()) {
            // (An empty identity satisfies no rule.)
            if rule.identities.iter().all(String::is_empty) {
                rule.identities.push(r.string(10) + "x");
            }
            let usable: Vec<&String> = rule.identities.iter().filter(|i| !i.is_empty()).collect();
            resp.software_identity = usable[r.below(usable.len())].clone();
        }
        let started = r.next() as i64;
        let ended = r.next() as i64;
        digest::stamp(&req, &mut resp, &r.string(10), started, ended);
        check_answer(&req, &resp).unwrap_or_else(|e| panic!("answer {i}: {e}"));

        // What a client receives is the wire form: it must check the same.
        let wire = pb::RunResponse::decode(&resp.encode_to_vec()[..]).unwrap();
        check_answer(&req, &wire).unwrap_or_else(|e| panic!("answer {i} after the wire: {e}"));

        let mut tampered = resp.clone();
        let bit = 1u8 << r.below(8);
        *stdout_byte(&mut tampered) ^= bit;
        match check_answer(&req, &tampered) {
            Err(CheckError::Mismatch { field, .. }) => assert_eq!(field, "result_sha256"),
            other => panic!("answer {i}: a flipped stdout byte gave {other:?}"),
        }
    }
}

#[test]
fn an_identity_outside_the_rule_fails_the_check_even_when_stamped() {
    let mut r = Rng(0x5EED_0F5A_F7E6_0006);
    let mut refused = 0;
    for i in 0..1000 {
        let mut req = random_request(&mut r);
        req.minimum_isolation = String::new();
        let allowed: Vec<String> = (0..=r.below(3)).map(|_| r.string(12) + "a").collect();
        req.software_rule = Some(pb::SoftwareRule {
            mode: if allowed.len() == 1 {
                "exact"
            } else {
                "approved"
            }
            .to_owned(),
            identities: allowed.clone(),
        });
        // Another identity (never one of the rule's: they end in "a"), or none at all.
        let other = if r.bool() {
            String::new()
        } else {
            r.string(12) + "b"
        };
        let mut resp = pb::RunResponse {
            sandbox: "docker".into(),
            isolation: "container".into(),
            software_identity: other.clone(),
            result: Some(random_result(&mut r)),
            ..Default::default()
        };
        digest::stamp(&req, &mut resp, "", 0, 1);
        match check_answer(&req, &resp) {
            Err(CheckError::SoftwareNotInRule { identity, .. }) => {
                assert_eq!(identity, other);
                refused += 1;
            }
            other => panic!("answer {i}: an identity outside the rule gave {other:?}"),
        }
        // The same answer under an identity the rule allows passes.
        resp.software_identity = allowed[r.below(allowed.len())].clone();
        digest::stamp(&req, &mut resp, "", 0, 1);
        check_answer(&req, &resp).unwrap_or_else(|e| panic!("answer {i}: {e}"));
    }
    assert_eq!(refused, 1000);
}

#[test]
fn an_answer_below_the_floor_fails_the_check_even_when_stamped() {
    let mut r = Rng(0x0123_4567_89AB_CDEF);
    for _ in 0..500 {
        let mut req = random_request(&mut r);
        req.software_rule = None;
        let floor = Tier::ALL[1 + r.below(3)];
        req.minimum_isolation = floor.to_string();
        let below = Tier::ALL[r.below(floor as usize)];
        let mut resp = pb::RunResponse {
            sandbox: "process".into(),
            isolation: below.to_string(),
            result: Some(random_result(&mut r)),
            ..Default::default()
        };
        digest::stamp(&req, &mut resp, "", 0, 1);
        assert!(
            matches!(
                check_answer(&req, &resp),
                Err(CheckError::BelowFloor { .. })
            ),
            "{below} passed a floor of {floor}"
        );
    }
}

/// Proto3 JSON must give back the very double it was given, or a digest recomputed from
/// JSON (`plimsoll record digest`, auditors in other languages) would not match the one
/// computed from protobuf. Found by `fuzz/digest_inputs` (serde_json's default float
/// parser is off by one unit in the last place for some inputs).
#[test]
fn proto3_json_round_trips_every_double_exactly() {
    let mut r = Rng(0x2545_F491_4F6C_DD1D);
    let mut tried = 0;
    let mut values = vec![8.674_332_576_244_311e-308_f64];
    while values.len() < 20_000 {
        let v = f64::from_bits(r.next());
        if v.is_finite() {
            values.push(v);
        }
    }
    for v in values {
        let json = format!(r#"{{"module":{{"model":"m","endTime":{v:e}}}}}"#);
        let req: pb::RunRequest = serde_json::from_str(&json).unwrap();
        let again: pb::RunRequest =
            serde_json::from_str(&serde_json::to_string(&req).unwrap()).unwrap();
        assert_eq!(
            digest::request_digest(&req),
            digest::request_digest(&again),
            "{json}"
        );
        tried += 1;
    }
    assert_eq!(tried, 20_000);
}
