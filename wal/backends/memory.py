"""The in-memory backend: the reference implementation of the contract, for tests.

It keeps exactly what the RocksDB backend keeps (blocks keyed by first id, a time index, channel
records) in Python structures guarded by one lock.  ``backup`` writes a directory that
``MemoryBackend.restore`` reads back, so the conformance suite can exercise backup on both backends.
"""

from __future__ import annotations

import bisect
import json
import os
import struct
import threading
from dataclasses import dataclass, field

from wal._codec import block_count
from wal.backend import Backend, ChannelInfo, TickEntry, WriteGroup
from wal.backends.rocks_layout import tail_state
from wal.errors import (
    ChannelExistError,
    ChannelNotExistError,
    CorruptedError,
    InvalidArgumentError,
    OnShutdownError,
)
from wal.message import MessageID

_BACKUP_FILE = "memory-wal.json"
_LEN = struct.Struct(">Q")


@dataclass
class _Channel:
    key: int
    term: int
    properties: dict[str, str]
    firsts: list[MessageID] = field(default_factory=list)
    blocks: dict[MessageID, bytes] = field(default_factory=dict)
    tick_ts: list[int] = field(default_factory=list)
    ticks: list[TickEntry] = field(default_factory=list)
    max_timetick: int = 0
    meta: dict[str, bytes] = field(default_factory=dict)


class MemoryBackend(Backend):
    """Process-local storage; ``durable`` writes are trivially durable for the process's lifetime."""

    def __init__(self) -> None:
        self.path = None
        self._lock = threading.Lock()
        self._channels: dict[str, _Channel] = {}
        self._next_key = 1
        self._closed = False

    def _get(self, name: str) -> _Channel:
        if self._closed:
            raise OnShutdownError("memory WAL backend is closed")
        ch = self._channels.get(name)
        if ch is None:
            raise ChannelNotExistError(f"pchannel {name!r} does not exist", channel=name)
        return ch

    def _by_key(self, key: int) -> _Channel:
        if self._closed:
            raise OnShutdownError("memory WAL backend is closed")
        for ch in self._channels.values():
            if ch.key == key:
                return ch
        raise ChannelNotExistError(f"pchannel with key {key} does not exist", channel_key=key)

    def _info(self, name: str, ch: _Channel) -> ChannelInfo:
        info = ChannelInfo(name, ch.key, ch.term, 0, 0, 0, dict(ch.properties))
        if ch.firsts:
            info.first_id = info.next_id = ch.firsts[0]
            last = ch.firsts[-1]
            return tail_state(info, (last, ch.blocks[last]), "memory", ch.max_timetick)
        return info

    def create_channel(self, name: str, properties: dict[str, str]) -> ChannelInfo:
        if not name:
            raise InvalidArgumentError("pchannel name must not be empty")
        with self._lock:
            if self._closed:
                raise OnShutdownError("memory WAL backend is closed")
            if name in self._channels:
                raise ChannelExistError(f"pchannel {name!r} already exists", channel=name)
            ch = _Channel(self._next_key, 0, dict(properties))
            self._next_key += 1
            self._channels[name] = ch
            return self._info(name, ch)

    def open_channel(self, name: str) -> ChannelInfo:
        with self._lock:
            ch = self._get(name)
            ch.term += 1
            return self._info(name, ch)

    def describe_channel(self, name: str) -> ChannelInfo:
        with self._lock:
            return self._info(name, self._get(name))

    def list_channels(self) -> list[str]:
        with self._lock:
            if self._closed:
                raise OnShutdownError("memory WAL backend is closed")
            return sorted(self._channels)

    def destroy_channel(self, name: str) -> None:
        with self._lock:
            self._get(name)
            del self._channels[name]

    def write(self, groups: list[WriteGroup], durable: bool) -> None:
        with self._lock:
            chans = [self._by_key(g.channel_key) for g in groups]  # validate all before changing any
            for ch, g in zip(chans, groups, strict=True):
                ch.firsts.append(g.first_id)
                ch.blocks[g.first_id] = g.block
                ch.max_timetick = max(ch.max_timetick, g.max_timetick)
                for t in g.ticks:
                    i = bisect.bisect_left(ch.tick_ts, t.timetick)
                    if i < len(ch.tick_ts) and ch.tick_ts[i] == t.timetick:
                        ch.ticks[i] = t
                    else:
                        ch.tick_ts.insert(i, t.timetick)
                        ch.ticks.insert(i, t)

    def read_blocks(
        self, channel_key: int, from_id: MessageID, max_bytes: int
    ) -> list[tuple[MessageID, bytes]]:
        with self._lock:
            ch = self._by_key(channel_key)
            i = max(bisect.bisect_right(ch.firsts, from_id) - 1, 0)
            if i < len(ch.firsts):
                first = ch.firsts[i]
                if first + block_count(ch.blocks[first]) <= from_id:
                    i += 1
            out: list[tuple[MessageID, bytes]] = []
            total = 0
            while i < len(ch.firsts) and total < max_bytes:
                first = ch.firsts[i]
                out.append((first, ch.blocks[first]))
                total += len(ch.blocks[first])
                i += 1
            return out

    def seek_time(self, channel_key: int, timetick: int) -> TickEntry | None:
        with self._lock:
            ch = self._by_key(channel_key)
            i = bisect.bisect_right(ch.tick_ts, timetick)
            return ch.ticks[i - 1] if i else None

    def truncate(self, channel_key: int, before_id: MessageID) -> MessageID:
        with self._lock:
            ch = self._by_key(channel_key)
            drop = 0
            while drop < len(ch.firsts):
                first = ch.firsts[drop]
                if first + block_count(ch.blocks[first]) > before_id:
                    break
                del ch.blocks[first]
                drop += 1
            del ch.firsts[:drop]
            keep_from = ch.firsts[0] if ch.firsts else before_id
            stale = 0
            while stale < len(ch.ticks) and ch.ticks[stale].message_id < keep_from:
                stale += 1
            del ch.ticks[:stale], ch.tick_ts[:stale]
            return keep_from

    def put_meta(self, channel_key: int, name: str, value: bytes) -> None:
        with self._lock:
            self._by_key(channel_key).meta[name] = bytes(value)

    def get_meta(self, channel_key: int, name: str) -> bytes | None:
        with self._lock:
            return self._by_key(channel_key).meta.get(name)

    def sync(self) -> None:
        return None

    def backup(self, dest: str) -> None:
        with self._lock:
            if self._closed:
                raise OnShutdownError("memory WAL backend is closed")
            if os.path.exists(dest):
                raise InvalidArgumentError(f"backup destination {dest} already exists", path=dest)
            os.makedirs(dest)
            meta = {
                "next_key": self._next_key,
                "channels": {
                    name: {
                        "key": ch.key, "term": ch.term, "properties": ch.properties,
                        "ticks": [[t.timetick, t.message_id, t.resume_id] for t in ch.ticks],
                        "firsts": ch.firsts,
                        "max_timetick": ch.max_timetick,
                        "meta": {k: v.hex() for k, v in ch.meta.items()},
                    }
                    for name, ch in self._channels.items()
                },
            }
            with open(os.path.join(dest, _BACKUP_FILE), "wb") as f:
                header = json.dumps(meta).encode()
                f.write(_LEN.pack(len(header)) + header)
                for ch in self._channels.values():
                    for first in ch.firsts:
                        f.write(_LEN.pack(len(ch.blocks[first])) + ch.blocks[first])
                f.flush()
                os.fsync(f.fileno())

    @classmethod
    def restore(cls, src: str) -> MemoryBackend:
        """A memory backend holding what ``backup`` wrote to ``src``."""
        path = os.path.join(src, _BACKUP_FILE)
        try:
            with open(path, "rb") as f:
                data = f.read()
            (n,) = _LEN.unpack_from(data, 0)
            meta = json.loads(data[8 : 8 + n])
            pos = 8 + n
            backend = cls()
            backend._next_key = int(meta["next_key"])
            for name, m in meta["channels"].items():
                ch = _Channel(int(m["key"]), int(m["term"]), dict(m["properties"]))
                ch.max_timetick = int(m["max_timetick"])
                ch.meta = {k: bytes.fromhex(v) for k, v in m["meta"].items()}
                for first in m["firsts"]:
                    (size,) = _LEN.unpack_from(data, pos)
                    ch.firsts.append(int(first))
                    ch.blocks[int(first)] = data[pos + 8 : pos + 8 + size]
                    pos += 8 + size
                for ts, mid, resume in m["ticks"]:
                    ch.tick_ts.append(int(ts))
                    ch.ticks.append(TickEntry(int(ts), int(mid), int(resume)))
                backend._channels[name] = ch
        except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
            raise CorruptedError(f"cannot restore memory WAL backup from {path}: {exc}", path=path) from exc
        return backend

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def reopen(self) -> MemoryBackend:
        """A new backend over this one's data, as reopening a directory would give (after ``close``)."""
        with self._lock:
            if not self._closed:
                raise InvalidArgumentError("close the memory backend before reopening it")
            other = MemoryBackend()
            other._channels = self._channels
            other._next_key = self._next_key
            return other


__all__ = ["MemoryBackend"]
