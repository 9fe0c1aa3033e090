"""The ``streamingnode`` sink: ``df.writeStream.format("streamingnode")`` and ``df.write``.

Plain mode: each row becomes one DATA message; columns ``payload`` (binary or string, required),
``vchannel`` (string; else the ``vchannel`` option) and ``properties`` (map<string,string>).
Collection mode (``collection`` and ``vchannel`` options): the rows are the collection's columns, sent
as INSERT messages of ``rowsPerMessage`` rows each.

Exactly once, and what it covers: a task writes through idempotent producers whose ids are derived
from (query id, batch id, partition id, chunk): ``spark:<query>:<batch>:<partition>:<chunk>``, each
starting at sequence 0 and sending at most ``CHUNK`` messages, which is within the node's dedup
window.  A retried task, or the batch re-run after the query restarts from its checkpoint, sends the
same messages with the same ids and sequences, and the node answers them with the results it already
has instead of writing them again.  This holds when

* the rows a task writes come in the same order on a retry (true for a deterministic plan over this
  source, Kafka or files; not for a plan whose partition contents depend on timing);
* the retry comes while the node still remembers the producers (its dedup table keeps the last 10,000
  producers, least recently used out: about 40 M messages of other idempotent writers in between);
* for ``df.write`` (no query, no batch id), within one job: a writer id is drawn when the write
  starts, so a task retry is deduplicated but running the job twice writes twice, unless you give
  the same ``writeId`` option both times.

Rows are in the log (and visible to readers) once a task ends, before Spark commits the batch; a batch
that Spark then re-runs adds nothing.  Nothing is rolled back when a query is abandoned mid-batch.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, MapType, Row, StringType, StructType

from streamingnode.spark._options import OptionError, SinkOptions
from wal import bodies
from wal.message import MessageType

CHUNK = 2048
"""Messages per idempotent producer: well within the node's dedup window (4096), so a whole chunk is
remembered when it is sent again."""

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""Local properties Spark's micro-batch execution sets on every task: stable across task retries and,
for the query id, across restarts from the checkpoint."""


class WriteResult(WriterCommitMessage):
    """What a task wrote: the producer id prefix it used and how many messages."""

    def __init__(self, producer_prefix: str, messages: int) -> None:
        self.producer_prefix = producer_prefix
        self.messages = messages


def _check_input(opts: SinkOptions, schema: StructType) -> None:
    names = {f.name: f.dataType for f in schema.fields}
    if opts.collection is not None:
        return  # the node checks the rows against the collection's schema on every insert
    payload = names.get("payload")
    if payload is None:
        raise OptionError("payload", "plain mode writes a 'payload' column (binary or string); the "
                                     f"input has {sorted(names)}")
    if not isinstance(payload, BinaryType | StringType):
        raise OptionError("payload", f"the payload column must be binary or string, got {payload.simpleString()}")
    if "vchannel" not in names and opts.vchannel is None:
        raise OptionError("vchannel", "give the vchannel option or a 'vchannel' column")
    props = names.get("properties")
    if props is not None and not (isinstance(props, MapType) and isinstance(props.keyType, StringType)
                                  and isinstance(props.valueType, StringType)):
        raise OptionError("properties", f"the properties column must be map<string,string>, got {props.simpleString()}")


class _Writes:
    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        _check_input(opts, schema)
        self._opts = opts
        self._columns = [f.name for f in schema.fields]
        self._write_id = opts.write_id

    def _messages(self, rows: Iterator[Row]) -> Iterator[tuple[str, bytes, dict[str, str] | None, MessageType]]:
        opts = self._opts
        if opts.collection is None:
            for row in rows:
                d = row.asDict()
                payload = d["payload"]
                if payload is None:
                    raise ValueError("a row of the streamingnode sink has a null payload")
                if isinstance(payload, str):
                    payload = payload.encode()
                vchannel = str(d.get("vchannel") or opts.vchannel)
                props = d.get("properties")
                yield vchannel, bytes(payload), dict(props) if props else None, MessageType.DATA
            return
        assert opts.vchannel is not None
        pending: list[dict[str, Any]] = []
        for row in rows:
            pending.append(row.asDict(recursive=True))
            if len(pending) >= opts.rows_per_message:
                yield self._insert(pending)
                pending = []
        if pending:
            yield self._insert(pending)

    def _insert(self, rows: list[dict[str, Any]]) -> tuple[str, bytes, dict[str, str] | None, MessageType]:
        assert self._opts.vchannel is not None and self._opts.collection is not None
        m = bodies.insert(self._opts.vchannel, self._opts.collection, pa.Table.from_pylist(rows))
        return m.vchannel, m.payload, dict(m.properties), m.message_type

    def _write(self, rows: Iterator[Row], prefix: str) -> WriteResult:
        with asyncio.Runner() as runner:
            total = runner.run(self._send_all(self._messages(rows), prefix))
        return WriteResult(prefix, total)

    async def _send_all(self, messages: Iterator[tuple[str, bytes, dict[str, str] | None, MessageType]],
                        prefix: str) -> int:
        from streamingnode.client import AsyncClient  # noqa: PLC0415  (executors import lazily)

        conn = self._opts.conn
        total = 0
        async with AsyncClient(list(conn.addrs), timeout=conn.timeout, reconnect_timeout=conn.timeout,
                               token=conn.token, tls_ca=conn.tls_ca, tls_cert=conn.tls_cert,
                               tls_key=conn.tls_key) as client:
            chunk = 0
            batch: list[tuple[str, bytes, dict[str, str] | None, MessageType]] = []
            for message in messages:
                batch.append(message)
                if len(batch) == CHUNK:
                    total += await self._send_chunk(client, f"{prefix}:{chunk}", batch)
                    chunk, batch = chunk + 1, []
            if batch:
                total += await self._send_chunk(client, f"{prefix}:{chunk}", batch)
        return total

    async def _send_chunk(self, client: Any, producer_id: str,
                          batch: list[tuple[str, bytes, dict[str, str] | None, MessageType]]) -> int:
        # A fresh producer per chunk, always from sequence 0: a retry of this chunk is answered from
        # the node's dedup table, message by message.
        async with client.producer(self._opts.pchannel, producer_id=producer_id, first_sequence=0) as producer:
            futures = [producer.send_nowait(v, p, properties=props, type=t) for v, p, props, t in batch]
            await asyncio.gather(*futures)
        return len(batch)


class StreamWriter(_Writes, DataSourceStreamWriter):
    """The streaming sink (see the module docstring for what exactly once covers)."""

    def write(self, iterator: Iterator[Row]) -> WriteResult:
        from pyspark import TaskContext  # noqa: PLC0415

        ctx = TaskContext.get()
        assert ctx is not None
        query = self._write_id or ctx.getLocalProperty(QUERY_ID_PROPERTY)
        batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
        return self._write(iterator, f"spark:{query}:{batch}:{ctx.partitionId()}")

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: each task's messages are durable when it ends."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: what tasks wrote stays, and a re-run of the batch is deduplicated."""


class BatchWriter(_Writes, DataSourceWriter):
    """``df.write``: one writer id per job (drawn on the driver), or the ``writeId`` option."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        super().__init__(opts, schema)
        self._write_id = opts.write_id or uuid.uuid4().hex

    def write(self, iterator: Iterator[Row]) -> WriteResult:
        from pyspark import TaskContext  # noqa: PLC0415

        ctx = TaskContext.get()
        assert ctx is not None
        return self._write(iterator, f"spark:{self._write_id}:batch:{ctx.partitionId()}")


__all__ = ["CHUNK", "BatchWriter", "StreamWriter", "WriteResult"]
