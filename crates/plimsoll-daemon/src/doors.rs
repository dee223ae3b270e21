//! The standard gRPC doors beside `plimsoll.v1.SandboxService` on the RPC listener: the
//! health service (`grpc.health.v1.Health`, for Kubernetes `grpc:` probes and load
//! balancers) and server reflection (`grpc.reflection.v1` and `v1alpha`, for grpcurl and
//! grpcio). Both answer without a caller token, so neither sits behind the authenticator.
//! Neither runs anything or says anything about callers: health states serving or
//! draining, reflection the public schema of `plimsoll.v1`.

use plimsoll_core::pb::sandbox_service_server::SERVICE_NAME as SANDBOX_SERVICE;
use prost::Message;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// The services health states: the whole server (`""`) and `plimsoll.v1.SandboxService`.
pub const HEALTH_SERVICES: [&str; 2] = ["", SANDBOX_SERVICE];

/// The health service's states, set by the daemon as it serves and drains.
#[derive(Debug, Clone)]
pub struct HealthDoor {
    reporter: HealthReporter,
}

impl HealthDoor {
    /// The health service, stating `SERVING` for every one of [`HEALTH_SERVICES`]. The
    /// daemon builds it once the provider has started and passed its checks, just before
    /// it serves: nothing can ask earlier, because nothing listens earlier.
    pub async fn serving() -> (HealthDoor, HealthServer<impl Health>) {
        let (reporter, server) = tonic_health::server::health_reporter();
        for name in HEALTH_SERVICES {
            reporter
                .set_service_status(name, ServingStatus::Serving)
                .await;
        }
        (HealthDoor { reporter }, server)
    }

    /// Draining: every service states `NOT_SERVING` (a `Watch` stream gets that answer), then
    /// the states are withdrawn, which ends every `Watch` stream so an open one does not
    /// hold the drain for the whole grace period. A `Check` after that is `NOT_FOUND`, which
    /// probes read as unhealthy too; new connections are refused by then anyway.
    pub async fn draining(mut self) {
        for name in HEALTH_SERVICES {
            self.reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
        for name in HEALTH_SERVICES {
            self.reporter.clear_service_status(name).await;
        }
    }
}

/// The services reflection lists: the ones this listener serves.
pub const REFLECTED_SERVICES: [&str; 4] = [
    SANDBOX_SERVICE,
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// The reflection builder over plimsoll-core's descriptor set (without
/// `plimsoll.sandboxd.v1`, which plimsolld does not serve), health's and reflection's own.
fn reflection_builder() -> tonic_reflection::server::Builder<'static> {
    let mut ours = prost_types::FileDescriptorSet::decode(plimsoll_core::FILE_DESCRIPTOR_SET)
        .expect("plimsoll-core's build script writes a valid descriptor set");
    ours.file
        .retain(|f| f.package.as_deref() != Some("plimsoll.sandboxd.v1"));
    let mut b = tonic_reflection::server::Builder::configure()
        .include_reflection_service(false)
        .register_file_descriptor_set(ours)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET);
    for name in REFLECTED_SERVICES {
        b = b.with_service_name(name);
    }
    b
}

/// Server reflection, `v1`.
pub fn reflection_v1() -> tonic_reflection::server::v1::ServerReflectionServer<
    impl tonic_reflection::server::v1::ServerReflection,
> {
    reflection_builder()
        .build_v1()
        .expect("the compiled-in descriptor sets are valid")
}

/// Server reflection, `v1alpha` (what older grpcurl and grpcio releases ask).
pub fn reflection_v1alpha() -> tonic_reflection::server::v1alpha::ServerReflectionServer<
    impl tonic_reflection::server::v1alpha::ServerReflection,
> {
    reflection_builder()
        .build_v1alpha()
        .expect("the compiled-in descriptor sets are valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_sets_build_and_declare_sandbox_service_run() {
        let _ = (reflection_v1(), reflection_v1alpha());
        let set =
            prost_types::FileDescriptorSet::decode(plimsoll_core::FILE_DESCRIPTOR_SET).unwrap();
        let sandbox = set
            .file
            .iter()
            .find(|f| f.package.as_deref() == Some("plimsoll.v1"))
            .expect("plimsoll.v1 is in the set");
        let svc = sandbox
            .service
            .iter()
            .find(|s| s.name.as_deref() == Some("SandboxService"))
            .expect("SandboxService is declared");
        assert!(svc.method.iter().any(|m| m.name.as_deref() == Some("Run")));
    }
}
