//! The OpenAPI document against the code: the committed
//! `openapi/scheduler.openapi.json` is what the code generates; the RPCs of
//! the proto's service are exactly the routed ones, each documented once per
//! route style; every message and enum has a schema, every `$ref` resolves,
//! operation ids are unique; Swagger UI is served from the bundle in the
//! binary and reads this document.

use std::{collections::BTreeSet, path::Path};

use serde_json::{Value, json};
use yadcc_pb::{self as pb, Method};
use yadcc_scheduler::openapi;

use crate::openapi_schema::{STYLES, client, document, resolve, services, start_server};

/// The one command that rewrites the committed document.
const REGENERATE: &str = "UPDATE_OPENAPI=1 cargo test --test it openapi";

#[test]
fn committed_document_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(openapi::COMMITTED_SPEC);
    let generated = openapi::render();
    if std::env::var("UPDATE_OPENAPI").as_deref() == Ok("1") {
        // In CI this test checks the committed document; a rewrite there
        // would pass whatever the code generates.
        assert!(
            std::env::var_os("CI").is_none(),
            "UPDATE_OPENAPI=1 rewrites the committed document, which CI must check, not rewrite"
        );
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
    let in_proto: Vec<String> = services()
        .iter()
        .flat_map(|service| service.methods())
        .map(|m| m.full_name().to_owned())
        .collect();
    let routed: Vec<String> = Method::ALL
        .iter()
        .map(|m| m.full_name().to_owned())
        .collect();
    assert_eq!(
        in_proto, routed,
        "the RPCs of the proto's services must be exactly pb::Method::ALL, in order: a new \
         RPC needs a Method variant, a dispatch arm and a service method"
    );
    for method in services().iter().flat_map(|service| service.methods()) {
        assert_eq!(
            Method::from_full_name(method.full_name()).map(Method::full_name),
            Some(method.full_name())
        );
    }
}

#[test]
fn every_operation_has_one_tag_so_swagger_ui_lists_it_once() {
    let doc = document();
    let mut admin = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let tags = operation["tags"].as_array().map(Vec::len).unwrap_or(0);
            assert_eq!(tags, 1, "{method} {path}: {}", operation["tags"]);
            admin += usize::from(operation["tags"][0] == "AdminService");
        }
    }
    assert!(admin > 0, "the admin operations have their own tag");
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
        let under_a_service = pb::Service::ALL
            .iter()
            .any(|service| path.starts_with(&format!("/{}/", service.full_name())));
        if path.starts_with("/rpc/") || under_a_service {
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
fn every_message_and_enum_an_rpc_carries_has_a_schema_and_every_ref_resolves() {
    let doc = document();
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let (messages, enums) = carried_by_the_service();
    for message in &messages {
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
    // By name only; the numbers the server also reads are in the table.
    for enumeration in &enums {
        let schema = &schemas[enumeration.full_name()];
        let names: Vec<Value> = enumeration.values().map(|v| json!(v.name())).collect();
        assert_eq!(schema["type"], "string", "{}", enumeration.full_name());
        assert_eq!(schema["enum"], json!(names), "{}", enumeration.full_name());
        for value in enumeration.values() {
            assert!(
                schema["description"].as_str().unwrap().contains(&format!(
                    "| `{}` | {} |",
                    value.name(),
                    value.number()
                )),
                "{}",
                value.full_name()
            );
        }
    }
    // Nothing else: an unused schema documents nothing a client meets.
    let proto_schemas: BTreeSet<&str> = schemas
        .keys()
        .map(String::as_str)
        .filter(|name| {
            pb::DESCRIPTOR_POOL.get_message_by_name(name).is_some()
                || pb::DESCRIPTOR_POOL.get_enum_by_name(name).is_some()
        })
        .collect();
    let carried: BTreeSet<&str> = messages
        .iter()
        .map(|m| m.full_name())
        .chain(enums.iter().map(|e| e.full_name()))
        .collect();
    assert_eq!(proto_schemas, carried);

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

/// The messages the RPCs take and return, with every message and enum their
/// fields reach, and the scheduler's `Status` (the error body's `status`).
fn carried_by_the_service() -> (
    Vec<prost_reflect::MessageDescriptor>,
    Vec<prost_reflect::EnumDescriptor>,
) {
    let mut messages: Vec<prost_reflect::MessageDescriptor> = Vec::new();
    let mut enums = vec![
        pb::DESCRIPTOR_POOL
            .get_enum_by_name("yadcc.scheduler.Status")
            .unwrap(),
    ];
    let mut pending: Vec<_> = services()
        .iter()
        .flat_map(|service| service.methods())
        .flat_map(|method| [method.input(), method.output()])
        .collect();
    while let Some(message) = pending.pop() {
        if messages.contains(&message) {
            continue;
        }
        for field in message.fields() {
            match field.kind() {
                prost_reflect::Kind::Message(inner) => pending.push(inner),
                prost_reflect::Kind::Enum(inner) if !enums.contains(&inner) => enums.push(inner),
                _ => {}
            }
        }
        messages.push(message);
    }
    (messages, enums)
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
    let documented = &document()["paths"][openapi::DOCS_PATH]["get"]["responses"];
    assert!(
        documented[redirect.status().as_str()].is_object(),
        "{} is not documented: {documented}",
        redirect.status()
    );

    let index = get(&format!("{}/", openapi::DOCS_PATH)).await.unwrap();
    assert_eq!(index.status(), 200);
    let html = index.text().await.unwrap();
    assert!(html.contains("swagger-ui"), "{html}");
    // A phone lays the page out at its own width, and a tab names the API.
    assert!(
        html.contains(r#"<meta name="viewport" content="width=device-width, initial-scale=1">"#),
        "{html}"
    );
    assert!(
        html.contains(&format!("<title>{}</title>", openapi::DOCS_TITLE))
            && !html.contains("<title>Swagger UI"),
        "{html}"
    );
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
