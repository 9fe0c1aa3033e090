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
an id -> sequence index learnt while writing and reading), never by scanning the stream; from there
it reads forward with batched direct gets (up to 256 blocks per request).

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

import contextlib
import json
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.js import api

from wal.backend import ChannelInfo, TickEntry
from wal.backends._js_appends import StreamAppends
from wal.backends._js_connection import (
    _EXPECTED_LAST_SEQ,
    _MAX_FENCE_TRIES,
    _MAX_TT_META,
    _WRONG_LAST_SEQUENCE,
    H_FENCE,
    H_FIRST,
    H_LAST_TICK,
    H_MAX_TT,
    H_TERM,
    _Chan,
    _tick_text,
)
from wal.backends.rocks_layout import TRUNCATED_META, tail_state
from wal.backends.rocks_layout import U64 as _U64
from wal.errors import (
    ChannelExistError,
    ChannelFencedError,
    ChannelNotExistError,
    CorruptedError,
    InvalidArgumentError,
    UnavailableError,
)
from wal.kv_key import decode_key, encode_key
from wal.message import MessageID


class JetStreamBackend(StreamAppends):
    """Pchannels as JetStream streams; see the module docstring.  ``servers``: one URL, a comma
    list, or a list; ``replicas``: 1 or 3; ``timeout``: seconds per NATS request, and half the time a
    block publish, metadata put or read keeps asking again without progress; ``attempt_timeout``:
    seconds one such attempt waits for its answer (short, so that an election is ridden out: a
    request to a dead stream leader is asked again of the new one soon after it is elected).

    Its parts: the connection (``_js_connection``), the stream reads (``_js_reads``), the appends
    (``_js_appends``) and, here, the channels (records, ownership claims, truncation, metadata)."""

    split_sync = False
    pipelined = True

    # --- channels --------------------------------------------------------------------------------
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
        except nats.js.errors.KeyNotFoundError as exc:
            # nats-py's create, refused as out of sequence, reads the key back (to tell a deleted key
            # from a live one); a read that finds nothing, as when another node creates the same
            # pchannel at the same moment on a cluster still settling, leaves the outcome open: this
            # node's stream goes, and the caller asks again (UNAVAILABLE), to find the record or win.
            await self._js.delete_stream(self._stream(key))
            raise UnavailableError(f"creating pchannel {name!r} raced with another creator of it; try again",
                                   channel=name, path=self.path) from exc
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
                if exc.err_code in _WRONG_LAST_SEQUENCE:
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
            if exc.err_code in _WRONG_LAST_SEQUENCE:
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

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._close_connection()
        finally:
            self._closed = True
            self._stop_loop()

__all__ = ["JetStreamBackend", "decode_key", "encode_key"]
