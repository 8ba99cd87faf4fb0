//! The OpenAPI 3.1 document and its two endpoints: `GET /openapi.json` and
//! Swagger UI at `/docs/`, served from the vendored bundle, so both work on a
//! network without internet access.
//!
//! The document is built from the descriptor pool the server decodes with
//! ([`pb::DESCRIPTOR_POOL`]). No message is described by hand. One file per
//! part of the document, assembled here:
//!
//! - [`paths`]: one operation per RPC and route style ([`RouteStyle`]), with the
//!   header parameters and response headers of each style;
//! - [`schemas`]: every message and enum, as the proto3 JSON mapping the
//!   server reads and writes (pbjson: lowerCamelCase names, 64-bit integers
//!   as decimal strings, enums by name), with the constraints of [`contract`];
//! - [`errors`]: the error responses, from the one error table
//!   ([`crate::rpc::error::ErrorKind::ALL`]) and each RPC's
//!   [`crate::service::failure_statuses`];
//! - [`security`]: the inspection API's basic auth;
//! - [`examples`]: values that work against `--demo`;
//! - [`prose`]: the overview and the route styles' descriptions;
//! - [`comments`]: the proto's comments every description starts from, and
//!   the Markdown helpers they are written with.
//!
//! Endpoints that are not RPCs are documented where they are served, with
//! `#[utoipa::path]` on their handlers: [`crate::http::operations`],
//! [`crate::dashboard`] and [`openapi_json`] below; Swagger UI's bundle has no
//! handler of ours, so its one path is built here (`docs_path`).
//!
//! The committed copy, `openapi/scheduler.openapi.json`, is what [`render`]
//! returns. The integration tests fail when that copy is stale and print
//! the command that regenerates it.

use std::sync::LazyLock;

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use serde_json::Value;
use utoipa::{
    OpenApi as _,
    openapi::{
        ComponentsBuilder, ContactBuilder, HeaderBuilder, HttpMethod, InfoBuilder, LicenseBuilder,
        ObjectBuilder, OpenApi, OpenApiBuilder, PathItem, ResponseBuilder, ServerBuilder, Type,
        path::OperationBuilder, tag::TagBuilder,
    },
};
use utoipa_swagger_ui::{Config, SwaggerUi};

use crate::{
    contract,
    dashboard::{DashboardApi, InspectAccess},
    engine::Limits,
    http::{dialect::RouteStyle, operations::OperationsApi},
    pb,
    rpc::{error::ErrorBody, state::AppState},
};

pub mod comments;
pub mod errors;
pub mod examples;
pub mod paths;
pub mod prose;
pub mod schemas;
pub mod security;

pub use paths::operation_id;

/// Where the document is served.
pub const SPEC_PATH: &str = "/openapi.json";

/// Where Swagger UI is served (`/docs` redirects to `/docs/`).
pub const DOCS_PATH: &str = "/docs";

/// The committed copy of [`render`]'s output, relative to the crate root.
pub const COMMITTED_SPEC: &str = "openapi/scheduler.openapi.json";

/// The media type under which binary protobuf is documented. The other
/// binary media types of [`crate::rpc::codec::MEDIA_TYPES`] are named in its description.
pub const PROTOBUF_MEDIA_TYPE: &str = "application/x-protobuf";

/// The media type under which proto3 JSON is documented.
pub const JSON_MEDIA_TYPE: &str = "application/json";

/// Header names as the yadcc daemons write them. The server matches header
/// names case-insensitively; a test checks that these are the dialect's headers.
pub const RPC_SEQ_NO: &str = "Rpc-SeqNo";
pub const RPC_TIMEOUT: &str = "Rpc-Timeout";
pub const CONNECT_TIMEOUT_MS: &str = "Connect-Timeout-Ms";
pub const RPC_ERROR_CODE: &str = "Rpc-Error-Code";
pub const RPC_ERROR_REASON: &str = "Rpc-Error-Reason";

/// Tags of the two route styles, in the order they are listed, and of the
/// operators' service (whose operations carry a route style's tag too).
const TAG_HTTP_PB: &str = "http+pb";
const TAG_CONNECT: &str = "Connect";
const TAG_ADMIN: &str = "AdminService";

/// The document as served, rendered once per inspection posture.
static SPEC_INSPECT_AUTH: LazyLock<String> = LazyLock::new(|| render_for(true));
static SPEC_INSPECT_OPEN: LazyLock<String> = LazyLock::new(|| render_for(false));

/// The whole OpenAPI document as committed: the inspection API behind basic
/// auth, the default posture.
pub fn document() -> Value {
    document_for(true)
}

/// The whole OpenAPI document: the RPCs from the descriptor pool with the
/// constraints of [`contract`], then every other endpoint from
/// `non_rpc_apis`. With `inspect_auth`, the inspection API's operations
/// carry the basic-auth security scheme.
pub fn document_for(inspect_auth: bool) -> Value {
    let pool = &*pb::DESCRIPTOR_POOL;
    let service = pool
        .get_service_by_name(pb::SCHEDULER_SERVICE)
        .expect("the descriptor pool holds the scheduler service");
    let rules = contract::field_rules(&Limits::default());

    let mut components = ComponentsBuilder::new();
    components = components.schema_from::<ErrorBody>();
    for (name, parameter) in paths::header_parameters() {
        components = components.parameter(name, parameter);
    }
    for (name, header) in paths::response_headers() {
        components = components.header(name, header);
    }

    let mut document = OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("yadcc scheduler")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(prose::overview(&service)))
                .license(Some(
                    LicenseBuilder::new()
                        .name("BSD-3-Clause")
                        .identifier(Some("BSD-3-Clause"))
                        .build(),
                ))
                .contact(Some(
                    ContactBuilder::new()
                        .name(Some("The operators of this scheduler"))
                        .build(),
                ))
                .build(),
        )
        .servers(Some([ServerBuilder::new()
            .url("/")
            .description(Some("This server (the one serving this document)"))
            .build()]))
        .tags(Some([
            TagBuilder::new()
                .name(TAG_HTTP_PB)
                .description(Some(prose::dialect_description(RouteStyle::HttpPb)))
                .build(),
            TagBuilder::new()
                .name(TAG_CONNECT)
                .description(Some(prose::dialect_description(RouteStyle::Connect)))
                .build(),
            TagBuilder::new()
                .name(TAG_ADMIN)
                .description(Some(prose::admin_description()))
                .build(),
        ]))
        .paths(paths::rpc_paths(&rules))
        .components(Some(components.build()))
        .build();
    for api in non_rpc_apis() {
        document.merge(api);
    }

    let mut json = serde_json::to_value(&document).expect("the document serializes to JSON");
    let component_schemas = json["components"]["schemas"]
        .as_object_mut()
        .expect("components has schemas");
    schemas::add_all(component_schemas, pool, &rules);
    errors::refer_to_status_enum(component_schemas);
    schemas::drop_unreachable(&mut json);
    security::declare_security(&mut json, inspect_auth);
    json
}

/// The endpoints that are not RPCs, each group as a utoipa-derived `OpenApi`
/// (`#[utoipa::path]` on the handlers, `ToSchema` on their types), in the
/// order they are listed. A new group is one more entry here.
fn non_rpc_apis() -> Vec<OpenApi> {
    vec![
        OperationsApi::openapi(),
        documentation_api(),
        DashboardApi::openapi(),
    ]
}

/// [`document`] as committed: pretty JSON and a final newline.
pub fn render() -> String {
    render_for(true)
}

/// [`document_for`] as served: pretty JSON and a final newline.
pub fn render_for(inspect_auth: bool) -> String {
    let mut json = serde_json::to_string_pretty(&document_for(inspect_auth))
        .expect("the OpenAPI document serializes to JSON");
    json.push('\n');
    json
}

/// `GET /openapi.json` and Swagger UI under `/docs/`; merge it into the app
/// router.
pub fn router() -> Router<AppState> {
    let config = Config::new([SPEC_PATH])
        .try_it_out_enabled(true)
        .display_request_duration(true)
        .display_operation_id(true)
        .filter(true)
        // The default sends the document to an online validator: not offline.
        .validator_url("none");
    Router::new().route(SPEC_PATH, get(openapi_json)).merge(
        Router::from(SwaggerUi::new(DOCS_PATH).config(config))
            .layer(axum::middleware::map_response(name_the_page)),
    )
}

/// The page's title, as tabs and bookmarks show it.
pub const DOCS_TITLE: &str = "yadcc-scheduler API";

/// The bundle's `index.html` is titled "Swagger UI" and has no viewport
/// tag, so a phone renders it 980 px wide: both are put right on the way
/// out (the bundle is vendored, and its other files pass untouched).
async fn name_the_page(response: Response) -> Response {
    /// Far above the bundle's index page (under 1 KiB).
    const MAX_INDEX_BYTES: usize = 64 * 1024;
    let is_html = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("text/html"));
    if !is_html {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_INDEX_BYTES).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let page = String::from_utf8_lossy(&bytes).replace(
        "<title>Swagger UI</title>",
        &format!(
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n    \
             <title>{DOCS_TITLE}</title>"
        ),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(page))
}

/// This document.
///
/// OpenAPI 3.1, generated from the proto files the server decodes with.
#[utoipa::path(get, path = "/openapi.json", tag = "documentation",
    responses((status = 200, description = "This OpenAPI document", content_type = "application/json", body = Object)))]
pub async fn openapi_json(State(state): State<AppState>) -> Response {
    // The inspection API asks for basic auth exactly when a credential is set.
    let spec = if matches!(state.settings.inspect, InspectAccess::Credential(_)) {
        &SPEC_INSPECT_AUTH
    } else {
        &SPEC_INSPECT_OPEN
    };
    ([(header::CONTENT_TYPE, JSON_MEDIA_TYPE)], spec.as_str()).into_response()
}

/// The documentation endpoints' part of the document.
#[derive(utoipa::OpenApi)]
#[openapi(
    paths(openapi_json),
    tags((name = "documentation", description = "This document and Swagger UI.")),
)]
struct DocumentationApi;

fn documentation_api() -> OpenApi {
    let mut api = DocumentationApi::openapi();
    let (path, item) = docs_path();
    api.paths.paths.insert(path, item);
    api
}

/// `GET /docs`: a redirect to Swagger UI at `/docs/`, served by
/// `utoipa_swagger_ui` from the bundle built into the binary, so there is no
/// handler of ours to annotate. The redirect is what is documented: a path
/// ending in `/` is not a resource name linters accept, and clients that
/// follow redirects get the page.
fn docs_path() -> (String, PathItem) {
    let operation = OperationBuilder::new()
        .tag("documentation")
        .summary(Some("Swagger UI for this document."))
        .description(Some(format!(
            "Redirects to `{DOCS_PATH}/`, Swagger UI for this document, served from the \
             bundle built into the binary (it works without internet access)."
        )))
        .operation_id(Some("docs"))
        .response(
            StatusCode::SEE_OTHER.as_str(),
            ResponseBuilder::new()
                .description(format!("Swagger UI is at `{DOCS_PATH}/`"))
                .header(
                    header::LOCATION.as_str(),
                    HeaderBuilder::new()
                        .schema(Some(
                            ObjectBuilder::new()
                                .schema_type(Type::String)
                                .enum_values(Some([format!("{DOCS_PATH}/")])),
                        ))
                        .description(Some("Where Swagger UI is."))
                        .build(),
                ),
        )
        .build();
    (
        DOCS_PATH.to_owned(),
        PathItem::new(HttpMethod::Get, operation),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::codec::MEDIA_TYPES;

    #[test]
    fn header_names_are_the_dialects_headers() {
        use crate::http::dialect;
        for (ours, theirs) in [
            (RPC_SEQ_NO, dialect::RPC_SEQ_NO),
            (RPC_TIMEOUT, dialect::RPC_TIMEOUT),
            (CONNECT_TIMEOUT_MS, dialect::CONNECT_TIMEOUT_MS),
            (RPC_ERROR_CODE, dialect::RPC_ERROR_CODE),
            (RPC_ERROR_REASON, dialect::RPC_ERROR_REASON),
        ] {
            assert!(
                ours.eq_ignore_ascii_case(theirs.as_str()),
                "{ours} vs {theirs}"
            );
        }
    }

    #[test]
    fn documented_media_types_are_served() {
        let served = |name: &str| MEDIA_TYPES.iter().any(|(served, _)| *served == name);
        assert!(served(JSON_MEDIA_TYPE));
        assert!(served(PROTOBUF_MEDIA_TYPE));
    }
}
