//! Compiles the protocol 5 proto files with protox (pure Rust: no `protoc` on the machine).
//!
//! Two passes: messages and clients with tonic's plain prost codec, then the servers alone
//! with `crate::codec::MarkedCodec`, which marks a request that cannot be decoded as a
//! `request` refusal. Clients must keep the plain codec: an answer that cannot be decoded
//! may have run, so it must never carry the not-dispatched mark.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/plimsoll/v1/sandbox.proto",
        "proto/plimsoll/v1/sandboxd.proto",
        "proto/google/rpc/status.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let bytes = fds.encode_to_vec();
    std::fs::write(out.join("descriptor.bin"), &bytes)?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_fds(fds.clone())?;
    let server_dir = out.join("server");
    std::fs::create_dir_all(&server_dir)?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(false)
        .out_dir(&server_dir)
        .codec_path("crate::codec::MarkedCodec")
        .extern_path(".plimsoll.v1", "crate::pb")
        .extern_path(".plimsoll.sandboxd.v1", "crate::sandboxd_pb")
        .extern_path(".google.rpc", "crate::rpc_status")
        .compile_fds(fds)?;
    pbjson_build::Builder::new()
        .register_descriptors(&bytes)?
        .build(&[".plimsoll.v1", ".plimsoll.sandboxd.v1"])?;
    Ok(())
}
