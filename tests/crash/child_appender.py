"""A child process for the crash tests: appends to a RocksDB WAL forever until it is SIGKILLed.

Usage::

    python tests/crash/child_appender.py <data_dir> <pchannel> <sync|relaxed> <seed> [tasks]

Everything it appends can be re-derived by the parent from ``(seed, task, seq)`` (see ``payload_for``
and ``batch_plan``), so the parent can check the recovered log byte for byte without any other channel
of information than this process's stdout, which carries one line per event:

    OPENED <term> <next_id> <last_timetick>   the pchannel is open (appending starts right after)
    READY                                     the appending tasks are scheduled
    ACK <message_id> <task> <seq>             one line per acknowledged (durable) message

Each batch's ACK lines go out in a single ``os.write`` so that lines of concurrent tasks never
interleave; a pipe write of up to PIPE_BUF bytes is atomic, and larger ones are only ever cut by the
kill, which leaves a trailing partial line the parent ignores.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import random
import sys
from collections.abc import Iterator

TASKS = 32
MAX_BATCH = 50
MAX_PAYLOAD = 4096
VCHANNELS = 4


def payload_for(seed: int, task: int, seq: int) -> bytes:
    """The exact payload of message ``seq`` of ``task`` in the run with ``seed`` (0..4096 bytes)."""
    key = f"{seed}:{task}:{seq}".encode()
    size = int.from_bytes(hashlib.sha256(key).digest()[:4], "big") % (MAX_PAYLOAD + 1)
    return hashlib.shake_256(key).digest(size) if size else b""


def batch_plan(seed: int, task: int) -> Iterator[tuple[bool, int]]:
    """The calls ``task`` makes, in order: ``(single, n)`` — ``wal.append`` if single, else an
    ``append_batch`` of ``n`` messages (1..50).  Deterministic, so the parent knows batch boundaries."""
    rng = random.Random(f"plan:{seed}:{task}")
    while True:
        if rng.random() < 0.3:
            yield True, 1
        else:
            yield False, rng.randint(1, MAX_BATCH)


def vchannel_for(task: int) -> str:
    return f"v{task % VCHANNELS}"


def _emit(data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(1, view)
        view = view[n:]


async def _main(data_dir: str, pchannel: str, durability_name: str, seed: int, tasks: int) -> None:
    import structlog  # noqa: PLC0415

    # Logs go to stderr: stdout is the protocol channel to the parent.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    from wal import ChannelExistError, Durability, Message, MessageType, WALManager  # noqa: PLC0415

    durability = {"sync": Durability.SYNC, "relaxed": Durability.RELAXED}[durability_name]
    manager = await WALManager.start_rocksdb(data_dir, durability=durability)
    with contextlib.suppress(ChannelExistError):
        await manager.create_channel(pchannel)
    wal = await manager.open(pchannel)
    _emit(f"OPENED {wal.term} {wal.next_id} {wal.last_timetick}\n".encode())

    clock = wal.last_timetick  # timeticks strictly increase, also across restarts

    async def run(task: int) -> None:
        nonlocal clock
        vch = vchannel_for(task)
        seq = 0
        for single, n in batch_plan(seed, task):
            msgs = []
            for i in range(n):
                s = seq + i
                msgs.append(
                    Message(
                        MessageType.INSERT, vch, payload_for(seed, task, s),
                        {"task": str(task), "seq": str(s)},
                    )
                )
            # Stamp the timeticks right before submitting, with no await in between, so that
            # timetick order is submission order.
            for m in msgs:
                clock += 1
                m.with_timetick(clock)
            if single:
                results = [await wal.append(msgs[0])]
            else:
                results = await wal.append_batch(msgs)
            _emit(
                "".join(f"ACK {r.message_id} {task} {seq + i}\n" for i, r in enumerate(results)).encode()
            )
            seq += n

    workers = [asyncio.create_task(run(t), name=f"appender-{t}") for t in range(tasks)]
    _emit(b"READY\n")
    await asyncio.gather(*workers)  # forever, until the parent kills this process


def main(argv: list[str]) -> int:
    if len(argv) not in (5, 6):
        print(__doc__, file=sys.stderr)
        return 2
    data_dir, pchannel, durability, seed = argv[1], argv[2], argv[3], int(argv[4])
    tasks = int(argv[5]) if len(argv) == 6 else TASKS
    asyncio.run(_main(data_dir, pchannel, durability, seed, tasks))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
