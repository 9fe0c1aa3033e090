"""The JetStream backend's connection: its own event loop thread, the NATS connection and KV buckets,
requests asked again through elections and lost connections, how JetStream refusals become the WAL's
errors, the names of streams, subjects and KV keys, and the per-pchannel state every part shares.
The backend itself is ``wal.backends.jetstream``."""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import contextlib
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
from wal.backend import Backend, TickEntry, WriteGroup
from wal.errors import (
    ChannelFencedError,
    InvalidArgumentError,
    MessageTooLargeError,
    OnShutdownError,
    StreamingError,
    UnavailableError,
    UnrecoverableError,
)
from wal.kv_key import encode_key

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
    # The KV errors (KeyNotFoundError and its kin) never set the fields their base declares.
    code, err_code = getattr(exc, "code", None), getattr(exc, "err_code", None)
    if code in _TRANSIENT_STATUS or err_code in _TRANSIENT_ERR_CODES:
        return UnavailableError(f"{what}: NATS at {path} refused for now: {exc}", path=path,
                                nats_code=code, err_code=err_code)
    return UnrecoverableError(
        f"{what}: NATS at {path} refused (code {code}, err_code {err_code}), which retrying cannot "
        f"change: {exc}", path=path, nats_code=code, err_code=err_code)


_PREFIX_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_WRONG_LAST_SEQUENCE = frozenset({10071, 10164})
"""JetStream's err_codes for a failed expected-last-sequence check: "wrong last sequence: N" and its
constant form "wrong last sequence" (met on a replicated stream under faults).  Either is the fence."""
_STREAM_NOT_FOUND = 10059
_MAX_FENCE_TRIES = 50
_READ_BATCH = 256
"""Most messages one batched direct get asks for while reading forward (``StreamReads._get_batch``)."""
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

class JetStreamConnection(Backend):
    """The connection half of ``JetStreamBackend`` (see ``wal.backends.jetstream`` for the arguments)."""

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
        self.batch_gets = 0
        """How many batched direct gets a forward read asked (one answers up to ``_READ_BATCH``)."""
        self._batches = True
        """Whether the servers answer batched direct gets (nats-server 2.11 and later)."""
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
    def _close_connection(self) -> None:
        if self._nc is None:
            return
        # On failure the connection is dropped with the loop (_stop_loop).
        with contextlib.suppress(StreamingError):
            self._call(self._nc.close(), what="closing the NATS connection", overall=self.timeout * 2)
