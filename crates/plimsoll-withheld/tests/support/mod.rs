//! Test fixtures: layer tars, `docker save` archives and OCI layouts built from scratch, small
//! zip/gzip/xz builders, and the workspace's engine gate (`plimsoll_testkit::docker`: skip
//! without an engine unless PLIMSOLL_REQUIRE_DOCKER=1, then fail). Shared by the library's
//! and the CLI's tests.
#![allow(dead_code)]

use std::io::Write;
use std::path::Path;
use std::process::Command;

/// Deterministic noise (xorshift).
pub fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn sha256_hex(b: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, b).as_ref())
}

/// One entry of a layer.
pub enum T<'a> {
    File(&'a str, Vec<u8>),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
}

/// A tar (a layer, or an archive inside one). Headers are written by hand so names may be
/// anything a hostile image could hold (`..`, absolute paths), up to 100 bytes.
pub fn tar_of(entries: &[T<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        let (name, kind, link, data): (&str, u8, &str, &[u8]) = match e {
            T::File(n, d) => (n, b'0', "", d),
            T::Dir(n) => (n, b'5', "", &[]),
            T::Symlink(n, t) => (n, b'2', t, &[]),
        };
        assert!(
            name.len() <= 100 && link.len() <= 100,
            "name too long for the fixture"
        );
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..108].copy_from_slice(b"0000644\0");
        h[108..116].copy_from_slice(b"0000000\0");
        h[116..124].copy_from_slice(b"0000000\0");
        h[124..136].copy_from_slice(format!("{:011o}\0", data.len()).as_bytes());
        h[136..148].copy_from_slice(b"00000000000\0");
        h[156] = kind;
        h[157..157 + link.len()].copy_from_slice(link.as_bytes());
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

pub fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

pub fn zstd(b: &[u8]) -> Vec<u8> {
    zstd::stream::encode_all(b, 3).unwrap()
}

pub fn bzip2(b: &[u8]) -> Vec<u8> {
    let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::default());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

pub fn xz(b: &[u8]) -> Vec<u8> {
    let mut w =
        lzma_rust2::XzWriter::new(Vec::new(), lzma_rust2::XzOptions::with_preset(1)).unwrap();
    w.write_all(b).unwrap();
    w.finish().unwrap()
}

/// One zip member.
pub struct Z<'a> {
    pub name: &'a str,
    pub data: &'a [u8],
    pub deflate: bool,
    pub encrypted: bool,
    pub descriptor: bool,
}

impl<'a> Z<'a> {
    pub fn stored(name: &'a str, data: &'a [u8]) -> Z<'a> {
        Z {
            name,
            data,
            deflate: false,
            encrypted: false,
            descriptor: false,
        }
    }
    pub fn deflated(name: &'a str, data: &'a [u8]) -> Z<'a> {
        Z {
            deflate: true,
            ..Z::stored(name, data)
        }
    }
}

/// A zip with local headers, optional data descriptors, a central directory and an end record.
pub fn zip_of(members: &[Z<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for m in members {
        let offset = out.len() as u32;
        let crc = crc32fast::hash(m.data);
        let body = if m.deflate {
            let mut e =
                flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(m.data).unwrap();
            e.finish().unwrap()
        } else {
            m.data.to_vec()
        };
        let flags: u16 = u16::from(m.encrypted) | if m.descriptor { 8 } else { 0 };
        let method: u16 = if m.deflate { 8 } else { 0 };
        let (lcrc, lc, lu) = if m.descriptor {
            (0, 0, 0)
        } else {
            (crc, body.len() as u32, m.data.len() as u32)
        };
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        out.extend_from_slice(&20u16.to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&method.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&0x21u16.to_le_bytes());
        out.extend_from_slice(&lcrc.to_le_bytes());
        out.extend_from_slice(&lc.to_le_bytes());
        out.extend_from_slice(&lu.to_le_bytes());
        out.extend_from_slice(&(m.name.len() as u16).to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(m.name.as_bytes());
        out.extend_from_slice(&body);
        if m.descriptor {
            out.extend_from_slice(&0x0807_4b50u32.to_le_bytes());
            out.extend_from_slice(&crc.to_le_bytes());
            out.extend_from_slice(&(body.len() as u32).to_le_bytes());
            out.extend_from_slice(&(m.data.len() as u32).to_le_bytes());
        }
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&20u16.to_le_bytes());
        central.extend_from_slice(&20u16.to_le_bytes());
        central.extend_from_slice(&flags.to_le_bytes());
        central.extend_from_slice(&method.to_le_bytes());
        central.extend_from_slice(&0u16.to_le_bytes());
        central.extend_from_slice(&0x21u16.to_le_bytes());
        central.extend_from_slice(&crc.to_le_bytes());
        central.extend_from_slice(&(body.len() as u32).to_le_bytes());
        central.extend_from_slice(&(m.data.len() as u32).to_le_bytes());
        central.extend_from_slice(&(m.name.len() as u16).to_le_bytes());
        central.extend_from_slice(&[0u8; 8]);
        central.extend_from_slice(&0u32.to_le_bytes());
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(m.name.as_bytes());
    }
    let cd_offset = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&(members.len() as u16).to_le_bytes());
    out.extend_from_slice(&(members.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// The first bytes of a 7z archive, then noise.
pub fn seven_zip() -> Vec<u8> {
    let mut v = vec![b'7', b'z', 0xbc, 0xaf, 0x27, 0x1c, 0, 4];
    v.extend(noise(200, 77));
    v
}

fn config_json(layers: &[Vec<u8>], label: &str) -> Vec<u8> {
    let diff_ids: Vec<String> = layers
        .iter()
        .map(|l| format!("sha256:{}", sha256_hex(l)))
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": { "Labels": { "io.plimsoll.test": label } },
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    }))
    .unwrap()
}

/// A `docker save` (classic layout) archive: returns (archive, image ID = config digest).
pub fn docker_save(tag: &str, layers: &[Vec<u8>], label: &str) -> (Vec<u8>, String) {
    let config = config_json(layers, label);
    let config_hex = sha256_hex(&config);
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_ustar();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_mtime(0);
        b.append_data(&mut h, name, data).unwrap();
    };
    let mut names = Vec::new();
    for l in layers {
        let dir = sha256_hex(l);
        add(&format!("{dir}/VERSION"), b"1.0");
        add(&format!("{dir}/layer.tar"), l);
        names.push(format!("{dir}/layer.tar"));
    }
    add(&format!("{config_hex}.json"), &config);
    let manifest = serde_json::json!([{
        "Config": format!("{config_hex}.json"),
        "RepoTags": [tag],
        "Layers": names,
    }]);
    add("manifest.json", &serde_json::to_vec(&manifest).unwrap());
    (b.into_inner().unwrap(), format!("sha256:{config_hex}"))
}

/// An OCI image layout directory with gzip layers: returns the image's config digest.
pub fn oci_layout(dir: &Path, layers: &[Vec<u8>], label: &str) -> String {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |b: &[u8]| -> (String, usize) {
        let h = sha256_hex(b);
        std::fs::write(blobs.join(&h), b).unwrap();
        (format!("sha256:{h}"), b.len())
    };
    let config = config_json(layers, label);
    let (config_digest, config_size) = put(&config);
    let layer_descs: Vec<_> = layers
        .iter()
        .map(|l| {
            let (d, s) = put(&gzip(l));
            serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": s})
        })
        .collect();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
        "layers": layer_descs,
    }))
    .unwrap();
    let (md, ms) = put(&manifest);
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": ms}],
        }))
        .unwrap(),
    )
    .unwrap();
    config_digest
}

/// A name no other test or run uses.
pub fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{what}-{}-{nanos}", std::process::id())
}

/// An image loaded into the engine for one test; removed when dropped.
pub struct LoadedImage {
    pub tag: String,
    pub id: String,
}

impl LoadedImage {
    /// `docker load`s a built archive under a unique tag.
    pub fn load(dir: &Path, name: &str, layers: &[Vec<u8>]) -> (LoadedImage, std::path::PathBuf) {
        let tag = format!("plimsoll-withheld-test/{}:1", unique(name));
        let (archive, id) = docker_save(&tag, layers, &tag);
        let path = dir.join(format!("{name}.tar"));
        std::fs::write(&path, &archive).unwrap();
        let out = Command::new("docker")
            .arg("load")
            .arg("-i")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "docker load: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let inspect = Command::new("docker")
            .args(["image", "inspect", "--format", "{{.Id}}", &tag])
            .output()
            .unwrap();
        let engine_id = String::from_utf8_lossy(&inspect.stdout).trim().to_owned();
        assert!(!engine_id.is_empty(), "docker image inspect {tag}: no ID");
        // The classic store keys images by config digest; the containerd store by manifest.
        let _ = id;
        let img = LoadedImage { tag, id: engine_id };
        (img, path)
    }
}

impl Drop for LoadedImage {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rmi", "-f", &self.tag])
            .output();
        let _ = Command::new("docker")
            .args(["rmi", "-f", &self.id])
            .output();
    }
}
