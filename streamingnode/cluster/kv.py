"""The JetStream KV plumbing cluster mode stands on: opening a bucket, reading a whole bucket in one
sweep (``read_all``), and the wall clock its records carry (names become keys through ``wal.kv_key``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from nats.js.errors import BucketNotFoundError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue


def now_ms() -> int:
    return int(time.time() * 1000)


async def bucket(js: Any, name: str, *, ttl: float | None = None, replicas: int = 1) -> KeyValue:
    """Open KV bucket ``name``, creating it when missing (two nodes creating it at once with the same
    settings both succeed: JetStream treats an identical stream creation as a no-op)."""
    try:
        kv: KeyValue = await js.key_value(name)
    except BucketNotFoundError:
        kv = await js.create_key_value(bucket=name, history=1, ttl=ttl, replicas=replicas)
    return kv


async def read_all(kv: KeyValue, within: float) -> dict[str, KeyValue.Entry]:
    """Every key's current entry (deleted and purged keys left out), in one sweep: an ordered consumer
    over the bucket delivering the last value per key, stopped at the server's "no more pending"
    marker.  A few round trips whatever the number of keys, where ``keys()`` then ``get()`` each is
    one per key.  The consumer is ephemeral and goes away soon after (``inactive_threshold``)."""
    out: dict[str, KeyValue.Entry] = {}
    seen: set[str] = set()  # every key delivered, deleted ones too: each is one message of the bucket
    # Setting the watch up is bounded by the JetStream context's request timeout; not cancelled from
    # here, since a watch cancelled half set up would leave its subscription behind.
    watcher = await kv.watchall(inactive_threshold=max(2.0, within))
    try:
        async with asyncio.timeout(within):
            async for entry in watcher:
                if entry is None:
                    # nats-py's "no more pending" marker.  It can come before any entry of a bucket that
                    # is not empty: it is decided from the consumer's pending count, which is 0 once the
                    # server has sent everything, whether or not the client has taken any of it yet.
                    # Only an empty bucket ends the sweep here; otherwise its entries are on their way.
                    if (await kv.status()).values == 0:
                        break
                    continue
                seen.add(entry.key)
                if entry.operation in (KV_DEL, KV_PURGE):
                    out.pop(entry.key, None)
                else:
                    out[entry.key] = entry
                # Nothing pending after it: the end of what the bucket held -- unless keys were
                # updated meanwhile.  The server picks each key's last message when the consumer starts;
                # a key updated before its turn has that message gone (one revision per key) and comes
                # later as its new revision, yet the pending count can reach 0 before it (a sweep
                # beside lease renewals missed held leases).  A bucket keeps at most ``history``
                # messages per key (cluster mode's keep one), so the sweep has ended once it has seen
                # at least messages / history keys: every key, when history is 1.
                if entry.delta == 0 and len(seen) >= await _keys_at_least(kv):
                    break
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]  # nats-py leaves it unannotated
    return out


async def _keys_at_least(kv: KeyValue) -> int:
    """A lower bound of the number of keys ``kv`` holds (deleted ones too): its messages over its
    history (exact for a bucket of history 1)."""
    status = await kv.status()
    return -(-status.values // max(status.history, 1))


__all__ = ["bucket", "now_ms", "read_all"]
