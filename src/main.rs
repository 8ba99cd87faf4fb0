//! `yadcc-scheduler`: parse the command line, start the engine and the HTTP
//! server, and shut down gracefully on SIGINT/SIGTERM.

use std::{net::SocketAddr, process::ExitCode, sync::Arc, time::Duration};

use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;
use yadcc_engine::{self as engine, GrantFence, Scheduler};
use yadcc_scheduler::{
    AppState,
    admin::{self, Admin, Store},
    app,
    config::{self, Cli, Settings, server::LogFormat},
    dashboard::InspectAccess,
    edge,
    ha::{self, Leadership, election::Election},
    logging::LimitedWarnings,
    net,
};
use yadcc_sim as sim;

/// The server allocates and frees small buffers on every request (bodies,
/// decoded strings, responses); mimalloc's thread-local free lists serve that
/// pattern markedly faster than glibc's malloc (see BENCHMARKS.md, P1).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let (cli, flag_warnings) =
        Cli::parse_gflags(std::env::args_os()).unwrap_or_else(|error| error.exit());
    // The demo's simulated cluster makes ~50 calls a second: keep its access
    // log out of the way unless RUST_LOG asks for it.
    let default_filter = if cli.sim.demo {
        "info,yadcc_scheduler::access=warn"
    } else {
        "info"
    };
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    // Logs are diagnostics: stderr, and colour only for a person at a terminal.
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A client can make warnings happen (an HTTP/2 connection reset, accept
    // failures): at most one line a second from each place, in either format.
    match cli.server.log_format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .map_event_format(LimitedWarnings::new)
            .init(),
        // One object per line: `timestamp`, `level`, `target` and the event's
        // `fields` (its message among them); spans carry nothing worth a key.
        LogFormat::Json => logs
            .json()
            .with_current_span(false)
            .with_span_list(false)
            .map_event_format(LimitedWarnings::new)
            .init(),
    }
    for warning in flag_warnings {
        tracing::warn!("{warning}");
    }
    let settings = match cli.settings() {
        Ok(settings) => settings,
        Err(message) => {
            eprintln!("yadcc-scheduler: {message}");
            return ExitCode::from(2);
        }
    };
    match run(settings).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("yadcc-scheduler: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(settings: Settings) -> std::io::Result<()> {
    warn_about_open_doors(&settings);
    // Refused credentials never heal: stop now rather than stand by for ever.
    if let Some(ha) = &settings.ha {
        ha::election::check_credentials(ha)
            .await
            .map_err(std::io::Error::other)?;
    }
    let mut engine_config = settings.engine.clone();
    // With a hot standby, the engine grants only while elected.
    let fence = settings.ha.is_some().then(GrantFence::closed);
    if let Some(fence) = &fence {
        engine_config.grant_fence = fence.clone();
    }
    let engine = Scheduler::new(engine_config);
    let leadership = match fence {
        Some(fence) => Leadership::elected(engine.clone(), fence),
        None => Leadership::solo(),
    };
    // Connections cost descriptors; the connection cap is derived from this.
    match edge::raise_fd_limit() {
        Ok(limit) => tracing::info!("file-descriptor limit: {limit}"),
        Err(error) => tracing::warn!("cannot raise the file-descriptor limit: {error}"),
    }
    let admin = start_admin(&settings, &engine, &leadership).await?;
    let state = AppState::with_admin(
        engine.clone(),
        settings.transport.clone(),
        leadership.clone(),
        admin,
    );
    if let Some(path) = &settings.tenants_file {
        let tenants = settings.engine.tenancy.iter().flat_map(|t| &t.tenants);
        tracing::info!(
            "tenants from {} (read again on SIGHUP and when it changes): {}",
            path.display(),
            tenants
                .map(|t| format!("{} (weight {})", t.name, t.weight))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let failures = state.metrics.config_reload_failures();
        state.reloads.add(config::tenants_file::Watched::source(
            path.clone(),
            engine.clone(),
            settings.tenants_checks.clone(),
            Arc::new(move || {
                failures.inc();
            }),
        ));
    }
    let listener = bind_when_free(settings.listen).await.map_err(|error| {
        std::io::Error::new(
            error.kind(),
            format!("cannot listen on {}: {error}", settings.listen),
        )
    })?;
    let local = listener.local_addr()?;
    tracing::info!("listening on http://{local} (daemons: flare://{local} or http+pb://{local})");
    if settings.transport.security.tls.is_some() {
        tracing::info!("TLS on the same port: https://{local} (HTTP/2 or HTTP/1.1 by ALPN)");
    }
    #[allow(unused_mut)] // Only a bench-route build adds to it.
    let mut router = app(state.clone());
    #[cfg(feature = "bench-route")]
    if settings.bench_bare_route {
        tracing::warn!("benchmark route POST {} is mounted", sim::BARE_PATH);
        router = router.merge(bench_route::bare_router());
    }
    let demo = settings.demo.then(|| start_demo(&settings, local));
    let election = settings.ha.clone().map(|mut ha| {
        ha.instance = ha::instance_name(local);
        Election::start(ha, leadership)
    });
    net::serve(
        listener,
        router,
        state,
        shutdown_signal(engine, demo, election),
    )
    .await
}

/// The operators' side: where their state lasts, what the last run left
/// there (`--state_file`, read before anything is served; with a hot standby
/// each win reads etcd instead), and what the log says about it.
async fn start_admin(
    settings: &Settings,
    engine: &Scheduler,
    leadership: &Leadership,
) -> std::io::Result<Admin> {
    let store = match (&settings.ha, &settings.state_file) {
        (Some(_), _) => Store::Etcd(leadership.clone()),
        (None, Some(path)) => Store::File(path.clone()),
        (None, None) => Store::Memory,
    };
    let admin = Admin::new(
        settings.admin_tokens.clone(),
        engine.clone(),
        leadership.clone(),
        store,
    );
    if let Some(path) = &settings.state_file {
        let saved = admin::store::read_file(path).map_err(std::io::Error::other)?;
        admin.restore(saved);
        // Written at once: a file that cannot be written stops the start,
        // not the first action.
        admin
            .store()
            .save(&admin.state())
            .await
            .map_err(|error| std::io::Error::other(format!("--state_file: {error}")))?;
    }
    if settings.ha.is_some() {
        leadership.keep_saved_state(Arc::new(admin.clone()));
    }
    let cordoned = engine.cordons().len();
    if admin.tokens().is_closed() {
        tracing::info!(
            "the admin API is closed: pass --admin_tokens=TOKEN to cordon and drain servants"
        );
    } else {
        tracing::info!(
            "the admin API takes {} token(s) (labels {}); cordons and the audit list are kept {}",
            admin.tokens().labels().len(),
            admin.tokens().labels().join(", "),
            admin.store().describe()
        );
    }
    if cordoned > 0 {
        tracing::info!("{cordoned} servant location(s) cordoned, as the state file says");
    }
    Ok(admin)
}

/// The baseline of benchmark P1 (`yadcc-loadgen heartbeat-rate`): what the HTTP stack
/// alone can do. Built only with the `bench-route` feature.
#[cfg(feature = "bench-route")]
mod bench_route {
    use axum::{Router, body::Bytes, http::header, response::IntoResponse, routing::post};
    use yadcc_sim::BARE_PATH;

    /// What the bare route answers: as many bytes as a binary
    /// `HeartbeatResponse` carrying three serving-daemon tokens (3 x (2 + 32) bytes).
    static BARE_RESPONSE: [u8; 102] = [b'x'; 102];

    /// `POST /bench/bare`: reads the body and answers fixed bytes, on the same
    /// server (listener, hyper, axum router) as the RPCs.
    pub fn bare_router() -> Router {
        Router::new().route(BARE_PATH, post(bare))
    }

    async fn bare(body: Bytes) -> impl IntoResponse {
        drop(body);
        (
            [(header::CONTENT_TYPE, "application/x-protobuf")],
            Bytes::from_static(&BARE_RESPONSE),
        )
    }
}

/// `--demo`: a simulated cluster against this scheduler, and where to look.
fn start_demo(settings: &Settings, local: SocketAddr) -> sim::Cluster {
    let target = sim::connect_address(local);
    let first = |tokens: &engine::TokenSet| tokens.first_entry().unwrap_or_default().to_owned();
    // With the demo's tenants the user tokens live in the tenancy, not in
    // the flag's set: the simulated daemons are the `developers` tenant.
    let user_token = Some(first(&settings.engine.user_tokens))
        .filter(|token| !token.is_empty())
        .unwrap_or_else(|| sim::DEMO_USER_TOKEN.to_owned());
    let servant_token = first(&settings.engine.servant_tokens);
    let mut config = sim::ClusterConfig::demo(target, &user_token, &servant_token);
    config.protocol = settings.demo_protocol;
    // Only the demo's own, public tokens are printed: tokens an operator
    // passed stay out of the log.
    let shown = if user_token == sim::DEMO_USER_TOKEN && servant_token == sim::DEMO_SERVANT_TOKEN {
        format!("user token {user_token:?}, servant token {servant_token:?}")
    } else {
        "with the configured tokens".to_owned()
    };
    tracing::info!(
        "demo: {} simulated daemons ({} of them compiling) are joining over {} ({shown})",
        config.servants.max(config.delegates),
        config.delegates,
        config.protocol
    );
    if settings.engine.tenancy.is_some() {
        tracing::info!(
            "demo: tenants developers (user token {:?}, weight 3; the simulated daemons) \
             and ci (user token {:?}, weight 1, at most half the slots)",
            sim::DEMO_USER_TOKEN,
            config::demo::DEMO_CI_TOKEN
        );
    }
    if settings
        .admin_tokens
        .accepts(config::demo::DEMO_ADMIN_TOKEN)
    {
        tracing::info!(
            "demo: the admin API (cordon, drain, uncordon; the dashboard's Operator panel) \
             takes the token {:?}",
            config::demo::DEMO_ADMIN_TOKEN
        );
    }
    tracing::info!("demo: dashboard at http://{target}/");
    tracing::info!("demo: API docs at http://{target}/docs");
    tracing::info!(
        "demo: try curl -s http://{target}/rpc/yadcc.scheduler.SchedulerService.GetRunningTasks -H 'Content-Type: application/json' -d '{{}}'"
    );
    sim::Cluster::start(config)
}

fn warn_about_open_doors(settings: &Settings) {
    for (tokens, flag, who) in [
        (
            &settings.engine.user_tokens,
            "--acceptable_user_tokens",
            "request compile slots",
        ),
        (
            &settings.engine.servant_tokens,
            "--acceptable_servant_tokens",
            "register as a servant",
        ),
    ] {
        if tokens.accepts_anyone() {
            tracing::warn!("--insecure_accept_any_token: ANYONE may {who}");
        } else if tokens.accepts_empty_token() {
            tracing::warn!(
                "POSSIBLE SECURITY BREACH: {flag} has an empty entry: daemons without --token may {who}"
            );
        }
    }
    match &settings.transport.inspect {
        InspectAccess::Closed => tracing::info!(
            "dashboard, /api/v1 and /inspect are closed: pass --inspect_credential=USER:PASSWORD \
             (basic auth) or --debugging_no_inspect_auth to open them"
        ),
        InspectAccess::Credential(_) => tracing::info!(
            "dashboard, /api/v1 and /inspect ask for the --inspect_credential (basic auth)"
        ),
        InspectAccess::Open if settings.demo && settings.listen.ip().is_loopback() => {
            tracing::info!(
                "demo: dashboard, /api/v1 and /inspect are open without a credential, \
                 because the demo listens on loopback only"
            )
        }
        InspectAccess::Open => tracing::warn!(
            "--debugging_no_inspect_auth: dashboard, /api/v1 and /inspect are open to anyone \
             who reaches {} (they never show tokens, but show grant ids and addresses)",
            settings.listen
        ),
    }
}

/// Resolves on SIGINT or SIGTERM, after resigning from the election (so a
/// standby takes over at once) and telling the engine to answer every
/// queued wait, so in-flight long polls finish and the server can drain.
async fn shutdown_signal(
    engine: Scheduler,
    demo: Option<sim::Cluster>,
    election: Option<Election>,
) {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {},
        () = terminate => {},
    }
    if let Some(demo) = demo {
        tracing::info!("demo: stopping the simulated cluster");
        demo.stop().await;
    }
    if let Some(election) = election {
        election.resign().await;
    }
    tracing::info!("shutting down: answering waiting calls, draining connections");
    engine.shutdown();
}

/// How long a start waits for its address to be released. A scheduler
/// restarted at once after `kill -9` finds the port still held while the
/// kernel tears the old process down; giving up at once would leave the
/// daemons with no scheduler at all.
const BIND_PATIENCE: Duration = Duration::from_secs(5);
/// Pause between two tries to bind a held address.
const BIND_RETRY_INTERVAL: Duration = Duration::from_millis(100);

/// Binds `listen`, trying again for up to [`BIND_PATIENCE`] while the address
/// is in use (logged once), then failing with the last error.
async fn bind_when_free(listen: SocketAddr) -> std::io::Result<TcpListener> {
    let give_up_at = tokio::time::Instant::now() + BIND_PATIENCE;
    let mut warned = false;
    loop {
        match TcpListener::bind(listen).await {
            Err(error)
                if error.kind() == std::io::ErrorKind::AddrInUse
                    && tokio::time::Instant::now() < give_up_at =>
            {
                if !warned {
                    tracing::warn!(
                        "{listen} is in use (an instance stopped a moment ago?): \
                         trying again for up to {} s",
                        BIND_PATIENCE.as_secs()
                    );
                    warned = true;
                }
                tokio::time::sleep(BIND_RETRY_INTERVAL).await;
            }
            result => return result,
        }
    }
}
