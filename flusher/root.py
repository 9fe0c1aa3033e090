"""The Parquet root as the operator gives it: a path, or a URI read through pyarrow's filesystem layer.

The flusher commits a file by writing a temporary, fsyncing it and renaming it into place; readers
never see a half-written file because the rename is atomic.  A local or shared POSIX filesystem (NFS,
a cluster filesystem mounted at the same path on every node) gives that; object stores (S3, GCS,
Azure, HDFS through its gateway) do not: a "rename" there is a copy then a delete, so a reader could
list a file twice or half of a commit.  Until the commit protocol has an object-store form they are
refused at start, naming the scheme, instead of losing rows quietly later.
"""

from __future__ import annotations

from pathlib import Path

from wal.errors import InvalidArgumentError

FIELD = "parquet_dir"
_LOCAL = ("file", "local")


def parquet_root(value: str) -> Path:
    """The local directory ``value`` names: a plain path, or a ``file://`` URI.  InvalidArgumentError
    (field ``parquet_dir``) for an object-store URI or a URI pyarrow cannot read."""
    text = value.strip()
    if "://" not in text:
        return Path(text)
    scheme = text.split("://", 1)[0].lower()
    shown = text if len(text) <= 200 else f"{text[:200]}..."
    if scheme not in _LOCAL:
        raise InvalidArgumentError(
            f"parquet root {shown!r}: {scheme}:// is not supported yet: the flusher commits Parquet files by "
            f"atomic rename, which object stores lack; give a shared filesystem path or a file:// URI",
            field=FIELD)
    from pyarrow import ArrowInvalid  # noqa: PLC0415  (pyarrow only when a URI is given)
    from pyarrow.fs import FileSystem, LocalFileSystem  # noqa: PLC0415

    try:
        fs, path = FileSystem.from_uri(text)
    except (ArrowInvalid, ValueError, OSError) as exc:
        raise InvalidArgumentError(f"parquet root {shown!r} is not a valid URI: {exc}", field=FIELD) from None
    if not isinstance(fs, LocalFileSystem):  # pragma: no cover  (file:// always maps to the local one)
        raise InvalidArgumentError(f"parquet root {shown!r} is not on a local filesystem", field=FIELD)
    return Path(path)


__all__ = ["parquet_root"]
