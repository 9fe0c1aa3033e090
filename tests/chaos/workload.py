"""The chaos workload: runs in the client namespace as its own process, through the public SDK only,
and writes every operation it tries into the run's history (``ops.jsonl``; format in README.md).

    python -m tests.chaos.workload setup RUN_DIR --seeds A,B,C --pchannels c0,c1,c2
    python -m tests.chaos.workload run RUN_DIR --seeds ... --pchannels ... --seed N   (until SIGTERM)
    python -m tests.chaos.workload read RUN_DIR --node NAME=ADDR ... --pchannels ...
    python -m tests.chaos.workload probe ADDR PCHANNEL

``run`` keeps, per pchannel: one idempotent producer shared by a few sender processes (sends invoked in
order: the invoke line is written and the message queued in one step), a transaction loop (commit or
roll back, at random), and a consumer group that commits what it read and is reopened now and then (the
resume is recorded with the first ids it delivers).  A send with no answer within ``OP_TIMEOUT`` is an
``info`` (unknown), never a ``fail``: it may still be written.  ``read`` is the final read after heal:
every pchannel from earliest, through a client whose only seed is that node.  ``probe`` asks one node
directly (no routing) for a pchannel's latest position and prints the gRPC status it answered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

from streamingnode.client import (
    AsyncClient,
    ChannelExistError,
    ConsumerGroupExistError,
    DeliverPolicy,
    MessageType,
    OutOfRangeError,
    Producer,
    UnavailableError,
)
from tests.chaos.history import Writer

OP_TIMEOUT = 30.0
"""Seconds an operation may take before its outcome is recorded as unknown (faults last up to ~20 s)."""
RECONNECT_TIMEOUT = 45.0
READ_TIMEOUT = float(os.environ.get("CHAOS_READ_TIMEOUT") or 1800)
"""Seconds one final read of one pchannel may take (a 30-minute run's log reads back slowly)."""
PACE = float(os.environ.get("CHAOS_PACE") or 1.0)
"""Multiplies each sender's pause between sends: above 1, a long run writes a log it can read back."""
SENDERS = 3
VCHANNELS = ("v0", "v1")


def _payload(chaos_id: str) -> bytes:
    return json.dumps({"id": chaos_id}).encode()


class _Rollback(Exception):
    """Raised inside a transaction block to roll it back."""


class Workload:
    def __init__(self, client: AsyncClient, hist: Writer, pchannels: list[str], seed: int) -> None:
        self.client, self.h, self.pchannels = client, hist, pchannels
        self.rng = random.Random(seed)
        self.stop = asyncio.Event()
        self._ids = itertools.count()
        self._producers: dict[str, Producer] = {}
        self._producer_lock = asyncio.Lock()

    def next_id(self, kind: str = "m") -> str:
        return f"{kind}{next(self._ids)}"

    async def producer(self, pch: str) -> Producer:
        """The pchannel's idempotent producer; made again (same id: the node fences the old epoch) when
        the last one closed after a failure."""
        async with self._producer_lock:
            prod = self._producers.get(pch)
            if prod is None or prod.closed or prod.draining:
                if prod is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(prod.aclose(), 5)
                prod = self.client.producer(pch, producer_id=f"prod-{pch}", linger=0.005)
                await prod.__aenter__()
                self._producers[pch] = prod
            return prod

    async def _pause(self, low: float, high: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), self.rng.uniform(low, high))

    # --- idempotent producers -----------------------------------------------------------------------
    async def sender(self, pch: str) -> None:
        proc = self.h.fresh()
        while not self.stop.is_set():
            try:
                prod = await asyncio.wait_for(self.producer(pch), OP_TIMEOUT)
            except Exception:
                await self._pause(0.5, 1.0)
                continue
            vch = self.rng.choice(VCHANNELS)
            cid = self.next_id()
            value = {"pchannel": pch, "vchannel": vch, "producer": f"prod-{pch}", "id": cid}
            self.h.write(proc, "invoke", "send", value)
            try:
                fut = prod.send_nowait(vch, _payload(cid), properties={"chaos_id": cid})
            except Exception as exc:
                self.h.write(proc, "fail", "send", {**value, "error": repr(exc)})
                await self._pause(0.2, 0.5)
                continue
            try:
                result = await asyncio.wait_for(asyncio.shield(fut), OP_TIMEOUT)
            except BaseException as exc:
                self.h.write(proc, "info", "send", {**value, "error": repr(exc)})
                proc = self.h.fresh()
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            self.h.write(proc, "ok", "send", {**value, "message_id": str(result.message_id)})
            await self._pause(0.01 * PACE, 0.05 * PACE)

    # --- transactions -------------------------------------------------------------------------------
    async def transactions(self, pch: str) -> None:
        proc = self.h.fresh()
        while not self.stop.is_set():
            await self._pause(0.2, 0.6)
            vch = self.rng.choice(VCHANNELS)
            key = self.next_id("t")
            ids = [f"{key}-{k}" for k in range(self.rng.randint(1, 4))]
            decision = self.rng.choice(("commit", "commit", "rollback"))
            value = {"pchannel": pch, "vchannel": vch, "txn": key, "ids": ids, "decision": decision}
            self.h.write(proc, "invoke", "txn", value)
            deciding = False
            try:
                async with asyncio.timeout(OP_TIMEOUT), self.client.txn(pch, vch) as tx:
                    for cid in ids:
                        await tx.send(_payload(cid), properties={"chaos_id": cid, "chaos_txn": key})
                    deciding = True
                    if decision == "rollback":
                        raise _Rollback
            except _Rollback:
                self.h.write(proc, "ok", "txn", value)
            except Exception as exc:
                # Before the commit was sent nothing can become visible (the body is rolled back or
                # expires); a failed commit or rollback call leaves a commit unknown.
                if decision == "commit" and deciding:
                    self.h.write(proc, "info", "txn", {**value, "error": repr(exc)})
                    proc = self.h.fresh()
                else:
                    self.h.write(proc, "fail", "txn", {**value, "error": repr(exc)})
            else:
                self.h.write(proc, "ok", "txn", value)

    # --- consumer groups ----------------------------------------------------------------------------
    async def group(self, pch: str) -> None:
        group, vch = f"g-{pch}", VCHANNELS[0]
        base = {"pchannel": pch, "vchannel": vch, "group": group}
        while not self.stop.is_set():
            proc = self.h.fresh()
            self.h.write(proc, "invoke", "group_resume", base)
            try:
                async with asyncio.timeout(OP_TIMEOUT):
                    [desc] = await self.client.describe_groups(pch, [group])
                    committed = desc.committed(vch)
                    consumer = self.client.consumer(pch, vch, group=group)
                    await consumer.__aenter__()
            except Exception as exc:
                self.h.write(proc, "info", "group_resume", {**base, "error": repr(exc)})
                await self._pause(1, 2)
                continue
            try:
                await self._consume(proc, consumer, base, committed)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(consumer.aclose(), 5)
            await self._pause(0.5, 1.5)

    async def _consume(self, proc: str, consumer: Any, base: dict[str, Any], committed: Any) -> None:
        """Record the resume (first ids delivered), then commit pack by pack for a while."""
        first: list[str] = []
        resumed = False
        commits = self.rng.randint(5, 40)
        packs = aiter(consumer)
        while not self.stop.is_set() and commits > 0:
            try:
                pack = await asyncio.wait_for(anext(packs), 3.0 if not resumed else OP_TIMEOUT)
            except TimeoutError:
                if not resumed:  # nothing new to deliver: the resume is what was seen so far
                    resumed = True
                    self._resumed(proc, base, committed, first)
                    continue
                # Waiting for the next pack is no operation of the history (the last commit ended
                # ok): the group is closed and reopened, with no line for the wait.
                return
            except Exception as exc:
                if not resumed:
                    self.h.write(proc, "info", "group_resume", {**base, "error": repr(exc)})
                return
            ours = [m for m in pack.messages if m.message_type is MessageType.DATA and "chaos_id" in m.properties]
            if not resumed:
                first.extend(m.properties["chaos_id"] for m in ours)
                if len(first) >= 100:
                    resumed = True
                    self._resumed(proc, base, committed, first[:100])
            if not ours or not resumed:
                continue
            value = {**base, "position": str(ours[-1].message_id)}
            self.h.write(proc, "invoke", "group_commit", value)
            try:
                await asyncio.wait_for(consumer.ack(pack), OP_TIMEOUT)
            except Exception as exc:
                self.h.write(proc, "info", "group_commit", {**value, "error": repr(exc)})
                return
            self.h.write(proc, "ok", "group_commit", value)
            commits -= 1
        if not resumed:
            self._resumed(proc, base, committed, first[:100])

    def _resumed(self, proc: str, base: dict[str, Any], committed: Any, first: list[str]) -> None:
        self.h.write(proc, "ok", "group_resume", {
            **base, "position": None if committed is None else str(committed.message_id),
            "committed_timetick": None if committed is None else committed.timetick, "first_ids": first})

    async def run(self) -> None:
        tasks = [asyncio.create_task(self.sender(p)) for p in self.pchannels for _ in range(SENDERS)]
        tasks += [asyncio.create_task(self.transactions(p)) for p in self.pchannels]
        tasks += [asyncio.create_task(self.group(p)) for p in self.pchannels]
        await self.stop.wait()
        # Let every operation in flight end (each is bounded by OP_TIMEOUT), then close the producers.
        await asyncio.wait(tasks, timeout=OP_TIMEOUT + 10)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for prod in self._producers.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(prod.aclose(), 10)


async def _setup(args: argparse.Namespace) -> None:
    async with AsyncClient(args.seeds.split(","), timeout=30) as client:
        pchannels = args.pchannels.split(",")
        with contextlib.suppress(ChannelExistError):
            await client.create_channels(pchannels)
        for pch in pchannels:
            for _ in range(60):
                try:
                    await client.latest_position(pch)
                    break
                except Exception:
                    await asyncio.sleep(0.5)
            with contextlib.suppress(ConsumerGroupExistError):
                await client.create_group(pch, f"g-{pch}")


async def _run(args: argparse.Namespace) -> None:
    hist = Writer(Path(args.run_dir) / "ops.jsonl")
    async with AsyncClient(args.seeds.split(","), timeout=10, reconnect_timeout=RECONNECT_TIMEOUT) as client:
        work = Workload(client, hist, args.pchannels.split(","), args.seed)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, work.stop.set)
        loop.add_signal_handler(signal.SIGINT, work.stop.set)
        await work.run()
    hist.close()


async def _read_one(address: str, pch: str, out: Path) -> int:
    """Every chaos message of ``pch`` from earliest, through a client seeded with ``address`` only."""
    async with AsyncClient(address, timeout=30) as client:
        last, _ = await client.latest_position(pch)
        n = 0
        with open(out, "w") as f:
            if last is None:
                return 0
            async with client.consumer(pch, policy=DeliverPolicy.all()) as consumer:
                async for pack in consumer:
                    for m in pack.messages:
                        cid = m.properties.get("chaos_id")
                        if m.message_type is MessageType.DATA and cid is not None:
                            f.write(json.dumps({"vchannel": m.vchannel, "id": cid, "txn": m.properties.get("chaos_txn"),
                                                "term": m.wal_term, "message_id": str(m.message_id),
                                                "timetick": m.timetick}) + "\n")
                            n += 1
                    if pack.end_ts >= last.timetick:
                        break
        return n


async def _read(args: argparse.Namespace) -> None:
    """Every (node, pchannel) read at once: a long run's log takes a while to read back, and the reads
    wait on the network more than on this process."""

    async def one(name: str, address: str, pch: str) -> None:
        out = Path(args.run_dir) / "reads" / name / f"{pch}.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READ_TIMEOUT
        while True:
            # After the heal a pchannel may still be opening at its new owner (a loaded host, a node
            # whose clock was skewed): UNAVAILABLE, which the client stops retrying after its own
            # timeout.  The read starts over (its file too) until READ_TIMEOUT.
            try:
                n = await asyncio.wait_for(_read_one(address, pch, out), max(deadline - loop.time(), 1.0))
                break
            except UnavailableError:
                if loop.time() >= deadline:
                    raise
                await asyncio.sleep(1.0)
            except OutOfRangeError as exc:
                # The node says part of the log is gone (JetStream lost a stream's messages after its
                # files were damaged on more than one server): what was read stays, the error is kept
                # beside it, and the checker judges the read as it is (what is missing, is missing).
                (out.parent / f"{pch}.error").write_text(f"{type(exc).__name__}: {exc}\n")
                print(f"{name} {pch} failed: {exc}", flush=True)
                return
        print(f"{name} {pch} {n}", flush=True)

    specs = [spec.split("=", 1) for spec in args.node]
    await asyncio.gather(*(one(name, address, pch) for name, address in specs for pch in args.pchannels.split(",")))


async def _probe(args: argparse.Namespace) -> None:
    import grpc  # noqa: PLC0415

    from streamingnode.v1 import streaming_pb2, streaming_pb2_grpc  # noqa: PLC0415

    async with grpc.aio.insecure_channel(args.address) as channel:
        stub = streaming_pb2_grpc.StreamingNodeStub(channel)
        try:
            await stub.GetLatestPosition(streaming_pb2.GetLatestPositionRequest(pchannel=args.pchannel), timeout=5)
            print("OK")
        except grpc.aio.AioRpcError as exc:
            print(exc.code().name, exc.details())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.workload")
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("setup", "run", "read"):
        p = sub.add_parser(name)
        p.add_argument("run_dir")
        p.add_argument("--seeds", default="")
        p.add_argument("--pchannels", required=True)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--node", action="append", default=[])
    p = sub.add_parser("probe")
    p.add_argument("address")
    p.add_argument("pchannel")
    args = parser.parse_args(argv)
    asyncio.run({"setup": _setup, "run": _run, "read": _read, "probe": _probe}[args.cmd](args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
