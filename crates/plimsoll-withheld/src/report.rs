//! What a scan found in one image, its verdict, and the three renderings (text, JSON, SARIF
//! 2.1.0). A report names where material was found and which entry matched, never the bytes.

use serde::Serialize;
use serde_json::{json, Value};

use crate::known::{KnownImages, KnownItem};
use crate::set::Mode;

/// A find: an entry of the withheld set matched here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The layer's digest, `config` (the image config) or `export` (another file of the export).
    pub layer: String,
    /// Path inside the layer, with `!` between an archive and a path inside it; empty for the
    /// layer blob or config itself.
    pub path: String,
    /// The entry's id.
    pub entry_id: String,
    /// The entry's mode.
    pub mode: Mode,
    /// `file` (the whole file matched) or `run` (a run of bytes inside it).
    #[serde(rename = "match")]
    pub kind: &'static str,
}

/// A file the scan could not read to the end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unreadable {
    /// As in [`Finding::layer`].
    pub layer: String,
    /// As in [`Finding::path`].
    pub path: String,
    /// `format:<name>` or `limit:<name>`.
    pub reason: String,
    /// The whole file's size in bytes.
    pub size: u64,
    /// Whether the image's known list names this file (layer, path, reason and size).
    pub known: bool,
}

impl Unreadable {
    /// The known-list item that would acknowledge this file.
    pub fn item(&self) -> KnownItem {
        KnownItem {
            layer: self.layer.clone(),
            path: self.path.clone(),
            reason: self.reason.clone(),
            size: self.size,
        }
    }
}

/// What a scan decides about an image, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Nothing found, nothing unread that is not on the known list.
    Clean,
    /// Only audit-mode finds: report (plimsolld logs them), do not refuse.
    AuditOnly,
    /// A file could not be read and is not on the image's known list: refuse.
    UnknownUnreadable,
    /// A refuse-mode entry was found: refuse.
    Refuse,
}

impl Verdict {
    /// True when the image must not ship (scan exit 1, plimsolld does not serve).
    pub fn refuses(self) -> bool {
        matches!(self, Verdict::Refuse | Verdict::UnknownUnreadable)
    }

    /// `clean`, `audit-only`, `unknown-unreadable` or `refuse`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Clean => "clean",
            Verdict::AuditOnly => "audit-only",
            Verdict::UnknownUnreadable => "unknown-unreadable",
            Verdict::Refuse => "refuse",
        }
    }
}

/// Everything a scan found in one image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScanReport {
    /// The content ID the report (and the known list) is keyed by: the engine's image ID, or
    /// for an archive the config digest (the classic engine's image ID).
    pub image_id: String,
    /// SHA-256 of the image config.
    pub config_digest: String,
    /// What was scanned (`docker:<name>`, an archive path, an OCI layout directory).
    pub source: String,
    /// Names the export gives the image.
    pub tags: Vec<String>,
    /// The image's layers, lowest first.
    pub layers: Vec<String>,
    /// Finds, in stream order.
    pub findings: Vec<Finding>,
    /// Unreadable files, in stream order.
    pub unreadable: Vec<Unreadable>,
    /// Files, archive members and decoded streams read.
    pub files: u64,
    /// Bytes all decoders produced.
    pub decoded_bytes: u64,
    /// Finds or unreadable files beyond the report's caps (counted, not listed). Any makes
    /// the verdict at least `unknown-unreadable`.
    pub omitted: u64,
}

impl ScanReport {
    /// The verdict: refuse on a refuse-mode find, unknown-unreadable on an unreadable file not
    /// on the known list (audit-only sets too), audit-only on audit finds, else clean.
    pub fn verdict(&self) -> Verdict {
        if self.findings.iter().any(|f| f.mode == Mode::Refuse) {
            Verdict::Refuse
        } else if self.omitted > 0 || self.unreadable.iter().any(|u| !u.known) {
            Verdict::UnknownUnreadable
        } else if !self.findings.is_empty() {
            Verdict::AuditOnly
        } else {
            Verdict::Clean
        }
    }

    /// Marks each unreadable file known or not against `known` (by this report's image ID).
    pub fn apply_known(&mut self, known: &KnownImages) {
        for u in &mut self.unreadable {
            u.known = known.covers(&self.image_id, &u.item());
        }
    }

    /// The list `known-unreadable` writes for this image.
    pub fn known_items(&self) -> Vec<KnownItem> {
        self.unreadable.iter().map(Unreadable::item).collect()
    }
}

fn place(layer: &str, path: &str) -> String {
    match (layer, path) {
        ("config", "") => "image config".to_owned(),
        (l, "") => format!("layer {l} (the blob itself)"),
        ("export", p) => format!("export file {p}"),
        (l, p) => format!("layer {l} path {p}"),
    }
}

/// Human-readable report, one line per find or unreadable file.
pub fn render_text(reports: &[ScanReport]) -> String {
    let mut s = String::new();
    for r in reports {
        s.push_str(&format!(
            "image {} ({}): {}\n",
            r.image_id,
            r.source,
            r.verdict().as_str()
        ));
        for f in &r.findings {
            s.push_str(&format!(
                "  {} {} ({} match) in {}\n",
                f.mode.as_str(),
                f.entry_id,
                f.kind,
                place(&f.layer, &f.path)
            ));
        }
        for u in &r.unreadable {
            s.push_str(&format!(
                "  unreadable{} {} in {} size {}\n",
                if u.known {
                    " (known)"
                } else {
                    " (not on the known list)"
                },
                u.reason,
                place(&u.layer, &u.path),
                u.size
            ));
        }
        if r.omitted > 0 {
            s.push_str(&format!(
                "  {} more finds or unreadable files were not listed\n",
                r.omitted
            ));
        }
        s.push_str(&format!(
            "  read {} files in {} layers, decoded {} bytes\n",
            r.files,
            r.layers.len(),
            r.decoded_bytes
        ));
    }
    s
}

/// JSON report: `{"version":1,"images":[...]}` with each image's verdict.
pub fn render_json(reports: &[ScanReport]) -> Value {
    let images: Vec<Value> = reports
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).expect("a report serialises");
            v["verdict"] = json!(r.verdict().as_str());
            v
        })
        .collect();
    json!({ "version": 1, "images": images })
}

fn uri_path(layer: &str, path: &str) -> String {
    let raw = if path.is_empty() {
        layer.to_owned()
    } else {
        format!("{layer}/{path}")
    };
    let mut out = String::new();
    for b in raw.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/!:@".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// SARIF 2.1.0 log: one run, one rule per set entry found plus `unreadable`.
pub fn render_sarif(reports: &[ScanReport]) -> Value {
    let mut rules: Vec<Value> = Vec::new();
    let mut rule_ids: Vec<String> = Vec::new();
    let mut results = Vec::new();
    let mut rule_index = |id: String, text: String, level: &str, rules: &mut Vec<Value>| {
        if let Some(i) = rule_ids.iter().position(|r| *r == id) {
            return i;
        }
        rules.push(json!({
            "id": id,
            "shortDescription": { "text": text },
            "defaultConfiguration": { "level": level },
        }));
        rule_ids.push(id);
        rule_ids.len() - 1
    };
    for r in reports {
        for f in &r.findings {
            let level = match f.mode {
                Mode::Refuse => "error",
                Mode::Audit => "warning",
            };
            let rule = format!("withheld/{}", f.entry_id);
            let i = rule_index(
                rule.clone(),
                format!(
                    "withheld material {} ({} mode)",
                    f.entry_id,
                    f.mode.as_str()
                ),
                level,
                &mut rules,
            );
            results.push(json!({
                "ruleId": rule,
                "ruleIndex": i,
                "level": level,
                "message": { "text": format!(
                    "{} entry {} ({} match) in image {}, {}",
                    f.mode.as_str(), f.entry_id, f.kind, r.image_id, place(&f.layer, &f.path)) },
                "locations": [{
                    "physicalLocation": { "artifactLocation": { "uri": uri_path(&f.layer, &f.path) } },
                    "logicalLocations": [{ "name": f.layer, "fullyQualifiedName": format!("{}/{}", r.image_id, f.layer), "kind": "module" }],
                }],
                "properties": { "imageId": r.image_id, "layer": f.layer, "path": f.path, "mode": f.mode.as_str() },
            }));
        }
        for u in &r.unreadable {
            let level = if u.known { "note" } else { "error" };
            let i = rule_index(
                "unreadable".into(),
                "a file the scan could not read".into(),
                "error",
                &mut rules,
            );
            results.push(json!({
                "ruleId": "unreadable",
                "ruleIndex": i,
                "level": level,
                "message": { "text": format!(
                    "unreadable ({}{}) in image {}, {}, size {}",
                    u.reason, if u.known { ", on the known list" } else { ", not on the known list" },
                    r.image_id, place(&u.layer, &u.path), u.size) },
                "locations": [{
                    "physicalLocation": { "artifactLocation": { "uri": uri_path(&u.layer, &u.path) } },
                    "logicalLocations": [{ "name": u.layer, "fullyQualifiedName": format!("{}/{}", r.image_id, u.layer), "kind": "module" }],
                }],
                "properties": { "imageId": r.image_id, "layer": u.layer, "path": u.path, "reason": u.reason, "size": u.size, "known": u.known },
            }));
        }
    }
    json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": { "driver": {
                "name": "plimsoll-withheld",
                "version": env!("CARGO_PKG_VERSION"),
                "rules": rules,
            }},
            "results": results,
            "properties": {
                "images": reports.iter().map(|r| json!({
                    "imageId": r.image_id, "source": r.source, "verdict": r.verdict().as_str()
                })).collect::<Vec<_>>(),
            },
        }],
    })
}
