"""The ``streamingnode`` data source: its streaming reader, its batch reader and the checks at start.

Driver side (a Spark-owned Python process): ``schema()`` parses the options and asks the node whether
the pchannel exists (and, in collection mode, finds the collection's schema in the log); the stream
reader answers ``initialOffset`` / ``latestOffset`` with one ``GetLatestPosition`` call each, through a
client cached per process and connection, shared by the queries' readers and closed when the last of
them stops.  Executor side: ``read(partition)`` opens its own column stream, reads one
vchannel's ``(start, end]`` (``_columns.read_packs``) and yields an Arrow batch per pack.  The reader
objects hold only frozen option dataclasses, Arrow schemas and offsets, so they pickle.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from streamingnode.spark import _columns, _range, _rows
from streamingnode.spark._options import (
    EARLIEST,
    LATEST,
    Connection,
    Offset,
    OptionError,
    SourceOptions,
    parse_sink,
    parse_source,
)
from wal import bodies
from wal.errors import ChannelNotExistError, StreamingError, UnavailableError
from wal.message import MessageType

_clients: dict[Connection, Any] = {}
_users: dict[Connection, set[str]] = {}
"""The stream readers using each cached client (by their ``_user`` token): one query's ``stop()``
closes the client only when no other reader of the driver process uses it."""
_clients_lock = threading.Lock()


def _driver_client(conn: Connection, user: str) -> Any:
    """One client per connection per driver process (latestOffset runs every trigger), shared by the
    stream readers on it and closed when the last of them stops."""
    with _clients_lock:
        client = _clients.get(conn)
        if client is None:
            client = _clients[conn] = conn.client()
        _users.setdefault(conn, set()).add(user)
        return client


def _drop_driver_client(conn: Connection, user: str) -> None:
    """Reader ``user`` stopped: close the connection's client if no other reader uses it."""
    with _clients_lock:
        users = _users.get(conn)
        if users is not None:
            users.discard(user)
            if users:
                return
            del _users[conn]
        client = _clients.pop(conn, None)
    if client is not None:
        client.close()


class CollectionInfo:
    """A collection's schema and primary key, as its CREATE_COLLECTION message gave them."""

    def __init__(self, name: str, schema: pa.Schema, primary_key: str) -> None:
        self.name = name
        self.schema = schema
        self.primary_key = primary_key


def _check_node(opts: SourceOptions) -> CollectionInfo | None:
    """Fail now, naming the option, when the node is unreachable, the pchannel unknown or the
    collection absent; return the collection's schema in collection mode."""
    try:
        with opts.conn.client() as client:
            described = client.describe_channels([opts.pchannel])
            if opts.collection is None:
                return None
            first_id = described[0].first_id if described else None
            return _find_collection(client, opts, truncated=first_id is not None and first_id > 0)
    except ChannelNotExistError as exc:
        raise OptionError("pchannel", f"no pchannel {opts.pchannel!r} on {', '.join(opts.conn.addrs)}") from exc
    except UnavailableError as exc:
        raise OptionError("addr", f"cannot reach the node at {', '.join(opts.conn.addrs)} "
                                  f"within {opts.conn.timeout} s: {exc}") from exc
    except StreamingError as exc:
        raise OptionError("pchannel", f"the node refused to describe {opts.pchannel!r}: {exc}") from exc


def _find_collection(client: Any, opts: SourceOptions, *, truncated: bool) -> CollectionInfo:
    """The last CREATE_COLLECTION of the collection in the log, up to now.

    The schema is known only from that message, so collection mode needs it still in the log: once
    retention truncated it (``truncated``: the log no longer starts at id 0) and it is not found,
    the error says so, naming the collection, rather than that the collection does not exist."""
    assert opts.collection is not None
    end = _range.latest(client, opts.pchannel, Offset(opts.pchannel, -1, 0))
    found: CollectionInfo | None = None
    for vchannel in opts.vchannels or ("",):
        for m, _ in _range.read_range(client, Offset(opts.pchannel, -1, 0), end, vchannel,
                                      (int(MessageType.CREATE_COLLECTION),), timeout=opts.conn.timeout):
            if m.message_type is MessageType.CREATE_COLLECTION \
                    and m.properties.get(bodies.PROP_COLLECTION) == opts.collection:
                schema = bodies.read_schema(m)
                if found is not None and not found.schema.equals(schema):
                    raise OptionError("collection", f"collection {opts.collection!r} has two schemas in the "
                                                    "log (dropped and created again): read one vchannel")
                found = CollectionInfo(opts.collection, schema, m.properties[bodies.PROP_PRIMARY_KEY])
    if found is None and truncated:
        raise OptionError("collection", f"the CREATE_COLLECTION of collection {opts.collection!r} is no longer in "
                                        f"the log of {opts.pchannel!r}: retention truncated it, and collection "
                                        "mode takes the schema from it; read the flushed Parquet "
                                        "(flusher.read.spark.read_collection) instead")
    if found is None:
        raise OptionError("collection", f"no collection {opts.collection!r} in the log of {opts.pchannel!r}"
                                        + (f" (vchannels {', '.join(opts.vchannels)})" if opts.vchannels else ""))
    return found


class StreamingNodeDataSource(DataSource):
    """``spark.readStream.format("streamingnode")``, ``spark.read``, and the sink (see the package doc)."""

    @classmethod
    def name(cls) -> str:
        return "streamingnode"

    def schema(self) -> StructType | str:
        opts = parse_source(self.options)
        info = _check_node(opts)
        if info is None:
            return _rows.PLAIN_SCHEMA
        return _rows.collection_spark_schema(info.schema)  # type: ignore[no-any-return]

    def _reader_parts(self, schema: StructType) -> tuple[SourceOptions, pa.Schema, CollectionInfo | None]:
        opts = parse_source(self.options)
        info = _check_node(opts) if opts.collection is not None else None
        return opts, to_arrow_schema(schema, timezone="UTC"), info

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(*self._reader_parts(schema))

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(*self._reader_parts(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from streamingnode.spark._sink import StreamWriter  # noqa: PLC0415  (the sink only when writing)

        return StreamWriter(parse_sink(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from streamingnode.spark._sink import BatchWriter  # noqa: PLC0415

        return BatchWriter(parse_sink(self.options), schema)


class _Reads:
    """What the stream and batch readers share: partitions of a range, and reading one."""

    def __init__(self, opts: SourceOptions, arrow_schema: pa.Schema, info: CollectionInfo | None) -> None:
        self._opts = opts
        self._arrow = arrow_schema
        self._info = info
        self._empty = Offset(opts.pchannel, -1, 0)
        self._user = uuid.uuid4().hex
        """This reader among the users of the driver's shared client (a string: the reader pickles)."""

    def _resolve(self, raw: Offset | str, client: Any) -> Offset:
        if isinstance(raw, Offset):
            return raw
        if raw == EARLIEST:
            return self._empty
        return _range.latest(client, self._opts.pchannel, self._empty)

    def _partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        # One partition per vchannel: a vchannel's messages (and transactions) are read by one
        # consumer, in order.  Reading the whole pchannel is one partition: ids interleave the
        # vchannels' transactions, so no id boundary is safe without reading.
        if end.timetick <= start.timetick:
            return []
        return [InputPartition((v, start.to_json(), end.to_json())) for v in self._opts.vchannels or ("",)]

    def _read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        vchannel, raw_start, raw_end = partition.value
        start = Offset.from_json(raw_start, self._opts.pchannel)
        end = Offset.from_json(raw_end, self._opts.pchannel)
        types = self._opts.types
        if self._info is not None:
            types = (int(MessageType.INSERT), int(MessageType.UPSERT), int(MessageType.DELETE))
        packs = _columns.read_packs(self._opts.conn, start, end, vchannel, types)
        if self._info is None:
            for pack in packs:
                batch = _columns.plain_batch(pack, end.timetick, self._arrow)
                if batch is not None:
                    yield batch
        else:
            decoder = _rows.CollectionDecoder(self._info.name, self._info.schema, self._info.primary_key,
                                              self._arrow)
            yield from decoder.batches((m, visible) for pack in packs
                                       for m, visible in _range.visible_messages(_columns.pack_messages(pack))
                                       if visible <= end.timetick)


class StreamReader(_Reads, DataSourceStreamReader):
    """Micro-batches ``(start, end]`` by node position; ``end`` is the node's latest position (or, with
    ``maxMessagesPerTrigger``, the end of the first whole packs holding that many messages)."""

    def initialOffset(self) -> dict[str, Any]:
        return self._resolve(self._opts.starting if self._opts.starting is not None else LATEST,
                             _driver_client(self._opts.conn, self._user)).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._opts.max_messages is None:
            return ReadAllAvailable()
        return ReadMaxRows(self._opts.max_messages)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = Offset.from_json(start, self._opts.pchannel)
        client = _driver_client(self._opts.conn, self._user)
        end = _range.latest(client, self._opts.pchannel, begin)
        if end.timetick <= begin.timetick:
            return start  # nothing new: Spark runs no batch
        if isinstance(limit, ReadMaxRows):
            end = _range.end_after(client, begin, end, vchannels=self._opts.vchannels, types=self._opts.types,
                                   max_messages=limit.max_rows, timeout=self._opts.conn.timeout)
        return end.to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return self._partitions(Offset.from_json(start, self._opts.pchannel),
                                Offset.from_json(end, self._opts.pchannel))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._read(partition)

    def stop(self) -> None:
        _drop_driver_client(self._opts.conn, self._user)


class BatchReader(_Reads, DataSourceReader):
    """``spark.read``: ``startingOffsets`` (default earliest) to ``endingOffsets`` (default latest),
    resolved once when the read is planned."""

    def partitions(self) -> Sequence[InputPartition]:
        with self._opts.conn.client() as client:
            start = self._resolve(self._opts.starting if self._opts.starting is not None else EARLIEST, client)
            end = self._resolve(self._opts.ending, client)
        return self._partitions(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._read(partition)


__all__ = ["BatchReader", "CollectionInfo", "StreamReader", "StreamingNodeDataSource"]
