//! yadcc scheduler: decides which compile servant runs which compilation, for a
//! whole cluster, behind an HTTP gateway that speaks binary protobuf and JSON.
//!
//! This package is the server: transport (how bytes arrive), the call core
//! (one path for every protocol) and operations (what people use beside the
//! RPCs). The layers under it are crates of the workspace, so the compiler
//! keeps their boundaries:
//!
//! - `yadcc-engine` (`crates/engine`): the scheduling rules; no HTTP, protobuf or JSON.
//! - `yadcc-pb` (`crates/pb`): generated types, descriptor pool, `Method`, `Encoding`.
//! - `yadcc-text` (`crates/text`): grammars of daemon-sent text, bounded echoes, `Redacted`.
//! - `yadcc-stock` (`crates/stock`): the stock daemons' periods and leases, written once.
//! - `yadcc-sim` (`crates/sim`): simulated stock daemons (the demo, tests, benchmarks).
//! - `yadcc-loadgen` (`crates/loadgen`): the benchmarks' load generator and farm model.
//! - `yadcc-testkit` (`crates/testkit`): starts the real binary for `tests/`.
//!
//! One request: `net` accepts it under the caps and sniffs the first bytes;
//! `daemon` serves the daemons' framings, hyper and `router` the rest, through
//! `http::handler`; every protocol then calls `rpc::call` (deadline,
//! dispatch, metrics, access log), `rpc::codec` decodes, `service` turns
//! protobuf into engine types, and the engine decides. `docs/design.md`
//! follows a `Heartbeat` file by file and defines the words used here.
//!
//! Layers, top to bottom: an import points to its own line or below, never
//! up, and never in a loop (`scripts/module_graph.py --check` reads this
//! block and fails CI otherwise; a module belongs to the longest name that
//! names it or a parent; `engine`, `pb`, `sim` and `grammar` are the crates):
//!
//! ```text
//! layers:
//! config                          the command line
//! net                             listener, caps, sniffing, shutdown
//! daemon                          the daemons' connections and framings
//! router                          the router, at the root: wiring every handler
//! openapi                         the document, built from the descriptors
//! http                            HTTP protocols: seam, dialects, gRPC, reflection, health
//! rpc                             the call core: dispatch, state, errors, codecs
//! service dashboard metrics       the RPCs; beside the path: people, Prometheus
//! admin                           operators' actions: credentials, audit, saved state
//! ha                              hot standby: leadership elected on etcd, fencing
//! contract                        what requests must satisfy, as data
//! engine                          the scheduling rules
//! edge protocol grammar readiness build_info logging security reload  leaves: limits, labels, grammars, readiness, the build, log limits, transport security, the one file watcher (SIGHUP)
//! sim                             the simulated daemons: generated types only
//! pb                              generated types, Method, Encoding, the framework's compression formats
//! ```
//!
//! Modules (`tests/it/rules.rs` checks this list against the `pub mod` lines):
//!
//! - [`admin`]: operators' actions: credentials, audit, saved state.
//! - [`build_info`]: the version and commit the build embeds.
//! - [`config`]: the command line, the demo, the tenants file.
//! - [`contract`]: what requests must satisfy, as data the document states.
//! - [`daemon`]: the daemons' connections: `flare://` and their `http+pb`.
//! - [`dashboard`]: the dashboard's JSON, history, access and page.
//! - [`edge`]: every limit of the edge: timeouts, caps, the body budget.
//! - [`ha`]: the hot standby: leadership elected on etcd, fencing.
//! - [`http`]: HTTP protocols: the handler seam, dialects, gRPC, health.
//! - [`logging`]: the access log and the limit on client-made log lines.
//! - [`metrics`]: Prometheus exposition.
//! - [`net`]: the listener, connection caps, sniffing, TLS, shutdown.
//! - [`openapi`]: the OpenAPI document, built from the descriptors.
//! - [`protocol`]: the five protocols' names, one label each; connections' kinds.
//! - [`readiness`]: the one readiness `/readyz` and gRPC health report.
//! - [`reload`]: the one watcher of the TLS files and the tenants file (SIGHUP, changes).
//! - [`router`]: wiring every handler, nothing else.
//! - [`rpc`]: the call core: dispatch, state, errors, codecs.
//! - [`security`]: transport security as data: TLS files, credentials over plain HTTP.
//! - [`service`]: the RPCs: protobuf to engine types and back.

pub mod admin;
pub mod build_info;
pub mod config;
pub mod contract;
pub mod daemon;
pub mod dashboard;
pub mod edge;
pub mod ha;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod openapi;
pub mod protocol;
pub mod readiness;
pub mod reload;
pub mod router;
pub mod rpc;
pub mod security;
pub mod service;

// The workspace's crates under the names the server's modules use.
use yadcc_engine as engine;
use yadcc_pb as pb;
use yadcc_sim as sim;
use yadcc_text::grammar;

pub use router::app;
pub use rpc::state::AppState;
