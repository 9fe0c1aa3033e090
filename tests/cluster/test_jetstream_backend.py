"""The JetStream backend on its own: fencing of an older writer, finding a block in a long stream
without scanning it, writes across a SIGKILLed server of a three-server cluster, and a backend that
fails to open closing the connection it made."""

from __future__ import annotations

import asyncio
import itertools
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import nats.errors
import nats.js.errors
import pytest

from tests.factories import ins
from tests.natscluster import NATS_SERVER, NatsCluster
from tests.waiting import until_sync
from wal._codec import decode_block, encode_block
from wal.backend import TickEntry, WriteGroup
from wal.backends.jetstream import JetStreamBackend
from wal.errors import ChannelFencedError, MessageTooLargeError, UnavailableError, UnrecoverableError

_prefixes = itertools.count(1)


@pytest.fixture
def prefix() -> str:
    return f"b{next(_prefixes)}"


@pytest.fixture
def backends(nats_r1: NatsCluster, prefix: str) -> Iterator[list[JetStreamBackend]]:
    opened: list[JetStreamBackend] = []
    yield opened
    for b in opened:
        b.close()


def _open(opened: list[JetStreamBackend], cluster: NatsCluster, prefix: str, replicas: int = 1) -> JetStreamBackend:
    b = JetStreamBackend(cluster.url, prefix=prefix, replicas=replicas, timeout=2.0)
    opened.append(b)
    return b


def _open_when_answering(opened: list[JetStreamBackend], cluster: NatsCluster, prefix: str,
                         replicas: int) -> JetStreamBackend:
    """``_open`` once the cluster answers: after a server restart its JetStream may still be electing
    (a meta or bucket leader) for seconds on a loaded machine, and opening asks for stream info."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return _open(opened, cluster, prefix, replicas)
        except UnavailableError:
            if time.monotonic() > deadline:
                raise


def _written(opened: list[JetStreamBackend], cluster: NatsCluster, prefix: str, blocks: int, n: int) -> int:
    """Pchannel "p" with ``blocks`` blocks of ``n`` messages (ids from 0), written by a backend of its
    own; returns the channel's key (a reader opened after it has learnt nothing of the stream)."""
    writer = _open(opened, cluster, prefix)
    key = writer.create_channel("p", {}).key
    writer.open_channel("p")
    for k in range(blocks):
        writer.write([_group(key, n * k, n=n)], durable=True)
    return key


def _group(key: int, first: int, n: int = 2, ts: int | None = None) -> WriteGroup:
    """A block of ``n`` messages with ids from ``first`` and timestamps 10 * id + 1, one tick at its end."""
    base = 10 * first if ts is None else ts
    msgs = [ins("v", base + 10 * i + 1, f"m{first + i}".encode()) for i in range(n)]
    block = encode_block(msgs)
    last_ts = base + 10 * (n - 1) + 1
    return WriteGroup(key, first, block, [TickEntry(last_ts + 1, first + n - 1, first + n)], last_ts + 1)


def _ids(blocks: list[tuple[int, bytes]]) -> list[int]:
    return [m.message_id for first, block in blocks for m in decode_block(block, first)]


def test_an_older_writer_is_fenced_and_nothing_of_it_is_stored(
        nats_r1: NatsCluster, backends: list[JetStreamBackend], prefix: str) -> None:
    old = _open(backends, nats_r1, prefix)
    key = old.create_channel("p", {}).key
    assert old.open_channel("p").term == 1
    old.write([_group(key, 0)], durable=True)
    new = _open(backends, nats_r1, prefix)  # another node takes the pchannel over
    info = new.open_channel("p")
    assert (info.term, info.next_id) == (2, 2)
    with pytest.raises(ChannelFencedError, match="fenced") as caught:
        old.write([_group(key, 2)], durable=True)
    assert caught.value.fields["term"] == 1
    assert new.describe_channel("p").next_id == 2  # nothing of the fenced write
    new.write([_group(key, 2)], durable=True)
    assert _ids(new.read_blocks(key, 0, 1 << 20)) == [0, 1, 2, 3]
    with pytest.raises(ChannelFencedError):  # and it stays fenced
        old.write([_group(key, 4)], durable=True)


def test_a_read_from_the_middle_of_a_long_stream_does_not_scan_it(
        nats_r1: NatsCluster, backends: list[JetStreamBackend], prefix: str) -> None:
    key = _written(backends, nats_r1, prefix, 300, 2)
    reader = _open(backends, nats_r1, prefix)  # a new instance: nothing learnt yet
    got = reader.read_blocks(key, 301, 1)  # in the block [300, 301]
    assert _ids(got) == [300, 301]
    assert reader.direct_gets <= 12, reader.direct_gets  # ~log2(301) probes and the block, not 150 gets
    gets = reader.direct_gets
    entry = reader.seek_time(key, 2005)  # ticks at 20k + 12 for the block with first id 2k
    assert entry is not None and (entry.timetick, entry.message_id) == (1992, 199)
    assert reader.direct_gets - gets <= 12, reader.direct_gets - gets


def test_a_catch_up_read_asks_for_many_blocks_per_request(
        nats_r1: NatsCluster, backends: list[JetStreamBackend], prefix: str) -> None:
    # A log of small blocks (one message each: a paced producer) read from earliest by a node that
    # did not write it (after a takeover): one request per block made that read a round trip per
    # message.  Batched direct gets answer many blocks per request.
    blocks = 600
    key = _written(backends, nats_r1, prefix, blocks, 1)
    reader = _open(backends, nats_r1, prefix)
    got = reader.read_blocks(key, 0, 1 << 30)
    assert _ids(got) == list(range(blocks))
    asked = reader.direct_gets + reader.batch_gets
    # ~log2(600) probes to find where id 0 is, then batches of 1, 2, 4 ... 256 blocks: not 600 gets.
    assert asked <= 24, (reader.direct_gets, reader.batch_gets)
    # A read bounded in bytes stops there and the next one goes on from where it stopped.
    reader2 = _open(backends, nats_r1, prefix)
    part = reader2.read_blocks(key, 100, 50 * len(got[0][1]))
    assert _ids(part) == list(range(100, 100 + len(part))) and 40 <= len(part) <= 50, len(part)


def test_a_catch_up_read_over_deleted_messages_returns_the_rest_in_order(
        nats_r1: NatsCluster, backends: list[JetStreamBackend], prefix: str) -> None:
    # A batch skips what is gone from the stream; each skipped sequence is asked alone (a follower
    # that lags skips nothing: it ends the batch early) and found gone, so the read goes on past it.
    key = _written(backends, nats_r1, prefix, 40, 1)
    asyncio.run(_delete_blocks(nats_r1, f"SN_{prefix}_{key}", {10, 11, 25}))
    reader = _open(backends, nats_r1, prefix)
    assert _ids(reader.read_blocks(key, 0, 1 << 30)) == [i for i in range(40) if i not in (10, 11, 25)]


async def _delete_blocks(cluster: NatsCluster, stream: str, first_ids: set[int]) -> None:
    """Delete from ``stream`` the blocks whose first id is in ``first_ids``."""
    nc = await nats.connect(cluster.url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(stream, seq)
            if int((msg.headers or {}).get("Sn-First", -1)) in first_ids and "Sn-Fence" not in (msg.headers or {}):
                await js.delete_msg(stream, seq)
    finally:
        await nc.close()


def test_a_backend_that_fails_to_open_closes_its_connection(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A server without JetStream takes the connection and then answers no request: the backend
    # connects, fails on its buckets, and must not leave the connection's socket behind (it outlived
    # the backend's loop, and surfaced later as an unclosed transport in whatever ran next).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "plain.log", "ab")  # noqa: SIM115  (the child keeps it)
    server = subprocess.Popen([str(NATS_SERVER), "-a", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    log.close()
    clients: list[Any] = []
    real_connect = nats.connect

    async def recording_connect(*args: Any, **kwargs: Any) -> Any:
        nc = await real_connect(*args, **kwargs)
        clients.append(nc)
        return nc

    def answering() -> bool:
        with socket.socket() as c:
            return c.connect_ex(("127.0.0.1", port)) == 0

    try:
        until_sync(answering, "a plain NATS server")
        monkeypatch.setattr(nats, "connect", recording_connect)
        with pytest.raises(UnavailableError, match="NATS"):
            JetStreamBackend(f"nats://127.0.0.1:{port}", prefix="plain", timeout=1.0)
        assert len(clients) == 1, clients
        assert clients[0].is_closed
    finally:
        server.terminate()
        server.wait(60)


def test_writes_survive_a_sigkilled_server_of_an_r3_cluster(tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.cluster.conftest import start_cluster  # noqa: PLC0415

    cluster = start_cluster(tmp_path_factory.mktemp("nats3kill"), 3)
    opened: list[JetStreamBackend] = []
    try:
        writer = _open(opened, cluster, "k", replicas=3)
        key = writer.create_channel("p", {}).key
        writer.open_channel("p")
        acked: list[int] = []
        refused: list[UnavailableError] = []

        def write(first: int) -> None:
            deadline = time.monotonic() + 60
            while True:  # what the redo step does: the same block again until it is acknowledged
                try:
                    writer.write([_group(key, first)], durable=True)
                    acked.append(first)
                    return
                except UnavailableError as exc:
                    refused.append(exc)
                    if time.monotonic() > deadline:
                        raise

        for k in range(20):
            write(2 * k)
        leader = writer._call(writer._js.stream_info(writer._stream(key)), what="test").cluster.leader
        cluster.kill(int(leader[1:]))
        for k in range(20, 40):
            write(2 * k)
        cluster.start(int(leader[1:]))
        asyncio.run(cluster.ready())
        reader = _open_when_answering(opened, cluster, "k", replicas=3)
        assert _ids(reader.read_blocks(key, 0, 1 << 30)) == list(range(80))
        assert acked == [2 * k for k in range(40)]
        # The outage was seen: publishes were asked again (an election) or writes refused (retriable).
        assert refused or writer.retries
        assert reader.describe_channel("p").next_id == 80
    finally:
        for b in opened:
            b.close()
        cluster.stop()


def test_a_block_stored_by_a_write_reported_failed_is_never_stored_twice(
        nats_r1: NatsCluster, backends: list[JetStreamBackend], prefix: str) -> None:
    # A write spans two pchannels; one is fenced, so the write fails and the WAL hands every id back,
    # though the other pchannel's block is stored (a write is atomic per pchannel only).
    b = _open(backends, nats_r1, prefix)
    ka, kb = b.create_channel("a", {}).key, b.create_channel("b", {}).key
    b.open_channel("a")
    b.open_channel("b")
    _open(backends, nats_r1, prefix).open_channel("b")  # another node takes b
    with pytest.raises(ChannelFencedError):
        b.write([_group(ka, 0), _group(kb, 0)], durable=True)
    assert b.describe_channel("a").next_id == 2
    other = WriteGroup(ka, 0, encode_block([ins("v", 5, b"other")]), [], 5)
    with pytest.raises(UnrecoverableError, match="reopen"):  # the log holds ids 0-1 already: not these
        b.write([other], durable=True)
    b.write([_group(ka, 0)], durable=True)  # the same block again: already there, not stored twice
    b.write([_group(ka, 2)], durable=True)
    assert _ids(b.read_blocks(ka, 0, 1 << 20)) == [0, 1, 2, 3]
    assert b.describe_channel("a").next_id == 4


def test_a_block_over_the_servers_max_payload_is_refused_and_writes_go_on(
        nats_r1: NatsCluster, backends: list[JetStreamBackend], prefix: str) -> None:
    b = _open(backends, nats_r1, prefix)
    key = b.create_channel("p", {}).key
    b.open_channel("p")
    huge = WriteGroup(key, 0, encode_block([ins("v", 1, b"x" * (9 << 20))]), [], 1)  # servers take 8 MB
    with pytest.raises(MessageTooLargeError, match="max_payload"):
        b.write([huge], durable=True)
    assert b.describe_channel("p").next_id == 0
    b.write([_group(key, 0)], durable=True)
    assert _ids(b.read_blocks(key, 0, 1 << 20)) == [0, 1]


def test_an_older_writers_metadata_and_truncation_are_fenced(
        nats_r1: NatsCluster, backends: list[JetStreamBackend], prefix: str) -> None:
    # A stale owner woken after a takeover must not move the new owner's flusher checkpoint, consumer
    # groups or truncation mark: its put_meta is refused once a newer term opened the pchannel.
    old = _open(backends, nats_r1, prefix)
    key = old.create_channel("p", {}).key
    old.open_channel("p")
    for k in range(3):
        old.write([_group(key, 2 * k)], durable=True)
    old.put_meta(key, "flusher_checkpoint", b"old-before")  # before the takeover: it counts
    new = _open(backends, nats_r1, prefix)
    assert new.open_channel("p").term == 2
    assert new.get_meta(key, "flusher_checkpoint") == b"old-before"
    with pytest.raises(ChannelFencedError, match="fenced") as caught:
        old.put_meta(key, "flusher_checkpoint", b"old-after")
    assert caught.value.fields["term"] == 1
    with pytest.raises(ChannelFencedError):  # a truncation stores its mark first: refused, nothing purged
        old.truncate(key, 4)
    assert new.get_meta(key, "flusher_checkpoint") == b"old-before"
    assert _ids(new.read_blocks(key, 0, 1 << 20)) == [0, 1, 2, 3, 4, 5]
    new.put_meta(key, "flusher_checkpoint", b"new")  # the owner's own metadata goes on
    assert new.truncate(key, 4) == 4
    assert new.get_meta(key, "flusher_checkpoint") == b"new"
    # And again at the next takeover: the newest term's writer is the only one whose metadata lands.
    third = _open(backends, nats_r1, prefix)
    assert third.open_channel("p").term == 3
    with pytest.raises(ChannelFencedError):
        new.put_meta(key, "flusher_checkpoint", b"stale")
    third.put_meta(key, "flusher_checkpoint", b"third")
    assert third.get_meta(key, "flusher_checkpoint") == b"third"


def _lose_answers(b: JetStreamBackend, subject_part: str, before: Callable[[], None] | None = None,
                  store: bool = True, on_retry: Callable[[], None] | None = None, land_late: bool = False) -> list[str]:
    """Make ``b``'s next publish to a subject containing ``subject_part`` lose its answer, as when a
    stream leader dies before answering: ``before`` runs first (in a thread: it may call another
    backend), the publish is sent (``store``) or not, and the client's timeout is raised.  At the next
    such publish (the retry) ``on_retry`` runs first, and with ``land_late`` the lost publish lands
    just then, as a slow leader's would."""
    real = b._js.publish
    lost: list[str] = []
    first: list[tuple[str, bytes, dict[str, Any]]] = []

    async def publish(subject: str, payload: bytes = b"", **kwargs: Any) -> Any:
        if subject_part in subject and not lost:
            lost.append(subject)
            first.append((subject, payload, kwargs))
            if before is not None:
                await asyncio.to_thread(before)
            if store:
                await real(subject, payload, **kwargs)
            raise nats.errors.TimeoutError
        if subject_part in subject and len(lost) == 1:
            lost.append(subject)
            if on_retry is not None:
                await asyncio.to_thread(on_retry)
            if land_late:
                subject0, payload0, kwargs0 = first[0]
                await real(subject0, payload0, **kwargs0)
        return await real(subject, payload, **kwargs)

    b._js.publish = publish  # type: ignore[method-assign]
    return lost


def test_a_block_publish_whose_answer_is_lost_is_asked_again_and_stored_once(
        nats_r1: NatsCluster, backends: list[JetStreamBackend], prefix: str) -> None:
    # A stream leader that dies after storing a block but before answering: the backend asks again,
    # finds its own block stored (the repeat is refused as out of sequence) and goes on, instead of
    # failing the write and waiting for the next one to sort it out.
    b = _open(backends, nats_r1, prefix)
    key = b.create_channel("p", {}).key
    b.open_channel("p")
    b.write([_group(key, 0)], durable=True)
    lost = _lose_answers(b, f".{key}")
    b.write([_group(key, 2), _group(key, 4)], durable=True)
    assert lost and b.retries >= 1
    # Not stored when the stream is checked, but landing late, just before the repeat: the repeat is
    # refused as out of sequence, and the stream shows the block that moved it on is ours.
    lost = _lose_answers(b, f".{key}", store=False, land_late=True)
    b.write([_group(key, 6)], durable=True)
    assert len(lost) == 2
    b.write([_group(key, 8)], durable=True)
    assert _ids(b.read_blocks(key, 0, 1 << 20)) == list(range(10))  # each block once, in order


def test_a_block_publish_lost_unstored_then_fenced_is_fenced_on_its_retry(
        nats_r1: NatsCluster, backends: list[JetStreamBackend], prefix: str) -> None:
    # The answer is lost and nothing was stored; the stream is checked (nothing there), and just
    # before the repeat another node takes the pchannel over.  The repeat is refused as out of
    # sequence, the stream is checked again and holds the new owner's fence marker, not our block:
    # fenced, and nothing of the write is stored.
    b = _open(backends, nats_r1, prefix)
    key = b.create_channel("p", {}).key
    b.open_channel("p")
    b.write([_group(key, 0)], durable=True)
    new = _open(backends, nats_r1, prefix)
    lost = _lose_answers(b, f".{key}", store=False, on_retry=lambda: new.open_channel("p") and None)
    with pytest.raises(ChannelFencedError, match="fenced"):
        b.write([_group(key, 2)], durable=True)
    assert len(lost) == 2  # refused at the repeat, after the stream was checked
    assert new.describe_channel("p").next_id == 2
    new.write([_group(key, 2)], durable=True)
    assert _ids(new.read_blocks(key, 0, 1 << 20)) == [0, 1, 2, 3]


def test_a_metadata_put_whose_answer_is_lost_is_asked_again_and_stays_fenced(
        nats_r1: NatsCluster, backends: list[JetStreamBackend], prefix: str) -> None:
    b = _open(backends, nats_r1, prefix)
    key = b.create_channel("p", {}).key
    b.open_channel("p")
    lost = _lose_answers(b, "_meta.")  # stored, answer lost: asked again, the same value
    b.put_meta(key, "ts_window_end", b"one")
    assert lost and b.get_meta(key, "ts_window_end") == b"one"
    # Lost before it was stored while a newer owner claimed the pchannel: the repeat carries the same
    # claim check, so it is refused, and the newer owner's value stays.
    new = _open(backends, nats_r1, prefix)

    def take_over() -> None:
        new.open_channel("p")
        new.put_meta(key, "ts_window_end", b"new")

    _lose_answers(b, "_meta.", before=take_over, store=False)
    with pytest.raises(ChannelFencedError, match="fenced"):
        b.put_meta(key, "ts_window_end", b"stale")
    assert new.get_meta(key, "ts_window_end") == b"new"


def test_a_stale_writers_metadata_is_fenced_on_a_replicated_log_too(
        nats_r3: NatsCluster, backends: list[JetStreamBackend], prefix: str) -> None:
    # On an R3 stream the server words a failed expected-last-subject-sequence check with another
    # err_code (10164, "wrong last sequence") than on R1 (10071): both are the fence, CHANNEL_FENCED,
    # never an UNRECOVERABLE refusal that would fail a stale owner's clients with the wrong code.
    old = _open(backends, nats_r3, prefix, replicas=3)
    key = old.create_channel("p", {}).key
    old.open_channel("p")
    old.write([_group(key, 0)], durable=True)
    old.put_meta(key, "consumer_groups", b"old-before")
    new = _open(backends, nats_r3, prefix, replicas=3)
    assert new.open_channel("p").term == 2
    with pytest.raises(ChannelFencedError, match="fenced"):
        old.put_meta(key, "consumer_groups", b"old-after")
    with pytest.raises(ChannelFencedError):
        old.write([_group(key, 2)], durable=True)
    assert new.get_meta(key, "consumer_groups") == b"old-before"


@pytest.mark.parametrize("err_code", [10071, 10164])
def test_either_wording_of_a_wrong_last_sequence_is_the_fence(
        nats_r1: NatsCluster, backends: list[JetStreamBackend], prefix: str, err_code: int) -> None:
    # nats-server refuses a failed expected-last-sequence check with err_code 10071 ("wrong last
    # sequence: N") or 10164 ("wrong last sequence", its constant form, met on a replicated log under
    # faults): a metadata put refused either way is fenced, not an UNRECOVERABLE refusal.
    b = _open(backends, nats_r1, prefix)
    key = b.create_channel("p", {}).key
    b.open_channel("p")
    real = b._js.publish

    async def refused(subject: str, *args: object, **kwargs: object) -> object:
        if subject.startswith(f"$KV.{prefix}_meta."):
            raise nats.js.errors.BadRequestError(code=400, err_code=err_code, description="wrong last sequence")
        return await real(subject, *args, **kwargs)
    b._js.publish = refused
    with pytest.raises(ChannelFencedError, match="fenced"):
        b.put_meta(key, "consumer_groups", b"stale")
