//! Compiles the scheduler's protos (`../../proto`) without a system `protoc`:
//! protox parses the files (keeping comments as source info), prost generates
//! the message types, pbjson the proto3-JSON mapping, and the raw descriptor
//! set is kept for prost-reflect (the OpenAPI document and the list of RPCs).

use std::{env, fs, path::PathBuf};

use prost::Message;

const PROTO_ROOT: &str = "../../proto";
const PROTO_FILES: &[&str] = &[
    "yadcc/api/env_desc.proto",
    "yadcc/api/scheduler.proto",
    "yadcc/api/admin.proto",
];
/// The daemons' framework framing (binary `flare://` protocol). Kept out of the
/// exported descriptor set: it is transport, not API, so neither the OpenAPI
/// document nor reflection lists it, and it has no JSON mapping.
const FRAMEWORK_PROTO_FILES: &[&str] = &["flare/rpc/rpc_meta.proto"];

/// Messages with a token or a serving-daemon token in them.
const SECRET_MESSAGES: [&str; 7] = [
    ".yadcc.scheduler.HeartbeatRequest",
    ".yadcc.scheduler.HeartbeatResponse",
    ".yadcc.scheduler.GetConfigRequest",
    ".yadcc.scheduler.GetConfigResponse",
    ".yadcc.scheduler.WaitForStartingTaskRequest",
    ".yadcc.scheduler.KeepTaskAliveRequest",
    ".yadcc.scheduler.FreeTaskRequest",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    let descriptors = protox::Compiler::new([PROTO_ROOT])?
        .include_source_info(true)
        .include_imports(true)
        .open_files(PROTO_FILES)?
        .file_descriptor_set();
    let descriptor_bytes = descriptors.encode_to_vec();
    fs::write(out_dir.join("descriptor_set.bin"), &descriptor_bytes)?;

    prost_build::Config::new()
        .out_dir(&out_dir)
        // Messages that carry a token get a redacting `Debug` in
        // `src/redacted_debug.rs`.
        .skip_debug(SECRET_MESSAGES)
        // `prost::Name` lets the JSON codec find each message's descriptor.
        .enable_type_names()
        .compile_fds(descriptors)?;

    pbjson_build::Builder::new()
        .out_dir(&out_dir)
        .register_descriptors(&descriptor_bytes)?
        // Clients built against newer protos must keep working.
        .ignore_unknown_fields()
        .build(&[".yadcc"])?;

    let framework = protox::Compiler::new([PROTO_ROOT])?
        .open_files(FRAMEWORK_PROTO_FILES)?
        .file_descriptor_set();
    prost_build::Config::new()
        .out_dir(&out_dir)
        .compile_fds(framework)?;

    Ok(())
}
