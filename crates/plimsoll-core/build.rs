//! Compiles the protocol 5 proto files with protox (pure Rust: no `protoc` on the machine).

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
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    pbjson_build::Builder::new()
        .register_descriptors(&bytes)?
        .build(&[".plimsoll.v1", ".plimsoll.sandboxd.v1"])?;
    Ok(())
}
