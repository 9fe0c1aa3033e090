"""Command line entry point: ``streamingnode <command>``.

``serve`` runs the node (gRPC on port 19530, data under ./data, no configuration needed).  ``demo``
runs a durable append/read round trip in a data directory without a server, ``inspect`` lists the
pchannels of a data directory, and ``verify``, ``salvage`` and ``compact`` check, repair and compact a
stopped node's data directory (``streamingnode.offline.verify``, ``.salvage``, ``.compact``).  ``produce``, ``consume``,
``channels``, ``groups`` and ``flush`` are clients of a running node (``--addr``, default
$STREAMINGNODE_ADDR or localhost:19530); see ``streamingnode.cli``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from typing import Any

DEFAULT_DATA_DIR = "./data"


def _data_dir(args: argparse.Namespace) -> str:
    return os.path.abspath(args.data_dir or os.environ.get("STREAMINGNODE_DATA_DIR") or DEFAULT_DATA_DIR)


async def _demo(data_dir: str, count: int) -> None:
    from wal import (  # noqa: PLC0415  (keep `--help` fast)
        ChannelExistError,
        DeliverPolicy,
        Message,
        MessageType,
        ReadOption,
        WALManager,
        new_time_tick,
    )
    from wal.clock import wall_ts  # noqa: PLC0415

    manager = await WALManager.start_rocksdb(data_dir)
    try:
        with contextlib.suppress(ChannelExistError):
            await manager.create_channel("demo")
        wal = await manager.open("demo")
        start_id = wal.next_id
        base_ts = max(wal.last_timetick, wall_ts()) + 1
        t0 = time.perf_counter()
        batch = [
            Message(MessageType.INSERT, "demo-v0", b"x" * 1024, timetick=base_ts + i) for i in range(count)
        ]
        batch.append(new_time_tick(base_ts + count))
        await wal.append_batch(batch)
        appended = time.perf_counter() - t0
        seen = 0
        async with wal.read(ReadOption(deliver_policy=DeliverPolicy.start_from(start_id))) as scanner:
            async for pack in scanner:
                seen += len(pack.messages)
                if pack.end_ts >= base_ts + count:
                    break
        print(
            f"pchannel demo term {wal.term}: appended {count} x 1 KiB durably in {appended * 1000:.1f} ms, "
            f"read back {seen}; ids [{wal.first_id}, {wal.next_id}) in {data_dir}"
        )
    finally:
        await manager.aclose()


async def _inspect(data_dir: str) -> None:
    from wal import WALManager  # noqa: PLC0415

    manager = await WALManager.start_rocksdb(data_dir)
    try:
        for name in await manager.list_channels():
            info = await manager.describe_channel(name)
            print(f"{name}\tterm={info.term}\tids=[{info.first_id}, {info.next_id})\tlast_ts={info.last_timetick}")
    finally:
        await manager.aclose()


def _serve(args: argparse.Namespace) -> None:
    from streamingnode.config import load_config, settings  # noqa: PLC0415
    from streamingnode.observability.logs import configure_logging  # noqa: PLC0415
    from streamingnode.server import RunningServer, serve  # noqa: PLC0415

    config = load_config(args.config, overrides={s.name: getattr(args, s.name, None) for s in settings()})
    configure_logging(config.log_level, fmt=config.log_format)

    def ready(running: RunningServer) -> None:
        # One line on stdout that scripts (and tests) wait for; logs go to stderr.
        metrics = f"http://{running.metrics_address}/metrics" if running.metrics_address else "off"
        print(f"streamingnode serving on {running.address} (data dir {config.data_dir.resolve()}, metrics {metrics})",
              flush=True)

    asyncio.run(serve(config, on_ready=ready))


def _add_setting_flags(serve: argparse.ArgumentParser) -> None:
    """One flag per NodeConfig field (``streamingnode.config.settings``), its help the field's docstring.

    Every flag defaults to "not given" (None, or absent for --data-dir, which the top-level parser
    also takes), so that the TOML file and the environment count unless the flag is given.
    """
    from streamingnode.config import settings  # noqa: PLC0415  (standard library only)

    for s in settings():
        default = "none" if s.default in (None, "", ()) else s.default
        text = f"{s.help} (default {default}; TOML {s.name}, ${s.env})".replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": s.name, "help": text}
        if s.name == "data_dir":
            kwargs["default"] = argparse.SUPPRESS
        if s.is_bool:
            serve.add_argument(*s.flags, action=argparse.BooleanOptionalAction, **kwargs)
        elif s.choices is not None:
            serve.add_argument(*s.flags, choices=s.choices, type=type(s.choices[0]),
                               metavar="|".join(map(str, s.choices)), **kwargs)
        else:
            serve.add_argument(*s.flags, metavar=s.name.upper(), **kwargs)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("streamingnode")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    from streamingnode.cli.suggesting_parser import SuggestingParser  # noqa: PLC0415  (stdlib only)

    parser: argparse.ArgumentParser = SuggestingParser(prog="streamingnode", description=__doc__)
    parser.add_argument("--version", action="version", version=f"streamingnode {_version()}")
    parser.add_argument("--data-dir", help=f"data directory (default $STREAMINGNODE_DATA_DIR or {DEFAULT_DATA_DIR})")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the node: gRPC service over the embedded WAL")
    serve.add_argument("--config", help="TOML file whose keys are the NodeConfig fields")
    _add_setting_flags(serve)
    demo = sub.add_parser("demo", help="durable append/read round trip on pchannel 'demo'")
    demo.add_argument("--data-dir", dest="data_dir", default=argparse.SUPPRESS,
                      help="data directory (default $STREAMINGNODE_DATA_DIR or ./data)")
    demo.add_argument("--count", type=int, default=1000)
    inspect = sub.add_parser("inspect", help="list the pchannels of the data directory")
    inspect.add_argument("--data-dir", dest="data_dir", default=argparse.SUPPRESS,
                         help="data directory (default $STREAMINGNODE_DATA_DIR or ./data)")
    verify = sub.add_parser("verify", help="offline check of the data directory: journal, WAL blocks, RocksDB, "
                            "snapshots, Parquet; one line per finding, exit 1 on any")
    verify.add_argument("--data-dir", dest="data_dir", default=argparse.SUPPRESS,
                        help="data directory (default $STREAMINGNODE_DATA_DIR or ./data)")
    verify.add_argument("--pchannel", help="check only this pchannel (and what no pchannel owns)")
    verify.add_argument("--parquet-dir", help="root of the Parquet files (default <data dir>/parquet)")
    comp = sub.add_parser("compact", help="offline: compact the small Parquet files of a stopped node (progress on "
                          "stderr, one summary line per collection on stdout)")
    comp.add_argument("--data-dir", dest="data_dir", default=argparse.SUPPRESS,
                      help="data directory (default $STREAMINGNODE_DATA_DIR or ./data)")
    comp.add_argument("--parquet-dir", help="root of the Parquet files (default <data dir>/parquet)")
    comp.add_argument("--pchannel", help="only this pchannel")
    comp.add_argument("--collection", help="only this collection")
    # The node's defaults (compaction_*): one home, flusher.compaction_config (standard library only).
    from flusher.compaction_config import DEFAULT_COMPACTION  # noqa: PLC0415

    comp.add_argument("--target-bytes", type=int, default=DEFAULT_COMPACTION.target_bytes,
                      help=f"size of a compacted file (default {DEFAULT_COMPACTION.target_bytes})")
    comp.add_argument("--min-files", type=int, default=DEFAULT_COMPACTION.min_files,
                      help=f"small files a partition needs (default {DEFAULT_COMPACTION.min_files}, as the node's)")
    comp.add_argument("--horizon-seconds", type=float, default=DEFAULT_COMPACTION.horizon_seconds,
                      help="as-of reads of the last this many seconds stay exact "
                           f"(default {DEFAULT_COMPACTION.horizon_seconds:g})")
    salvage = sub.add_parser("salvage", help="offline: cut a pchannel at its first damaged block (only with "
                             "--truncate-at-corruption; without it, report what would be cut)")
    salvage.add_argument("--data-dir", dest="data_dir", default=argparse.SUPPRESS,
                         help="data directory (default $STREAMINGNODE_DATA_DIR or ./data)")
    salvage.add_argument("--pchannel", action="append", required=True,
                         help="pchannel to cut (repeat for several damaged pchannels)")
    salvage.add_argument("--truncate-at-corruption", action="store_true",
                         help="really cut: drop every message from the first damaged block on")
    salvage.add_argument("--parquet-dir", help="root of the Parquet files (default <data dir>/parquet): files "
                                               "holding rows of cut messages move aside")
    from streamingnode.cli import CLIENT_COMMANDS, add_client_commands  # noqa: PLC0415  (stdlib-only module)
    from streamingnode.cli.backup import add_restore, run_restore  # noqa: PLC0415  (stdlib-only module)

    add_client_commands(sub)
    add_restore(sub)
    args = parser.parse_args(argv)
    if args.command in CLIENT_COMMANDS:
        from streamingnode.cli import run  # noqa: PLC0415

        return run(args)
    from streamingnode.node.gc_tuning import tune_gc  # noqa: PLC0415
    from wal import StreamingError  # noqa: PLC0415

    tune_gc()
    if args.command == "verify":
        from streamingnode.offline import verify as verify_cmd  # noqa: PLC0415

        return verify_cmd.run(_data_dir(args), args.pchannel, args.parquet_dir)
    if args.command == "compact":
        from streamingnode.offline import compact as compact_cmd  # noqa: PLC0415

        return compact_cmd.run(_data_dir(args), args.parquet_dir, args.pchannel, args.collection,
                               target_bytes=args.target_bytes, min_files=args.min_files,
                               horizon_seconds=args.horizon_seconds)
    if args.command == "restore":
        return run_restore(args)
    if args.command == "salvage":
        from streamingnode.offline import salvage as salvage_cmd  # noqa: PLC0415

        return salvage_cmd.run(_data_dir(args), args.pchannel, apply=args.truncate_at_corruption,
                                 parquet_dir=args.parquet_dir)

    try:
        if args.command == "serve":
            _serve(args)
        elif args.command == "demo":
            asyncio.run(_demo(_data_dir(args), args.count))
        else:
            asyncio.run(_inspect(_data_dir(args)))
    except StreamingError as exc:
        print(f"error: {exc.code.name}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
