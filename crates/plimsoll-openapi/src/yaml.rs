//! YAML reading on saphyr-parser's event stream, with our own limits.
//!
//! Aliases share the anchored node (`Rc`), so a "billion laughs" document costs memory in
//! proportion to its text, never to its expansion; on top of that the number of aliases,
//! the nesting depth (counting what an alias brings in) and merge-key work (entries looked
//! at, bytes hashed and copied; a set of keys makes each entry one lookup) are bounded,
//! and every limit hit is an error naming it. [`read_counted`] reports the work done. One document per stream; complex (non-scalar)
//! mapping keys are refused.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use saphyr_parser::{Event, Parser, ScalarStyle};

use crate::node::Node;

/// Limits on one YAML document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct YamlLimits {
    /// Nesting depth, counting the depth an alias brings in.
    pub max_depth: usize,
    /// Alias uses.
    pub max_aliases: usize,
    /// Entries of merge sources (`<<`) looked at, in total (copied or already present).
    pub max_merged_entries: usize,
    /// Bytes merge keys hash and copy (keys, and scalar values copied), in total.
    pub max_merged_bytes: usize,
}

impl Default for YamlLimits {
    fn default() -> Self {
        YamlLimits {
            max_depth: 128,
            max_aliases: 1_000_000,
            max_merged_entries: 1_000_000,
            max_merged_bytes: 16 << 20,
        }
    }
}

/// What reading one document cost, counted as it is read (tests assert on these, never on
/// wall time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct YamlStats {
    /// Parser events handled.
    pub events: u64,
    /// Alias uses.
    pub aliases: u64,
    /// Merge-key (`<<`) work: every entry of a merge source looked at (one set lookup
    /// each), whether its key was already present or not.
    pub merge_steps: u64,
    /// Bytes of keys merge keys hashed, plus bytes of keys and scalar values they copied.
    pub merge_bytes: u64,
}

/// The bytes a merge copies when it copies `v` (its scalar text; containers are shared).
fn scalar_bytes(v: &Node) -> u64 {
    match v {
        Node::String(s) | Node::Number(s) => s.len() as u64,
        _ => 0,
    }
}

/// A YAML error with its position (1-based line and column, when known).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}{}", .line.map(|l| format!(" at line {l} column {}", .column.unwrap_or(0))).unwrap_or_default())]
pub struct YamlError {
    /// What is wrong.
    pub message: String,
    /// The line.
    pub line: Option<usize>,
    /// The column.
    pub column: Option<usize>,
}

enum Frame {
    Seq {
        items: Vec<Node>,
        anchor: usize,
        height: usize,
    },
    Map {
        entries: Vec<(String, Node)>,
        key: Option<String>,
        anchor: usize,
        height: usize,
    },
}

fn plain_scalar(v: &str) -> Node {
    match v {
        "" | "~" | "null" | "Null" | "NULL" => Node::Null,
        "true" | "True" | "TRUE" => Node::Bool(true),
        "false" | "False" | "FALSE" => Node::Bool(false),
        _ => {
            let numeric = v.parse::<f64>().is_ok()
                && v.bytes()
                    .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b))
                || v.starts_with("0x")
                    && v.len() > 2
                    && v[2..].bytes().all(|b| b.is_ascii_hexdigit())
                || v.starts_with("0o")
                    && v.len() > 2
                    && v[2..].bytes().all(|b| (b'0'..=b'7').contains(&b));
            if numeric {
                Node::Number(v.to_owned())
            } else {
                Node::String(v.to_owned())
            }
        }
    }
}

struct Builder {
    limits: YamlLimits,
    stack: Vec<Frame>,
    anchors: HashMap<usize, (Node, usize)>,
    aliases: usize,
    stats: YamlStats,
    root: Option<Node>,
    documents: usize,
}

impl Builder {
    fn err(&self, message: impl Into<String>) -> YamlError {
        YamlError {
            message: message.into(),
            line: None,
            column: None,
        }
    }

    fn key_expected(&self) -> bool {
        matches!(self.stack.last(), Some(Frame::Map { key: None, .. }))
    }

    /// Attaches a finished node of `height` to its parent (or makes it the root).
    fn attach(&mut self, node: Node, height: usize) -> Result<(), YamlError> {
        if self.stack.len() + height > self.limits.max_depth {
            return Err(self.err(format!(
                "the document nests deeper than {} levels (aliases included)",
                self.limits.max_depth
            )));
        }
        match self.stack.last_mut() {
            None => {
                if self.root.is_some() {
                    return Err(self.err("the stream holds more than one document"));
                }
                self.root = Some(node);
            }
            Some(Frame::Seq {
                items, height: h, ..
            }) => {
                items.push(node);
                *h = (*h).max(height);
            }
            Some(Frame::Map {
                entries,
                key,
                height: h,
                ..
            }) => match key.take() {
                None => {
                    let k = match node {
                        Node::String(s) | Node::Number(s) => s,
                        Node::Bool(b) => b.to_string(),
                        Node::Null => "null".to_owned(),
                        _ => {
                            return Err(YamlError {
                                message: "complex (non-scalar) mapping keys are not supported"
                                    .into(),
                                line: None,
                                column: None,
                            })
                        }
                    };
                    *key = Some(k);
                }
                Some(k) => {
                    entries.push((k, node));
                    *h = (*h).max(height);
                }
            },
        }
        Ok(())
    }

    /// One unit of merge work: an entry of a merge source looked at, whose key of
    /// `key_bytes` bytes is hashed once. Errors past either merge limit.
    fn merge_step(&mut self, key_bytes: usize) -> Result<(), YamlError> {
        self.stats.merge_steps += 1;
        if self.stats.merge_steps > self.limits.max_merged_entries as u64 {
            return Err(self.err(format!(
                "merge keys (<<) bring in more than {} entries",
                self.limits.max_merged_entries
            )));
        }
        self.merge_bytes(key_bytes as u64)
    }

    fn merge_bytes(&mut self, n: u64) -> Result<(), YamlError> {
        self.stats.merge_bytes += n;
        if self.stats.merge_bytes > self.limits.max_merged_bytes as u64 {
            return Err(self.err(format!(
                "merge keys (<<) hash or copy more than {} bytes of keys and values",
                self.limits.max_merged_bytes
            )));
        }
        Ok(())
    }

    /// Applies a mapping's merge keys: its own entries first, then each source's entries
    /// whose key is not yet present, earlier sources first. Each entry looked at costs one
    /// set lookup and counts against the limits, present or not.
    fn merge(&mut self, entries: Vec<(String, Node)>) -> Result<Vec<(String, Node)>, YamlError> {
        if !entries.iter().any(|(k, _)| k == "<<") {
            return Ok(entries);
        }
        let (merges, mut own): (Vec<_>, Vec<_>) = entries.into_iter().partition(|(k, _)| k == "<<");
        let mut present: HashSet<String> = own.iter().map(|(k, _)| k.clone()).collect();
        let not_a_mapping = "a merge key (<<) must name a mapping or a list of mappings";
        for (_, m) in merges {
            let sources: Vec<Node> = match m {
                Node::Map(_) => vec![m],
                Node::Seq(s) => s.iter().cloned().collect(),
                _ => return Err(self.err(not_a_mapping)),
            };
            for src in sources {
                let Node::Map(src) = src else {
                    return Err(self.err(not_a_mapping));
                };
                for (k, v) in src.iter() {
                    self.merge_step(k.len())?;
                    if !present.contains(k.as_str()) {
                        self.merge_bytes(k.len() as u64 + scalar_bytes(v))?;
                        present.insert(k.clone());
                        own.push((k.clone(), v.clone()));
                    }
                }
            }
        }
        Ok(own)
    }

    fn event(&mut self, ev: Event<'_>) -> Result<(), YamlError> {
        match ev {
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => {}
            Event::DocumentStart(_) => {
                self.documents += 1;
                if self.documents > 1 {
                    return Err(self.err("the stream holds more than one document"));
                }
            }
            Event::Scalar(v, style, anchor, _tag) => {
                let node = if matches!(style, ScalarStyle::Plain) && !self.key_expected() {
                    plain_scalar(&v)
                } else {
                    Node::String(v.into_owned())
                };
                if anchor > 0 {
                    self.anchors.insert(anchor, (node.clone(), 0));
                }
                self.attach(node, 0)?;
            }
            Event::Alias(id) => {
                self.aliases += 1;
                self.stats.aliases += 1;
                if self.aliases > self.limits.max_aliases {
                    return Err(self.err(format!(
                        "the document uses more than {} aliases",
                        self.limits.max_aliases
                    )));
                }
                let Some((node, height)) = self.anchors.get(&id).cloned() else {
                    return Err(self.err("an alias names an anchor that is not defined before it"));
                };
                self.attach(node, height)?;
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if self.key_expected() {
                    return Err(self.err("complex (non-scalar) mapping keys are not supported"));
                }
                if self.stack.len() >= self.limits.max_depth {
                    return Err(self.err(format!(
                        "the document nests deeper than {} levels",
                        self.limits.max_depth
                    )));
                }
                self.stack.push(if matches!(ev, Event::SequenceStart(..)) {
                    Frame::Seq {
                        items: Vec::new(),
                        anchor,
                        height: 0,
                    }
                } else {
                    Frame::Map {
                        entries: Vec::new(),
                        key: None,
                        anchor,
                        height: 0,
                    }
                });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let frame = self
                    .stack
                    .pop()
                    .ok_or_else(|| self.err("unbalanced YAML events"))?;
                let (node, anchor, height) = match frame {
                    Frame::Seq {
                        items,
                        anchor,
                        height,
                    } => (Node::Seq(Rc::new(items)), anchor, height + 1),
                    Frame::Map {
                        entries,
                        anchor,
                        height,
                        ..
                    } => {
                        let entries = self.merge(entries)?;
                        (Node::Map(Rc::new(entries)), anchor, height + 1)
                    }
                };
                if anchor > 0 {
                    self.anchors.insert(anchor, (node.clone(), height));
                }
                self.attach(node, height.saturating_sub(1))?;
            }
        }
        Ok(())
    }
}

/// Parses one YAML document into a tree, within `limits`.
pub fn read(text: &str, limits: YamlLimits) -> Result<Node, YamlError> {
    read_counted(text, limits).0
}

/// [`read`], also returning what the reading cost (counted up to where it stopped).
pub fn read_counted(text: &str, limits: YamlLimits) -> (Result<Node, YamlError>, YamlStats) {
    let mut b = Builder {
        limits,
        stack: Vec::new(),
        anchors: HashMap::new(),
        aliases: 0,
        stats: YamlStats::default(),
        root: None,
        documents: 0,
    };
    let result = b.run(text);
    (result, b.stats)
}

impl Builder {
    fn run(&mut self, text: &str) -> Result<Node, YamlError> {
        for ev in Parser::new_from_str(text) {
            let (ev, span) = ev.map_err(|e| YamlError {
                message: e.info().to_owned(),
                line: Some(e.marker().line()),
                column: Some(e.marker().col() + 1),
            })?;
            self.stats.events += 1;
            self.event(ev).map_err(|mut e| {
                e.line = Some(span.start.line());
                e.column = Some(span.start.col() + 1);
                e
            })?;
        }
        self.root.take().ok_or_else(|| YamlError {
            message: "the document is empty".into(),
            line: None,
            column: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_maps_sequences_and_aliases() {
        let n = read(
            "a: &x {b: [1, true, ~, 'q', 0x1F]}\nc: *x\nd: {<<: *x, e: 2}\n'200': ok\n",
            YamlLimits::default(),
        )
        .unwrap();
        let b = n.get("a").unwrap().get("b").unwrap().items().unwrap();
        assert_eq!(b[0], Node::Number("1".into()));
        assert_eq!(b[1], Node::Bool(true));
        assert_eq!(b[2], Node::Null);
        assert_eq!(b[3], Node::String("q".into()));
        assert_eq!(b[4], Node::Number("0x1F".into()));
        assert_eq!(n.get("c"), n.get("a"));
        assert!(n.get("d").unwrap().get("b").is_some());
        assert_eq!(n.get("200").unwrap().as_str(), Some("ok"));
    }

    #[test]
    fn merge_keys_keep_own_entries_and_earlier_sources_first() {
        let n = read(
            "a: &a {x: 1, y: 1}\nb: &b {y: 2, z: 2}\nm: {<<: [*a, *b], x: 0}\n",
            YamlLimits::default(),
        )
        .unwrap();
        let m = n.get("m").unwrap();
        let got: Vec<_> = m
            .entries()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        let num = |s: &str| Node::Number(s.into());
        assert_eq!(got, vec![("x", num("0")), ("y", num("1")), ("z", num("2"))]);
        let (_, stats) = read_counted(
            "a: &a {x: 1, y: 1}\nb: &b {y: 2, z: 2}\nm: {<<: [*a, *b], x: 0}\n",
            YamlLimits::default(),
        );
        // Four entries looked at; y and z copied (x is the mapping's own).
        assert_eq!(stats.merge_steps, 4);
        assert_eq!(stats.merge_bytes, 4 + 2 + 2);
        for (limits, needle) in [
            (
                YamlLimits {
                    max_merged_entries: 3,
                    ..Default::default()
                },
                "more than 3 entries",
            ),
            (
                YamlLimits {
                    max_merged_bytes: 5,
                    ..Default::default()
                },
                "more than 5 bytes",
            ),
        ] {
            let e = read(
                "a: &a {x: 1, y: 1}\nb: &b {y: 2, z: 2}\nm: {<<: [*a, *b]}\n",
                limits,
            )
            .unwrap_err();
            assert!(e.to_string().contains(needle), "{e}");
            assert!(e.line.is_some(), "{e}");
        }
        assert!(read("m: {<<: 1}\n", YamlLimits::default()).is_err());
        assert!(read("m: {<<: [1]}\n", YamlLimits::default()).is_err());
    }

    #[test]
    fn billion_laughs_stays_small_and_alias_counts_are_bounded() {
        let mut doc = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..30 {
            let p = i - 1;
            doc.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        // 10^30 leaves if expanded; shared, it is 300 nodes. But the depth grows by one per level.
        let n = read(&doc, YamlLimits::default()).unwrap();
        assert!(n.get("a29").is_some());
        let e = read(
            &doc,
            YamlLimits {
                max_aliases: 100,
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.message.contains("aliases"), "{e}");
        let e = read(
            &doc,
            YamlLimits {
                max_depth: 20,
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.message.contains("deeper"), "{e}");
    }

    #[test]
    fn errors_carry_positions() {
        let e = read("a: [1, 2\nb: c", YamlLimits::default()).unwrap_err();
        assert!(e.line.is_some(), "{e}");
        let e = read("? [a]\n: b\n", YamlLimits::default()).unwrap_err();
        assert!(e.message.contains("complex"), "{e}");
        let e = read("a: *nope\n", YamlLimits::default()).unwrap_err();
        assert!(
            e.to_string().contains("anchor") || e.to_string().contains("alias"),
            "{e}"
        );
        assert!(read("a: 1\n---\nb: 2\n", YamlLimits::default()).is_err());
        assert!(read("", YamlLimits::default()).is_err());
        let deep = "[".repeat(500) + &"]".repeat(500);
        assert!(read(&deep, YamlLimits::default()).is_err());
    }
}
