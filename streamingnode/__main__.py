"""Command line entry point: ``streamingnode <command>``.

``serve`` runs the node (gRPC on port 19530, data under ./data, no configuration needed).  ``demo``
runs a durable append/read round trip in a data directory without a server, ``inspect`` lists the
pchannels of a data directory, and ``verify`` and ``salvage`` check and repair a stopped node's data
directory (``streamingnode.verify``, ``streamingnode.salvage``).  ``produce``, ``consume``,
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
    from streamingnode.config import load_config  # noqa: PLC0415
    from streamingnode.server import RunningServer, serve  # noqa: PLC0415

    config = load_config(args.config, overrides={
        "data_dir": args.data_dir, "listen": args.listen, "metrics_listen": args.metrics_listen,
        "durability": args.durability,
        "max_message_bytes": args.max_message_bytes, "channels": args.channels,
        "tick_interval": args.tick_interval, "drain_seconds": args.drain_seconds,
        "retention_seconds": args.retention_seconds, "retention_check_seconds": args.retention_check_seconds,
        "snapshot_every_messages": args.snapshot_every_messages, "snapshot_every_seconds": args.snapshot_every_seconds,
        "trace_exporter": args.trace_exporter,
        "tls_cert": args.tls_cert, "tls_key": args.tls_key, "tls_client_ca": args.tls_client_ca,
        "auth_tokens": args.auth_tokens, "allow_unauthenticated": args.allow_unauthenticated or None,
        "txn_max_messages": args.txn_max_messages, "txn_max_bytes": args.txn_max_bytes,
        "max_streams": args.max_streams, "max_streams_per_connection": args.max_streams_per_connection,
        "storage_min_free_bytes": args.storage_min_free_bytes,
        "compaction_interval_seconds": args.compaction_interval_seconds,
        "compaction_target_bytes": args.compaction_target_bytes, "compaction_min_files": args.compaction_min_files,
        "compaction_horizon_seconds": args.compaction_horizon_seconds,
        "compaction_io_bytes_per_second": args.compaction_io_bytes_per_second,
        "cluster_nats": args.cluster_nats, "wal": args.wal, "nats_replicas": args.nats_replicas,
        "parquet_dir": args.parquet_dir, "node_id": args.node_id, "advertise": args.advertise,
        "lease_seconds": args.lease_seconds, "cluster_prefix": args.cluster_prefix,
    })

    def ready(running: RunningServer) -> None:
        # One line on stdout that scripts (and tests) wait for; logs go to stderr.
        metrics = f"http://{running.metrics_address}/metrics" if running.metrics_address else "off"
        print(f"streamingnode serving on {running.address} (data dir {config.data_dir.resolve()}, metrics {metrics})",
              flush=True)

    asyncio.run(serve(config, on_ready=ready))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamingnode", description=__doc__)
    parser.add_argument("--data-dir", help=f"data directory (default $STREAMINGNODE_DATA_DIR or {DEFAULT_DATA_DIR})")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the node: gRPC service over the embedded WAL")
    serve.add_argument("--config", help="TOML file whose keys are the NodeConfig fields")
    serve.add_argument("--data-dir", dest="data_dir", default=argparse.SUPPRESS,
                       help="data directory (default $STREAMINGNODE_DATA_DIR or ./data)")
    serve.add_argument("--listen", help="gRPC listen address (default 127.0.0.1:19530; port 0 = any free port)")
    serve.add_argument("--metrics-listen", help="Prometheus /metrics address (default 127.0.0.1:9091; "
                       "port 0 = any free port; '' = off)")
    serve.add_argument("--durability", choices=["sync", "relaxed"])
    serve.add_argument("--max-message-bytes", type=int)
    serve.add_argument("--channels", help="comma-separated pchannels to create at start when missing")
    serve.add_argument("--tick-interval", type=float, help="seconds between persisted TimeTicks")
    serve.add_argument("--drain-seconds", type=float, help="how long SIGTERM waits for calls in flight")
    serve.add_argument("--retention-seconds", type=float,
                       help="keep WAL messages at least this long (default 86400; 0 = no time floor; <0 = forever)")
    serve.add_argument("--retention-check-seconds", type=float, help="how often truncation is checked (default 60)")
    serve.add_argument("--snapshot-every-messages", type=int,
                       help="store a recovery snapshot every this many messages (default 10000; 0 = off)")
    serve.add_argument("--snapshot-every-seconds", type=float,
                       help="... or every this many seconds if anything was written (default 60; 0 = off)")
    serve.add_argument("--trace-exporter", choices=["none", "console", "otlp"],
                       help="OpenTelemetry spans (default none = off; otlp needs opentelemetry-exporter-otlp)")
    serve.add_argument("--tls-cert", help="server certificate chain (PEM): serve TLS only (with --tls-key)")
    serve.add_argument("--tls-key", help="private key (PEM) of --tls-cert")
    serve.add_argument("--tls-client-ca", help="CA (PEM) client certificates must chain to: mutual TLS")
    serve.add_argument("--auth-tokens", help="tokens file (TOML): bearer tokens' SHA-256, principals, permissions")
    serve.add_argument("--allow-unauthenticated", action="store_true",
                       help="listen on a non-loopback address with neither tokens nor mutual TLS")
    serve.add_argument("--txn-max-messages", type=int, help="most messages of one transaction (default 100000)")
    serve.add_argument("--txn-max-bytes", type=int, help="most bytes of one transaction (default 64 MiB)")
    serve.add_argument("--max-streams", type=int, help="Produce/Consume streams open on the node (default 1024)")
    serve.add_argument("--max-streams-per-connection", type=int,
                       help="Produce/Consume streams open on one connection (default 128)")
    serve.add_argument("--storage-min-free-bytes", type=int,
                       help="free disk space under which appends are refused (STORAGE_FULL) and the node flushes "
                       "and truncates at once (default 256 MiB; 0 = off)")
    serve.add_argument("--compaction-interval-seconds", type=float,
                       help="how often small Parquet files are compacted (default 300; 0: never in the background)")
    serve.add_argument("--compaction-target-bytes", type=int, help="size of a compacted file (default 128 MiB)")
    serve.add_argument("--compaction-min-files", type=int, help="small files a partition needs first (default 8)")
    serve.add_argument("--compaction-horizon-seconds", type=float,
                       help="as-of reads of the last this many seconds stay exact (default 3600)")
    serve.add_argument("--compaction-io-bytes-per-second", type=int,
                       help="compaction I/O limit, bytes/s (default 64 MiB/s; 0: none)")
    serve.add_argument("--nats", "--cluster-nats", dest="cluster_nats",
                       help="cluster mode: NATS URLs, comma-separated (default off: one node, every pchannel "
                       "served here)")
    serve.add_argument("--wal", choices=["rocksdb", "jetstream"],
                       help="WAL backend: rocksdb (this node's own, default) or jetstream (the log shared by the "
                       "cluster on the --nats servers)")
    serve.add_argument("--nats-replicas", type=int, choices=[1, 3],
                       help="--wal jetstream: replicas of each pchannel's stream and the WAL's KV (default 3)")
    serve.add_argument("--parquet-root", dest="parquet_dir",
                       help="root of the flusher's Parquet files: a path or a file:// URI (default <data dir>/parquet; "
                       "object stores are not supported yet)")
    serve.add_argument("--node-id", help="cluster mode: this node's unique, stable id")
    serve.add_argument("--advertise", help="cluster mode: host:port clients reach this node at (default: the "
                       "bound listen address)")
    serve.add_argument("--lease-seconds", type=float, help="cluster mode: pchannel lease TTL (default 10)")
    serve.add_argument("--cluster-prefix", help="cluster mode: prefix of the NATS KV buckets (default sn)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    demo = sub.add_parser("demo", help="durable append/read round trip on pchannel 'demo'")
    demo.add_argument("--count", type=int, default=1000)
    sub.add_parser("inspect", help="list the pchannels of the data directory")
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
    comp.add_argument("--target-bytes", type=int, default=128 << 20, help="size of a compacted file (default 128 MiB)")
    comp.add_argument("--min-files", type=int, default=2, help="small files a partition needs (default 2)")
    comp.add_argument("--horizon-seconds", type=float, default=3600.0,
                      help="as-of reads of the last this many seconds stay exact (default 3600)")
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

    add_client_commands(sub)
    args = parser.parse_args(argv)
    if args.command in CLIENT_COMMANDS:
        from streamingnode.cli import run  # noqa: PLC0415

        return run(args)
    from streamingnode._process import tune_gc  # noqa: PLC0415
    from wal import StreamingError  # noqa: PLC0415

    tune_gc()
    if args.command == "verify":
        from streamingnode import verify as verify_cmd  # noqa: PLC0415

        return verify_cmd.run(_data_dir(args), args.pchannel, args.parquet_dir)
    if args.command == "compact":
        from flusher.compact import run_offline  # noqa: PLC0415

        return run_offline(_data_dir(args), args.parquet_dir, args.pchannel, args.collection,
                           target_bytes=args.target_bytes, min_files=args.min_files,
                           horizon_seconds=args.horizon_seconds)
    if args.command == "salvage":
        from streamingnode import salvage as salvage_cmd  # noqa: PLC0415

        return salvage_cmd.run(_data_dir(args), args.pchannel, apply=args.truncate_at_corruption,
                                 parquet_dir=args.parquet_dir)

    try:
        if args.command == "serve":
            from streamingnode._logging import configure_logging  # noqa: PLC0415

            configure_logging(args.log_level)
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
