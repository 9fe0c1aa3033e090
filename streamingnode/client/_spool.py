"""A producer's disk spool: its sealed batches outlive the client process.

One file per (producer id, pchannel) in the spool directory, appended to only:

- ``B`` records: a sealed batch (the serialized ``ProduceRequest``: first sequence, vchannels,
  types, payloads, properties), written before the batch is first sent;
- ``A`` records: every sequence up to this one is answered (or was failed to its caller).

A record is ``kind (1 byte) | sequence (8, big endian) | length (4) | body``.  A torn last record (the
process died while appending) is ignored.  When nothing is left unanswered the file is truncated.

A producer made with the same id and spool directory reads the batches past the last ``A`` and sends
them first, with their original sequences: the node's dedup window drops those it already has, so they
are appended once, as long as the resend comes within that window (4096 sequences per producer by
default).  The file is flushed to the OS after each record, not fsynced: it survives the client
process, not the machine.
"""

from __future__ import annotations

import base64
import os
import struct

from streamingnode.v1 import streaming_pb2 as spb

_HEADER = struct.Struct(">cQI")
_BATCH = b"B"
_ANSWERED = b"A"


def spool_path(spool_dir: str | os.PathLike[str], producer_id: str, pchannel: str) -> str:
    """The file of one producer on one pchannel (names encoded: ids may hold any character)."""
    key = f"{producer_id}\x00{pchannel}".encode()
    name = base64.b32encode(key).decode().rstrip("=").lower()
    return os.path.join(os.fspath(spool_dir), f"{name}.spool")


class Spool:
    """The append-only file of one producer (see the module)."""

    def __init__(self, spool_dir: str | os.PathLike[str], producer_id: str, pchannel: str) -> None:
        os.makedirs(spool_dir, exist_ok=True)
        self.path = spool_path(spool_dir, producer_id, pchannel)
        self._pending = self._read()
        self._file = open(self.path, "ab")  # noqa: SIM115  (held for the producer's life; closed by close())

    def _read(self) -> list[spb.ProduceRequest]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        batches: list[tuple[int, bytes]] = []
        answered = -1
        pos = 0
        while pos + _HEADER.size <= len(data):
            kind, seq, length = _HEADER.unpack_from(data, pos)
            end = pos + _HEADER.size + length
            if end > len(data) or kind not in (_BATCH, _ANSWERED):
                break  # a torn tail
            if kind == _BATCH:
                batches.append((seq, data[pos + _HEADER.size:end]))
            else:
                answered = max(answered, seq)
            pos = end
        pending: list[spb.ProduceRequest] = []
        for _, body in batches:
            request = spb.ProduceRequest.FromString(body)
            n = len(request.batch.columns.payloads)
            if request.batch.first_sequence + n - 1 > answered:
                pending.append(request)
        return pending

    def pending(self) -> list[spb.ProduceRequest]:
        """Batches an earlier producer spooled and never saw answered, in sequence order."""
        pending, self._pending = self._pending, []
        return pending

    def append(self, request: spb.ProduceRequest) -> None:
        body = request.SerializeToString()
        self._file.write(_HEADER.pack(_BATCH, request.batch.first_sequence, len(body)) + body)
        self._file.flush()

    def answered(self, last_sequence: int, *, empty: bool) -> None:
        """Every sequence up to ``last_sequence`` is answered; ``empty``: nothing else is pending, so the
        file can start over."""
        if empty:
            self._file.truncate(0)
            self._file.seek(0)
        else:
            self._file.write(_HEADER.pack(_ANSWERED, last_sequence, 0))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


__all__ = ["Spool", "spool_path"]
