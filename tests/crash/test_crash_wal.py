"""Crash tests: SIGKILL a real process that appends under heavy concurrent load, then recover.

``child_appender.py`` appends forever from many tasks and prints one ``ACK`` line per durable message.
After the kill this process reopens the same data directory and checks, through the public Scanner:

* every acknowledged id is there, holding exactly the acknowledged ``(task, seq)`` and its payload,
  byte for byte (the payload is re-derived from the child's seed);
* ids are dense and in submission order (timeticks strictly increase with ids);
* nothing is half-written: every message decodes, no ``(task, seq)`` appears twice, each task's
  messages are a prefix of its sequence ending on a batch boundary (batches are all-or-nothing), at
  most one batch past the last acknowledged one (written, killed before the acknowledgement);
* every open increments the term by exactly one, and messages carry the term of the process that
  wrote them.

The same data directory is reused across trials, so recovery after many crashes is exercised and each
child continues after the recovered last id.  ``STREAMINGNODE_CRASH_TRIALS`` (default 20) sets the number
of trials; ``STREAMINGNODE_CRASH_SEED`` replays a failing run (the seed is in every failure message).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.crash.child_appender import batch_plan, payload_for, vchannel_for
from tests.crash.evidence import stderr_on_failure
from wal import WAL, DeliverPolicy, Message, MessageType, ReadOption, WALManager, new_time_tick

pytestmark = pytest.mark.crash

CHILD = Path(__file__).with_name("child_appender.py")
REPO = Path(__file__).resolve().parents[2]
PCHANNEL = "crash-p"
TRIALS = int(os.environ.get("STREAMINGNODE_CRASH_TRIALS", "20"))
START_TIMEOUT = 60.0
SCAN_TIMEOUT = 120.0


# --- the child process -------------------------------------------------------------------------------
@dataclass
class Run:
    """What one killed child told us before it died."""

    seed: int
    durability: str
    term: int = -1
    start_id: int = -1
    start_ts: int = -1
    ready: bool = False
    acks: list[tuple[int, int, int]] = field(default_factory=list)  # (message_id, task, seq)


class Child:
    def __init__(self, data_dir: Path, durability: str, seed: int, log_dir: Path) -> None:
        self.run = Run(seed, durability)
        self.stderr_path = log_dir / f"child-{seed}.stderr"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(CHILD), str(data_dir), PCHANNEL, durability, str(seed)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, cwd=REPO, env=env,
            )
        self._out = bytearray()
        self._killed = False
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, name=f"child-{seed}-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            self._out += chunk
            if not self._ready.is_set() and b"READY\n" in self._out:
                self._ready.set()
        self._ready.set()  # EOF: wake the waiter, which then sees the child died

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not self._ready.is_set():
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"child did not start within {START_TIMEOUT}s:\n{self.stderr()}")
            await asyncio.sleep(0.002)
        if b"READY\n" not in self._out:
            self.proc.wait()
            raise AssertionError(f"child exited with {self.proc.returncode} before READY:\n{self.stderr()}")

    def kill(self) -> Run:
        """SIGKILL the child and parse every complete line it wrote (a trailing partial line is dropped)."""
        if self._killed:
            return self.run
        self._killed = True
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._reader.join()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        assert self.proc.returncode == -signal.SIGKILL, (
            f"child ended with {self.proc.returncode}, not by our SIGKILL:\n{self.stderr()}"
        )
        run = self.run
        lines = bytes(self._out).split(b"\n")[:-1]
        for line in lines:
            parts = line.split() or [b""]
            if parts[0] == b"ACK" and len(parts) == 4:
                run.acks.append((int(parts[1]), int(parts[2]), int(parts[3])))
            elif parts[0] == b"OPENED" and len(parts) == 4:
                run.term, run.start_id, run.start_ts = (int(p) for p in parts[1:])
            elif parts == [b"READY"]:
                run.ready = True
            else:
                raise AssertionError(f"unexpected line from child: {line!r}")
        return run

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-4000:]


# --- verification ------------------------------------------------------------------------------------
def _id(m: Message) -> int:
    assert m.message_id is not None, f"{m!r} was read without an id"
    return m.message_id


async def _scan(wal_: WAL, start_id: int, end_ts: int) -> list[Message]:
    """Every message from ``start_id`` released by ticks up to the one at ``end_ts``, in id order."""
    scanner = wal_.read(ReadOption(deliver_policy=DeliverPolicy.start_from(start_id)))
    out: list[Message] = []

    async def drain() -> None:
        async for pack in scanner:
            out.extend(pack.messages)
            if pack.end_ts >= end_ts:
                assert pack.end_ts == end_ts, f"pack ends at {pack.end_ts}, past the final tick {end_ts}"
                return

    try:
        await asyncio.wait_for(drain(), SCAN_TIMEOUT)
    finally:
        await scanner.aclose()
    return out  # in delivery order: (ts, id), which is id order here because ts grows with ids


def _batch_ends(seed: int, task: int, upto: int) -> list[int]:
    """Cumulative message counts at the batch boundaries of ``task``: 0, n1, n1+n2, ... past ``upto``."""
    ends = [0]
    for _, n in batch_plan(seed, task):
        if ends[-1] > upto:
            break
        ends.append(ends[-1] + n)
    return ends


def verify_segment(run: Run, msgs: list[Message], end_id: int, ctx: str) -> int:
    """Check the messages with ids ``[run.start_id, end_id)`` written by ``run``; return their last ts."""
    ctx = f"{ctx} (term {run.term}, {run.durability}, child seed {run.seed})"
    ids = [_id(m) for m in msgs]
    if ids != list(range(run.start_id, end_id)):
        if sorted(ids) == list(range(run.start_id, end_id)):
            at = next(i for i, mid in enumerate(ids) if mid != run.start_id + i)
            raise AssertionError(f"{ctx}: messages delivered out of id order at {ids[at - 1 : at + 2]}")
        missing = sorted(set(range(run.start_id, end_id)) - set(ids))[:10]
        extra = sorted(set(ids) - set(range(run.start_id, end_id)))[:10]
        dups = len(ids) - len(set(ids))
        raise AssertionError(
            f"{ctx}: ids are not dense over [{run.start_id}, {end_id}): "
            f"missing {missing}, unexpected {extra}, duplicates {dups}"
        )
    by_id: dict[int, Message] = {}
    present: dict[int, list[int]] = defaultdict(list)
    last_ts = run.start_ts
    for m in msgs:
        mid = _id(m)
        where = f"{ctx}: message {mid}"
        assert m.message_type is MessageType.INSERT, f"{where} has type {m.message_type!r}"
        assert m.wal_term == run.term, f"{where} has term {m.wal_term}, its writer had {run.term}"
        assert set(m.properties) == {"task", "seq"}, f"{where} has properties {m.properties}"
        task, seq = int(m.properties["task"]), int(m.properties["seq"])
        assert m.vchannel == vchannel_for(task), f"{where} is on vchannel {m.vchannel!r}"
        expected = payload_for(run.seed, task, seq)
        if m.payload != expected:
            diff = next((i for i, (x, y) in enumerate(zip(m.payload, expected, strict=False)) if x != y), None)
            raise AssertionError(
                f"{where} (task {task} seq {seq}) has a wrong payload: {len(m.payload)} bytes, "
                f"expected {len(expected)}, first difference at {diff}"
            )
        assert m.timetick > last_ts, f"{where} has timetick {m.timetick} <= {last_ts}: not in submission order"
        last_ts = m.timetick
        by_id[mid] = m
        present[task].append(seq)

    acked: dict[int, list[int]] = defaultdict(list)
    for mid, task, seq in run.acks:
        stored = by_id.get(mid)
        assert stored is not None, f"{ctx}: acknowledged message {mid} (task {task} seq {seq}) is lost"
        got = (stored.properties["task"], stored.properties["seq"])
        assert got == (str(task), str(seq)), f"{ctx}: acknowledged message {mid} is task/seq {got}, not {(task, seq)}"
        acked[task].append(seq)

    for task in set(present) | set(acked):
        seqs, ack = present[task], sorted(acked[task])
        assert seqs == list(range(len(seqs))), (
            f"{ctx}: task {task} stored seqs are not a prefix in order: first gap/repeat near "
            f"{next((i for i, s in enumerate(seqs) if s != i), None)} of {len(seqs)}"
        )
        assert ack == list(range(len(ack))), f"{ctx}: task {task} acknowledged seqs are not a prefix"
        n, a = len(seqs), len(ack)
        ends = _batch_ends(run.seed, task, max(n, a))
        assert n in ends, f"{ctx}: task {task} stored {n} messages, which cuts a batch (boundaries {ends[-4:]})"
        # The first boundary at or past the acknowledged count; the write after it may be durable too.
        b0 = next(e for e in ends if e >= a)
        allowed = {b0}
        if b0 == a and ends.index(b0) + 1 < len(ends):
            allowed.add(ends[ends.index(b0) + 1])
        assert n in allowed, (
            f"{ctx}: task {task} has {n} stored messages for {a} acknowledged; allowed {sorted(allowed)}"
        )
    return last_ts


@dataclass
class Opened:
    manager: WALManager
    wal: WAL
    tick_id: int
    tick_ts: int


async def reopen_and_seal(data_dir: Path, expect_term: int, ctx: str) -> Opened:
    """Open the pchannel in this process and append a tick past everything, which releases it all."""
    manager = await WALManager.start_rocksdb(data_dir)
    try:
        wal_ = await manager.open(PCHANNEL)
        assert wal_.term == expect_term, f"{ctx}: reopened with term {wal_.term}, expected {expect_term}"
        assert wal_.first_id == 0, f"{ctx}: first id is {wal_.first_id}"
        next_id, ts = wal_.next_id, wal_.last_timetick + 1
        r = await wal_.append(new_time_tick(ts))
        assert r.message_id == next_id, f"{ctx}: the tick got id {r.message_id}, next id was {next_id}"
    except BaseException:
        await manager.aclose()
        raise
    return Opened(manager, wal_, r.message_id, ts)


async def verify_all(opened: Opened, segments: list[tuple[Run, int]], ticks: dict[int, int], ctx: str) -> None:
    """One scan of the whole log: every segment and every tick the parent appended, nothing else."""
    msgs = await _scan(opened.wal, 0, opened.tick_ts)
    got = iter(msgs)
    pending: Message | None = next(got, None)
    expect_id = 0
    for run, end_id in segments:
        assert run.start_id >= expect_id, f"{ctx}: segment of term {run.term} overlaps at {run.start_id}"
        for tid in range(expect_id, run.start_id):
            assert tid in ticks, f"{ctx}: id {tid} between segments is not a tick of ours"
        seg: list[Message] = []
        while pending is not None and _id(pending) < end_id:
            seg.append(pending)
            pending = next(got, None)
        verify_segment(run, seg, end_id, f"{ctx} full scan")
        expect_id = end_id
    assert pending is None, f"{ctx}: message {pending.message_id} past the last segment"
    assert expect_id == opened.tick_id, f"{ctx}: segments end at {expect_id}, the final tick is {opened.tick_id}"


# --- the tests ---------------------------------------------------------------------------------------
def _fail_ctx(seed: int, data_dir: Path) -> str:
    return f"STREAMINGNODE_CRASH_SEED={seed}, data dir {data_dir}"


async def test_sigkill_under_load_loses_nothing_acknowledged(tmp_path: Path, crash_seed: int) -> None:
    seed = crash_seed
    rng = random.Random(seed)
    data_dir = tmp_path / "db"
    where = _fail_ctx(seed, data_dir)
    segments: list[tuple[Run, int]] = []
    ticks: dict[int, int] = {}
    term = 0  # the term of the last open of this process (0: the channel does not exist yet)
    acked = 0
    t0 = time.monotonic()
    for trial in range(TRIALS):
        durability = "relaxed" if trial % 4 == 3 else "sync"
        ctx = f"trial {trial}/{TRIALS} [{where}]"
        child = Child(data_dir, durability, rng.randrange(1 << 31), tmp_path)
        try:
            await child.wait_ready()
            await asyncio.sleep(rng.uniform(0.05, 0.6))
        finally:
            run = child.kill()
        assert run.ready, f"{ctx}: no READY line"
        assert run.term == term + 1, f"{ctx}: child opened with term {run.term}, after term {term}"
        if segments:
            assert run.start_id == segments[-1][1] + 1, (
                f"{ctx}: child recovered next id {run.start_id}, expected one past our tick {segments[-1][1]}"
            )
            assert run.start_ts == ticks[segments[-1][1]], f"{ctx}: child recovered last timetick {run.start_ts}"
        else:
            assert (run.start_id, run.start_ts) == (0, 0), f"{ctx}: a new channel is not empty"

        opened = await reopen_and_seal(data_dir, run.term + 1, ctx)
        try:
            msgs = await _scan(opened.wal, run.start_id, opened.tick_ts)
            with stderr_on_failure(child.stderr):
                verify_segment(run, msgs, opened.tick_id, ctx)
            segments.append((run, opened.tick_id))
            ticks[opened.tick_id] = opened.tick_ts
            term = run.term + 1
            acked += len(run.acks)
            if trial == TRIALS - 1:
                await verify_all(opened, segments, ticks, f"after all trials [{where}]")
        finally:
            await opened.manager.aclose()
    elapsed = time.monotonic() - t0
    assert acked, f"nothing was acknowledged before any kill; the test tested nothing [{where}]"
    print(f"{TRIALS} crash trials, {acked} acknowledged messages, {segments[-1][1]} ids, {elapsed:.1f}s")
    shutil.rmtree(data_dir)  # hundreds of MB; kept when the test fails


async def test_rapid_kills_early_in_group_commit(tmp_path: Path, crash_seed: int) -> None:
    """Five children killed 10-50 ms into appending, back to back, with no recovery in between."""
    seed = crash_seed
    rng = random.Random(seed)
    data_dir = tmp_path / "db"
    where = _fail_ctx(seed, data_dir)
    runs: list[Run] = []
    children: list[Child] = []
    for k in range(5):
        durability = "relaxed" if k == 2 else "sync"
        child = Child(data_dir, durability, rng.randrange(1 << 31), tmp_path)
        children.append(child)
        try:
            await child.wait_ready()
            time.sleep(rng.uniform(0.01, 0.05))  # no event-loop round trip: keep the window short
        finally:
            run = child.kill()
        runs.append(run)
        ctx = f"kill {k} [{where}]"
        assert run.term == k + 1, f"{ctx}: child opened with term {run.term}, expected {k + 1}"
        if k:
            assert run.start_id >= runs[k - 1].start_id, f"{ctx}: next id went back to {run.start_id}"
            assert all(mid < run.start_id for mid, _, _ in runs[k - 1].acks), (
                f"{ctx}: recovered next id {run.start_id} is below an id acknowledged by the previous child"
            )

    opened = await reopen_and_seal(data_dir, runs[-1].term + 1, f"recovery [{where}]")
    try:
        ends = [r.start_id for r in runs[1:]] + [opened.tick_id]
        msgs = await _scan(opened.wal, 0, opened.tick_ts)
        for k, (run, end_id) in enumerate(zip(runs, ends, strict=True)):
            seg = [m for m in msgs if run.start_id <= _id(m) < end_id]
            with stderr_on_failure(children[k].stderr):
                last_ts = verify_segment(run, seg, end_id, f"kill {k} [{where}]")
            if k + 1 < len(runs):
                assert runs[k + 1].start_ts == last_ts, (
                    f"kill {k + 1}: child recovered last timetick {runs[k + 1].start_ts}, stored last is {last_ts}"
                )
        assert len(msgs) == opened.tick_id, f"{len(msgs)} messages below the final tick at {opened.tick_id}"
    finally:
        await opened.manager.aclose()
