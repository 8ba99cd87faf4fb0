//! gRPC server reflection (`grpc.reflection.v1` and `v1alpha`), answered by
//! `tonic-reflection` from the descriptor set embedded at build time, so
//! `grpcurl list`, `buf curl --list-methods` and friends need no schema file.
//! `tonic-web` lets the same service answer gRPC-Web, which `buf curl
//! --protocol grpcweb` uses for its reflection stream too.
//!
//! Reflection is a bidirectional stream: it needs HTTP/2 (h2c on this
//! plain-text port), whatever the framing.

use axum::Router;
use tonic_reflection::server::Builder;
use tower::Layer;

use crate::pb;

/// Path prefix of each reflection service version.
pub const SERVICES: [&str; 2] = [
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// The reflection services, routed by their gRPC paths.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let builder =
        || Builder::configure().register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET);
    // The descriptor set is this binary's own, compiled by build.rs; a test
    // builds both services, so failing here is a build defect, not input.
    let v1 = builder()
        .build_v1()
        .expect("the embedded descriptor set builds reflection v1");
    let v1alpha = builder()
        .build_v1alpha()
        .expect("the embedded descriptor set builds reflection v1alpha");
    let web = tonic_web::GrpcWebLayer::new();
    Router::new()
        .route_service(&format!("/{}/{{method}}", SERVICES[0]), web.layer(v1))
        .route_service(&format!("/{}/{{method}}", SERVICES[1]), web.layer(v1alpha))
}

#[cfg(test)]
mod tests {
    #[test]
    fn both_versions_build_from_the_embedded_descriptors() {
        let _ = super::router::<()>();
    }
}
