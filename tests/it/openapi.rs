//! The OpenAPI document against the code and against a running server:
//!
//! - the committed `openapi/scheduler.openapi.json` is what the code generates;
//! - the RPCs of the proto's service are exactly the routed ones;
//! - every `$ref` resolves, operation ids are unique;
//! - for each RPC and route style, an example request built from the schema
//!   is accepted by a real server over a real socket (JSON and binary), and
//!   the answers validate against the documented response schemas;
//! - the endpoints that are not RPCs answer as documented, and Swagger UI is
//!   served from the bundle in the binary.
//!
//! Schema checks use a small structural validator (below) for the part of
//! JSON Schema this document uses; it refuses keywords it does not know, so
//! it never passes a value it did not check. The full OpenAPI 3.1 validation
//! of the committed file is `scripts/validate_openapi.sh`.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    path::Path,
    time::Duration,
};

use prost::Message as _;
use prost_reflect::DynamicMessage;
use serde_json::{Map, Value, json};
use tokio::net::TcpListener;
use yadcc_scheduler::{
    AppState, app,
    engine::{Config, Scheduler},
    http::{dialect::Dialect, state::HttpSettings},
    openapi,
    pb::{self, Method},
};

/// The one command that rewrites the committed document.
const REGENERATE: &str = "UPDATE_OPENAPI=1 cargo test --test it openapi";

/// Accepted as user and as servant token, so every RPC passes the token check
/// (a heartbeat with a servant token gets real capacity).
const TOKEN: &str = "openapi-check-token";

const STYLES: [Dialect; 2] = [Dialect::HttpPb, Dialect::Connect];

fn service() -> prost_reflect::ServiceDescriptor {
    pb::DESCRIPTOR_POOL
        .get_service_by_name(pb::SCHEDULER_SERVICE)
        .expect("scheduler service in the descriptor pool")
}

fn document() -> Value {
    serde_json::from_str(&openapi::render()).expect("the rendered document is JSON")
}

#[test]
fn committed_document_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(openapi::COMMITTED_SPEC);
    let generated = openapi::render();
    if std::env::var("UPDATE_OPENAPI").as_deref() == Ok("1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &generated).unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(old, new)| old != new)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
        panic!(
            "{} differs from what the code generates (first difference at line {}:\n  \
             committed: {}\n  generated: {}).\nRegenerate it with:\n\n    {REGENERATE}\n",
            openapi::COMMITTED_SPEC,
            line + 1,
            committed.lines().nth(line).unwrap_or("<end of file>"),
            generated.lines().nth(line).unwrap_or("<end of file>"),
        );
    }
}

#[test]
fn the_rpcs_of_the_proto_are_the_routed_rpcs() {
    let in_proto: Vec<String> = service().methods().map(|m| m.name().to_owned()).collect();
    let routed: Vec<String> = Method::ALL.iter().map(|m| m.name().to_owned()).collect();
    assert_eq!(
        in_proto,
        routed,
        "the RPCs of {} in the proto must be exactly pb::Method::ALL, in order: a new \
         RPC needs a Method variant, a dispatch arm and a service method",
        pb::SCHEDULER_SERVICE
    );
    for method in service().methods() {
        assert_eq!(
            Method::from_name(method.name()).map(Method::name),
            Some(method.name())
        );
    }
}

#[test]
fn every_rpc_is_documented_once_per_route_style() {
    let doc = document();
    let paths = doc["paths"].as_object().unwrap();
    let mut rpc_paths = BTreeSet::new();
    for rpc in Method::ALL {
        let method = rpc.descriptor();
        for dialect in STYLES {
            let path = dialect.path(rpc).to_owned();
            let item = paths
                .get(&path)
                .unwrap_or_else(|| panic!("{path} is not documented"));
            assert_eq!(item.as_object().unwrap().len(), 1, "{path}: POST only");
            let operation = &item["post"];
            assert_eq!(
                operation["operationId"],
                openapi::operation_id(dialect, rpc)
            );
            let content = &operation["requestBody"]["content"];
            assert_eq!(
                content[openapi::JSON_MEDIA_TYPE]["schema"]["$ref"],
                format!("#/components/schemas/{}", method.input().full_name())
            );
            assert_eq!(
                content[openapi::PROTOBUF_MEDIA_TYPE]["schema"]["x-protobuf-message"],
                method.input().full_name()
            );
            let ok = &operation["responses"]["200"]["content"];
            assert_eq!(
                ok[openapi::JSON_MEDIA_TYPE]["schema"]["$ref"],
                format!("#/components/schemas/{}", method.output().full_name())
            );
            assert_eq!(
                ok[openapi::PROTOBUF_MEDIA_TYPE]["schema"]["x-protobuf-message"],
                method.output().full_name()
            );
            rpc_paths.insert(path);
        }
    }
    // Anything else under the RPC prefixes would be an RPC the server lacks.
    for path in paths.keys() {
        if path.starts_with("/rpc/") || path.starts_with(&format!("/{}/", pb::SCHEDULER_SERVICE)) {
            assert!(
                rpc_paths.contains(path),
                "{path} is not an RPC of the service"
            );
        }
    }

    let mut ids = BTreeSet::new();
    for (path, item) in paths {
        for (verb, operation) in item.as_object().unwrap() {
            if let Some(id) = operation["operationId"].as_str() {
                assert!(
                    ids.insert(id.to_owned()),
                    "{verb} {path}: duplicate id {id}"
                );
            }
        }
    }
}

#[test]
fn every_message_and_enum_has_a_schema_and_every_ref_resolves() {
    let doc = document();
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for message in pb::DESCRIPTOR_POOL.all_messages() {
        if !message.is_map_entry() {
            let schema = &schemas[message.full_name()];
            assert_eq!(schema["type"], "object", "{}", message.full_name());
            for field in message.fields() {
                let property = &schema["properties"][field.json_name()];
                let description = property["description"].as_str().unwrap_or_default();
                assert!(
                    description.contains(&format!("{} = {}`", field.name(), field.number())),
                    "{}: {description}",
                    field.full_name()
                );
            }
        }
    }
    for enumeration in pb::DESCRIPTOR_POOL.all_enums() {
        let names = enumeration.values().map(|v| json!(v.name()));
        let numbers = enumeration.values().map(|v| json!(v.number()));
        assert_eq!(
            schemas[enumeration.full_name()]["enum"],
            json!(names.chain(numbers).collect::<Vec<_>>()),
            "{}",
            enumeration.full_name()
        );
    }

    fn walk(doc: &Value, node: &Value, at: &str) {
        match node {
            Value::Object(map) => {
                if let Some(Value::String(reference)) = map.get("$ref") {
                    assert!(
                        resolve(doc, reference).is_some(),
                        "{at}: dangling {reference}"
                    );
                }
                for (key, child) in map {
                    walk(doc, child, &format!("{at}/{key}"));
                }
            }
            Value::Array(items) => {
                for (index, child) in items.iter().enumerate() {
                    walk(doc, child, &format!("{at}/{index}"));
                }
            }
            _ => {}
        }
    }
    walk(&doc, &doc, "#");
}

/// The server, on a real socket, as `main` serves it.
async fn start_server() -> SocketAddr {
    let engine = Scheduler::new(Config {
        user_tokens: yadcc_scheduler::engine::TokenSet::new([TOKEN]),
        servant_tokens: yadcc_scheduler::engine::TokenSet::new([TOKEN]),
        ..Config::default()
    });
    // `--debugging_no_inspect_auth`: the dashboard and inspection endpoints
    // answer as documented for 200.
    let state = AppState::new(
        engine,
        HttpSettings {
            inspect: yadcc_scheduler::dashboard::InspectAccess::Open,
            ..HttpSettings::default()
        },
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app(state).into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("server");
    });
    addr
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

#[tokio::test]
async fn example_requests_built_from_the_schema_are_accepted() {
    let doc = document();
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
            let problems = validate(&doc, request_schema, &request);
            assert!(
                problems.is_empty(),
                "{path}: example {request} is invalid: {problems:?}"
            );

            // proto3 JSON.
            let mut call = client
                .post(format!("http://{addr}{path}"))
                .header("content-type", openapi::JSON_MEDIA_TYPE)
                .body(request.to_string());
            if dialect == Dialect::HttpPb {
                call = call.header(openapi::RPC_SEQ_NO, "17");
            }
            let response = call.send().await.expect("JSON call");
            if let Some(body) = check_answer(
                &doc,
                operation,
                dialect,
                openapi::JSON_MEDIA_TYPE,
                response,
                &path,
            )
            .await
            {
                let body: Value = serde_json::from_slice(&body)
                    .unwrap_or_else(|error| panic!("{path}: 200 body is not JSON: {error}"));
                let schema =
                    &operation["responses"]["200"]["content"][openapi::JSON_MEDIA_TYPE]["schema"];
                let problems = validate(&doc, schema, &body);
                assert!(
                    problems.is_empty(),
                    "{path}: answer {body} does not match: {problems:?}"
                );
                *validated.entry(method.name().to_owned()).or_default() += 1;
            }

            // Binary protobuf: the same example, encoded.
            let message = DynamicMessage::deserialize(method.input(), request.clone())
                .unwrap_or_else(|error| panic!("{path}: example is not proto3 JSON: {error}"));
            let mut call = client
                .post(format!("http://{addr}{path}"))
                .header("content-type", openapi::PROTOBUF_MEDIA_TYPE)
                .body(message.encode_to_vec());
            if dialect == Dialect::HttpPb {
                call = call.header(openapi::RPC_SEQ_NO, "17");
            }
            let response = call.send().await.expect("binary call");
            if let Some(body) = check_answer(
                &doc,
                operation,
                dialect,
                openapi::PROTOBUF_MEDIA_TYPE,
                response,
                &path,
            )
            .await
            {
                let answer = DynamicMessage::decode(method.output(), body.as_slice())
                    .unwrap_or_else(|error| panic!("{path}: 200 body is not protobuf: {error}"));
                let as_json = serde_json::to_value(&answer).unwrap();
                let schema =
                    &operation["responses"]["200"]["content"][openapi::JSON_MEDIA_TYPE]["schema"];
                let problems = validate(&doc, schema, &as_json);
                assert!(
                    problems.is_empty(),
                    "{path}: binary answer {as_json}: {problems:?}"
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

/// Values that depend on where the example is sent, not on the schema: the
/// deployment's token, and a location the scheduler sees the servant at
/// (otherwise it is "behind NAT" and gets no tasks).
fn for_this_deployment(request: &mut Value) {
    let Some(object) = request.as_object_mut() else {
        return;
    };
    if object.contains_key("token") {
        object.insert("token".into(), json!(TOKEN));
    }
    if let Some(Value::String(location)) = object.get_mut("location") {
        let port = location.rsplit_once(':').map_or("8335", |(_, port)| port);
        *location = format!("127.0.0.1:{port}");
    }
}

/// Checks one RPC answer against the operation; returns the body of a 200.
async fn check_answer(
    doc: &Value,
    operation: &Value,
    dialect: Dialect,
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
    if dialect == Dialect::HttpPb {
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
    let problems = validate(doc, schema, &error);
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
        let matching = content
            .iter()
            .find(|(media, _)| essence(media) == essence(&content_type));
        let (_, media) = matching.unwrap_or_else(|| {
            panic!("GET {path}: content type {content_type:?} is not documented for {status}")
        });
        let body = response.bytes().await.unwrap();
        if essence(&content_type) == "application/json" {
            let value: Value = serde_json::from_slice(&body).expect("JSON body");
            let problems = validate(&doc, &media["schema"], &value);
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

#[tokio::test]
async fn swagger_ui_is_served_from_the_binary_and_reads_this_document() {
    let addr = start_server().await;
    let client = client();
    let get = |path: &str| client.get(format!("http://{addr}{path}")).send();

    let redirect = get(openapi::DOCS_PATH).await.unwrap();
    assert!(redirect.status().is_redirection(), "{}", redirect.status());
    assert_eq!(
        redirect.headers()["location"],
        format!("{}/", openapi::DOCS_PATH)
    );

    let index = get(&format!("{}/", openapi::DOCS_PATH)).await.unwrap();
    assert_eq!(index.status(), 200);
    let html = index.text().await.unwrap();
    assert!(html.contains("swagger-ui"), "{html}");
    for remote in ["src=\"http", "href=\"http", "src=\"//", "href=\"//"] {
        assert!(
            !html.contains(remote),
            "the page loads {remote}...: not offline"
        );
    }

    let initializer = get(&format!("{}/swagger-initializer.js", openapi::DOCS_PATH))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        initializer.contains(&format!("\"url\": \"{}\"", openapi::SPEC_PATH)),
        "{initializer}"
    );
    assert!(
        initializer.contains("\"validatorUrl\": \"none\""),
        "{initializer}"
    );
    assert!(
        initializer.contains("\"tryItOutEnabled\": true"),
        "{initializer}"
    );

    let bundle = get(&format!("{}/swagger-ui-bundle.js", openapi::DOCS_PATH))
        .await
        .unwrap();
    assert_eq!(bundle.status(), 200);
    assert!(bundle.bytes().await.unwrap().len() > 100_000);

    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(
        doc["servers"][0]["url"], "/",
        "Try it out calls the serving server"
    );
}

// ---------------------------------------------------------------------------
// Example values and a structural validator, for the JSON Schema keywords the
// document uses.

fn resolve<'a>(doc: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    doc.pointer(pointer)
}

/// A value for `schema`: its first `examples` entry, else the first enum
/// value, else one built from the type.
fn example(doc: &Value, schema: &Value, depth: usize) -> Value {
    assert!(depth < 16, "schema nests too deep (recursive message?)");
    if let Some(reference) = schema["$ref"].as_str() {
        let target = resolve(doc, reference).expect("ref resolves");
        return example(doc, target, depth + 1);
    }
    if let Some(first) = schema["examples"].get(0) {
        return first.clone();
    }
    if let Some(first) = schema["enum"].get(0) {
        return first.clone();
    }
    if schema["type"].is_null()
        && let Some(first) = schema["anyOf"].get(0)
    {
        return example(doc, first, depth + 1);
    }
    // Of a list of types, the first is the one the server writes.
    let ty = match &schema["type"] {
        Value::Array(types) => types.first().and_then(Value::as_str),
        one => one.as_str(),
    };
    match ty {
        Some("object") => Value::Object(
            schema["properties"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(name, property)| (name.clone(), example(doc, property, depth + 1)))
                .collect::<Map<_, _>>(),
        ),
        Some("array") => json!([example(doc, &schema["items"], depth + 1)]),
        Some("string") if schema["pattern"].is_string() => json!("1"),
        Some("string") => json!("example"),
        Some("integer") => {
            let low = schema["minimum"].as_i64().unwrap_or(0).max(1);
            json!(schema["maximum"].as_i64().map_or(low, |high| low.min(high)))
        }
        Some("number") => json!(1.5),
        Some("boolean") => json!(true),
        other => panic!("no example for a schema of type {other:?}: {schema}"),
    }
}

/// What is wrong with `value` under `schema`; empty when it conforms.
/// Objects with `type` and `properties` are closed unless
/// `additionalProperties` says otherwise: the server writes only documented
/// fields.
fn validate(doc: &Value, schema: &Value, value: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    check(doc, schema, value, "$", &mut problems);
    problems
}

fn check(doc: &Value, schema: &Value, value: &Value, at: &str, problems: &mut Vec<String>) {
    const ANNOTATIONS: &[&str] = &[
        "description",
        "title",
        "format",
        "examples",
        "example",
        "default",
        "deprecated",
        "readOnly",
        "writeOnly",
        "contentMediaType",
        "contentEncoding",
        "summary",
    ];
    let Some(keywords) = schema.as_object() else {
        if schema != &Value::Bool(true) {
            problems.push(format!("{at}: schema {schema} is not an object"));
        }
        return;
    };
    for (keyword, argument) in keywords {
        match keyword.as_str() {
            "$ref" => {
                let reference = argument.as_str().unwrap();
                let target = resolve(doc, reference)
                    .unwrap_or_else(|| panic!("dangling reference {reference}"));
                check(doc, target, value, at, problems);
            }
            "type" => {
                let types: Vec<&str> = match argument {
                    Value::String(one) => vec![one.as_str()],
                    Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
                    other => panic!("bad type {other}"),
                };
                if !types.iter().any(|ty| has_type(value, ty)) {
                    problems.push(format!("{at}: {value} is not of type {argument}"));
                }
            }
            "enum" => {
                if !argument.as_array().unwrap().contains(value) {
                    problems.push(format!("{at}: {value} is not one of {argument}"));
                }
            }
            "pattern" => {
                if let Some(text) = value.as_str()
                    && !regex::Regex::new(argument.as_str().unwrap())
                        .expect("a pattern the regex crate reads")
                        .is_match(text)
                {
                    problems.push(format!("{at}: {text:?} does not match {argument}"));
                }
            }
            "minLength" | "maxLength" => {
                if let Some(text) = value.as_str() {
                    let bound = argument.as_u64().unwrap() as usize;
                    let length = text.chars().count();
                    let ok = if keyword == "minLength" {
                        length >= bound
                    } else {
                        length <= bound
                    };
                    if !ok {
                        problems.push(format!("{at}: {text:?} breaks {keyword} {bound}"));
                    }
                }
            }
            "minimum" => {
                if let (Some(number), Some(bound)) = (value.as_f64(), argument.as_f64())
                    && number < bound
                {
                    problems.push(format!("{at}: {number} < minimum {bound}"));
                }
            }
            "maximum" => {
                if let (Some(number), Some(bound)) = (value.as_f64(), argument.as_f64())
                    && number > bound
                {
                    problems.push(format!("{at}: {number} > maximum {bound}"));
                }
            }
            "required" => {
                if let Some(object) = value.as_object() {
                    for name in argument.as_array().unwrap() {
                        if !object.contains_key(name.as_str().unwrap()) {
                            problems.push(format!("{at}: missing required {name}"));
                        }
                    }
                }
            }
            "properties" => {
                if let Some(object) = value.as_object() {
                    let properties = argument.as_object().unwrap();
                    for (name, item) in object {
                        match properties.get(name) {
                            Some(property) => {
                                check(doc, property, item, &format!("{at}.{name}"), problems)
                            }
                            // Only an object's own schema closes it, not a
                            // branch of anyOf or allOf that names a few properties.
                            None if keywords.contains_key("additionalProperties")
                                || !keywords.contains_key("type") => {}
                            None => problems.push(format!("{at}: undocumented property {name}")),
                        }
                    }
                }
            }
            "additionalProperties" => {
                if let Some(object) = value.as_object() {
                    let declared = keywords.get("properties").and_then(Value::as_object);
                    for (name, item) in object {
                        if declared.is_some_and(|declared| declared.contains_key(name)) {
                            continue;
                        }
                        match argument {
                            Value::Bool(true) => {}
                            Value::Bool(false) => {
                                problems.push(format!("{at}: undocumented property {name}"))
                            }
                            schema => check(doc, schema, item, &format!("{at}.{name}"), problems),
                        }
                    }
                }
            }
            "propertyNames" => {
                if let Some(object) = value.as_object() {
                    for name in object.keys() {
                        check(
                            doc,
                            argument,
                            &json!(name),
                            &format!("{at}[key {name}]"),
                            problems,
                        );
                    }
                }
            }
            "items" => {
                if let Some(items) = value.as_array() {
                    for (index, item) in items.iter().enumerate() {
                        check(doc, argument, item, &format!("{at}[{index}]"), problems);
                    }
                }
            }
            "minItems" | "maxItems" => {
                if let Some(items) = value.as_array() {
                    let bound = argument.as_u64().unwrap() as usize;
                    let ok = if keyword == "minItems" {
                        items.len() >= bound
                    } else {
                        items.len() <= bound
                    };
                    if !ok {
                        problems.push(format!(
                            "{at}: {} items breaks {keyword} {bound}",
                            items.len()
                        ));
                    }
                }
            }
            "allOf" | "anyOf" | "oneOf" => {
                let passing = argument
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|branch| validate(doc, branch, value).is_empty())
                    .count();
                let ok = match keyword.as_str() {
                    "allOf" => passing == argument.as_array().unwrap().len(),
                    "anyOf" => passing >= 1,
                    _ => passing == 1,
                };
                if !ok {
                    problems.push(format!(
                        "{at}: {value} fails {keyword} ({passing} branches pass)"
                    ));
                }
            }
            known if ANNOTATIONS.contains(&known) || known.starts_with("x-") => {}
            unknown => panic!("the test validator does not implement `{unknown}`: extend it"),
        }
    }
}

fn has_type(value: &Value, ty: &str) -> bool {
    match ty {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        "number" => value.is_number(),
        "integer" => {
            value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        other => panic!("unknown JSON type {other}"),
    }
}

// ---------------------------------------------------------------------------
// The contract against the server: each rule's bound is accepted and one
// step past it is refused, so the document's constraints are the checks.

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
    let response = client
        .post(format!("http://{addr}{path}"))
        .header("content-type", openapi::JSON_MEDIA_TYPE)
        .body(request.to_string())
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
    use yadcc_scheduler::{
        contract::{self, Rule},
        engine::Limits,
    };
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
        let path = Dialect::HttpPb.path(method_of(message)).to_owned();
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
            Rule::NonEmpty => vec![(Some(json!("")), false), (Some(json!("d")), true)],
            Rule::Location => vec![
                (Some(json!("127.0.0.1:8335")), true),
                (Some(json!("[::1]:8335")), true),
                (Some(json!("localhost:8335")), false),
                (Some(json!("127.0.0.1:08335")), false),
            ],
            Rule::AtMost(most) => vec![(Some(json!(most)), true), (Some(json!(most + 1)), false)],
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
    for rule in contract::any_positive() {
        let (path, request) = base(rule.message);
        let names: Vec<String> = rule
            .fields
            .iter()
            .map(|name| json_path(rule.message, &[name]).remove(0))
            .collect();
        let mut none = request.clone();
        for name in &names {
            none[name] = json!(0);
        }
        assert_eq!(
            outcome(&client, addr, &path, &none).await,
            Some(INVALID_ARGUMENT),
            "{rule:?}: all zero"
        );
        for name in &names {
            let mut one = none.clone();
            one[name] = json!(1);
            assert_ne!(
                outcome(&client, addr, &path, &one).await,
                Some(INVALID_ARGUMENT),
                "{rule:?}: {name} = 1"
            );
        }
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} cases");
}

/// A client that sends daemon-style calls (`Rpc-SeqNo`) and then other
/// requests on one keep-alive connection (as schemathesis and scripts with a
/// session do) gets each answered as on any connection; a sequence number
/// that is not one is refused and not echoed, on the daemons' path too.
#[tokio::test]
async fn one_connection_serves_daemon_calls_and_other_endpoints() {
    use crate::support::{RawConnection, Server, http_pb_request};
    let server = Server::start().await;
    let mut connection = RawConnection::open(server.addr).await;
    let config = pb::GetConfigRequest {
        token: crate::support::USER_TOKEN.into(),
    };
    connection
        .send(&http_pb_request(
            "GetConfig",
            7,
            &config.encode_to_vec(),
            &[],
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
    assert_eq!(health.body, b"ok\n");

    connection
        .send(&http_pb_request(
            "GetConfig",
            8,
            &config.encode_to_vec(),
            &[("Rpc-Timeout", "abc")],
        ))
        .await;
    let refused = connection.read_response().await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.header("rpc-error-code"), Some("5"));

    let mut fresh = RawConnection::open(server.addr).await;
    let bad_seq_no = String::from_utf8(http_pb_request("GetConfig", 9, &[], &[]))
        .unwrap()
        .replace("Rpc-SeqNo: 9", "Rpc-SeqNo: nine");
    fresh.send(bad_seq_no.as_bytes()).await;
    let refused = fresh.read_response().await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.header("rpc-seqno"), None, "not echoed");
    server.stop().await;
}
