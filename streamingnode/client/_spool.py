"""A producer's disk spool: its sealed batches outlive the client process.

One file per (producer id, pchannel) in the spool directory, appended to only.  It starts with a
magic line (``SNSPOOL2``) and holds records:

- ``B`` records: a sealed batch (the serialized ``ProduceRequest``: first sequence, vchannels,
  types, payloads, properties), written before the batch is first sent;
- ``A`` records: every sequence up to this one is answered (or was failed to its caller).

A record is ``kind (1 byte) | sequence (8, big endian) | length (4) | CRC-32 (4) | body``, the CRC over
the kind, sequence, length and body.  A torn last record (the process died while appending) is
ignored.  A record that fails its checksum is reported (``damaged``: the file and the offset, and a
warning in the ``streamingnode.client`` log), and reading goes on at the next record that passes its
own: a damaged batch cannot be resent, but the batches after it still are.  Files written before
checksums (no magic line) are still read.

When nothing is left unanswered the file starts over, with one ``A`` record of the highest sequence
answered: the spool's high-water mark survives the truncation, so a producer made later never numbers
new messages below it, even without the node's next sequence (see ``Producer``).

A producer made with the same id and spool directory reads the batches past the last ``A`` and sends
them first, with their original sequences: the node's dedup window answers those it already has with
their original results (the content must match), so they are appended once, as long as the resend
comes within that window (4096 sequences per producer by default).  The file is flushed to the OS
after each record, not fsynced: it survives the client process, not the machine.

The file is locked (``flock``, exclusive, released when the file is closed or the process dies): two
producers, in one process or two, cannot use one spool at once; the second is refused with a
``ResourceExhaustedError`` naming the file.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import zlib

from streamingnode.v1 import streaming_pb2 as spb
from wal.errors import ResourceExhaustedError
from wal.kv_key import encode_key

log = logging.getLogger("streamingnode.client")

MAGIC = b"SNSPOOL2\n"
_HEADER = struct.Struct(">cQII")
_LEGACY_HEADER = struct.Struct(">cQI")
_BATCH = b"B"
_ANSWERED = b"A"


def spool_path(spool_dir: str | os.PathLike[str], producer_id: str, pchannel: str) -> str:
    """The file of one producer on one pchannel (names encoded: ids may hold any character)."""
    name = encode_key(f"{producer_id}\x00{pchannel}")
    return os.path.join(os.fspath(spool_dir), f"{name}.spool")


def _record(kind: bytes, seq: int, body: bytes) -> bytes:
    head = struct.pack(">cQI", kind, seq, len(body))
    return head + struct.pack(">I", zlib.crc32(body, zlib.crc32(head))) + body


def _valid_at(data: bytes, pos: int) -> tuple[bytes, int, bytes, int] | None:
    """``(kind, sequence, body, end)`` of a whole record at ``pos`` that passes its checksum, or None."""
    if pos + _HEADER.size > len(data):
        return None
    kind, seq, length, crc = _HEADER.unpack_from(data, pos)
    end = pos + _HEADER.size + length
    if kind not in (_BATCH, _ANSWERED) or end > len(data):
        return None
    body = data[pos + _HEADER.size:end]
    if zlib.crc32(body, zlib.crc32(data[pos:pos + 13])) != crc:
        return None
    return kind, seq, body, end


class Spool:
    """The append-only file of one producer (see the module)."""

    def __init__(self, spool_dir: str | os.PathLike[str], producer_id: str, pchannel: str) -> None:
        os.makedirs(spool_dir, exist_ok=True)
        self.path = spool_path(spool_dir, producer_id, pchannel)
        self._file = open(self.path, "ab")  # noqa: SIM115  (held for the producer's life; closed by close())
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self._file.close()
            raise ResourceExhaustedError(
                f"producer spool {self.path!r} (producer {producer_id!r}, pchannel {pchannel!r}) is in use by "
                f"another producer, in this process or another: one spool serves one producer at a time",
                path=self.path, limit="spool_dir") from exc
        self.damaged: list[tuple[str, int]] = []
        """``(file, offset)`` of every record that failed its checksum when the spool was read."""
        self.high_water = -1
        """The highest sequence the spool ever held or saw answered (-1: none)."""
        self._pending = self._read()
        if self._file.tell() == 0:
            self._file.write(MAGIC)
            self._file.flush()

    def _read(self) -> list[spb.ProduceRequest]:
        with open(self.path, "rb") as f:
            data = f.read()
        if not data.startswith(MAGIC):
            return self._read_legacy(data)
        batches: list[bytes] = []
        answered = -1
        pos = len(MAGIC)
        while pos < len(data):
            record = _valid_at(data, pos)
            if record is None:
                nxt = next((p for p in range(pos + 1, len(data)) if _valid_at(data, p) is not None), None)
                if nxt is None and self._torn(data, pos):
                    break  # the process died while appending: nothing was lost that was ever answered
                self.damaged.append((self.path, pos))
                log.warning("producer spool %s: the record at offset %d fails its checksum; %s", self.path, pos,
                            f"reading goes on at offset {nxt}" if nxt is not None else "nothing after it is readable")
                if nxt is None:
                    break
                pos = nxt
                continue
            kind, seq, body, pos = record
            if kind == _BATCH:
                batches.append(body)
            else:
                answered = max(answered, seq)
        return self._unanswered(batches, answered)

    @staticmethod
    def _torn(data: bytes, pos: int) -> bool:
        """The bytes from ``pos`` are the start of a record cut short (not a damaged one)."""
        if pos + _HEADER.size > len(data):
            return True
        kind, _, length, _ = _HEADER.unpack_from(data, pos)
        return kind in (_BATCH, _ANSWERED) and pos + _HEADER.size + length > len(data)

    def _read_legacy(self, data: bytes) -> list[spb.ProduceRequest]:
        batches: list[bytes] = []
        answered = -1
        pos = 0
        while pos + _LEGACY_HEADER.size <= len(data):
            kind, seq, length = _LEGACY_HEADER.unpack_from(data, pos)
            end = pos + _LEGACY_HEADER.size + length
            if end > len(data) or kind not in (_BATCH, _ANSWERED):
                break  # a torn tail
            if kind == _BATCH:
                batches.append(data[pos + _LEGACY_HEADER.size:end])
            else:
                answered = max(answered, seq)
            pos = end
        pending = self._unanswered(batches, answered)
        # Rewritten in the current form: records are appended with checksums from now on.
        self._file.truncate(0)
        self._file.seek(0)
        self._file.write(MAGIC + _record(_ANSWERED, answered, b"") if answered >= 0 else MAGIC)
        for request in pending:
            self._file.write(_record(_BATCH, request.batch.first_sequence, request.SerializeToString()))
        self._file.flush()
        return pending

    def _unanswered(self, batches: list[bytes], answered: int) -> list[spb.ProduceRequest]:
        self.high_water = max(self.high_water, answered)
        pending: list[spb.ProduceRequest] = []
        for body in batches:
            request = spb.ProduceRequest.FromString(body)
            last = request.batch.first_sequence + len(request.batch.columns.payloads) - 1
            self.high_water = max(self.high_water, last)
            if last > answered:
                pending.append(request)
        return pending

    def pending(self) -> list[spb.ProduceRequest]:
        """Batches an earlier producer spooled and never saw answered, in sequence order."""
        pending, self._pending = self._pending, []
        return pending

    def append(self, request: spb.ProduceRequest) -> None:
        batch = request.batch
        self._file.write(_record(_BATCH, batch.first_sequence, request.SerializeToString()))
        self._file.flush()
        self.high_water = max(self.high_water, batch.first_sequence + len(batch.columns.payloads) - 1)

    def answered(self, last_sequence: int, *, empty: bool) -> None:
        """Every sequence up to ``last_sequence`` is answered; ``empty``: nothing else is pending, so the
        file can start over (keeping its high-water mark)."""
        self.high_water = max(self.high_water, last_sequence)
        if empty:
            self._file.truncate(0)
            self._file.seek(0)
            self._file.write(MAGIC + _record(_ANSWERED, self.high_water, b""))
        else:
            self._file.write(_record(_ANSWERED, last_sequence, b""))
        self._file.flush()

    def close(self) -> None:
        self._file.close()  # (releases the lock)


__all__ = ["MAGIC", "Spool", "spool_path"]
