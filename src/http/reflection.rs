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
    use axum::body::Body;
    use http_body_util::BodyExt;
    use prost::Message;
    use tonic_reflection::pb::{v1, v1alpha};
    use tower::ServiceExt;

    use crate::pb;

    /// One reflection request through the router as a gRPC client sends it
    /// (a single length-prefixed message, then the end of the stream); the
    /// messages of the answer and its `grpc-status`.
    async fn reflect(service: &str, request: Vec<u8>) -> (Vec<Vec<u8>>, String) {
        let mut body = vec![0u8];
        body.extend_from_slice(&u32::try_from(request.len()).unwrap().to_be_bytes());
        body.extend_from_slice(&request);
        // Plain gRPC: HTTP/2, as on the wire (h2c).
        let request = http::Request::post(format!("/{service}/ServerReflectionInfo"))
            .version(http::Version::HTTP_2)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header("te", "trailers")
            .body(Body::from(body))
            .unwrap();
        let answer = super::router::<()>().oneshot(request).await.unwrap();
        assert_eq!(answer.status(), http::StatusCode::OK);
        let collected = answer.into_body().collect().await.unwrap();
        let status = collected
            .trailers()
            .and_then(|trailers| trailers.get("grpc-status"))
            .map(|status| status.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let mut rest = &collected.to_bytes()[..];
        let mut messages = Vec::new();
        while rest.len() >= 5 {
            let length = u32::from_be_bytes(rest[1..5].try_into().unwrap()) as usize;
            messages.push(rest[5..5 + length].to_vec());
            rest = &rest[5 + length..];
        }
        (messages, status)
    }

    #[tokio::test]
    async fn v1_lists_the_scheduler_and_describes_it() {
        use v1::{
            ServerReflectionRequest, ServerReflectionResponse,
            server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        };
        let ask = |request| {
            ServerReflectionRequest {
                host: String::new(),
                message_request: Some(request),
            }
            .encode_to_vec()
        };
        let (answers, status) = reflect(
            super::SERVICES[0],
            ask(MessageRequest::ListServices(String::new())),
        )
        .await;
        assert_eq!(status, "0");
        let answer = ServerReflectionResponse::decode(&answers[0][..]).unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
            panic!("{answer:?}");
        };
        let names: Vec<_> = list
            .service
            .iter()
            .map(|service| service.name.as_str())
            .collect();
        assert!(names.contains(&pb::SCHEDULER_SERVICE), "{names:?}");

        let (answers, status) = reflect(
            super::SERVICES[0],
            ask(MessageRequest::FileContainingSymbol(
                pb::SCHEDULER_SERVICE.to_owned(),
            )),
        )
        .await;
        assert_eq!(status, "0");
        let answer = ServerReflectionResponse::decode(&answers[0][..]).unwrap();
        let Some(MessageResponse::FileDescriptorResponse(files)) = answer.message_response else {
            panic!("{answer:?}");
        };
        let described = files.file_descriptor_proto.iter().any(|file| {
            prost_types::FileDescriptorProto::decode(&file[..]).is_ok_and(|file| {
                file.service
                    .iter()
                    .any(|service| pb::SCHEDULER_SERVICE.ends_with(service.name()))
            })
        });
        assert!(described, "no file describes {}", pb::SCHEDULER_SERVICE);
    }

    #[tokio::test]
    async fn v1alpha_lists_the_scheduler() {
        use v1alpha::{
            ServerReflectionRequest, ServerReflectionResponse,
            server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        };
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let (answers, status) = reflect(super::SERVICES[1], request.encode_to_vec()).await;
        assert_eq!(status, "0");
        let answer = ServerReflectionResponse::decode(&answers[0][..]).unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
            panic!("{answer:?}");
        };
        assert!(
            list.service
                .iter()
                .any(|service| service.name == pb::SCHEDULER_SERVICE),
            "{list:?}"
        );
    }
}
