"""``streamingnode.cluster.kv.read_all`` on a real bucket while its keys are renewed: every sweep must
see every key (a lease being renewed is still held; a sweep that misses it reads the pchannel as
free)."""

from __future__ import annotations

import asyncio
import itertools
import random

import nats
import pytest

from streamingnode.cluster.kv import bucket, read_all
from tests.natscluster import NatsCluster

pytestmark = pytest.mark.integration

_names = itertools.count()


async def test_every_sweep_sees_every_key_while_keys_are_renewed(nats_r1: NatsCluster) -> None:
    keys = [f"k{i}" for i in range(40)]
    nc = await nats.connect(nats_r1.url)
    try:
        js = nc.jetstream(timeout=10)
        kv = await bucket(js, f"sweep{next(_names)}")
        for k in keys:
            await kv.put(k, b"0")
        stop = asyncio.Event()
        renewals = [0]

        async def renew(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                await kv.put(rng.choice(keys), str(renewals[0]).encode())
                renewals[0] += 1

        renewers = [asyncio.create_task(renew(s)) for s in range(4)]
        short: list[tuple[int, list[str]]] = []
        try:
            async with asyncio.timeout(300):
                for sweep in range(150):
                    got = await read_all(kv, 10.0)
                    if set(got) != set(keys):
                        short.append((sweep, sorted(set(keys) - set(got))))
        finally:
            stop.set()
            await asyncio.gather(*renewers)
        assert renewals[0] > 150, renewals  # the sweeps did run beside renewals
        assert not short, f"{len(short)} of 150 sweeps missed keys (sweep, missing): {short[:5]}"
    finally:
        await nc.close()
