"""A stock gRPC client (grpcio, stubs generated from proto/ by grpcio-tools)
calling every RPC of the scheduler and checking the status codes of the error
table. Run by tests/it/grpc.rs against a real server it started with
min_daemon_version=5, a 4096-byte body limit and no servants.

Usage: client.py HOST:PORT PROTO_ROOT [CA_FILE]  (with CA_FILE: over TLS)
Exits non-zero, naming the failed check, if anything differs.
"""

import importlib
import os
import sys
import tempfile
import time

import grpc
from grpc_tools import protoc

USER_TOKEN = "user-token"
SERVANT_TOKEN = "servant-token"
DIGEST = "c0ffee"


def generate_stubs(proto_root):
    out = tempfile.mkdtemp(prefix="yadcc-grpc-stubs-")
    files = ["yadcc/api/env_desc.proto", "yadcc/api/scheduler.proto"]
    args = ["protoc", f"-I{proto_root}", f"--python_out={out}", f"--grpc_python_out={out}"]
    if protoc.main(args + files) != 0:
        sys.exit("grpc_tools.protoc failed")
    sys.path.insert(0, out)
    env = importlib.import_module("yadcc.api.env_desc_pb2")
    pb = importlib.import_module("yadcc.api.scheduler_pb2")
    stubs = importlib.import_module("yadcc.api.scheduler_pb2_grpc")
    return env, pb, stubs


def expect_code(name, code, call):
    try:
        call()
    except grpc.RpcError as error:
        if error.code() != code:
            sys.exit(f"FAIL {name}: expected {code}, got {error.code()} ({error.details()})")
        if not error.details():
            sys.exit(f"FAIL {name}: {code} without a message")
        print(f"ok   {name}: {code.name}")
        return error
    sys.exit(f"FAIL {name}: expected {code}, the call succeeded")


def main():
    target, proto_root = sys.argv[1], sys.argv[2]
    # A third argument: the CA (PEM) of a server reached over TLS.
    ca_file = sys.argv[3] if len(sys.argv) > 3 else None
    env, pb, stubs = generate_stubs(proto_root)
    if ca_file:
        with open(ca_file, "rb") as ca:
            credentials = grpc.ssl_channel_credentials(root_certificates=ca.read())
        channel = grpc.secure_channel(target, credentials)
    else:
        channel = grpc.insecure_channel(target)
    grpc.channel_ready_future(channel).result(timeout=10)
    scheduler = stubs.SchedulerServiceStub(channel)
    Code = grpc.StatusCode

    def heartbeat(**overrides):
        fields = dict(
            token=SERVANT_TOKEN,
            next_heartbeat_in_ms=10000,
            version=5,
            location="127.0.0.1:8335",
            num_processors=16,
            capacity=1,
            env_descs=[env.EnvironmentDesc(compiler_digest=DIGEST)],
        )
        fields.update(overrides)
        return pb.HeartbeatRequest(**fields)

    def wait(**overrides):
        fields = dict(
            token=USER_TOKEN,
            milliseconds_to_wait=1000,
            env_desc=env.EnvironmentDesc(compiler_digest=DIGEST),
            immediate_reqs=1,
            next_keep_alive_in_ms=15000,
        )
        fields.update(overrides)
        return pb.WaitForStartingTaskRequest(**fields)

    # The six RPCs, succeeding.
    beat = scheduler.Heartbeat(heartbeat(), timeout=10)
    assert SERVANT_TOKEN not in beat.acceptable_tokens
    assert len(beat.acceptable_tokens) > 0, beat
    print("ok   Heartbeat")
    config = scheduler.GetConfig(pb.GetConfigRequest(token=USER_TOKEN), timeout=10)
    assert config.serving_daemon_token, config
    print("ok   GetConfig")
    granted = scheduler.WaitForStartingTask(wait(), timeout=10)
    assert len(granted.grants) == 1, granted
    assert granted.grants[0].servant_location == "127.0.0.1:8335", granted
    grant_id = granted.grants[0].task_grant_id
    print("ok   WaitForStartingTask")
    alive = scheduler.KeepTaskAlive(
        pb.KeepTaskAliveRequest(
            token=USER_TOKEN, task_grant_ids=[grant_id, 12345], next_keep_alive_in_ms=10000
        ),
        timeout=10,
    )
    assert list(alive.statuses) == [True, False], alive
    print("ok   KeepTaskAlive")
    running = scheduler.GetRunningTasks(pb.GetRunningTasksRequest(), timeout=10)
    assert isinstance(running, pb.GetRunningTasksResponse)
    print("ok   GetRunningTasks")

    # The error table, in gRPC codes. The one slot is taken now.
    expect_code(
        "no quota",
        Code.RESOURCE_EXHAUSTED,
        lambda: scheduler.WaitForStartingTask(wait(milliseconds_to_wait=0), timeout=10),
    )
    expect_code(
        "access denied",
        Code.PERMISSION_DENIED,
        lambda: scheduler.GetConfig(pb.GetConfigRequest(token="wrong"), timeout=10),
    )
    expect_code(
        "invalid argument",
        Code.INVALID_ARGUMENT,
        lambda: scheduler.Heartbeat(heartbeat(location="nowhere"), timeout=10),
    )
    expect_code(
        "version too old",
        Code.FAILED_PRECONDITION,
        lambda: scheduler.Heartbeat(heartbeat(version=4), timeout=10),
    )
    expect_code(
        "environment not available",
        Code.NOT_FOUND,
        lambda: scheduler.WaitForStartingTask(
            wait(env_desc=env.EnvironmentDesc(compiler_digest="nobody-has-this")), timeout=10
        ),
    )
    expect_code(
        "message over the body limit",
        Code.RESOURCE_EXHAUSTED,
        lambda: scheduler.GetConfig(pb.GetConfigRequest(token="x" * 5000), timeout=10),
    )
    garbage = channel.unary_unary(
        "/yadcc.scheduler.SchedulerService/GetConfig",
        request_serializer=lambda raw: raw,
        response_deserializer=lambda raw: raw,
    )
    expect_code(
        "undecodable message", Code.INVALID_ARGUMENT, lambda: garbage(b"\x0a\x05a", timeout=10)
    )
    for name, path in [
        ("unknown method", "/yadcc.scheduler.SchedulerService/NoSuchMethod"),
        ("unknown service", "/yadcc.scheduler.OtherService/GetConfig"),
    ]:
        call = channel.unary_unary(
            path, request_serializer=lambda raw: raw, response_deserializer=lambda raw: raw
        )
        expect_code(name, Code.UNIMPLEMENTED, lambda: call(b"", timeout=10))
    started = time.monotonic()
    expect_code(
        "deadline",
        Code.DEADLINE_EXCEEDED,
        lambda: scheduler.WaitForStartingTask(wait(milliseconds_to_wait=5000), timeout=0.2),
    )
    elapsed = time.monotonic() - started
    if not 0.15 <= elapsed < 2.0:
        sys.exit(f"FAIL deadline: took {elapsed:.3f} s, expected about 0.2 s")

    # Returning the grant frees the slot for the next caller.
    scheduler.FreeTask(pb.FreeTaskRequest(token=USER_TOKEN, task_grant_ids=[grant_id]), timeout=10)
    print("ok   FreeTask")
    again = scheduler.WaitForStartingTask(wait(), timeout=10)
    assert len(again.grants) == 1, again
    print("ok   the freed slot is granted again")
    channel.close()
    print("all gRPC checks passed")


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    main()
