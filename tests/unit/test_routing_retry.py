"""Router.call: a read of a pchannel nobody owns waits for the next owner, backing off 0.05 s doubling to
0.5 s, for at most ``ownerless_wait``; a write fails at once; NOT_OWNER naming the owner is followed at
once (a redirect), at most MAX_HOPS times per try."""

from __future__ import annotations

from typing import Any

import pytest

from streamingnode.client._routing import MAX_HOPS, Router
from tests.pauses import record_pauses
from wal.errors import NotOwnerError

SCHEDULE = [0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.5, 0.5]


class _Router(Router):
    """Owner lookups and stubs faked: ``answers`` are what the calls return or raise, in turn."""

    def __init__(self, *answers: object, moved: bool = False) -> None:
        super().__init__(["seed:1"], lambda addr: (None, None))
        self.answers = list(answers)
        self.moved = moved
        self.calls = 0

    async def owner(self, pchannel: str, deadline_s: float | None) -> str:
        return "node:1"

    def stub_at(self, addr: str) -> Any:
        router = self

        class Stub:
            async def Describe(self, request: object, timeout: float | None) -> object:
                router.calls += 1
                answer = router.answers.pop(0) if router.answers else NotOwnerError("nobody owns it")
                if isinstance(answer, Exception):
                    raise answer
                return answer
        return Stub()

    def learn(self, pchannel: str, addr: str, exc: BaseException) -> bool:
        return self.moved


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    return record_pauses(monkeypatch)


async def test_a_read_waits_for_an_owner(pauses: list[float]) -> None:
    router = _Router(NotOwnerError("x"), NotOwnerError("x"), NotOwnerError("x"), "answer")
    assert await router.call("p", "Describe", object(), None, retry_gone=True) == "answer"
    assert pauses == SCHEDULE[:3] and router.calls == 4


async def test_a_write_fails_at_once(pauses: list[float]) -> None:
    router = _Router(NotOwnerError("x"), "answer")
    with pytest.raises(NotOwnerError):
        await router.call("p", "Describe", object(), None)
    assert pauses == [] and router.calls == 1


async def test_the_wait_is_bounded(pauses: list[float]) -> None:
    router = _Router()
    router.ownerless_wait = 0.5
    with pytest.raises(NotOwnerError):
        await router.call("p", "Describe", object(), None, retry_gone=True)
    assert pauses[:-1] == SCHEDULE[: len(pauses) - 1] and 0 < pauses[-1] <= SCHEDULE[len(pauses) - 1]
    assert sum(pauses) <= 0.5 + 1e-6 and router.calls == len(pauses) + 1


async def test_moves_are_followed_at_once_up_to_max_hops(pauses: list[float]) -> None:
    router = _Router(*[NotOwnerError("moved")] * MAX_HOPS, "answer", moved=True)
    assert await router.call("p", "Describe", object(), None) == "answer"
    assert pauses == [] and router.calls == MAX_HOPS + 1
    router = _Router(*[NotOwnerError("moved")] * (MAX_HOPS + 1), "answer", moved=True)
    with pytest.raises(NotOwnerError):
        await router.call("p", "Describe", object(), None)
    assert router.calls == MAX_HOPS + 1
