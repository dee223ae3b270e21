"""An independent client of plimsolld's standard gRPC doors, with gRPC's own Python packages
(grpcio, grpcio-health-checking, grpcio-reflection). Driven by grpc_doors.rs.

usage: grpc_doors.py HOST:PORT [--ca CA.pem --server-name NAME]

It sends no token anywhere and prints one JSON object:
  health         {service: status name} from Health.Check, grpc_health_probe style, for ""
                 and plimsoll.v1.SandboxService (or the gRPC code name when the call failed)
  reflection     v1alpha through grpcio-reflection's descriptor database: the listed services
                 and SandboxService's methods, or the gRPC code name when it failed
  reflection_v1  the services listed through grpc.reflection.v1, or the gRPC code name
  describe       the gRPC code name of SandboxService/Describe sent without a token
"""

import json
import sys

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc


def channel(addr, ca, server_name):
    if ca is None:
        return grpc.insecure_channel(addr)
    with open(ca, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    return grpc.secure_channel(addr, creds, options=options)


def health(ch):
    stub = health_pb2_grpc.HealthStub(ch)
    out = {}
    for service in ["", "plimsoll.v1.SandboxService"]:
        try:
            r = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            out[service] = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
        except grpc.RpcError as e:
            out[service] = e.code().name
    return out


def reflection_v1alpha(ch):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    db = ProtoReflectionDescriptorDatabase(ch)
    try:
        services = sorted(db.get_services())
        pool = descriptor_pool.DescriptorPool(db)
        svc = pool.FindServiceByName("plimsoll.v1.SandboxService")
    except grpc.RpcError as e:
        return e.code().name
    return {"services": services, "methods": sorted(m.name for m in svc.methods)}


def reflection_v1(ch):
    # grpcio-reflection ships v1alpha stubs only (as of 1.85); v1's messages are the same on
    # the wire (same fields, same numbers), so v1alpha's classes are sent on v1's method.
    from grpc_reflection.v1alpha import reflection_pb2

    call = ch.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    req = reflection_pb2.ServerReflectionRequest(list_services="")
    try:
        for answer in call(iter([req]), timeout=10):
            return sorted(s.name for s in answer.list_services_response.service)
    except grpc.RpcError as e:
        return e.code().name
    return "NO_ANSWER"


def describe_without_token(ch):
    call = ch.unary_unary("/plimsoll.v1.SandboxService/Describe")
    try:
        call(b"", timeout=10)
    except grpc.RpcError as e:
        return e.code().name
    return "OK"


def main(argv):
    addr, ca, server_name = argv[1], None, None
    rest = argv[2:]
    while rest:
        flag, value, rest = rest[0], rest[1], rest[2:]
        if flag == "--ca":
            ca = value
        elif flag == "--server-name":
            server_name = value
        else:
            raise SystemExit(f"unknown flag {flag}")
    with channel(addr, ca, server_name) as ch:
        grpc.channel_ready_future(ch).result(timeout=10)
        out = {
            "health": health(ch),
            "reflection": reflection_v1alpha(ch),
            "reflection_v1": reflection_v1(ch),
            "describe": describe_without_token(ch),
        }
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv)
