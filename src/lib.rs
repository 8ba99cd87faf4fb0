//! yadcc scheduler: decides which compile servant runs which compilation, for a
//! whole cluster, behind an HTTP gateway that speaks binary protobuf and JSON.
//!
//! Words, one concept each (types named after them; `renames.md` of issue
//! 36 lists the names they replaced):
//!
//! - **connection**: one accepted TCP stream, under the connection caps
//!   ([`edge`]). Its first bytes pick the server that takes it for good
//!   (`net::ConnectionServer`): a daemon framing, or hyper.
//! - **protocol**: what a call speaks on the wire, one of six
//!   ([`protocol::Protocol`]: `flare`, `http+pb`, `http`, `connect`, `grpc`,
//!   `grpc-web`), the label in metrics, the access log and the dashboard.
//!   A simulated daemon's choice is its **wire** ([`sim::Wire`]: `flare`,
//!   `http+pb`, `json`).
//! - **framing**: how a daemon connection's bytes split into requests and
//!   answers ([`daemon::Framing`]: `daemon::flare`, `daemon::http_pb`).
//!   gRPC's length-prefixed messages come in three flavours
//!   ([`http::grpc::GrpcFlavour`]: gRPC, gRPC-Web, gRPC-Web text).
//! - **dialect**: how one protocol over HTTP reads a request's head and body
//!   and writes its answer ([`http::handler::Dialect`], implemented by
//!   [`http::dialect::RouteDialect`] and [`http::grpc::Grpc`]). A **route
//!   style** ([`http::dialect::RouteStyle`]) is the family of paths and
//!   headers a request used: `/rpc/...` (`http+pb`) or Connect's.
//! - **call**: one RPC, from its request to its answer, whatever the
//!   protocol ([`rpc::Call`]).
//! - **answer**: what a call gets back, a message or an error
//!   ([`rpc::EncodedAnswer`]); a daemon connection queues its answers in
//!   `daemon::conn::AnswerSender`, a hyper connection's are counted by
//!   [`net::answers::AnswerTracker`]. "Response" is kept for the prost
//!   `*Response` messages and hyper's `Response`.
//! - **requester**: who waits for grants in the engine, a daemon's
//!   connection or an address (`engine/requesters.rs`); turns are fair
//!   between requesters.
//! - **tenant**: a named group of user tokens with a weight (issue 31,
//!   `--tenants_file`); grants are shared between tenants with waiting calls
//!   in proportion to their weights, then between a tenant's requesters.
//!
//! One request travels one way, and each layer knows one thing:
//!
//! ```text
//! socket -> net             accept under the connection caps; the first bytes
//!                           decide the protocol of the whole connection:
//!    "CPRF"      -> daemon          one connection loop for the daemons' protocols:
//!    daemon http -> daemon          long polls concurrent, answers written as they
//!                                   finish, matched by id, one overload, idle and
//!                                   close rule; framings daemon::flare (binary
//!                                   frames) and daemon::http_pb (`Rpc-SeqNo`)
//!    otherwise   -> hyper -> router          wiring only; picks the dialect per request
//!                         -> http::handler   the seam: each dialect (http::dialect:
//!                                            http+pb and Connect; http::grpc: gRPC and
//!                                            gRPC-Web) says what a head means; the head
//!                                            checks run once, in one order (among
//!                                            them http::cors: no cross-site calls)
//!        -> rpc             the call core every protocol calls: deadline, dispatch,
//!                           metrics, access log, peer protocol ([`protocol::Protocol`])
//!        -> rpc::codec      bytes <-> prost message (binary protobuf, proto3 JSON;
//!                           rpc::json reads JSON in one pass into binary protobuf)
//!        -> service         prost message <-> engine domain types; scheduler `Status`
//!                           (service::admin: the operators' service -> admin)
//!        -> engine          servants, grants, waiters, tokens, expiry, cordons (no HTTP, no protobuf)
//! ```
//!
//! A `Heartbeat`, file by file (the other RPCs take the same way):
//!
//! ```text
//! flare://   src/net.rs            serve: accept under the caps; serve_connection, sniff,
//!                                  classify:
//!                                  "CPRF" -> ConnectionServer::Flare
//!            src/daemon.rs         serve: the connection loop, with the framing Flare
//!            src/daemon/conn.rs    Connection: the reader, calls in flight, AnswerSender
//!            src/daemon/flare.rs   read_request (frame.rs: the frame, RequestMeta), method_of
//! http+pb    src/net.rs            classify: `Rpc-SeqNo` head -> ConnectionServer::DaemonHttp
//! (daemon)   src/daemon.rs, src/daemon/conn.rs   as above, with the framing HttpPb
//!            src/daemon/http_pb.rs read_request: the head checked by http/dialect.rs's
//!                                  RouteDialect (DAEMON_HTTP_PB), as on the general server
//! curl, Connect, gRPC:
//!            src/net.rs            classify -> ConnectionServer::Hyper; serve_hyper
//!                                  (net/answers.rs: AnswerTracker counts its answers)
//!            src/router.rs         rpc_path / service_path: the dialect by path and
//!                                  Content-Type (RouteStyle::HttpPb.served(), Connect, Grpc)
//!            src/http/handler.rs   serve, check_head: the head checks in one order;
//!                                  Dialect::message reads the body (http/dialect.rs, http/grpc.rs)
//! then, every protocol:
//!            src/rpc.rs            call: deadline, leadership, metrics, access log;
//!                                  dispatch: Method::Heartbeat
//!            src/rpc/codec.rs      decode: the pb::HeartbeatRequest (rpc/json.rs for JSON)
//!            src/service.rs        SchedulerService::heartbeat: prost -> engine::Heartbeat
//!            src/engine.rs         Scheduler::heartbeat: the token, the version, the limits,
//!                                  then the one lock (engine/shared.rs)
//!            src/engine/heartbeat.rs  State::heartbeat: admission, reports, adoption
//! and back:  src/service.rs -> src/rpc/codec.rs (encode) -> rpc::EncodedAnswer ->
//!            src/daemon/flare.rs answer / src/daemon/http_pb.rs answer, written by
//!            AnswerSender; or the dialect's respond, written by hyper.
//! ```
//!
//! The call core ([`rpc`]) is below every transport and imports none of
//! them: [`rpc::state`] (`AppState`: service, metrics, dashboard, settings,
//! the body budget, the `GetRunningTasks` answer, the [`readiness`]) is what
//! every transport takes; [`rpc::error`] is the one error table, mapping every failure to an
//! HTTP status, the framework's numeric `Rpc-Error-Code` (also the binary
//! protocol's `status`), a Connect code and a JSON body (the HTTP form is
//! [`http::dialect`]'s); [`rpc::running_tasks`] owns the `GetRunningTasks`
//! answer, the whole list, encoded once per version of the engine's list,
//! per encoding and per compression; [`rpc::compression`] is the binary
//! protocol's compressions (requests inflated, bounded; large answers
//! compressed for callers that accept it).
//! Which scheduler `Status` codes each RPC can answer with is
//! [`service::failure_statuses`]. [`http::operations`] serves `/healthz`,
//! `/readyz` and `/metrics`.
//!
//! Layers, top to bottom: an import points to its own line or below, never
//! up, and never in a loop (`scripts/module_graph.py --check` reads this
//! block and fails CI otherwise; a module belongs to the longest name that
//! names it or a parent):
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
//! edge protocol grammar readiness build_info logging security  leaves: limits, labels, grammars, readiness, the build, log limits, transport security
//! sim                             the simulated daemons: generated types only
//! pb                              generated types, Method, Encoding, the framework's compression formats
//! ```
//!
//! Inside the engine (`src/engine.rs` and `src/engine/`): `engine.rs` is the cheap-to-clone handle;
//! `shared.rs` the one `Mutex<State>`, the token check and the one expiry
//! task; `state.rs` the state: one owner type per index family, each with
//! private fields and the methods that keep it consistent: `servants.rs`
//! (registry, address index, expiries, reports, the running-task list's
//! version, capacity rule), `grants.rs` (grant table, leases, adoption
//! memory, counters), `envs.rs` (per-environment indexes, `Envs`, and the
//! follow-up `Effects` of a change), `wait_queues.rs` (queues fair between
//! tenants, then between requesters, their count and the waiter caps,
//! `WaitQueues`), `tenants.rs` (tenants' weights, caps, virtual times and
//! figures, `Tenants`; the token directory, `Access`, swapped whole by a
//! reload),
//! `requesters.rs` (owners by address and token, turns by requester: a
//! daemon's connection or an address, figures per address), `adoption.rs`
//! (the window after start), `cordons.rs` (the locations operators took
//! out of rotation), `own_load.rs` (rule "own load": the 15 s average of
//! the grants on a servant), `speed.rs` (rule "observed speed": how soon a
//! servant's grants come back), `tokens.rs`
//! (token sets and the flag's splitting rule, `Redacted`, serving-daemon
//! ring). The rules that change several owners are `impl State` blocks:
//! `lifecycle.rs` (placement rule, the one grant creation and the one
//! removal, renew, free by the owner only, zombies), `heartbeat.rs`
//! (admission, reports, adoption, servant removal), `waiters.rs` (admission,
//! serving, timeouts, cancellation), `cordoning.rs` (a cordon applied to the
//! servants it covers), `snapshot.rs` (totals, inspection).
//! `types.rs`, `views.rs` and `config.rs` hold the plain types. The rules
//! the comments cite by name are listed in `RULES.md`, each with the
//! function that holds it. Tests by topic in `tests/`.
//!
//! The edge's limits (timeouts, caps, the budget for buffered request
//! bytes: each connection's own 64 KiB, then the global budget; the bound on
//! a connection's queued answers) are [`edge`], one flag or named constant
//! each; every protocol obeys them. A daemon connection counts its queued
//! answers in `daemon::conn` (an answer is a head and a payload shared by
//! every caller, written with one vectored write); a hyper connection's
//! answers are counted until hyper takes them in `net::answers`, which also
//! closes a connection whose answers make no progress. Strangers
//! (connections that never completed a call with a valid token: the
//! [`edge::Proof`] the call core marks, `rpc::proves_a_token`) buffer beyond
//! their own 64 KiB only within a quarter of the global budget, and are
//! evicted first, oldest first, near the connection cap (`net::strangers`);
//! a hyper connection without a complete request within the header-read
//! timeout, or without an open one for the idle timeout, is closed
//! (`net::streams`). A client's value echoed in an error is cut by
//! [`edge::echo`]. [`logging`]: which
//! calls the access log writes (`--access_log`) and the limit of one line a
//! second per kind on what clients can make the server write.
//!
//! Beside the request path, never in it:
//! - [`security`]: transport security as data and rules: the TLS files
//!   (served by `net::tls`: a first byte 0x16 is a TLS handshake, served by
//!   hyper after it), the rule for the inspection credential over plain
//!   HTTP, the limit on guessing it, and their counters. `docs/security.md`.
//! - [`contract`]: what a request's fields must satisfy (engine limits,
//!   required fields), as data the OpenAPI document states; [`grammar`]: the
//!   `location` and header-integer grammars, each a parser (the engine and the
//!   transports check with it) and the pattern the document states.
//! - [`pb`]: generated types and the descriptor pool (`build.rs` compiles
//!   `proto/`), and the names every protocol and the simulator share:
//!   [`pb::Service`] and [`pb::Method`] (each service's RPCs, each RPC's
//!   name, full name, `/rpc/` and Connect paths, from one table) and
//!   [`pb::Encoding`].
//! - [`admin`] (`src/admin/`): the operators' side of
//!   `yadcc.scheduler.AdminService` (`proto/yadcc/api/admin.proto`, its
//!   protobuf side in [`service::admin`]): `credentials.rs` (`--admin_tokens`,
//!   the bearer token, the seam for a client certificate's subject, the
//!   [`admin::Identity`] the audit names), `audit.rs` (the log line and the
//!   bounded list), `store.rs` (the saved state: `--state_file`, or etcd
//!   through [`ha::Leadership::save_state`]); `admin.rs` checks, saves, then
//!   applies each action on the engine's cordons.
//! - [`http::reflection`]: gRPC server reflection from that descriptor set;
//!   [`http::health`]: the gRPC health service, reporting [`readiness`] (the
//!   one readiness `/readyz` reports, flipped by [`net`] when a shutdown
//!   begins and by [`ha`] while standing by); both served over gRPC, gRPC-Web and Connect by
//!   [`http::connect_bridge`] (Connect in front of tonic's services).
//! - [`openapi`]: the OpenAPI document built from the descriptor pool (one
//!   file per part: paths, schemas, errors, security, examples, prose and
//!   comments), served at `/openapi.json` with Swagger UI at `/docs`;
//!   committed in `openapi/`.
//! - [`dashboard`] (`src/dashboard/`): `overview.rs` the JSON over the engine
//!   snapshot, `history.rs` the history ring and the grant rates over 10 s,
//!   `tenants.rs` the Tenants view (`/api/v1/tenants`), `vars.rs` the original's dump at
//!   `/inspect/vars/yadcc/task_dispatcher`, `access.rs` who may read them
//!   ([`dashboard::InspectAccess`]: closed unless a flag opens them),
//!   `assets.rs` the page from `web/` embedded and routed from one list, with
//!   the security headers on every answer. `web/` is ES modules, no build
//!   step: `app.js` (entry, polling), `api.js`, `table.js` (the one table
//!   every panel uses), `cells.js`, `chart.js` and `chart-geometry.js`
//!   (history), `format.js`, `dom.js`, `store.js`, and `views/` (servants,
//!   grants, environments, requesters, tenants, summary cards, tabs, connection
//!   status, and `admin.js`, the operators' panel: cordons, and an
//!   operator's actions with the token kept in the tab).
//! - [`metrics`]: Prometheus exposition, classic text or OpenMetrics as the
//!   scraper asks (`exposition.rs`), the `process_*` series (`process.rs`),
//!   the per-tenant series (`tenants.rs`)
//!   and the build's version and commit ([`build_info`], embedded by
//!   `build.rs`; `--version` prints them too).
//! - [`ha`] (`src/ha/`): the hot standby. `election.rs` campaigns on etcd
//!   (etcd's own election and lease services, stubs from `proto/etcd/` in
//!   `etcd.rs`; `connection.rs` reaches an endpoint over `http://` or
//!   `https://` with etcd's CA and a client certificate, and holds etcd's
//!   user token, fetched again when etcd refuses it) and, on winning, opens the engine's [`engine::GrantFence`]
//!   until the lease could expire; `ha.rs` is the narrow side the rest
//!   sees, [`ha::Leadership`]: whether this instance serves (the call core
//!   refuses RPCs otherwise), whether a daemon connection is admitted and
//!   until when ([`net`] closes them), the takeover of daemons whose leader
//!   does not answer (`probe.rs` asks its `/readyz`), the engine's restarts,
//!   the role for `/readyz`, the dashboard and the metrics;
//!   `saved_state.rs` the operators' state in etcd beside the election,
//!   read on every win before the fence opens, written only while leading.
//!   [`net::proxy`] reads the PROXY header a balancer in front of it sends.
//! - [`config`]: the command line (`src/main.rs` starts and stops the server):
//!   `server.rs` (the scheduler's flags), `demo.rs` (`--demo`, and with the
//!   `bench-route` cargo feature the hidden `--bench_bare_route`),
//!   `settings.rs` (value parsers, checks across flags, [`config::Settings`]),
//!   `tenants_file.rs` (`--tenants_file`: TOML read strictly, watched for
//!   SIGHUP and changes, docs/tenants.md);
//!   every flag's kebab alias and `YADCC_*` variable are added in one place,
//!   and [`config::gflags`] first rewrites the original's gflags habits
//!   (`--flagfile`, `--fromenv`, `-name=value`, `--noflag`, glog and
//!   `--flare_*` flags).
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
//!   mode: `farm/` the farm model of benchmark P7 with its own daemons over
//!   [`sim::client`]; `heartbeat_rate/driver.rs` is P1, whose baseline route,
//!   `sim::BARE_PATH`, is served only by a `bench-route` build; `process.rs`
//!   reads a process's CPU and memory from `/proc`), `tests/it/daemons.rs`,
//!   `tests/it/restart.rs`
//!   (SIGKILL and restart of the real binary under load) and
//!   `scripts/bench.sh`.
//!
//! Tests: unit tests beside the code (the engine's in `engine/tests/`, with
//! paused time), issue 22's attacks on the real binary in `tests/memory/`
//! (a test binary of its own, one attack at a time: peak RSS and a
//! legitimate daemon's latency), integration tests over real sockets and
//! real Chromium in `tests/it/` (`cdp.rs` drives Chromium over DevTools for
//! `browser_operator.rs`; `admin.rs` and `admin_farm.rs` the operators'
//! service; with `differential.rs`, the JSON mapping
//! against Google's protobuf through `scripts/differential.py`, and `openapi_*.rs`, the
//! document against the code and a live server's answers against the
//! document's schemas with `jsonschema`, and `peers/`, the original yadcc's
//! daemons and compiler wrapper in network namespaces against the real
//! binary; heavy tests take `support::heavy()` and run one at a time),
//! engine benchmarks in `benches/`; `scripts/schemathesis.sh` tests the
//! OpenAPI document against a live server.

pub mod admin;
pub mod build_info;
pub mod config;
pub mod contract;
pub mod daemon;
pub mod dashboard;
pub mod edge;
pub mod engine;
pub mod grammar;
pub mod ha;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod openapi;
pub mod pb;
pub mod protocol;
pub mod readiness;
pub mod router;
pub mod rpc;
pub mod security;
pub mod service;
pub mod sim;

pub use router::app;
pub use rpc::state::AppState;
