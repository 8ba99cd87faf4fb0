//! `yadcc-scheduler`: parse the command line, start the engine and the HTTP
//! server, and shut down gracefully on SIGINT/SIGTERM.

use std::{net::SocketAddr, process::ExitCode};

use clap::Parser;
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;
use yadcc_scheduler::{
    AppState, app,
    config::{Cli, Settings},
    engine::Scheduler,
};

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
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
    let engine = Scheduler::new(settings.engine.clone());
    let state = AppState::new(engine.clone(), settings.http.clone());
    let listener = TcpListener::bind(settings.listen).await.map_err(|error| {
        std::io::Error::new(
            error.kind(),
            format!("cannot listen on {}: {error}", settings.listen),
        )
    })?;
    let local = listener.local_addr()?;
    tracing::info!("listening on http://{local} (http+pb://{local} for daemons)");
    axum::serve(
        listener,
        app(state).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown_signal(engine))
    .await
}

fn warn_about_open_doors(settings: &Settings) {
    if settings.engine.user_tokens.iter().any(String::is_empty) {
        tracing::warn!("an empty user token is accepted: ANYONE may request compile slots");
    }
    if settings.engine.servant_tokens.iter().any(String::is_empty) {
        tracing::warn!("an empty servant token is accepted: ANYONE may register as a servant");
    }
    if settings.http.inspect_credential.is_none() {
        tracing::info!(
            "dashboard and inspection API are open (no --inspect_credential); they never show tokens"
        );
    }
}

/// Resolves on SIGINT or SIGTERM, after telling the engine to answer every
/// queued wait, so in-flight long polls finish and the server can drain.
async fn shutdown_signal(engine: Scheduler) {
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
    tracing::info!("shutting down: answering waiting calls, draining connections");
    engine.shutdown();
}
