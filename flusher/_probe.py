"""Reading committed Parquet files in a child process, so that a damaged file cannot stop the node.

pyarrow does not only raise on a damaged file: some damage in a footer (a column chunk's size
statistics, its type) makes the C++ reader throw where nothing catches it, and the process aborts.
The node must survive any byte of any file, so the flusher never decodes its committed files itself:
``python -m flusher._probe <mode> <root> <pchannel>`` does, one file per input line, and answers one
line per file.  A child that dies names the file it was on (it says which file it starts before
touching it); that file is damaged, and a new child goes on with the files after it.

Modes: ``keys`` (``layout.read_keys``: footers only, at start) and ``data`` (``layout.check_data``:
every page, in the background).  Answers, tab-separated: ``start <rel>``, then ``keys <rel> <ts>
<id>`` / ``ok <rel>`` / ``damaged <rel> <reason>``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from flusher import layout

KEYS = "keys"
DATA = "data"


def _main(argv: list[str]) -> int:
    mode, root, pchannel = argv
    out = sys.stdout
    for line in sys.stdin:
        rel = line.rstrip("\n")
        if not rel:
            continue
        out.write(f"start\t{rel}\n")
        out.flush()  # before touching the file: if the reader aborts, the parent knows on which
        path = os.path.join(root, rel)
        try:
            if mode == KEYS:
                _, last = layout.read_keys(path, pchannel)
                out.write(f"keys\t{rel}\t{last[0]}\t{last[1]}\n")
            else:
                layout.check_data(path)
                out.write(f"ok\t{rel}\n")
        except layout.DamagedFileError as exc:
            out.write(f"damaged\t{rel}\t{_one_line(exc.reason)}\n")
        except FileNotFoundError:
            out.write(f"ok\t{rel}\n")  # gone since it was listed (the channel's directory was moved)
        out.flush()
    return 0


def _one_line(text: str) -> str:
    return " ".join(text.split())


__all__ = ["DATA", "KEYS", "probe", "scan"]

Answer = tuple[str, layout.DeliveryKey | None, str | None]
"""(relative path, last key when ``keys`` found the footer sound, reason when damaged)."""


async def probe(mode: str, root: Path, pchannel: str, rels: list[str]) -> AsyncIterator[Answer]:
    """Each of ``rels`` (paths under ``root``) checked in ``mode`` by a child process, in order."""
    done = 0
    while done < len(rels):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "flusher._probe", mode, str(root), pchannel, env=_child_env(),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        stdin = proc.stdin
        feeding = asyncio.get_running_loop().create_task(_feed(stdin, rels[done:]))
        errors = asyncio.get_running_loop().create_task(proc.stderr.read())
        started = False
        try:
            async for raw in proc.stdout:
                kind, _, rest = raw.decode().rstrip("\n").partition("\t")
                if kind == "start":
                    started = True
                    continue
                rel, _, detail = rest.partition("\t")
                started = False
                done += 1
                if kind == "keys":
                    ts, _, mid = detail.partition("\t")
                    yield rel, (int(ts), int(mid)), None
                else:
                    yield rel, None, detail if kind == "damaged" else None
            code = await proc.wait()
            err = (await errors).decode(errors="replace")
            await feeding
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            for task in (feeding, errors):
                task.cancel()
            await asyncio.gather(feeding, errors, return_exceptions=True)
            await stdin.wait_closed()
        if code == 0 and done == len(rels):
            return
        if not started:
            raise layout.LayoutError(f"the Parquet check of {root} failed (exit {code}): {err[-300:]}")
        last = err.strip().splitlines()[-1:] or [""]
        yield rels[done], None, f"reading it aborted the Parquet reader (exit {code}: {last[0][:200]})"
        done += 1


def _child_env() -> dict[str, str]:
    # The child must import this very package (not another copy on its path).
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    return env


async def _feed(stdin: asyncio.StreamWriter, todo: list[str]) -> None:
    # Beside the reading in ``probe``: with both pipes full, writing everything first would deadlock.
    try:
        for i in range(0, len(todo), 512):
            stdin.write("".join(f"{r}\n" for r in todo[i:i + 512]).encode())
            await stdin.drain()
    except ConnectionError:
        pass  # the child died; what it answered says where
    finally:
        stdin.close()


async def scan(root: Path, pchannel: str) -> layout.Committed:
    """``layout.read_keys`` of every committed file, in a child: what the flusher knows on start."""
    committed = layout.Committed({}, [], [])
    rels = await asyncio.to_thread(layout.committed_files, root)
    async for rel, key, reason in probe(KEYS, root, pchannel, rels):
        if key is None:
            committed.damaged.append(layout.Damaged(rel, reason or "unreadable"))
            continue
        committed.files.append(rel)
        directory = rel.rpartition("/")[0]
        if directory not in committed.flushed or key > committed.flushed[directory]:
            committed.flushed[directory] = key
    return committed


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
