"""Property: for any log that honours the TimeTick barrier, a scanner delivers exactly the model.

The model: at each tick T, every plain message with previous_tick < ts <= T and every transaction
committed in that window (Begin, bodies, Commit) is released, ordered by (ts, first id); rolled-back
and never-committed transactions are never released.  Resuming from any pack's end position
delivers exactly the rest.
"""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.factories import begin, body, commit, ins, rollback, tick
from wal import Message, MsgPack, ReadOption, WALManager
from wal.backends import MemoryBackend
from wal.resume import resume_after

Op = tuple[str, int, str]  # (kind, txn slot or 0, vchannel)
EXAMPLE_SECONDS = 3.0

ops_strategy = st.lists(
    st.tuples(
        st.sampled_from(["msg", "msg", "tick", "tick", "begin", "body", "commit", "rollback"]),
        st.integers(0, 1),
        st.sampled_from(["a", "b", ""]),
    ),
    max_size=60,
)


def build_log(ops: list[Op], jitter: list[int]) -> tuple[list[Message], list[list[tuple[int, int]]]]:
    """Messages to append, and the model's expected packs as lists of (ts, position in log)."""
    log: list[Message] = []
    last_tick = 0
    used: set[int] = set()
    j = iter(jitter * 100)

    def fresh_ts() -> int:
        ts = last_tick + 1 + next(j)
        while ts in used:
            ts += 1
        used.add(ts)
        return ts

    open_txn: dict[int, tuple[int, str, list[int]]] = {}  # slot -> (txn id, vchannel, log positions)
    next_txn = 1
    waiting: list[tuple[int, int, list[int]]] = []  # (release ts, first pos, positions)
    expected: list[list[tuple[int, int]]] = []
    for kind, slot, vch in ops:
        if kind == "msg":
            ts = fresh_ts()
            waiting.append((ts, len(log), [len(log)]))
            log.append(ins(vch, ts, f"m{len(log)}".encode()))
        elif kind == "begin" and slot not in open_txn:
            txn_vch = vch or "a"  # a transaction lives on one vchannel
            open_txn[slot] = (next_txn, txn_vch, [len(log)])
            log.append(begin(txn_vch, fresh_ts(), next_txn))
            next_txn += 1
        elif kind == "body" and slot in open_txn:
            tid, tv, positions = open_txn[slot]
            positions.append(len(log))
            log.append(body(tv, fresh_ts(), tid, f"b{len(log)}".encode()))
        elif kind == "commit" and slot in open_txn:
            tid, tv, positions = open_txn.pop(slot)
            ts = fresh_ts()
            positions.append(len(log))
            log.append(commit(tv, ts, tid))
            waiting.append((ts, positions[0], positions))
        elif kind == "rollback" and slot in open_txn:
            tid, tv, _ = open_txn.pop(slot)
            log.append(rollback(tv, fresh_ts(), tid))
        elif kind == "tick":
            t = max([last_tick, *used]) + 1
            used.add(t)
            log.append(tick(t))
            ready = sorted(w for w in waiting if w[0] <= t)
            waiting = [w for w in waiting if w[0] > t]
            expected.append([(log[p].timetick, p) for _, _, ps in ready for p in ps])
            last_tick = t
    t = max([last_tick, *used]) + 1
    log.append(tick(t))
    ready = sorted(w for w in waiting if w[0] <= t)
    expected.append([(log[p].timetick, p) for _, _, ps in ready for p in ps])
    return log, expected


async def _scan(ops: list[Op], jitter: list[int], vchannel: str | None, from_storage: bool = False) -> None:
    # from_storage: a one-byte tail buffer keeps nothing, so every read goes through storage, where
    # the scanner takes plain runs between decode marks as slices.
    manager = await WALManager.start(MemoryBackend(), tail_buffer_bytes=1 if from_storage else 64 << 20)
    try:
        await manager.create_channel("p")
        wal = await manager.open("p")
        log, expected = build_log(ops, jitter)
        # Append in a few batches, as producers would.
        for i in range(0, len(log), 7):
            await wal.append_batch(log[i : i + 7])
        end = log[-1].timetick

        def visible(p: int) -> bool:
            return vchannel is None or log[p].vchannel in (vchannel, "")

        want = [[p for _, p in pack if visible(p)] for pack in expected]
        packs: list[MsgPack] = []
        async for pack in wal.read(ReadOption(vchannel=vchannel)):
            packs.append(pack)
            if pack.end_ts >= end:
                break
        got = [[m.message_id for m in pack.messages] for pack in packs]
        assert got == want
        for pack in packs:
            assert all(pack.begin_ts < m.timetick or m.txn for m in pack.messages)
            assert all(m.timetick <= pack.end_ts for m in pack.messages)
        # Resume from every pack's end position: exactly the rest, nothing twice.
        flat_want = [p for pack in want for p in pack]
        done = 0
        for i, pack in enumerate(packs[:-1]):
            done += len(pack.messages)
            pos = pack.end_position
            rest: list[int] = []
            policy, filters = resume_after(pos.message_id, pos.timetick)
            scanner = wal.read(ReadOption(vchannel=vchannel, deliver_policy=policy, deliver_filters=filters))
            async for p2 in scanner:
                rest.extend(m.message_id for m in p2.messages)
                if p2.end_ts >= end:
                    break
            assert flat_want[:done] + rest == flat_want, f"resume after pack {i}"
    finally:
        await manager.aclose()


# No explain phase: it re-runs a failing example about a hundred times, which for a hang is as many
# deadlines (minutes); shrinking is kept.
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink])
@given(ops_strategy, st.lists(st.integers(0, 30), min_size=1, max_size=10), st.sampled_from([None, "a"]),
       st.booleans())
def test_scanner_matches_model(ops: list[Op], jitter: list[int], vchannel: str | None, from_storage: bool) -> None:
    asyncio.run(_scan_within_deadline(ops, jitter, vchannel, from_storage))


async def _scan_within_deadline(ops: list[Op], jitter: list[int], vchannel: str | None, from_storage: bool) -> None:
    # A scanner that misses a tick waits for it forever: the deadline turns that into a failing example
    # (an example takes milliseconds; shrinking a hang costs this much per try).
    try:
        async with asyncio.timeout(EXAMPLE_SECONDS):
            await _scan(ops, jitter, vchannel, from_storage)
    except TimeoutError:
        raise AssertionError(f"no answer within {EXAMPLE_SECONDS} s: the scanner waits for a tick it missed") from None
