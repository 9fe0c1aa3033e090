"""A group commit that holds an unencodable request fails that request alone.

The appends' width checks keep such messages out; these tests hand them to the committer directly,
past those checks, in one burst with innocent requests of the same and of another pchannel, so that
all of them are taken into one commit.  The innocent ones must be written (with dense ids) and the
poisoned one must fail with a precise error.
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator

import pytest

from wal import WAL, Message, MessageType, WALManager
from wal._record import MAX_KEEPALIVE_MS, MAX_PROPERTIES, MAX_VCHANNEL_BYTES, check_encodable, needs_width_check
from wal.errors import CodecError, InvalidArgumentError, StreamingError
from wal.message import TxnContext


@pytest.fixture
async def two(tmp_path: pathlib.Path) -> AsyncIterator[tuple[WALManager, WAL, WAL]]:
    manager = await WALManager.start_rocksdb(tmp_path / "db")
    try:
        for name in ("a", "b"):
            await manager.create_channel(name)
        yield manager, await manager.open("a"), await manager.open("b")
    finally:
        await manager.aclose()


def _data(payload: bytes, vchannel: str = "v") -> Message:
    m = Message(MessageType.DATA, vchannel, payload)
    m._timetick = 1
    return m


def _poisons() -> dict[str, Message]:
    long_vchannel = _data(b"p", "x" * (MAX_VCHANNEL_BYTES + 1))
    many = _data(b"p")
    many._properties = {f"k{i}": "" for i in range(MAX_PROPERTIES + 1)}
    keepalive = _data(b"p")
    keepalive._txn = TxnContext(7, MAX_KEEPALIVE_MS + 1)
    surrogate = _data(b"p", "v\ud800")
    bad_type = _data(b"p")
    bad_type._type = 1 << 20  # type: ignore[assignment]  (no width check knows this one: the codec fails)
    return {"vchannel": long_vchannel, "properties": many, "keepalive_ms": keepalive, "UTF-8": surrogate,
            "cannot be encoded": bad_type}


@pytest.mark.parametrize("kind", sorted(_poisons()))
async def test_an_unencodable_request_fails_alone_in_its_group_commit(
    two: tuple[WALManager, WAL, WAL], kind: str
) -> None:
    manager, a, b = two
    await a.append(_data(b"before"))
    poison = _poisons()[kind]
    committer = manager._committer
    # One burst, no await between: the committer takes all three into one write.
    first = committer.submit(a, [_data(b"a1"), _data(b"a2")], 128)
    bad = committer.submit(b, [_data(b"b0"), poison], 128)
    after = committer.submit(b, [_data(b"b1")], 64)
    done = await asyncio.gather(first, bad, after, return_exceptions=True)
    assert done[0] is None and done[2] is None, done
    err = done[1]
    assert isinstance(err, InvalidArgumentError if kind != "cannot be encoded" else CodecError), err
    assert kind in str(err), err
    if kind != "cannot be encoded":
        assert str(err).startswith("messages[1]"), err
    # Nothing of the poisoned request was stored; the others were, with dense ids.
    assert [m.payload for m in await a.read_stored(0)] == [b"before", b"a1", b"a2"]
    assert [(m.message_id, m.payload) for m in await b.read_stored(0)] == [(0, b"b1")]
    assert b.next_id == 1 and a.next_id == 3
    assert committer._fatal is None
    await b.append(_data(b"b2"))
    assert [m.payload for m in await b.read_stored(0)] == [b"b1", b"b2"]


async def test_a_lone_unencodable_request_fails_and_the_wal_goes_on(two: tuple[WALManager, WAL, WAL]) -> None:
    manager, a, _ = two
    with pytest.raises(StreamingError, match="cannot be encoded"):
        await manager._committer.submit(a, [_poisons()["cannot be encoded"]], 64)
    await a.append(_data(b"x"))
    assert [(m.message_id, m.payload) for m in await a.read_stored(0)] == [(0, b"x")]


@pytest.mark.parametrize("kind", sorted(set(_poisons()) - {"cannot be encoded", "UTF-8"}))
async def test_the_append_refuses_what_the_codec_cannot_hold_naming_field_and_limit(
    two: tuple[WALManager, WAL, WAL], kind: str
) -> None:
    manager, a, _ = two
    poison = _poisons()[kind]
    assert needs_width_check(poison)
    submitted: list[object] = []
    submit = manager._committer.submit
    manager._committer.submit = lambda *args: submitted.append(args) or submit(*args)  # type: ignore[method-assign]
    with pytest.raises(InvalidArgumentError, match=kind) as caught:
        await a.append_batch([_data(b"ok"), poison])
    assert not submitted, "refused before it joined a group commit"
    assert "messages[1]" in str(caught.value) and "outside what the log can store" in str(caught.value)
    assert caught.value.fields["limit"] in {MAX_VCHANNEL_BYTES, MAX_PROPERTIES, MAX_KEEPALIVE_MS}
    assert a.next_id == 0


def test_widths_come_from_the_codec_formats() -> None:
    assert (MAX_VCHANNEL_BYTES, MAX_PROPERTIES, MAX_KEEPALIVE_MS) == (0xFFFF, 0xFFFF, 0xFFFFFFFF)
    ok = _data(b"x" * 10, "v" * MAX_VCHANNEL_BYTES)
    ok._properties = {"k" * 0xFFFF: "v"}
    check_encodable(ok)
    ok._properties = {"k" * 0x10000: "v"}
    with pytest.raises(InvalidArgumentError, match=r"properties key: length in bytes 65536 .*0 to 65535"):
        check_encodable(ok)
    # A vchannel's limit is in bytes, not characters.
    with pytest.raises(InvalidArgumentError, match="vchannel"):
        check_encodable(_data(b"", "é" * (MAX_VCHANNEL_BYTES // 2 + 1)))
