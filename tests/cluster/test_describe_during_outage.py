"""DescribeChannels (the owner lookup clients route by) while NATS cannot answer: the node reads the
leases again for it, and a transient NATS error of that read is UNAVAILABLE, which clients retry or
take to the next node, not an internal error (UNKNOWN), which they must not retry."""

from __future__ import annotations

import nats.errors
import pytest

from streamingnode.cluster.leases import Leases
from streamingnode.cluster.membership import Membership
from streamingnode.cluster.ownership import Ownership
from wal.errors import ErrorCode, StreamingError


async def _names() -> list[str]:
    return ["p0"]


async def _take(name: str, term: int) -> int:
    return term


async def _lose(name: str, reason: str) -> None:
    return None


def _ownership(read_all_raises: BaseException) -> Ownership:
    leases = Leases(None, "a", "addr-a", 2.0)  # type: ignore[arg-type]  (no KV: its read is replaced)

    async def read_all() -> dict[str, object]:
        raise read_all_raises
    leases.read_all = read_all  # type: ignore[method-assign]
    return Ownership(Membership(None, "a", "addr-a", 2.0), leases, _names, _take, _lose)  # type: ignore[arg-type]


@pytest.mark.parametrize("exc", [nats.errors.OutboundBufferLimitError(), nats.errors.ConnectionReconnectingError(),
                                 nats.errors.TimeoutError(), nats.errors.NoRespondersError()])
async def test_a_lease_read_that_nats_cannot_answer_is_unavailable(exc: BaseException) -> None:
    own = _ownership(exc)
    with pytest.raises(StreamingError) as caught:
        await own.refresh(["p0"])
    assert caught.value.code is ErrorCode.UNAVAILABLE
    assert "NATS" in str(caught.value) and caught.value.__cause__ is exc


async def test_any_other_error_of_the_read_is_not_disguised() -> None:
    own = _ownership(ValueError("a bug"))
    with pytest.raises(ValueError, match="a bug"):
        await own.refresh(["p0"])
