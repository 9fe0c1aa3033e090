"""Kept so that jobs written against ``flusher.spark`` go on working: the reader lives in ``flusher.read.spark``."""

from flusher.read.spark import (
    DELETES_DIR,
    DROPPED_MARKER,
    PRIMARY_KEY_METADATA,
    AsOfBeforeHorizonError,
    CollectionLayoutError,
    CollectionNotFoundError,
    DamagedFileError,
    as_of,
    read_collection,
    read_collection_arrow,
)

__all__ = [
    "DELETES_DIR",
    "DROPPED_MARKER",
    "PRIMARY_KEY_METADATA",
    "AsOfBeforeHorizonError",
    "CollectionLayoutError",
    "CollectionNotFoundError",
    "DamagedFileError",
    "as_of",
    "read_collection",
    "read_collection_arrow",
]
