//! The scheduler's rules for text that arrives from the network, shared by
//! every layer without pulling in a wire crate: the grammars of the strings
//! daemons send ([`grammar`]), bounded echoes of bad input in error messages
//! ([`echo`]), and [`Redacted`], the wrapper that keeps secrets out of logs.

pub mod echo;
pub mod grammar;
mod redacted;

pub use redacted::Redacted;
