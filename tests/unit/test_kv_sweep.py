"""``streamingnode.cluster.kv.read_all`` against a stand-in bucket whose watch behaves as nats-py's can:
the "no more pending" marker first, then the entries the server had already sent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from streamingnode.cluster.kv import read_all


@dataclass
class _Entry:
    key: str
    value: bytes
    delta: int  # what the consumer still had pending after this entry
    operation: str | None = None


class _Watch:
    def __init__(self, updates: list[_Entry | None]) -> None:
        self.updates = updates
        self.stopped = False

    def __aiter__(self) -> AsyncIterator[_Entry | None]:
        return self._each()

    async def _each(self) -> AsyncIterator[_Entry | None]:
        for u in self.updates:
            yield u

    async def stop(self) -> None:
        self.stopped = True


class _Status:
    def __init__(self, values: int) -> None:
        self.values = values
        self.history = 1


class _Bucket:
    def __init__(self, updates: list[_Entry | None], stored: int) -> None:
        self.watch = _Watch(updates)
        self.stored = stored

    async def watchall(self, **kwargs: Any) -> _Watch:
        return self.watch

    async def status(self) -> _Status:
        return _Status(self.stored)


async def test_a_marker_before_the_entries_of_a_bucket_that_is_not_empty_does_not_end_the_sweep() -> None:
    # nats-py puts the marker first when the server had sent every entry before the client took one.
    entries = [_Entry("a", b"1", 2), _Entry("b", b"2", 1), _Entry("c", b"3", 0)]
    bucket = _Bucket([None, *entries], stored=3)
    got = await read_all(bucket, 5.0)  # type: ignore[arg-type]
    assert {k: e.value for k, e in got.items()} == {"a": b"1", "b": b"2", "c": b"3"}
    assert bucket.watch.stopped


async def test_the_sweep_ends_at_the_entry_with_nothing_pending_or_at_the_marker_of_an_empty_bucket() -> None:
    later = _Entry("z", b"written after the sweep", 0)
    bucket = _Bucket([_Entry("a", b"1", 1), _Entry("b", b"x", 0, "DEL"), None, later], stored=2)
    got = await read_all(bucket, 5.0)  # type: ignore[arg-type]
    assert list(got) == ["a"]  # "b" deleted; what came after the end is not read
    empty = _Bucket([None, later], stored=0)
    assert await read_all(empty, 5.0) == {}  # type: ignore[arg-type]


async def test_a_key_renewed_during_the_sweep_is_read_though_the_pending_count_reached_zero_before_it() -> None:
    # The server chose b's last message when the sweep began; b was renewed before its turn, so that
    # message is gone and b comes as its new revision, after an entry the server sent with nothing
    # pending.  The bucket holds 2 keys: the sweep goes on until it has seen both.
    bucket = _Bucket([_Entry("a", b"1", 0), _Entry("b", b"renewed", 0)], stored=2)
    got = await read_all(bucket, 5.0)  # type: ignore[arg-type]
    assert {k: e.value for k, e in got.items()} == {"a": b"1", "b": b"renewed"}
