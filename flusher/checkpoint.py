"""A flusher's checkpoint: where its reader resumes, stored with the collection registry in one WAL meta
value (``put_meta``), so that a crash can never separate the two.

It is stored only after the files it steps over are durable (the flusher's ``_write`` returns once
they are), at once after a write or a registry change, else at most every ``interval_seconds``.  See
flusher/README.md "Exactly once", step 3.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import structlog

from flusher.commit import crash_point
from interceptors.recovery.snapshot import load_snapshot
from interceptors.shard.interceptor import ShardInterceptor
from wal.message import Position
from wal.wal import WAL

log = structlog.get_logger(__name__)

CHECKPOINT_META = "flusher_checkpoint"
"""The default WAL meta key of a flusher's checkpoint (``FlusherConfig.checkpoint_name``)."""


@dataclass(slots=True)
class CollectionEntry:
    """A collection of the registry: what the flusher needs to write its rows and delete entries."""

    vchannel: str
    name: str
    schema: pa.Schema
    primary_key: str
    dropped: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"vchannel": self.vchannel, "name": self.name, "primary_key": self.primary_key,
                "dropped": self.dropped, "schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode()}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> CollectionEntry:
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(raw["schema"])))
        return cls(raw["vchannel"], raw["name"], schema, raw["primary_key"], bool(raw["dropped"]))


Registry = dict[tuple[str, str], CollectionEntry]
"""The collections by (vchannel, name)."""


class Checkpoint:
    """The checkpoint of one flusher of ``wal`` under the meta key ``name``, with its ``registry``
    (the flusher's own dict: loaded into and stored from in place)."""

    def __init__(self, wal: WAL, name: str, interval_seconds: float, registry: Registry) -> None:
        self._wal = wal
        self._name = name
        self._interval = interval_seconds
        self._registry = registry
        self._saved: tuple[int, int] | None = None
        self._saved_at = 0.0
        self._registry_changed = False
        self._wrote = False

    @property
    def saved(self) -> tuple[int, int] | None:
        """(message id, timetick) of the stored checkpoint, or None before the first."""
        return self._saved

    @property
    def position(self) -> Position:
        """The stored checkpoint as a position (the first retained id before the first)."""
        if self._saved is None:
            return Position(self._wal.pchannel, self._wal.first_id, 0)
        return Position(self._wal.pchannel, self._saved[0], self._saved[1])

    def registry_changed(self) -> None:
        """A collection was created, dropped or seeded: the next ``maybe_store`` stores."""
        self._registry_changed = True

    def file_written(self) -> None:
        """A file was committed: the next ``maybe_store`` stores without waiting for the interval."""
        self._wrote = True

    async def load(self) -> bool:
        """Read the stored checkpoint and its registry; True when there is one to resume from.

        Without one (none stored, or one below the retained log) the registry is seeded from the
        recovery snapshot retention stored, for the collections whose CreateCollection is gone."""
        raw = await self._wal.get_meta(self._name)
        saved = json.loads(raw) if raw is not None else None
        if saved is not None and int(saved["message_id"]) < self._wal.first_id:
            # Retention truncated past a checkpoint left while this flusher was off: what lay between
            # is gone from the log.  Start from the first retained message, as without a checkpoint.
            log.warning("flusher checkpoint is below the retained log; messages in between were never "
                        "written to Parquet", pchannel=self._wal.pchannel, checkpoint=int(saved["message_id"]),
                        first_id=self._wal.first_id)
            saved = None
        if saved is None:
            await self._seed_from_snapshot()
            return False
        for c in saved["collections"]:
            coll = CollectionEntry.from_json(c)
            self._registry[(coll.vchannel, coll.name)] = coll
        self._saved = (int(saved["message_id"]), int(saved["timetick"]))
        return True

    async def _seed_from_snapshot(self) -> None:
        """Reading from the first retained message: the collections created before it are known only
        from the recovery snapshot that retention stored with the truncation (the CreateCollection
        messages are gone).

        When the snapshot is above the first retained id (a crash between storing it and truncating),
        drops it records may still be ahead in the log: those collections are seeded live, and the
        DropCollection, when read, marks them dropped as usual.
        """
        if self._wal.first_id == 0:
            return  # nothing was ever truncated: every CreateCollection is in the log
        snapshot = await load_snapshot(self._wal)
        if snapshot is None:
            return
        exact = snapshot.message_id <= self._wal.first_id
        for c in snapshot.steps.get(ShardInterceptor.name, {}).get("collections", []):
            coll = CollectionEntry.from_json(c)
            if not exact:
                coll.dropped = False
            self._registry[(coll.vchannel, coll.name)] = coll
        self._registry_changed = True

    async def maybe_store(self, now: float, pos: Position) -> None:
        """Store ``pos`` (every message before it is in committed files, or needs none) with the
        registry, when it moved or the registry changed, and a file was written or the interval is over."""
        target = (pos.message_id, pos.timetick)
        if self._saved is not None and target <= self._saved and not self._registry_changed:
            return
        if not self._wrote and now - self._saved_at < self._interval:
            return
        value = {"version": 1, "message_id": target[0], "timetick": target[1],
                 "collections": [c.to_json() for c in self._registry.values()]}
        await self._wal.put_meta(self._name, json.dumps(value).encode())
        crash_point("checkpoint")
        self._saved = max(target, self._saved) if self._saved is not None else target
        self._saved_at = now
        self._wrote = False
        self._registry_changed = False


__all__ = ["CHECKPOINT_META", "Checkpoint", "CollectionEntry", "Registry"]
