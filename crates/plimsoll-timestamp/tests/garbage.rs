//! Thousands of deterministic pseudo-random mutations of the recorded responses and tokens
//! (flipped bytes, truncations, insertions, deletions, random bytes): verification never
//! panics, and every mutation of a token is refused. A mutated response may be accepted only
//! when the token inside it is the original one (the status wrapper is not signed; status 1,
//! grantedWithMods, is a grant).

use plimsoll_timestamp::{
    certificates_from_pem, verify_response, verify_token, HashAlg, Imprint, TimeStampRequest,
};

macro_rules! fixture {
    ($p:literal) => {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/tsa/", $p)
    };
}

/// splitmix64: a fixed sequence, so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, orig: &[u8]) -> Vec<u8> {
    let mut v = orig.to_vec();
    match rng.below(6) {
        0 | 1 => {
            for _ in 0..=rng.below(3) {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
        }
        2 => v.truncate(rng.below(v.len())),
        3 => {
            let i = rng.below(v.len());
            v.insert(i, rng.next() as u8);
        }
        4 => {
            let i = rng.below(v.len());
            v.remove(i);
        }
        _ => {
            let i = rng.below(v.len());
            v[i] = rng.next() as u8;
        }
    }
    v
}

struct Case {
    resp: Vec<u8>,
    req: TimeStampRequest,
    roots: Vec<Vec<u8>>,
}

fn cases() -> Vec<Case> {
    let pem = |p: &str| certificates_from_pem(&std::fs::read_to_string(p).unwrap()).unwrap();
    let hello = std::fs::read(fixture!("hello.txt")).unwrap();
    let sigstage = pem(fixture!("sigstage/ts_chain.pem"));
    let identrust = pem(fixture!("identrust/root.pem"));
    let req = |alg| TimeStampRequest::with_nonce(Imprint::of(alg, &hello), &[]).unwrap();
    [
        (
            fixture!("sigstage/response-sha256.tsr"),
            HashAlg::Sha256,
            &sigstage,
        ),
        (
            fixture!("sigstage/response-sha384.tsr"),
            HashAlg::Sha384,
            &sigstage,
        ),
        (
            fixture!("sigstage/response-sha512.tsr"),
            HashAlg::Sha512,
            &sigstage,
        ),
        (
            fixture!("identrust/issue-104.tsr"),
            HashAlg::Sha512,
            &identrust,
        ),
    ]
    .into_iter()
    .map(|(f, alg, roots)| Case {
        resp: std::fs::read(f).unwrap(),
        req: req(alg),
        roots: roots.clone(),
    })
    .collect()
}

#[test]
fn mutated_responses_and_tokens_never_panic_and_are_refused() {
    let mut rng = Rng(0x5eed_3161);
    let mut refused = 0;
    for case in cases() {
        let (token, _) = verify_response(&case.resp, &case.req, &case.roots, &[])
            .expect("the unmutated fixture verifies");
        for _ in 0..600 {
            let bad = mutate(&mut rng, &case.resp);
            if bad == case.resp {
                continue;
            }
            match verify_response(&bad, &case.req, &case.roots, &[]) {
                Err(_) => refused += 1,
                Ok((t, _)) => assert_eq!(t, token, "a mutated token was accepted"),
            }
            let bad = mutate(&mut rng, &token);
            if bad == token {
                continue;
            }
            let r = verify_token(&bad, case.req.imprint(), None, &case.roots, &[]);
            assert!(r.is_err(), "a mutated token was accepted: {}", hex(&bad));
            refused += 1;
        }
    }
    assert!(refused > 4000, "only {refused} mutations were tried");
    // The recorded request, mutated, parses or is refused without a panic.
    let req = std::fs::read(fixture!("sigstage/request.der")).unwrap();
    for _ in 0..2000 {
        let _ = TimeStampRequest::parse(&mutate(&mut rng, &req));
    }
}

#[test]
fn random_bytes_and_wrapped_garbage_are_refused() {
    let mut rng = Rng(42);
    let case = &cases()[0];
    for n in 0..2000 {
        let len = rng.below(if n % 10 == 0 { 70_000 } else { 300 });
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        // Start some with plausible DER headers so parsing gets past the first byte.
        if n % 2 == 0 && bytes.len() > 4 {
            bytes[0] = 0x30;
            bytes[1] = 0x82;
        }
        assert!(verify_response(&bytes, &case.req, &case.roots, &[]).is_err());
        assert!(verify_token(&bytes, case.req.imprint(), None, &case.roots, &[]).is_err());
        let _ = TimeStampRequest::parse(&bytes);
        // Garbage as extra and root certificates.
        let extra = vec![bytes.clone()];
        assert!(verify_response(&case.resp, &case.req, &case.roots, &extra).is_err());
        assert!(verify_response(&case.resp, &case.req, &extra, &[]).is_err());
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
