//! The daemons' connections.

pub mod conn;
pub mod http_pb;
