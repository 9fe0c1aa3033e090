"""Kept so that code written against ``flusher.duckdb`` goes on working: the reader lives in ``flusher.read.duckdb``."""

from flusher.read.duckdb import read_collection_duckdb

__all__ = ["read_collection_duckdb"]
