"""proto/ is a complete contract: the google.rpc files it ships compile with it and define the very
messages the node sends (no server needed)."""

from __future__ import annotations

import tempfile
from importlib import resources
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from google.rpc import error_details_pb2, status_pb2

PROTO = Path(__file__).resolve().parents[2] / "proto"


def _compiled(*sources: str) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    from grpc_tools import protoc  # noqa: PLC0415 - heavy, only here

    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "set.pb"
        status = protoc.main(["grpc_tools.protoc", f"--proto_path={PROTO}",
                              f"--proto_path={resources.files('grpc_tools') / '_proto'}",
                              f"--descriptor_set_out={out}", "--include_imports", *sources])
        assert status == 0, f"protoc failed on {sources}"
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    return {f.name: f for f in files}


def _without_json_names(message: descriptor_pb2.DescriptorProto) -> None:
    """protoc fills in json_name; the Python descriptors leave it out."""
    for field in message.field:
        field.ClearField("json_name")
    for nested in message.nested_type:
        _without_json_names(nested)


@pytest.mark.parametrize(("source", "module"), [
    ("google/rpc/status.proto", status_pb2), ("google/rpc/error_details.proto", error_details_pb2)])
def test_the_shipped_google_rpc_files_define_what_python_decodes(source: str, module: object) -> None:
    shipped = _compiled(source)[source]
    used = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(used)  # type: ignore[attr-defined]
    for message in (*shipped.message_type, *used.message_type):
        _without_json_names(message)
    assert (shipped.package, list(shipped.message_type)) == (used.package, list(used.message_type))
    assert {m.name for m in shipped.message_type} & {"Status", "ErrorInfo"}


def test_the_shipped_files_carry_their_licence() -> None:
    licence = (PROTO / "google" / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    for source in (PROTO / "google" / "rpc").glob("*.proto"):
        head = source.read_text()[:600]
        assert "Apache License 2.0" in head and "proto/google/LICENSE" in head, source


def test_the_contract_compiles_from_proto_alone() -> None:
    files = _compiled("streamingnode/v1/streaming.proto", "google/rpc/status.proto", "google/rpc/error_details.proto")
    assert {"streamingnode/v1/streaming.proto", "streamingnode/v1/common.proto", "google/rpc/status.proto",
            "google/rpc/error_details.proto"} <= set(files)
