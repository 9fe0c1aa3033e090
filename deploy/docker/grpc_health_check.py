"""Container health check: exit 0 only if the node's gRPC health service answers SERVING.

Used by the Dockerfile's HEALTHCHECK (Kubernetes probes gRPC health natively instead).  A draining
node answers NOT_SERVING, so it is reported unhealthy as soon as SIGTERM arrives.
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main(argv: list[str]) -> int:
    address = argv[1] if len(argv) > 1 else "localhost:19530"
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=3.0)
    except grpc.RpcError as exc:
        print(f"unhealthy: {address}: {exc.code().name}", file=sys.stderr)
        return 1
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        print(f"unhealthy: {address}: {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
