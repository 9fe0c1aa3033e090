"""The blocking Client (an AsyncClient on a private loop thread) against a real node, from plain
synchronous test functions and from several threads."""

from __future__ import annotations

import concurrent.futures
import itertools
import threading

import pytest

from streamingnode.client import Client, Owner
from wal.errors import ChannelNotExistError, ConsumerGroupExistError, InvalidArgumentError, UnavailableError
from wal.message import Message, MessageType
from wal.options import DeliverPolicy

pytestmark = pytest.mark.integration


def data(pack_messages: list[Message]) -> list[bytes]:
    return [m.payload for m in pack_messages if m.message_type is MessageType.DATA]


def read_until(consumer, marker: bytes) -> list[bytes]:
    out: list[bytes] = []
    while marker not in out:
        pack = consumer.next(timeout=10)
        assert pack is not None, f"no pack within 10 s; have {out[-3:]}"
        out += data(pack.messages)
    return out


def test_sync_client_admin_produce_consume(server: str) -> None:
    with Client(server, timeout=10.0) as client:
        assert client.create_channels(["p"], owner=Owner(role="ingest")) == ["p"]
        (desc,) = client.describe_channels(["p"])
        assert desc.owner.role == "ingest"
        with pytest.raises(ChannelNotExistError):
            client.describe_channels(["nope"])

        with client.producer("p", linger=0.01) as producer:
            first = producer.send("v", b"one")
            futures = [producer.send_nowait("v", b"n%d" % i) for i in range(50)]
            results = [f.result(timeout=10) for f in futures]
            assert isinstance(futures[0], concurrent.futures.Future)
            assert first.message_id < results[0].message_id
            assert all(a.message_id < b.message_id for a, b in itertools.pairwise(results))
        last, mvcc = client.latest_position("p", "v")
        assert last is not None and last.message_id >= results[-1].message_id and mvcc >= results[-1].timetick

        client.create_group("p", "g")
        with pytest.raises(ConsumerGroupExistError):
            client.create_group("p", "g")
        with client.consumer("p", "v", group="g") as consumer:
            got = read_until(consumer, b"n49")
            assert got == [b"one", *(b"n%d" % i for i in range(50))]
            assert consumer.position is not None
            consumer.ack(consumer.position)
        (group,) = client.describe_groups("p", ["g"])
        assert group.committed("v") == consumer.position

        with pytest.raises(RuntimeError, match="boom"), client.txn("p", "v") as tx:
            tx.send(b"rolled back")
            raise RuntimeError("boom")
        with client.txn("p", "v") as tx:
            tx.send(b"t1")
            tx.send(b"t2")
        with client.producer("p") as producer:
            producer.send("v", b"end")
        with client.consumer("p", "v", group="g") as consumer:
            assert read_until(consumer, b"end") == [b"t1", b"t2", b"end"]

        client.seek_group("p", "g", "v", policy=DeliverPolicy.latest())
        with pytest.raises(InvalidArgumentError):
            client.seek_group("p", "g", "v")


def test_sync_producer_batches_sends_from_many_threads(server: str) -> None:
    with Client(server) as client:
        client.create_channels(["p"])
        producer = client.producer("p", linger=0.02)
        barrier = threading.Barrier(8)
        results: dict[int, list[int]] = {}

        def worker(n: int) -> None:
            barrier.wait()
            results[n] = [producer.send("v", b"%d-%d" % (n, i)).message_id for i in range(20)]

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ids = [i for r in results.values() for i in r]
        assert len(set(ids)) == 160
        assert all(r == sorted(r) for r in results.values()), "each thread's sends keep their order"
        producer.close()


def test_sync_msgstream(server: str) -> None:
    with Client(server) as client:
        client.create_channels(["a", "b"])
        with client.msgstream() as out, client.msgstream() as into:
            out.as_producer(["a", "b"])
            into.as_consumer(["a", "b"], "g", position="latest")
            results = out.produce([Message(MessageType.DATA, f"v{i}", b"m%d" % i) for i in range(10)])
            assert len(results) == 10
            out.broadcast(Message(MessageType.DATA, "", b"end"))
            got: list[bytes] = []
            while got.count(b"end") < 2:
                pack = into.consume(timeout=10)
                assert pack is not None
                got += data(pack.messages)
            assert sorted(got) == sorted([b"m%d" % i for i in range(10)] + [b"end", b"end"])
            into.ack(pack)


def test_sync_client_reports_a_dead_address_as_unavailable() -> None:
    with Client("127.0.0.1:1", timeout=2.0) as client, pytest.raises(UnavailableError) as err:
        client.describe_channels()
    assert err.value.retriable
