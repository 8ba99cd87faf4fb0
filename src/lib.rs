//! yadcc scheduler: decides which compile servant runs which compilation, for a
//! whole cluster, behind an HTTP gateway that speaks binary protobuf and JSON.
//!
//! One request travels one way, and each layer knows one thing:
//!
//! ```text
//! socket -> http::routes    routes, body limit, request log, peer address
//!        -> http::dialect   http+pb (`/rpc/...`) and Connect (`/pkg.Service/Method`) framing
//!        -> http::codec     bytes <-> prost message (binary protobuf, proto3 JSON)
//!        -> service         prost message <-> engine domain types; scheduler `Status`
//!        -> engine          servants, grants, waiters, tokens, expiry (no HTTP, no protobuf)
//! ```
//!
//! Errors have one table: [`http::error`] maps every failure to an HTTP
//! status, the framework's numeric `Rpc-Error-Code`, a Connect code and a JSON
//! body.
//!
//! Beside the request path, never in it:
//! - [`pb`]: generated types and the descriptor pool (`build.rs` compiles `proto/`).
//! - [`openapi`]: the OpenAPI document built from the descriptor pool.
//! - [`dashboard`]: inspection API over the engine snapshot, history ring and the
//!   embedded static page from `web/`.
//! - [`metrics`]: Prometheus exposition.
//! - [`config`]: the command line.
//! - [`sim`]: a simulated cluster speaking the daemons' wire protocol (demo, load tests).

pub mod config;
pub mod dashboard;

pub mod engine;
pub mod http;
pub mod metrics;
pub mod openapi;

pub mod pb;
pub mod service;
pub mod sim;

pub use http::routes::{AppState, app};
