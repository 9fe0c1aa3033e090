"""``streamingnode backup`` (a client of a running node: the Backup RPC) and ``streamingnode restore``
(offline: ``streamingnode.offline.restore``).

Standard library only at module level (see ``streamingnode.cli``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from streamingnode.cli.connection import connect
from streamingnode.cli.progress import MIB

DEFAULT_RATE_MIB = 64.0
"""The command's pace: the node's compaction default (``compaction_io_bytes_per_second``), so that a
backup leaves appends their latency (bench/RESULTS.md, "Backup")."""


def add_backup(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """Register ``backup`` (with the client commands' connection options ``common``)."""
    p = sub.add_parser(
        "backup", parents=[common], help="back up a running node's pchannels and Parquet files",
        description="Ask the node at --addr to write a consistent backup into a new directory inside --to, while "
        "it keeps serving: the log of every pchannel (or of those named) up to a cut the command prints, with "
        "consumer groups, recovery snapshots and flusher checkpoints as of that cut, the Parquet files committed "
        "up to it, and a manifest (sizes and SHA-256) written last.  The node writes the files: --to is a path "
        "on the node's host (a relative one is made absolute here).  Files the newest complete backup in --to "
        "holds unchanged are hard-linked, not copied.  Needs the admin permission.")
    p.add_argument("--to", required=True, metavar="DIR", type=os.path.abspath,
                   help="the target directory (on the node's host)")
    p.add_argument("--pchannel", action="append", metavar="P", help="only this pchannel (repeat for several)")
    p.add_argument("--rate", type=float, default=DEFAULT_RATE_MIB, metavar="MIB_PER_S",
                   help=f"read at most this many MiB/s on the node (default {DEFAULT_RATE_MIB:g}, as compaction; 0: as "
                        "fast as the disk goes, which costs appends latency on a busy node)")
    p.add_argument("--nats", metavar="URLS",
                   help="cluster mode (--wal jetstream): back up from these NATS servers directly (no node is "
                        "asked; the nodes keep serving), with --cluster-prefix and --parquet-root")
    p.add_argument("--cluster-prefix", default="sn", help="cluster mode: the nodes' --cluster-prefix (default sn)")
    p.add_argument("--parquet-root", help="cluster mode: the nodes' shared Parquet root, as seen from here")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress on stderr (default: redrawn in place on a terminal, one line per phase else)")
    p.set_defaults(client_handler=backup)


def add_restore(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``restore`` (offline, like verify)."""
    p = sub.add_parser(
        "restore", help="offline: build a new data directory from a backup (checksums first)",
        description="Check every file of the backup against its manifest (a damaged one is named, exit 1, "
        "nothing written), then build the new data directory --data-dir (it must not exist or be empty) that "
        "`serve` opens.  --from is one backup directory or a target holding several (the newest complete one "
        "is taken).")
    p.add_argument("--from", dest="source", required=True, metavar="DIR", help="the backup (or the backup target)")
    p.add_argument("--data-dir", dest="data_dir", default=argparse.SUPPRESS,
                   help="the new data directory (required unless --nats)")
    p.add_argument("--pchannel", action="append", metavar="P", help="only this pchannel (repeat for several)")
    p.add_argument("--until", metavar="TIME|ID",
                   help="restore as of a point: a time (ISO 8601 with its zone, or @UNIX_SECONDS; every message "
                        "stamped at or before it, to the millisecond) or a message id (that message and the ones "
                        "before it; with one --pchannel).  A transaction is restored whole or not at all")
    p.add_argument("--parquet-dir", help="root of the restored Parquet files (default <data dir>/parquet)")
    p.add_argument("--nats", metavar="URLS",
                   help="restore a cluster backup into these NATS servers (instead of --data-dir), under "
                        "--cluster-prefix, with its Parquet files into --parquet-dir")
    p.add_argument("--cluster-prefix", help="cluster mode: the prefix to restore under (must hold no pchannel)")
    p.add_argument("--nats-replicas", type=int, default=3, choices=(1, 3),
                   help="cluster mode: replicas of the restored streams and buckets (default 3)")


def run_restore(args: argparse.Namespace) -> int:
    from streamingnode.offline import restore  # noqa: PLC0415

    if args.nats:
        return restore.run_cluster(args.source, args.nats, args.cluster_prefix or "", args.nats_replicas,
                                   args.parquet_dir, until=args.until, pchannels=args.pchannel)
    if getattr(args, "data_dir", None) is None:
        print("restore: --data-dir is required (or --nats for a cluster backup)", file=sys.stderr)
        return 2
    return restore.run(args.source, args.data_dir, args.pchannel, args.until, parquet_dir=args.parquet_dir)


class _Progress:
    def __init__(self, enabled: bool, in_place: bool) -> None:
        self.enabled = enabled
        self.in_place = in_place
        self.phase = ""

    def show(self, p: Any) -> None:
        if not self.enabled:
            return
        line = f"backup: {p.phase}"
        if p.files_total:
            line += (f"  {p.files_done}/{p.files_total} files  {p.bytes_done / MIB:.1f}/{p.bytes_total / MIB:.1f} MiB")
        if self.in_place:
            sys.stderr.write(f"\r{line}\x1b[K")
            sys.stderr.flush()
        elif p.phase != self.phase:
            print(line, file=sys.stderr, flush=True)
        self.phase = p.phase

    def clear(self) -> None:
        if self.enabled and self.in_place and self.phase:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


async def backup(args: argparse.Namespace, addr: str) -> int:
    """``streamingnode backup``: stream the node's progress, print the result."""
    import grpc  # noqa: PLC0415

    from streamingnode.client._calls import translate  # noqa: PLC0415
    from streamingnode.v1 import streaming_pb2 as spb  # noqa: PLC0415

    tty = sys.stderr.isatty()
    progress = _Progress(tty if args.progress is None else args.progress, tty)
    if args.nats:
        return await _backup_cluster(args, progress)
    client = await connect(addr)
    try:
        stub = client.router.stub_at(client.seeds[0])
        request = spb.BackupRequest(to=args.to, pchannels=args.pchannel or [],
                                    max_bytes_per_second=int(max(args.rate, 0.0) * MIB))
        result = None
        try:
            async for update in stub.Backup(request):
                if update.HasField("result"):
                    result = update.result
                else:
                    progress.show(update)
        except grpc.RpcError as exc:
            raise translate(exc) from None
        finally:
            progress.clear()
    finally:
        await client.aclose()
    if result is None:
        print("error: the node ended the backup without a result", file=sys.stderr)
        return 1
    positions = [{"pchannel": p.pchannel, "first_id": p.first_id, "next_id": p.next_id,
                  "last_id": p.next_id - 1 if p.next_id > p.first_id else None, "last_timetick": p.last_timetick,
                  "flusher_checkpoint_id": p.flusher_checkpoint_id if p.HasField("flusher_checkpoint_id") else None}
                 for p in result.positions]
    print_result({"path": result.path, "positions": positions, "files_copied": result.files_copied,
                  "bytes_copied": result.bytes_copied, "files_reused": result.files_reused,
                  "bytes_reused": result.bytes_reused, "seconds": round(result.seconds, 3)}, args.json)
    return 0


async def _backup_cluster(args: argparse.Namespace, progress: _Progress) -> int:
    from pathlib import Path  # noqa: PLC0415

    from streamingnode.offline.cluster_backup import backup_cluster  # noqa: PLC0415
    from streamingnode.server.backup import node_version  # noqa: PLC0415

    def show(phase: str) -> None:
        progress.show(argparse.Namespace(phase=phase, files_total=0))

    root = Path(args.parquet_root) if args.parquet_root else None
    try:
        r = await backup_cluster(args.nats, args.cluster_prefix, root, Path(args.to), pchannels=args.pchannel or [],
                                 on_progress=show, node_version=node_version())
    finally:
        progress.clear()
    positions = [{"pchannel": p.pchannel, "first_id": p.first_id, "next_id": p.next_id, "last_id": p.last_id,
                  "last_timetick": p.last_timetick,
                  "flusher_checkpoint_id": p.flusher_checkpoint[0] if p.flusher_checkpoint else None}
                 for p in r.manifest.pchannels]
    print_result({"path": str(r.path), "positions": positions, **r.manifest.copied, "seconds": round(r.seconds, 3)},
                 args.json)
    return 0


def print_result(result: dict[str, Any], as_json: bool) -> None:
    from streamingnode.cli.parsing import ts_text  # noqa: PLC0415

    if as_json:
        print(json.dumps(result))
        return
    positions: list[dict[str, Any]] = result["positions"]
    for p in positions:
        held = f"up to id {p['last_id']}" if p["last_id"] is not None else "no messages"
        ckpt = p["flusher_checkpoint_id"]
        print(f"pchannel {p['pchannel']!r}: {held} (timetick {p['last_timetick']}, {ts_text(p['last_timetick'])}); "
              f"flusher checkpoint {'-' if ckpt is None else f'at id {ckpt}'}")
    print(f"backup {result['path']}: copied {result['files_copied']} files ({result['bytes_copied'] / MIB:.1f} MiB), "
          f"reused {result['files_reused']} unchanged files ({result['bytes_reused'] / MIB:.1f} MiB) in "
          f"{result['seconds']:.1f} s")


__all__ = ["add_backup", "add_restore", "backup", "print_result", "run_restore"]
