"""The shard step's segment table: the growing segments of one pchannel.

A segment belongs to one (vchannel, collection, partition) and is in one of three states:

- *open*: takes new rows.  The open segment with the largest id is a key's current one; any other
  open segment of the key (left behind when a seal's write failed while a newer segment was already
  taking rows) is not given new rows and is sealed by age, manual flush or drop.
- *sealing*: chosen by ``ShardInterceptor.seal_expired``; takes no new rows; its FLUSH is not
  written yet.
- *flushing*: its FLUSH is in a batch being written.

A segment leaves the table when its FLUSH is written.  Rows and bytes are counted when an insert is
*planned*, before it is written, so concurrent batches see each other's reservations; a failed write
gives them back.  Ids are unique per pchannel and increase; one handed to a write that failed is not
handed out again.
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass, field

SegmentKey = tuple[str, str, str]
"""(vchannel, collection, partition)."""


class SegmentState(enum.Enum):
    OPEN = "open"
    SEALING = "sealing"
    FLUSHING = "flushing"


@dataclass(slots=True, eq=False)
class Segment:
    """A growing segment (mutable, owned by the table)."""

    segment_id: int
    vchannel: str
    collection: str
    partition: str
    created_at: float
    rows: int = 0
    bytes: int = 0
    state: SegmentState = SegmentState.OPEN

    @property
    def key(self) -> SegmentKey:
        return (self.vchannel, self.collection, self.partition)


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """A read-only view of a growing segment.

    ``rows`` and ``bytes`` (of INSERT payload) include appends still being written.  ``created_at``
    is on the shard's monotonic clock and is left out of comparisons: it is re-derived on replay.
    """

    segment_id: int
    vchannel: str
    collection: str
    partition: str
    rows: int
    bytes: int
    created_at: float = field(compare=False)


class SegmentTable:
    """Segments by id and by key; each key's list is kept in id order."""

    __slots__ = ("_by_id", "_by_key", "next_id")

    def __init__(self, first_id: int = 1) -> None:
        self._by_id: dict[int, Segment] = {}
        self._by_key: dict[SegmentKey, list[Segment]] = {}
        self.next_id = first_id

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, segment_id: int) -> Segment | None:
        return self._by_id.get(segment_id)

    def current(self, key: SegmentKey) -> Segment | None:
        """The open segment of ``key`` with the largest id, which takes the key's new rows."""
        segs = self._by_key.get(key)
        if segs:
            for seg in reversed(segs):
                if seg.state is SegmentState.OPEN:
                    return seg
        return None

    def open(self, key: SegmentKey, created_at: float) -> Segment:
        """A new segment with the next id."""
        seg = Segment(self.next_id, key[0], key[1], key[2], created_at)
        self.next_id += 1
        self._by_id[seg.segment_id] = seg
        self._by_key.setdefault(key, []).append(seg)
        return seg

    def restore(self, key: SegmentKey, segment_id: int, created_at: float) -> Segment:
        """Re-create a segment seen in replay (ids may first appear out of order there)."""
        seg = Segment(segment_id, key[0], key[1], key[2], created_at)
        self._by_id[segment_id] = seg
        bisect.insort(self._by_key.setdefault(key, []), seg, key=lambda s: s.segment_id)
        self.next_id = max(self.next_id, segment_id + 1)
        return seg

    def remove(self, seg: Segment) -> None:
        if self._by_id.pop(seg.segment_id, None) is None:
            return
        segs = self._by_key[seg.key]
        segs.remove(seg)
        if not segs:
            del self._by_key[seg.key]

    def contains(self, seg: Segment) -> bool:
        return self._by_id.get(seg.segment_id) is seg

    def select(self, vchannel: str | None = None, collection: str | None = None,
               partition: str | None = None) -> list[Segment]:
        """Segments matching every given part of the key, in id order."""
        out = [
            seg for key, segs in self._by_key.items()
            if (vchannel is None or key[0] == vchannel)
            and (collection is None or key[1] == collection)
            and (partition is None or key[2] == partition)
            for seg in segs
        ]
        out.sort(key=lambda s: s.segment_id)
        return out

    def infos(self) -> list[SegmentInfo]:
        return [
            SegmentInfo(s.segment_id, s.vchannel, s.collection, s.partition, s.rows, s.bytes, s.created_at)
            for s in sorted(self._by_id.values(), key=lambda s: s.segment_id)
        ]

    def clear(self) -> None:
        self._by_id.clear()
        self._by_key.clear()


__all__ = ["Segment", "SegmentInfo", "SegmentKey", "SegmentState", "SegmentTable"]
