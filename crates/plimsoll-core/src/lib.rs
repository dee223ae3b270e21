//! plimsoll-core: the protocol 5 wire types, isolation tiers, refusals with their
//! not-dispatched mark, request validation, and the run-record digests.
//!
//! It never performs I/O and never runs code: everything here is pure data and
//! arithmetic that the daemon, sandboxd, the CLI and auditors share.

/// Generated code, nested as the proto packages are so cross-package paths resolve.
#[allow(clippy::all, missing_docs)]
pub mod proto {
    pub mod plimsoll {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/plimsoll.v1.rs"));
            include!(concat!(env!("OUT_DIR"), "/plimsoll.v1.serde.rs"));
            include!(concat!(env!("OUT_DIR"), "/server/plimsoll.v1.rs"));
        }
        pub mod sandboxd {
            pub mod v1 {
                include!(concat!(env!("OUT_DIR"), "/plimsoll.sandboxd.v1.rs"));
                include!(concat!(env!("OUT_DIR"), "/plimsoll.sandboxd.v1.serde.rs"));
                include!(concat!(env!("OUT_DIR"), "/server/plimsoll.sandboxd.v1.rs"));
            }
        }
    }
    pub mod google {
        pub mod rpc {
            include!(concat!(env!("OUT_DIR"), "/google.rpc.rs"));
        }
    }
}

/// The gRPC rich-error envelope (`google.rpc.Status`).
pub use proto::google::rpc as rpc_status;
/// Types of the plimsolld ↔ sandboxd channel (`plimsoll.sandboxd.v1`).
pub use proto::plimsoll::sandboxd::v1 as sandboxd_pb;
/// Protocol 5 types (`plimsoll.v1`) with proto3 JSON (serde) impls.
pub use proto::plimsoll::v1 as pb;

pub mod check;
pub mod codec;
pub mod digest;
pub mod refusal;
pub mod tier;
pub mod validate;

pub use refusal::{
    not_dispatched_reason, session_ended, unanswered_call, unanswered_status, Reason, Refusal,
};
pub use tier::{Floor, Tier};

/// The encoded `google.protobuf.FileDescriptorSet` of every proto file this crate compiles
/// (`plimsoll.v1`, `plimsoll.sandboxd.v1`, `google.rpc`), written by the build script: what
/// plimsolld's server reflection answers from.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptor.bin"));

/// The one protocol number this release serves.
pub const PROTOCOL: u32 = 5;
