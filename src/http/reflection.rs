//! gRPC server reflection (`grpc.reflection.v1` and `v1alpha`), answered by
//! `tonic-reflection` from the descriptor sets embedded at build time (the
//! scheduler's, the health service's and reflection's own), so `grpcurl
//! list`, `buf curl --list-methods` and friends need no schema file. Served
//! over gRPC, gRPC-Web and Connect ([`super::connect_bridge`]), so `buf curl`
//! works with its default protocol (Connect).
//!
//! Reflection is a bidirectional stream: it needs HTTP/2 (h2c on this
//! plain-text port), whatever the protocol.

use axum::Router;
use tonic_reflection::server::Builder;

use super::connect_bridge::bridged;
use crate::pb;

/// Path prefix of each reflection service version.
pub const SERVICES: [&str; 2] = [
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// The reflection services, routed by their paths.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    // Both versions describe every service served, both versions of
    // reflection included (by default each would list only itself).
    let builder = || {
        Builder::configure()
            .include_reflection_service(false)
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(
                tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
            )
    };
    // The descriptor sets are this binary's own, compiled by build.rs and
    // tonic's crates; a test builds both services, so failing here is a
    // build defect, not input.
    let v1 = builder()
        .build_v1()
        .expect("the embedded descriptor sets build reflection v1");
    let v1alpha = builder()
        .build_v1alpha()
        .expect("the embedded descriptor sets build reflection v1alpha");
    Router::new()
        .route_service(&format!("/{}/{{method}}", SERVICES[0]), bridged(v1))
        .route_service(&format!("/{}/{{method}}", SERVICES[1]), bridged(v1alpha))
}

#[cfg(test)]
mod tests {
    #[test]
    fn both_versions_build_from_the_embedded_descriptors() {
        let _ = super::router::<()>();
    }
}
