//! What the page tests share: the shipped bundle, and one-byte changes made to it the way
//! an attacker (or a reader) would, keeping each line in its canonical form.

#![allow(dead_code)]

use std::path::PathBuf;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use plimsoll_core::pb;
use prost::Message as _;

pub fn learn() -> PathBuf {
    plimsoll_learn::learn_dir()
}

pub fn shipped_lines() -> Vec<String> {
    std::fs::read_to_string(learn().join(plimsoll_learn::records::BUNDLE))
        .expect("the shipped bundle")
        .lines()
        .map(str::to_owned)
        .collect()
}

pub fn shipped_pub() -> String {
    std::fs::read_to_string(learn().join(plimsoll_learn::records::PUBLIC_KEY)).expect("the key")
}

/// The base64 value after `key` (e.g. `"response":"`), as (start, end) byte offsets.
fn value_span(line: &str, key: &str) -> (usize, usize) {
    let start = line
        .find(key)
        .unwrap_or_else(|| panic!("no {key} in the line"))
        + key.len();
    let end = start + line[start..].find('"').expect("a closing quote");
    (start, end)
}

fn swap_value(line: &str, key: &str, f: impl FnOnce(&mut Vec<u8>)) -> String {
    let (a, b) = value_span(line, key);
    let mut bytes = STANDARD.decode(&line[a..b]).expect("base64");
    f(&mut bytes);
    format!("{}{}{}", &line[..a], STANDARD.encode(&bytes), &line[b..])
}

/// One byte of the program's stdout inside the stored answer, changed.
pub fn change_answer(line: &str) -> String {
    swap_value(line, "\"response\":\"", |bytes| {
        let resp = pb::RunResponse::decode(bytes.as_slice()).expect("a RunResponse");
        let stdout = match resp.result.expect("a result") {
            pb::run_response::Result::Javascript(j) => j.stdout,
            pb::run_response::Result::Cell(c) => c.stdout,
            pb::run_response::Result::Project(p) => p.steps[0].stdout.clone(),
            pb::run_response::Result::Module(m) => m.stdout,
        };
        assert!(!stdout.is_empty(), "the answer has a stdout to change");
        let at = bytes
            .windows(stdout.len())
            .rposition(|w| w == stdout.as_slice())
            .expect("the stdout bytes in the answer");
        bytes[at] ^= 0x01;
    })
}

/// The first byte of the record's signature, changed.
pub fn change_signature(line: &str) -> String {
    let envelope = line.find("\"envelope\":").expect("an envelope");
    let (head, tail) = line.split_at(envelope);
    format!("{head}{}", swap_value(tail, "\"sig\":\"", |b| b[0] ^= 0x01))
}

/// One byte of the signed link statement (a digit of its line number), changed.
pub fn change_link(line: &str) -> String {
    let link = line.find("\"link\":").expect("a link");
    let (head, tail) = line.split_at(link);
    format!(
        "{head}{}",
        swap_value(tail, "\"payload\":\"", |b| {
            let text = String::from_utf8(b.clone()).expect("a JSON statement");
            let at = text.find("\"index\":").expect("an index") + 8;
            b[at] ^= 0x01;
        })
    )
}

/// The line numbers (1-based) of the bundle's run and session-call records.
pub fn record_lines(lines: &[String]) -> Vec<usize> {
    lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("\"request\":"))
        .map(|(i, _)| i + 1)
        .collect()
}

/// One kind of one-byte change.
pub struct OneByte {
    /// What was changed.
    pub name: &'static str,
    /// The 1-based line changed.
    pub line: usize,
    /// The bundle with that line changed.
    pub lines: Vec<String>,
    /// What the verdict's reason must say.
    pub reason: &'static str,
}

/// The shipped bundle with one byte changed in an answer (the first record), a signature
/// (the second) and a link (the third), each with the reason the checker must give.
pub fn one_byte_changes(lines: &[String]) -> Vec<OneByte> {
    let recs = record_lines(lines);
    type Change = fn(&str) -> String;
    let cases: [(&str, usize, Change, &str); 3] = [
        (
            "answer",
            recs[0],
            change_answer,
            "result digest does not recompute",
        ),
        (
            "signature",
            recs[1],
            change_signature,
            "the record's signature does not verify",
        ),
        (
            "link",
            recs[2],
            change_link,
            "the link's signature does not verify",
        ),
    ];
    cases
        .into_iter()
        .map(|(name, line, change, reason)| {
            let mut changed = lines.to_vec();
            changed[line - 1] = change(&lines[line - 1]);
            OneByte {
                name,
                line,
                lines: changed,
                reason,
            }
        })
        .collect()
}
