"""Instructions per message of the decoders that build Messages (stored blocks, the wire), counted by
callgrind: what ``wal.message.decoded_message`` / ``decoded_messages`` cost against filling the slots.

    .venv/bin/python bench/decode_instructions.py

Re-runs itself under ``valgrind --tool=callgrind --instr-atstart=no``; each case decodes 1,000 messages
(1 KiB payloads for blocks; what a consumer receives for the wire) five times between two client
requests (``bench/_callgrind.py``) after two warm-up runs, and prints instructions per message.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

_HERE = Path(__file__).resolve().parent
N = 1000
REPEAT = 5


def _cases() -> dict[str, Callable[[], object]]:
    sys.path.insert(0, str(_HERE.parent))
    from streamingnode.v1 import common_pb2 as pb  # noqa: PLC0415
    from streamingnode.wire import codec  # noqa: PLC0415
    from wal._codec import decode_block, encode_block  # noqa: PLC0415
    from wal._record import decode_message, encode_message  # noqa: PLC0415
    from wal.message import Message, MessageType  # noqa: PLC0415

    plain = [Message(MessageType.DATA, "v0", b"x" * 1024).with_timetick(i + 1).with_last_confirmed(5) for i in range(N)]
    mixed = [Message(MessageType.DATA, f"v{i % 3}", b"x" * (100 + i % 7)).with_timetick(i + 1) for i in range(N)]
    plain_block, mixed_block = encode_block(plain), encode_block(mixed)
    one = encode_message(mixed[0])
    stored = decode_block(plain_block, 10)
    cols = pb.MessageColumns()
    cols.types.extend([m.message_type for m in stored])
    cols.vchannels.extend([m.vchannel for m in stored])
    cols.timeticks.extend([m.timetick for m in stored])
    cols.wal_terms.extend([0] * N)
    cols.ids.extend([m.message_id or 0 for m in stored])
    cols.payloads.extend([m.payload for m in stored])
    cols.last_confirmeds.extend([5] * N)
    produced = pb.MessageColumns()
    produced.types.extend([int(MessageType.DATA)] * N)
    produced.vchannels.extend(["v0"] * N)
    produced.payloads.extend([b"x" * 1024] * N)
    rows = [codec.message_to_pb(m) for m in stored]
    return {
        "decode_block plain run": lambda: decode_block(plain_block, 10),
        "decode_block mixed": lambda: decode_block(mixed_block, 10),
        "decode_message": lambda: [decode_message(one) for _ in range(N)],
        "messages_from_columns": lambda: codec.messages_from_columns(cols),
        "produced_columns": lambda: codec.produced_columns(produced, 1 << 20),
        "message_from_pb": lambda: [codec.message_from_pb(p) for p in rows],
    }


def _inner() -> None:
    sys.path.insert(0, str(_HERE))
    from _callgrind import ClientRequests  # noqa: PLC0415

    requests = ClientRequests()
    for name, run in _cases().items():
        run()
        run()
        requests.start()
        for _ in range(REPEAT):
            run()
        requests.stop(name)


def main() -> None:
    if "--inner" in sys.argv:
        _inner()
        return
    with tempfile.TemporaryDirectory(prefix="decode-instr-") as work:
        subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={work}/cg.out",
                        sys.executable, __file__, "--inner"], check=True, capture_output=True)
        for path in sorted(glob.glob(os.path.join(work, "cg.out.*")), key=lambda p: int(p.rsplit(".", 1)[1])):
            text = Path(path).read_text()
            name = re.search(r"^desc: Trigger: Client Request: (.*)$", text, re.M)
            total = re.search(r"^summary: (\d+)", text, re.M) or re.search(r"^totals: (\d+)", text, re.M)
            if name and total:
                print(f"{name.group(1):24s} {int(total.group(1)) // (N * REPEAT):>8,} instructions per message")


if __name__ == "__main__":
    main()
