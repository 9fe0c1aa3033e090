"""The name rules (wal.names), the quote of a bad value, the path check, and the bounds on what an
error puts into gRPC metadata."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from flusher.commit import PathOutsideRootError, inside
from streamingnode.node.groups import check_group_name
from streamingnode.wire import codes
from wal import bodies, names
from wal.errors import ChannelNotExistError, InvalidArgumentError, StreamingError

HOSTILE = ["..", ".", "/abs", "a/b", "tr/", "a\\b", "\x00", "a\x00b", "a\nb", "tab\there", "\x1b[2J",
           "a\u2028b", "\u202eevil", "\ud800", "x" * 10_000]
PATH_ONLY = ["café", "a b", "-rf", ".hidden", "名前"]
RULES = [names.PCHANNEL, names.VCHANNEL, names.CONSUMER_GROUP, names.COLLECTION, names.PARTITION]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.kind)
@pytest.mark.parametrize("bad", HOSTILE, ids=repr)
def test_every_rule_refuses_what_could_be_a_path_or_break_a_log_line(rule: names.NameRule, bad: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        rule.check(bad, "the_field")
    err = caught.value
    assert err.fields["field"] == "the_field" and err.fields["kind"] == rule.kind
    assert rule.kind in str(err) and "the_field" in str(err)
    assert len(str(err)) < 450, "the value is quoted shortened"
    assert "\n" not in str(err) and "\x00" not in str(err) and "\x1b" not in str(err)
    assert not rule.is_valid(bad)


@pytest.mark.parametrize("rule", [names.PCHANNEL, names.COLLECTION, names.PARTITION], ids=lambda r: r.kind)
@pytest.mark.parametrize("bad", PATH_ONLY, ids=repr)
def test_names_that_become_directories_are_portable_ascii(rule: names.NameRule, bad: str) -> None:
    with pytest.raises(InvalidArgumentError):
        rule.check(bad)


def test_legitimate_names_pass() -> None:
    for name in ["p", "p1", "pchannel_0", "orders", "by-dev-rootcoord-dml_0", "pc-0", "a.b", "_x", "9", "P" * 128]:
        assert names.PCHANNEL.check(name) == name
    for name in ["v", "", "vc-1", "vchannel-ü", "by-dev-rootcoord-dml_0_449v0", "a b", "名前", "v" * 255]:
        assert names.VCHANNEL.check(name, allow_empty=True) == name
        if name:
            assert check_group_name(name) == name
    for name in ["users", "_default", "c-1", "Books_2"]:
        assert bodies.validate_name("collection", name) == name
        assert bodies.validate_name("partition", name) == name
    assert names.PARTITION.is_valid("p" * 245) and not names.PARTITION.is_valid("p" * 246)
    assert not names.PCHANNEL.is_valid("P" * 129)
    assert not names.VCHANNEL.is_valid("é" * 128), "255 is a bound in UTF-8 bytes"


def test_empty_is_refused_unless_allowed() -> None:
    for rule in RULES:
        with pytest.raises(InvalidArgumentError, match="empty"):
            rule.check("")
    assert names.VCHANNEL.check("", allow_empty=True) == ""
    with pytest.raises(InvalidArgumentError):
        names.PCHANNEL.check(None)


def test_shorten_quotes_at_most_about_200_characters() -> None:
    assert names.shorten("abc") == "'abc'"
    long = names.shorten("y" * 10_000)
    assert len(long) < 240 and "10000 chars" in long
    assert len(names.shorten("\x00" * 150)) <= 203
    assert len(names.shorten(b"z" * 5000)) < 240


# --- the path check -----------------------------------------------------------------------------
def test_inside_refuses_paths_that_leave_the_root(tmp_path: Path) -> None:
    root = tmp_path / "parquet"
    assert inside(root, "p") == root / "p"
    assert inside(root, "p/users/partition=_default/segment=1") == root / "p/users/partition=_default/segment=1"
    for rel in ("../x", "/abs", "p/../../x", ".", "", "p/.."):
        with pytest.raises(PathOutsideRootError):
            inside(root, rel)
    root.mkdir()
    (root / "out").symlink_to(tmp_path)
    with pytest.raises(PathOutsideRootError):
        inside(root, "out/x")


# --- error metadata ------------------------------------------------------------------------------
def _header_bytes(st: object) -> int:
    """What a status puts into response headers: grpc-message (percent-encoded) and the base64
    details, as gRPC sends them."""
    total = 0
    for key, value in st.trailing_metadata:  # type: ignore[attr-defined]
        total += len(key) + (len(value) * 4 // 3 + 4 if isinstance(value, bytes) else len(value))
    return total + len(quote(st.details.encode()))  # type: ignore[attr-defined]


def test_no_error_can_exceed_the_16_kib_metadata_limit() -> None:
    err = StreamingError("é" * 20_000, channel="x" * 10_000, vchannel="\u4e00" * 5000,
                         **{f"k{i}" * 50: "v" * 300 for i in range(100)})
    st = codes.to_grpc_status(err)
    assert _header_bytes(st) < 12 * 1024
    (_, raw), = [(k, v) for k, v in st.trailing_metadata if k == "grpc-status-details-bin"]
    rich = status_pb2.Status.FromString(raw)
    info = error_details_pb2.ErrorInfo()
    any_pb2.Any.Unpack(rich.details[0], info)
    assert info.metadata["channel"].startswith("xxx") and len(info.metadata["channel"].encode()) <= 256
    assert sum(len(k) + len(v.encode()) for k, v in info.metadata.items()) <= codes.MAX_METADATA_BYTES
    assert len(rich.message.encode()) <= codes.MAX_MESSAGE_BYTES and "bytes)" in rich.message
    detail = codes.to_error_detail(err)
    assert len(detail.message.encode()) <= codes.MAX_MESSAGE_BYTES
    assert sum(len(k) + len(v.encode()) for k, v in detail.metadata.items()) <= codes.MAX_METADATA_BYTES


def test_a_small_error_is_carried_whole() -> None:
    err = ChannelNotExistError("pchannel 'p' does not exist", channel="p")
    back = codes.from_error_detail(codes.to_error_detail(err))
    assert str(back) == str(err) and back.fields == {"channel": "p"}


def test_the_quarantine_directory_is_no_collection_name() -> None:
    """Damaged Parquet files go to a directory beside the collections: no collection may take its name."""
    from flusher.layout import QUARANTINE_DIR  # noqa: PLC0415

    assert QUARANTINE_DIR == names.QUARANTINE_DIR
    with pytest.raises(InvalidArgumentError, match="reserved"):
        bodies.validate_name("collection", QUARANTINE_DIR)
    assert bodies.validate_name("collection", "_quarantined") == "_quarantined"
