//! The HTTP side: routes, wire dialects (http+pb, Connect, gRPC, gRPC-Web),
//! reflection, codecs and the one error table.

pub mod access_log;
pub mod dialect;
pub mod grpc;
pub mod handler;
pub mod operations;
pub mod reflection;
pub mod routes;
