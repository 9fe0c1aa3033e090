"""``Consumer.process``: a handler on N workers against a real node — order per key, parallel keys, a
group position never committed past a message not yet handled, a handler that raises, and the bound
on messages in flight."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

from streamingnode.client import AsyncClient, Client
from tests.waiting import until
from wal.message import Message, MessageType

pytestmark = pytest.mark.integration

VCHANNELS = ("a", "b", "c", "d")


@pytest.fixture
async def client(server: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server, timeout=10.0, reconnect_timeout=10.0) as c:
        yield c


async def produce(client: AsyncClient, n: int) -> list[tuple[str, bytes]]:
    """``n`` messages spread over the vchannels in turn; returns (vchannel, payload) in send order."""
    sent = [(VCHANNELS[i % len(VCHANNELS)], f"m{i:05d}".encode()) for i in range(n)]
    async with client.producer("p") as producer:
        await asyncio.gather(*(producer.send_nowait(v, p) for v, p in sent))
    return sent


def data(m: Message) -> bool:
    return m.message_type is MessageType.DATA


async def committed_id(client: AsyncClient, group: str) -> int:
    """The message id the group resumes from on the pchannel (0: nothing committed)."""
    [desc] = await client.describe_groups("p", [group])
    pos = desc.committed("")
    return 0 if pos is None else pos.message_id


async def test_messages_of_one_key_are_handled_in_order_and_keys_run_in_parallel(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    sent = await produce(client, 2000)
    seen: dict[str, list[bytes]] = {v: [] for v in VCHANNELS}
    running: set[str] = set()
    overlap = 0

    async def handler(m: Message) -> None:
        nonlocal overlap
        if not data(m):
            return
        assert m.vchannel not in running, f"two messages of {m.vchannel!r} handled at once"
        running.add(m.vchannel)
        overlap = max(overlap, len(running))
        for _ in range(int(m.payload[-1:]) % 3 + 1):  # uneven work per message, no clock involved
            await asyncio.sleep(0)
        seen[m.vchannel].append(m.payload)
        running.discard(m.vchannel)

    async with client.consumer("p") as consumer:
        task = asyncio.ensure_future(consumer.process(handler, workers=4))
        await until(lambda: sum(map(len, seen.values())) == len(sent), timeout=60, what="every message handled")
        await consumer.aclose()
        handled = await asyncio.wait_for(task, 30)
    for v in VCHANNELS:
        assert seen[v] == [p for w, p in sent if w == v], f"order of {v!r} not kept"
    assert overlap > 1, "the keys never ran in parallel"
    assert handled >= len(sent)


async def test_the_group_position_never_passes_a_message_not_yet_handled(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    await client.create_group("p", "g")
    sent = await produce(client, 400)
    stuck = sent[50][1]  # held by its handler while everything after it (other keys) is handled
    release = asyncio.Event()
    done: set[bytes] = set()
    stuck_id: list[int] = []

    async def handler(m: Message) -> None:
        if not data(m):
            return
        if m.payload == stuck:
            assert m.message_id is not None
            stuck_id.append(m.message_id)
            await release.wait()
        done.add(m.payload)

    async with client.consumer("p", group="g") as consumer:
        task = asyncio.ensure_future(consumer.process(handler, workers=4, key=lambda m: m.payload))
        await until(lambda: len(done) == len(sent) - 1, timeout=60, what="all but the stuck message handled")
        # Packs after the stuck one are done; the group must still resume at or before it.  The
        # committer acks in its own time, so a position that passed it might not show yet: wait a
        # bounded while for the thing that must not happen.
        async def passed_it() -> bool:
            return await committed_id(client, "g") > stuck_id[0]

        with pytest.raises(AssertionError, match="timed out"):
            await until(passed_it, timeout=3, what="the position to pass the stuck message (it must not)")
        release.set()
        await until(lambda: len(done) == len(sent), timeout=30, what="the stuck message handled")

        async def caught_up() -> bool:
            return await committed_id(client, "g") > stuck_id[0]

        await until(caught_up, timeout=30, what="the position to move past the released message")
        await consumer.aclose()
        await asyncio.wait_for(task, 30)


async def test_a_handler_that_raises_stops_the_run_and_its_message_is_delivered_again(
        client: AsyncClient) -> None:
    await client.create_channels(["p"])
    await client.create_group("p", "g")
    sent = await produce(client, 300)
    bad = sent[120][1]

    class Boom(Exception):
        pass

    async def handler(m: Message) -> None:
        if data(m) and m.payload == bad:
            raise Boom("cannot handle it")

    async with client.consumer("p", group="g") as consumer:
        with pytest.raises(Boom):
            await asyncio.wait_for(consumer.process(handler, workers=3), 60)
    # A new consumer of the group starts at or before the failed message: it is not skipped.
    again: list[bytes] = []
    async with client.consumer("p", group="g") as consumer:
        async with asyncio.timeout(30):
            async for pack in consumer:
                again.extend(m.payload for m in pack.messages if data(m))
                if bad in again:
                    break
    assert bad in again


async def test_at_most_max_in_flight_messages_are_taken_and_not_yet_handled(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    await produce(client, 500)
    release = asyncio.Event()
    started = 0
    highest = 0

    async with client.consumer("p") as consumer:
        async def handler(m: Message) -> None:
            nonlocal started, highest
            started += 1
            highest = max(highest, consumer.in_process)
            await release.wait()

        task = asyncio.ensure_future(consumer.process(handler, workers=4, max_in_flight=10,
                                                      key=lambda m: m.message_id))
        await until(lambda: started == 4 and consumer.in_process >= 10, timeout=30,
                    what="four handlers blocked and the bound reached")
        assert consumer.in_process == 10, "more messages taken than max_in_flight"
        release.set()
        await until(lambda: started >= 500, timeout=60, what="every message handled")
        await consumer.aclose()
        await asyncio.wait_for(task, 30)
    assert highest <= 10


def test_the_sync_client_processes_on_threads(server: str) -> None:
    with Client(server, timeout=10.0) as client:
        client.create_channels(["p"])
        with client.producer("p") as producer:
            for i in range(200):
                producer.send_nowait(VCHANNELS[i % 4], f"s{i:04d}".encode())
        seen: dict[str, list[bytes]] = {v: [] for v in VCHANNELS}
        threads: set[str] = set()
        lock = threading.Lock()
        consumer = client.consumer("p")
        total = 0

        def handler(m: Message) -> None:
            nonlocal total
            if m.message_type is MessageType.DATA:
                with lock:
                    threads.add(threading.current_thread().name)
                    seen[m.vchannel].append(m.payload)
                    total += 1
                    if total == 200:
                        threading.Thread(target=consumer.close).start()

        handled = consumer.process(handler, workers=3)
        assert handled >= 200
        for i, v in enumerate(VCHANNELS):
            assert seen[v] == [f"s{j:04d}".encode() for j in range(i, 200, 4)]
        assert all(name.startswith("consumer-process") for name in threads)
