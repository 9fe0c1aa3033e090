"""verify and salvage on the state a node leaves after damaged journal records at open: the damaged
pchannel's channel record carries the DAMAGED mark, the journal files from the damaged one on are kept
(``.jnl.kept``), every other pchannel served on (one truncated since, one destroyed since).  The state is
built here directly, as the node writes it; and Parquet files past a cut move aside."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import rocksdict

from flusher import Flusher, FlusherConfig
from interceptors.recovery.streaming_wal import ChainConfig, open_streaming_wal
from streamingnode.offline.salvage import run as salvage_run
from streamingnode.offline.verify import run as verify_run
from tests.factories import ins, tick
from wal import WALManager, bodies
from wal.backend import WriteGroup
from wal.backends import RocksBackend, _journal
from wal.backends.rocks_layout import DAMAGED, KEY_ID, TRUNCATED_META, U32, U64

KEYS = {"p": 1, "q": 2, "d": 3}
BLOCKS = 10
DAMAGED_BLOCK = 6
"""p's block whose journal record is damaged: ids 12 and 13; p holds ids below 12 only."""
TRUNCATED = 8
"""q was truncated after the damage: its blocks below id 8 are gone."""


async def _fill(path: Path) -> None:
    m = await WALManager.start(RocksBackend(path))
    for name in KEYS:
        await m.create_channel(name)
        wal = await m.open(name)
        for k in range(BLOCKS):  # one block per append: ids [2k, 2k + 1]
            await wal.append_batch([ins("v", 10 * k + 1, f"{name}{k}".encode()), tick(10 * k + 2)])
    await m.aclose()


def _record(db: rocksdict.Rdict, name: str) -> dict[str, object]:
    raw = db.get(b"C" + name.encode())
    assert raw is not None
    doc: dict[str, object] = json.loads(raw)
    return doc


def _damage(path: Path) -> tuple[Path, int]:
    """Turn a cleanly closed data dir into what a node leaves after damaged journal records of p: a
    kept journal file (every block of p, q and d, p's block 6 damaged), p marked, q truncated, d
    destroyed, and a live journal file still holding q's truncated blocks.  Returns (kept file, offset
    of the damaged record)."""
    db = rocksdict.Rdict(str(path), options=rocksdict.Options(raw_mode=True))
    try:
        blocks = {(ck, first): bytes(db[b"D" + KEY_ID.pack(ck, first)]) for ck in KEYS.values()
                  for first in range(0, 2 * BLOCKS, 2)}
        journal = path / "journal"
        journal.mkdir(exist_ok=True)
        kept = Path(_journal.file_name(str(journal), 7))
        offset = damaged_at = 0
        with open(kept, "wb") as f:
            for k in range(BLOCKS):
                for ck in KEYS.values():
                    g = WriteGroup(ck, 2 * k, blocks[(ck, 2 * k)], [], 10 * k + 2)
                    data = b"".join(_journal.encode([g]))
                    if ck == KEYS["p"] and k == DAMAGED_BLOCK:
                        damaged_at = offset
                        data = data[:-20] + bytes([data[-20] ^ 0x10]) + data[-19:]  # in the block's body
                    f.write(data)
                    offset += len(data)
        os.rename(kept, str(kept) + _journal.KEPT_SUFFIX)
        # Live, newer: q's first blocks again (written before its truncation, which no longer empties
        # the journal: the truncation mark makes replay skip them).
        with open(_journal.file_name(str(journal), 8), "wb") as f:
            for first in range(0, TRUNCATED, 2):
                f.write(b"".join(_journal.encode([WriteGroup(KEYS["q"], first, blocks[(KEYS["q"], first)], [],
                                                             first * 5 + 2)])))
        p = KEYS["p"]
        for first in range(2 * DAMAGED_BLOCK, 2 * BLOCKS, 2):
            db.delete(b"D" + KEY_ID.pack(p, first))
        record = _record(db, "p")
        record[DAMAGED] = {"file": str(kept), "offset": damaged_at, "first_id": 2 * DAMAGED_BLOCK,
                           "reason": "the block of channel key 1 at id 12 is damaged"}
        db.put(b"C" + b"p", json.dumps(record).encode())
        q = KEYS["q"]
        db.delete_range(b"D" + KEY_ID.pack(q, 0), b"D" + KEY_ID.pack(q, TRUNCATED))
        db.put(b"X" + U32.pack(q) + TRUNCATED_META.encode(), U64.pack(TRUNCATED))
        # d destroyed: its record and every key of it gone.
        db.delete(b"C" + b"d")
        d = KEYS["d"]
        for kind in (b"D", b"T", b"H", b"X"):
            db.delete_range(kind + U32.pack(d), kind + U32.pack(d + 1))
        db.flush()
    finally:
        db.close()
    return Path(str(kept) + _journal.KEPT_SUFFIX), damaged_at


def _digest(path: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*"))
            if p.is_file() and not p.name.startswith("LOG")}


def _run(fn: object, *args: object, **kw: object) -> tuple[int, str, str]:
    import io  # noqa: PLC0415

    out, err = io.StringIO(), io.StringIO()
    code = fn(*args, out=out, err=err, **kw)  # type: ignore[operator]
    return int(code), out.getvalue(), err.getvalue()


def _journal_records_end(path: str) -> int:
    """Where a journal file's records end: the file is zero-written ahead of them, and a record
    never ends with a zero byte."""
    with open(path, "rb") as f:
        return len(f.read().rstrip(b"\0"))


async def test_a_marked_pchannel_is_reported_cut_at_its_first_id_and_opens_after_salvage(tmp_path: Path) -> None:
    path = tmp_path / "db"
    await _fill(path)
    kept, offset = _damage(path)

    code, out, _ = _run(verify_run, str(path), None, None)
    assert code == 1, out
    assert f"{kept} at byte {offset}: pchannel 'p' is marked damaged (first id not held: 12)" in out, out
    assert f"{kept} at byte {offset}: damaged journal record (channel keys 1)" in out, out
    assert "pchannel 'q'" not in out, out  # truncated, not damaged: its kept copies are no gap

    before = _digest(path)
    code, out, _ = _run(salvage_run, str(path), ["p"], apply=False)
    assert code == 1, out
    assert "pchannel 'p': would cut ids 12..19 (8 messages)" in out, out
    assert _digest(path) == before

    code, out, err = _run(salvage_run, str(path), ["p"], apply=True)
    assert code == 0, out + err
    assert "pchannel 'p': cut ids 12..19 (8 messages)" in out, out
    [aside] = path.glob("salvaged-*")
    assert (aside / "journal" / kept.name).is_file() and not (path / "journal").exists()

    db = rocksdict.Rdict(str(path), options=rocksdict.Options(raw_mode=True),
                         access_type=rocksdict.AccessType.read_only())
    try:
        assert DAMAGED not in _record(db, "p")  # the mark is gone with the damage
        # Neither the destroyed pchannel's blocks (kept records are not applied again) nor q's truncated
        # ones (the live journal's copies lie below its mark) came back.
        d = KEYS["d"]
        assert [k for k, _ in db.items(from_key=b"D" + U32.pack(d)) if k[:5] == b"D" + U32.pack(d)] == []
        assert db.get(b"D" + KEY_ID.pack(KEYS["q"], 0)) is None
    finally:
        db.close()

    m = await WALManager.start(RocksBackend(path))
    try:
        wal = await m.open("p")
        assert wal.term == 3 and wal.next_id == 2 * DAMAGED_BLOCK  # 1 before; salvage 2; this open 3
        stored = await wal.read_stored(wal.first_id, 1 << 30)
        assert [x.payload for x in stored if x.payload] == [f"p{k}".encode() for k in range(DAMAGED_BLOCK)]
        q = await m.open("q")
        assert (q.first_id, q.next_id) == (TRUNCATED, 2 * BLOCKS)
        assert [x.message_id for x in await q.read_stored(q.first_id, 1 << 30)] == list(range(TRUNCATED, 2 * BLOCKS))
    finally:
        await m.aclose()
    code, out, _ = _run(verify_run, str(path), None, None)
    assert code == 0, out


# --- Parquet past the cut -------------------------------------------------------------------------------
SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])


def _batch(pks: range) -> pa.RecordBatch:
    return pa.record_batch([pa.array(list(pks), pa.int64()), pa.array([f"r{j}" for j in pks])], schema=SCHEMA)


async def _flushed_log(data_dir: Path, inserts: list[tuple[range, bool]]) -> list[int]:
    """Pchannel 'c' with a flusher: each insert, flushed after it when its flag says so.  Returns the
    message id of each insert."""
    manager = await WALManager.start(RocksBackend(data_dir))
    try:
        if "c" not in await manager.list_channels():
            await manager.create_channel("c")
            first = True
        else:
            first = False
        swal = await open_streaming_wal(manager, "c", ChainConfig(tick_interval=0.01, segment_max_rows=1000))
        await swal.ready()
        flusher = Flusher(swal, data_dir / "parquet" / "c", FlusherConfig())
        await flusher.start()
        if first:
            await swal.append(bodies.create_collection("v", "coll", SCHEMA, "pk"))
        ids = []
        for pks, flush in inserts:
            ids.append((await swal.append(bodies.insert("v", "coll", _batch(pks)))).message_id)
            if flush:
                await flusher.flush("v")
        await flusher.aclose()
        await swal.aclose()
    finally:
        await manager.aclose()
    return ids


def _visible_rows(root: Path) -> list[int]:
    """Every pk a reader of the collection sees (dot and underscore directories are hidden)."""
    out: list[int] = []
    for f in sorted(root.rglob("*.parquet")):
        rel = f.relative_to(root).parts
        if any(part.startswith((".", "_")) for part in rel):
            continue
        out += pq.read_table(f).column("pk").to_pylist()
    return sorted(out)


async def test_parquet_files_past_the_cut_move_aside_and_the_flusher_rewrites_what_the_log_keeps(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db"
    ids = await _flushed_log(path, [(range(0, 5), True), (range(5, 10), False), (range(10, 15), True),
                                    (range(15, 20), True)])
    root = path / "parquet"
    files = sorted(str(f.relative_to(root)) for f in root.rglob("*.parquet"))
    assert len(files) == 3 and _visible_rows(root) == list(range(20))
    # The node found p's journal damaged from the third insert on: the database holds ids below it.
    cut = ids[2]
    db = rocksdict.Rdict(str(path), options=rocksdict.Options(raw_mode=True))
    try:
        ck = int(_record(db, "c")["key"])  # type: ignore[call-overload]
        stored = [KEY_ID.unpack_from(k, 1)[1] for k, _ in db.items(from_key=b"D" + U32.pack(ck))
                  if k[:5] == b"D" + U32.pack(ck)]
        assert cut in stored, "the cut must fall on a block boundary"
        for first in stored:
            if first >= cut:
                db.delete(b"D" + KEY_ID.pack(ck, first))
        record = _record(db, "c")
        record[DAMAGED] = {"file": str(path / "journal" / "gone.jnl"), "offset": 0, "first_id": cut,
                           "reason": "test"}
        db.put(b"Cc", json.dumps(record).encode())
        db.flush()
    finally:
        db.close()

    code, out, err = _run(salvage_run, str(path), ["c"], apply=True)
    assert code == 0, out + err
    # The second file spans the cut (rows 5..9 kept, 10..14 cut), the third is past it.
    moved = [line.split("Parquet file ")[1].split(" ")[0] for line in out.splitlines() if "moved Parquet file" in line]
    assert sorted(moved) == files[1:], out
    [aside] = path.glob("salvaged-*")
    assert all((aside / "parquet" / rel).is_file() for rel in moved)
    assert _visible_rows(root) == list(range(5))

    # The restarted flusher writes the kept rows again and the re-produced messages, no cut row.
    await _flushed_log(path, [(range(100, 105), True)])
    assert _visible_rows(root) == [*range(10), *range(100, 105)]


async def test_from_journal_damage_to_a_salvaged_pchannel_through_the_real_backend(tmp_path: Path) -> None:
    """The whole path: a crash image whose journal holds a damaged block of p; the backend opens,
    fails p alone and keeps the file; verify names it; salvage cuts p there; p opens again under a
    higher term, q has lost nothing, and verify is clean."""
    import io  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    from wal import CorruptedError, Message, MessageType  # noqa: PLC0415

    live, image = tmp_path / "live", tmp_path / "image"
    m = await WALManager.start(RocksBackend(live))
    try:
        await m.create_channel("p")
        await m.create_channel("q")
        wals = {n: await m.open(n) for n in ("p", "q")}
        for i in range(20):
            for n in ("p", "q"):
                await wals[n].append_batch([Message(MessageType.DATA, "v", f"{n}{i}".encode())])
        shutil.copytree(live, image)  # while open: the journal holds the appends, the tables do not
    finally:
        await m.aclose()
    (journal,) = [f for f in _journal.files(str(image / "journal")) if os.path.getsize(f) > 0]
    at = hit = 0
    lost_from = -1
    for item in _journal.read(journal):
        assert isinstance(item, list)
        size = sum(map(len, _journal.encode(item)))
        if not hit and at > _journal_records_end(journal) // 2 and [g.channel_key for g in item] == [KEYS["p"]]:
            hit, lost_from = at, item[0].first_id
            data = bytearray(Path(journal).read_bytes())
            data[at + size - 30] ^= 0x5A  # inside p's block
            Path(journal).write_bytes(bytes(data))
        at += size
    assert hit

    backend = RocksBackend(image)
    try:
        term = backend.describe_channel("p").term
        try:
            backend.open_channel("p")
            raise AssertionError("p opened with a hole in its log")
        except CorruptedError as err:
            assert err.fields["offset"] == hit
        q = backend.open_channel("q")
        assert q.next_id == 20  # every message of q (a raw WAL: no fence messages)
    finally:
        backend.close()

    out = io.StringIO()
    assert verify_run(str(image), None, None, out, io.StringIO()) == 1
    assert f"{journal}{_journal.KEPT_SUFFIX}" in out.getvalue() and str(lost_from) in out.getvalue(), out.getvalue()
    out = io.StringIO()
    assert salvage_run(str(image), ["p"], apply=True, out=out, err=io.StringIO()) == 0, out.getvalue()
    assert f"cut ids {lost_from}.." in out.getvalue(), out.getvalue()

    m = await WALManager.start(RocksBackend(image))
    try:
        p = await m.open("p")
        assert p.next_id == lost_from and p.term > term
        got = [x.payload for x in await p.read_stored(0, 1 << 30)]
        assert got == [f"p{i}".encode() for i in range(lost_from)]
        q_wal = await m.open("q")
        assert [x.payload for x in await q_wal.read_stored(0, 1 << 30)] == [f"q{i}".encode() for i in range(20)]
        await p.append_batch([Message(MessageType.DATA, "v", b"after")])
    finally:
        await m.aclose()
    assert verify_run(str(image), None, None, io.StringIO(), io.StringIO()) == 0
