//! Generated protobuf types (prost), their proto3-JSON mapping (pbjson), the
//! descriptor pool the OpenAPI document and the RPC list are built from, and
//! the names every transport and the simulator share: [`Service`] and
//! [`Method`] (with their full names and paths) and [`Encoding`]. Lints relax on the generated
//! modules only: generated code is not ours to style.

use std::{fmt, sync::LazyLock};

use prost_reflect::{DescriptorPool, MethodDescriptor, ServiceDescriptor};

/// Package `yadcc` (`env_desc.proto`).
#[allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]
pub mod compression;
mod redacted_debug;

pub mod yadcc {
    include!(concat!(env!("OUT_DIR"), "/yadcc.rs"));
    include!(concat!(env!("OUT_DIR"), "/yadcc.serde.rs"));

    /// Package `yadcc.scheduler` (`scheduler.proto`, `admin.proto`).
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

/// Declares [`Service`] and [`Method`] from one table: each service's full
/// name and its RPCs in proto order, every name and path spelled once, as
/// `&'static str` (the transports match on them per call). A service more
/// is one more entry, not another copy of the plumbing.
macro_rules! services {
    ($($service:ident = $full_name:literal { $($method:ident),+ $(,)? })+) => {
        /// The services this server implements, in the order documented.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Service {
            $($service),+
        }

        /// The RPCs of every [`Service`], service by service, each in proto order.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Method {
            $($($method),+),+
        }

        impl Service {
            /// Every service; a test pins each against the descriptor set.
            pub const ALL: [Service; [$(stringify!($service)),+].len()] = [$(Service::$service),+];

            /// `yadcc.scheduler.SchedulerService`.
            pub const fn full_name(self) -> &'static str {
                match self {
                    $(Service::$service => $full_name),+
                }
            }

            /// Its RPCs, in proto order.
            pub const fn methods(self) -> &'static [Method] {
                match self {
                    $(Service::$service => &[$(Method::$method),+]),+
                }
            }
        }

        impl Method {
            /// Every RPC this server implements.
            pub const ALL: [Method; [$($(stringify!($method)),+),+].len()] =
                [$($(Method::$method),+),+];

            /// The method's name as in the proto (`Heartbeat`).
            pub const fn name(self) -> &'static str {
                match self {
                    $($(Method::$method => stringify!($method)),+),+
                }
            }

            /// The service it belongs to.
            pub const fn service(self) -> Service {
                match self {
                    $($(Method::$method => Service::$service),+),+
                }
            }

            /// `yadcc.scheduler.SchedulerService.Heartbeat`: the flare
            /// `method_name`, and the last segment of the `http+pb` path.
            pub const fn full_name(self) -> &'static str {
                match self {
                    $($(Method::$method => concat!($full_name, ".", stringify!($method))),+),+
                }
            }

            /// `/rpc/yadcc.scheduler.SchedulerService.Heartbeat`: the
            /// `http+pb` path the daemons' framework posts to.
            pub const fn rpc_path(self) -> &'static str {
                match self {
                    $($(Method::$method => concat!("/rpc/", $full_name, ".", stringify!($method))),+),+
                }
            }

            /// `/yadcc.scheduler.SchedulerService/Heartbeat`: the Connect,
            /// gRPC and gRPC-Web path.
            pub const fn connect_path(self) -> &'static str {
                match self {
                    $($(Method::$method => concat!("/", $full_name, "/", stringify!($method))),+),+
                }
            }
        }
    };
}

services! {
    Scheduler = "yadcc.scheduler.SchedulerService" {
        Heartbeat,
        GetConfig,
        WaitForStartingTask,
        KeepTaskAlive,
        FreeTask,
        GetRunningTasks,
    }
    Admin = "yadcc.scheduler.AdminService" {
        CordonServant,
        UncordonServant,
        DrainServant,
        ListServantStates,
        ListAuditEvents,
    }
}

/// Full name of the service the yadcc daemons call.
pub const SCHEDULER_SERVICE: &str = Service::Scheduler.full_name();

/// Full name of the operators' service (`admin.proto`).
pub const ADMIN_SERVICE: &str = Service::Admin.full_name();

/// Where every `http+pb` call goes: `/rpc/` and the method's full name.
pub const RPC_PATH_PREFIX: &str = "/rpc/";

impl Service {
    /// Looks a service up by its full name; exact, as protobuf names are.
    pub fn from_full_name(full_name: &str) -> Option<Service> {
        Service::ALL
            .into_iter()
            .find(|service| service.full_name() == full_name)
    }

    /// Looks one of its RPCs up by its proto name; exact, case-sensitive.
    pub fn method(self, name: &str) -> Option<Method> {
        self.methods()
            .iter()
            .copied()
            .find(|method| method.name() == name)
    }

    /// The service's descriptor: its RPCs and the proto's comments.
    pub fn descriptor(self) -> ServiceDescriptor {
        DESCRIPTOR_POOL
            .get_service_by_name(self.full_name())
            .expect("every Service is in the descriptor set (a test pins it)")
    }
}

impl Method {
    /// Looks a method of the scheduler's service up by its proto name; exact,
    /// case-sensitive, as protobuf names are.
    pub fn from_name(name: &str) -> Option<Method> {
        Service::Scheduler.method(name)
    }

    /// Looks any method up by its full name (`yadcc.scheduler.AdminService.DrainServant`).
    pub fn from_full_name(full_name: &str) -> Option<Method> {
        let (service, method) = full_name.rsplit_once('.')?;
        Service::from_full_name(service)?.method(method)
    }

    /// The method's descriptor: its messages and the proto's comments.
    pub fn descriptor(self) -> MethodDescriptor {
        self.service()
            .descriptor()
            .methods()
            .find(|method| method.name() == self.name())
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

/// A JSON answer's bytes: the value, then a newline, as every JSON body the
/// server sends ends (an answer printed by curl leaves the shell prompt on a
/// line of its own; JSON parsers skip the whitespace).
pub fn json_answer<T: serde::Serialize + ?Sized>(value: &T) -> serde_json::Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec(value)?;
    bytes.push(b'\n');
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::{
        DESCRIPTOR_POOL, Method, RPC_PATH_PREFIX, SCHEDULER_SERVICE, Service,
        flare::rpc::{MethodType, RpcMeta, RpcResponseMeta},
    };

    /// A new RPC in the proto needs a variant here (then a dispatch arm and
    /// a service method); the order is the proto's, service by service.
    #[test]
    fn the_methods_are_the_services_in_proto_order() {
        let mut all = Vec::new();
        for service in Service::ALL {
            let in_proto: Vec<String> = DESCRIPTOR_POOL
                .get_service_by_name(service.full_name())
                .unwrap()
                .methods()
                .map(|m| m.name().to_owned())
                .collect();
            let ours: Vec<&str> = service.methods().iter().map(|m| m.name()).collect();
            assert_eq!(in_proto, ours, "{service:?}");
            for method in service.methods() {
                assert_eq!(method.service(), service);
                assert_eq!(method.descriptor().name(), method.name());
            }
            all.extend_from_slice(service.methods());
        }
        assert_eq!(all, Method::ALL);
        // The descriptor set holds no service this server does not serve.
        let served: Vec<&str> = Service::ALL.iter().map(|s| s.full_name()).collect();
        for service in DESCRIPTOR_POOL.services() {
            assert!(
                served.contains(&service.full_name()),
                "{}",
                service.full_name()
            );
        }
    }

    #[test]
    fn names_and_paths_spell_the_service_and_the_method() {
        for method in Method::ALL {
            let name = method.name();
            let service = method.service().full_name();
            assert_eq!(method.service().method(name), Some(method));
            assert_eq!(Method::from_full_name(method.full_name()), Some(method));
            assert_eq!(method.full_name(), format!("{service}.{name}"));
            assert_eq!(
                method.rpc_path(),
                format!("{RPC_PATH_PREFIX}{}", method.full_name())
            );
            assert_eq!(method.connect_path(), format!("/{service}/{name}"));
        }
        assert_eq!(
            Method::KeepTaskAlive.rpc_path(),
            "/rpc/yadcc.scheduler.SchedulerService.KeepTaskAlive"
        );
        assert_eq!(
            Method::DrainServant.connect_path(),
            "/yadcc.scheduler.AdminService/DrainServant"
        );
        assert_eq!(SCHEDULER_SERVICE, "yadcc.scheduler.SchedulerService");
        assert_eq!(Method::from_name("heartbeat"), None);
        assert_eq!(Method::from_name("NotifyTaskStart"), None);
        // `from_name` names the daemons' service only.
        assert_eq!(Method::from_name("CordonServant"), None);
        assert_eq!(
            Method::from_full_name("yadcc.scheduler.SchedulerService.CordonServant"),
            None
        );
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
