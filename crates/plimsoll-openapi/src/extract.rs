//! From a document tree to grant routes: the server URL's origin and base path, every
//! operation's method and path, the selection, the checks a grant applies.

use std::collections::{BTreeMap, HashMap};

use plimsoll_grants::profile::parse_origin;
use plimsoll_grants::route::is_param_name;
use plimsoll_grants::{Method, Route};

use crate::node::Node;
use crate::SpecError;

/// How routes are chosen and where they point.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// Which entry of the root `servers` to use (default the first).
    pub server: usize,
    /// Values for server variables, overriding their defaults.
    pub server_vars: BTreeMap<String, String>,
    /// The upstream origin (`https://host[:port]`), overriding the server URL's; required
    /// when the server URL is relative or the document has no servers.
    pub origin: Option<String>,
    /// The base path, overriding the server URL's (`""` for none).
    pub base_path: Option<String>,
    /// Keep operations carrying one of these tags.
    pub tags: Vec<String>,
    /// Keep operations with one of these operationIds.
    pub operation_ids: Vec<String>,
    /// Keep operations whose route (base path included) or document path starts with one
    /// of these.
    pub path_prefixes: Vec<String>,
}

impl Options {
    fn selects_all(&self) -> bool {
        self.tags.is_empty() && self.operation_ids.is_empty() && self.path_prefixes.is_empty()
    }
}

/// One operation turned into a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    /// The route (base path included).
    pub route: Route,
    /// The operationId, if any.
    pub operation_id: Option<String>,
    /// The tags.
    pub tags: Vec<String>,
}

/// What was read from a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extraction {
    /// `openapi` as written.
    pub openapi: String,
    /// `info.title`.
    pub title: String,
    /// `info.version`.
    pub version: String,
    /// The upstream origin (`https://api.example.com`).
    pub origin: String,
    /// The base path every route starts with (`/client/v4`, or empty).
    pub base_path: String,
    /// The selected operations, most specific route first.
    pub operations: Vec<Operation>,
    /// Operations left out, each `METHOD /path: why`.
    pub skipped: Vec<String>,
    /// Notes that do not stop generation.
    pub warnings: Vec<String>,
}

impl Extraction {
    /// The routes as a grant writes them (`"GET /v1/items/{id}"`).
    pub fn route_strings(&self) -> Vec<String> {
        self.operations
            .iter()
            .map(|o| o.route.to_string())
            .collect()
    }
}

/// A server URL resolved: origin (if absolute) and base path.
struct Server {
    origin: Option<String>,
    base_path: String,
}

fn substitute(
    url: &str,
    vars: Option<&Node>,
    overrides: &BTreeMap<String, String>,
) -> Result<String, SpecError> {
    let mut out = String::new();
    let mut rest = url;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| SpecError::Server(format!("server URL {url:?} has an unclosed {{")))?;
        let name = &after[..close];
        let value = match overrides.get(name) {
            Some(v) => v.clone(),
            None => vars
                .and_then(|v| v.get(name))
                .and_then(|v| v.get("default"))
                .and_then(|d| match d {
                    Node::String(s) | Node::Number(s) => Some(s.clone()),
                    _ => None,
                })
                .ok_or_else(|| {
                    SpecError::Server(format!(
                        "server URL {url:?} uses variable {name:?}, which has no default; pass --server-var {name}=VALUE"
                    ))
                })?,
        };
        out.push_str(&value);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn normalise_base(path: &str) -> Result<String, SpecError> {
    let p = path.trim_end_matches('/');
    if p.is_empty() {
        return Ok(String::new());
    }
    if !p.starts_with('/') {
        return Err(SpecError::Server(format!(
            "base path {path:?} must start with /"
        )));
    }
    if p.contains(['?', '#']) {
        return Err(SpecError::Server(format!(
            "base path {path:?} must not hold a query or fragment"
        )));
    }
    Ok(p.to_owned())
}

fn resolve_server(node: &Node, overrides: &BTreeMap<String, String>) -> Result<Server, SpecError> {
    let url = node
        .get("url")
        .and_then(Node::as_str)
        .ok_or_else(|| SpecError::Server("a server has no url".into()))?;
    let url = substitute(url, node.get("variables"), overrides)?;
    if let Some((scheme, rest)) = url.split_once("://") {
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        Ok(Server {
            origin: Some(format!("{scheme}://{authority}")),
            base_path: normalise_base(path)?,
        })
    } else {
        // A relative server URL: a path on the document's own host.
        let path = url.trim_start_matches('.');
        Ok(Server {
            origin: None,
            base_path: normalise_base(path)?,
        })
    }
}

const OPERATION_METHODS: &[&str] = &["get", "put", "post", "delete", "patch"];
const SKIPPED_METHODS: &[&str] = &["head", "options", "trace"];

/// Follows a JSON pointer (`#/components/pathItems/x`) inside the document.
fn pointer<'a>(root: &'a Node, r: &str) -> Result<&'a Node, SpecError> {
    let Some(frag) = r.strip_prefix('#') else {
        return Err(SpecError::Ref(format!(
            "$ref {r:?} points outside the document; bundle it into one file first"
        )));
    };
    let frag =
        percent_decode(frag).ok_or_else(|| SpecError::Ref(format!("$ref {r:?} is malformed")))?;
    let mut node = root;
    if frag.is_empty() {
        return Ok(node);
    }
    let Some(frag) = frag.strip_prefix('/') else {
        return Err(SpecError::Ref(format!("$ref {r:?} is malformed")));
    };
    for token in frag.split('/') {
        let key = token.replace("~1", "/").replace("~0", "~");
        node = match node {
            Node::Map(_) => node.get(&key),
            Node::Seq(items) => key.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        }
        .ok_or_else(|| SpecError::Ref(format!("$ref {r:?} does not resolve")))?;
    }
    Ok(node)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A path item and every item its `$ref` chain leads to, nearest first.
fn path_item_chain<'a>(
    root: &'a Node,
    item: &'a Node,
    path: &str,
) -> Result<Vec<&'a Node>, SpecError> {
    let mut chain = vec![item];
    let mut seen: Vec<&str> = Vec::new();
    let mut node = item;
    while let Some(r) = node.get("$ref") {
        let r = r
            .as_str()
            .ok_or_else(|| SpecError::Ref(format!("path {path:?}: $ref must be a string")))?;
        if seen.contains(&r) {
            seen.push(r);
            return Err(SpecError::Ref(format!(
                "path {path:?}: $ref cycle: {}",
                seen.join(" -> ")
            )));
        }
        seen.push(r);
        if seen.len() > 64 {
            return Err(SpecError::Ref(format!(
                "path {path:?}: $ref chain longer than 64"
            )));
        }
        node = pointer(root, r)?;
        if !matches!(node, Node::Map(_)) {
            return Err(SpecError::Ref(format!(
                "path {path:?}: $ref {r:?} is {}, not a path item",
                node.kind()
            )));
        }
        chain.push(node);
    }
    Ok(chain)
}

/// The path template with each `{param}` name made valid for a grant; `Err` says why the
/// path cannot be a grant route.
fn grant_path(base: &str, path: &str) -> Result<String, String> {
    if !path.starts_with('/') {
        return Err("the path does not start with /".into());
    }
    let mut out = String::from(base);
    if path == "/" && !base.is_empty() {
        return Ok(out);
    }
    for (i, seg) in path[1..].split('/').enumerate() {
        out.push('/');
        if let Some(inner) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            if inner.contains(['{', '}']) {
                return Err("a parameter shares its segment with other text".into());
            }
            let mut name: String = inner
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                        c
                    } else {
                        '_'
                    }
                })
                .take(64)
                .collect();
            if name.is_empty() {
                name = format!("p{i}");
            }
            debug_assert!(is_param_name(&name));
            out.push('{');
            out.push_str(&name);
            out.push('}');
        } else if seg.contains(['{', '}']) {
            return Err(
                "a parameter shares its segment with other text (a grant's {param} is a whole segment)"
                    .into(),
            );
        } else {
            out.push_str(seg);
        }
    }
    Ok(out)
}

fn tags_of(op: &Node) -> Vec<String> {
    op.get("tags")
        .and_then(Node::items)
        .map(|t| {
            t.iter()
                .filter_map(Node::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Reads the routes of `doc` under `opts`.
pub fn extract(doc: &Node, opts: &Options) -> Result<Extraction, SpecError> {
    if !matches!(doc, Node::Map(_)) {
        return Err(SpecError::NotOpenApi(format!(
            "the document is {}, not a mapping",
            doc.kind()
        )));
    }
    let openapi = match doc.get("openapi") {
        Some(Node::String(v)) | Some(Node::Number(v)) => v.clone(),
        Some(_) => {
            return Err(SpecError::NotOpenApi(
                "`openapi` must be a version string".into(),
            ))
        }
        None if doc.get("swagger").is_some() => {
            return Err(SpecError::NotOpenApi(
                "this is a Swagger 2.0 document; convert it to OpenAPI 3 first".into(),
            ))
        }
        None => {
            return Err(SpecError::NotOpenApi(
                "the document has no `openapi` field".into(),
            ))
        }
    };
    let mut warnings = Vec::new();
    if !(openapi.starts_with("3.0") || openapi.starts_with("3.1")) {
        if openapi.starts_with("3.") {
            warnings.push(format!(
                "openapi {openapi} is newer than 3.1; paths and servers are read as 3.1 reads them"
            ));
        } else {
            return Err(SpecError::NotOpenApi(format!(
                "openapi {openapi:?} is not supported; this reads 3.0 and 3.1"
            )));
        }
    }
    let info = doc.get("info");
    let text = |k: &str| {
        info.and_then(|i| i.get(k))
            .and_then(|v| match v {
                Node::String(s) | Node::Number(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_default()
    };
    let (title, version) = (text("title"), text("version"));

    let paths = match doc.get("paths") {
        None => &[][..],
        Some(p) => p
            .entries()
            .ok_or_else(|| SpecError::NotOpenApi("`paths` must be a mapping".into()))?,
    };

    // The root server: origin and base path.
    let servers = doc.get("servers").and_then(Node::items).unwrap_or(&[]);
    for name in opts.server_vars.keys() {
        let known = servers
            .get(opts.server)
            .and_then(|s| s.get("variables"))
            .and_then(|v| v.get(name))
            .is_some();
        if !known {
            return Err(SpecError::Server(format!(
                "--server-var {name}: the chosen server has no variable {name:?}"
            )));
        }
    }
    let root_server = match servers.get(opts.server) {
        Some(s) => Some(resolve_server(s, &opts.server_vars)?),
        None if servers.is_empty() => None,
        None => {
            return Err(SpecError::Server(format!(
                "--server {}: the document lists only {} servers",
                opts.server,
                servers.len()
            )))
        }
    };
    let origin_text = match (&opts.origin, root_server.as_ref().and_then(|s| s.origin.clone())) {
        (Some(o), _) => o.clone(),
        (None, Some(o)) => o,
        (None, None) if root_server.is_none() => {
            return Err(SpecError::Server(
                "the document has no servers, so the upstream is unknown; pass --origin https://HOST (and --base-path if the API lives under a prefix)".into(),
            ))
        }
        (None, None) => {
            return Err(SpecError::Server(
                "the server URL is relative, so the upstream host is unknown; pass --origin https://HOST".into(),
            ))
        }
    };
    let origin = parse_origin(&origin_text)
        .map_err(|e| SpecError::Server(format!("{}: {e}", origin_text)))?
        .to_string();
    let base_path = match &opts.base_path {
        Some(b) => normalise_base(b)?,
        None => root_server.map(|s| s.base_path).unwrap_or_default(),
    };

    let mut skipped = Vec::new();
    let mut operations: Vec<Operation> = Vec::new();
    let mut shapes: HashMap<(Method, String), String> = HashMap::new();
    let mut seen_paths = std::collections::HashSet::new();
    for (path, item) in paths {
        if path.starts_with("x-") {
            continue;
        }
        if !seen_paths.insert(path.as_str()) {
            return Err(SpecError::NotOpenApi(format!(
                "path {path:?} is written twice"
            )));
        }
        let chain = path_item_chain(doc, item, path)?;
        // A path-level server overrides the root one for its operations.
        let path_server = chain.iter().find_map(|n| {
            n.get("servers")
                .and_then(Node::items)
                .and_then(|s| s.first())
        });
        let mut done = std::collections::HashSet::new();
        for m in OPERATION_METHODS.iter().chain(SKIPPED_METHODS) {
            let Some(op) = chain.iter().find_map(|n| n.get(m)) else {
                continue;
            };
            if !done.insert(*m) {
                continue;
            }
            let upper = m.to_ascii_uppercase();
            if SKIPPED_METHODS.contains(m) {
                skipped.push(format!(
                    "{upper} {path}: grants name only GET, PUT, POST, DELETE and PATCH"
                ));
                continue;
            }
            let method = Method::parse(&upper).expect("one of the five");
            let operation_id = op
                .get("operationId")
                .and_then(Node::as_str)
                .map(str::to_owned);
            let tags = tags_of(op);
            // An operation-level server beats the path's, which beats the root's.
            let server = op
                .get("servers")
                .and_then(Node::items)
                .and_then(|s| s.first())
                .or(path_server);
            let base = match server {
                None => base_path.clone(),
                Some(s) => {
                    let s = resolve_server(s, &BTreeMap::new())?;
                    if let Some(o) = &s.origin {
                        let same =
                            parse_origin(o).map(|o| o.to_string()).ok() == Some(origin.clone());
                        if !same && opts.origin.is_none() {
                            skipped
                                .push(format!("{upper} {path}: served from another origin ({o})"));
                            continue;
                        }
                    }
                    s.base_path
                }
            };
            let full = match grant_path(&base, path) {
                Ok(f) => f,
                Err(why) => {
                    skipped.push(format!("{upper} {path}: {why}"));
                    continue;
                }
            };
            if !opts.selects_all() {
                let chosen = tags.iter().any(|t| opts.tags.contains(t))
                    || operation_id
                        .as_ref()
                        .is_some_and(|id| opts.operation_ids.contains(id))
                    || opts
                        .path_prefixes
                        .iter()
                        .any(|p| full.starts_with(p.as_str()) || path.starts_with(p.as_str()));
                if !chosen {
                    continue;
                }
            }
            let route = match Route::new(method, &full) {
                Ok(r) => r,
                Err(e) => {
                    skipped.push(format!("{upper} {path}: {}", e.why));
                    continue;
                }
            };
            if let Some(first) = shapes.insert((method, route.shape()), route.to_string()) {
                warnings.push(format!(
                    "{route} matches the same requests as {first}; kept {first}"
                ));
                shapes.insert((method, route.shape()), first);
                continue;
            }
            operations.push(Operation {
                route,
                operation_id,
                tags,
            });
        }
    }
    operations.sort_by(|a, b| a.route.specificity_cmp(&b.route));
    Ok(Extraction {
        openapi,
        title,
        version,
        origin,
        base_path,
        operations,
        skipped,
        warnings,
    })
}
