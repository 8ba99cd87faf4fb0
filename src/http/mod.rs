//! The HTTP side: the routes, the seam every RPC protocol over HTTP plugs
//! into (`handler`), the protocols (`dialect`: http+pb and Connect; `grpc`:
//! gRPC and gRPC-Web), reflection, health and metrics, the access log.

pub mod access_log;
pub mod dialect;
pub mod grpc;
pub mod handler;
pub mod operations;
pub mod reflection;
pub mod routes;
