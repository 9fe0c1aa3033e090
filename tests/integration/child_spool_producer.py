"""A client process for the spool tests: ``ADDRESS SPOOL_DIR TAG BATCHES [STOP_AFTER]``.

Produces ``BATCHES`` batches of three messages ``TAG-<batch>-<i>`` on pchannel ``p``, vchannel ``v``,
as producer ``spooled`` with the spool in ``SPOOL_DIR``, one batch at a time, and prints

- ``recovered <count>`` once, when the messages the spool held from an earlier process are answered;
- ``acked <payload>...`` after each batch is answered;
- with ``STOP_AFTER``: ``written`` once batch STOP_AFTER has been written to the stream (answered or
  not), then it waits to be killed;
- ``done`` at the end.
"""

from __future__ import annotations

import asyncio
import sys

from streamingnode.client import AsyncClient


def say(*words: str) -> None:
    print(*words, flush=True)


async def main(address: str, spool: str, tag: str, batches: int, stop_after: int | None) -> None:
    async with AsyncClient(address, timeout=20.0, reconnect_timeout=20.0) as client:
        producer = client.producer("p", producer_id="spooled", spool_dir=spool, linger=60.0)
        if producer.recovered:
            await asyncio.gather(*producer.recovered)
            say("recovered", str(len(producer.recovered)))
        for b in range(batches):
            futures = [producer.send_nowait("v", f"{tag}-{b}-{i}".encode()) for i in range(3)]
            if b == stop_after:
                written = producer.batches_written
                flushing = asyncio.ensure_future(producer.flush())
                while producer.batches_written == written:
                    await asyncio.sleep(0.001)
                say("written")
                await flushing
                await asyncio.Event().wait()  # killed here (answered or not, the batch is in the spool)
            await producer.flush()
            await asyncio.gather(*futures)
            say("acked", *(f"{tag}-{b}-{i}" for i in range(3)))
        await producer.aclose()
    say("done")


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(args[0], args[1], args[2], int(args[3]), int(args[4]) if len(args) > 4 else None))
