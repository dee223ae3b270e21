//! Arbitrary bytes as a request body, the way the daemon's codec receives them: decoding,
//! validation and the request digest must never panic, and a decoded request must
//! survive an encode/decode round trip with the same digest.

#![no_main]

use libfuzzer_sys::fuzz_target;
use plimsoll_core::codec::decode_request;
use plimsoll_core::{digest, not_dispatched_reason, pb, validate, Reason, Refusal, PROTOCOL};
use prost::Message;

fuzz_target!(|data: &[u8]| {
    match decode_request::<pb::RunRequest>(data.len(), data) {
        Ok(req) => {
            let _ = Refusal::check_protocol(req.protocol, PROTOCOL);
            if let Err(r) = validate::validate_run(&req) {
                // Every refusal keeps its not-dispatched mark through a gRPC status.
                assert_eq!(not_dispatched_reason(&r.to_status()), Some(r.reason));
            }
            let d = digest::request_digest(&req);
            assert_eq!(d.len(), 64);
            assert_eq!(d, digest::request_digest(&req), "request digest is not deterministic");
            let again: pb::RunRequest = decode_request(0, &req.encode_to_vec()[..])
                .expect("a decoded request re-encodes to bytes that decode");
            // Bytes, not `==`: a module row may hold NaN.
            assert_eq!(again.encode_to_vec(), req.encode_to_vec(), "round trip changed the request");
            assert_eq!(digest::request_digest(&again), d);
        }
        Err(r) => {
            assert_eq!(r.reason, Reason::Request);
            assert_eq!(not_dispatched_reason(&r.to_status()), Some(Reason::Request));
        }
    }
    if let Ok(s) = decode_request::<pb::SessionRunRequest>(data.len(), data) {
        let _ = digest::request_digest(&digest::session_call_as_run(&s));
    }
});
