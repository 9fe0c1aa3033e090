"""The NATS JetStream backend: the WAL replicated by a JetStream cluster (nats-py), many pchannels.

Layout, under one configurable prefix ``P`` (default ``sn``) per cluster of nodes:

    stream   SN_P_<key>, subject sn.P.<key>   one message per record block, file storage, replicas 1 or 3
    KV P_channels  <b32(name)>                JSON {"name", "key", "term", "properties"}
    KV P_meta      next_key                   the next channel key (decimal; never reused), by CAS
    KV P_meta      c.<key>.<b32(name)>        ``put_meta`` values (the truncation mark among them)
    KV P_meta      c.<key>.-term              the term of the pchannel's newest opener (fences metadata)

``b32`` is base32 without padding, lowercase: KV keys take only ``[-/_=.a-zA-Z0-9]``.  A block's
message carries the block as its payload and, in headers, its first id (``Sn-First``), the channel's
largest timetick so far (``Sn-Max-Tt``), its time-index entries (``Sn-Ticks``: ``ts:id:resume``
separated by commas), the channel's last time-index entry so far (``Sn-Last-Tick``) and the writer's
term (``Sn-Term``).  Those headers make the stream its own index: first ids and largest timeticks grow
with the sequence, so a reader finds a block by id or time by binary search with direct gets (plus
an id -> sequence index learnt while writing and reading), never by scanning the stream.

Fencing.  Every publish carries ``Nats-Expected-Last-Sequence``: the sequence this backend last saw
acknowledged on the channel.  ``open_channel`` bumps the term in the channel record by compare-and-set,
then publishes a *fence marker* (``Sn-Fence``, no payload, the same position headers) expecting the last
sequence it read, retrying until it lands.  From then on any older writer's publish expects a sequence
that is no longer the last one: the server refuses it ("wrong last sequence") and nothing of it is
stored; the backend raises ChannelFencedError.  Readers skip fence markers.

Metadata is fenced too (a stale owner's flusher checkpoint, consumer groups or truncation mark must not
land after a takeover).  ``open_channel``, after bumping the record's term and before reading the
stream, claims the key ``c.<key>.-term`` in the meta bucket by compare-and-set, only ever raising the
term stored there (an opener that finds a term >= its own is already fenced).  Every ``put_meta`` of an
opened pchannel is one publish to the meta bucket's stream carrying ``Nats-Expected-Last-Subject-
Sequence`` = the revision of that claim and ``Nats-Expected-Last-Subject-Sequence-Subject`` = the claim
key's subject: the server checks it and stores the value in one step, on the stream's leader, so there
is no window between a check and the write.  Once a newer opener's claim is stored, every older
writer's put fails (ChannelFencedError); a put stored before the claim is seen by the newer opener,
which reads its metadata only after claiming.  A truncation stores its mark (fenced) before purging,
so a stale owner purges nothing once fenced; one whose mark landed just before the takeover may still
purge below that mark afterwards, which the new owner's recovery already treats as gone.

A ``write`` is atomic per pchannel, NOT across pchannels: groups of different pchannels go to
different streams, published concurrently; each pchannel's blocks are stored in order or not at all
(each expects its predecessor's sequence), but one pchannel's may be stored while another's failed.
The WAL then hands every id back, so a block stored for a write reported failed is remembered (and a
publish whose answer never came is checked against the stream): the next write of that pchannel skips
it when it is the same block again, and otherwise fails UNRECOVERABLE (reopen the WAL), because the log
already holds ids the WAL handed out anew.

Riding out an election.  When a stream's leader dies, its followers elect a new one after 4-9 s
(nats-server's Raft), and a request to the dead one gets no answer.  Block publishes, metadata puts
and reads therefore wait ``attempt_timeout`` (1 s) per attempt and are asked again until twice
``timeout`` passes without progress, so appends resume about as soon as the new leader is there.  A
repeat is safe: a block whose answer was lost is first looked for in the stream (``_settle``: ours and
skipped, or someone else's and fenced), and a repeat refused as out of sequence is checked the same way
before it is called fenced; a metadata put repeats the same value under the same claim check.
The writes of creating, opening and destroying a channel (compare-and-set of the term and the claim,
the fence marker, a purge) are not repeated here: their callers retry them whole.

Every publish waits for its acknowledgement (the servers run with ``sync_interval: always``), so
``durable`` changes nothing, ``sync`` has nothing to do and ``split_sync`` is False.  Blocks up to the
servers' ``max_payload`` (raise it to 8 MB: the committer writes blocks of about 1 MiB).

Pipelining (``start_write``; ``pipelined`` is True).  The committer starts the next commit's write
while the previous one's acknowledgement is pending: each pchannel's writes queue behind one another
on the backend's loop, and each is published the moment its predecessor is acknowledged, with the
sequence that one got as its expected last sequence, so fencing is unchanged.  What overlaps is the
node's own work (taking the next appends, encoding ~1 MiB, two thread hand-offs: about a third of a
block's time, profiled) with the round trip.  A queued write that does not start at the id after the
last stored block is never sent: it follows a write that failed (it fails the same way, and the WAL
hands both back) or ids out of step with the stream (UNRECOVERABLE).

Threading.  The contract is synchronous and called from the WAL's writer and reader threads; nats-py is
asyncio.  The backend owns an event loop in a thread of its own, and every call runs a coroutine there
and waits for it with a timeout: a NATS that does not answer is UNAVAILABLE (retriable), never a hang
(nats-py futures may never complete when the server answers an error).  All state is touched on that
loop only, so it needs no lock.  Metadata puts are a handful per run, off the hot path.

``backup`` is refused: a directory copy would not open as a JetStream backend, and a JetStream stream
is backed up by NATS itself (``nats stream backup``), already replicated besides.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import contextlib
import json
import re
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.js import api
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from wal._codec import block_count
from wal.backend import Backend, ChannelInfo, TickEntry, WriteGroup
from wal.backends.rocks_layout import TRUNCATED_META, tail_state
from wal.backends.rocks_layout import U64 as _U64
from wal.errors import (
    ChannelExistError,
    ChannelFencedError,
    ChannelNotExistError,
    CorruptedError,
    InvalidArgumentError,
    MessageTooLargeError,
    OnShutdownError,
    StreamingError,
    UnavailableError,
    UnrecoverableError,
)
from wal.kv_key import decode_key, encode_key
from wal.message import MessageID

T = TypeVar("T")

# Failures after which a request may simply be asked again: no answer in time, nobody to answer (a
# stream or its leader being elected), the connection lost (nats-py reconnects by itself).  A publish
# that got no answer may have been stored all the same: its retry is made safe by the caller.
_RETRIABLE: tuple[type[BaseException], ...] = (
    TimeoutError, nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.errors.ConnectionClosedError,
    nats.errors.StaleConnectionError, nats.js.errors.NoStreamResponseError, nats.js.errors.ServiceUnavailableError)


class _Recheck(UnavailableError):
    """A retried publish was refused as out of sequence: its lost-answer attempt may be the message
    that moved the stream on, so the stream is checked (``_settle``) before calling it fenced (and
    when time runs out first, the write is UNAVAILABLE, its doubt left for the next write)."""


_RETRIABLE_WRITE: tuple[type[BaseException], ...] = (*_RETRIABLE, _Recheck)

_TRANSIENT_STATUS = frozenset({408, 429, 503})
"""JetStream API answers (their HTTP-like ``code``) that a later attempt may see succeed: a request
timeout, too many requests, a service unavailable (no quorum, insufficient resources for now)."""
_TRANSIENT_ERR_CODES = frozenset({
    10004,  # JSClusterIncompleteErr: incomplete results (peers not answering yet)
    10007,  # JSClusterNotAssignedErr: the stream is not assigned to this server (being placed)
    10008,  # JSClusterNotAvailErr: JetStream system temporarily unavailable
    10009,  # JSClusterNotLeaderErr: the cluster can not handle the request (a leader election)
})
"""JetStream ``err_code``s of a cluster between leaders or placements: transient whatever their status."""


def api_refusal(exc: nats.js.errors.APIError, what: str, path: str | None) -> StreamingError:
    """A JetStream API refusal as the WAL reports it: UNAVAILABLE (retriable) while the cluster is
    between states (``_TRANSIENT_STATUS``, ``_TRANSIENT_ERR_CODES``); UNRECOVERABLE for the rest --
    limits, permissions, a configuration that does not match, a bad request -- which no retry cures,
    so neither the node nor its clients retry them forever (``fields``: ``nats_code``, ``err_code``)."""
    if exc.code in _TRANSIENT_STATUS or exc.err_code in _TRANSIENT_ERR_CODES:
        return UnavailableError(f"{what}: NATS at {path} refused for now: {exc}", path=path,
                                nats_code=exc.code, err_code=exc.err_code)
    return UnrecoverableError(
        f"{what}: NATS at {path} refused (code {exc.code}, err_code {exc.err_code}), which retrying cannot "
        f"change: {exc}", path=path, nats_code=exc.code, err_code=exc.err_code)


_PREFIX_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_WRONG_LAST_SEQUENCE = 10071  # JetStream's err_code for a failed Nats-Expected-Last-Sequence
_STREAM_NOT_FOUND = 10059
_MAX_FENCE_TRIES = 50
_READ_AHEAD = 8  # direct gets in flight while reading forward
_INDEX_MAX = 100_000  # entries of a pchannel's id -> sequence index before it is thinned
_RETRY_PAUSE = 0.1  # seconds before asking again after a refusal that came at once (no responders)
_MAX_TT_META = "jetstream.max_timetick"
"""The channel's largest timetick, kept when a truncation empties its stream (no header holds it)."""

H_FIRST = "Sn-First"
H_MAX_TT = "Sn-Max-Tt"
H_TICKS = "Sn-Ticks"
H_LAST_TICK = "Sn-Last-Tick"
H_TERM = "Sn-Term"
H_FENCE = "Sn-Fence"
_EXPECTED_LAST_SEQ = "Nats-Expected-Last-Sequence"


def _tick_text(t: TickEntry) -> str:
    return f"{t.timetick}:{t.message_id}:{t.resume_id}"


def _parse_tick(text: str) -> TickEntry:
    ts, mid, resume = text.split(":")
    return TickEntry(int(ts), int(mid), int(resume))


@dataclass(slots=True)
class _Msg:
    """One stored message: a block or a fence marker, with its position headers."""

    seq: int
    first_id: int
    max_tt: int
    term: int
    fence: bool
    ticks: list[TickEntry]
    last_tick: TickEntry | None
    data: bytes

    @property
    def end_id(self) -> int:
        return self.first_id if self.fence else self.first_id + block_count(self.data)


@dataclass
class _Doubt:
    """Blocks of a pchannel that may be stored though the WAL was told the write failed."""

    base_seq: int
    groups: list[WriteGroup]


@dataclass
class _Chan:
    """What the backend knows of one pchannel; its writer fields are set by ``open_channel``."""

    key: int
    name: str
    term: int = 0
    last_seq: int | None = None  # None: not opened for writing by this backend
    claim_rev: int = 0  # the revision of this backend's term claim in the meta bucket (0: none)
    last_tick: TickEntry | None = None
    doubt: _Doubt | None = None
    next_id: int = 0  # the id after the last block known stored (the writer's view)
    failed: BaseException | None = None  # why the last write failed, until one is stored again
    queue_tail: asyncio.Future[None] | None = None  # the newest started write (``start_write``)
    # The id -> sequence index: sequences in order, with their first ids and largest timeticks.
    seqs: list[int] = field(default_factory=list)
    firsts: list[int] = field(default_factory=list)

    def learn(self, seq: int, first_id: int) -> None:
        i = bisect.bisect_left(self.seqs, seq)
        if i < len(self.seqs) and self.seqs[i] == seq:
            return
        self.seqs.insert(i, seq)
        self.firsts.insert(i, first_id)
        if len(self.seqs) > _INDEX_MAX:
            # Every other entry goes: the index only narrows a bisection, so a sparser one stays right
            # (a search costs one direct get more), and memory stays bounded on a long-lived writer.
            del self.seqs[1::2], self.firsts[1::2]

    def forget_below(self, seq: int) -> None:
        i = bisect.bisect_left(self.seqs, seq)
        del self.seqs[:i], self.firsts[:i]


class JetStreamBackend(Backend):
    """Pchannels as JetStream streams; see the module docstring.  ``servers``: one URL, a comma
    list, or a list; ``replicas``: 1 or 3; ``timeout``: seconds per NATS request, and half the time a
    block publish, metadata put or read keeps asking again without progress; ``attempt_timeout``:
    seconds one such attempt waits for its answer (short, so that an election is ridden out: a
    request to a dead stream leader is asked again of the new one soon after it is elected)."""

    split_sync = False
    pipelined = True

    def __init__(self, servers: str | list[str], *, prefix: str = "sn", replicas: int = 1,
                 timeout: float = 5.0, attempt_timeout: float = 1.0) -> None:
        if not _PREFIX_RE.match(prefix):
            raise InvalidArgumentError(
                f"NATS prefix {prefix[:200]!r} must be 1-32 letters, digits, '_' or '-'", field="prefix")
        if replicas not in (1, 3):
            raise InvalidArgumentError(f"replicas must be 1 or 3, not {replicas}", field="replicas")
        urls = [u.strip() for u in (servers.split(",") if isinstance(servers, str) else servers) if u.strip()]
        if not urls:
            raise InvalidArgumentError("no NATS server URL given", field="servers")
        self.path = f"nats:{','.join(urls)}/{prefix}"
        self.prefix = prefix
        self.replicas = replicas
        self.timeout = timeout
        self.attempt_timeout = min(attempt_timeout, timeout)
        self.retries = 0
        """Requests asked again after no answer or no responder (an election, a lost connection)."""
        self.direct_gets = 0
        """How many stored messages were fetched one by one (tests count them: no full scans)."""
        self._closed = False
        self._chans: dict[int, _Chan] = {}
        self._nc: Any = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"wal-jetstream-{prefix}", daemon=True)
        self._thread.start()
        try:
            self._call(self._connect(urls), what="connecting to NATS", overall=timeout * 3)
        except BaseException:
            # Connected but not opened (a bucket not answering during an election, say): the
            # connection is closed before its loop stops, or its socket outlives the backend.
            self._close_connection()
            self._stop_loop()
            raise

    # --- the loop bridge ---------------------------------------------------------------------------
    def _call(self, coro: Coroutine[Any, Any, T], *, what: str, overall: float | None = None) -> T:
        if self._closed:
            coro.close()
            raise OnShutdownError(f"JetStream WAL backend {self.path} is closed", path=self.path)
        future = asyncio.run_coroutine_threadsafe(self._guard(coro, what), self._loop)
        try:
            return future.result(overall if overall is not None else self.timeout * 6)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise UnavailableError(f"{what}: NATS at {self.path} did not answer in time", path=self.path) from exc

    async def _guard(self, coro: Awaitable[T], what: str) -> T:
        """Translate client failures at the boundary."""
        try:
            return await coro
        except StreamingError:
            raise
        except (TimeoutError, nats.errors.TimeoutError, nats.errors.NoServersError,
                nats.errors.ConnectionClosedError, nats.errors.NoRespondersError,
                nats.js.errors.NoStreamResponseError, nats.js.errors.ServiceUnavailableError,
                nats.errors.StaleConnectionError, nats.errors.OutboundBufferLimitError) as exc:
            raise UnavailableError(f"{what}: NATS at {self.path} is unavailable: {type(exc).__name__} {exc}",
                                   path=self.path) from exc
        except nats.errors.MaxPayloadError as exc:
            raise MessageTooLargeError(
                f"{what}: a record block is larger than the NATS servers' max_payload "
                f"({self._nc.max_payload} bytes): raise max_payload (8 MB is advised) or lower the WAL's "
                f"max_commit_bytes", path=self.path, limit=self._nc.max_payload) from exc
        except nats.js.errors.APIError as exc:
            raise api_refusal(exc, what, self.path) from exc

    def _window(self) -> float:
        """How long a request keeps being asked again without progress (an election takes seconds)."""
        return self.timeout * 2

    async def _retrying(self, ask: Callable[[float], Awaitable[T]], deadline: float | None = None) -> T:
        """``ask(attempt_timeout)`` until it answers, again after each retriable failure (see
        ``_RETRIABLE``) until ``deadline`` (loop time; default: ``_window`` from now), then the last
        failure is raised.  Only for requests that are safe to repeat as they are."""
        loop = asyncio.get_running_loop()
        end = [loop.time() + self._window() if deadline is None else deadline]
        started = [0.0]
        async for attempt in self._asking_again(_RETRIABLE, end, started):
            with attempt:
                started[0] = loop.time()
                return await ask(max(min(self.attempt_timeout, end[0] - started[0]), 0.05))
        raise AssertionError("unreachable: tenacity either returns or re-raises")  # pragma: no cover

    def _asking_again(
        self, retriable: tuple[type[BaseException], ...], deadline: list[float], started: list[float],
        on_retry: Callable[[], None] | None = None,
    ) -> AsyncRetrying:
        """The retry policy of a request to NATS: again after a ``retriable`` failure, after a pause that
        pads an attempt refused at once to ``_RETRY_PAUSE`` (nobody answers during an election), while
        the pause ends before ``deadline[0]`` (loop time; the caller may move it on progress); else the
        last failure is raised.  ``started[0]``: when the current attempt began (the caller sets it).
        Each retry is counted (``retries``), then ``on_retry`` runs."""
        loop = asyncio.get_running_loop()

        def retrying(_rs: RetryCallState) -> None:
            self.retries += 1
            if on_retry is not None:
                on_retry()

        return AsyncRetrying(
            retry=retry_if_exception_type(retriable),
            wait=lambda _rs: max(0.0, _RETRY_PAUSE - (loop.time() - started[0])),
            stop=lambda rs: loop.time() + rs.upcoming_sleep >= deadline[0],
            before_sleep=retrying, reraise=True)

    async def _connect(self, urls: list[str]) -> None:
        async def quiet(exc: Exception) -> None:
            """Connection errors surface as UNAVAILABLE from the calls they fail; no print."""

        self._nc = await nats.connect(urls, connect_timeout=self.timeout, max_reconnect_attempts=-1,
                                      reconnect_time_wait=0.2, error_cb=quiet)
        self._js = self._nc.jetstream(timeout=self.timeout)
        # Requests that are retried (reads) wait one attempt's time each; the others the whole timeout.
        self._jsq = self._nc.jetstream(timeout=self.attempt_timeout)
        self._kv_channels = await self._bucket(f"{self.prefix}_channels")
        self._kv_meta = await self._bucket(f"{self.prefix}_meta")
        self._kv_meta_q: Any = await self._jsq.key_value(f"{self.prefix}_meta")
        self._kv_channels_q: Any = await self._jsq.key_value(f"{self.prefix}_channels")

    async def _bucket(self, name: str) -> Any:
        try:
            return await self._js.key_value(name)
        except nats.js.errors.BucketNotFoundError:
            # Reads not direct: a follower could answer an older revision than the one just written.
            return await self._js.create_key_value(api.KeyValueConfig(
                bucket=name, history=1, replicas=self.replicas, storage=api.StorageType.FILE, direct=False))

    def _stop_loop(self) -> None:
        async def cancel_rest() -> None:
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(cancel_rest(), self._loop).result(self.timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self.timeout * 2)
        self._loop.close()

    # --- naming ------------------------------------------------------------------------------------
    def _stream(self, key: int) -> str:
        return f"SN_{self.prefix}_{key}"

    def _subject(self, key: int) -> str:
        return f"sn.{self.prefix}.{key}"

    def _meta_key(self, key: int, name: str) -> str:
        return f"c.{key}.{encode_key(name)}"

    def _claim_key(self, key: int) -> str:
        # '-' never occurs in base32, so no put_meta name can collide with it; under c.<key>. so that
        # destroying the channel purges it with the rest of its metadata.
        return f"c.{key}.-term"

    def _meta_subject(self, kv_key: str) -> str:
        return f"$KV.{self.prefix}_meta.{kv_key}"

    def _fenced(self, ch: _Chan) -> ChannelFencedError:
        return ChannelFencedError(
            f"pchannel {ch.name!r} term {ch.term} is fenced: a newer writer appended to its stream "
            f"{self._stream(ch.key)}", channel=ch.name, term=ch.term)

    # --- stored messages ---------------------------------------------------------------------------
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
    async def _record(self, name: str) -> tuple[dict[str, Any], int]:
        try:
            entry = await self._retrying(lambda _t: self._kv_channels_q.get(encode_key(name)))
        except nats.js.errors.NotFoundError as exc:
            raise ChannelNotExistError(f"pchannel {name!r} does not exist", channel=name) from exc
        try:
            record: dict[str, Any] = json.loads(entry.value or b"")
            int(record["key"]), int(record["term"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptedError(f"channel record of {name!r} in {self.path} is damaged", channel=name,
                                 path=self.path) from exc
        return record, int(entry.revision)

    async def _meta_u64(self, key: int, name: str) -> int | None:
        raw = await self._get_meta(key, name)
        return _U64.unpack(raw)[0] if raw is not None and len(raw) == _U64.size else None

    async def _recover(self, name: str, record: dict[str, Any]) -> tuple[ChannelInfo, int, TickEntry | None]:
        """The channel's state from its stream's ends; with the last sequence and last tick entry."""
        key = int(record["key"])
        info = ChannelInfo(name, key, int(record["term"]), 0, 0, 0, dict(record.get("properties", {})))
        first, last = await self._bounds(key)
        head = await self._get(key, first) if first <= last else None
        tail = await self._get(key, last) if first <= last else None
        if head is None or tail is None:
            mark = await self._meta_u64(key, TRUNCATED_META)
            info.first_id = info.next_id = mark or 0
            info.last_timetick = await self._meta_u64(key, _MAX_TT_META) or 0
            return info, last, None
        info.first_id = info.next_id = head.first_id
        if tail.fence:
            info.next_id, info.last_timetick = tail.first_id, tail.max_tt
        else:
            tail_state(info, (tail.first_id, tail.data), f"{self.path} stream {self._stream(key)}", tail.max_tt)
        last_tick = tail.ticks[-1] if tail.ticks else tail.last_tick
        return info, last, last_tick

    # --- channels ----------------------------------------------------------------------------------
    def create_channel(self, name: str, properties: dict[str, str]) -> ChannelInfo:
        if not name:
            raise InvalidArgumentError("pchannel name must not be empty")
        return self._call(self._create(name, dict(properties)), what=f"creating pchannel {name!r}")

    async def _create(self, name: str, properties: dict[str, str]) -> ChannelInfo:
        try:
            await self._kv_channels.get(encode_key(name))
            raise ChannelExistError(f"pchannel {name!r} already exists", channel=name)
        except nats.js.errors.NotFoundError:
            pass
        key = await self._next_key()
        await self._js.add_stream(api.StreamConfig(
            name=self._stream(key), subjects=[self._subject(key)], storage=api.StorageType.FILE,
            num_replicas=self.replicas, allow_direct=True, discard=api.DiscardPolicy.OLD))
        record = {"name": name, "key": key, "term": 0, "properties": properties}
        try:
            await self._kv_channels.create(encode_key(name), json.dumps(record).encode())
        except nats.js.errors.KeyWrongLastSequenceError as exc:  # another node created it meanwhile
            await self._js.delete_stream(self._stream(key))
            raise ChannelExistError(f"pchannel {name!r} already exists", channel=name) from exc
        return ChannelInfo(name, key, 0, 0, 0, 0, dict(properties))

    async def _next_key(self) -> int:
        while True:
            try:
                entry = await self._kv_meta.get("next_key")
                key, rev = int(entry.value or b"1"), int(entry.revision)
            except nats.js.errors.NotFoundError:
                key, rev = 1, 0
            try:
                if rev == 0:
                    await self._kv_meta.create("next_key", str(key + 1).encode())
                else:
                    await self._kv_meta.update("next_key", str(key + 1).encode(), last=rev)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue  # another node took that key: take the next
            return key

    def open_channel(self, name: str) -> ChannelInfo:
        return self._call(self._open(name), what=f"opening pchannel {name!r}")

    async def _open(self, name: str) -> ChannelInfo:
        while True:  # the term, by compare-and-set
            record, rev = await self._record(name)
            record["term"] = int(record["term"]) + 1
            try:
                await self._kv_channels.update(encode_key(name), json.dumps(record).encode(), last=rev)
                break
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
        key = int(record["key"])
        claim_rev = await self._claim(name, key, int(record["term"]))
        for _ in range(_MAX_FENCE_TRIES):
            info, last, last_tick = await self._recover(name, record)
            headers = {H_FIRST: str(info.next_id), H_MAX_TT: str(info.last_timetick), H_TERM: str(info.term),
                       H_FENCE: "1", _EXPECTED_LAST_SEQ: str(last)}
            if last_tick is not None:
                headers[H_LAST_TICK] = _tick_text(last_tick)
            try:
                ack = await self._js.publish(self._subject(key), b"", timeout=self.timeout, headers=headers)
            except nats.js.errors.APIError as exc:
                if exc.err_code == _WRONG_LAST_SEQUENCE:
                    continue  # an older writer appended meanwhile: read the new end and fence again
                raise
            ch = self._chans.get(key) or _Chan(key, name)
            ch.term, ch.last_seq, ch.last_tick, ch.doubt = info.term, int(ack.seq), last_tick, None
            ch.next_id, ch.failed = info.next_id, None
            ch.claim_rev = claim_rev
            ch.learn(int(ack.seq), info.next_id)
            self._chans[key] = ch
            return info
        raise UnavailableError(f"opening pchannel {name!r}: its stream kept changing while fencing it",
                               channel=name, path=self.path)

    async def _claim(self, name: str, key: int, term: int) -> int:
        """Store ``term`` as the pchannel's metadata term, by CAS and only upwards; its revision."""
        kv_key = self._claim_key(key)
        while True:
            try:
                entry = await self._kv_meta.get(kv_key)
                held, rev = int(entry.value or b"0"), int(entry.revision)
            except nats.js.errors.NotFoundError:
                held, rev = 0, 0
            if held >= term:
                # A newer opener claimed it between our term bump and now: we are fenced already.
                raise ChannelFencedError(
                    f"pchannel {name!r} term {term} is fenced: term {held} opened it meanwhile",
                    channel=name, term=term)
            try:
                if rev == 0:
                    return int(await self._kv_meta.create(kv_key, str(term).encode()))
                return int(await self._kv_meta.update(kv_key, str(term).encode(), last=rev))
            except nats.js.errors.KeyWrongLastSequenceError:
                continue  # another opener wrote it meanwhile: compare again

    def describe_channel(self, name: str) -> ChannelInfo:
        async def run() -> ChannelInfo:
            record, _ = await self._record(name)
            return (await self._recover(name, record))[0]

        return self._call(run(), what=f"describing pchannel {name!r}")

    def list_channels(self) -> list[str]:
        async def run() -> list[str]:
            # From the bucket's stream, not kv.keys(): nats-py's key watcher can end before a key that
            # follows a deletion.  Destroy removes a record's subject whole, so each subject is a channel.
            bucket = f"{self.prefix}_channels"
            info = await self._js.stream_info(f"KV_{bucket}", subjects_filter=f"$KV.{bucket}.>")
            skip = len(f"$KV.{bucket}.")
            return sorted(decode_key(subject[skip:]) for subject in (info.state.subjects or {}))

        return self._call(run(), what="listing pchannels")

    def destroy_channel(self, name: str) -> None:
        async def run() -> None:
            record, _ = await self._record(name)
            key = int(record["key"])
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await self._js.delete_stream(self._stream(key))
            # Whole subjects go, tombstones included, so that nothing of the channel is left listed.
            meta, channels = f"{self.prefix}_meta", f"{self.prefix}_channels"
            await self._js.purge_stream(f"KV_{meta}", subject=f"$KV.{meta}.c.{key}.>")
            await self._js.purge_stream(f"KV_{channels}", subject=f"$KV.{channels}.{encode_key(name)}")
            self._chans.pop(key, None)

        self._call(run(), what=f"destroying pchannel {name!r}")

    # --- data ----------------------------------------------------------------------------------------
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
            if exc.err_code == _WRONG_LAST_SEQUENCE:
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
        ahead = 1  # gets in flight: one at first (a small read needs one block), doubling to _READ_AHEAD
        while seq <= last and total < max_bytes:
            window = range(seq, min(seq + ahead, last + 1))
            ahead = min(2 * ahead, _READ_AHEAD)
            msgs = await asyncio.gather(*(self._get(key, s, seen) for s in window))
            for msg in msgs:
                seq += 1
                if msg is None or msg.fence or msg.end_id <= from_id:
                    continue
                ch = self._chans.get(key)
                if ch is not None:
                    ch.learn(msg.seq, msg.first_id)
                out.append((msg.first_id, msg.data))
                total += len(msg.data)
                if total >= max_bytes:
                    break
        return out

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

    def truncate(self, channel_key: int, before_id: MessageID) -> MessageID:
        return self._call(self._truncate(channel_key, before_id), what="truncating the WAL")

    async def _truncate(self, key: int, before_id: int) -> int:
        first, last = await self._bounds(key)
        if first > last:
            return await self._meta_u64(key, TRUNCATED_META) or before_id
        seq = await self._last_at_or_before(key, before_id, first, last)
        if seq < first:
            head = await self._get(key, first)
            return head.first_id if head is not None else before_id
        msg = await self._get(key, seq)
        if msg is None:
            return before_id
        end = msg.end_id
        keep_seq, keep_from = (seq + 1, end) if end <= before_id else (seq, msg.first_id)
        if keep_seq > last:
            # Nothing is left to carry the channel's high-water timetick: keep it beside the mark.
            tail = msg if seq == last else await self._get(key, last)
            await self._put_meta(key, _MAX_TT_META, _U64.pack(tail.max_tt if tail is not None else 0))
        await self._put_meta(key, TRUNCATED_META, _U64.pack(keep_from))
        if keep_seq > first:
            await self._js.purge_stream(self._stream(key), seq=keep_seq)
        ch = self._chans.get(key)
        if ch is not None:
            ch.forget_below(keep_seq)
        return int(keep_from)

    async def _put_meta(self, key: int, name: str, value: bytes) -> None:
        ch = self._chans.get(key)
        kv_key, data = self._meta_key(key, name), bytes(value)
        if ch is None or ch.last_seq is None or not ch.claim_rev:
            # Not opened here (tools, tests reading a log): nothing to fence against.
            await self._retrying(lambda _t: self._kv_meta_q.put(kv_key, data))
            return
        # One publish that the server stores only while our claim is still the claim key's last
        # message: the check and the write cannot be separated by a newer opener (module docstring).
        # Asked again after no answer: a repeat stores the same value under the same check (a put of
        # ours does not move the claim key), so it can neither land once the claim moved nor undo a
        # newer owner's value; puts are issued one after another, so none overtakes the next.
        headers = {"Nats-Expected-Last-Subject-Sequence": str(ch.claim_rev),
                   "Nats-Expected-Last-Subject-Sequence-Subject": self._meta_subject(self._claim_key(key))}
        try:
            await self._retrying(lambda t: self._js.publish(self._meta_subject(kv_key), data, timeout=t,
                                                            headers=headers))
        except nats.js.errors.APIError as exc:
            if exc.err_code == _WRONG_LAST_SEQUENCE:
                raise ChannelFencedError(
                    f"pchannel {ch.name!r} term {ch.term} is fenced: a newer term opened it, so its "
                    f"metadata {name[:200]!r} is not stored", channel=ch.name, term=ch.term) from exc
            raise

    async def _get_meta(self, key: int, name: str) -> bytes | None:
        try:
            entry = await self._retrying(lambda _t: self._kv_meta_q.get(self._meta_key(key, name)))
        except nats.js.errors.NotFoundError:
            return None
        return bytes(entry.value) if entry.value is not None else None

    def put_meta(self, channel_key: int, name: str, value: bytes) -> None:
        self._call(self._put_meta(channel_key, name, value), what=f"storing {name!r}")

    def get_meta(self, channel_key: int, name: str) -> bytes | None:
        return self._call(self._get_meta(channel_key, name), what=f"reading {name!r}")

    def sync(self) -> None:
        return None  # every write already waited for its acknowledgement (servers sync always)

    def backup(self, dest: str) -> None:
        raise InvalidArgumentError(
            f"backup to {dest[:200]!r} is not supported by the JetStream WAL backend: its streams are "
            f"replicated by NATS; back them up with NATS itself (`nats stream backup SN_{self.prefix}_<key>`)",
            path=dest[:200], backend="jetstream")

    def _close_connection(self) -> None:
        if self._nc is None:
            return
        # On failure the connection is dropped with the loop (_stop_loop).
        with contextlib.suppress(StreamingError):
            self._call(self._nc.close(), what="closing the NATS connection", overall=self.timeout * 2)

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._close_connection()
        finally:
            self._closed = True
            self._stop_loop()


__all__ = ["JetStreamBackend", "decode_key", "encode_key"]
