"""The standard gRPC health client (grpcio-health-checking's stubs) against
the server. Run by tests/it/health.rs against a real server, which it shuts
down when this prints "watching SERVING".

Usage: health.py HOST:PORT
Exits non-zero, naming the failed check, if anything differs.
"""

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SCHEDULER = "yadcc.scheduler.SchedulerService"
Status = health_pb2.HealthCheckResponse


def request(service):
    return health_pb2.HealthCheckRequest(service=service)


def expect_status(name, answer, status):
    if answer.status != status:
        sys.exit(f"FAIL {name}: expected {Status.ServingStatus.Name(status)}, "
                 f"got {Status.ServingStatus.Name(answer.status)}")
    print(f"ok   {name}: {Status.ServingStatus.Name(status)}", flush=True)


def main():
    channel = grpc.insecure_channel(sys.argv[1])
    grpc.channel_ready_future(channel).result(timeout=10)
    health = health_pb2_grpc.HealthStub(channel)

    for service in ("", SCHEDULER):
        expect_status(f"Check {service!r}", health.Check(request(service), timeout=10),
                      Status.SERVING)
    try:
        health.Check(request("no.such.Service"), timeout=10)
        sys.exit("FAIL Check of an unknown service: it succeeded")
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.NOT_FOUND:
            sys.exit(f"FAIL Check of an unknown service: {error.code()}")
        print("ok   Check of an unknown service: NOT_FOUND", flush=True)

    unknown = health.Watch(request("no.such.Service"), timeout=10)
    expect_status("Watch of an unknown service", next(unknown), Status.SERVICE_UNKNOWN)
    unknown.cancel()

    watch = health.Watch(request(SCHEDULER), timeout=30)
    expect_status("Watch", next(watch), Status.SERVING)
    print("watching SERVING", flush=True)
    # The test shuts the server down now.
    expect_status("Watch during the shutdown", next(watch), Status.NOT_SERVING)
    for answer in watch:
        sys.exit(f"FAIL Watch after NOT_SERVING: {answer}")
    print("all health checks passed", flush=True)


if __name__ == "__main__":
    main()
