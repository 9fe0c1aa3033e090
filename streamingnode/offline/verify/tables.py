"""The RocksDB part of ``verify``: every key of the database with RocksDB's block checksums
verified, going on past an unreadable region to the next key range, and how keys and files are named
in findings."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from wal.backends.rocks_layout import KEY_ID as _KEY_ID
from wal.backends.rocks_layout import U32 as _U32


def _next_boundary(key: bytes) -> bytes | None:
    """The first key of the next region after ``key``: the next channel's for keys that carry a channel
    key (D, T, H, X), else the next key letter."""
    if key[:1] in (b"D", b"T", b"H", b"X") and len(key) >= 5:
        (ck,) = _U32.unpack_from(key, 1)
        if ck < 0xFFFFFFFF:
            return key[:1] + _U32.pack(ck + 1)
    if not key or key[0] == 0xFF:
        return None
    return bytes([key[0] + 1])


def rocks_file(message: str) -> str | None:
    """The file a RocksDB status names ("... in /path/000012.sst offset 4673 size 651")."""
    marker = " in /"
    at = message.find(marker)
    if at < 0:
        return None
    return message[at + 4:].split(maxsplit=1)[0]


@dataclass(slots=True)
class Unreadable:
    """Keys RocksDB could not read: somewhere after ``after`` (None: the start) and before ``before``
    (None: the end)."""

    after: bytes | None
    before: bytes | None
    file: str
    error: str
    until: bytes | None = None
    """The last key the scan sought to past the damage: no key lost lies at or after it."""


def scan_rocks(db: Any, unreadable: list[Unreadable]) -> Iterator[tuple[bytes, bytes]]:
    """Every readable key and value in order, checksums verified; each unreadable stretch goes to
    ``unreadable`` and the scan goes on at the next region (see ``_next_boundary``)."""
    import rocksdict  # noqa: PLC0415

    ro = rocksdict.ReadOptions()
    ro.set_verify_checksums(True)
    it = db.iter(ro)
    try:
        it.seek_to_first()
        last: bytes | None = None
        target: bytes | None = None
        while True:
            while it.valid():
                k = bytes(it.key())
                v = bytes(it.value())
                if unreadable and unreadable[-1].before is None:
                    unreadable[-1].before = k
                last = k
                yield k, v
                it.next()
            try:
                it.status()
            except Exception as exc:  # noqa: BLE001  (rocksdict raises plain Exception with RocksDB's status)
                text = str(exc)
                if unreadable and unreadable[-1].before is None:
                    unreadable[-1].error = unreadable[-1].error or text
                else:
                    unreadable.append(Unreadable(last, None, rocks_file(text) or db.path(), text))
                base = max(last or b"", target or b"")
                target = _next_boundary(base)
                unreadable[-1].until = target
                if target is None:
                    return
                it.seek(target)
            else:
                return
    finally:
        del it


def describe_key(key: bytes | None) -> str:
    if key is None:
        return "(start)"
    if key[:1] in (b"D", b"T") and len(key) == 13:
        ck, n = _KEY_ID.unpack_from(key, 1)
        return f"{key[:1].decode()}/{ck}/{n}"
    if key[:1] in (b"H", b"X") and len(key) >= 5:
        return f"{key[:1].decode()}/{_U32.unpack_from(key, 1)[0]}/{key[5:][:64]!r}"
    return repr(key[:80])


__all__ = ["Unreadable", "describe_key", "rocks_file", "scan_rocks"]
