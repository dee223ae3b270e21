//! Arbitrary bytes as an RFC 3161 TimeStampResp, as a bare token, as an extra certificate and
//! spliced into a recorded answer: `plimsoll_timestamp::verify_response`, `verify_token` and
//! `TimeStampRequest::parse` must never panic, and no input but the recorded token itself
//! verifies as a token.

#![no_main]

use libfuzzer_sys::fuzz_target;
use plimsoll_timestamp::{
    certificates_from_pem, verify_response, verify_token, HashAlg, Imprint, TimeStampRequest,
};

const RESP: &[u8] = include_bytes!("../../testdata/tsa/sigstage/response-sha256.tsr");
const CHAIN: &str = include_str!("../../testdata/tsa/sigstage/ts_chain.pem");

fuzz_target!(|data: &[u8]| {
    let roots = certificates_from_pem(CHAIN).unwrap();
    let req = TimeStampRequest::with_nonce(Imprint::of(HashAlg::Sha256, b"hello"), &[]).unwrap();
    let (token, _) = verify_response(RESP, &req, &roots, &[]).unwrap();
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 => {
            let _ = verify_response(rest, &req, &roots, &[]);
        }
        1 => {
            let r = verify_token(rest, req.imprint(), None, &roots, &[]);
            assert!(r.is_err() || rest == token.as_slice());
        }
        2 => {
            let _ = verify_response(RESP, &req, &roots, &[rest.to_vec()]);
            let _ = verify_response(RESP, &req, &[rest.to_vec()], &[]);
            let _ = TimeStampRequest::parse(rest);
        }
        _ => {
            // Overwrite the recorded answer from an offset the first two bytes pick.
            let Some((at, patch)) = rest.split_first_chunk::<2>() else {
                return;
            };
            let at = usize::from(u16::from_be_bytes(*at)) % RESP.len();
            let mut v = RESP.to_vec();
            let end = (at + patch.len()).min(v.len());
            v[at..end].copy_from_slice(&patch[..end - at]);
            if let Ok((t, _)) = verify_response(&v, &req, &roots, &[]) {
                assert_eq!(t, token, "a changed token verified");
            }
        }
    }
});
