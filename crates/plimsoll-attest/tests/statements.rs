//! Signed records and statements: the exact statement bytes (§3.10 member order, omitted
//! empties, Go escapes), and the decoder's refusals (unknown members, wrong types, shape,
//! version rules, digests that do not agree).

mod common;

use common::*;
use plimsoll_attest::dsse::Envelope;
use plimsoll_attest::statement::{decode_statement, record_statement, Statement};
use plimsoll_attest::{sign_record, verify_record, AttestError, SigningKey};
use plimsoll_core::digest::record_digest;
use plimsoll_core::pb;

fn rec() -> pb::RunRecord {
    run("console.log(1)", "1\n").1.record.unwrap()
}

#[test]
fn the_record_statement_has_go_bytes() {
    let mut r = pb::RunRecord {
        version: 2,
        request_sha256: "aa".into(),
        result_sha256: "bb".into(),
        provider: "docker".into(),
        isolation: "container".into(),
        environment: "img<1>&\u{2028}".into(),
        policy: "p".into(),
        started_unix_ms: -1,
        ended_unix_ms: 5,
        ..Default::default()
    };
    r.record_sha256 = "cc".into();
    let want = concat!(
        r#"{"_type":"https://in-toto.io/Statement/v1","subject":[{"name":"run-record","digest":{"sha256":"cc"}}],"#,
        r#""predicateType":"https://plimsollmark.github.io/plimsoll/run-record/v1","predicate":{"version":2,"request_sha256":"aa","result_sha256":"bb","provider":"docker","isolation":"container","environment":"img\u003c1\u003e\u0026\u2028","policy":"p","started_unix_ms":-1,"ended_unix_ms":5,"session":"","sequence":0,"previous_sha256":"","record_sha256":"cc"}}"#
    );
    assert_eq!(String::from_utf8(record_statement(&r)).unwrap(), want);

    r.software_identity = "sha256:x".into();
    r.software_rule_id = "exact:sha256:x".into();
    r.version = 3;
    r.unanswered = "internal".into();
    r.session = "s".into();
    r.sequence = 7;
    let got = String::from_utf8(record_statement(&r)).unwrap();
    assert!(got.contains(r#""environment":"img\u003c1\u003e\u0026\u2028","software_identity":"sha256:x","software_rule_id":"exact:sha256:x","policy":"p""#), "{got}");
    assert!(got.ends_with(r#""session":"s","sequence":7,"previous_sha256":"","unanswered":"internal","record_sha256":"cc"}}"#), "{got}");
}

#[test]
fn sign_and_verify_a_record() {
    let key = SigningKey::generate().unwrap();
    let r = rec();
    let env = sign_record(&key, &r).unwrap();
    let back = Envelope::from_json(env.to_json().as_bytes()).unwrap();
    assert_eq!(verify_record(&back, &key.public()).unwrap(), r);
    let other = SigningKey::generate().unwrap();
    assert!(matches!(
        verify_record(&back, &other.public()),
        Err(AttestError::Signature(_))
    ));
}

#[test]
fn signing_refuses_what_it_must_not_sign() {
    let key = SigningKey::generate().unwrap();
    let mut r = rec();
    r.record_sha256 = "0".repeat(64);
    assert!(matches!(
        sign_record(&key, &r),
        Err(AttestError::NotSigned(_))
    ));
    for (version, unanswered) in [(1, ""), (3, ""), (2, "internal"), (4, "")] {
        let mut r = rec();
        r.version = version;
        r.unanswered = unanswered.into();
        r.record_sha256 = record_digest(&r);
        assert!(
            matches!(sign_record(&key, &r), Err(AttestError::NotSigned(_))),
            "version {version} unanswered {unanswered:?}"
        );
    }
}

fn statement_json(r: &pb::RunRecord) -> String {
    String::from_utf8(record_statement(r)).unwrap()
}

fn refused(json: &str) -> String {
    match decode_statement(json.as_bytes()) {
        Err(AttestError::Statement(m)) => m,
        other => panic!("{json} decoded: {other:?}"),
    }
}

#[test]
fn the_decoder_refuses_malformed_statements() {
    let r = rec();
    let good = statement_json(&r);
    assert_eq!(
        decode_statement(good.as_bytes()).unwrap(),
        Statement::Record(Box::new(r.clone()))
    );

    // Unknown members at every level.
    refused(&good.replacen("{\"_type\"", "{\"x\":1,\"_type\"", 1));
    refused(&good.replace("\"predicate\":{", "\"predicate\":{\"extra\":true,"));
    refused(&good.replace("{\"name\":", "{\"uri\":\"u\",\"name\":"));
    // Wrong types.
    refused(&good.replace("\"version\":2", "\"version\":\"2\""));
    refused(&good.replace("\"version\":2", "\"version\":2.0"));
    refused(&good.replace("\"sequence\":0", "\"sequence\":-1"));
    refused(&good.replace("\"provider\":\"process\"", "\"provider\":null"));
    // A missing required member.
    refused(&good.replace("\"policy\":\"\",", ""));
    // Shape.
    refused(&good.replace(
        "https://in-toto.io/Statement/v1",
        "https://in-toto.io/Statement/v0.1",
    ));
    refused(&good.replace("run-record/v1", "run-record/v2"));
    refused(&good.replace("\"name\":\"run-record\"", "\"name\":\"session\""));
    let two = good.replace(
        "}}],",
        "}},{\"name\":\"run-record\",\"digest\":{\"sha256\":\"x\"}}],",
    );
    assert!(refused(&two).contains("subjects"));
    refused(&good.replace("{\"sha256\":", "{\"sha512\":\"x\",\"sha256\":"));
    // The subject is not the record digest; the record digest does not recompute.
    let other = "0".repeat(64);
    let m = refused(&good.replacen(&r.record_sha256, &other, 1));
    assert!(m.contains("subject digest"), "{m}");
    let m = refused(&good.replace("\"ended_unix_ms\":1005", "\"ended_unix_ms\":1006"));
    assert!(m.contains("does not recompute"), "{m}");
}

#[test]
fn version_rules() {
    let base = rec();
    let with = |version: u32, unanswered: &str, software: bool| {
        let mut r = base.clone();
        r.version = version;
        r.unanswered = unanswered.into();
        if software {
            r.software_identity = "sha256:s".into();
        }
        r.record_sha256 = record_digest(&r);
        decode_statement(statement_json(&r).as_bytes())
    };
    assert!(with(1, "", false).is_ok());
    assert!(with(2, "", true).is_ok());
    assert!(with(3, "internal", false).is_ok());
    assert!(with(1, "", true).is_err(), "v1 with software fields");
    assert!(with(3, "", false).is_err(), "v3 without unanswered");
    assert!(with(2, "internal", false).is_err(), "v2 with unanswered");
    assert!(with(4, "", false).is_err());
    assert!(with(0, "", false).is_err());
}

#[test]
fn close_statements_round_trip() {
    let key = SigningKey::generate().unwrap();
    let close = pb::CloseSessionResponse {
        session: fp(),
        calls: 3,
        last_record_sha256: "ab".into(),
        ended: 1,
    };
    let env = plimsoll_attest::sign_close(&key, &close);
    let got = String::from_utf8(env.payload.clone()).unwrap();
    assert_eq!(
        got,
        format!(
            r#"{{"_type":"https://in-toto.io/Statement/v1","subject":[{{"name":"session","digest":{{"sha256":"{0}"}}}}],"predicateType":"https://plimsollmark.github.io/plimsoll/session-close/v1","predicate":{{"session":"{0}","calls":3,"last_record_sha256":"ab"}}}}"#,
            fp()
        )
    );
    let c = plimsoll_attest::verify_close(&env, &key.public()).unwrap();
    assert_eq!(
        (c.session, c.calls, c.last_record_sha256),
        (fp(), 3, "ab".to_owned())
    );
    // A record envelope is not a close, and vice versa.
    assert!(plimsoll_attest::verify_record(&env, &key.public()).is_err());
    let rec_env = sign_record(&key, &rec()).unwrap();
    assert!(plimsoll_attest::verify_close(&rec_env, &key.public()).is_err());
}

/// Arbitrary bytes never panic the decoders.
#[test]
fn garbage_never_panics_the_decoders() {
    let key = SigningKey::generate().unwrap();
    let seed = sign_record(&key, &rec()).unwrap().to_json().into_bytes();
    let mut x: u64 = 88172645463325252;
    for _ in 0..3000 {
        let mut m = seed.clone();
        for _ in 0..4 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x as usize) % m.len();
            m[i] = (x >> 32) as u8;
        }
        if let Ok(env) = Envelope::from_json(&m) {
            let _ = env.verify(&key.public());
            let _ = decode_statement(&env.payload);
        }
        let _ = decode_statement(&m);
    }
}
