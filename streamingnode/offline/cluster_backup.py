"""Backup and restore in cluster mode (``--wal jetstream``): the log is NATS's, so the command talks to
NATS, not to a node, and runs while the nodes serve.

Backup (``streamingnode backup --nats URL --cluster-prefix P --parquet-root ROOT --to DIR``):

1. the WAL's two key-value buckets, ``P_channels`` (channel records) and ``P_meta`` (next channel key,
   and per pchannel its consumer groups, recovery snapshots, flusher checkpoint, truncation mark and
   metadata term), are read first, key by key;
2. then each pchannel's stream ``SN_P_<key>`` is read message by message (one message per record
   block, with its headers) up to its last sequence at that moment.  Read after the buckets, the
   streams hold at least every message a group position, snapshot or flusher checkpoint of the
   buckets refers to: the cut of each pchannel is the end of its stream as read;
3. the Parquet files committed up to the cut are copied (as in local mode: ``backup._parquet_files``);
4. the manifest is written last, with every file's size and SHA-256.

Restore (``streamingnode restore --nats URL --cluster-prefix NEW --from DIR --parquet-dir ROOT``) checks
every checksum first, refuses a prefix that holds any channel, creates the buckets and streams as the
backend does, puts the keys back, republishes each stream's blocks in order with their headers (the
server's own ``Nats-*`` headers left out: sequences start again at 1, which the backend does not
depend on), and copies the Parquet files.  Nodes started with ``--cluster-prefix NEW`` (and that
Parquet root) then serve the restored pchannels, each opened with the next term.

``--pchannel`` and ``--until`` restore as the local restore does (``restore``): the stream's blocks up to
the cut, the block holding it re-encoded, the metadata positions lowered.  Not offered in cluster mode:
reuse of unchanged files between backups (each backup reads the streams whole), and pacing.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from streamingnode.offline.manifest import (
    PARQUET_DIR,
    ChannelPosition,
    FileEntry,
    Manifest,
    damaged_files,
    file_sha256,
    fsync_dir,
    read_manifest,
    resolve_backup,
    write_manifest,
)
from streamingnode.offline.restore import Cut, Until, lower_positions
from wal.errors import StreamingError

KV_DIR = "kv"
STREAMS_DIR = "streams"
WAL_KIND = "jetstream"
_LEN = struct.Struct(">I")
_TIMEOUT = 10.0
_FLUSH_BYTES = 8 << 20


@dataclass(slots=True)
class ClusterResult:
    path: Path
    manifest: Manifest
    seconds: float


def _buckets(prefix: str) -> tuple[str, str]:
    return f"{prefix}_channels", f"{prefix}_meta"


async def _kv_dump(js: Any, bucket: str) -> dict[str, bytes]:
    """Every key of a bucket with its value (from the bucket's stream: every subject holds its last)."""
    import nats.js.errors  # noqa: PLC0415

    try:
        info = await js.stream_info(f"KV_{bucket}", subjects_filter=f"$KV.{bucket}.>")
    except nats.js.errors.NotFoundError:
        return {}
    kv = await js.key_value(bucket)
    skip = len(f"$KV.{bucket}.")
    out: dict[str, bytes] = {}
    for subject in sorted(info.state.subjects or {}):
        key = subject[skip:]
        try:
            entry = await kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            continue
        if entry.value is not None:
            out[key] = bytes(entry.value)
    return out


def _write_kv(path: Path, values: dict[str, bytes]) -> None:
    with open(path, "w") as f:
        for k, v in sorted(values.items()):
            f.write(json.dumps({"key": k, "value": base64.b64encode(v).decode()}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _read_kv(path: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        out[str(doc["key"])] = base64.b64decode(doc["value"])
    return out


async def _dump_stream(js: Any, stream: str, path: Path) -> tuple[int, int, int, int] | None:
    """Write every message of ``stream`` to ``path``; (first id, next id, largest timetick, blocks) of
    what it holds, None when the stream is missing."""
    import nats.js.errors  # noqa: PLC0415

    from wal._codec import block_count  # noqa: PLC0415
    from wal.backends._js_connection import H_FENCE, H_FIRST, H_MAX_TT  # noqa: PLC0415

    try:
        info = await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        return None
    first_seq, last_seq = int(info.state.first_seq), int(info.state.last_seq)
    first_id: int | None = None
    next_id = 0
    max_tt = 0
    blocks = 0
    f = await asyncio.to_thread(open, path, "wb")
    try:
        parts: list[bytes] = []
        pending = 0
        for seq in range(first_seq, last_seq + 1):
            try:
                msg = await js.get_msg(stream, seq)
            except nats.js.errors.NotFoundError:
                continue
            headers = {k: v for k, v in (msg.headers or {}).items() if not k.startswith("Nats-")}
            data = bytes(msg.data or b"")
            raw_headers = json.dumps(headers).encode()
            parts.append(_LEN.pack(len(raw_headers)) + raw_headers + _LEN.pack(len(data)) + data)
            pending += len(data)
            if pending >= _FLUSH_BYTES:
                await asyncio.to_thread(f.write, b"".join(parts))
                parts, pending = [], 0
            blocks += 1
            block_first = int(headers.get(H_FIRST, "0"))
            max_tt = max(max_tt, int(headers.get(H_MAX_TT, "0")))
            if first_id is None:
                first_id = block_first
            next_id = block_first if headers.get(H_FENCE) else block_first + block_count(data)
        await asyncio.to_thread(f.write, b"".join(parts))
        await asyncio.to_thread(f.flush)
        await asyncio.to_thread(os.fsync, f.fileno())
    finally:
        f.close()
    return (first_id if first_id is not None else next_id), next_id, max_tt, blocks


def _read_stream(path: Path) -> list[tuple[dict[str, str], bytes]]:
    raw = path.read_bytes()
    out = []
    at = 0
    while at < len(raw):
        (n,) = _LEN.unpack_from(raw, at)
        headers = json.loads(raw[at + 4:at + 4 + n])
        at += 4 + n
        (m,) = _LEN.unpack_from(raw, at)
        out.append((headers, raw[at + 4:at + 4 + m]))
        at += 4 + m
    return out


async def backup_cluster(
    servers: str, prefix: str, parquet_root: Path | None, target: Path, *, pchannels: list[str],
    on_progress: Callable[[str], None], node_version: str,
) -> ClusterResult:
    """Back up the cluster's pchannels (every one when ``pchannels`` is empty) into ``target``."""
    import nats  # noqa: PLC0415
    import nats.js.errors  # noqa: PLC0415

    from streamingnode.offline.backup import new_backup_dir, parquet_files  # noqa: PLC0415
    from wal.kv_key import decode_key  # noqa: PLC0415

    start = time.monotonic()
    created = datetime.now(UTC)
    nc = await nats.connect(servers.split(","), connect_timeout=_TIMEOUT)
    try:
        js = nc.jetstream(timeout=_TIMEOUT)
        channels_bucket, meta_bucket = _buckets(prefix)
        on_progress("key-value buckets")
        records = await _kv_dump(js, channels_bucket)
        meta = await _kv_dump(js, meta_bucket)
        by_name = {decode_key(k): json.loads(v) for k, v in records.items()}
        missing = [n for n in pchannels if n not in by_name]
        if missing:
            raise StreamingError(f"no pchannel {missing[0]!r} in the cluster under prefix {prefix!r}",
                                 channel=missing[0])
        names = sorted(pchannels or by_name)
        keep_keys = {int(by_name[n]["key"]) for n in names}
        records = {k: v for k, v in records.items() if decode_key(k) in names}
        meta = {k: v for k, v in meta.items() if not k.startswith("c.") or int(k.split(".")[1]) in keep_keys}
        dest = await asyncio.to_thread(new_backup_dir, target, created)
        (dest / KV_DIR).mkdir()
        (dest / STREAMS_DIR).mkdir()
        await asyncio.to_thread(_write_kv, dest / KV_DIR / "channels.jsonl", records)
        await asyncio.to_thread(_write_kv, dest / KV_DIR / "meta.jsonl", meta)
        positions: list[ChannelPosition] = []
        for name in names:
            key = int(by_name[name]["key"])
            on_progress(f"stream of pchannel {name!r}")
            got = await _dump_stream(js, f"SN_{prefix}_{key}", dest / STREAMS_DIR / f"{key}.blocks")
            first_id, next_id, max_tt, _ = got if got is not None else (0, 0, 0, 0)
            pos = ChannelPosition(name, key, first_id, next_id, max_tt)
            _fill_from_meta(pos, meta)
            positions.append(pos)
    finally:
        await nc.close()

    def finish() -> Manifest:
        sources: list[tuple[Path, str]] = []
        if parquet_root is not None and parquet_root.is_dir():
            on_progress("parquet")
            for pos in positions:
                sources.extend((src, f"{PARQUET_DIR}/{pos.pchannel}/{rel}")
                               for src, rel in parquet_files(parquet_root, pos))
        entries = []
        for src, rel in sources:
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out)
        for p in sorted(q for q in dest.rglob("*") if q.is_file()):
            size, digest = file_sha256(p)
            entries.append(FileEntry(p.relative_to(dest).as_posix(), size, digest))
        copied = {"files_copied": len(entries), "bytes_copied": sum(e.size for e in entries), "files_reused": 0,
                  "bytes_reused": 0}
        manifest = Manifest(node_version, created.isoformat(), positions, entries, parquet_root is not None,
                            partial=bool(pchannels), copied=copied, wal=WAL_KIND)
        for d in sorted({p.parent for p in dest.rglob("*")} | {dest}, key=lambda p: len(p.parts), reverse=True):
            fsync_dir(d)
        on_progress("manifest")
        write_manifest(dest, manifest)
        fsync_dir(target)
        return manifest

    manifest = await asyncio.to_thread(finish)
    return ClusterResult(dest, manifest, time.monotonic() - start)


def _fill_from_meta(pos: ChannelPosition, meta: dict[str, bytes]) -> None:
    from flusher.checkpoint import CHECKPOINT_META  # noqa: PLC0415
    from interceptors.recovery.snapshot import PERIODIC_METAS, SNAPSHOT_META, RecoverySnapshot  # noqa: PLC0415
    from streamingnode.node.groups import META_KEY as GROUPS_META  # noqa: PLC0415
    from wal.kv_key import encode_key  # noqa: PLC0415

    def get(name: str) -> bytes | None:
        return meta.get(f"c.{pos.key}.{encode_key(name)}")

    raw = get(CHECKPOINT_META)
    if raw:
        doc = json.loads(raw)
        pos.flusher_checkpoint = (int(doc["message_id"]), int(doc["timetick"]))
    raw = get(GROUPS_META)
    if raw:
        pos.groups = {g: {v: [int(p[0]), int(p[1])] for v, p in vs.items()} for g, vs in json.loads(raw).items()}
    ids = [RecoverySnapshot.decode(raw, pos.pchannel).message_id
           for slot in (SNAPSHOT_META, *PERIODIC_METAS) if (raw := get(slot))]
    pos.snapshot_id = max(ids, default=None)


async def restore_cluster(
    source: str, servers: str, prefix: str, replicas: int, parquet_dir: str | None, *,
    pchannels: list[str] | None = None, until: Until | None = None,
) -> tuple[Manifest, dict[str, int]]:
    """Restore the cluster backup at ``source`` under ``prefix`` (see the module docstring): only
    ``pchannels`` (default all), and as of ``until``.  Returns the manifest and the cut of each pchannel
    cut (its first id not restored)."""
    import nats  # noqa: PLC0415
    import nats.js.errors  # noqa: PLC0415
    from nats.js import api  # noqa: PLC0415

    from streamingnode.offline.restore import (  # noqa: PLC0415
        ChannelOutcome,
        DamagedBackupError,
        RestoreRefusedError,
        copy_parquet,
    )
    from wal.backends.rocks_layout import TRUNCATED_META, U64  # noqa: PLC0415
    from wal.kv_key import decode_key, encode_key  # noqa: PLC0415

    backup = resolve_backup(Path(source))
    manifest = read_manifest(backup)
    names = list(pchannels) if pchannels else [p.pchannel for p in manifest.pchannels]
    unknown = [n for n in names if manifest.channel(n) is None]
    if unknown:
        raise RestoreRefusedError(f"the backup {backup} holds no pchannel {unknown[0]!r}")
    if until is not None and until.message_id is not None and len(names) != 1:
        raise RestoreRefusedError("--until with a message id needs exactly one pchannel (--pchannel): ids are per "
                                  "pchannel")
    chosen = [p for p in manifest.pchannels if p.pchannel in names]
    keys = {p.key for p in chosen}
    if manifest.wal != WAL_KIND:
        raise RestoreRefusedError(f"{backup} is a backup of a node with the embedded WAL: restore it with "
                                  "--data-dir, without --nats")
    root = Path(parquet_dir) if parquet_dir is not None else None
    if manifest.parquet and any(f.path.startswith(f"{PARQUET_DIR}/") for f in manifest.files) and root is None:
        raise RestoreRefusedError("the backup holds Parquet files: name where they go with --parquet-dir")
    if root is not None and root.exists() and any(root.iterdir()):
        raise RestoreRefusedError(f"restore target {root} is not empty: restore into a new directory", path=str(root))
    damaged = damaged_files(backup, manifest)
    if damaged:
        raise DamagedBackupError(f"the backup {backup} is damaged; nothing was restored:\n  " + "\n  ".join(damaged),
                                 damaged)
    channels_bucket, meta_bucket = _buckets(prefix)
    nc = await nats.connect(servers.split(","), connect_timeout=_TIMEOUT)
    try:
        js = nc.jetstream(timeout=_TIMEOUT)
        if await _kv_dump(js, channels_bucket):
            raise RestoreRefusedError(f"cluster prefix {prefix!r} holds pchannels already: restore under a new "
                                      "--cluster-prefix")
        for pos in chosen:
            try:
                await js.stream_info(f"SN_{prefix}_{pos.key}")
            except nats.js.errors.NotFoundError:
                continue
            raise RestoreRefusedError(f"stream SN_{prefix}_{pos.key} exists already: restore under a new "
                                      "--cluster-prefix")
        kvs = {}
        for bucket in (channels_bucket, meta_bucket):
            try:
                kvs[bucket] = await js.key_value(bucket)
            except nats.js.errors.BucketNotFoundError:
                # As the backend makes them (wal/backends/_js_connection.py).
                kvs[bucket] = await js.create_key_value(api.KeyValueConfig(
                    bucket=bucket, history=1, replicas=replicas, storage=api.StorageType.FILE, direct=False))
        cuts: dict[int, Cut] = {}
        for pos in chosen:
            stream = f"SN_{prefix}_{pos.key}"
            subject = f"sn.{prefix}.{pos.key}"
            await js.add_stream(api.StreamConfig(
                name=stream, subjects=[subject], storage=api.StorageType.FILE, num_replicas=replicas,
                allow_direct=True, discard=api.DiscardPolicy.OLD))
            path = backup / STREAMS_DIR / f"{pos.key}.blocks"
            blocks = await asyncio.to_thread(_read_stream, path) if path.exists() else []
            if until is not None:
                blocks, cut = _cut_blocks(blocks, pos, until)
                if cut is not None:
                    cuts[pos.key] = cut
            for headers, data in blocks:
                await js.publish(subject, data, headers=headers or None)
        marks = {}
        for cut in cuts.values():
            if cut.at <= cut.first_kept:
                # Every block cut: the stream is empty, and its ids go on from the truncation mark.
                marks[f"c.{cut.key}.{encode_key(TRUNCATED_META)}"] = U64.pack(cut.at)
        for key, stored in {**_read_kv(backup / KV_DIR / "meta.jsonl"), **marks}.items():
            value: bytes | None = stored
            if key.startswith("c."):
                ch_key = int(key.split(".")[1])
                if ch_key not in keys:
                    continue
                cut = cuts.get(ch_key)
                if cut is not None and not key.endswith(".-term"):
                    value = lower_positions(decode_key(key.split(".", 2)[2]), stored, cut)
            if value is not None:
                await kvs[meta_bucket].put(key, value)
        # The channel records last: a pchannel exists for the nodes only once its stream and metadata do.
        for key, raw in _read_kv(backup / KV_DIR / "channels.jsonl").items():
            record = json.loads(raw)
            if int(record["key"]) not in keys:
                continue
            if int(record["key"]) in cuts:
                record["term"] = int(record["term"]) + 1  # the cut is a term of its own
            await kvs[channels_bucket].put(key, json.dumps(record).encode())
    finally:
        await nc.close()
    if root is not None:
        for pos in chosen:
            await asyncio.to_thread(copy_parquet, backup, manifest, root,
                                    ChannelOutcome(pos.pchannel, pos.first_id, pos.next_id), cuts.get(pos.key))
    return manifest, {p.pchannel: cuts[p.key].at for p in chosen if p.key in cuts}


def _cut_blocks(
    blocks: list[tuple[dict[str, str], bytes]], pos: ChannelPosition, until: Until,
) -> tuple[list[tuple[dict[str, str], bytes]], Cut | None]:
    """The blocks of a stream dump up to ``until``: the block holding the cut re-encoded with the
    messages before it, its time-index headers trimmed; and the cut (None: nothing cut)."""
    from wal._codec import decode_block, encode_block  # noqa: PLC0415
    from wal.backends._js_connection import H_FENCE, H_FIRST, H_LAST_TICK, H_TICKS  # noqa: PLC0415

    kept: list[tuple[dict[str, str], bytes]] = []
    kept_ts = -1
    last_tick: str | None = None
    for headers, data in blocks:
        if headers.get(H_FENCE):
            kept.append((headers, data))
            continue
        first = int(headers[H_FIRST])
        messages = decode_block(data, first)
        at = None
        for m in messages:
            assert m.message_id is not None
            past = (m.message_id > until.message_id) if until.message_id is not None else \
                (until.timetick is not None and m.timetick > until.timetick)
            if past:
                at = m.message_id
                break
            kept_ts = max(kept_ts, m.timetick)
        if at is None:
            kept.append((headers, data))
            last_tick = headers.get(H_LAST_TICK, last_tick)
            continue
        if at > first:
            h = dict(headers)
            ticks = [t for t in h.get(H_TICKS, "").split(",") if t and int(t.split(":")[1]) < at]
            if ticks:
                h[H_TICKS] = ",".join(ticks)
                last_tick = ticks[-1]
            else:
                h.pop(H_TICKS, None)
            if last_tick is not None:
                h[H_LAST_TICK] = last_tick
            else:
                h.pop(H_LAST_TICK, None)
            kept.append((h, encode_block(messages[: at - first])))
        return kept, Cut(pos.key, at, pos.first_id, (kept_ts, at - 1) if kept_ts >= 0 else (-1, -1))
    return kept, None


__all__ = ["WAL_KIND", "ClusterResult", "backup_cluster", "restore_cluster"]
