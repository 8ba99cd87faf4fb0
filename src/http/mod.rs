//! The HTTP side: routes, wire dialects (http+pb, Connect, gRPC, gRPC-Web),
//! reflection, codecs and the one error table.

pub mod access_log;
pub mod codec;
pub mod dialect;
pub mod error;
pub mod grpc;
pub mod json;
pub mod operations;
pub mod reflection;
pub mod routes;
pub mod state;
