//! The OpenAPI reader against small documents of every kind it must handle: 3.0 and 3.1,
//! JSON and YAML, with and without a server base path, with server variables, with `$ref`s,
//! and malformed.

use plimsoll_openapi::{read, read_yaml_counted, Extraction, Options, SpecError, YamlLimits};

const CLOUDFLARE_LIKE_JSON: &str = r##"{
  "openapi": "3.0.3",
  "info": {"title": "Zones API", "version": "4.0.0"},
  "servers": [{"url": "https://api.cloudflare.example/client/v4", "description": "Client API"}],
  "paths": {
    "/zones": {
      "get": {"operationId": "listZones", "tags": ["zones"], "responses": {"200": {"description": "ok"}}},
      "post": {"operationId": "createZone", "tags": ["zones", "admin"], "requestBody": {"content": {}}}
    },
    "/zones/{zone_id}": {
      "parameters": [{"name": "zone_id", "in": "path", "required": true}],
      "get": {"operationId": "getZone", "tags": ["zones"]},
      "delete": {"operationId": "deleteZone", "tags": ["admin"]},
      "head": {"operationId": "headZone"}
    },
    "/zones/{zone_id}/dns_records/{id}.json": {"get": {"operationId": "legacy"}},
    "/user": {"get": {"operationId": "me", "tags": ["user"]}}
  },
  "components": {"schemas": {"Zone": {"type": "object", "properties": {"self": {"$ref": "#/components/schemas/Zone"}}}}}
}"##;

const GHES_LIKE_YAML: &str = r#"
openapi: 3.1.0
info:
  title: Enterprise Server
  version: "3.22"
servers:
  - url: '{protocol}://{hostname}/api/v3'
    variables:
      protocol:
        default: https
      hostname:
        default: ghe.example.com
paths:
  /repos/{owner}/{repo}:
    get:
      operationId: repos/get
      tags: [repos]
      parameters: &params
        - name: owner
          in: path
  /repos/{owner}/{repo}/issues:
    get:
      operationId: issues/list
      tags: [issues]
      parameters: *params
    post:
      operationId: issues/create
      tags: [issues]
  /meta:
    $ref: '#/components/pathItems/meta'
components:
  pathItems:
    meta:
      get:
        operationId: meta/get
        tags: [meta]
"#;

fn opts() -> Options {
    Options::default()
}

/// Reads `doc` with the default options and checks where its routes live and what they are.
fn read_checked(doc: &str, origin: &str, base_path: &str, routes: &[&str]) -> Extraction {
    let x = read(doc.as_bytes(), &opts()).unwrap();
    assert_eq!(x.origin, origin);
    assert_eq!(x.base_path, base_path);
    assert_eq!(x.route_strings(), routes);
    x
}

#[test]
fn a_server_base_path_prefixes_every_route_in_3_0_json() {
    let x = read_checked(
        CLOUDFLARE_LIKE_JSON,
        "https://api.cloudflare.example",
        "/client/v4",
        &[
            "GET /client/v4/user",
            "GET /client/v4/zones",
            "POST /client/v4/zones",
            "GET /client/v4/zones/{zone_id}",
            "DELETE /client/v4/zones/{zone_id}",
        ],
    );
    assert!(
        x.skipped
            .iter()
            .any(|s| s.starts_with("HEAD /zones/{zone_id}")),
        "{:?}",
        x.skipped
    );
    assert!(
        x.skipped
            .iter()
            .any(|s| s.contains("{id}.json") && s.contains("shares its segment")),
        "{:?}",
        x.skipped
    );
    assert_eq!(x.title, "Zones API");
}

#[test]
fn server_variables_resolve_to_defaults_in_3_1_yaml() {
    read_checked(
        GHES_LIKE_YAML,
        "https://ghe.example.com",
        "/api/v3",
        &[
            "GET /api/v3/meta",
            "GET /api/v3/repos/{owner}/{repo}",
            "GET /api/v3/repos/{owner}/{repo}/issues",
            "POST /api/v3/repos/{owner}/{repo}/issues",
        ],
    );
    // An override beats the default; an unknown variable is an error naming it.
    let mut o = opts();
    o.server_vars
        .insert("hostname".into(), "127.0.0.1:8443".into());
    let x = read(GHES_LIKE_YAML.as_bytes(), &o).unwrap();
    assert_eq!(x.origin, "https://127.0.0.1:8443");
    let mut o = opts();
    o.server_vars.insert("port".into(), "1".into());
    let e = read(GHES_LIKE_YAML.as_bytes(), &o).unwrap_err();
    assert!(e.to_string().contains("port"), "{e}");
}

#[test]
fn no_base_path_and_the_same_document_as_json_and_yaml() {
    let json = r#"{"openapi":"3.0.0","servers":[{"url":"https://api.github.example/"}],
        "paths":{"/":{"get":{}},"/users/{username}":{"get":{"operationId":"users/get"}}}}"#;
    let yaml = "openapi: 3.0.0\nservers:\n  - url: https://api.github.example/\npaths:\n  /:\n    get: {}\n  /users/{username}:\n    get:\n      operationId: users/get\n";
    let a = read(json.as_bytes(), &opts()).unwrap();
    let b = read(yaml.as_bytes(), &opts()).unwrap();
    assert_eq!(a.base_path, "");
    assert_eq!(a.route_strings(), vec!["GET /", "GET /users/{username}"]);
    assert_eq!(a, b);
}

#[test]
fn selection_by_tag_operation_id_and_prefix() {
    let doc = CLOUDFLARE_LIKE_JSON.as_bytes();
    let mut o = opts();
    o.tags = vec!["admin".into()];
    assert_eq!(
        read(doc, &o).unwrap().route_strings(),
        vec!["POST /client/v4/zones", "DELETE /client/v4/zones/{zone_id}"]
    );
    let mut o = opts();
    o.operation_ids = vec!["me".into(), "getZone".into()];
    assert_eq!(
        read(doc, &o).unwrap().route_strings(),
        vec!["GET /client/v4/user", "GET /client/v4/zones/{zone_id}"]
    );
    let mut o = opts();
    o.path_prefixes = vec!["/client/v4/user".into()];
    assert_eq!(
        read(doc, &o).unwrap().route_strings(),
        vec!["GET /client/v4/user"]
    );
    let mut o = opts();
    o.path_prefixes = vec!["/user".into()];
    assert_eq!(
        read(doc, &o).unwrap().route_strings(),
        vec!["GET /client/v4/user"]
    );
}

#[test]
fn missing_and_relative_servers_need_an_origin() {
    let none = r#"{"openapi":"3.1.0","paths":{"/a":{"get":{}}}}"#;
    let e = read(none.as_bytes(), &opts()).unwrap_err();
    assert!(
        matches!(e, SpecError::Server(_)) && e.to_string().contains("--origin"),
        "{e}"
    );
    let mut o = opts();
    o.origin = Some("https://api.example.com".into());
    o.base_path = Some("/v2/".into());
    assert_eq!(
        read(none.as_bytes(), &o).unwrap().route_strings(),
        vec!["GET /v2/a"]
    );

    let relative = r#"{"openapi":"3.0.1","servers":[{"url":"/api"}],"paths":{"/a":{"get":{}}}}"#;
    let e = read(relative.as_bytes(), &opts()).unwrap_err();
    assert!(e.to_string().contains("relative"), "{e}");
    let mut o = opts();
    o.origin = Some("http://127.0.0.1:8080".into());
    assert_eq!(
        read(relative.as_bytes(), &o).unwrap().route_strings(),
        vec!["GET /api/a"]
    );

    let plain_http =
        r#"{"openapi":"3.0.1","servers":[{"url":"http://api.example.com"}],"paths":{}}"#;
    let e = read(plain_http.as_bytes(), &opts()).unwrap_err();
    assert!(e.to_string().contains("https"), "{e}");

    let unset = r#"{"openapi":"3.0.1","servers":[{"url":"https://{host}/x","variables":{"host":{"enum":["a"]}}}],"paths":{}}"#;
    let e = read(unset.as_bytes(), &opts()).unwrap_err();
    assert!(e.to_string().contains("no default"), "{e}");
}

#[test]
fn path_and_operation_servers_override_the_root() {
    let doc = r#"{"openapi":"3.0.3","servers":[{"url":"https://api.example.com/v1"}],"paths":{
        "/a":{"servers":[{"url":"https://api.example.com/v2"}],"get":{},"put":{"servers":[{"url":"/v3"}]}},
        "/b":{"get":{"servers":[{"url":"https://uploads.example.com"}]}},
        "/c":{"get":{}}}}"#;
    let x = read(doc.as_bytes(), &opts()).unwrap();
    assert_eq!(
        x.route_strings(),
        vec!["GET /v1/c", "GET /v2/a", "PUT /v3/a"]
    );
    assert!(
        x.skipped.iter().any(|s| s.contains("another origin")),
        "{:?}",
        x.skipped
    );
}

#[test]
fn ref_cycles_external_refs_and_dangling_refs_are_clear_errors() {
    let cycle = r##"{"openapi":"3.1.0","servers":[{"url":"https://a.example"}],"paths":{
        "/a":{"$ref":"#/components/pathItems/x"}},
        "components":{"pathItems":{"x":{"$ref":"#/components/pathItems/y"},"y":{"$ref":"#/components/pathItems/x"}}}}"##;
    let e = read(cycle.as_bytes(), &opts()).unwrap_err();
    assert!(matches!(e, SpecError::Ref(_)), "{e}");
    assert!(
        e.to_string().contains("cycle") && e.to_string().contains("#/components/pathItems/x"),
        "{e}"
    );

    let external = r#"{"openapi":"3.1.0","servers":[{"url":"https://a.example"}],"paths":{"/a":{"$ref":"other.yaml#/x"}}}"#;
    let e = read(external.as_bytes(), &opts()).unwrap_err();
    assert!(e.to_string().contains("outside the document"), "{e}");

    let dangling = r##"{"openapi":"3.1.0","servers":[{"url":"https://a.example"}],"paths":{"/a":{"$ref":"#/components/pathItems/nope"}}}"##;
    let e = read(dangling.as_bytes(), &opts()).unwrap_err();
    assert!(e.to_string().contains("does not resolve"), "{e}");

    // A pointer with escapes resolves to another path item.
    let escaped = r##"{"openapi":"3.1.0","servers":[{"url":"https://a.example"}],"paths":{
        "/a/{id}":{"get":{}},"/b":{"$ref":"#/paths/~1a~1%7Bid%7D"}}}"##;
    assert_eq!(
        read(escaped.as_bytes(), &opts()).unwrap().route_strings(),
        vec!["GET /a/{id}", "GET /b"]
    );

    // Recursive schemas are not an error: schemas are never read.
    assert!(read(CLOUDFLARE_LIKE_JSON.as_bytes(), &opts()).is_ok());
}

#[test]
fn malformed_documents_are_clear_errors() {
    for (doc, needle) in [
        (&b"{\"openapi\": \"3.0.0\", "[..], "malformed JSON"),
        (b"openapi: [3.0\npaths: {", "malformed YAML"),
        (b"\xff\xfe", "not UTF-8"),
        (b"swagger: '2.0'\npaths: {}\n", "Swagger 2.0"),
        (b"- a\n- b\n", "not a mapping"),
        (b"title: x\n", "no `openapi` field"),
        (b"openapi: 2.5\n", "not supported"),
        (
            b"{\"openapi\":\"3.0.0\",\"paths\":[]}",
            "`paths` must be a mapping",
        ),
        (b"", "empty"),
    ] {
        let e = read(doc, &opts()).unwrap_err();
        assert!(
            e.to_string().contains(needle),
            "{:?}: {e}",
            String::from_utf8_lossy(doc)
        );
    }
    // Positions are reported.
    let e = read(b"openapi: 3.0.0\npaths:\n  /a: [\n", &opts()).unwrap_err();
    assert!(e.to_string().contains("line"), "{e}");
}

#[test]
fn a_yaml_alias_bomb_is_read_without_expanding() {
    let mut doc = String::from("openapi: 3.1.0\nservers: [{url: 'https://a.example'}]\npaths: {}\nx-bomb:\n  l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..40 {
        let p = i - 1;
        doc.push_str(&format!(
            "  l{i}: &l{i} [*l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}]\n"
        ));
    }
    // 9^40 strings if expanded; it reads at once, and nothing walks the shared tree.
    let x = read(doc.as_bytes(), &opts()).unwrap();
    assert!(x.operations.is_empty());
}

#[test]
fn fuzz_entry_point_takes_garbage() {
    for d in [
        &b""[..],
        b"{",
        b"openapi: 3.0.0\npaths:\n  /a/{x}{y}:\n    get: {}\n",
        b"openapi: 3.0.0\npaths:\n  /a/{x}:\n    get: {}\n  /a/{y}:\n    get: {}\n",
        b"{\"openapi\":\"3.1.0\",\"paths\":{\"/a/%2F\":{\"get\":{}},\"/..\":{\"get\":{}}}}",
        b"openapi: 3.0.0\npaths:\n  x: {get: {}}\n",
    ] {
        plimsoll_openapi::fuzz_read(d);
    }
}

const HEAD: &str = "openapi: 3.1.0\nservers: [{url: 'https://a.example'}]\npaths: {}\n";

/// `x-s: &S {k0: 0, ..}` with `keys` keys, `x-l: &L [*S, ..]` with `aliases` aliases and
/// `x-m: {<<: *L}`: merging looks at keys × aliases entries, each against every key already
/// merged (cubic in the document's length when done by scanning).
fn merge_bomb(keys: usize, aliases: usize) -> String {
    let mut d = String::from(HEAD);
    d.push_str("x-s: &S {");
    for i in 0..keys {
        d.push_str(&format!("k{i}: 0, "));
    }
    d.push_str("}\nx-l: &L [");
    d.push_str(&"*S, ".repeat(aliases));
    d.push_str("]\nx-m: {<<: *L}\n");
    d
}

/// A mapping of `keys` keys of `key_bytes` bytes each, merged into `maps` small mappings:
/// copying the keys costs maps × keys × key_bytes bytes.
fn merge_copy_bomb(keys: usize, key_bytes: usize, maps: usize) -> String {
    let mut d = String::from(HEAD);
    d.push_str("x-s: &S {");
    for i in 0..keys {
        d.push_str(&format!("{i:x<key_bytes$}: 0, "));
    }
    d.push_str("}\n");
    for i in 0..maps {
        d.push_str(&format!("m{i}: {{<<: *S}}\n"));
    }
    d
}

#[test]
fn yaml_merge_keys_stay_within_their_limits_even_in_a_megabyte() {
    let limits = YamlLimits::default();
    let max_steps = limits.max_merged_entries as u64 + 1;
    // 400 × 1000 merged entries: under the limit, a result.
    let small = merge_bomb(400, 1000);
    let (node, stats) = read_yaml_counted(&small, limits);
    assert!(
        stats.merge_steps <= max_steps,
        "{} bytes: {stats:?}",
        small.len()
    );
    let merged = node.unwrap();
    assert_eq!(merged.get("x-m").unwrap().entries().unwrap().len(), 400);
    // The reported 41 KB shape, and a megabyte of it: a clear error, at the limit.
    for (keys, aliases) in [(3000, 7000), (40_000, 150_000)] {
        let doc = merge_bomb(keys, aliases);
        let (node, stats) = read_yaml_counted(&doc, limits);
        assert!(
            stats.merge_steps <= max_steps,
            "{} bytes: {stats:?}",
            doc.len()
        );
        assert!(stats.events <= doc.len() as u64, "{stats:?}");
        let e = node.unwrap_err();
        assert!(e.message.contains("merge keys"), "{e}");
    }
    let mb = merge_bomb(40_000, 150_000);
    assert!(mb.len() >= 1_000_000, "{}", mb.len());
    let e = read(mb.as_bytes(), &opts()).unwrap_err();
    assert!(
        e.to_string().starts_with("malformed YAML: merge keys (<<)"),
        "{e}"
    );

    // A megabyte of long keys merged into many small mappings: the copies are bounded by
    // bytes, not only by entries (16 keys × 32 KiB into 40,000 mappings would be 20 GiB).
    let copies = merge_copy_bomb(16, 32 * 1024, 40_000);
    assert!(copies.len() >= 1_000_000, "{}", copies.len());
    let (node, stats) = read_yaml_counted(&copies, limits);
    assert!(
        stats.merge_bytes <= limits.max_merged_bytes as u64 + 32 * 1024 + 64,
        "{stats:?}"
    );
    assert!(stats.merge_steps <= max_steps, "{stats:?}");
    let e = node.unwrap_err();
    assert!(e.message.contains("merge keys"), "{e}");
}
