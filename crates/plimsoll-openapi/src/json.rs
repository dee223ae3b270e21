//! JSON reading with pruning: only the parts of an OpenAPI document that routes come from
//! are built (`openapi`, `info`, `servers`, `paths` with each operation's `tags`,
//! `operationId` and `servers`, `components.pathItems`, and unknown top-level keys a `$ref`
//! may point into). Schemas, responses, examples and descriptions are skipped while parsing,
//! so a 13 MB document costs a small tree. serde_json bounds nesting at 128 levels.

use std::fmt;
use std::rc::Rc;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;

use crate::node::Node;

/// Where in the document a value sits, which decides what of it is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ctx {
    Root,
    Components,
    Paths,
    PathItem,
    Operation,
    Keep,
}

const METHODS: &[&str] = &[
    "get", "put", "post", "delete", "patch", "head", "options", "trace",
];

impl Ctx {
    /// The context of the value under `key`, or `None` to skip it.
    fn child(self, key: &str) -> Option<Ctx> {
        match self {
            Ctx::Root => match key {
                "paths" => Some(Ctx::Paths),
                "components" => Some(Ctx::Components),
                "webhooks" => None,
                _ => Some(Ctx::Keep),
            },
            Ctx::Components => (key == "pathItems").then_some(Ctx::Keep),
            Ctx::Paths => Some(Ctx::PathItem),
            Ctx::PathItem => {
                if METHODS.contains(&key) {
                    Some(Ctx::Operation)
                } else {
                    matches!(key, "$ref" | "servers").then_some(Ctx::Keep)
                }
            }
            Ctx::Operation => {
                matches!(key, "tags" | "operationId" | "servers" | "$ref").then_some(Ctx::Keep)
            }
            Ctx::Keep => Some(Ctx::Keep),
        }
    }
}

struct Seed(Ctx);

impl<'de> DeserializeSeed<'de> for Seed {
    type Value = Node;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor(self.0))
    }
}

struct NodeVisitor(Ctx);

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Number(v.to_string()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Number(v.to_string()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Number(v.to_string()))
    }
    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Node, E> {
        Ok(Node::String(v))
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Node, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = s.next_element_seed(Seed(Ctx::Keep))? {
            out.push(v);
        }
        Ok(Node::Seq(Rc::new(out)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Node, A::Error> {
        let mut out = Vec::new();
        while let Some(k) = m.next_key::<String>()? {
            match self.0.child(&k) {
                Some(c) => {
                    let v = m.next_value_seed(Seed(c))?;
                    out.push((k, v));
                }
                None => {
                    m.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Node::Map(Rc::new(out)))
    }
}

/// Parses a JSON document into its pruned tree.
pub fn read(text: &str) -> Result<Node, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let node = Seed(Ctx::Root).deserialize(&mut de)?;
    de.end()?;
    Ok(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prunes_what_routes_do_not_need() {
        let n = read(
            r#"{"openapi":"3.0.3","paths":{"/a":{"get":{"operationId":"x","responses":{"200":{}},"tags":["t"]},
            "parameters":[1],"summary":"s"}},"components":{"schemas":{"big":{}},"pathItems":{"p":{"get":{}}}},
            "webhooks":{"w":{}},"x-other":{"y":1}}"#,
        )
        .unwrap();
        let op = n
            .get("paths")
            .unwrap()
            .get("/a")
            .unwrap()
            .get("get")
            .unwrap();
        assert_eq!(op.get("operationId").unwrap().as_str(), Some("x"));
        assert!(op.get("responses").is_none());
        assert!(n
            .get("paths")
            .unwrap()
            .get("/a")
            .unwrap()
            .get("summary")
            .is_none());
        assert!(n.get("components").unwrap().get("schemas").is_none());
        assert!(n.get("components").unwrap().get("pathItems").is_some());
        assert!(n.get("webhooks").is_none());
        assert!(n.get("x-other").is_some());
    }

    #[test]
    fn depth_is_bounded_and_trailing_data_refused() {
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        let e = read(&format!(r#"{{"x":{deep}}}"#)).unwrap_err();
        assert!(e.to_string().contains("recursion limit"), "{e}");
        assert!(read("{} {}").is_err());
    }
}
