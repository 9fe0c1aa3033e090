"""Unclosed resources fail the test that left them, not a later one.

A file, socket, pipe or event loop that a test forgets to close is closed by the garbage collector,
with a ResourceWarning.  When the object sits in a reference cycle, that happens whenever the
collector next runs: during some later test, which then errors (``filterwarnings = error`` turns the
warning into an exception inside ``__del__``, and pytest reports it where it surfaced).  So after
every test's teardown (its fixtures closed, its event loop too) ``collect`` runs the collector and
hands back what it warned about; tests/conftest.py fails that test's teardown with it.

The objects alive once collection ends (imported modules, mostly) are frozen out of the collector
(``gc.freeze``) so that a collection after each test costs what the test left behind, not what the
whole session imported.  ``PYTHONTRACEMALLOC=20`` adds where each leaked object was allocated.
"""

from __future__ import annotations

import gc
import sys
import traceback
import tracemalloc
import warnings


def freeze_imports() -> None:
    """Leave what exists now (modules, their globals) out of every later collection."""
    gc.collect()
    gc.freeze()


def collect() -> list[str]:
    """Run the collector; every warning it raised (unclosed files, sockets, loops, coroutines never
    awaited) and every exception a finalizer raised (a task whose coroutine, closed by the collector
    after its loop, reaches for that loop: "Event loop is closed"), each with its allocation traceback
    when tracemalloc traces.

    The exceptions are caught here because pytest's own hook is gone by now: it would hold them
    until the next test's setup and fail that test instead."""
    raised: list[str] = []

    def keep(args: sys.UnraisableHookArgs) -> None:
        text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
        raised.append(f"{args.err_msg or 'Exception ignored in'}: {args.object!r}\n{text}")

    previous, sys.unraisablehook = sys.unraisablehook, keep
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gc.collect()
    finally:
        sys.unraisablehook = previous
    found = raised
    for w in caught:
        text = f"{w.category.__name__}: {w.message}"
        where = tracemalloc.get_object_traceback(w.source) if w.source is not None else None
        if where is not None:
            text += "\n  allocated at:\n    " + "\n    ".join(where.format())
        found.append(text)
    return found
