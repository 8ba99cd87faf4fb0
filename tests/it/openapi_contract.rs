//! The contract against the server: each field rule's bound is accepted
//! and one step past it is refused, so the document's constraints are the
//! server's checks.

use std::net::SocketAddr;

use serde_json::{Value, json};
use yadcc_pb::{self as pb, Method};
use yadcc_scheduler::{http::dialect::RouteStyle, openapi};

use crate::openapi_schema::{
    authorized, client, document, example, for_this_deployment, start_server,
};

/// The JSON name of each field along `path` (proto names) from `message`.
fn json_path(message: &str, path: &[&str]) -> Vec<String> {
    let mut descriptor = pb::DESCRIPTOR_POOL.get_message_by_name(message).unwrap();
    let mut names = Vec::new();
    for name in path {
        let field = descriptor.get_field_by_name(name).unwrap();
        names.push(field.json_name().to_owned());
        if let prost_reflect::Kind::Message(inner) = field.kind() {
            descriptor = inner;
        }
    }
    names
}

fn set_path(request: &mut Value, path: &[String], value: Option<Value>) {
    let (last, parents) = path.split_last().unwrap();
    let mut node = request;
    for name in parents {
        node = node
            .as_object_mut()
            .unwrap()
            .entry(name.clone())
            .or_insert_with(|| json!({}));
        // Through a list: its first element.
        if let Value::Array(items) = node {
            node = items.first_mut().expect("a list with an element");
        }
    }
    let object = node.as_object_mut().unwrap();
    match value {
        Some(value) => object.insert(last.clone(), value),
        None => object.remove(last),
    };
}

/// The scheduler outcome of one JSON call: `None` for success, else the
/// error body's `rpcErrorCode`.
async fn outcome(
    client: &reqwest::Client,
    addr: SocketAddr,
    path: &str,
    request: &Value,
) -> Option<u64> {
    let response = authorized(
        path,
        client
            .post(format!("http://{addr}{path}"))
            .header("content-type", openapi::JSON_MEDIA_TYPE)
            .body(request.to_string()),
    )
    .send()
    .await
    .expect("call");
    if response.status().is_success() {
        return None;
    }
    let error: Value = response.json().await.expect("error body");
    error["rpcErrorCode"].as_u64()
}

#[tokio::test]
async fn every_contract_rule_is_what_the_server_enforces() {
    use yadcc_engine::Limits;
    use yadcc_scheduler::contract::{self, Rule};
    const INVALID_ARGUMENT: u64 = 1004;
    let doc = document();
    let addr = start_server().await;
    let client = client();
    let method_of = |message: &str| {
        Method::ALL
            .into_iter()
            .find(|method| method.descriptor().input().full_name() == message)
            .unwrap()
    };
    let base = |message: &str| {
        let path = RouteStyle::HttpPb.path(method_of(message)).to_owned();
        let schema = &doc["paths"][&path]["post"]["requestBody"]["content"]
            [openapi::JSON_MEDIA_TYPE]["schema"];
        let mut request = example(&doc, schema, 0);
        for_this_deployment(&mut request);
        // An environment nobody offers: a request that passes validation
        // is answered at once (ENVIRONMENT_NOT_AVAILABLE), never queued.
        if request.get("envDesc").is_some() {
            request["envDesc"]["compilerDigest"] = json!("no-such-compiler");
        }
        (path, request)
    };

    let mut checked = 0;
    for rule in contract::field_rules(&Limits::default()) {
        let (path, request) = base(rule.message);
        let field = json_path(rule.message, rule.path);
        let cases: Vec<(Option<Value>, bool)> = match &rule.rule {
            Rule::Required => vec![(None, false)],
            Rule::Location => vec![
                (Some(json!("127.0.0.1:8335")), true),
                (Some(json!("[::1]:8335")), true),
                (Some(json!("localhost:8335")), false),
                // Leading zeros in the port, as the original's parser reads them.
                (Some(json!("127.0.0.1:08335")), true),
                (Some(json!("127.0.0.1:065536")), false),
            ],
            Rule::AtMost(most) => vec![(Some(json!(most)), true), (Some(json!(most + 1)), false)],
            Rule::OneLine => vec![
                (Some(json!("one line, with ünïcödé")), true),
                (Some(json!("two\nlines")), false),
                (Some(json!("a C1 control \u{0085}")), false),
                (Some(json!("\u{00a0}no-break space is no control")), true),
            ],
            Rule::MaxLength(most) => vec![
                (Some(json!("é".repeat(*most))), true),
                (Some(json!("d".repeat(most + 1))), false),
            ],
            Rule::MaxItems(most) => {
                // The smallest element, so the longest list fits the body limit.
                let element = match request.pointer(&format!("/{}/0", field.join("/"))) {
                    Some(Value::Object(_)) => json!({}),
                    Some(element) => element.clone(),
                    None => panic!("{rule:?}: the example has no list element to repeat"),
                };
                vec![
                    (Some(json!(vec![element.clone(); *most])), true),
                    (Some(json!(vec![element; most + 1])), false),
                ]
            }
        };
        for (value, accepted) in cases {
            let mut request = request.clone();
            set_path(&mut request, &field, value.clone());
            let code = outcome(&client, addr, &path, &request).await;
            assert_eq!(
                code != Some(INVALID_ARGUMENT),
                accepted,
                "{rule:?} with {}: answered {code:?}",
                value.map_or("nothing".to_owned(), |value| {
                    let text = value.to_string();
                    text.chars().take(60).collect()
                })
            );
            assert_ne!(
                code,
                Some(5),
                "{rule:?}: a valid JSON body is never malformed"
            );
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} cases");
}
