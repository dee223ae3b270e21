//! The document model: a JSON-like tree whose containers are shared (`Rc`), so a YAML alias
//! costs one pointer, not a copy, however often it is used.

use std::rc::Rc;

/// One value of a document.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// `null`.
    Null,
    /// A boolean.
    Bool(bool),
    /// A number, as written.
    Number(String),
    /// A string.
    String(String),
    /// A sequence.
    Seq(Rc<Vec<Node>>),
    /// A mapping, in document order.
    Map(Rc<Vec<(String, Node)>>),
}

impl Node {
    /// The value of `key` in a mapping (the first, if written twice).
    pub fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Map(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Node::String(s) => Some(s),
            _ => None,
        }
    }

    /// The entries, if this is a mapping.
    pub fn entries(&self) -> Option<&[(String, Node)]> {
        match self {
            Node::Map(m) => Some(m),
            _ => None,
        }
    }

    /// The items, if this is a sequence.
    pub fn items(&self) -> Option<&[Node]> {
        match self {
            Node::Seq(s) => Some(s),
            _ => None,
        }
    }

    /// A short name of the node's kind, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool(_) => "a boolean",
            Node::Number(_) => "a number",
            Node::String(_) => "a string",
            Node::Seq(_) => "a sequence",
            Node::Map(_) => "a mapping",
        }
    }
}
