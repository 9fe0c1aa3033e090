"""Instructions per appended message through the chain and the RocksDB WAL, counted by callgrind.

    .venv/bin/python bench/append_instructions.py                 # measure and print
    .venv/bin/python bench/append_instructions.py --check         # fail (exit 1) over the budget
    .venv/bin/python bench/append_instructions.py --write-budget  # store the figures as the budget

Timed figures drift by ±20% on a shared host; instruction counts do not: the same interpreter and
libraries doing the same work execute the same instructions, whatever else runs on the machine.  This
benchmark re-runs itself under ``valgrind --tool=callgrind --instr-atstart=no``.  The child builds
the real chain in process (``WALManager.start_rocksdb``, Durability.RELAXED, ``open_streaming_wal``:
dedup → lock → shard → timetick → redo → txn → ``WAL.append_batch`` → group commit → RocksDB),
appends a warm-up uninstrumented, then counts, between two Valgrind client requests
(``bench/_callgrind.py``), the instructions of every thread while one task appends:

* **b100**: ``--messages`` (20,000) DATA messages of ``--size`` (1 KiB) in batches of 100, each batch
  awaited before the next (one batch per commit: the count does not depend on thread timing);
* **b1**: ``--messages // 10`` lone messages, one ``append`` each (the lone-message path).

Payloads are fixed bytes, vchannels ``v0``..``v3``; the relaxed sync, the tick beat, the timestamp
window and the age-seal check are set hours apart, so none falls inside the region (each is a cost
per interval, not per message, and would make the count depend on how long the run took); the
memtables hold everything appended, so RocksDB flushes and compacts nothing in the process (its own
threads' work per byte, the same for any tree of ours, and timed by them, not by the appends).  What is
counted: the chain, the adaptor, StreamingWAL, the committer, the codec, the writer thread and
RocksDB's own write (no fsync), the event loop between them.  What is not: gRPC and the produce
stream (``bench/produce_consume.py`` measures those end to end).

The budget (``bench/append_budget.json``) holds instructions per message for each case; ``--check``
fails when a case exceeds its budget by more than its tolerance there: 10% for b100, which repeats
to within 0.1%; 20% for b1, whose count moves by up to about 5% between runs on a loaded host (a lone
write runs on the loop or on the writer thread depending on what else is ready at that moment).  Counts depend on the
interpreter, the rocksdict/RocksDB build and Valgrind: refresh the budget on purpose, on the machine
kind CI runs on (bench/README.md says how).  ``--inner`` is the child's entry point.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
BUDGET = _HERE / "append_budget.json"
CASES = ("b100", "b1")
VCHANNELS = ("v0", "v1", "v2", "v3")
_HOURS = 3600.0


# --- the child: the measured process ---------------------------------------------------------------
async def _measure(path: str, messages: int, size: int, warmup: int, requests: object) -> None:
    from interceptors.recovery.streaming_wal import ChainConfig, open_streaming_wal  # noqa: PLC0415
    from wal import Message, MessageType, WALManager  # noqa: PLC0415
    from wal.backend import Durability  # noqa: PLC0415

    memtables = {}
    if "write_buffer_bytes" in inspect.signature(WALManager.start_rocksdb).parameters:
        # Memtables larger than everything appended: no flush to a table file and no compaction in the
        # measured process.  Those run on RocksDB's own threads, cost the same per byte whichever tree
        # appends, and would make the count depend on whether a flush started inside the region and
        # how far it got (trees before the memory settings had 64 MiB memtables: none flushed either).
        memtables["write_buffer_bytes"] = 256 << 20
    manager = await WALManager.start_rocksdb(path, durability=Durability.RELAXED, relaxed_sync_interval=_HOURS,
                                             **memtables)
    try:
        committer = manager._committer
        if hasattr(committer, "inline_max_seconds"):
            # A lone write runs on the loop while writes have been fast; under Valgrind every write is
            # slow, so fix the limits to the fast disk's decision (as the tests do): the count must not
            # depend on how long a write took.
            committer.inline_max_seconds = committer.inline_idle_max_seconds = _HOURS
        await manager.create_channel("p")
        config = ChainConfig(tick_interval=_HOURS, ts_window_ms=int(_HOURS * 1000),
                             seal_check_interval=_HOURS)
        swal = await open_streaming_wal(manager, "p", config)
        try:
            await swal.ready()
            payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
            data = MessageType.DATA

            def batch_of(start: int, n: int) -> list[Message]:
                return [Message(data, VCHANNELS[k & 3], payload) for k in range(start, start + n)]

            async def bulk(n: int) -> None:
                for start in range(0, n, 100):
                    await swal.append_batch(batch_of(start, min(100, n - start)))

            async def lone(n: int) -> None:
                for k in range(n):
                    await swal.append(Message(data, VCHANNELS[k & 3], payload))

            for case, run, n in (("b100", bulk, messages), ("b1", lone, max(messages // 10, 1))):
                await run(warmup)  # caches, first allocations, the interpreter's specialisation
                gc.collect()
                requests.start()  # type: ignore[attr-defined]
                await run(n)
                requests.stop(f"{case} {n}")  # type: ignore[attr-defined]
        finally:
            await swal.aclose()
    finally:
        await manager.aclose()


def _inner(args: argparse.Namespace) -> int:
    from _callgrind import ClientRequests  # noqa: PLC0415

    requests = ClientRequests()
    if not requests.running_on_valgrind:
        print("--inner runs under callgrind only (run the benchmark without --inner)", file=sys.stderr)
        return 2
    import logging  # noqa: PLC0415

    import structlog  # noqa: PLC0415

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    gc.set_threshold(100_000, 50, 100)  # the node's settings (streamingnode/node/gc_tuning.py)
    path = tempfile.mkdtemp(prefix="append-instr-", dir=args.dir)
    try:
        asyncio.run(_measure(path, args.messages, args.size, args.warmup, requests))
    finally:
        shutil.rmtree(path, ignore_errors=True)
    return 0


# --- the parent: runs the child under callgrind, reads the dumps -----------------------------------
def count(messages: int, size: int, warmup: int, root: Path | None = None, python: str | None = None,
          tmp: str | None = None) -> dict[str, float]:
    """Instructions per message for each case, from one callgrind run of the tree at ``root`` (default
    this one) with ``python`` (default this interpreter)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise RuntimeError("valgrind is not installed (Debian: apt-get install valgrind)")
    root = root or _HERE.parent
    out = tempfile.mkdtemp(prefix="append-instr-out-", dir=tmp)
    try:
        env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=str(root))
        cmd = [
            valgrind, "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}/cg.out",
            python or sys.executable, str(Path(__file__).resolve()), "--inner",
            "--messages", str(messages), "--size", str(size), "--warmup", str(warmup),
        ]
        if tmp:
            cmd += ["--dir", tmp]
        proc = subprocess.run(cmd, env=env, cwd=str(root), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"the callgrind run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}")
        result: dict[str, float] = {}
        for dump in sorted(Path(out).glob("cg.out.*")):
            text = dump.read_text(errors="replace")
            # "desc: Trigger: Client Request: b100 20000", and the part's own cost (not "totals:", which
            # callgrind keeps summing over the parts of one run).
            trigger = re.search(r"^desc: Trigger: Client Request: (b100|b1) (\d+)\s*$", text, re.M)
            total = re.search(r"^summary: (\d+)", text, re.M)
            if trigger and total:
                result[trigger.group(1)] = int(total.group(1)) / int(trigger.group(2))
        missing = [c for c in CASES if c not in result]
        if missing:
            raise RuntimeError(f"no callgrind dump for {missing} in {out}: {sorted(os.listdir(out))}")
        return result
    finally:
        shutil.rmtree(out, ignore_errors=True)


def count_node(messages: int, size: int, warmup: int, root: Path | None = None, tmp: str | None = None,
               keep: str | None = None, consume: bool = False) -> float:
    """Instructions of a whole node process per message (gRPC, the produce stream, the chain, the WAL,
    the flusher and the periodic snapshot's shadow replay), the node under callgrind and the SDK
    (native, in this process) producing ``messages`` as a bulk producer does: batches of up to 1 MiB.
    Collection is switched on and read out from outside with ``callgrind_control``.

    ``consume``: count a catch-up consume instead.  ``warmup`` + ``messages`` are produced uncounted,
    a first consumer reads ``warmup`` of them (uncounted), then a second one reads all of them from the
    start (counted: the scanner's reads and decoding, the Consume stream's packs and their encoding)."""
    import asyncio as aio  # noqa: PLC0415
    import signal  # noqa: PLC0415
    import time  # noqa: PLC0415

    root = root or _HERE.parent
    sys.path.insert(0, str(root))
    from streamingnode import client as sdk  # noqa: PLC0415

    work = tempfile.mkdtemp(prefix="node-instr-", dir=tmp)
    log_path = os.path.join(work, "node.log")
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONHASHSEED="0", GRPC_VERBOSITY="ERROR",
               # Memtables larger than the run, as in process (no flush counted); older trees ignore it.
               STREAMINGNODE_ROCKSDB_WRITE_BUFFER_BYTES=str(256 << 20))
    if consume:
        # No tick beat: the stored ticks (which cut the log into packs) would depend on how long the
        # slowed produce took.  The consumer's open asks for the tick that releases what is stored.
        env["STREAMINGNODE_TICK_INTERVAL"] = "3600"
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={work}/cg.out",
            sys.executable, "-m", "streamingnode", "serve", "--data-dir", os.path.join(work, "data"),
            "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--channels", "p",
            "--log-level", "warning"]
    with open(log_path, "w+") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(root))
        try:
            addr = None
            deadline = time.monotonic() + 900
            while addr is None and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.5)
                log.seek(0)
                found = re.search(r"streamingnode serving on (\S+)", log.read())
                addr = found.group(1) if found else None
            if addr is None:
                log.seek(0)
                raise RuntimeError(f"the node under callgrind did not start:\n{log.read()[-3000:]}")

            async def produce(n: int) -> None:
                c = sdk.AsyncClient(addr)
                try:
                    producer = c.producer("p", linger=0.005, max_batch_bytes=1 << 20)
                    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
                    futures = [producer.send_nowait("v", payload) for _ in range(n)]
                    await producer.flush()
                    for f in futures:
                        f.result()
                    await producer.aclose()
                finally:
                    await c.aclose()

            async def read_all(n: int) -> None:
                c = sdk.AsyncClient(addr)
                try:
                    seen = 0
                    kinds = getattr(sdk, "DeliverPolicy", None)
                    if kinds is None:  # trees whose SDK did not re-export it
                        from wal.options import DeliverPolicy as kinds  # noqa: PLC0415
                    types = getattr(sdk, "MessageType", None)
                    if types is None:
                        from wal.message import MessageType as types  # noqa: PLC0415
                    data = types.DATA
                    async with c.consumer("p", vchannel="", policy=kinds.all()) as consumer:
                        async for pack in consumer:
                            seen += sum(1 for m in pack.messages if m.message_type is data)
                            if seen >= n:
                                break
                finally:
                    await c.aclose()

            def control(*a: str) -> None:
                subprocess.run(["callgrind_control", *a, str(proc.pid)], capture_output=True, check=True,
                               timeout=600)

            if consume:
                aio.run(produce(warmup + messages))
                aio.run(read_all(warmup))
                control("-i", "on")
                control("-z")
                aio.run(read_all(warmup + messages))
                control("-d", "node")
                messages += warmup
            else:
                aio.run(produce(warmup))
                control("-i", "on")
                control("-z")
                aio.run(produce(messages))
                control("-d", "node")
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(300)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    try:
        for dump in Path(work).glob("cg.out.*"):
            text = dump.read_text(errors="replace")
            total = re.search(r"^summary: (\d+)", text, re.M)
            if "Trigger: Client Request" not in text and total is not None:
                if keep:
                    shutil.copyfile(dump, keep)
                return int(total.group(1)) / messages
        raise RuntimeError(f"no callgrind dump of the node in {work}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--messages", type=int, default=20_000, help="messages of the batch-100 case (default 20,000)")
    p.add_argument("--size", type=int, default=1024, help="payload bytes (default 1024)")
    p.add_argument("--warmup", type=int, default=2_000, help="uncounted messages before each case (default 2,000)")
    p.add_argument("--dir", default=None, help="parent of the temporary database (default: system temp)")
    p.add_argument("--check", action="store_true", help="exit 1 when a case is over its budget by > --tolerance")
    p.add_argument("--tolerance", type=float, default=None, help="allowed growth over the budget for every case "
                   "(default: the budget file's, per case)")
    p.add_argument("--write-budget", action="store_true", help=f"store the figures in {BUDGET.name}")
    p.add_argument("--root", default=None, help="measure the tree at ROOT (its wal/ and interceptors/)")
    p.add_argument("--node", action="store_true", help="also count a whole node's instructions per message "
                   "(the node under callgrind, the SDK producing; a few minutes)")
    p.add_argument("--node-consume", action="store_true",
                   help="count a whole node's instructions per message of a catch-up consume instead (the "
                        "in-process cases are skipped; a few minutes)")
    p.add_argument("--keep-node-dump", default=None, metavar="FILE",
                   help="with --node: copy the node's callgrind dump to FILE (for callgrind_annotate)")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if min(args.messages, args.size) < 1 or args.warmup < 0:
        p.error("--messages and --size must be >= 1, --warmup >= 0")
    if args.messages % 100:
        p.error("--messages must be a multiple of 100 (whole batches)")
    if args.inner:
        return _inner(args)

    root = Path(args.root).resolve() if args.root else None
    if args.node_consume:
        per = count_node(args.messages, args.size, args.warmup, root=root, tmp=args.dir, keep=args.keep_node_dump,
                         consume=True)
        print(f"catch-up consume, whole node: {per:,.0f} instructions per message"
              f"{'' if root is None else f' ({root})'}")
        return 0
    figures = count(args.messages, args.size, args.warmup, root=root, tmp=args.dir)
    cases = list(CASES)
    if args.node:
        figures["node"] = count_node(args.messages, args.size, args.warmup, root=root, tmp=args.dir,
                                     keep=args.keep_node_dump)
        cases.append("node")
    budget = json.loads(BUDGET.read_text()) if BUDGET.exists() else None
    tolerances = {c: args.tolerance if args.tolerance is not None else (budget or {}).get("tolerance", {}).get(c, 0.10)
                  for c in cases}
    over = []
    print(f"append_instructions: {args.size} B DATA messages through the chain and the RocksDB WAL "
          f"(relaxed durability), instructions per message under callgrind{'' if root is None else f' ({root})'}")
    for case in cases:
        line = f"  {case:<5} {figures[case]:>10,.0f}"
        allowed = (budget or {}).get("instructions_per_message", {}).get(case)
        if allowed is not None:
            ratio = figures[case] / allowed
            line += f"   budget {allowed:>10,.0f}   ratio {ratio:.3f}"
            if ratio > 1 + tolerances[case]:
                over.append(case)
                line += f"   OVER (> {1 + tolerances[case]:.2f})"
        print(line)
    if args.write_budget:
        BUDGET.write_text(json.dumps({
            "instructions_per_message": {**(budget or {}).get("instructions_per_message", {}),
                                         **{c: round(figures[c]) for c in cases}},
            "tolerance": {**(budget or {}).get("tolerance", {}), **tolerances},
            "measured_with": {"messages": args.messages, "size": args.size, "warmup": args.warmup,
                              "python": sys.version.split()[0],
                              "valgrind": subprocess.run(["valgrind", "--version"], capture_output=True,
                                                         text=True, check=False).stdout.strip()},
        }, indent=2) + "\n")
        print(f"budget written to {BUDGET}")
    if args.check:
        if budget is None:
            print(f"no budget file {BUDGET}", file=sys.stderr)
            return 1
        if over:
            print(f"perf-check FAILED: {', '.join(f'{c} by more than {tolerances[c]:.0%}' for c in over)} over "
                  f"budget (if intended, refresh the budget: see bench/README.md)", file=sys.stderr)
            return 1
        print("perf-check passed (" + ", ".join(f"{c} within {tolerances[c]:.0%}" for c in cases) + " of the budget)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(_HERE))
    sys.exit(main())
