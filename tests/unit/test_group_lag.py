"""The lag rule of ``streamingnode.node.groups`` over a real WAL: per vchannel, behind its newest message,
exact at 0; the high-water from appends (broadcasts count for every vchannel, other vchannels do not)
and, after a restart, from one read of what follows the groups' positions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from streamingnode.node.groups import ConsumerGroups, lag
from tests.reopening import Opened
from wal import Message, MessageType, Position
from wal.clock import compose


@pytest.fixture
async def opened(tmp_path: Path) -> AsyncIterator[Opened]:
    o = Opened(tmp_path / "db")
    await o.open()
    yield o
    await o.close()


def test_lag_is_zero_at_or_past_the_newest_timetick_and_counts_ids_through_it_otherwise() -> None:
    newest = (20, compose(5_000, 3))
    assert lag(None, 0, 0) == (0, 0), "a vchannel never written: nothing to read"
    assert lag(newest, 21, compose(5_000, 3)) == (0, 0)
    assert lag(newest, 10, compose(6_000)) == (0, 0), "the time says caught up, whatever the id"
    assert lag(newest, 15, compose(4_000)) == (6, 1_000), "ids 15..20, 1 s behind"
    assert lag(newest, 25, compose(5_000, 2)) == (1, 0), "behind by a message of the same millisecond"


async def test_appends_set_the_high_water_of_their_vchannel_and_broadcasts_of_every_one(opened: Opened) -> None:
    swal = opened.swal
    assert swal is not None
    groups = await ConsumerGroups.load(swal.wal)

    async def append(*messages: Message) -> None:
        batch = list(messages)
        await swal.append_batch(batch)
        groups.observe_append(batch, 0.0, None)

    await append(Message(MessageType.DATA, "a", b"1"), Message(MessageType.DATA, "a", b"2"))
    a = groups.newest("a")
    assert a is not None and groups.newest("b") is None
    await append(*(Message(MessageType.DATA, "b", b"x") for _ in range(50)))
    assert groups.newest("a") == a, "another vchannel's writes leave a's high-water alone"
    b = groups.newest("b")
    assert b is not None and b[0] > a[0]
    await append(Message(MessageType.DATA, "a", b"3"), Message(MessageType.DATA, "", b"all"))  # mixed batch
    a2, every = groups.newest("a"), groups.newest("")
    assert a2 is not None and every is not None and a2 == every, "a broadcast is the newest message of a too"
    newest_b = groups.newest("b")
    assert newest_b is not None and newest_b[0] == every[0]
    failed = [Message(MessageType.DATA, "a", b"4")]
    groups.observe_append(failed, 0.0, RuntimeError("refused"))
    assert groups.newest("a") == a2, "a refused batch was not written"

    await groups.create("g")
    await groups.commit("g", [("a", Position(swal.pchannel, a2[0] + 1, a2[1]))])
    assert [(p.lag_messages, p.lag_ms) for p in groups.progress("g")] == [(0, 0)]


async def test_after_a_restart_the_high_water_is_read_back_from_the_groups_oldest_position(opened: Opened) -> None:
    swal = opened.swal
    assert swal is not None
    sent = [await swal.append(Message(MessageType.DATA, "a", b"m%d" % i)) for i in range(10)]
    for _ in range(20):
        await swal.append(Message(MessageType.DATA, "b", b"other"))
    groups = await ConsumerGroups.load(swal.wal)
    await groups.create("g")
    behind = Position(swal.pchannel, sent[6].message_id, sent[5].timetick)
    await groups.commit("g", [("a", behind)])
    assert groups.newest("a") is None, "nothing observed: as after a restart"
    await groups.refresh()
    assert groups.newest("a") == (sent[9].message_id, sent[9].timetick)
    (p,) = groups.progress("g")
    assert p.lag_messages == sent[9].message_id - sent[6].message_id + 1 and p.lag_ms >= 0
    # A seek further back later reads the part not read yet, once.
    await groups.commit("g", [("a", Position(swal.pchannel, sent[0].message_id, sent[0].timetick - 1))])
    await groups.refresh()
    (p,) = groups.progress("g")
    assert p.lag_messages == sent[9].message_id - sent[0].message_id + 1


async def test_the_high_water_of_random_mixed_batches_matches_a_plain_model(opened: Opened) -> None:
    # A seeded walk: batches of several vchannels (broadcasts among them), each message noted against
    # a model that looks at every message in order, as the rule states it.
    import random  # noqa: PLC0415

    swal = opened.swal
    assert swal is not None
    groups = await ConsumerGroups.load(swal.wal)
    rng = random.Random(32)
    model: dict[str, tuple[int, int]] = {}
    for _ in range(40):
        batch = [Message(MessageType.DATA, rng.choice(["a", "b", "c", ""]), b"x") for _ in range(rng.randint(1, 12))]
        await swal.append_batch(batch)
        groups.observe_append(batch, 0.0, None)
        for m in batch:
            assert m.message_id is not None
            old = model.get(m.vchannel)
            new = (m.message_id, m.timetick)
            model[m.vchannel] = new if old is None else (max(old[0], new[0]), max(old[1], new[1]))
        every = model.get("")
        for vchannel in ("a", "b", "c"):
            seen = [p for p in (model.get(vchannel), every) if p is not None]
            want = (max(p[0] for p in seen), max(p[1] for p in seen)) if seen else None
            assert groups.newest(vchannel) == want, vchannel
        assert groups.newest("") == (max(p[0] for p in model.values()), max(p[1] for p in model.values()))
