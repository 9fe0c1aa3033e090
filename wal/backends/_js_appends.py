"""The JetStream backend's appends: group commits published as one stream message per block, fenced
by the expected last sequence, pipelined per pchannel, and a publish whose answer was lost settled
against the stream before it is retried."""

from __future__ import annotations

import asyncio
import concurrent.futures

import nats
import nats.errors
import nats.js.errors

from wal._codec import block_count
from wal.backend import WriteGroup
from wal.backends._js_connection import (
    _EXPECTED_LAST_SEQ,
    _RETRIABLE_WRITE,
    _WRONG_LAST_SEQUENCE,
    H_FIRST,
    H_LAST_TICK,
    H_MAX_TT,
    H_TERM,
    H_TICKS,
    _Chan,
    _Doubt,
    _Recheck,
    _tick_text,
)
from wal.backends._js_reads import StreamReads
from wal.errors import (
    ChannelFencedError,
    OnShutdownError,
    StreamingError,
    UnavailableError,
    UnrecoverableError,
)


class StreamAppends(StreamReads):
    """The write half of ``JetStreamBackend``."""

    def write(self, groups: list[WriteGroup], durable: bool) -> None:
        if groups:
            # Each block may take a retry window (_window) when an election stalls it.
            self._call(self._write(groups), what="writing to the WAL",
                       overall=self.timeout * (3 + 2 * len(groups)))

    def _by_key(self, groups: list[WriteGroup]) -> dict[int, list[WriteGroup]]:
        by_key: dict[int, list[WriteGroup]] = {}
        for g in groups:
            ch = self._chans.get(g.channel_key)
            if ch is None or ch.last_seq is None:
                raise UnrecoverableError(f"write to pchannel key {g.channel_key} that this backend did not open",
                                         channel_key=g.channel_key)
            by_key.setdefault(g.channel_key, []).append(g)
        return by_key

    async def _write(self, groups: list[WriteGroup]) -> None:
        by_key = self._by_key(groups)
        starts = {k: self._chans[k].last_seq for k in by_key}
        results = await asyncio.gather(*(self._publish_chain(self._chans[k], gs) for k, gs in by_key.items()),
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if not errors:
            return
        # The WAL hands every id of this write back: what did land must not be stored twice.
        for (k, gs), r in zip(by_key.items(), results, strict=True):
            ch = self._chans[k]
            if not isinstance(r, BaseException) and ch.doubt is None:
                base = starts[k]
                assert base is not None
                ch.doubt, ch.next_id = _Doubt(base, gs), gs[0].first_id
        fenced = [e for e in errors if isinstance(e, ChannelFencedError)]
        raise fenced[0] if fenced else errors[0]

    async def _publish_chain(self, ch: _Chan, groups: list[WriteGroup]) -> None:
        """Publish ``groups`` in order, each expecting its predecessor's sequence.  A publish that
        got no answer (or no responder: an election) is asked again until ``_window`` passes without
        progress; the answer it missed may be "stored", so before a repeat the stream is checked
        (``_settle``: the blocks found there are ours, or we are fenced), and a repeat refused as out
        of sequence is checked the same way instead of being called fenced at once."""
        loop = asyncio.get_running_loop()
        deadline = [loop.time() + self._window()]
        started = [0.0]
        pending, retried = groups, [False]

        def repeat() -> None:
            retried[0] = True  # a repeat refused as out of sequence is checked, not called fenced

        async for attempt in self._asking_again(_RETRIABLE_WRITE, deadline, started, on_retry=repeat):
            with attempt:
                started[0] = loop.time()
                if ch.doubt is not None:
                    pending = await self._settle(ch, pending)
                while pending:
                    await self._publish_block(ch, pending, retried[0], deadline[0])
                    pending = pending[1:]
                    deadline[0] = loop.time() + self._window()  # progress: a new window for the next block

    async def _publish_block(self, ch: _Chan, pending: list[WriteGroup], retried: bool, deadline: float) -> None:
        """Publish ``pending[0]``; on no answer, leave a doubt covering every pending block."""
        g = pending[0]
        assert ch.last_seq is not None
        headers = {H_FIRST: str(g.first_id), H_MAX_TT: str(g.max_timetick), H_TERM: str(ch.term),
                   _EXPECTED_LAST_SEQ: str(ch.last_seq)}
        last_tick = g.ticks[-1] if g.ticks else ch.last_tick
        if g.ticks:
            headers[H_TICKS] = ",".join(_tick_text(t) for t in g.ticks)
        if last_tick is not None:
            headers[H_LAST_TICK] = _tick_text(last_tick)
        wait = max(min(self.attempt_timeout, deadline - asyncio.get_running_loop().time()), 0.05)
        try:
            ack = await self._js.publish(self._subject(ch.key), g.block, timeout=wait, headers=headers)
        except nats.js.errors.APIError as exc:
            if exc.err_code in _WRONG_LAST_SEQUENCE:
                if retried:
                    # An earlier attempt of this write whose answer was lost may be what moved the
                    # stream on: check before calling it fenced.
                    ch.doubt = _Doubt(ch.last_seq, pending)
                    raise _Recheck(f"pchannel {ch.name!r}: a publish whose answer was lost may be stored; "
                                   f"checking the stream {self._stream(ch.key)}", channel=ch.name) from exc
                raise self._fenced(ch) from exc
            raise
        except BaseException:
            # No answer: the block may or may not be stored; a retry (or the next write) finds out.
            ch.doubt = _Doubt(ch.last_seq, pending)
            raise
        ch.last_seq, ch.last_tick = int(ack.seq), last_tick
        ch.next_id, ch.failed = g.first_id + block_count(g.block), None
        ch.learn(int(ack.seq), g.first_id)

    async def _settle(self, ch: _Chan, groups: list[WriteGroup]) -> list[WriteGroup]:
        """Resolve an earlier write whose outcome the WAL did not get: drop from ``groups`` the blocks
        already stored; fail when the stream holds anything else."""
        doubt = ch.doubt
        assert doubt is not None
        _, last = await self._bounds(ch.key)
        stored = last - doubt.base_seq
        if stored == 0:
            ch.doubt, ch.last_seq = None, doubt.base_seq
            return groups
        if stored < 0 or stored > len(doubt.groups):
            raise self._fenced(ch)
        for n in range(stored):
            msg = await self._get(ch.key, doubt.base_seq + 1 + n)
            g = doubt.groups[n]
            if msg is None or msg.fence or msg.term != ch.term or msg.first_id != g.first_id or msg.data != g.block:
                raise self._fenced(ch)
        # Ours, all of them: the stream is ahead of the WAL by these blocks.
        ch.last_seq = last
        same = len(groups) >= stored and all(
            a.first_id == b.first_id and a.block == b.block
            for a, b in zip(groups[:stored], doubt.groups[:stored], strict=True))
        if not same:
            raise UnrecoverableError(
                f"pchannel {ch.name!r}: a write reported failed was stored after all (ids from "
                f"{doubt.groups[0].first_id}); reopen the WAL", channel=ch.name, term=ch.term)
        ch.doubt = None
        for g in groups[:stored]:
            if g.ticks:
                ch.last_tick = g.ticks[-1]
            ch.next_id = g.first_id + block_count(g.block)
        return groups[stored:]

    # --- pipelined writes (``start_write``) ------------------------------------------------------------
    def start_write(self, groups: list[WriteGroup]) -> concurrent.futures.Future[dict[int, BaseException]]:
        if self._closed:
            raise OnShutdownError(f"JetStream WAL backend {self.path} is closed", path=self.path)
        return asyncio.run_coroutine_threadsafe(self._start_write(groups), self._loop)

    async def _start_write(self, groups: list[WriteGroup]) -> dict[int, BaseException]:
        """Queue each channel's groups behind that channel's previous write (this runs on the loop in
        the order writes were started, and queues before its first await) and wait for them all."""
        tasks: dict[int, asyncio.Future[None]] = {}
        for key, gs in self._by_key(groups).items():
            ch = self._chans[key]
            ch.queue_tail = tasks[key] = asyncio.ensure_future(self._queued(ch, gs, ch.queue_tail))
        results = await asyncio.gather(*tasks.values(), return_exceptions=True)
        return {k: r for k, r in zip(tasks, results, strict=True) if isinstance(r, BaseException)}

    async def _queued(self, ch: _Chan, groups: list[WriteGroup], previous: asyncio.Future[None] | None) -> None:
        """Publish ``groups`` once the channel's previous write is settled, if they follow what is stored.

        So the block of the next commit is encoded and queued while this one's round trip runs, and
        sent the moment it is acknowledged, each still expecting its predecessor's sequence (the
        fence).  A write that does not start at the end of what is stored follows a failed one whose
        ids the WAL hands back: it is not sent (it fails as that one did).
        """
        if previous is not None and not previous.done():
            await asyncio.wait([previous])
        if groups[0].first_id != ch.next_id:
            raise self._out_of_step(ch, groups[0].first_id)
        try:
            # Each block may take a retry window (_window) when an election stalls it, as in ``write``.
            await self._guard(asyncio.wait_for(self._publish_chain(ch, groups),
                                               self.timeout * (3 + 2 * len(groups))), "writing to the WAL")
        except BaseException as exc:
            ch.failed = exc
            raise

    def _out_of_step(self, ch: _Chan, first_id: int) -> StreamingError:
        prior = ch.failed
        if isinstance(prior, ChannelFencedError):
            return self._fenced(ch)
        if prior is not None:
            return UnavailableError(
                f"pchannel {ch.name!r}: the write before this one failed, so this one (from id {first_id}) "
                f"was not sent: {str(prior)[:300]}", channel=ch.name, path=self.path)
        return UnrecoverableError(
            f"pchannel {ch.name!r}: a write from id {first_id} does not follow the end of the stream "
            f"(id {ch.next_id}); reopen the WAL", channel=ch.name, term=ch.term)
