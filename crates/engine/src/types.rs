//! Domain types the service layer translates to and from the wire.
//!
//! Nothing here knows about protobuf or HTTP: the service layer copies the
//! wire fields into these types and maps [`Rejection`] to the seed's `Status`
//! codes. Fields are checked here, by the engine, in the reference's order
//! (token, version, arguments), so a request is moved over unparsed.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::time::Instant;

use super::tokens::Redacted;

/// How eagerly the scheduler uses a servant: dedicated build machines are
/// preferred over developers' desktops that volunteer spare cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServantPriority {
    /// A machine whose only job is compiling for others (QoS somewhat guaranteed).
    Dedicated,
    /// A user's machine volunteering idle processors. The service maps
    /// `SERVANT_PRIORITY_UNKNOWN` and out-of-range values here (old daemons).
    User,
}

/// Why a servant takes no new task, as reported by the servant or decided by
/// the engine. Codes are those of the seed's `NotAcceptingTaskReason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NotAcceptingReason {
    /// The servant's owner told the daemon not to serve others (code 1).
    UserInstructed,
    /// The machine is too small or, when the engine decides it, its available
    /// memory is under `servant_min_memory_for_accepting_new_task` (code 2).
    PoorMachine,
    /// cgroups limits are present on the machine (code 3).
    CgroupsPresent,
    /// The address the scheduler saw differs from the one the servant reports,
    /// so other daemons probably cannot reach it (code 4).
    BehindNat,
    /// The servant presented only a user token, not a servant token (code 100).
    NotVerified,
    /// A code this engine does not know; kept so it can be shown and echoed.
    Other(u32),
}

impl NotAcceptingReason {
    /// The wire code (`NOT_ACCEPTING_TASK_REASON_*`), for the service layer and the dashboard.
    pub fn code(&self) -> u32 {
        match self {
            NotAcceptingReason::UserInstructed => 1,
            NotAcceptingReason::PoorMachine => 2,
            NotAcceptingReason::CgroupsPresent => 3,
            NotAcceptingReason::BehindNat => 4,
            NotAcceptingReason::NotVerified => 100,
            NotAcceptingReason::Other(n) => *n,
        }
    }

    /// Parses a wire code; `0` (`UNKNOWN`, also proto3's "unset") means "no reason".
    pub fn from_code(code: u32) -> Option<Self> {
        match code {
            0 => None,
            1 => Some(NotAcceptingReason::UserInstructed),
            2 => Some(NotAcceptingReason::PoorMachine),
            3 => Some(NotAcceptingReason::CgroupsPresent),
            4 => Some(NotAcceptingReason::BehindNat),
            100 => Some(NotAcceptingReason::NotVerified),
            n => Some(NotAcceptingReason::Other(n)),
        }
    }

    /// A sentence for people (dashboard, logs) explaining the reason.
    pub fn describe(&self) -> String {
        match self {
            NotAcceptingReason::UserInstructed => {
                "the machine's user asked the daemon not to take tasks".to_owned()
            }
            NotAcceptingReason::PoorMachine => {
                "the machine is too small or too short of memory for new tasks".to_owned()
            }
            NotAcceptingReason::CgroupsPresent => {
                "cgroups limits are present on the machine".to_owned()
            }
            NotAcceptingReason::BehindNat => {
                "the servant seems to be behind NAT (observed and reported addresses differ)"
                    .to_owned()
            }
            NotAcceptingReason::NotVerified => {
                "the servant did not present a servant token".to_owned()
            }
            NotAcceptingReason::Other(n) => format!("reason code {n} reported by the servant"),
        }
    }
}

impl fmt::Display for NotAcceptingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// One task a servant says it is running, keyed by the grant it was started with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReportedTask {
    /// The servant's own id for the task (shown to other daemons).
    pub servant_task_id: u64,
    /// The grant the task runs under; the engine checks it is still valid.
    pub grant_id: u64,
    /// Digest of the compilation, so other daemons can avoid duplicate work.
    pub task_digest: String,
}

/// A servant's periodic report, as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    /// Token presented by the daemon (user or servant token).
    pub token: Redacted<String>,
    /// Peer IP of the connection; IPv4-mapped IPv6 is normalised by the engine.
    pub observed_ip: IpAddr,
    /// `location` as sent (`a.b.c.d:port` or `[v6]:port`); the engine parses
    /// it after the token and version checks (rule "order of checks").
    pub location: String,
    /// When the next heartbeat is due; zero means the servant is leaving.
    pub next_heartbeat_in: Duration,
    /// Daemon version, checked against `Config::min_daemon_version`.
    pub version: u32,
    /// Processors of the machine; `0` (old daemons) is replaced by `capacity` in the engine.
    pub num_processors: u32,
    /// Load average, including the tasks this scheduler granted there.
    pub current_load: u32,
    /// Dedicated or user machine.
    pub priority: ServantPriority,
    /// What the servant reported (`None` for code 0).
    pub not_accepting_reason: Option<NotAcceptingReason>,
    /// Maximum number of concurrent tasks the servant is willing to run.
    pub capacity: u32,
    /// Total memory in bytes; `0` means "not reported" and disables the memory floor.
    pub total_memory: u64,
    /// Available memory in bytes.
    pub memory_available: u64,
    /// Compiler digests the servant can run.
    pub environments: Vec<String>,
    /// Tasks the servant is running right now.
    pub running_tasks: Vec<ReportedTask>,
}

/// What a servant learns from a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatReply {
    /// Serving-daemon tokens the servant must accept: expiring, active, next.
    pub acceptable_tokens: Vec<String>,
    /// Grant ids from the report that the servant should kill.
    pub expired_grant_ids: Vec<u64>,
}

/// A delegate's request for compile slots (`WaitForStartingTask`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantRequest {
    /// User token.
    pub token: Redacted<String>,
    /// Peer IP of the requester, used to keep its tasks off its own machine
    /// and, with the token, to own the grants (rule "grant ownership").
    pub requester_ip: IpAddr,
    /// The daemon connection the call came on (`flare`, `http+pb`), if any:
    /// the requester that takes turns for quota is then that connection,
    /// not the address, so daemons behind one NAT address take turns with
    /// each other (see [`RequesterId`]).
    pub connection: Option<u64>,
    /// How long the first grant may wait for capacity (at most `Limits::max_wait`).
    pub wait: Duration,
    /// How long the caller still waits for an answer (its deadline less a
    /// margin), if it said. Cuts `wait` only after `wait` passed its range
    /// check, so a deadline never makes an out-of-range wait acceptable.
    pub answer_within: Option<Duration>,
    /// Compiler digest the tasks need; must not be empty.
    pub environment: String,
    /// Grants for tasks ready to run now (served first). With `prefetch`,
    /// capped (not refused) at `Limits::max_grants_per_request`.
    pub immediate: u32,
    /// Grants the requester may use soon (marked `prefetch`).
    pub prefetch: u32,
    /// Lease of each grant from the moment it is made (`next_keep_alive_in_ms`).
    pub lease: Duration,
    /// Servants older than this daemon version are not used.
    pub min_version: u32,
}

/// Who takes turns for quota (rule "fair shares per requester") and whose
/// queued calls are capped: a daemon's connection, or for the protocols of
/// scripts and tools (JSON, Connect, gRPC), an address. A daemon holds at
/// most two connections; an office behind one NAT address is many daemons,
/// each its own requester. Ownership of grants stays with the address and
/// token ([`GrantRequest::requester_ip`]), so a daemon renews and frees on
/// either of its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequesterId {
    /// Canonical IP (IPv4-mapped IPv6 is IPv4).
    pub ip: IpAddr,
    /// The daemon connection, or None for a caller known by its address.
    pub connection: Option<u64>,
}

impl RequesterId {
    pub fn of(request: &GrantRequest) -> RequesterId {
        RequesterId {
            ip: request.requester_ip.to_canonical(),
            connection: request.connection,
        }
    }
}

/// One compile slot on one servant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Grant {
    /// Random, never zero; used to renew, free and report the task.
    pub id: u64,
    /// Observed location of the servant to send the task to.
    pub servant: SocketAddr,
    /// True if the grant answers a prefetch request rather than an immediate one.
    pub prefetch: bool,
}

/// A task running somewhere in the cluster, for `GetRunningTasks`: only
/// tasks whose grant is live on a verified servant not behind NAT.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunningTask {
    /// Observed location of the servant running it.
    pub servant: SocketAddr,
    /// The servant's own task id (what a delegate attaches to).
    pub servant_task_id: u64,
    /// Grant the task runs under. For credentialed readers only: the open
    /// `GetRunningTasks` RPC leaves it out (see `service`).
    pub grant_id: u64,
    /// Digest of the compilation.
    pub task_digest: String,
}

/// Every outcome of a call that is not a success; the service layer maps each
/// variant to the seed's `Status`. `Display` is a message for people and never
/// contains a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The token is not in the accepted set for this call (`STATUS_ACCESS_DENIED`).
    #[error("access denied: the token is not accepted for this call")]
    AccessDenied,
    /// A field is out of range; the message names the field and the limit
    /// (`STATUS_INVALID_ARGUMENT`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The daemon must be upgraded (`STATUS_VERSION_TOO_OLD`).
    #[error(
        "daemon version {version} is too old: this scheduler requires version {minimum} or newer"
    )]
    VersionTooOld {
        /// Version the daemon reported.
        version: u32,
        /// `Config::min_daemon_version`.
        minimum: u32,
    },
    /// No live servant offers the environment with capacity and a recent enough
    /// version (`STATUS_ENVIRONMENT_NOT_AVAILABLE`).
    #[error("environment not available: no live servant offers compiler {environment}")]
    EnvironmentNotAvailable {
        /// The requested compiler digest.
        environment: String,
    },
    /// No capacity could be granted in time (`STATUS_NO_QUOTA_AVAILABLE`).
    #[error("no quota available: the compile cluster is busy, try again shortly")]
    NoQuotaAvailable,
}

/// Registration sequence number: identifies a servant and orders ties
/// (earliest registered first). A servant that expires and comes back gets a
/// new one.
pub(crate) type ServantKey = u64;

/// Index of an environment's slot in the environment table (`envs::Envs`).
pub(crate) type EnvId = usize;

/// `now + d`, saturating far in the future instead of overflowing (limits
/// are configurable, so a duration may be huge).
pub(crate) fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400))
}
