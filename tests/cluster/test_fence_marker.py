"""The new owner's fence marker expects the last sequence its recovery read (Expected-Last-Sequence): an
older writer that publishes between that read and the marker makes the marker fail, and the new owner
reads the stream again and fences after it, so the old writer's block is either seen by the new
owner's recovery or fenced out — never left behind a marker that claims its ids for the new term.

The interleaving is made deterministic by a seam: the new owner's recovery read returns, then the old
writer (another backend on the same NATS, as another node would be) writes, then the marker goes out.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from tests.factories import ins
from tests.natscluster import NatsCluster
from wal._codec import decode_block, encode_block
from wal.backend import TickEntry, WriteGroup
from wal.backends.jetstream import JetStreamBackend
from wal.errors import ChannelFencedError

pytestmark = pytest.mark.integration

_prefixes = itertools.count(1)


def _group(key: int, first: int, n: int = 2) -> WriteGroup:
    """A block of ``n`` messages with ids from ``first``, timestamps 10 * id + 1, one tick at its end."""
    msgs = [ins("v", 10 * (first + i) + 1, f"m{first + i}".encode()) for i in range(n)]
    last_ts = 10 * (first + n - 1) + 1
    return WriteGroup(key, first, encode_block(msgs), [TickEntry(last_ts + 1, first + n - 1, first + n)], last_ts + 1)


@pytest.fixture
def backends(nats_r1: NatsCluster) -> Iterator[tuple[JetStreamBackend, JetStreamBackend]]:
    prefix = f"fm{next(_prefixes)}"
    old = JetStreamBackend(nats_r1.url, prefix=prefix, timeout=2.0)
    new = JetStreamBackend(nats_r1.url, prefix=prefix, timeout=2.0)
    try:
        yield old, new
    finally:
        old.close()
        new.close()


def test_an_old_writers_block_between_the_new_owners_recovery_read_and_its_fence_marker_is_seen_not_overwritten(
    backends: tuple[JetStreamBackend, JetStreamBackend], monkeypatch: pytest.MonkeyPatch,
) -> None:
    old, new = backends
    key = old.create_channel("p", {}).key
    assert old.open_channel("p").term == 1
    old.write([_group(key, 0)], durable=True)  # ids 0, 1

    recover = new._recover
    reads: list[int] = []

    async def then_the_old_writer_publishes(name: str, record: dict[str, Any]) -> Any:
        out = await recover(name, record)
        reads.append(out[0].next_id)
        if len(reads) == 1:
            # Between the recovery read and the marker: the old owner, not fenced yet, stores ids 2, 3.
            await asyncio.to_thread(old.write, [_group(key, 2)], durable=True)
        return out
    monkeypatch.setattr(new, "_recover", then_the_old_writer_publishes)

    info = new.open_channel("p")
    # The marker expecting the first read's last sequence was refused; the second read saw the block.
    assert reads == [2, 4]
    assert (info.term, info.next_id) == (2, 4)
    with pytest.raises(ChannelFencedError):  # fenced from the marker on
        old.write([_group(key, 4)], durable=True)
    new.write([_group(key, 4)], durable=True)
    blocks = new.read_blocks(key, 0, 1 << 20)
    ids = [m.message_id for first, block in blocks for m in decode_block(block, first)]
    assert ids == [0, 1, 2, 3, 4, 5]  # each id once: the old writer's block kept, the new term's after it
