"""The CLI's pieces without a node: raw output's delimiters, and ``groups create --if-not-exists`` when
the group appears between its check and its create (another run of the same script)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from streamingnode.cli import admin
from streamingnode.cli.consume import RawFormat, parse_delimiter
from streamingnode.cli.parsing import CliError
from wal.errors import ConsumerGroupExistError
from wal.message import Message, MessageType


@pytest.mark.parametrize(("text", "expected"), [
    ("", b""), (r"\n", b"\n"), (r"\t|\r", b"\t|\r"), (r"\0", b"\0"), (r"a\\b", b"a\\b"), ("é", "é".encode()),
])
def test_delimiters_decode_kcats_escapes(text: str, expected: bytes) -> None:
    assert parse_delimiter(text, "-D") == expected


@pytest.mark.parametrize("text", [r"\q", "\\"])
def test_an_unknown_or_cut_escape_is_refused(text: str) -> None:
    with pytest.raises(CliError, match="-D: unknown escape"):
        parse_delimiter(text, "-D")


def test_raw_output_is_payload_bytes_unchanged() -> None:
    messages = [Message(MessageType.DATA, "eu", b"a\nb"), Message(MessageType.DATA, "", b"\xff")]
    assert RawFormat(b"\n", None).render(messages) == b"a\nb\n\xff\n"
    assert RawFormat(b"\0", b":").render(messages) == b"eu:a\nb\0:\xff\0"


class _RacingClient:
    """Says the group is not there, then finds it created when asked to create it."""

    def __init__(self) -> None:
        self.created: list[str] = []

    async def describe_groups(self, pchannel: str, groups: list[str]) -> list[Any]:
        assert pchannel == "", "asked across every pchannel: the permission the create needs (admin)"
        return []

    async def create_group(self, pchannel: str, group: str) -> None:
        if group == "raced":
            raise ConsumerGroupExistError(f"consumer group {group!r} already exists", channel=pchannel, group=group)
        self.created.append(group)

    async def aclose(self) -> None:
        pass


async def test_a_group_created_between_check_and_create_is_reported_as_existing(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    client = _RacingClient()

    async def connect(addr: str) -> _RacingClient:
        return client

    monkeypatch.setattr(admin, "connect", connect)
    args = argparse.Namespace(channel="p", names=["raced", "new"], if_not_exists=True)
    assert await admin.groups_create(args, "addr") == 0
    assert capsys.readouterr().out.splitlines() == ["group raced exists on p", "created group new on p"]
    assert client.created == ["new"]
    args.if_not_exists = False
    with pytest.raises(ConsumerGroupExistError):
        await admin.groups_create(args, "addr")
