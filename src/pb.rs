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

/// Package `flare.rpc`: the frame metadata of the daemons' binary protocol
/// (`rpc_meta.proto`, proto2: `required` fields are always encoded).
pub mod flare {
    pub mod rpc {
        include!(concat!(env!("OUT_DIR"), "/flare.rpc.rs"));
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

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::flare::rpc::{MethodType, RpcMeta, RpcResponseMeta};

    /// The daemons' decoder closes the connection when a proto2 `required`
    /// field is missing, so a zero status must still be on the wire
    /// (`32 02 08 00`, the smallest success of `flare-wire.md`).
    #[test]
    fn required_meta_fields_are_encoded_even_when_zero() {
        let meta = RpcMeta {
            correlation_id: 1,
            method_type: MethodType::Single as i32,
            response_meta: Some(RpcResponseMeta {
                status: 0,
                ..RpcResponseMeta::default()
            }),
            ..RpcMeta::default()
        };
        assert_eq!(
            meta.encode_to_vec(),
            [0x08, 0x01, 0x32, 0x02, 0x08, 0x00, 0x38, 0x01]
        );
    }
}
