"""Pipelined writes of the JetStream backend (``start_write``): a write is queued behind the one before
it and sent the moment that one is acknowledged, each still fenced by its expected sequence; a write
that follows a failed one is never sent, and a write from the end of what is stored goes on."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.test_jetstream_backend import _group, _ids
from tests.factories import ins
from tests.natscluster import NatsCluster
from wal._codec import encode_block
from wal.backend import WriteGroup
from wal.backends.jetstream import JetStreamBackend
from wal.errors import ChannelFencedError, ErrorCode, MessageTooLargeError, StreamingError

_prefixes = itertools.count(1)


@pytest.fixture
def backends(nats_r1: NatsCluster) -> Iterator[list[JetStreamBackend]]:
    opened: list[JetStreamBackend] = []
    yield opened
    for b in opened:
        b.close()


def _open(opened: list[JetStreamBackend], cluster: NatsCluster) -> JetStreamBackend:
    b = JetStreamBackend(cluster.url, prefix=f"pl{next(_prefixes)}", replicas=1, timeout=2.0)
    opened.append(b)
    return b


def _count_publishes(b: JetStreamBackend) -> list[str]:
    """Record the first id (``Sn-First``) of every block publish ``b`` sends from now on."""
    real = b._js.publish
    sent: list[str] = []

    async def publish(subject: str, payload: bytes = b"", **kwargs: Any) -> Any:
        sent.append(kwargs.get("headers", {}).get("Sn-First", "?"))
        return await real(subject, payload, **kwargs)

    b._js.publish = publish  # type: ignore[method-assign]
    return sent


def test_started_writes_are_stored_in_the_order_they_were_started(
        nats_r1: NatsCluster, backends: list[JetStreamBackend]) -> None:
    b = _open(backends, nats_r1)
    key = b.create_channel("p", {}).key
    b.open_channel("p")
    futures = [b.start_write([_group(key, first)]) for first in range(0, 40, 2)]  # none awaited yet
    assert [f.result(30) for f in futures] == [{}] * 20
    assert _ids(b.read_blocks(key, 0, 1 << 20)) == list(range(40))
    assert b.describe_channel("p").next_id == 40


def test_a_write_behind_a_failed_one_is_not_sent_and_one_from_the_stored_end_is(
        nats_r1: NatsCluster, backends: list[JetStreamBackend]) -> None:
    b = _open(backends, nats_r1)
    key = b.create_channel("p", {}).key
    b.open_channel("p")
    b.write([_group(key, 0)], durable=True)
    sent = _count_publishes(b)
    huge = WriteGroup(key, 2, encode_block([ins("v", 30, b"x" * (9 << 20))]), [], 30)  # over max_payload
    failed = b.start_write([huge])
    behind = b.start_write([_group(key, 3)])  # pipelined after it: ids 3-4 follow the refused block
    assert isinstance(failed.result(30)[key], MessageTooLargeError)
    behind_errors = behind.result(30)
    assert key in behind_errors, "the write behind a failed one succeeded"
    err = behind_errors[key]
    assert isinstance(err, StreamingError) and err.code is ErrorCode.UNAVAILABLE, err
    assert "was not sent" in str(err)
    assert sent == ["2"], "the write behind a failed one was sent (it would leave a gap in the ids)"
    # The WAL hands ids 2-4 back; its next write starts at the end of what is stored, and is sent.
    assert b.start_write([_group(key, 2)]).result(30) == {}
    assert _ids(b.read_blocks(key, 0, 1 << 20)) == [0, 1, 2, 3]


def test_a_write_that_does_not_follow_the_stored_end_is_refused_unsent(
        nats_r1: NatsCluster, backends: list[JetStreamBackend]) -> None:
    b = _open(backends, nats_r1)
    key = b.create_channel("p", {}).key
    b.open_channel("p")
    sent = _count_publishes(b)
    err = b.start_write([_group(key, 5)]).result(30)[key]
    assert isinstance(err, StreamingError) and err.code is ErrorCode.UNRECOVERABLE and "reopen" in str(err)
    assert sent == []
    assert b.describe_channel("p").next_id == 0


def test_pipelined_writes_of_a_fenced_writer_all_fail_fenced_and_none_is_stored(
        nats_r1: NatsCluster, backends: list[JetStreamBackend]) -> None:
    old = _open(backends, nats_r1)
    key = old.create_channel("p", {}).key
    old.open_channel("p")
    old.write([_group(key, 0)], durable=True)
    new = JetStreamBackend(nats_r1.url, prefix=old.prefix, replicas=1, timeout=2.0)
    backends.append(new)
    new.open_channel("p")  # takes the pchannel over
    sent = _count_publishes(old)
    futures = [old.start_write([_group(key, first)]) for first in (2, 4, 6)]
    for f in futures:
        assert isinstance(f.result(30)[key], ChannelFencedError)
    assert sent == ["2"], "only the first write may reach the servers (which refuse it)"
    assert new.describe_channel("p").next_id == 2
    assert _ids(new.read_blocks(key, 0, 1 << 20)) == [0, 1]
