"""Rebuilding damaged files from the WAL: one replay that collects, for each file moved aside, exactly
the messages it held, so the file written again has the same rows under the same name.

A file of directory ``D`` named ``<first_id>-<last_id>.parquet`` holds the messages for ``D`` that the
scanner delivers from the one with id ``first_id`` through the one with id ``last_id``, and no others:
the flusher buffers one directory's messages in delivery order and writes the buffer whole, and on a
replay it skips what a committed file holds, so the files of one directory never overlap.  The replay
reads from the first retained message (retention never cuts through a transaction, so every kept
transaction is delivered whole) and stops once every file is complete, or once it has delivered
everything stored when it began: a file whose first message is no longer there cannot be rebuilt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from flusher._buffers import Buffer, delete_rows, insert_destination, upsert_delete_rows
from flusher.layout import deletes_dir
from wal import bodies
from wal.message import MessageType, Position
from wal.options import DeliverPolicy, ReadOption
from wal.wal import WAL


class CollectionInfo(Protocol):
    name: str
    schema: pa.Schema
    primary_key: str


@dataclass(frozen=True, slots=True)
class Target:
    """A file to rebuild: its directory (relative to the root) and the ids its name states."""

    directory: str
    first_id: int
    last_id: int


async def rebuild(wal: WAL, targets: list[Target], collections: Mapping[tuple[str, str], CollectionInfo],
                  read_batch_bytes: int) -> dict[Target, Buffer]:
    """The buffers of the ``targets`` found whole in the WAL (a target missing from the result is lost).

    ``collections`` is the flusher's registry; CreateCollection messages read on the way add to a
    copy of it (a file can be older than the stored registry)."""
    registry = dict(collections)
    waiting: dict[tuple[str, int], Target] = {(t.directory, t.first_id): t for t in targets}
    open_: dict[str, tuple[Target, Buffer]] = {}
    done: dict[Target, Buffer] = {}
    stop_ts = wal.last_timetick
    if not waiting or stop_ts == 0:
        return done
    scanner = wal.read(ReadOption(deliver_policy=DeliverPolicy.all(), read_batch_bytes=read_batch_bytes))
    try:
        async for pack in scanner:
            commits = {m.txn.txn_id: m.timetick for m in pack.messages
                       if m.message_type is MessageType.COMMIT_TXN and m.txn is not None}
            for m in pack.messages:
                t = m.message_type
                if t is MessageType.CREATE_COLLECTION:
                    name = m.properties[bodies.PROP_COLLECTION]
                    if (m.vchannel, name) not in registry:
                        registry[(m.vchannel, name)] = _Created(name, bodies.read_schema(m),
                                                                m.properties[bodies.PROP_PRIMARY_KEY])
                    continue
                if t not in _DML:
                    continue
                c = registry.get((m.vchannel, m.properties.get(bodies.PROP_COLLECTION, "")))
                mid = m.message_id
                if c is None or mid is None:
                    continue
                # An UPSERT is in two files: its rows in the segment's, its delete entries in the deletes'.
                parts: list[tuple[str, int | None]] = []
                if t is not MessageType.DELETE:
                    parts.append(insert_destination(m, c.name))
                if t is not MessageType.INSERT:
                    parts.append((deletes_dir(c.name), None))
                for directory, segment in parts:
                    entry = open_.get(directory)
                    if entry is None and (directory, mid) not in waiting:
                        continue
                    if segment is not None:
                        schema, batch = c.schema, bodies.read_rows(m)
                    elif t is MessageType.UPSERT:
                        schema, batch = upsert_delete_rows(bodies.read_rows(m), c.schema, c.primary_key)
                    else:
                        schema, batch = delete_rows(m, c.schema, c.primary_key)
                    if entry is None:
                        entry = open_[directory] = (waiting.pop((directory, mid)), Buffer(
                            directory, c.name, schema, segment, Position(wal.pchannel, mid, 0),
                            primary_key=c.primary_key))
                    target, b = entry
                    ts = m.timetick if m.txn is None else commits.get(m.txn.txn_id, m.timetick)
                    b.add(batch, ts, (ts, mid), m.vchannel, len(m.payload))
                    if mid == target.last_id:
                        done[target] = b
                        del open_[directory]
            if (not waiting and not open_) or pack.end_ts >= stop_ts:
                break
    finally:
        await scanner.aclose()
    return done


_DML = frozenset({MessageType.INSERT, MessageType.DELETE, MessageType.UPSERT})


@dataclass(slots=True)
class _Created:
    name: str
    schema: pa.Schema
    primary_key: str


__all__ = ["CollectionInfo", "Target", "rebuild"]
