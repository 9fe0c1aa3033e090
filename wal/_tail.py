"""The in-memory tail of a WAL: the most recently committed messages, shared by tailing scanners.

Scanners that have caught up read from here instead of storage.  It holds a contiguous id range
``[base, base + len)`` and evicts whole commits from the front once over its byte budget; a scanner
whose next id was evicted drops back to storage.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable

from wal.message import Message, MessageID


class TailBuffer:
    def __init__(self, max_bytes: int, base: MessageID) -> None:
        self._max_bytes = max_bytes
        self._base = base
        self._messages: list[Message] = []
        self._commits: deque[tuple[int, int]] = deque()  # (message count, bytes) per commit, oldest first
        self._bytes = 0

    @property
    def base(self) -> MessageID:
        return self._base

    @property
    def end(self) -> MessageID:
        return self._base + len(self._messages)

    def extend(self, first_id: MessageID, messages: list[Message], nbytes: int) -> None:
        """Add a commit; ids must follow on (a gap resets the buffer, which only costs a storage read)."""
        if first_id != self.end:
            self._messages.clear()
            self._commits.clear()
            self._bytes = 0
            self._base = first_id
        self._messages.extend(messages)
        self._commits.append((len(messages), nbytes))
        self._bytes += nbytes
        if self._bytes > self._max_bytes:
            drop = 0
            # Evict down to 3/4 of the budget so eviction is amortised over many commits.
            while self._commits and self._bytes > self._max_bytes * 3 // 4:
                n, b = self._commits.popleft()
                drop += n
                self._bytes -= b
            del self._messages[:drop]
            self._base += drop

    def read(self, from_id: MessageID, limit: int) -> list[Message] | None:
        """Up to ``limit`` messages from ``from_id``; [] when none yet; None when already evicted."""
        if from_id < self._base:
            return None
        i = from_id - self._base
        return self._messages[i : i + limit]

    def reset(self, base: MessageID) -> None:
        self._messages.clear()
        self._commits.clear()
        self._bytes = 0
        self._base = base


class StoredBlocks:
    """Blocks recently decoded from storage, shared by the readers behind the tail.

    Readers that fell behind the tail together (many consumers after a burst of appends) read the same
    blocks back: each block is decoded once, here, and every reader takes its messages from the
    decoded copy (decoding is most of a catch-up read's cost on the event loop).  Keyed by a block's
    first id and header (its count, length and CRC), so a different block at that id is never taken
    for it.  Least recently used first out, at most ``max_bytes`` of blocks (counted encoded, as the
    tail counts); 0 turns it off.  Shared with reader threads (the shadow replay), hence the lock.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.decodes = 0
        """Blocks decoded into this cache so far (a reader that found its block here decoded nothing)."""
        self._entries: OrderedDict[MessageID, tuple[bytes, list[Message], list[int], int]] = OrderedDict()
        self._lock = threading.Lock()

    def decoded(self, block: bytes, first_id: MessageID, header: bytes,
                decode: Callable[[list[int]], list[Message]]) -> tuple[list[Message], list[int]]:
        """The messages of ``block`` from its start and the marks of that decoding (see
        ``decode_block``); ``decode(marks)`` decodes it when it is not here (its errors pass through,
        and nothing is kept)."""
        with self._lock:
            hit = self._entries.get(first_id)
            if hit is not None and hit[0] == header:
                self._entries.move_to_end(first_id)
                return hit[1], hit[2]
        marks: list[int] = []
        messages = decode(marks)
        size = len(block)
        with self._lock:
            self.decodes += 1
            if size <= self.max_bytes and first_id not in self._entries:
                self._entries[first_id] = (header, messages, marks, size)
                self.bytes += size
                while self.bytes > self.max_bytes:
                    _, (_, _, _, dropped) = self._entries.popitem(last=False)
                    self.bytes -= dropped
        return messages, marks
