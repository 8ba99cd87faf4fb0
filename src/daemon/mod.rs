//! The daemons' connections.

pub mod conn;
pub mod flare;
pub mod http_pb;
