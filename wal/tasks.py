"""The one way a background task is stopped by its owner.

Owners start their tasks in ``start()`` and stop them in ``aclose()`` with :func:`cancel_and_wait`.
The pattern it replaces, ``task.cancel()`` then ``await`` under ``suppress(CancelledError)``, also
swallowed the *owner's* cancellation when the owner was itself cancelled during the await: the
owner then carried on as if nothing had happened.  Here only the task's own cancellation is absorbed.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancel ``task`` and wait until it has finished.

    The task's own cancellation is absorbed; any other exception it ended with is raised, as awaiting
    it would.  When the *calling* task is cancelled during the wait, that cancellation propagates,
    never swallowed (the task is left to finish its cancellation by itself).  A caller already
    unwinding from its own cancellation (cleanup in a ``finally``) still waits: only a new request
    interrupts it.  ``None`` and finished tasks are accepted.
    """
    if task is None:
        return
    task.cancel()
    # asyncio.wait never raises the task's outcome: a CancelledError out of it is the caller's own.
    await asyncio.wait((task,))
    if not task.cancelled():
        task.result()
