"""The data journal of the RocksDB backend: what a killed process acknowledged is there after reopen,
a torn tail is dropped, damage elsewhere is reported, and a truncation is never undone by replay.

Each writer runs in a child process that ends with ``os._exit`` (no close, no flush): data written with
RocksDB's log off is then only in the journal, as after a crash.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from wal import CorruptedError, Message, MessageType, WALManager
from wal._codec import decode_block
from wal.backends import RocksBackend, _journal

ROOT = Path(__file__).resolve().parents[2]


def _crash_after(path: Path, body: str, **backend: object) -> str:
    """Run ``body`` (async, with ``wal`` open on pchannel p) in a child, then kill it without a close."""
    script = textwrap.dedent('''
        import asyncio, json, os, sys
        from wal import Message, MessageType, WALManager
        from wal.backends import RocksBackend

        async def main() -> None:
            backend = RocksBackend(sys.argv[1], **json.loads(sys.argv[2]))
            m = await WALManager.start(backend)
            if "p" not in await m.list_channels():
                await m.create_channel("p")
            wal = await m.open("p")
        {body}
            os._exit(0)  # no close: RocksDB never flushes, the memtable is gone

        asyncio.run(main())
    ''').replace("{body}", textwrap.indent(textwrap.dedent(body), " " * 4))
    done = subprocess.run([sys.executable, "-c", script, str(path), json.dumps(backend)], cwd=ROOT, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"the writer exited with {done.returncode}:\n{done.stderr}"
    return done.stdout


async def _payloads(path: Path, name: str = "p") -> list[bytes]:
    m = await WALManager.start(RocksBackend(path))
    try:
        wal = await m.open(name)
        messages = await wal.read_stored(wal.first_id, 1 << 30)
        return [x.payload for x in messages if x.message_type is MessageType.DATA]
    finally:
        await m.aclose()


def _journal_files(path: Path) -> list[str]:
    return _journal.files(str(path / "journal"))


def _records_only(path: Path) -> str:
    """The newest journal file, cut to its records' end: what a writer that does not preallocate
    leaves, for the tests that place bytes by the file's length.  (A version 2 record ends with its
    end magic, never with a zero byte.)"""
    last = _journal_files(path)[-1]
    with open(last, "rb") as f:
        os.truncate(last, len(f.read().rstrip(b"\0")))
    return last


_APPEND_40 = '''
    for i in range(40):
        await wal.append_batch([Message(MessageType.DATA, "v", b"m%02d" % i)])
'''


async def test_acknowledged_appends_survive_a_kill_through_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _crash_after(path, _APPEND_40)
    files = _journal_files(path)
    assert files and os.path.getsize(files[-1]) > 0, "the appends are in the journal, not in RocksDB's tables"
    assert await _payloads(path) == [b"m%02d" % i for i in range(40)]
    assert [os.path.getsize(f) for f in _journal_files(path)] == [0], "replayed, flushed, deleted"
    assert await _payloads(path) == [b"m%02d" % i for i in range(40)], "and still there after a clean close"


async def test_a_torn_record_at_the_end_is_dropped_and_the_rest_kept(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _crash_after(path, _APPEND_40)
    last = _journal_files(path)[-1]
    with open(last, "rb") as f:
        data = f.read()
    with open(last, "ab") as f:
        f.write(data[:200])  # the start of a record whose end never reached the disk
    assert await _payloads(path) == [b"m%02d" % i for i in range(40)]


def _refused(path: Path, name: str = "p") -> tuple[CorruptedError, list[bytes]]:
    """Open the database (journal damage never refuses it), check that opening pchannel ``name``
    fails with CORRUPTED, and return that error and the payloads the database still holds of it."""
    backend = RocksBackend(path)
    try:
        with pytest.raises(CorruptedError) as info:
            backend.open_channel(name)
        key = backend.describe_channel(name).key
        held = [m.payload for first, block in backend.read_blocks(key, 0, 1 << 30)
                for m in decode_block(block, first) if m.message_type is MessageType.DATA]
    finally:
        backend.close()
    return info.value, held


async def test_damage_in_an_older_journal_file_is_reported_not_skipped(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _crash_after(path, _APPEND_40)
    last = _records_only(path)
    older = _journal.file_name(str(path / "journal"), _journal.sequence_of(last) - 1)
    with open(last, "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0x5A
    with open(older, "wb") as f:
        f.write(bytes(data))
    err, held = _refused(path)
    assert re.search(rf"lost journal records: {older} is damaged at byte \d+", str(err)), err
    assert 0 < len(held) < 40 and held == [b"m%02d" % i for i in range(len(held))], \
        "a clean prefix is held; nothing from the newer file was applied past the gap"
    assert all(os.path.getsize(f) == 0 for f in _journal_files(path)), "only the fresh file is live"
    assert os.path.exists(older + ".kept") and os.path.exists(last + ".kept"), \
        "both files were not fully replayed: kept, never deleted"
    assert _refused(path)[1] == held, "refused again, not forgotten"


async def test_replay_never_brings_back_what_a_truncation_deleted(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _crash_after(path, _APPEND_40 + '''
    await wal.truncate(20)
    for i in range(40, 45):
        await wal.append_batch([Message(MessageType.DATA, "v", b"m%02d" % i)])
''')
    assert await _payloads(path) == [b"m%02d" % i for i in range(20, 45)]


async def test_a_rotated_journal_is_flushed_and_deleted_in_the_background(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _crash_after(path, '''
    for i in range(300):
        await wal.append_batch([Message(MessageType.DATA, "v", b"%05d" % i + bytes(1000))])
    # Until the background flushes of the rotated files finish (20 s at most; the test counts them).
    journal = os.path.join(sys.argv[1], "journal")
    for _ in range(2000):
        if len([n for n in os.listdir(journal) if n.endswith(".jnl")]) <= 2:
            break
        await asyncio.sleep(0.01)
''', journal_rotate_bytes=32 << 10)
    # About 1 KiB per append and a file every 32 KiB: without the background flush there would be
    # about ten files; the flushed ones are gone.
    assert 1 <= len(_journal_files(path)) <= 2
    assert [p[:5] for p in await _payloads(path)] == [b"%05d" % i for i in range(300)]


async def test_the_other_sync_methods_replay_a_journal_left_behind(tmp_path: Path) -> None:
    from wal.backends.rocks import SyncMethod  # noqa: PLC0415

    path = tmp_path / "db"
    _crash_after(path, _APPEND_40)
    m = await WALManager.start(RocksBackend(path, SyncMethod.FLUSH_WAL))
    try:
        wal = await m.open("p")
        got = [x.payload for x in await wal.read_stored(wal.first_id, 1 << 30)
               if x.message_type is MessageType.DATA]
    finally:
        await m.aclose()
    assert got == [b"m%02d" % i for i in range(40)]
    assert _journal_files(path) == []


def test_a_commit_of_more_blocks_than_one_writev_takes_is_journaled_whole(tmp_path: Path) -> None:
    from wal._codec import encode_block  # noqa: PLC0415
    from wal.backend import WriteGroup  # noqa: PLC0415
    from wal.message import Message  # noqa: PLC0415

    backend = RocksBackend(tmp_path / "db")
    try:
        key = backend.create_channel("p", {}).key
        blocks = []
        for i in range(1500):  # one group per block: 1,500 blocks plus two headers in one record
            m = Message(MessageType.DATA, "v", b"%04d" % i)
            m._timetick, m._term, m._last_confirmed = i + 1, 1, 0
            blocks.append(WriteGroup(key, i, encode_block([m]), [], i + 1))
        backend.write(blocks, True)
        records = [r for r in _journal.read(_journal_files(tmp_path / "db")[-1])]
        assert len(records) == 1 and not isinstance(records[0], _journal.Torn) and len(records[0]) == 1500
    finally:
        backend.close()


def _flip(path: str, offset: int) -> bytes:
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        data[offset] ^= 0x5A
        f.seek(0)
        f.write(bytes(data))
    return bytes(data)


async def test_a_flipped_byte_with_valid_records_after_it_refuses_the_pchannel_and_keeps_the_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db"
    _crash_after(path, _APPEND_40)
    last = _records_only(path)
    damaged = _flip(last, os.path.getsize(last) // 2)  # inside a record in the middle: 20 follow it
    err, held = _refused(path)
    assert re.search(rf"lost journal records: {last} is damaged at byte \d+", str(err)), err
    assert err.fields["file"] == last
    record_starts = [0]
    for item in _journal.read(last + ".kept"):
        assert isinstance(item, list) or item.damaged
        if isinstance(item, list):
            record_starts.append(record_starts[-1] + sum(map(len, _journal.encode(item))))
    assert err.fields["offset"] in record_starts, "the offset is where the damaged record starts"
    assert 0 < err.fields["offset"] < len(damaged)
    assert held == [b"m%02d" % i for i in range(len(held))] and len(held) < 40
    with open(last + ".kept", "rb") as f:
        assert f.read() == damaged, "the evidence is kept as it was"
    assert _refused(path)[1] == held  # and refused again, not forgotten


async def test_a_flipped_byte_in_the_last_complete_record_is_damage_not_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _crash_after(path, _APPEND_40)
    last = _records_only(path)
    _flip(last, os.path.getsize(last) - 30)  # in the last message of the last record: nothing follows
    err, held = _refused(path)
    assert re.search(rf"{last} is damaged at byte \d+ \(the block .* is damaged; its trailer", str(err)), err
    assert err.fields["pchannel"] == "p"
    assert held == [b"m%02d" % i for i in range(39)], "all but the damaged record's message"
    assert os.path.exists(last + ".kept")


@pytest.mark.parametrize("tail", ["cut", "zeros", "garbage"])
async def test_a_torn_tail_is_dropped_and_its_bytes_kept_aside(tmp_path: Path, tail: str) -> None:
    path = tmp_path / "db"
    _crash_after(path, _APPEND_40)
    last = _records_only(path)
    with open(last, "rb") as f:
        data = f.read()
    first = next(iter(_journal.read(last)))
    assert isinstance(first, list)
    cut = data[:sum(map(len, _journal.encode(first))) - 20]  # a record without its last twenty bytes
    extra = {"cut": cut, "zeros": bytes(300), "garbage": bytes(range(256)) * 2}[tail]
    with open(last, "ab") as f:
        f.write(extra)  # a write cut short, pages never written, or junk: nothing valid follows it
    assert await _payloads(path) == [b"m%02d" % i for i in range(40)]
    if tail == "zeros":
        # Zeros at a record boundary are the unwritten rest of a preallocated file: the records end
        # there, nothing was torn.
        assert not os.path.exists(last + ".torn")
        return
    assert os.path.exists(last + ".torn"), "what was dropped is kept for inspection"
    with open(last + ".torn", "rb") as f:
        # Up to its last non-zero byte: zeros the cut record ends with cannot be told from the
        # preallocated rest of the file.
        assert f.read() == extra.rstrip(b"\0"), "what was dropped is kept for inspection"


async def test_a_record_cut_short_in_the_middle_of_a_file_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _crash_after(path, _APPEND_40)
    last = _records_only(path)
    with open(last, "rb") as f:
        data = f.read()
    ends = []
    for item in _journal.read(last):
        assert isinstance(item, list)
        ends.append((ends[-1] if ends else 0) + sum(map(len, _journal.encode(item))))
    # Twenty bytes of the tenth record never reached the disk, and thirty records follow: no trailer
    # vouches for it, only the valid records after it tell that this is no torn tail.
    with open(last, "wb") as f:
        f.write(data[:ends[9] - 20] + data[ends[9]:])
    err, held = _refused(path)
    assert re.search(rf"at byte {ends[8]} .*a valid record follows at byte \d+", str(err)), err
    assert len(held) < 40 and held == [b"m%02d" % i for i in range(len(held))]


def test_version_1_records_of_an_older_build_still_replay(tmp_path: Path) -> None:
    import struct  # noqa: PLC0415
    import zlib  # noqa: PLC0415

    from wal._codec import encode_block  # noqa: PLC0415
    from wal.message import Message  # noqa: PLC0415

    m = Message(MessageType.DATA, "v", b"old")
    m._timetick, m._term, m._last_confirmed = 5, 1, 0
    block = encode_block([m])
    body_crc = struct.unpack_from("<I", block, 12)[0]
    meta = struct.pack("<IQQIII", 1, 0, 5, 0, len(block), body_crc)
    record = struct.pack("<III", _journal.MAGIC_V1, len(meta), zlib.crc32(meta)) + meta + block
    name = tmp_path / "1.jnl"
    name.write_bytes(record * 2)
    items = list(_journal.read(str(name)))
    assert len(items) == 2 and all(isinstance(i, list) and i[0].block == block for i in items)
    name.write_bytes(record + record[:-3])  # and a cut second record is a torn tail, as before
    *good, torn = _journal.read(str(name))
    assert len(good) == 1 and isinstance(torn, _journal.Torn) and not torn.damaged and torn.offset == len(record)


# --- damage contained to the pchannels it touches ---------------------------------------------------
_APPEND_P_Q = '''
    if "q" not in await m.list_channels():
        await m.create_channel("q")
    other = await m.open("q")
    for i in range(30):
        await wal.append_batch([Message(MessageType.DATA, "v", b"p%02d" % i)])
        await other.append_batch([Message(MessageType.DATA, "v", b"q%02d" % i)])
'''


def _records(path: str) -> list[tuple[int, list[object]]]:
    """(offset, groups) of each record of a whole journal file."""
    out: list[tuple[int, list[object]]] = []
    at = 0
    for item in _journal.read(path):
        assert isinstance(item, list)
        out.append((at, list(item)))
        at += sum(map(len, _journal.encode(item)))
    return out


@pytest.mark.parametrize("where", ["block", "record magic", "last record magic"])
async def test_journal_damage_fails_only_the_pchannel_it_touches(tmp_path: Path, where: str) -> None:
    path = tmp_path / "db"
    _crash_after(path, _APPEND_P_Q)
    last = _journal_files(path)[-1]
    p_key = 1  # created first
    records = _records(last)
    # The twentieth record holding p's block (its message p%02d), in the middle of the file.
    p_records = [(at, groups) for at, groups in records
                 if any(getattr(g, "channel_key", None) == p_key for g in groups) and len(groups) == 1]
    at, _groups = p_records[-1 if where == "last record magic" else len(p_records) // 2]
    # "block": the meta still names the pchannel.  "record magic": the record cannot be read at all,
    # and only the ids that follow tell whose block it held; in p's last record, none follow for p,
    # so p stays a suspect and is refused (q's next block continues q's ids: q is cleared).
    _flip(last, at + (sum(map(len, _journal.encode(_groups))) - 20 if where == "block" else 0))
    assert await _payloads(path, "q") == [b"q%02d" % i for i in range(30)], "the other pchannel lost nothing"
    err, held = _refused(path, "p")
    assert err.fields["file"] == last and err.fields["offset"] == at
    assert held == [b"p%02d" % i for i in range(len(held))] and 0 < len(held) < 30
    # q keeps serving and writing; the kept file is never deleted by the journal's own clean-up.
    m = await WALManager.start(RocksBackend(path, journal_rotate_bytes=1 << 10))
    try:
        q = await m.open("q")
        for i in range(30, 60):
            await q.append_batch([Message(MessageType.DATA, "v", b"q%02d" % i)])
    finally:
        await m.aclose()
    assert os.path.exists(last + ".kept")
    assert await _payloads(path, "q") == [b"q%02d" % i for i in range(60)]
    assert _refused(path, "p")[1] == held


async def test_a_damaged_journal_copy_of_a_block_the_tables_hold_costs_nothing(tmp_path: Path) -> None:
    # A journal file whose flush had in fact finished (the crash came before its deletion): the
    # tables hold every block, so damage in the journal's copy loses nothing.
    path = tmp_path / "db"
    _crash_after(path, _APPEND_40)
    last = _records_only(path)
    with open(last, "rb") as f:
        copy = f.read()
    assert await _payloads(path) == [b"m%02d" % i for i in range(40)]  # replayed, flushed, deleted
    with open(last, "wb") as f:
        f.write(copy)
    _flip(last, len(copy) - 30)  # in the last block: the meta names it, the tables hold it whole
    assert await _payloads(path) == [b"m%02d" % i for i in range(40)]


async def test_replay_skips_blocks_below_a_truncation_mark_and_ids_go_on(tmp_path: Path) -> None:
    path = tmp_path / "db"
    out = _crash_after(path, _APPEND_40 + '''
    print("state", wal.next_id, wal.last_timetick, flush=True)
    await wal.truncate(wal.next_id)  # everything: the journal holds every block, the tables none
''')
    next_id, last_ts = (int(x) for x in out.split("state ", 1)[1].split()[:2])
    backend = RocksBackend(path)
    try:
        info = backend.open_channel("p")
        assert backend.read_blocks(info.key, 0, 1 << 30) == [], "nothing truncated comes back"
        assert (info.first_id, info.next_id) == (next_id, next_id), "ids go on from the truncation, never from 0"
        assert info.last_timetick >= last_ts, "time never goes back"
    finally:
        backend.close()


# --- a preallocated file: zeros written ahead of the records ----------------------------------------
def _records_end(path: str) -> int:
    with open(path, "rb") as f:
        return len(f.read().rstrip(b"\0"))


async def test_a_crash_leaves_zeros_after_the_records_and_they_are_the_files_end(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _crash_after(path, _APPEND_40)
    last = _journal_files(path)[-1]
    end = _records_end(last)
    assert os.path.getsize(last) >= end + (1 << 20), "the writer zero-wrote the file ahead of its records"
    items = list(_journal.read(last))
    assert all(isinstance(i, list) for i in items), "the zeros are neither a torn tail nor damage"
    assert sum(map(len, (b for i in items for b in _journal.encode(i)))) == end, "the records end exactly there"
    assert await _payloads(path) == [b"m%02d" % i for i in range(40)]
    assert not os.path.exists(last + ".torn") and not os.path.exists(last + ".kept")


async def test_a_record_cut_short_before_the_zeros_is_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _crash_after(path, _APPEND_40)
    last = _journal_files(path)[-1]
    end = _records_end(last)
    starts = [at for at, _ in _records(last)]
    with open(last, "rb") as f:
        first_record = f.read(starts[1] - 20)  # a record without its last twenty bytes
    with open(last, "r+b") as f:  # a crash in the middle of the next record: its start, then zeros
        f.seek(end)
        f.write(first_record)
    *records, torn = _journal.read(last)
    assert all(isinstance(r, list) for r in records)
    assert isinstance(torn, _journal.Torn) and torn.offset == end and not torn.damaged
    assert await _payloads(path) == [b"m%02d" % i for i in range(40)]
    with open(last + ".torn", "rb") as f:
        assert f.read() == first_record.rstrip(b"\0"), "the cut record is kept, not the zeros after it"


async def test_an_older_file_ending_in_zeros_is_not_damage(tmp_path: Path) -> None:
    # A crash right after the journal moved to a new file: the older one still has its zeros.
    path = tmp_path / "db"
    _crash_after(path, _APPEND_40)
    last = _journal_files(path)[-1]
    os.rename(last, _journal.file_name(str(path / "journal"), _journal.sequence_of(last) - 1))
    Path(last).write_bytes(b"")
    assert await _payloads(path) == [b"m%02d" % i for i in range(40)]
    assert not any(n.endswith(_journal.KEPT_SUFFIX) for n in os.listdir(path / "journal"))


async def test_zeros_with_a_valid_record_after_them_are_damage(tmp_path: Path) -> None:
    # A record whose pages never reached the disk while a later one's did: zeros where it was.  The
    # reader must not take them for the file's end.
    path = tmp_path / "db"
    _crash_after(path, _APPEND_40)
    last = _journal_files(path)[-1]
    starts = [at for at, _ in _records(last)]
    with open(last, "r+b") as f:
        f.seek(starts[20])
        f.write(bytes(starts[21] - starts[20]))
    items = list(_journal.read(last))
    torn = [i for i in items if isinstance(i, _journal.Torn)]
    assert len(torn) == 1 and torn[0].offset == starts[20] and torn[0].damaged
    err, held = _refused(path)
    assert err.fields["offset"] == starts[20] and held == [b"m%02d" % i for i in range(len(held))] and len(held) < 40


def test_the_writer_zero_writes_ahead_so_a_sync_changes_no_file_size(tmp_path: Path) -> None:
    from wal._codec import encode_block  # noqa: PLC0415
    from wal.backend import WriteGroup  # noqa: PLC0415

    backend = RocksBackend(tmp_path / "db", journal_prealloc_bytes=64 << 10)
    try:
        key = backend.create_channel("p", {}).key
        sizes = []
        for i in range(20):
            m = Message(MessageType.DATA, "v", b"%04d" % i)
            m._timetick, m._term, m._last_confirmed = i + 1, 1, 0
            backend.write([WriteGroup(key, i, encode_block([m]), [], i + 1)], True)
            sizes.append(os.path.getsize(backend._journal_dir + "/" + os.listdir(backend._journal_dir)[0]))
        assert sizes == [sizes[0]] * 20 and sizes[0] > backend._joffset, "the size was set once, ahead"
        records = list(_journal.read(_journal_files(tmp_path / "db")[-1]))
        assert len(records) == 20 and all(isinstance(r, list) for r in records)
    finally:
        backend.close()


async def test_verify_reads_a_preallocated_journal_to_its_records_end(tmp_path: Path) -> None:
    from streamingnode.offline.verify.access import Finding  # noqa: PLC0415
    from streamingnode.offline.verify.journal import scan_journal  # noqa: PLC0415

    path = tmp_path / "db"
    _crash_after(path, _APPEND_40)
    last = _journal_files(path)[-1]
    # An older live file too (a crash right after the journal moved on): zeros end both.
    shutil.copyfile(last, _journal.file_name(str(path / "journal"), _journal.sequence_of(last) - 1))
    findings: list[Finding] = []
    notes: list[str] = []
    records = scan_journal(str(path), findings, notes)
    assert findings == [] and notes == [], (findings, notes)
    assert len(records) == 2 * len(list(_journal.read(last)))
