"""Consumer-group lag per (group, vchannel), as Kafka defines it: behind the newest message of that
vchannel, 0 when nothing is left to read there.  The same numbers in the Describe RPC, the CLI's
``groups describe`` and the ``consumer_group_lag`` gauges; a seek stores a real time; a restart keeps it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from streamingnode.client import AsyncClient
from streamingnode.server import ServerThread
from tests.integration.conftest import node_config
from tests.integration.test_metrics import Samples, scrape, value
from tests.waiting import until
from wal.message import AppendResult
from wal.options import DeliverPolicy

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


async def cli_lag(server: str, pchannel: str, group: str) -> dict[str, tuple[int, int]]:
    """``groups describe`` of one group, JSON and table alike: vchannel -> (lag messages, lag ms)."""
    def run(*extra: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "streamingnode", "groups", "describe", "--channel", pchannel, group,
             "--addr", server, *extra], capture_output=True, text=True, timeout=30, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    (described,) = json.loads(await asyncio.to_thread(run, "--json"))
    from_json = {p["vchannel"]: (p["lag_messages"], p["lag_ms"]) for p in described["vchannels"]}
    table = (await asyncio.to_thread(run)).splitlines()
    assert table[0].split()[-2:] == ["LAG_MSGS", "LAG_MS"]
    from_table = {row.split()[2].strip("'"): (int(row.split()[-2]), int(row.split()[-1])) for row in table[1:]}
    assert from_table == from_json, "the table and --json say the same"
    return from_json


async def rpc_lag(client: AsyncClient, pchannel: str, group: str) -> dict[str, tuple[int, int]]:
    (g,) = await client.describe_groups(pchannel, [group])
    return {p.vchannel: (p.lag_messages, p.lag_ms) for p in g.vchannels}


def metric_lag(samples: Samples, pchannel: str, group: str, vchannel: str) -> tuple[float, float]:
    labels = {"pchannel": pchannel, "group": group, "vchannel": vchannel}
    return (value(samples, "streamingnode_consumer_group_lag_messages", **labels),
            value(samples, "streamingnode_consumer_group_lag_seconds", **labels))


async def produce(client: AsyncClient, vchannel: str, n: int) -> AppendResult:
    async with client.producer("p") as producer:
        for i in range(n):
            last = await producer.send(vchannel, b"m%d" % i)
    return last


async def confirmed(srv: ServerThread, last: AppendResult) -> None:
    """Every append up to ``last`` acknowledged (the MVCC point passed it): "latest" includes it."""
    stream = srv.node.channel("p").stream
    await until(lambda: stream.mvcc_timetick() >= last.timetick, "the read point past the last message")


async def test_seek_to_latest_is_lag_zero_in_rpc_cli_and_metric(server_thread: ServerThread) -> None:
    address, metrics = server_thread.address, server_thread.metrics_address
    assert metrics is not None
    async with AsyncClient(address) as client:
        await client.create_channels(["p"])
        await client.create_group("p", "g")
        last = await produce(client, "a", 20)
        await confirmed(server_thread, last)
        pos = await client.seek_group("p", "g", "a", policy=DeliverPolicy.latest())
        assert pos.timetick >= last.timetick, "the stored position carries the time of the newest message"
        assert await rpc_lag(client, "p", "g") == {"a": (0, 0)}
        assert await cli_lag(address, "p", "g") == {"a": (0, 0)}
        assert metric_lag(scrape(metrics), "p", "g", "a") == (0, 0)
        # Nothing is redelivered after the seek, and what comes next is.
        after = await produce(client, "a", 1)
        async with client.consumer("p", "a", group="g") as consumer:
            async for pack in consumer:
                if pack.messages:
                    assert [m.message_id for m in pack.messages] == [after.message_id]
                    break


async def test_seek_to_earliest_lags_by_the_retained_log_from_a_real_time(server_thread: ServerThread) -> None:
    address, metrics = server_thread.address, server_thread.metrics_address
    assert metrics is not None
    async with AsyncClient(address) as client:
        await client.create_channels(["p"])
        await client.create_group("p", "g")
        last = await produce(client, "a", 30)
        pos = await client.seek_group("p", "g", "a", policy=DeliverPolicy.all())
        (d,) = await client.describe_channels(["p"])
        assert d.first_id is not None and pos.message_id == d.first_id
        assert pos.timetick > 0
        # WAL ids from the first retained through the vchannel's newest (the fence tick counts too).
        want = last.message_id - d.first_id + 1
        for got in (await rpc_lag(client, "p", "g"), await cli_lag(address, "p", "g")):
            n, ms = got["a"]
            assert n == want
            assert 0 <= ms < HOUR_MS, f"lag of {ms} ms after a seek to earliest: measured from 1970?"
        n_metric, seconds = metric_lag(scrape(metrics), "p", "g", "a")
        assert n_metric == want and 0 <= seconds < 3600
        # The seek changed the lag's origin, not what is delivered: every message of the vchannel.
        got_ids: list[int] = []
        async with client.consumer("p", "a", group="g") as consumer:
            async for pack in consumer:
                got_ids += [m.message_id for m in pack.messages]
                if got_ids and got_ids[-1] == last.message_id:
                    break
        assert len(got_ids) == 30


async def test_seek_to_an_id_stores_that_messages_time(server_thread: ServerThread) -> None:
    async with AsyncClient(server_thread.address) as client:
        await client.create_channels(["p"])
        await client.create_group("p", "g")
        async with client.producer("p") as producer:
            sent = [await producer.send("a", b"m%d" % i) for i in range(5)]
        pos = await client.seek_group("p", "g", "a", policy=DeliverPolicy.start_from(sent[2].message_id))
        assert pos.message_id == sent[2].message_id
        assert sent[1].timetick <= pos.timetick < sent[2].timetick, "just below the sought message's time"
        n, ms = (await rpc_lag(client, "p", "g"))["a"]
        assert n == sent[4].message_id - sent[2].message_id + 1
        assert 0 <= ms < HOUR_MS


async def test_an_idle_group_stays_at_zero_while_another_vchannel_is_written(server_thread: ServerThread) -> None:
    address, metrics = server_thread.address, server_thread.metrics_address
    assert metrics is not None
    async with AsyncClient(address) as client:
        await client.create_channels(["p"])
        await client.create_group("p", "g")
        last_a = await produce(client, "a", 10)
        async with client.consumer("p", "a", group="g") as consumer:
            async for pack in consumer:
                if pack.end_ts >= last_a.timetick:
                    await consumer.ack(pack)
                    break
        assert await rpc_lag(client, "p", "g") == {"a": (0, 0)}
        last_b = await produce(client, "b", 1000)

        async def persisted() -> bool:  # a persisted tick after B's writes: ids move on past them
            (d,) = await client.describe_channels(["p"])
            return d.last_id is not None and d.last_id > last_b.message_id

        await until(persisted, "a persisted tick after the writes to b")
        assert await rpc_lag(client, "p", "g") == {"a": (0, 0)}
        assert await cli_lag(address, "p", "g") == {"a": (0, 0)}
        assert metric_lag(scrape(metrics), "p", "g", "a") == (0, 0)
        # The same pchannel's other vchannel does lag for a group behind on it.
        await client.create_group("p", "gb")
        await client.seek_group("p", "gb", "b", policy=DeliverPolicy.all())
        n, _ = (await rpc_lag(client, "p", "gb"))["b"]
        assert n >= 1000
        # And a write to a makes the idle group lag by exactly that one message.
        one = await produce(client, "a", 1)
        n, ms = (await rpc_lag(client, "p", "g"))["a"]
        assert n >= 1 and ms >= 0
        (g,) = await client.describe_groups("p", ["g"])
        assert g.vchannels[0].committed.message_id + n - 1 == one.message_id


def test_lag_survives_a_restart(tmp_path: Path) -> None:
    config = node_config(tmp_path / "data")

    async def before(srv: ServerThread) -> tuple[dict[str, tuple[int, int]], Samples]:
        async with AsyncClient(srv.address) as client:
            await client.create_channels(["p"])
            await client.create_group("p", "g")
            async with client.producer("p") as producer:
                sent = [await producer.send("a", b"m%d" % i) for i in range(10)]
            await confirmed(srv, sent[-1])
            await client.seek_group("p", "g", "a", policy=DeliverPolicy.start_from(sent[6].message_id))
            await client.create_group("p", "idle")
            await client.seek_group("p", "idle", "a", policy=DeliverPolicy.latest())
            await produce(client, "b", 200)  # other vchannel traffic: neither group's lag
            assert (await rpc_lag(client, "p", "idle")) == {"a": (0, 0)}
            lag = await rpc_lag(client, "p", "g")
            # WAL ids from the committed one through a's newest: 4, plus any TimeTick the tick beat
            # appended between those sends (ids are per pchannel).
            assert lag["a"][0] == sent[-1].message_id - sent[6].message_id + 1 >= 4
        assert srv.metrics_address is not None
        return lag, scrape(srv.metrics_address)

    async def after(srv: ServerThread) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]], Samples]:
        assert srv.metrics_address is not None
        samples = scrape(srv.metrics_address)  # the first look after the restart is the scrape
        async with AsyncClient(srv.address) as client:
            return await rpc_lag(client, "p", "g"), await rpc_lag(client, "p", "idle"), samples

    with ServerThread(config) as srv:
        lag_before, samples_before = asyncio.run(before(srv))
    assert lag_before["a"][0] >= 4 and lag_before["a"][1] >= 0
    with ServerThread(config) as srv:
        lag_after, idle_after, samples_after = asyncio.run(after(srv))
    assert lag_after == lag_before, "the high-water of vchannel a is recovered, not reset or moved"
    assert idle_after == {"a": (0, 0)}
    for group in ("g", "idle"):
        assert metric_lag(samples_after, "p", group, "a") == metric_lag(samples_before, "p", group, "a")
