"""The chain in front of a real WAL: time ticks, ordering under concurrency, recovery and fencing."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import pytest

from interceptors.recovery.streaming_wal import ChainConfig, StreamingWAL, open_streaming_wal
from tests.conftest import ManagerFactory
from tests.factories import data
from tests.waiting import loop_turns, ticks_pass, until
from wal import (
    WAL,
    AppendResult,
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


async def test_concurrent_producers_are_delivered_in_timestamp_order_exactly_once(
    manager: WALManager, seed: int
) -> None:
    swal = await _open(manager)
    vchannels = [f"v{i}" for i in range(4)]
    scanners = {v: swal.read(ReadOption(vchannel=v, deliver_policy=DeliverPolicy.latest())) for v in vchannels}
    acked: dict[str, set[int]] = {v: set() for v in vchannels}
    rng = random.Random(seed)

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


async def test_a_live_reader_gets_every_message_in_the_pack_of_its_own_tick(manager: WALManager, seed: int) -> None:
    # A TimeTick at T is a barrier: it may go out only once every append with a smaller timestamp was
    # acknowledged.  Sent early, a slower append lands in a later pack whose begin_ts is already at or
    # past its own timestamp.  Sixteen producers and a reader that tails while they write make the
    # interleavings; a barrier that does not wait shows up within a few hundred messages.
    swal = await _open(manager, ChainConfig(tick_interval=0.005))
    scanner = swal.read(ReadOption(deliver_policy=DeliverPolicy.latest()))
    acked: set[int] = set()
    seen: list[tuple[int, int, int, int]] = []  # (begin_ts, ts, end_ts, id)
    done = asyncio.Event()
    rng = random.Random(seed)

    async def read() -> None:
        async for pack in scanner:
            seen.extend((pack.begin_ts, m.timetick, pack.end_ts, m.message_id) for m in pack.messages)  # type: ignore[misc]
            if done.is_set() and acked <= {mid for *_, mid in seen}:
                return

    async def producer(k: int) -> None:
        for _ in range(40):
            batch = [data(f"v{k % 4}", b"x" * rng.randrange(1, 512)) for _ in range(rng.randrange(1, 8))]
            acked.update(r.message_id for r in await swal.append_batch(batch))
            await asyncio.sleep(0)  # let the reader and the tick task in between appends

    reader = asyncio.create_task(read())
    await asyncio.gather(*(producer(k) for k in range(16)))
    done.set()
    swal.wal.want_tick()
    await asyncio.wait_for(reader, 20)
    late = [(b, ts, e, mid) for b, ts, e, mid in seen if not b < ts <= e]
    assert not late, f"{len(late)} of {len(seen)} messages outside their pack's (begin_ts, end_ts]: {late[:5]}"
    assert {mid for *_, mid in seen} == acked and len(seen) == len(acked)
    await scanner.aclose()
    await swal.aclose()


async def test_a_tick_waits_for_an_append_allocated_before_it(
    manager: WALManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same barrier, made deterministic: one append is held between its timestamp and its write
    # while a later one completes and asks for a tick.  The tick must wait for the held one; sent at
    # once, the held message would arrive behind it, in a pack that begins after its timestamp.
    release = asyncio.Event()
    reached = asyncio.Event()
    real_append = WAL.append_batch

    async def holding(self: WAL, messages: Sequence[Message]) -> list[AppendResult]:
        if any(m.payload == b"held" for m in messages):
            reached.set()
            await release.wait()
        return await real_append(self, messages)

    monkeypatch.setattr(WAL, "append_batch", holding)  # before the chain binds it
    swal = await _open(manager, ChainConfig(tick_interval=3600))  # only prompted ticks
    ticks_started = 0
    emit = swal.timetick.emit_tick

    async def counting(persist: bool) -> int:
        nonlocal ticks_started
        ticks_started += 1
        return await emit(persist)

    monkeypatch.setattr(swal.timetick, "emit_tick", counting)
    scanner = swal.read(ReadOption(deliver_policy=DeliverPolicy.latest()))
    seen: list[tuple[int, int, int, bytes]] = []

    async def read() -> None:
        async for pack in scanner:
            seen.extend((pack.begin_ts, m.timetick, pack.end_ts, m.payload) for m in pack.messages)
            if len(seen) == 2:
                return

    reader = asyncio.create_task(read())
    held = asyncio.create_task(swal.append(data("v", b"held")))
    await asyncio.wait_for(reached.wait(), 5)
    before = ticks_started
    await swal.append(data("v", b"other"))  # acknowledged: it asks for a tick
    await until(lambda: ticks_started > before, "the tick asked for by the second append")
    release.set()
    await asyncio.wait_for(held, 5)
    await asyncio.wait_for(reader, 5)
    assert sorted(p for *_, p in seen) == [b"held", b"other"]
    for begin, ts, end, payload in seen:
        assert begin < ts <= end, f"{payload!r} at {ts} arrived in the pack ({begin}, {end}]"
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
    await loop_turns()  # a tick the appends' acknowledgements asked for is emitted on this loop, in these turns
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
    await loop_turns()
    assert len(ticks) == before
    await lazy.aclose()
    await swal.aclose()


async def test_ticks_never_go_backwards_across_reopen(open_manager: ManagerFactory) -> None:
    m = await open_manager()
    swal = await _open(m)
    first = await swal.append(data("v"))
    await ticks_pass(swal, 3)  # some not-persisted ticks are handed out meanwhile
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
