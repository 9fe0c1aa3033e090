"""The producer spool: its high-water mark outlives truncation, each record is checksummed (a damaged
one is named by file and offset, the rest still read), and one spool serves one producer at a time."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest

from streamingnode.client._spool import MAGIC, Spool, spool_path
from streamingnode.v1 import streaming_pb2 as spb
from wal.errors import ResourceExhaustedError


def request(first: int, n: int, tag: str = "x") -> spb.ProduceRequest:
    req = spb.ProduceRequest()
    req.batch.first_sequence = first
    req.batch.columns.payloads.extend([f"{tag}{first + i}".encode() for i in range(n)])
    req.batch.columns.vchannels.extend(["v"] * n)
    return req


def firsts(spool: Spool) -> list[int]:
    return [r.batch.first_sequence for r in spool.pending()]


def test_unanswered_batches_are_read_back_in_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "p", "ch")
    for first in (0, 3, 6):
        spool.append(request(first, 3))
    spool.answered(2, empty=False)
    spool.close()
    again = Spool(tmp_path, "p", "ch")
    assert firsts(again) == [3, 6] and again.high_water == 8
    again.close()


def test_the_high_water_mark_survives_truncation(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "p", "ch")
    spool.append(request(0, 10))
    spool.answered(9, empty=True)  # everything answered: the file starts over
    spool.close()
    assert Path(spool.path).stat().st_size < 40, "the file was truncated"
    again = Spool(tmp_path, "p", "ch")
    assert firsts(again) == [] and again.high_water == 9
    again.close()


def test_a_damaged_record_is_named_and_the_rest_is_recovered(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool(tmp_path, "p", "ch")
    offsets = []
    for first in (0, 3, 6):
        offsets.append(spool._file.tell())
        spool.append(request(first, 3))
    spool.close()
    raw = bytearray(Path(spool.path).read_bytes())
    raw[offsets[1] + 30] ^= 0xFF  # a flipped byte inside the second batch's body
    Path(spool.path).write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="streamingnode.client"):
        again = Spool(tmp_path, "p", "ch")
    assert again.damaged == [(spool.path, offsets[1])]
    assert f"offset {offsets[1]}" in caplog.text and spool.path in caplog.text
    assert firsts(again) == [0, 6], "the batches around the damaged one are still resent"
    again.close()


def test_a_damaged_length_is_passed_over_to_the_next_valid_record(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "p", "ch")
    offsets = []
    for first in (0, 3, 6):
        offsets.append(spool._file.tell())
        spool.append(request(first, 3))
    spool.close()
    raw = bytearray(Path(spool.path).read_bytes())
    struct.pack_into(">I", raw, offsets[0] + 9, 7)  # the first record's length, now wrong
    Path(spool.path).write_bytes(bytes(raw))
    again = Spool(tmp_path, "p", "ch")
    assert again.damaged == [(spool.path, offsets[0])] and firsts(again) == [3, 6]
    again.close()


def test_a_torn_last_record_is_no_damage(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "p", "ch")
    spool.append(request(0, 3))
    spool.append(request(3, 3))
    spool.close()
    raw = Path(spool.path).read_bytes()
    Path(spool.path).write_bytes(raw[:-5])  # the process died while appending the second
    again = Spool(tmp_path, "p", "ch")
    assert again.damaged == [] and firsts(again) == [0]
    again.close()


def test_a_spool_without_checksums_is_still_read_and_rewritten(tmp_path: Path) -> None:
    path = Path(spool_path(tmp_path, "p", "ch"))
    body = request(4, 2).SerializeToString()
    old = struct.pack(">cQI", b"A", 3, 0) + struct.pack(">cQI", b"B", 4, len(body)) + body
    path.write_bytes(old)
    spool = Spool(tmp_path, "p", "ch")
    assert firsts(spool) == [4] and spool.high_water == 5
    spool.close()
    assert path.read_bytes().startswith(MAGIC)
    again = Spool(tmp_path, "p", "ch")
    assert firsts(again) == [4] and again.high_water == 5
    again.close()


def test_one_spool_serves_one_producer_at_a_time(tmp_path: Path) -> None:
    first = Spool(tmp_path, "p", "ch")
    with pytest.raises(ResourceExhaustedError, match="in use by another producer") as refused:
        Spool(tmp_path, "p", "ch")
    assert refused.value.fields["path"] == first.path
    other = Spool(tmp_path, "p", "other-channel")  # another file: no conflict
    other.close()
    first.close()
    Spool(tmp_path, "p", "ch").close()


def test_a_second_process_is_refused_while_the_first_holds_the_spool(tmp_path: Path) -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    repo = Path(__file__).resolve().parents[2]
    code = ("import sys; from streamingnode.client._spool import Spool; s = Spool(sys.argv[1], 'p', 'ch'); "
            "print('held', flush=True); sys.stdin.readline()")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=repo)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ResourceExhaustedError, match="in use by another producer"):
            Spool(tmp_path, "p", "ch")
    finally:
        holder.communicate("\n")
    Spool(tmp_path, "p", "ch").close()  # the lock went with the process
