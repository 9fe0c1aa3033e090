"""What a crash test keeps of a child for its failure message: the end of the child's stderr."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


def tail(text: str | bytes | list[str], chars: int = 4000) -> str:
    """The last ``chars`` characters of a child's stderr (text, bytes or a list of lines)."""
    if isinstance(text, list):
        text = "".join(text)
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text[-chars:]


@contextmanager
def stderr_on_failure(stderr: Callable[[], str | bytes | list[str]], who: str = "child") -> Iterator[None]:
    """Re-raise an AssertionError from the block with the end of ``who``'s stderr appended."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- {who} stderr (end) ---\n{tail(stderr())}") from exc
