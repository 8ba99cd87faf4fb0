//! The client side of the wire protocols a stock yadcc daemon speaks to its
//! scheduler (`flare-wire.md`), plus plain-HTTP JSON as scripts send it.
//! Depends on the generated protobuf types only, never on the server's
//! modules, so the simulator checks the server from the outside.
//!
//! - [`flare`]: `flare://` frames, answers matched by correlation id.
//! - [`http`]: the daemons' `http+pb` (answers matched by `Rpc-SeqNo`) and
//!   JSON as curl or a script sends it.
//!
//! Each has the encoder a daemon uses, and two decoders of one parser: the
//! [`StreamAnswer`] a daemon acts on, and the whole answer ([`FlareResponse`],
//! [`HttpResponse`]) the integration tests inspect. The tests also use these
//! encoders, so the server is checked with one client.

pub mod compression;
pub mod flare;
pub mod http;

use std::{fmt, str::FromStr, time::Duration};

use bytes::Bytes;

pub use self::{compression::Compression, flare::*, http::*};
use yadcc_pb::Method;

/// The stock daemon's client timeout for a call of `rpc`; it is also sent as
/// the call's deadline (`timeout` in the request meta, `Rpc-Timeout`).
pub fn client_timeout(rpc: Method) -> Duration {
    Duration::from_secs(match rpc {
        Method::Heartbeat | Method::GetRunningTasks | Method::GetConfig => 2,
        Method::KeepTaskAlive | Method::FreeTask => 5,
        // The server may hold it `milliseconds_to_wait` (5 s).
        Method::WaitForStartingTask => 10,
        // No daemon calls the operators' service; a script's patience.
        Method::CordonServant
        | Method::UncordonServant
        | Method::DrainServant
        | Method::ListServantStates
        | Method::ListAuditEvents => 5,
    })
}

/// How a simulated machine talks to the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Wire {
    /// The daemons' default (`--scheduler_uri=flare://HOST:8336`).
    #[default]
    Flare,
    /// `--scheduler_uri=http+pb://HOST:8336`.
    HttpPb,
    /// Proto3 JSON over plain HTTP/1.1, one call at a time per connection.
    Json,
}

impl Wire {
    pub const ALL: [Wire; 3] = [Wire::Flare, Wire::HttpPb, Wire::Json];

    pub fn label(self) -> &'static str {
        match self {
            Wire::Flare => "flare",
            Wire::HttpPb => "http+pb",
            Wire::Json => "json",
        }
    }

    /// True if answers are matched by id, so many calls share a connection.
    pub fn multiplexed(self) -> bool {
        !matches!(self, Wire::Json)
    }
}

impl fmt::Display for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl FromStr for Wire {
    type Err = String;

    fn from_str(text: &str) -> Result<Wire, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "flare" => Ok(Wire::Flare),
            "http+pb" | "httppb" | "http-pb" => Ok(Wire::HttpPb),
            "json" => Ok(Wire::Json),
            other => Err(format!(
                "unknown protocol {other:?}; use flare, http+pb or json"
            )),
        }
    }
}

/// Why bytes from the server are not a usable answer. Each closes the
/// connection: the stream can no longer be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamError {
    /// A flare frame not starting with `CPRF`.
    BadMagic([u8; 4]),
    /// An answer over the daemons' 512 MiB limit.
    TooLarge(usize),
    /// The meta did not decode, or lacks what an answer must carry.
    BadMeta(String),
    /// Not an HTTP/1.1 answer this client can use.
    BadHttp(String),
    /// A compressed message that does not inflate.
    BadPayload(String),
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamError::BadMagic(magic) => write!(f, "bad frame magic {magic:02x?}"),
            StreamError::TooLarge(size) => write!(
                f,
                "frame of {size} bytes over the {FLARE_MAX_FRAME_BYTES}-byte limit"
            ),
            StreamError::BadMeta(why) => write!(f, "bad RpcMeta: {why}"),
            StreamError::BadHttp(why) => write!(f, "bad HTTP answer: {why}"),
            StreamError::BadPayload(why) => write!(f, "compressed message: {why}"),
        }
    }
}

impl std::error::Error for StreamError {}

/// What an answer says, in either protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Success: the encoded response message.
    Ok(Bytes),
    /// A non-zero framework or yadcc status (`RpcResponseMeta.status`,
    /// `Rpc-Error-Code`), with its description if any.
    Failed { code: i32, description: String },
    /// An HTTP error status without `Rpc-Error-Code` (a daemon closes the
    /// connection on it).
    Http { status: u16 },
}

/// One answer taken off the stream: the id it answers (correlation id,
/// `Rpc-SeqNo`; `None` if the HTTP answer carried none) and its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamAnswer {
    pub id: Option<u64>,
    pub outcome: Outcome,
    /// The server asked to close the connection after this answer.
    pub close: bool,
}

#[cfg(test)]
mod tests;
