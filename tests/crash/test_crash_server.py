"""Kill test of the service: SIGKILL the node under a producing client, restart it, let the client
resume; what a consumer finally reads equals what was acknowledged, exactly.

The producer is idempotent (producer id + sequences), so the batches it resends after each restart
are not written twice; the consumer follows the log across the restarts and resumes from its last
position.  Both the consumer that lived through the kills and a fresh full read must see every
acknowledged message once and nothing else (a message written but never acknowledged — killed
between the fsync and the answer — is allowed only if its resend is then acknowledged).
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from pathlib import Path

import pytest

from streamingnode.client import AsyncClient
from tests.node_process import NodeProcess
from wal.message import MessageType

pytestmark = pytest.mark.crash

KILLS = int(os.environ.get("STREAMINGNODE_SERVER_KILLS", "3"))


async def _read_all(client: AsyncClient, expect: int, into: list[bytes], timeout: float) -> None:
    async with client.consumer("ch") as consumer:
        async with asyncio.timeout(timeout):
            async for pack in consumer:
                into += [m.payload for m in pack.messages if m.message_type is MessageType.DATA]
                if len(into) >= expect:
                    return


async def test_sigkill_and_restart_lose_nothing_and_duplicate_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("STREAMINGNODE_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    node = NodeProcess(tmp_path / "data", None, "--channels", "ch").start()
    try:
        async with AsyncClient(node.address, reconnect_timeout=60.0, timeout=30.0) as client:
            live: list[bytes] = []
            live_task = asyncio.ensure_future(_read_all(client, 10**9, live, 600))
            producer = client.producer("ch", producer_id=uuid.uuid4().hex, linger=0.002, max_batch_messages=50)
            acked: list[bytes] = []
            failed: list[BaseException] = []

            stop = asyncio.Event()
            acked_at_kill: list[int] = []

            async def send_all() -> int:
                # Keep producing until the kills are over, so every kill lands mid-stream.
                pending = []
                i = 0
                while not stop.is_set():
                    for _ in range(100):
                        payload = f"m{i:07}".encode()
                        fut = producer.send_nowait("v", payload)
                        fut.add_done_callback(
                            lambda f, p=payload: acked.append(p) if not f.exception() else failed.append(f.exception()))
                        pending.append(fut)
                        i += 1
                    await asyncio.sleep(0.01)
                await asyncio.gather(*pending, return_exceptions=True)
                return i

            sender = asyncio.ensure_future(send_all())
            for _ in range(KILLS):
                await asyncio.sleep(rng.uniform(0.3, 1.0))
                acked_at_kill.append(len(acked))
                node.kill()
                node.start()
            await asyncio.sleep(0.3)
            stop.set()
            sent = await sender
            await producer.aclose()
            assert not failed, f"seed {seed}: sends failed: {failed[:3]}"
            assert len(acked) == sent
            assert acked_at_kill[0] > 0 and acked_at_kill[-1] < sent, "the kills must land while producing"

            async with asyncio.timeout(60):
                while len(live) < len(acked):
                    await asyncio.sleep(0.05)
            live_task.cancel()
            fresh: list[bytes] = []
            await _read_all(client, len(acked), fresh, 60)
            await asyncio.sleep(0.3)  # anything extra (a duplicate) would arrive right behind
        for name, got in (("live consumer", live), ("fresh read", fresh)):
            assert len(got) == len(set(got)), f"seed {seed}: {name} saw duplicates"
            assert sorted(got) == sorted(acked), f"seed {seed}: {name} differs from the acknowledged set"
        assert fresh == sorted(fresh), f"seed {seed}: one producer's messages must stay in order"
    finally:
        node.kill()
