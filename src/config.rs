//! The command line. Flag names are the reference scheduler's (snake_case, so
//! existing deployment scripts keep working); each is also accepted in
//! kebab-case and as a `YADCC_*` environment variable. The original's gflags
//! habits (`--flagfile`, `-name=value`, `--noflag`, its logging flags) are
//! rewritten by [`gflags`] before clap sees them.
//!
//! [`server`]: the scheduler's flags; [`demo`]: the simulator run inside it;
//! [`settings`]: value parsers, checks across flags, and the [`Settings`]
//! the server starts with; [`tenants_file`]: `--tenants_file`, read and
//! watched.

pub mod demo;
pub mod gflags;
#[cfg(test)]
mod ha_tests;
pub mod server;
pub mod settings;
pub mod tenants_file;
#[cfg(test)]
mod tests;

use std::ffi::OsString;

use clap::{ArgAction, Command, CommandFactory, FromArgMatches, Parser};

pub use settings::{MAX_FLAG_DURATION, Settings, parse_duration, parse_size};

/// yadcc scheduler: hands out compile slots on the servants of a yadcc cluster.
///
/// Daemons reach it with `--scheduler_uri=flare://HOST:8336` (or http+pb://); scripts post
/// JSON to `/rpc/yadcc.scheduler.SchedulerService.<Method>`; people open the
/// dashboard at `/` and the API docs at `/docs`.
#[derive(Debug, Clone, Parser)]
// Repeating a flag is not an error: the last one wins, as with gflags (a
// flag file, then an override on the command line).
#[command(version = crate::build_info::LONG_VERSION, about, long_about, args_override_self = true)]
pub struct Cli {
    #[command(flatten)]
    pub server: server::ServerFlags,
    #[command(flatten)]
    pub sim: demo::DemoFlags,
}

/// Prefix of the environment variable of every flag (`YADCC_PORT`).
const ENV_PREFIX: &str = "YADCC_";

impl Cli {
    /// The command line clap parses: every flag under its snake_case name,
    /// also in kebab-case and as `YADCC_<NAME>` in the environment; every
    /// boolean a [`gflags::switch`], so `--noname` overrides its variable.
    pub fn command_line() -> Command {
        <Cli as CommandFactory>::command().mut_args(|arg| {
            let Some(long) = arg.get_long().map(str::to_owned) else {
                return arg;
            };
            if matches!(arg.get_action(), ArgAction::Help | ArgAction::Version) {
                return arg;
            }
            let arg = if matches!(arg.get_action(), ArgAction::SetTrue) {
                gflags::switch(arg)
            } else {
                arg
            };
            let arg = arg.env(format!("{ENV_PREFIX}{}", long.to_ascii_uppercase()));
            if long.contains('_') {
                arg.visible_alias(long.replace('_', "-"))
            } else {
                arg
            }
        })
    }

    /// Parses `args` (program name first) as they are, without the gflags
    /// rewriting.
    pub fn try_parse_args(
        args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
    ) -> Result<Cli, clap::Error> {
        let mut command = Cli::command_line();
        let matches = command.try_get_matches_from_mut(args)?;
        Cli::from_arg_matches(&matches).map_err(|error| error.format(&mut command))
    }

    /// Parses a command line as the original scheduler's operators write it
    /// (see [`gflags`]); also returns the warnings to log once logging is up.
    pub fn parse_gflags(
        args: impl IntoIterator<Item = OsString>,
    ) -> Result<(Cli, Vec<String>), clap::Error> {
        let mut command = Cli::command_line();
        command.build();
        let normalised = gflags::normalise(&command, args, |name| std::env::var_os(name))
            .map_err(|message| command.error(clap::error::ErrorKind::InvalidValue, message))?;
        let cli = Cli::try_parse_args(normalised.args)?;
        Ok((cli, normalised.warnings))
    }
}
