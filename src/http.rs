//! The HTTP side, mounted by [`crate::router`]: the seam every RPC protocol
//! over HTTP plugs into (`handler`), its dialects (`dialect`: http+pb and
//! Connect; `grpc`: gRPC and gRPC-Web), reflection and health (with Connect in front of
//! them: `connect_bridge`), metrics, the access log, and the refusal of
//! rebound names (`rebinding`).

pub mod access_log;
pub mod connect_bridge;
pub mod connection;
pub mod cors;
pub mod dialect;
pub mod grpc;
pub mod handler;
pub mod health;
pub mod operations;
pub mod rebinding;
pub mod reflection;
