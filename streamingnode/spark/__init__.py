"""Spark reads the log live: a PySpark data source (streaming and batch) and sink named ``streamingnode``.

    from streamingnode.spark import register
    register(spark)                      # once per session
    orders = (spark.readStream.format("streamingnode")
              .option("addr", "localhost:19530").option("pchannel", "orders").load())

Pure Python (PySpark's Python Data Source API), no JVM code.

Options of the source: ``addr`` (host:port, comma-separated for a cluster's seeds), ``token``,
``tlsCa``/``tlsCert``/``tlsKey``, ``timeout`` (seconds, default 30: connecting and waiting for a pack),
``pchannel`` (required), ``vchannel`` (comma-separated; absent: the whole pchannel), ``types``
(comma-separated MessageType names, e.g. ``data,insert``), ``collection`` (collection mode),
``startingOffsets`` (``earliest``, ``latest``, an offset's JSON, or an ISO-8601 time with its zone,
refused without one; default latest when streaming, earliest in a batch read), ``endingOffsets``
(batch: ``latest`` or an offset's JSON), ``maxMessagesPerTrigger``.  The sink's are in ``_sink``.

Design:

* **Offsets** are node positions, ``{"pchannel", "message_id", "timetick"}`` (``message_id`` -1: the
  log's beginning), kept by Spark in its checkpoint.  Reading after an offset is the resume rule of
  ``Position``: ``DeliverPolicy.start_from(message_id)`` plus ``DeliverFilter.timetick_gt(timetick)``.
  A micro-batch is ``(start, end]``: the messages visible after ``start`` and by ``end`` (a
  transaction's body is visible at its commit), so consecutive batches never overlap, never leave a
  gap, and never split a transaction; only committed bodies are ever delivered.  ``latestOffset``
  asks the node its latest position (one unary call); with ``maxMessagesPerTrigger`` it reads from
  ``start`` on the driver and ends the batch at the end of the first whole packs holding that many
  messages (a pack is one tick's release and holds whole transactions, so it is never cut).  An
  idle pchannel runs no micro-batches: the node stores a TimeTick only after data, so the latest
  position stands still while nothing is written, and ``latestOffset`` returns ``start``.
* **Partitions**: one Spark partition per vchannel when ``vchannel`` lists several, each read by its
  own consumer over the batch's range (a vchannel's order and its transactions stay in one task);
  the whole pchannel (no ``vchannel``) is one partition, because message ids interleave the
  vchannels' transactions and no id boundary is known to be safe without reading.  A broadcast
  message (vchannel "") reaches every vchannel, so it appears once per listed vchannel.
* **Readers run on executors** (separate Python workers): each ``read`` opens its own ``Consume``
  stream from the options, asking for column packs, and builds plain rows from the packed arrays
  without a Python object per message (``_columns``); reader objects hold only plain values.  The
  driver keeps one client per process for ``latestOffset``.
* **Bad options** (missing or malformed, an unknown pchannel or collection, an address that does not
  answer within ``timeout``) raise ``OptionError`` from ``schema()``: the query fails at ``load()``
  with an ``AnalysisException`` whose message names the option.
* **Collection mode** takes the collection's schema from its CREATE_COLLECTION message, scanned for
  in the log when the query starts: once retention has truncated that message, ``load()`` fails
  naming the collection (read the flushed Parquet with ``flusher.read.spark.read_collection`` instead).
* **Rows**: see ``_rows`` (plain mode and collection mode).  **Sink** and what its exactly once covers:
  see ``_sink``.
"""

from __future__ import annotations

from typing import Any

from streamingnode.spark._options import Offset, OptionError
from streamingnode.spark._source import StreamingNodeDataSource
from streamingnode.spark._workers import WorkerPythonError, check_worker_python


def register(spark: Any) -> None:
    """Make ``format("streamingnode")`` known to ``spark`` (a SparkSession).

    With a local master, first checks that Spark's Python workers can import the source (they run
    ``$PYSPARK_PYTHON`` as it was when the session started, else ``python3`` from the PATH), and
    raises WorkerPythonError saying how to point them at this interpreter when they cannot
    (``streamingnode.spark._workers``).
    """
    check_worker_python(spark)
    spark.dataSource.register(StreamingNodeDataSource)


__all__ = ["Offset", "OptionError", "StreamingNodeDataSource", "WorkerPythonError", "register"]
