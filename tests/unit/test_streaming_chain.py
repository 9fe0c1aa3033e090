"""The chain in front of a real WAL: time ticks, ordering under concurrency, recovery and fencing."""

from __future__ import annotations

import asyncio
import random

import pytest

from interceptors.streaming import ChainConfig, StreamingWAL, open_streaming_wal
from tests.conftest import ManagerFactory
from tests.factories import data
from wal import (
    ChannelFencedError,
    DeliverPolicy,
    Message,
    MessageType,
    MsgPack,
    OnShutdownError,
    ReadOption,
    WALManager,
)

FAST = ChainConfig(tick_interval=0.02)


async def _open(manager: WALManager, config: ChainConfig = FAST, name: str = "p") -> StreamingWAL:
    if name not in await manager.list_channels():
        await manager.create_channel(name)
    swal = await open_streaming_wal(manager, name, config)
    await swal.ready()
    return swal


async def test_concurrent_producers_are_delivered_in_timestamp_order_exactly_once(manager: WALManager) -> None:
    swal = await _open(manager)
    vchannels = [f"v{i}" for i in range(4)]
    scanners = {v: swal.read(ReadOption(vchannel=v, deliver_policy=DeliverPolicy.latest())) for v in vchannels}
    acked: dict[str, set[int]] = {v: set() for v in vchannels}
    rng = random.Random(7)

    async def producer(k: int) -> None:
        v = vchannels[k % 4]
        for _ in range(15):
            batch = [data(v, bytes(rng.randrange(1, 2000))) for _ in range(rng.randrange(1, 20))]
            results = await swal.append_batch(batch)
            acked[v].update(r.message_id for r in results)

    await asyncio.gather(*(producer(k) for k in range(16)))
    for v, scanner in scanners.items():
        seen: list[tuple[int, int]] = []
        ends: list[int] = []
        while len(seen) < len(acked[v]):
            pack: MsgPack = await asyncio.wait_for(scanner.__anext__(), 10)
            ends.append(pack.end_ts)
            seen.extend((m.timetick, m.message_id) for m in pack.messages)  # type: ignore[misc]
        assert [ts for ts, _ in seen] == sorted({ts for ts, _ in seen})  # strictly increasing
        assert {mid for _, mid in seen} == acked[v] and len(seen) == len(acked[v])  # exactly once
        assert ends == sorted(ends)
        await scanner.aclose()
    await swal.aclose()


async def test_a_tailing_reader_gets_a_message_without_waiting_for_the_beat(manager: WALManager) -> None:
    # With an hour between beats, only the prompt tick after the acknowledgement can release it.
    swal = await _open(manager, ChainConfig(tick_interval=3600))
    scanner = swal.read(ReadOption(deliver_policy=DeliverPolicy.latest()))
    nxt = asyncio.create_task(scanner.__anext__())
    await swal.append(data("v", b"now"))
    pack = await asyncio.wait_for(nxt, 5)
    while not pack.messages:
        pack = await asyncio.wait_for(scanner.__anext__(), 5)
    assert [m.payload for m in pack.messages] == [b"now"]
    await swal.aclose()


async def test_appends_emit_no_tick_of_their_own_while_only_lazy_readers_are_open(manager: WALManager) -> None:
    # An hour between beats: every tick seen here is one an append, a reader or want_tick asked for.
    swal = await _open(manager, ChainConfig(tick_interval=3600))
    ticks: list[int] = []
    deliver = swal.wal.deliver_unpersisted

    def counting(tick: Message) -> None:
        ticks.append(tick.timetick)
        deliver(tick)

    swal.wal.deliver_unpersisted = counting  # type: ignore[method-assign]
    lazy = swal.read(ReadOption(deliver_policy=DeliverPolicy.latest(), lazy=True))
    nxt = asyncio.create_task(lazy.__anext__())
    for i in range(5):
        await swal.append(data("v", b"%d" % i))
    await asyncio.sleep(0.1)
    assert ticks == [] and not nxt.done()  # no tick, and the lazy reader was not woken to find none

    swal.wal.want_tick()
    got: list[bytes] = []
    pack = await asyncio.wait_for(nxt, 5)
    while len(got) < 5:
        got += [m.payload for m in pack.messages]
        if len(got) < 5:
            pack = await asyncio.wait_for(lazy.__anext__(), 5)
    assert got == [b"%d" % i for i in range(5)] and len(ticks) == 1

    # A prompt reader opened now gets what came before it at once, and every append ticks again.
    prompt = swal.read(ReadOption(deliver_policy=DeliverPolicy.all()))
    seen: list[bytes] = []
    while len(seen) < 5:
        seen += [m.payload for m in (await asyncio.wait_for(prompt.__anext__(), 5)).messages]
    assert seen == got
    before = len(ticks)
    await swal.append(data("v", b"more"))
    pack = await asyncio.wait_for(prompt.__anext__(), 5)
    while not pack.messages:
        pack = await asyncio.wait_for(prompt.__anext__(), 5)
    assert [m.payload for m in pack.messages] == [b"more"] and len(ticks) > before

    await prompt.aclose()
    await prompt.aclose()  # idempotent: the reader is counted out once
    assert swal.wal.prompt_readers == 0
    before = len(ticks)
    await swal.append(data("v", b"quiet"))
    await asyncio.sleep(0.1)
    assert len(ticks) == before
    await lazy.aclose()
    await swal.aclose()


async def test_ticks_never_go_backwards_across_reopen(open_manager: ManagerFactory) -> None:
    m = await open_manager()
    swal = await _open(m)
    first = await swal.append(data("v"))
    await asyncio.sleep(0.1)  # some not-persisted ticks are handed out meanwhile
    last_seen = swal.timetick.last_tick
    await swal.aclose()
    await m.aclose()
    m2 = await open_manager()
    swal2 = await _open(m2)
    second = await swal2.append(data("v"))
    assert second.timetick > max(first.timetick, last_seen)
    assert swal2.term == swal.term + 1
    # Everything, across both terms, reads back in order with the fence tick between them.
    scanner = swal2.read()
    got: list[int] = []
    while len(got) < 2:
        pack = await asyncio.wait_for(scanner.__anext__(), 5)
        got.extend(x.timetick for x in pack.messages)
    assert got == [first.timetick, second.timetick]
    await swal2.aclose()


async def test_reopen_writes_a_fence_tick_and_fences_the_old_handle(manager: WALManager) -> None:
    old = await _open(manager)
    await old.append(data("v"))
    new = await _open(manager)
    with pytest.raises(ChannelFencedError) as info:
        await old.append(data("v"))
    assert info.value.fields["term"] == old.term
    stored = await new.wal.read_stored(0)
    fences = [x for x in stored if x.message_type is MessageType.TIME_TICK and x.wal_term == new.term]
    assert fences, "the new term starts with a persisted TimeTick"
    assert (await new.append(data("v"))).message_id > fences[0].message_id  # type: ignore[operator]
    await new.aclose()
    await old.aclose()


async def test_closed_streaming_wal_refuses_appends(manager: WALManager) -> None:
    swal = await _open(manager)
    await swal.aclose()
    with pytest.raises(OnShutdownError):
        await swal.append(data("v"))


async def test_mvcc_timetick_covers_acknowledged_appends(manager: WALManager) -> None:
    swal = await _open(manager)
    r = await swal.append(data("v"))
    assert swal.mvcc_timetick() >= r.timetick
    await swal.aclose()
