"""The JetStream backend's stream reads: a stored block by sequence, the id -> sequence index and its
searches, reading blocks forward from an id, and the time index (``seek_time``)."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
from collections.abc import Callable
from typing import Any

import nats
import nats.errors
import nats.js.errors

from wal.backend import TickEntry
from wal.backends._js_connection import (
    _READ_BATCH,
    H_FENCE,
    H_FIRST,
    H_LAST_TICK,
    H_MAX_TT,
    H_TERM,
    H_TICKS,
    JetStreamConnection,
    _Msg,
    _parse_tick,
)
from wal.errors import (
    ChannelNotExistError,
    CorruptedError,
)
from wal.message import MessageID


class StreamReads(JetStreamConnection):
    """The read half of ``JetStreamBackend``."""

    async def _get(self, key: int, seq: int, seen: dict[int, _Msg] | None = None) -> _Msg | None:
        """The message at ``seq``, or None when there is none.  A direct get may be answered by a
        follower that lags: a miss is asked again of the leader.  ``seen``: messages this call
        already fetched (a search's probes), fetched again never."""
        if seen is not None and seq in seen:
            return seen[seq]
        stream = self._stream(key)
        self.direct_gets += 1
        try:
            raw = await self._retrying(lambda _t: self._jsq.get_msg(stream, seq, direct=True))
        except nats.js.errors.NotFoundError:
            try:
                raw = await self._retrying(lambda _t: self._jsq.get_msg(stream, seq))
            except nats.js.errors.NotFoundError:
                return None
        msg = self._parse(key, seq, raw.headers or {}, raw.data or b"")
        if seen is not None:
            seen[seq] = msg
        return msg

    def _parse(self, key: int, seq: int, headers: dict[str, str], data: bytes) -> _Msg:
        try:
            ticks = [_parse_tick(t) for t in headers.get(H_TICKS, "").split(",") if t]
            last = headers.get(H_LAST_TICK)
            return _Msg(seq, int(headers[H_FIRST]), int(headers.get(H_MAX_TT, 0)), int(headers.get(H_TERM, 0)),
                        H_FENCE in headers, ticks, _parse_tick(last) if last else None, bytes(data))
        except (KeyError, ValueError) as exc:
            raise CorruptedError(
                f"message {seq} of stream {self._stream(key)} has no valid WAL headers ({exc!r})",
                path=self.path, channel_key=key, seq=seq) from exc

    async def _bounds(self, key: int) -> tuple[int, int]:
        """The stream's first and last sequence (first > last when it holds nothing)."""
        try:
            info = await self._retrying(lambda _t: self._jsq.stream_info(self._stream(key)))
        except nats.js.errors.NotFoundError as exc:
            raise ChannelNotExistError(f"pchannel with key {key} does not exist (no stream {self._stream(key)})",
                                       channel_key=key) from exc
        last = int(info.state.last_seq)
        if not info.state.messages:
            return last + 1, last  # a new stream says first 0, a purged one first = last + 1
        return int(info.state.first_seq), last

    async def _search(self, key: int, lo: int, hi: int, after: Callable[[_Msg], bool],
                      seen: dict[int, _Msg] | None = None) -> tuple[int, _Msg | None]:
        """The first sequence in [lo, hi] whose message satisfies ``after`` (monotone: false then
        true), hi + 1 when none does; with the message there when it was fetched."""
        ch = self._chans.get(key)
        found: _Msg | None = None
        while lo <= hi:
            mid = (lo + hi) // 2
            msg = await self._get(key, mid, seen)
            if msg is None:  # purged meanwhile: everything below is gone
                lo = mid + 1
                continue
            if ch is not None:
                ch.learn(mid, msg.first_id)
            if after(msg):
                hi, found = mid - 1, msg
            else:
                lo = mid + 1
        return lo, (found if found is not None and found.seq == lo else None)

    def _id_bounds(self, key: int, lo: int, hi: int, from_id: int) -> tuple[int, int]:
        """Narrow [lo, hi] for "the last message with first id <= from_id" with the learnt index."""
        ch = self._chans.get(key)
        if ch is None or not ch.seqs:
            return lo, hi
        i = bisect.bisect_right(ch.firsts, from_id)  # entries < i have first <= from_id
        if i > 0 and ch.seqs[i - 1] >= lo:
            lo = ch.seqs[i - 1]
        if i < len(ch.seqs) and ch.seqs[i] - 1 <= hi:
            hi = ch.seqs[i] - 1
        return lo, hi

    async def _last_at_or_before(self, key: int, from_id: int, first: int, last: int,
                                 seen: dict[int, _Msg] | None = None) -> int:
        """The sequence of the last message whose first id is <= ``from_id`` (first - 1 if none)."""
        lo, hi = self._id_bounds(key, first, last, from_id)
        if lo == hi:
            return lo
        seq, _ = await self._search(key, lo, hi, lambda m: m.first_id > from_id, seen)
        return seq - 1

    # --- channel records ---------------------------------------------------------------------------
    def read_blocks(
        self, channel_key: int, from_id: MessageID, max_bytes: int
    ) -> list[tuple[MessageID, bytes]]:
        return self._call(self._read(channel_key, from_id, max_bytes), what="reading the WAL")

    async def _ends(self, key: int) -> tuple[int, int]:
        ch = self._chans.get(key)
        first, last = await self._bounds(key)
        if ch is not None and ch.last_seq is not None and ch.doubt is None:
            last = min(last, ch.last_seq)  # the writer's view: only what it acknowledged
        return first, last

    async def _read(self, key: int, from_id: int, max_bytes: int) -> list[tuple[int, bytes]]:
        first, last = await self._ends(key)
        if first > last:
            return []
        seen: dict[int, _Msg] = {}
        seq = max(await self._last_at_or_before(key, from_id, first, last, seen), first)
        out: list[tuple[int, bytes]] = []
        total = 0
        want = 1  # messages per batch: one at first (a small read needs one block), doubling to _READ_BATCH
        ch = self._chans.get(key)
        while seq <= last and total < max_bytes:
            end = min(seq + want - 1, last)
            want = min(2 * want, _READ_BATCH)
            got, reached = ({}, seq - 1) if seq in seen else await self._get_batch(key, seq, end, max_bytes - total)
            reached = max(reached, seq)  # no batch answer: this sequence alone (the leader asked on a miss)
            for s in range(seq, reached + 1):
                # A sequence the batch skipped is asked alone: deleted, or the answer came from a
                # follower that lags (a direct get then asks the leader).
                msg = got[s] if s in got else await self._get(key, s, seen)
                seq = s + 1
                if msg is None or msg.fence or msg.end_id <= from_id:
                    continue
                if ch is not None:
                    ch.learn(msg.seq, msg.first_id)
                out.append((msg.first_id, msg.data))
                total += len(msg.data)
                if total >= max_bytes:
                    break
        return out

    async def _get_batch(self, key: int, start: int, end: int, max_bytes: int) -> tuple[dict[int, _Msg], int]:
        """The messages from ``start`` to at most ``end`` that one batched direct get answers (one
        request, the messages streamed back until an end-of-batch status), and the highest sequence
        the answer reached (``start - 1`` when none came).  Reading forward one message per request
        costs a round trip per block: a log of small blocks read back at a few hundred blocks a
        second.  A server that does not know batches (before nats-server 2.11) answers the first
        message alone: it is used, and later reads ask one by one.  Any failure or silence ends the
        batch where it got to: the caller asks the rest one by one, with their retries."""
        got: dict[int, _Msg] = {}
        reached = start - 1
        if not self._batches or end <= start:
            return got, reached
        self.batch_gets += 1
        request = {"seq": start, "batch": end - start + 1, "max_bytes": max(max_bytes, 1)}
        came: list[Any] = []
        ended = asyncio.get_running_loop().create_future()

        async def take(raw: Any) -> None:
            # Kept as they come, parsed after: a callback per message, no timer per message.
            headers = raw.headers or {}
            if ended.done():
                return
            seq = int(headers.get("Nats-Sequence", 0)) if "Status" not in headers else 0
            if seq < start or seq > end:  # 204 end of batch; 404 nothing from start (a follower behind)
                ended.set_result(None)  # (or past what this read may deliver: the writer's acknowledged end)
                return
            came.append(raw)
            if seq == end or "Nats-Num-Pending" not in headers:  # the last asked; or a server without batches
                ended.set_result(None)

        try:
            sub = await self._nc.subscribe(self._nc.new_inbox(), cb=take)
            try:
                await self._nc.publish(f"$JS.API.DIRECT.GET.{self._stream(key)}", json.dumps(request).encode(),
                                       reply=sub.subject)
                while not ended.done():
                    before = len(came)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(ended), self.attempt_timeout)
                    if len(came) == before and not ended.done():
                        break  # silent for a whole attempt: what came is kept
            finally:
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()
        except nats.errors.Error:
            pass  # what came is kept; the caller asks the rest one by one, with retries
        for raw in came:
            headers = raw.headers
            seq = int(headers["Nats-Sequence"])
            got[seq] = self._parse(key, seq, headers, raw.data or b"")
            reached = seq
            if "Nats-Num-Pending" not in headers:
                self._batches = False
        return got, reached

    def seek_time(self, channel_key: int, timetick: int) -> TickEntry | None:
        return self._call(self._seek(channel_key, timetick), what="searching the time index")

    async def _seek(self, key: int, timetick: int) -> TickEntry | None:
        first, last = await self._ends(key)
        if first > last:
            return None
        seen: dict[int, _Msg] = {}
        head = await self._get(key, first, seen)
        if head is None:
            return None
        # The first message whose channel high-water passed ``timetick``: its own entries may still
        # be <= timetick; otherwise the answer is the last entry known just before it.
        seq, msg = await self._search(key, first, last, lambda m: m.max_tt > timetick, seen)
        entry: TickEntry | None = None
        if seq <= last:
            msg = msg or await self._get(key, seq, seen)
            if msg is not None:
                fit = [t for t in msg.ticks if t.timetick <= timetick]
                entry = fit[-1] if fit else None
        if entry is None and seq - 1 >= first:
            prev = await self._get(key, seq - 1, seen)
            if prev is not None:
                entry = prev.ticks[-1] if prev.ticks else prev.last_tick
        if entry is None or entry.timetick > timetick or entry.message_id < head.first_id:
            return None  # none yet, or truncated away with its block
        return entry
