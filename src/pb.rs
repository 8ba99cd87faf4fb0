//! Generated protobuf types (prost), their proto3-JSON mapping (pbjson) and the
//! descriptor pool the OpenAPI document and the RPC list are built from. The
//! only place where lints relax: generated code is not ours to style.

#![allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]

use std::sync::LazyLock;

use prost_reflect::DescriptorPool;

/// Package `yadcc` (`env_desc.proto`).
pub mod yadcc {
    include!(concat!(env!("OUT_DIR"), "/yadcc.rs"));
    include!(concat!(env!("OUT_DIR"), "/yadcc.serde.rs"));

    /// Package `yadcc.scheduler` (`scheduler.proto`).
    pub mod scheduler {
        include!(concat!(env!("OUT_DIR"), "/yadcc.scheduler.rs"));
        include!(concat!(env!("OUT_DIR"), "/yadcc.scheduler.serde.rs"));
    }
}

pub use yadcc::EnvironmentDesc;
pub use yadcc::scheduler::*;

/// Encoded `FileDescriptorSet` of every proto file, comments included.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/descriptor_set.bin"));

/// Full name of the one service this server implements.
pub const SCHEDULER_SERVICE: &str = "yadcc.scheduler.SchedulerService";

/// Decoded descriptors, shared by everything that reflects on the API.
pub static DESCRIPTOR_POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(FILE_DESCRIPTOR_SET)
        .expect("descriptor set produced by build.rs must decode")
});
