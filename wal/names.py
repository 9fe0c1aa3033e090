"""The rules for names: one per kind (pchannel, vchannel, consumer group, collection, partition).

A name comes from a client, so it is checked once where it enters (the service's handlers and the
embedded API) and refused with ``InvalidArgumentError`` naming the kind and the field.  Every rule
refuses what could become a path or break a log line: ``.``, ``..``, ``/``, ``\\``, NUL, control and
other unprintable characters.  Names that become directory names (pchannels under the Parquet root,
collections and partitions under a pchannel's directory) are further kept to a portable ASCII set
and to lengths whose directory entries fit the usual 255-byte limit; vchannels and consumer groups
are only keys, so any printable Unicode is allowed there.

``shorten`` is what a message quotes of a value: at most about ``QUOTE_CHARS`` characters, so that a
10,000-character name cannot blow up an error (nor the gRPC metadata that carries it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from wal.errors import InvalidArgumentError

QUOTE_CHARS = 200
"""How much of a bad value an error message quotes."""


def shorten(value: object, limit: int = QUOTE_CHARS) -> str:
    """``repr(value)`` cut to about ``limit`` characters, saying how long the value was when cut."""
    if isinstance(value, str | bytes) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} {'chars' if isinstance(value, str) else 'bytes'})"
    text = repr(value)
    # Escapes (``\x00``, ``\U0001f600``) can make the repr of a short value long; cut that too.
    return text if len(text) <= limit else f"{text[:limit]}..."


@dataclass(frozen=True, slots=True)
class NameRule:
    """One kind of name: its longest length and its allowed characters.

    ``ascii`` rules take names that match ``pattern`` (they become directory names); the others take
    any printable name without a path separator.  ``max_bytes`` bounds the UTF-8 length.
    """

    kind: str
    max_bytes: int
    allowed: str
    """The rule in words, for the error message."""
    pattern: re.Pattern[str] | None = None
    reserved: frozenset[str] = frozenset()
    """Names the node keeps for itself (directories it makes beside the names of this kind)."""

    def check(self, value: object, field: str | None = None, *, allow_empty: bool = False) -> str:
        """``value`` when it is a valid name of this kind (or empty and ``allow_empty``); otherwise
        ``InvalidArgumentError`` naming the kind and ``field`` (default: the kind)."""
        if isinstance(value, str) and self.is_valid(value, allow_empty=allow_empty):
            return value
        field = field or self.kind
        if isinstance(value, str) and not value:
            raise InvalidArgumentError(f"invalid {self.kind} name in {field}: empty ({field} is required)",
                                       field=field, kind=self.kind)
        if isinstance(value, str) and value in self.reserved:
            raise InvalidArgumentError(f"invalid {self.kind} name in {field}: {value!r} is reserved by the node",
                                       field=field, kind=self.kind)
        raise InvalidArgumentError(
            f"invalid {self.kind} name in {field}: {shorten(value)}; {self.allowed}, "
            f"at most {self.max_bytes} bytes", field=field, kind=self.kind)

    def is_valid(self, value: str, *, allow_empty: bool = False) -> bool:
        """Whether ``check`` would accept ``value``, without building an error."""
        if not value:
            return allow_empty
        if len(value) > self.max_bytes:  # before anything that walks the value
            return False
        if value in self.reserved:
            return False
        if self.pattern is not None:
            return self.pattern.fullmatch(value) is not None
        # isprintable() refuses control, format, surrogate, private-use and unassigned characters and
        # line/paragraph separators: nothing that can split or hide part of a log line.
        return (value.isprintable() and "/" not in value and "\\" not in value and value not in (".", "..")
                and len(value.encode()) <= self.max_bytes)


# Not starting with '.' (hidden, and '.' / '..'), nor '-' (read as an option by shell tools).
PCHANNEL = NameRule(
    "pchannel", 128, "use ASCII letters, digits, '_', '-' and '.', not starting with '.' or '-'",
    re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"))
"""A pchannel names a directory under the Parquet root, and a destroyed one is moved aside as
``<name>-<key>-<ns>``: 128 leaves room for that suffix within 255 bytes."""

VCHANNEL = NameRule("vchannel", 255, "use printable characters without '/' or '\\', not '.' or '..'")
"""Empty means broadcast where a message is produced: pass ``allow_empty=True`` there."""

CONSUMER_GROUP = NameRule("consumer group", 255, "use printable characters without '/' or '\\', not '.' or '..'")

QUARANTINE_DIR = "_quarantine"
"""Where the flusher moves damaged Parquet files: a directory beside the collections' own."""

DELETES_DIR = "_deletes"
"""Where the flusher writes delete files (``_deletes/<collection>/``): a directory beside the
collections' own, kept out of them so that a glob of a collection's files reads data only."""

COLLECTION = NameRule(
    "collection", 255, "use ASCII letters, digits, '_' and '-', starting with a letter or '_'",
    re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*"), frozenset({QUARANTINE_DIR, DELETES_DIR}))
"""A collection names a directory under its pchannel's directory, beside ``QUARANTINE_DIR`` and
``DELETES_DIR``."""

PARTITION = NameRule(
    "partition", 245, "use ASCII letters, digits, '_' and '-', starting with a letter or '_'",
    re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*"))
"""A partition names the directory ``partition=<name>``: 245 keeps that within 255 bytes."""


__all__ = [
    "COLLECTION", "CONSUMER_GROUP", "DELETES_DIR", "PARTITION", "PCHANNEL", "QUARANTINE_DIR", "QUOTE_CHARS", "VCHANNEL",
    "NameRule", "shorten",
]
