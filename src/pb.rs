//! Generated protobuf types (prost), their proto3-JSON mapping (pbjson), the
//! descriptor pool the OpenAPI document and the RPC list are built from, and
//! the names every transport and the simulator share: [`Method`] (with its
//! full name and its paths) and [`Encoding`]. Lints relax on the generated
//! modules only: generated code is not ours to style.

use std::{fmt, sync::LazyLock};

use prost_reflect::{DescriptorPool, MethodDescriptor};

/// Package `yadcc` (`env_desc.proto`).
#[allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]
pub mod compression;

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
#[allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]
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

/// Decoded descriptors, shared by everything that reflects on the API.
pub static DESCRIPTOR_POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(FILE_DESCRIPTOR_SET)
        .expect("descriptor set produced by build.rs must decode")
});

/// The service's full name as a literal, for `concat!` in [`methods!`].
macro_rules! scheduler_service {
    () => {
        "yadcc.scheduler.SchedulerService"
    };
}

/// Full name of the one service this server implements.
pub const SCHEDULER_SERVICE: &str = scheduler_service!();

/// Where every `http+pb` call goes: `/rpc/` and the method's full name.
pub const RPC_PATH_PREFIX: &str = "/rpc/";

/// Declares [`Method`] with every name and path of each RPC spelled once, as
/// `&'static str`: the transports match on them per call.
macro_rules! methods {
    ($($method:ident),+ $(,)?) => {
        /// The RPCs of `yadcc.scheduler.SchedulerService`, in proto order.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Method {
            $($method),+
        }

        impl Method {
            /// Every RPC this server implements; a test pins it against the descriptor set.
            pub const ALL: [Method; [$(stringify!($method)),+].len()] = [$(Method::$method),+];

            /// The method's name as in the proto (`Heartbeat`).
            pub fn name(self) -> &'static str {
                match self {
                    $(Method::$method => stringify!($method)),+
                }
            }

            /// `yadcc.scheduler.SchedulerService.Heartbeat`: the flare
            /// `method_name`, and the last segment of the `http+pb` path.
            pub fn full_name(self) -> &'static str {
                match self {
                    $(Method::$method => concat!(scheduler_service!(), ".", stringify!($method))),+
                }
            }

            /// `/rpc/yadcc.scheduler.SchedulerService.Heartbeat`: the
            /// `http+pb` path the daemons' framework posts to.
            pub fn rpc_path(self) -> &'static str {
                match self {
                    $(Method::$method => concat!("/rpc/", scheduler_service!(), ".", stringify!($method))),+
                }
            }

            /// `/yadcc.scheduler.SchedulerService/Heartbeat`: the Connect,
            /// gRPC and gRPC-Web path.
            pub fn connect_path(self) -> &'static str {
                match self {
                    $(Method::$method => concat!("/", scheduler_service!(), "/", stringify!($method))),+
                }
            }
        }
    };
}

methods!(
    Heartbeat,
    GetConfig,
    WaitForStartingTask,
    KeepTaskAlive,
    FreeTask,
    GetRunningTasks,
);

impl Method {
    /// Looks a method up by its proto name; exact, case-sensitive, as protobuf names are.
    pub fn from_name(name: &str) -> Option<Method> {
        Method::ALL.into_iter().find(|method| method.name() == name)
    }

    /// The method's descriptor: its messages and the proto's comments.
    pub fn descriptor(self) -> MethodDescriptor {
        DESCRIPTOR_POOL
            .get_service_by_name(SCHEDULER_SERVICE)
            .and_then(|service| {
                service
                    .methods()
                    .find(|method| method.name() == self.name())
            })
            .expect("every Method is in the descriptor set (a test pins it)")
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a message is encoded in a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// The protobuf wire format.
    Binary,
    /// The canonical proto3 JSON mapping.
    Json,
}

impl Encoding {
    /// Label used in logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Encoding::Binary => "binary",
            Encoding::Json => "json",
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::{
        DESCRIPTOR_POOL, Method, RPC_PATH_PREFIX, SCHEDULER_SERVICE,
        flare::rpc::{MethodType, RpcMeta, RpcResponseMeta},
    };

    /// A new RPC in the proto needs a variant here (then a dispatch arm and
    /// a service method); the order is the proto's.
    #[test]
    fn the_methods_are_the_services_in_proto_order() {
        let service = DESCRIPTOR_POOL
            .get_service_by_name(SCHEDULER_SERVICE)
            .unwrap();
        let in_proto: Vec<String> = service.methods().map(|m| m.name().to_owned()).collect();
        let ours: Vec<&str> = Method::ALL.iter().map(|m| m.name()).collect();
        assert_eq!(in_proto, ours);
        for method in Method::ALL {
            assert_eq!(method.descriptor().name(), method.name());
        }
    }

    #[test]
    fn names_and_paths_spell_the_service_and_the_method() {
        for method in Method::ALL {
            let name = method.name();
            assert_eq!(Method::from_name(name), Some(method));
            assert_eq!(method.full_name(), format!("{SCHEDULER_SERVICE}.{name}"));
            assert_eq!(
                method.rpc_path(),
                format!("{RPC_PATH_PREFIX}{}", method.full_name())
            );
            assert_eq!(
                method.connect_path(),
                format!("/{SCHEDULER_SERVICE}/{name}")
            );
        }
        assert_eq!(
            Method::KeepTaskAlive.rpc_path(),
            "/rpc/yadcc.scheduler.SchedulerService.KeepTaskAlive"
        );
        assert_eq!(Method::from_name("heartbeat"), None);
        assert_eq!(Method::from_name("NotifyTaskStart"), None);
    }

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
