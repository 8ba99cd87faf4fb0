//! Integration tests: the real server on real sockets, one test binary.

mod dialects;
mod errors;
mod long_poll;
mod operations;
mod support;
mod wire;
