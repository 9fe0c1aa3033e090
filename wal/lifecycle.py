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

    The task's own ``CancelledError`` is absorbed; any other exception it ended with is raised, as
    awaiting it would.  When the *calling* task is being cancelled meanwhile, that cancellation is
    re-raised, never swallowed.  ``None`` and finished tasks are accepted (a finished task's
    exception is raised, its cancellation absorbed).
    """
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
