//! What the OpenAPI tests share: the rendered document, a server as `main`
//! serves it, example values built from the document's schemas, and schema
//! validation by the `jsonschema` crate (JSON Schema 2020-12, the dialect of
//! OpenAPI 3.1). The full OpenAPI 3.1 validation of the committed file is
//! `scripts/validate_openapi.sh`.

use std::{net::SocketAddr, time::Duration};

use serde_json::{Map, Value, json};
use tokio::net::TcpListener;
use yadcc_engine::{Config, Scheduler, TokenSet};
use yadcc_pb as pb;
use yadcc_scheduler::{
    AppState,
    admin::{Admin, AdminTokens, Store},
    app,
    ha::Leadership,
    http::dialect::RouteStyle,
    openapi,
    rpc::state::TransportSettings,
};

/// Accepted as user and as servant token, so every RPC passes the token check
/// (a heartbeat with a servant token gets real capacity).
pub const TOKEN: &str = "openapi-check-token";

/// The admin token of [`start_server`]'s server.
pub const ADMIN_TOKEN: &str = "openapi-check-admin-token";

/// `request` with the admin token when `path` is an operation of the
/// operators' service (which declares the `adminToken` scheme).
pub fn authorized(path: &str, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    if openapi::security::is_admin_path(path) {
        request.bearer_auth(ADMIN_TOKEN)
    } else {
        request
    }
}

/// The route styles every RPC is documented under.
pub const STYLES: [RouteStyle; 2] = [RouteStyle::HttpPb, RouteStyle::Connect];

/// Every service the server implements, as the descriptor pool has them.
pub fn services() -> Vec<prost_reflect::ServiceDescriptor> {
    pb::Service::ALL
        .iter()
        .map(|service| {
            pb::DESCRIPTOR_POOL
                .get_service_by_name(service.full_name())
                .expect("every service in the descriptor pool")
        })
        .collect()
}

pub fn document() -> Value {
    serde_json::from_str(&openapi::render()).expect("the rendered document is JSON")
}

/// The server, on a real socket, as `main` serves it.
pub async fn start_server() -> SocketAddr {
    let engine = Scheduler::new(Config {
        user_tokens: TokenSet::new([TOKEN]),
        servant_tokens: TokenSet::new([TOKEN]),
        ..Config::default()
    });
    // `--debugging_no_inspect_auth`: the dashboard and inspection endpoints
    // answer as documented for 200.
    let leadership = Leadership::solo();
    let admin = Admin::new(
        AdminTokens::new([ADMIN_TOKEN]),
        engine.clone(),
        leadership.clone(),
        Store::Memory,
    );
    let state = AppState::with_admin(
        engine,
        TransportSettings {
            inspect: yadcc_scheduler::dashboard::InspectAccess::Open,
            ..TransportSettings::default()
        },
        leadership,
        admin,
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

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// The node a local `$ref` (`#/...`) of the document points at.
pub fn resolve<'a>(doc: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    doc.pointer(pointer)
}

/// A value for `schema`: its first `examples` entry, else the first enum
/// value, else one built from the type. Not a validator: what it builds is
/// checked by [`Schemas`] before it is sent.
pub fn example(doc: &Value, schema: &Value, depth: usize) -> Value {
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

/// Values that depend on where the example is sent, not on the schema: the
/// deployment's token, and a location the scheduler sees the servant at
/// (otherwise it is "behind NAT" and gets no tasks).
pub fn for_this_deployment(request: &mut Value) {
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

/// The document's schemas, for validating values with the `jsonschema`
/// crate. The document's `$ref`s point into its `components`, so each
/// schema is validated as the root of a resource that carries them.
pub struct Schemas {
    components: Value,
}

impl Schemas {
    pub fn of(doc: &Value) -> Schemas {
        let mut components = doc["components"].clone();
        if let Some(schemas) = components["schemas"].as_object_mut() {
            schemas.values_mut().for_each(close_objects);
        }
        Schemas { components }
    }

    /// What is wrong with `value` under `schema` (a schema of the document,
    /// inline or a `$ref`); empty when it conforms.
    pub fn problems(&self, schema: &Value, value: &Value) -> Vec<String> {
        let mut schema = schema.clone();
        close_objects(&mut schema);
        let mut root = match schema {
            Value::Object(keywords) => keywords,
            Value::Bool(true) => Map::new(),
            other => panic!("not a schema: {other}"),
        };
        assert!(
            !root.contains_key("components"),
            "a schema of the document has no `components` of its own"
        );
        root.insert("components".into(), self.components.clone());
        let validator = jsonschema::draft202012::new(&Value::Object(root))
            .unwrap_or_else(|error| panic!("the document's schema does not compile: {error}"));
        validator
            .iter_errors(value)
            .map(|error| format!("{}: {error}", error.instance_path()))
            .collect()
    }
}

/// The server writes only documented fields, so the tests hold its answers
/// to closed objects, where JSON Schema leaves an object open unless
/// `additionalProperties` says otherwise. An object schema with its own
/// `type` and `properties` is closed; a branch of `allOf` or `anyOf` that
/// names a few properties has no `type` and stays open, as does an object
/// that states `additionalProperties` itself.
fn close_objects(schema: &mut Value) {
    let Some(keywords) = schema.as_object_mut() else {
        return;
    };
    if keywords.contains_key("type")
        && keywords.contains_key("properties")
        && !keywords.contains_key("additionalProperties")
    {
        keywords.insert("additionalProperties".into(), json!(false));
    }
    for (keyword, argument) in keywords.iter_mut() {
        match keyword.as_str() {
            "properties" => argument
                .as_object_mut()
                .into_iter()
                .flat_map(|properties| properties.values_mut())
                .for_each(close_objects),
            "items" | "additionalProperties" | "propertyNames" => close_objects(argument),
            "allOf" | "anyOf" | "oneOf" => argument
                .as_array_mut()
                .into_iter()
                .flatten()
                .for_each(close_objects),
            _ => {}
        }
    }
}

/// The validator refuses what the server must never send, so a test that
/// validates an answer can fail.
#[test]
fn the_validator_rejects_values_that_break_the_documented_schema() {
    let doc = document();
    let schemas = Schemas::of(&doc);
    let reference = |name: &str| json!({ "$ref": format!("#/components/schemas/{name}") });
    let grants = reference("yadcc.scheduler.WaitForStartingTaskResponse");
    let error = reference("ErrorBody");

    let good_grants =
        json!({ "grants": [{ "taskGrantId": "7", "servantLocation": "10.0.0.1:8335" }] });
    assert_eq!(
        schemas.problems(&grants, &good_grants),
        Vec::<String>::new()
    );
    let good_error = json!({ "code": "permission_denied", "message": "no", "rpcErrorCode": 1002 });
    assert_eq!(schemas.problems(&error, &good_error), Vec::<String>::new());

    let broken: [(&Value, Value, &str); 6] = [
        // A 64-bit id that is no decimal: the pattern, through two `$ref`s.
        (
            &grants,
            json!({ "grants": [{ "taskGrantId": "seven" }] }),
            "/grants/0/taskGrantId",
        ),
        (
            &grants,
            json!({ "grants": [{ "taskGrantId": "18446744073709551616" }] }),
            "/grants/0/taskGrantId",
        ),
        (&grants, json!({ "grants": "none" }), "/grants"),
        // A field the document does not name.
        (&grants, json!({ "grants": [], "extra": 1 }), ""),
        (&error, json!({ "code": "internal", "message": "x" }), ""),
        (
            &error,
            json!({ "code": "internal", "message": "x", "rpcErrorCode": -1 }),
            "/rpcErrorCode",
        ),
    ];
    for (schema, value, at) in broken {
        let problems = schemas.problems(schema, &value);
        assert!(
            problems
                .iter()
                .any(|problem| problem.starts_with(&format!("{at}:"))),
            "{value} passed {schema} (problems: {problems:?})"
        );
    }

    // An inline schema that refers into the components is resolved too.
    let inline = json!({ "type": "array", "items": reference("ErrorBody") });
    assert!(schemas.problems(&inline, &json!([good_error])).is_empty());
    // One problem per missing required field.
    assert_eq!(schemas.problems(&inline, &json!([{}])).len(), 3);
}
