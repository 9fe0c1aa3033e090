"""The in-memory tail of a WAL: the most recently committed messages, shared by tailing scanners.

Scanners that have caught up read from here instead of storage.  It holds a contiguous id range
``[base, base + len)`` and evicts whole commits from the front once over its byte budget; a scanner
whose next id was evicted drops back to storage.
"""

from __future__ import annotations

from collections import deque

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
