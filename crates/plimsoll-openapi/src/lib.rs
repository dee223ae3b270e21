//! plimsoll-openapi: reads an OpenAPI 3.0 or 3.1 document (JSON or YAML) and turns its
//! operations into grant routes, each prefixed with the server URL's base path.
//!
//! It reads only what routes come from (servers, paths, operations, path-item `$ref`s);
//! schemas are never built. It must never follow a `$ref` out of the document, never expand
//! a YAML alias into a copy, and never accept a route the broker would refuse.

mod extract;
mod json;
mod node;
mod yaml;

pub use extract::{extract, Extraction, Operation, Options};
pub use node::Node;
pub use yaml::{read_counted as read_yaml_counted, YamlError, YamlLimits, YamlStats};

/// The largest document read.
pub const MAX_DOCUMENT_BYTES: usize = 256 * 1024 * 1024;

/// Why a document could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The bytes are not UTF-8, or too many.
    #[error("the document {0}")]
    Input(String),
    /// Malformed JSON.
    #[error("malformed JSON: {0}")]
    Json(String),
    /// Malformed YAML, or a YAML limit was hit.
    #[error("malformed YAML: {0}")]
    Yaml(#[from] YamlError),
    /// Parsed, but not an OpenAPI 3.0/3.1 document.
    #[error("not an OpenAPI 3.0/3.1 document: {0}")]
    NotOpenApi(String),
    /// The server (origin and base path) cannot be worked out.
    #[error("server: {0}")]
    Server(String),
    /// A `$ref` that cannot be followed (cycle, outside the document, unresolvable).
    #[error("{0}")]
    Ref(String),
}

/// Which syntax a document was read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    /// JSON (the first non-blank character is `{`).
    Json,
    /// YAML (anything else).
    Yaml,
}

/// Parses a document: JSON when its first non-blank character is `{`, YAML otherwise.
pub fn parse(bytes: &[u8]) -> Result<(Node, Syntax), SpecError> {
    if bytes.len() > MAX_DOCUMENT_BYTES {
        return Err(SpecError::Input(format!(
            "is larger than {} MiB",
            MAX_DOCUMENT_BYTES >> 20
        )));
    }
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let text =
        std::str::from_utf8(bytes).map_err(|e| SpecError::Input(format!("is not UTF-8 ({e})")))?;
    if text.trim_start().starts_with('{') {
        json::read(text)
            .map(|n| (n, Syntax::Json))
            .map_err(|e| SpecError::Json(e.to_string()))
    } else {
        Ok((yaml::read(text, YamlLimits::default())?, Syntax::Yaml))
    }
}

/// Parses and extracts in one step.
pub fn read(bytes: &[u8], opts: &Options) -> Result<Extraction, SpecError> {
    let (node, _) = parse(bytes)?;
    extract(&node, opts)
}

/// Fuzz entry point: reads arbitrary bytes as a document (with an origin given, so a
/// missing server is not the only answer). Never panics; every route it returns passes the
/// grant's own route check.
pub fn fuzz_read(data: &[u8]) {
    let opts = Options {
        origin: Some("https://fuzz.example".into()),
        ..Default::default()
    };
    if let Ok(x) = read(data, &opts) {
        for r in x.route_strings() {
            plimsoll_grants::Route::parse(&r).expect("an extracted route parses again");
        }
        plimsoll_grants::RouteSet::parse(&x.route_strings()).expect("extracted routes form a set");
    }
}
