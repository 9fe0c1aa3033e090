"""produce's stdin reader thread once the command's loop is gone: it stops quietly, leaving no
coroutine behind for Python to warn about on stderr ("coroutine 'Queue.put' was never awaited")."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import warnings

import pytest

from streamingnode.cli import produce
from tests.waiting import until_sync


def test_the_reader_stops_without_a_warning_once_the_loop_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    read_end, write_end = os.pipe()
    stdin = os.fdopen(read_end, "rb", buffering=0)
    monkeypatch.setattr(produce.sys, "stdin", stdin)
    loop = asyncio.new_event_loop()
    try:
        produce._read_stdin_in_thread(loop)
    finally:
        loop.close()  # the command ended before the reader handed anything over
    before = {t for t in threading.enumerate() if t.name == "stdin-reader"}
    assert before, "no reader thread started"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        os.write(write_end, b"more input\n")  # the reader wakes, and finds the loop gone
        os.close(write_end)
        until_sync(lambda: not any(t.is_alive() for t in before), "the reader thread to stop")
        gc.collect()
    stdin.close()
    assert not [w for w in caught if "never awaited" in str(w.message)], [str(w.message) for w in caught]
