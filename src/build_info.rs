//! What this binary is: its version and the commit it was built from
//! (embedded by `build.rs`; `unknown` when built outside git without
//! `YADCC_BUILD_COMMIT`). `--version` prints them and `/metrics` serves them
//! as `yadcc_scheduler_build_info`.

/// The crate's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The short hash of the commit built, or `unknown`.
pub const COMMIT: &str = env!("YADCC_BUILD_COMMIT");

/// What `--version` prints after the program's name.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("YADCC_BUILD_COMMIT"),
    ")"
);
