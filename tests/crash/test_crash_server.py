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
from tests.crash.evidence import stderr_on_failure
from tests.node_process import NodeProcess
from tests.waiting import until
from wal.message import MessageType

pytestmark = pytest.mark.crash

KILLS = int(os.environ.get("STREAMINGNODE_SERVER_KILLS", "3"))
END = b"end"  # sent once every other message is acknowledged: whatever a reader gets twice comes before it
IN_FLIGHT = 1000  # messages queued in the producer beyond the acknowledged ones


async def _read_until_end(client: AsyncClient, into: list[bytes], timeout: float) -> None:
    """The DATA payloads of pchannel ``ch`` into ``into``, up to and including ``END``."""
    async with client.consumer("ch") as consumer:
        async with asyncio.timeout(timeout):
            async for pack in consumer:
                for m in pack.messages:
                    if m.message_type is MessageType.DATA:
                        into.append(m.payload)
                        if m.payload == END:
                            return


async def test_sigkill_and_restart_lose_nothing_and_duplicate_nothing(tmp_path: Path, crash_seed: int) -> None:
    seed = crash_seed
    rng = random.Random(seed)
    node = NodeProcess(tmp_path / "data", None, "--channels", "ch").start()
    try:
        with stderr_on_failure(lambda: node.stderr, "node"):
            await _produce_kill_and_read(node, seed, rng)
    finally:
        node.kill()


async def _produce_kill_and_read(node: NodeProcess, seed: int, rng: random.Random) -> None:
    async with AsyncClient(node.address, reconnect_timeout=60.0, timeout=30.0) as client:
        live: list[bytes] = []
        live_task = asyncio.ensure_future(_read_until_end(client, live, 600))
        producer = client.producer("ch", producer_id=uuid.uuid4().hex, linger=0.002, max_batch_messages=50)
        acked: list[bytes] = []
        failed: list[BaseException] = []
        stop = asyncio.Event()
        acked_at_kill: list[int] = []

        async def send_all() -> int:
            # Keep producing until the kills are over, so every kill lands mid-stream; at most
            # IN_FLIGHT messages ahead of the acknowledgements (they stall while the node restarts).
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
                await asyncio.sleep(0)  # the acknowledgements and the kills run in between
                await until(lambda n=i: n - len(acked) - len(failed) <= IN_FLIGHT, "the producer to catch up",
                            timeout=120)
            await asyncio.gather(*pending, return_exceptions=True)
            return i

        sender = asyncio.ensure_future(send_all())
        for _ in range(KILLS):
            # Kill after a random number of further acknowledgements: always mid-stream, however fast
            # or slow the machine is.
            target = len(acked) + rng.randrange(200, 3000)
            await until(lambda t=target: len(acked) >= t or sender.done(), f"{target} acknowledgements",
                        timeout=120)
            acked_at_kill.append(len(acked))
            node.kill()
            node.start()
        resumed = len(acked)
        await until(lambda: len(acked) >= resumed + 200 or sender.done(), "acknowledgements after the last restart",
                    timeout=120)
        stop.set()
        sent = await sender
        await producer.aclose()
        assert not failed, f"seed {seed}: sends failed: {failed[:3]}"
        assert len(acked) == sent
        assert acked_at_kill[0] > 0 and acked_at_kill[-1] < sent, "the kills must land while producing"
        async with client.producer("ch") as last:
            await last.send("v", END)

        await asyncio.wait_for(live_task, 60)
        fresh: list[bytes] = []
        await _read_until_end(client, fresh, 60)
    for name, read in (("live consumer", live), ("fresh read", fresh)):
        assert read[-1] == END and END not in read[:-1], f"seed {seed}: {name} did not end with the end marker"
        got = read[:-1]
        assert len(got) == len(set(got)), f"seed {seed}: {name} saw duplicates"
        assert sorted(got) == sorted(acked), f"seed {seed}: {name} differs from the acknowledged set"
    assert fresh[:-1] == sorted(fresh[:-1]), f"seed {seed}: one producer's messages must stay in order"
    print(f"{KILLS} kills at {acked_at_kill} acknowledged, {len(acked)} in all")
