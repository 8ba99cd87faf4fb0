//! The daemons' connections.

pub mod conn;
