"""The dedup step's producer table: epochs, next sequences, digests, its bound, and a random walk of
opens, appends (new, resent, changed, skipping) and restarts against a plain model."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from interceptors.dedup import (
    EPOCH_META,
    PRODUCER_CLAIM,
    PROP_PRODUCER,
    PROP_SEQUENCE,
    DedupInterceptor,
    content_digest,
    epoch_bucket,
)
from tests.seeds import draw_seed
from wal.errors import (
    DuplicateSequenceMismatchError,
    InvalidArgumentError,
    OutOfOrderSequenceError,
    OutOfRangeError,
    ProducerFencedError,
    StreamingError,
)
from wal.message import AppendResult, Message, MessageType


class MetaStore:
    """The pchannel metadata the epochs are kept in (a WAL's put_meta/get_meta)."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.puts = 0

    async def put_meta(self, name: str, value: bytes) -> None:
        self.puts += 1
        self.values[name] = value

    async def get_meta(self, name: str) -> bytes | None:
        return self.values.get(name)


class Log:
    """The chain after dedup: gives ids, keeps every written message (what a restart replays)."""

    def __init__(self) -> None:
        self.stored: list[Message] = []

    async def __call__(self, batch: list[Message]) -> list[AppendResult]:
        out = []
        for m in batch:
            m._seal(len(self.stored))
            self.stored.append(m)
            out.append(AppendResult(m._id, 1000 + m._id, None))  # type: ignore[arg-type]
        return out

    def restarted(self, step: DedupInterceptor) -> None:
        step.replay(list(self.stored))


def msg(pid: str, seq: int, payload: bytes, vchannel: str = "v", **props: str) -> Message:
    return Message(MessageType.DATA, vchannel, payload, {**props, PROP_PRODUCER: pid, PROP_SEQUENCE: str(seq)})


async def append(step: DedupInterceptor, log: Log, claim: tuple[str, int] | None,
                 batch: list[Message]) -> list[AppendResult]:
    async def run() -> list[AppendResult]:
        PRODUCER_CLAIM.set(claim)
        return await step.do_append(batch, log)
    return await asyncio.create_task(run())  # its own context, as a stream's reader task has


# --- hand-picked cases -----------------------------------------------------------------------------
async def test_every_open_without_an_epoch_bumps_it_and_a_reconnect_keeps_it() -> None:
    store = MetaStore()
    step = DedupInterceptor(store=store)
    assert await step.open_producer("p", None) == (1, 0)
    assert await step.open_producer("p", 1) == (1, 0)
    assert store.puts == 1, "a reconnect with the current epoch writes nothing"
    assert await step.open_producer("p", None) == (2, 0)
    with pytest.raises(ProducerFencedError) as fenced:
        await step.open_producer("p", 1)
    assert fenced.value.fields == {"producer_id": "p", "epoch": 1, "current_epoch": 2}
    with pytest.raises(ProducerFencedError):
        await step.open_producer("p", 7)  # an epoch the node never handed out
    with pytest.raises(InvalidArgumentError, match="producer_epoch"):
        await step.open_producer("p", 0)


async def test_a_batch_of_an_older_epoch_is_fenced_in_the_chain_and_writes_nothing() -> None:
    step = DedupInterceptor(store=MetaStore())
    log = Log()
    await step.open_producer("p", None)
    await append(step, log, ("p", 1), [msg("p", 0, b"a")])
    assert await step.open_producer("p", None) == (2, 1)
    with pytest.raises(ProducerFencedError, match="nothing of the batch was written"):
        await append(step, log, ("p", 1), [msg("p", 1, b"zombie")])
    await append(step, log, ("p", 2), [msg("p", 1, b"b")])
    assert [m.payload for m in log.stored] == [b"a", b"b"]


async def test_epochs_and_the_next_sequence_survive_a_restart() -> None:
    store = MetaStore()
    log = Log()
    step = DedupInterceptor(store=store)
    await step.open_producer("p", None)
    await append(step, log, ("p", 1), [msg("p", i, b"%d" % i) for i in range(5)])
    await step.open_producer("p", None)  # epoch 2: opened, nothing written under it
    restarted = DedupInterceptor(store=store)
    log.restarted(restarted)
    with pytest.raises(ProducerFencedError):
        await restarted.open_producer("p", 1)
    assert await restarted.open_producer("p", 2) == (2, 5)
    assert await restarted.open_producer("p", None) == (3, 5)
    assert await restarted.open_producer("other", None) == (1, 0)


async def test_digests_and_high_water_survive_a_snapshot() -> None:
    log = Log()
    step = DedupInterceptor(store=MetaStore())
    await append(step, log, None, [msg("p", 0, b"a"), msg("p", 1, b"b", k="v")])
    imported = DedupInterceptor(store=MetaStore())
    imported.import_state(step.export_state())
    assert await imported.open_producer("p", None) == (1, 2)
    with pytest.raises(DuplicateSequenceMismatchError):
        await append(imported, log, None, [msg("p", 1, b"b")])  # the property is part of the digest
    again = await append(imported, log, None, [msg("p", 0, b"a"), msg("p", 1, b"b", k="v")])
    assert [r.message_id for r in again] == [0, 1] and len(log.stored) == 2
    # A snapshot written before digests: resends are answered as they were (unchecked).
    old = step.export_state()
    for _, _, results in old["producers"]:
        for entry in results:
            del entry[4]
    legacy = DedupInterceptor()
    legacy.import_state(old)
    assert [r.message_id for r in await append(legacy, log, None, [msg("p", 0, b"other")])] == [0]


def test_the_digest_covers_type_vchannel_payload_and_properties_but_not_the_stamps() -> None:
    base = content_digest(msg("p", 0, b"x", k="v"))
    assert content_digest(msg("other", 9, b"x", k="v")) == base
    for changed in (msg("p", 0, b"y", k="v"), msg("p", 0, b"x", "w", k="v"), msg("p", 0, b"x", k="w"),
                    msg("p", 0, b"x", k="v", j="v"), msg("p", 0, b"x"),
                    Message(MessageType.INSERT, "v", b"x", {"k": "v", PROP_PRODUCER: "p", PROP_SEQUENCE: "0"})):
        assert content_digest(changed) != base
    # Keys and values are length-prefixed: moving a character across the boundary changes the digest.
    assert content_digest(msg("p", 0, b"x", ab="c")) != content_digest(msg("p", 0, b"x", a="bc"))


async def test_the_table_holds_max_producers_and_forgets_the_least_recently_used_whole() -> None:
    store = MetaStore()
    log = Log()
    step = DedupInterceptor(max_producers=3, store=store)
    for pid in ("a", "b", "c"):
        await step.open_producer(pid, None)
        await append(step, log, (pid, 1), [msg(pid, 0, pid.encode())])
    await append(step, log, ("a", 1), [msg("a", 1, b"a1")])  # "b" is now the least recently used
    assert await step.open_producer("d", None) == (1, 0)
    assert list(step._producers) == ["c", "a", "d"]
    # "b" is forgotten whole: its window (a resend is written again) and its epoch (its open stream's
    # epoch is taken as current again; a new open starts over at 1).
    await append(step, log, ("b", 1), [msg("b", 0, b"b")])
    assert [m.payload for m in log.stored].count(b"b") == 2
    assert step.epoch("b") == 1
    # Its bucket is rewritten without it at the bucket's next write, so a restart does not bring it back.
    bucket = EPOCH_META.format(epoch_bucket("b"))
    assert b'"b"' in store.values[bucket]


async def test_opens_of_many_producers_each_write_one_small_bucket() -> None:
    store = MetaStore()
    step = DedupInterceptor(store=store)
    for i in range(640):
        await step.open_producer(f"producer-{i}", None)
    assert store.puts == 640
    assert max(len(v) for v in store.values.values()) < 640 * 25 / 64 * 3, "a bump rewrites one bucket only"


# --- the random walk -------------------------------------------------------------------------------
@dataclass
class ModelProducer:
    epoch: int = 0
    written: dict[int, tuple[bytes, int]] = field(default_factory=dict)  # seq -> (content, id)
    order: list[int] = field(default_factory=list)  # seqs in the order they were written
    admitted: int = -1


class Model:
    """What the table must answer, written plainly: one ordered list of written sequences per producer."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.producers: dict[str, ModelProducer] = {}
        self.next_id = 0

    def producer(self, pid: str) -> ModelProducer:
        return self.producers.setdefault(pid, ModelProducer())

    def open(self, pid: str, epoch: int | None) -> tuple[int, int] | type[StreamingError]:
        p = self.producer(pid)
        if epoch is None:
            p.epoch += 1
        elif epoch != p.epoch and p.epoch != 0:
            return ProducerFencedError
        else:
            p.epoch = epoch
        top = max([p.admitted, *p.written])
        return p.epoch, top + 1

    def remembered(self, p: ModelProducer) -> list[int]:
        return p.order[-self.window:]

    def append(self, claim: tuple[str, int], batch: list[tuple[int, bytes]]) -> list[int] | type[StreamingError]:
        pid, epoch = claim
        p = self.producer(pid)
        if p.epoch > epoch:
            return ProducerFencedError
        known = self.remembered(p)
        top = p.admitted
        fresh: list[tuple[int, bytes]] = []
        for seq, content in batch:
            if seq in known:
                if p.written[seq][0] != content:
                    return DuplicateSequenceMismatchError
            elif known and seq <= max(p.written) and seq < known[0]:
                return OutOfRangeError
            else:
                if top >= 0 and seq > top + 1:
                    return OutOfOrderSequenceError
                top = max(top, seq)
                fresh.append((seq, content))
        p.admitted = top
        p.epoch = max(p.epoch, epoch)
        out = []
        for seq, content in batch:
            if (seq, content) in fresh:
                p.written[seq] = (content, self.next_id)
                if seq in p.order:
                    p.order.remove(seq)
                p.order.append(seq)
                self.next_id += 1
            out.append(p.written[seq][1])
        return out

    def restart(self) -> None:
        for p in self.producers.values():
            p.admitted = -1


async def test_random_walk_against_a_plain_model(record_property: Callable[[str, object], None]) -> None:
    seed = draw_seed("STREAMINGNODE_PRODUCER_TABLE_SEED", record_property, "producer table seed")
    rng = random.Random(seed)
    window = 6
    model = Model(window)
    store = MetaStore()
    log = Log()
    step = DedupInterceptor(window=window, store=store)
    instances: list[tuple[str, int, int]] = []  # (pid, epoch, next sequence it would use)
    connected: set[int] = set()  # instances whose stream outlived the last restart
    content_of: dict[tuple[str, int], bytes] = {}
    outcomes: dict[str, int] = {}
    for n in range(1500):
        op = rng.random()
        if op < 0.12 or not instances:
            pid = rng.choice("ab")
            held = [e for p, e, _ in instances if p == pid]
            presented = rng.choice([None, *held]) if held and rng.random() < 0.5 else None
            want = model.open(pid, presented)
            try:
                got: object = await step.open_producer(pid, presented)
            except StreamingError as exc:
                got = type(exc)
            assert got == want, f"step {n}: open {pid} presenting {presented}"
            if isinstance(want, tuple):
                instances.append((pid, want[0], want[1]))
                connected.add(len(instances) - 1)
            outcomes["open"] = outcomes.get("open", 0) + 1
        elif op < 0.15:
            step = DedupInterceptor(window=window, store=store)
            log.restarted(step)
            model.restart()
            connected.clear()
            outcomes["restart"] = outcomes.get("restart", 0) + 1
        else:
            i = rng.randrange(len(instances))
            pid, epoch, nxt = instances[i]
            if i not in connected:  # its stream died with the node: it reconnects presenting its epoch
                want = model.open(pid, epoch)
                try:
                    got = await step.open_producer(pid, epoch)
                except StreamingError as exc:
                    got = type(exc)
                assert got == want, f"step {n}: reconnect of {pid}@{epoch}"
                if not isinstance(want, tuple):
                    continue
                connected.add(i)
            kind = rng.random()
            if kind < 0.55:
                first = nxt  # the instance goes on
            elif kind < 0.85:
                first = max(0, nxt - rng.randint(1, window + 3))  # a resend, maybe older than the window
            else:
                first = nxt + rng.randint(1, 3)  # skips ahead
            count = rng.randint(1, 3)
            batch: list[tuple[int, bytes]] = []
            for seq in range(first, first + count):
                content = content_of.get((pid, seq)) or b"%s-%d-%d" % (pid.encode(), seq, n)
                if rng.random() < 0.1:
                    content = b"changed-%d" % n
                batch.append((seq, content))
            want_ids = model.append((pid, epoch), batch)
            try:
                results = await append(step, log, (pid, epoch), [msg(pid, s, c) for s, c in batch])
                got = [r.message_id for r in results]
            except StreamingError as exc:
                got = type(exc)
            assert got == want_ids, f"step {n}: {pid}@{epoch} appends {batch}"
            if isinstance(want_ids, list):
                for seq, content in batch:
                    content_of.setdefault((pid, seq), content)
                instances[i] = (pid, epoch, max(nxt, first + count))
                outcomes["written"] = outcomes.get("written", 0) + 1
            else:
                outcomes[want_ids.__name__] = outcomes.get(want_ids.__name__, 0) + 1
    assert len(log.stored) == model.next_id
    for name in ("open", "restart", "written", "ProducerFencedError", "DuplicateSequenceMismatchError",
                 "OutOfOrderSequenceError", "OutOfRangeError"):
        assert outcomes.get(name, 0) > 0, f"the walk never reached {name}: {outcomes}"


async def test_a_changed_resend_of_a_sequence_in_flight_is_refused() -> None:
    step = DedupInterceptor()
    gate = asyncio.Event()
    log = Log()

    async def slow(batch: list[Message]) -> list[AppendResult]:
        await gate.wait()
        return await log(batch)

    original = asyncio.ensure_future(step.do_append([msg("p", 0, b"a")], slow))
    await asyncio.sleep(0)
    # Refused at once, not made to wait for the original (which would then answer it as a resend).
    changed = asyncio.ensure_future(step.do_append([msg("p", 0, b"changed")], slow))
    for _ in range(5):
        await asyncio.sleep(0)
    assert changed.done() and isinstance(changed.exception(), DuplicateSequenceMismatchError)
    same = asyncio.ensure_future(step.do_append([msg("p", 0, b"a")], slow))
    await asyncio.sleep(0)
    gate.set()
    assert await original == await same and len(log.stored) == 1


def test_a_row_message_digests_alike_before_and_after_the_shard_step_stamped_it() -> None:
    """The shard step adds segment, rows and (when none was named) the default partition to an
    INSERT; replay digests the stored form, the chain the produced one: they must agree."""
    from wal import bodies  # noqa: PLC0415

    produced = Message(MessageType.INSERT, "v", b"rows", {"collection": "c", PROP_PRODUCER: "p", PROP_SEQUENCE: "0"})
    stored = Message(MessageType.INSERT, "v", b"rows", {
        "collection": "c", PROP_PRODUCER: "p", PROP_SEQUENCE: "0", bodies.PROP_PARTITION: bodies.DEFAULT_PARTITION,
        bodies.PROP_SEGMENT: "3", bodies.PROP_ROWS: "10"})
    assert content_digest(produced) == content_digest(stored)
    other_partition = Message(MessageType.INSERT, "v", b"rows", {
        "collection": "c", PROP_PRODUCER: "p", PROP_SEQUENCE: "0", bodies.PROP_PARTITION: "p1"})
    assert content_digest(other_partition) != content_digest(produced)
    # On a DATA message "rows" is the producer's own property, and counts.
    data = Message(MessageType.DATA, "v", b"x", {"rows": "1", PROP_PRODUCER: "p", PROP_SEQUENCE: "0"})
    assert content_digest(data) != content_digest(msg("p", 0, b"x"))


async def test_unreadable_stored_epochs_refuse_the_open_instead_of_forgetting_them() -> None:
    from wal.errors import CorruptedError  # noqa: PLC0415

    store = MetaStore()
    store.values[EPOCH_META.format(epoch_bucket("p"))] = b"{not json"
    with pytest.raises(CorruptedError, match="unreadable"):
        await DedupInterceptor(store=store).open_producer("p", None)


async def test_a_replay_digests_only_what_it_still_remembers_and_lets_the_messages_go() -> None:
    log = Log()
    live = DedupInterceptor(window=3)
    await append(live, log, None, [msg("p", i, b"%d" % i) for i in range(10)])
    replayed = DedupInterceptor(window=3)
    log.restarted(replayed)
    held = [d for _, d in replayed._producers["p"].results.values()]
    assert len(held) == 3 and all(isinstance(d, Message) for d in held), "digested lazily"
    # What it remembers digests as the live step did: a changed resend is refused, the same one answered.
    with pytest.raises(DuplicateSequenceMismatchError):
        await append(replayed, log, None, [msg("p", 8, b"other")])
    assert [r.message_id for r in await append(replayed, log, None, [msg("p", 9, b"9")])] == [9]
    await replayed.recovered()
    assert [d for _, d in replayed._producers["p"].results.values()] == [
        d for _, d in live._producers["p"].results.values()]
