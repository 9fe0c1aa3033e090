"""Backup: a consistent backup of the node's pchannels into a directory on its host, while it serves
(``streamingnode.offline.backup`` does the work; this streams its progress to the caller).

The files are written by the node, not streamed to the caller: the target must be a path the node's
process can write (a mounted backup volume, say).  A caller that goes away mid-way (or a node that
shuts down) abandons the backup: the node removes what it wrote of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from importlib.metadata import PackageNotFoundError, version

import grpc

from streamingnode.node.node import Node
from streamingnode.offline.backup import Progress, Result, check_target, take_backup
from streamingnode.offline.manifest import Pace
from streamingnode.server.errors import stream_errors
from streamingnode.v1 import streaming_pb2 as spb
from wal import names
from wal.errors import InvalidArgumentError, ResourceExhaustedError

_PROGRESS_EVERY = 0.25
"""Seconds between two progress responses within one phase."""


def node_version() -> str:
    try:
        return version("streamingnode")
    except PackageNotFoundError:
        return "unknown"


def _progress_pb(p: Progress) -> spb.BackupProgress:
    return spb.BackupProgress(phase=p.phase, files_done=p.files_done, files_total=p.files_total,
                              bytes_done=p.bytes_done, bytes_total=p.bytes_total)


def result_pb(r: Result) -> spb.BackupResult:
    copied = r.manifest.copied
    out = spb.BackupResult(path=str(r.path), files_copied=copied["files_copied"], bytes_copied=copied["bytes_copied"],
                           files_reused=copied["files_reused"], bytes_reused=copied["bytes_reused"], seconds=r.seconds)
    for p in r.manifest.pchannels:
        pos = out.positions.add(pchannel=p.pchannel, first_id=p.first_id, next_id=p.next_id,
                                last_timetick=p.last_timetick)
        if p.flusher_checkpoint is not None:
            pos.flusher_checkpoint_id = p.flusher_checkpoint[0]
    return out


class BackupHandlers:
    """The Backup RPC (mixed into the servicer, over ``self.node``)."""

    node: Node
    _backup_lock: asyncio.Lock | None = None

    @stream_errors
    async def Backup(self, raw: bytes, context: grpc.aio.ServicerContext) -> None:
        # Registered without a deserializer (``service.add_service``): parsed here, where an
        # unparsable request is INVALID_ARGUMENT (gRPC answers a deserializer's error with UNKNOWN).
        request = spb.BackupRequest.FromString(raw)
        node = self.node
        if node.ownership is not None:
            raise InvalidArgumentError(
                "Backup works on a node with the embedded RocksDB WAL; in cluster mode (--wal jetstream) the log "
                "is NATS's: back it up with NATS (docs/operations.md, Backup and restore, Cluster mode)")
        pchannels = [names.PCHANNEL.check(n, "pchannels") for n in request.pchannels]
        for n in pchannels:
            node.channel(n)  # CHANNEL_NOT_EXIST for a name the node does not have
        cfg = node.config
        parquet_root = cfg.parquet_root if cfg.flusher else None
        target = check_target(request.to, cfg.data_dir, parquet_root)
        if self._backup_lock is None:
            self._backup_lock = asyncio.Lock()  # one per servicer (and so per event loop)
        lock = self._backup_lock
        if lock.locked():
            raise ResourceExhaustedError("another backup is running on this node (one at a time): retry once it "
                                         "has finished")
        loop = asyncio.get_running_loop()
        pending: list[spb.BackupProgress] = []
        changed = asyncio.Event()
        last: dict[str, float | str] = {"at": 0.0, "phase": ""}

        def push(update: spb.BackupProgress) -> None:
            pending.append(update)
            changed.set()

        def on_progress(p: Progress) -> None:
            # Called from the worker thread: at most every _PROGRESS_EVERY seconds within a phase,
            # and the end of the copy always.
            now = time.monotonic()
            at = last["at"]
            assert isinstance(at, float)
            if p.phase == last["phase"] and now - at < _PROGRESS_EVERY and p.files_done != p.files_total:
                return
            last["at"], last["phase"] = now, p.phase
            loop.call_soon_threadsafe(push, _progress_pb(p))

        async with lock:
            # A task of its own, stopped through its pace: a caller that goes away (or a node shutting
            # down) abandons the backup at the next chunk, and its half-written directory is removed.
            pace = Pace(request.max_bytes_per_second)
            task: asyncio.Task[Result] = asyncio.ensure_future(take_backup(
                node.manager, cfg.data_dir, parquet_root, target, pchannels=pchannels, on_progress=on_progress,
                node_version=node_version(), pace=pace))
            task.add_done_callback(lambda _t: changed.set())
            try:
                while True:
                    await changed.wait()
                    changed.clear()
                    while pending:
                        await context.write(pending.pop(0))
                    if task.done():
                        break
                result = task.result()
            except BaseException:
                pace.stop()
                with contextlib.suppress(Exception):
                    await asyncio.shield(task)  # ends at its next chunk, removing what it wrote
                raise
        await context.write(spb.BackupProgress(phase="done", result=result_pb(result)))


__all__ = ["BackupHandlers", "node_version", "result_pb"]
