"""Print a flushed collection as of a time: ``python -m flusher.spark_job`` or ``spark-submit flusher/spark_job.py``.

    python -m flusher.spark_job --root ./flushed --collection books --count
    python -m flusher.spark_job --root ./flushed --collection books --as-of 2026-01-01T12:00:00Z --show 5
    PYSPARK_PYTHON=.venv/bin/python spark-submit --master 'local[2]' flusher/spark_job.py --root ./flushed \
        --collection books --as-of 464...  # a timetick

``--as-of`` takes an ISO 8601 time with a zone (``Z`` or ``+01:00``; everything up to that millisecond) or an
integer timetick. ``--count`` prints the number of rows on a line of its own; ``--show N`` prints the first N rows
as a table (``--show 0`` prints none); with neither, 20 rows are shown. Started by plain ``python``, the job runs
Spark locally bound to 127.0.0.1; under spark-submit it uses the master and settings spark-submit gives it (and
runs the file with ``PYSPARK_PYTHON``, by default the ``python3`` on PATH: point it at the venv).
Exits 2 with a message on stderr when the collection does not exist or the arguments are wrong.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

if __package__ in (None, ""):
    # spark-submit runs this file as a script, which puts flusher/ itself first on sys.path: there
    # `import flusher` would find flusher/flusher.py instead of the package. Put the package's parent there.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, os.path.dirname(_here))

from flusher.read.spark import CollectionLayoutError, CollectionNotFoundError, as_of, read_collection
from wal.zoned_time import ZONE_FORMS, NaiveTimeError, parse_zoned

DEFAULT_SHOW = 20


def parse_as_of(text: str) -> int:
    """An integer timetick as is, or an ISO 8601 time with a zone as the timetick bounding that millisecond."""
    moment: int | datetime
    try:
        moment = int(text)
    except ValueError:
        try:
            moment = parse_zoned(text, "--as-of")
        except NaiveTimeError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a timetick or {ZONE_FORMS}: {text!r}") from None
    try:
        return as_of(moment)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="flusher.spark_job", description="Read a flushed collection with Spark.")
    parser.add_argument("--root", required=True, help="the flusher's root directory (a path or a URI)")
    parser.add_argument("--collection", required=True, help="the collection's name")
    parser.add_argument("--as-of", type=parse_as_of, default=None, metavar="ISO|TIMETICK", help="default: all")
    parser.add_argument("--primary-key", default=None, help="default: from the data files' metadata")
    parser.add_argument("--show", type=int, default=None, metavar="N", help=f"print N rows (default {DEFAULT_SHOW})")
    parser.add_argument("--count", action="store_true", help="print the number of rows")
    return parser


def _session() -> SparkSession:
    from pyspark.sql import SparkSession  # noqa: PLC0415  (only after the arguments are known to be good)

    builder = SparkSession.builder.appName("streamingnode-read").config("spark.ui.showConsoleProgress", "false")
    # spark-submit hands its JVM over in these variables; without them pyspark starts a JVM of its own, which
    # would otherwise bind the machine's external interface.
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (
            builder.master("local[*]")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
        )
    spark = builder.getOrCreate()
    # ERROR, not WARN: reading `_deletes` logs "All paths were ignored" at WARN (about its `_` name; it is read).
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv: list[str] | None = None) -> int:
    """Run the job; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.show is not None and args.show < 0:
        parser.error("--show takes a count >= 0")
    root = str(args.root)
    # Fail before paying for a JVM when a local collection is plainly missing (Spark would say so too, later).
    if "://" not in root and not os.path.isdir(os.path.join(root, args.collection)):
        print(f"error: {CollectionNotFoundError(os.path.join(root, args.collection))}", file=sys.stderr)
        return 2
    spark = _session()
    try:
        df = read_collection(spark, root, args.collection, as_of_ts=args.as_of, primary_key=args.primary_key)
        if args.count:
            print(df.count(), flush=True)
        show = args.show if args.show is not None else (0 if args.count else DEFAULT_SHOW)
        if show:
            df.show(show, truncate=False)
    except (CollectionNotFoundError, CollectionLayoutError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
