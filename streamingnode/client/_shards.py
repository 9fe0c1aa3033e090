"""ShardedCollection: one collection over N vchannels of a pchannel (Milvus's shards).

``data.sharded("v", "users", shards=4, primary_key="pk")`` names the collection ``users`` on the
vchannels ``v_0`` .. ``v_3``; ``create(schema)`` creates it on each.  Every row goes to shard
``shard_of(key, shards)`` of its primary key, so every version of a key (its inserts, deletes and
upserts) is in one shard, in that shard's order.  A write that touches several shards is one message
per shard, sent together: each is atomic, the whole is not (as in Milvus, and a transaction is on one
vchannel).  The flusher writes the shards of one collection name into one directory, so the readers
see one table.

The shard count is part of the collection: every writer must use the one it was created with.  It is
not stored on the node; a writer with another count would send a key to another shard, where a delete
no longer finds its earlier versions in order.
"""

from __future__ import annotations

import asyncio
import struct
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from wal import bodies
from wal.errors import InvalidArgumentError
from wal.message import AppendResult, Message

if TYPE_CHECKING:
    from streamingnode.client._data import DataClient

MAX_SHARDS = 256
"""Most shards one collection may have: each is a vchannel with its own segments and files."""


def shard_vchannel(base: str, index: int) -> str:
    """The vchannel of shard ``index`` of a collection on ``base``: ``<base>_<index>``."""
    return f"{base}_{index}"


def shard_of(key: int | str, shards: int) -> int:
    """The shard of a primary key: CRC-32 of its canonical bytes modulo ``shards``.

    The bytes are the little-endian two's complement int64 of an integer key and the UTF-8 of a
    string key, so every process, language and version agrees (Python's ``hash()`` is salted).
    """
    if isinstance(key, bool) or not isinstance(key, int | str):
        raise InvalidArgumentError(
            f"a primary key is an int64 or a string, got {type(key).__name__} {key!r:.200}", field="primary_key")
    if isinstance(key, str):
        data = key.encode()
    else:
        try:
            data = struct.pack("<q", key)
        except struct.error:
            raise InvalidArgumentError(f"primary key {key!r:.200} is outside int64", field="primary_key") from None
    return zlib.crc32(data) % shards


def _routes(keys: Sequence[Any], shards: int, what: str) -> dict[int, list[int]]:
    """{shard: positions of its keys, ascending}."""
    out: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        if key is None:
            raise InvalidArgumentError(f"{what} has a null primary key at row {i}", field="primary_key")
        out.setdefault(shard_of(key, shards), []).append(i)
    return out


class ShardedCollection:
    """A collection on ``shards`` vchannels (``<vchannel>_0`` ..), written by primary key.  Made by
    ``DataClient.sharded``; it holds no connection of its own (the DataClient's producer sends)."""

    def __init__(self, data: DataClient, vchannel: str, name: str, shards: int, primary_key: str) -> None:
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
            raise InvalidArgumentError(f"shards must be an integer from 1 to {MAX_SHARDS}, got {shards!r:.200}",
                                       field="shards")
        if not isinstance(primary_key, str) or not primary_key:
            raise InvalidArgumentError("a sharded collection needs its primary key column name", field="primary_key")
        bodies.validate_name("collection", name)
        self._data = data
        self.name = name
        self.primary_key = primary_key
        self.vchannels = [shard_vchannel(vchannel, i) for i in range(shards)]
        """The shards' vchannels, shard ``i`` at index ``i``."""

    @property
    def shards(self) -> int:
        return len(self.vchannels)

    def shard_of(self, key: int | str) -> int:
        """The shard that holds every version of ``key``."""
        return shard_of(key, self.shards)

    async def _each(self, make: Any) -> list[AppendResult]:
        return await self._data.send_all([make(v) for v in self.vchannels])

    async def create(self, schema: pa.Schema) -> list[AppendResult]:
        """Create the collection on every shard (one result per shard, in shard order)."""
        return await self._each(lambda v: bodies.create_collection(v, self.name, schema, self.primary_key))

    async def drop(self) -> list[AppendResult]:
        return await self._each(lambda v: bodies.drop_collection(v, self.name))

    async def create_partition(self, partition: str) -> list[AppendResult]:
        return await self._each(lambda v: bodies.create_partition(v, self.name, partition))

    async def drop_partition(self, partition: str) -> list[AppendResult]:
        return await self._each(lambda v: bodies.drop_partition(v, self.name, partition))

    def _split_rows(self, data: pa.RecordBatch | pa.Table, build: Any) -> list[Message]:
        if not isinstance(data, pa.RecordBatch | pa.Table):
            raise InvalidArgumentError(f"rows of {self.name!r} must be a RecordBatch or Table, got "
                                       f"{type(data).__name__}", collection=self.name)
        if data.num_rows == 0:
            return [build(self.vchannels[0], data)]  # the builder's own "no rows" error
        if self.primary_key not in data.schema.names:
            raise InvalidArgumentError(f"rows of {self.name!r} have no primary key column {self.primary_key!r}",
                                       field=self.primary_key, collection=self.name)
        keys = data.column(self.primary_key).to_pylist()
        routes = _routes(keys, self.shards, f"rows of {self.name!r}")
        return [build(self.vchannels[s], data.take(pa.array(rows, pa.int64()))) for s, rows in sorted(routes.items())]

    async def insert(
        self, data: pa.RecordBatch | pa.Table, partition: str = bodies.DEFAULT_PARTITION,
    ) -> list[AppendResult]:
        """Insert rows, each into its key's shard: one INSERT per shard that gets rows, results in
        shard order.  The rows are readable as of the largest timetick of the results."""
        return await self._data.send_all(
            self._split_rows(data, lambda v, rows: bodies.insert(v, self.name, rows, partition)))

    async def delete(self, keys: pa.Array | pa.ChunkedArray | Sequence[Any]) -> list[AppendResult]:
        """Delete by primary key: one DELETE per shard holding some of ``keys``, results in shard order."""
        values = keys.to_pylist() if isinstance(keys, pa.Array | pa.ChunkedArray) else list(keys)
        if not values:
            return [await self._data.delete(self.vchannels[0], self.name, values)]  # its "needs keys" error
        routes = _routes(values, self.shards, f"delete keys of {self.name!r}")
        arrow_keys = keys if isinstance(keys, pa.Array | pa.ChunkedArray) else None
        messages = []
        for s, positions in sorted(routes.items()):
            part: pa.Array | pa.ChunkedArray | list[Any] = (
                arrow_keys.take(pa.array(positions, pa.int64())) if arrow_keys is not None
                else [values[i] for i in positions])
            messages.append(bodies.delete(self.vchannels[s], self.name, part))
        return await self._data.send_all(messages)

    async def upsert(
        self, data: pa.RecordBatch | pa.Table, partition: str = bodies.DEFAULT_PARTITION,
    ) -> list[AppendResult]:
        """Replace the rows of the keys in ``data`` (each in its key's shard): one UPSERT per shard."""
        if isinstance(data, pa.RecordBatch | pa.Table) and self.primary_key in data.schema.names:
            # Checked here, before any shard is written: the node refuses a key twice in one UPSERT,
            # and would refuse only the shard holding it.
            seen: set[Any] = set()
            for twice in data.column(self.primary_key).to_pylist():
                if twice not in seen:
                    seen.add(twice)
                    continue
                raise InvalidArgumentError(f"upsert into {self.name!r} holds key {twice!r:.200} twice",
                                           field=self.primary_key, collection=self.name)
        return await self._data.send_all(
            self._split_rows(data, lambda v, rows: bodies.upsert(v, self.name, rows, partition)))

    async def flush(self) -> tuple[list[str], int]:
        """Flush every shard: (the Parquet files written, the largest flush timetick)."""
        results = await asyncio.gather(*(self._data.flush(v, self.name) for v in self.vchannels))
        return [f for files, _ in results for f in files], max(ts for _, ts in results)


__all__ = ["MAX_SHARDS", "ShardedCollection", "shard_of", "shard_vchannel"]
