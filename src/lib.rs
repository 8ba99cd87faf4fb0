//! yadcc scheduler: decides which compile servant runs which compilation, for a
//! whole cluster, behind an HTTP gateway that speaks binary protobuf and JSON.
//!
//! One request travels one way, and each layer knows one thing:
//!
//! ```text
//! socket -> net             accept under the connection caps; the first bytes
//!                           decide the protocol of the whole connection:
//!    "CPRF"      -> flare          the daemons' binary frames, long polls concurrent,
//!                                  answers written as they finish, matched by id
//!    daemon http -> flare::http    the daemons' http+pb (`Rpc-SeqNo`), same rules
//!    otherwise   -> hyper -> http::routes   wiring only; http::access_log, peer address
//!                         -> http::dialect  http+pb (`/rpc/...`) and Connect framing
//!                            http::grpc     gRPC and gRPC-Web, on the Connect path by Content-Type
//!        -> rpc             the one entry every protocol calls: deadline, metrics,
//!                           access log, peer protocol ([`protocol::Protocol`] labels)
//!        -> http::codec     bytes <-> prost message (binary protobuf, proto3 JSON;
//!                           http::json brings every canonical JSON form to pbjson's)
//!        -> service         prost message <-> engine domain types; scheduler `Status`
//!        -> engine          servants, grants, waiters, tokens, expiry (no HTTP, no protobuf)
//! ```
//!
//! Errors have one table: [`http::error`] maps every failure to an HTTP
//! status, the framework's numeric `Rpc-Error-Code` (also the binary
//! protocol's `status`), a Connect code and a JSON body. Which scheduler
//! `Status` codes each RPC can answer with is [`service::failure_statuses`].
//!
//! Arrows point down the picture: every transport takes [`http::state`]
//! (`AppState`: service, metrics, dashboard, settings), which knows none of
//! them; [`http::operations`] serves `/healthz`, `/readyz` and `/metrics`.
//! `scripts/module_graph.py` prints the module graph and its import cycles.
//!
//! Inside the engine (`src/engine/`): `mod.rs` is the cheap-to-clone handle;
//! `shared.rs` the one `Mutex<State>`, the token check and the one expiry
//! task; `state.rs` the state: one owner type per index family, each with
//! private fields and the methods that keep it consistent: `servants.rs`
//! (registry, address index, expiries, reports, running-task list, capacity
//! rule), `grants.rs` (grant table, leases, adoption memory, counters),
//! `placement.rs` (per-environment indexes), `queue.rs` (queues fair between
//! machines and their count), `requesters.rs` (owners, last served,
//! figures), `adoption.rs` (the window after start), `tokens.rs` (token sets
//! and the flag's splitting rule, `Redacted`, serving-daemon ring). The
//! rules that change several owners are `impl State` blocks:
//! `lifecycle.rs` (placement rule, the one grant creation and the one
//! removal, renew, free by the owner only, zombies), `heartbeat.rs`
//! (admission, reports, adoption, servant removal), `waiters.rs` (admission,
//! serving, timeouts, cancellation), `snapshot.rs` (totals, inspection).
//! `types.rs`, `views.rs` and `config.rs` hold the plain types; no import
//! cycles. Tests by topic in `tests/`.
//!
//! The edge's limits (timeouts, caps, the budget for buffered bodies) are
//! [`limits`], one flag each; every protocol obeys them.
//!
//! Beside the request path, never in it:
//! - [`contract`]: what a request's fields must satisfy (engine limits,
//!   required fields), as data the OpenAPI document states; [`grammar`]: the
//!   `location` and header-integer grammars, each a parser (the engine and the
//!   transports check with it) and the pattern the document states.
//! - [`pb`]: generated types and the descriptor pool (`build.rs` compiles
//!   `proto/`), and the names every protocol and the simulator share:
//!   [`pb::Method`] (each RPC's name, full name, `/rpc/` and Connect paths)
//!   and [`pb::Encoding`].
//! - [`http::reflection`]: gRPC server reflection from that descriptor set.
//! - [`openapi`]: the OpenAPI document built from the descriptor pool (one
//!   file per part: paths, schemas, errors, security, examples, prose and
//!   comments), served at `/openapi.json` with Swagger UI at `/docs`;
//!   committed in `openapi/`.
//! - [`dashboard`] (`src/dashboard/`): `views.rs` the JSON over the engine
//!   snapshot, `history.rs` the history ring, `vars.rs` the original's dump at
//!   `/inspect/vars/yadcc/task_dispatcher`, `access.rs` who may read them
//!   ([`dashboard::InspectAccess`]: closed unless a flag opens them),
//!   `assets.rs` the page from `web/` embedded and routed from one list, with
//!   the security headers on every answer. `web/` is ES modules, no build
//!   step: `app.js` (entry, polling), `api.js`, `table.js` (the one table
//!   every panel uses), `cells.js`, `chart.js` and `chart-geometry.js`
//!   (history), `format.js`, `dom.js`, `store.js`, and `views/` (servants,
//!   grants, environments, requesters, summary cards, tabs, connection status).
//! - [`metrics`]: Prometheus exposition.
//! - [`config`]: the command line (`src/main.rs` starts and stops the server):
//!   `server.rs` (the scheduler's flags), `demo.rs` (`--demo`, and with the
//!   `bench-route` cargo feature the hidden `--bench_bare_route`),
//!   `settings.rs` (value parsers, checks across flags, [`config::Settings`]);
//!   every flag's kebab alias and `YADCC_*` variable are added in one place,
//!   and [`config::gflags`] first rewrites the original's gflags habits
//!   (`--flagfile`, `-name=value`, `--noflag`, glog and `--flare_*` flags).
//! - [`sim`]: a simulated cluster of stock daemons (each machine servant and
//!   delegate, at most two shared connections, the daemons' periods and
//!   timeouts, compressed answers accepted and inflated) speaking `flare://`,
//!   `http+pb` or JSON from the outside; it imports [`pb`] only, never the
//!   server's modules. No task per machine or per call: timing wheels
//!   (`shard.rs`) fire what falls due, answers are handled on their
//!   connection's reader (`daemons.rs`, `servant.rs`, `delegate.rs`,
//!   `jobs.rs`, `registry.rs`). `sim::wire` (`flare.rs`, `http.rs`,
//!   `compression.rs`: encoders, and decoders giving a daemon's answer or the
//!   whole response) and `sim::client` (`serial.rs`, `mux.rs`,
//!   `endpoint.rs`: one exchange at a time, many calls per connection, a
//!   machine's pool) are also the raw client of `tests/it/`. Used by
//!   `--demo`, the load generator (`src/bin/loadgen/`, one file per kind of
//!   mode; `sim::heartbeat_rate` is P1, whose baseline route is served only
//!   by a `bench-route` build), `tests/it/daemons.rs`, `tests/it/restart.rs`
//!   (SIGKILL and restart of the real binary under load) and
//!   `scripts/bench.sh`.
//!
//! Tests: unit tests beside the code (the engine's in `engine/tests/`, with
//! paused time), integration tests over real sockets and real Chromium in
//! `tests/it/` (with `differential.rs`, the JSON mapping against Google's
//! protobuf through `scripts/differential.py`, and `openapi_*.rs`, the
//! document against the code and a live server's answers against the
//! document's schemas with `jsonschema`), engine benchmarks in
//! `benches/`; `scripts/schemathesis.sh` tests the OpenAPI document against a
//! live server.

pub mod config;
pub mod contract;
pub mod dashboard;
pub mod engine;
pub mod flare;
pub mod grammar;
pub mod http;
pub mod limits;
pub mod metrics;
pub mod net;
pub mod openapi;
pub mod pb;
pub mod protocol;
pub mod rpc;
pub mod service;
pub mod sim;

pub use http::{routes::app, state::AppState};
