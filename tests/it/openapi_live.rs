//! The OpenAPI document against a running server on a real socket: for
//! each RPC and route style, an example request built from the schema is
//! accepted (JSON and binary) and the answers validate against the
//! documented response schemas; the endpoints that are not RPCs answer as
//! documented; one keep-alive connection serves daemon calls and the rest.

use std::collections::BTreeMap;

use prost::Message as _;
use prost_reflect::DynamicMessage;
use serde_json::Value;
use yadcc_pb::{self as pb, Method};
use yadcc_scheduler::{http::dialect::RouteStyle, openapi};

use crate::openapi_schema::{
    STYLES, Schemas, authorized, client, document, example, for_this_deployment, start_server,
};

#[tokio::test]
async fn example_requests_built_from_the_schema_are_accepted() {
    let doc = document();
    let schemas = Schemas::of(&doc);
    let addr = start_server().await;
    let client = client();
    // RPC name -> how many answers were validated against the 200 schema.
    let mut validated: BTreeMap<String, usize> = BTreeMap::new();

    // Proto order: Heartbeat first, so the servant it registers serves the
    // later WaitForStartingTask.
    for rpc in Method::ALL {
        let method = rpc.descriptor();
        for dialect in STYLES {
            let path = dialect.path(rpc).to_owned();
            let operation = &doc["paths"][&path]["post"];
            let request_schema =
                &operation["requestBody"]["content"][openapi::JSON_MEDIA_TYPE]["schema"];
            let mut request = example(&doc, request_schema, 0);
            for_this_deployment(&mut request);
            let problems = schemas.problems(request_schema, &request);
            assert!(
                problems.is_empty(),
                "{path}: example {request} is invalid: {problems:?}"
            );

            // proto3 JSON, then binary protobuf: the same example, encoded.
            let binary = DynamicMessage::deserialize(method.input(), request.clone())
                .unwrap_or_else(|error| panic!("{path}: example is not proto3 JSON: {error}"))
                .encode_to_vec();
            let ok_schema =
                &operation["responses"]["200"]["content"][openapi::JSON_MEDIA_TYPE]["schema"];
            for (media_type, body) in [
                (openapi::JSON_MEDIA_TYPE, request.to_string().into_bytes()),
                (openapi::PROTOBUF_MEDIA_TYPE, binary),
            ] {
                let mut call = authorized(
                    &path,
                    client
                        .post(format!("http://{addr}{path}"))
                        .header("content-type", media_type)
                        .body(body),
                );
                if dialect == RouteStyle::HttpPb {
                    call = call.header(openapi::RPC_SEQ_NO, "17");
                }
                let response = call
                    .send()
                    .await
                    .unwrap_or_else(|error| panic!("{path} ({media_type}): {error}"));
                let Some(body) =
                    check_answer(&schemas, operation, dialect, media_type, response, &path).await
                else {
                    continue;
                };
                // Either way the answer is checked in proto3 JSON, the
                // form the schema describes.
                let answer: Value = if media_type == openapi::JSON_MEDIA_TYPE {
                    serde_json::from_slice(&body)
                        .unwrap_or_else(|error| panic!("{path}: 200 body is not JSON: {error}"))
                } else {
                    let message = DynamicMessage::decode(method.output(), body.as_slice())
                        .unwrap_or_else(|error| {
                            panic!("{path}: 200 body is not protobuf: {error}")
                        });
                    serde_json::to_value(&message).unwrap()
                };
                let problems = schemas.problems(ok_schema, &answer);
                assert!(
                    problems.is_empty(),
                    "{path} ({media_type}): answer {answer} does not match: {problems:?}"
                );
                *validated.entry(method.name().to_owned()).or_default() += 1;
            }
        }
    }
    for method in Method::ALL {
        assert!(
            validated.get(method.name()).copied().unwrap_or(0) > 0,
            "no 200 answer of {method} was checked against its schema (answers: {validated:?})"
        );
    }
}

/// Checks one RPC answer against the operation; returns the body of a 200.
async fn check_answer(
    schemas: &Schemas,
    operation: &Value,
    dialect: RouteStyle,
    media_type: &str,
    response: reqwest::Response,
    path: &str,
) -> Option<Vec<u8>> {
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.bytes().await.expect("body").to_vec();
    let documented = &operation["responses"][status.as_str()];
    assert!(
        documented.is_object(),
        "{path} ({media_type}): status {status} is not documented: {}",
        String::from_utf8_lossy(&body)
    );
    if dialect == RouteStyle::HttpPb {
        assert_eq!(
            headers
                .get(openapi::RPC_SEQ_NO)
                .map(|v| v.to_str().unwrap()),
            Some("17"),
            "{path}: Rpc-SeqNo is echoed"
        );
    }
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if status.is_success() {
        assert_eq!(status, 200, "{path}");
        assert_eq!(
            content_type, media_type,
            "{path}: the answer echoes the request's type"
        );
        return Some(body);
    }

    // A failure: JSON whatever the request's type, matching ErrorBody, and a
    // scheduler outcome: a valid request is never "malformed".
    assert_eq!(
        content_type,
        openapi::JSON_MEDIA_TYPE,
        "{path}: error bodies are JSON"
    );
    let error: Value = serde_json::from_slice(&body).expect("error body is JSON");
    let schema = &documented["content"][openapi::JSON_MEDIA_TYPE]["schema"];
    let problems = schemas.problems(schema, &error);
    assert!(
        problems.is_empty(),
        "{path}: error {error} does not match: {problems:?}"
    );
    let code = error["rpcErrorCode"].as_u64().unwrap();
    assert_eq!(
        headers
            .get(openapi::RPC_ERROR_CODE)
            .and_then(|v| v.to_str().ok()),
        Some(code.to_string().as_str()),
        "{path}: header and body agree"
    );
    assert!(
        code >= 1000,
        "{path} ({media_type}): a schema-valid example was refused by the gateway: {error}"
    );
    let description = documented["description"].as_str().unwrap_or_default();
    assert!(
        description.contains(&format!("| {code} |")),
        "{path}: {code} is not among the documented outcomes of {status}: {description}"
    );
    None
}

#[tokio::test]
async fn endpoints_that_are_not_rpcs_answer_as_documented() {
    let doc = document();
    let schemas = Schemas::of(&doc);
    let addr = start_server().await;
    let client = client();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        let Some(operation) = item.get("get") else {
            continue;
        };
        let response = client
            .get(format!("http://{addr}{path}"))
            .send()
            .await
            .expect("GET");
        let status = response.status();
        let documented = &operation["responses"][status.as_str()];
        assert!(
            documented.is_object(),
            "GET {path}: {status} is not documented"
        );
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let essence = |media: &str| media.split(';').next().unwrap().trim().to_ascii_lowercase();
        let content = documented["content"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        if content.is_empty() {
            // A documented answer without a body (the redirect to Swagger UI).
            let body = response.bytes().await.unwrap();
            assert!(
                body.is_empty(),
                "GET {path}: {status} has an undocumented body"
            );
            checked += 1;
            continue;
        }
        let matching = content
            .iter()
            .find(|(media, _)| essence(media) == essence(&content_type));
        let (_, media) = matching.unwrap_or_else(|| {
            panic!("GET {path}: content type {content_type:?} is not documented for {status}")
        });
        let body = response.bytes().await.unwrap();
        if essence(&content_type) == "application/json" {
            let value: Value = serde_json::from_slice(&body).expect("JSON body");
            let problems = schemas.problems(&media["schema"], &value);
            assert!(problems.is_empty(), "GET {path}: {problems:?}");
        }
        if path == openapi::SPEC_PATH {
            // This server's inspection API is open: no security scheme.
            assert!(
                body == openapi::render_for(false).as_bytes(),
                "the served document is the one rendered for this server"
            );
        }
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} documented GET endpoints");
}

/// A client that sends daemon-style calls (`Rpc-SeqNo`) and then other
/// requests on one keep-alive connection (as schemathesis and scripts with a
/// session do) gets each answered as on any connection; a sequence number
/// that is not one is refused and not echoed, on the daemons' path too.
#[tokio::test]
async fn one_connection_serves_daemon_calls_and_other_endpoints() {
    use crate::support::{Connection, Server, daemon_request};
    let server = Server::start().await;
    let mut connection = Connection::open(server.addr).await;
    let config = pb::GetConfigRequest {
        token: crate::support::USER_TOKEN.into(),
    };
    connection
        .send(&daemon_request(
            Method::GetConfig,
            7,
            &config.encode_to_vec(),
            None,
        ))
        .await;
    let answer = connection.read_response().await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("rpc-seqno"), Some("7"));

    connection
        .send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let health = connection.read_response().await;
    assert_eq!(
        health.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&health.body)
    );
    assert_eq!(&health.body[..], b"ok\n");

    let bad_timeout = String::from_utf8(daemon_request(
        Method::GetConfig,
        8,
        &config.encode_to_vec(),
        Some(1),
    ))
    .unwrap()
    .replace("Rpc-Timeout: 1\r\n", "Rpc-Timeout: abc\r\n");
    connection.send(bad_timeout.as_bytes()).await;
    let refused = connection.read_response().await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.header("rpc-error-code"), Some("5"));

    let mut fresh = Connection::open(server.addr).await;
    let bad_seq_no = String::from_utf8(daemon_request(Method::GetConfig, 9, &[], None))
        .unwrap()
        .replace("Rpc-SeqNo: 9", "Rpc-SeqNo: nine");
    fresh.send(bad_seq_no.as_bytes()).await;
    let refused = fresh.read_response().await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.header("rpc-seqno"), None, "not echoed");
    server.stop().await;
}
