//! The HTTP side: routes, wire dialects, codecs and the one error table.

pub mod codec;
pub mod dialect;
pub mod error;
pub mod routes;
