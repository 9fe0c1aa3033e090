"""Two nodes creating the same pchannel at the same moment on a cluster still settling: nats-py's KV
create, refused as out of sequence, reads the key back and may find nothing.  The backend then leaves
no stream of its own behind and answers UNAVAILABLE (the caller asks again), never an error nobody
expects; and a JetStream refusal without the fields its base declares (the KV errors) is still named."""

from __future__ import annotations

import itertools
from typing import Any

import nats.js.errors
import pytest

from tests.natscluster import NatsCluster
from wal.backends._js_connection import api_refusal
from wal.backends.jetstream import JetStreamBackend
from wal.errors import ChannelExistError, UnavailableError, UnrecoverableError

pytestmark = pytest.mark.integration

_prefixes = itertools.count(1)


def test_a_kv_refusal_without_codes_is_named_not_a_crash() -> None:
    refused = api_refusal(nats.js.errors.KeyNotFoundError(), "creating pchannel 'p'", "nats:here/sn")
    assert isinstance(refused, UnrecoverableError) and "creating pchannel 'p'" in str(refused)


def test_a_create_whose_record_read_back_finds_nothing_leaves_no_stream_and_is_asked_again(
    nats_r1: NatsCluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    b = JetStreamBackend(nats_r1.url, prefix=f"cr{next(_prefixes)}", timeout=2.0)
    try:
        kv = b._kv_channels
        real = kv.create
        raced = [True]

        async def racing(key: str, value: bytes, *args: Any, **kwargs: Any) -> int:
            if raced.pop() if raced else False:
                raise nats.js.errors.KeyNotFoundError()
            return int(await real(key, value, *args, **kwargs))
        monkeypatch.setattr(kv, "create", racing)

        async def streams() -> list[str]:
            return sorted(info.config.name for info in await b._js.streams_info())
        before = b._call(streams(), what="listing streams")
        with pytest.raises(UnavailableError, match="raced with another creator"):
            b.create_channel("p", {})
        assert b._call(streams(), what="listing streams") == before  # its stream went with it
        info = b.create_channel("p", {})  # asked again: created
        assert b.describe_channel("p").key == info.key
        with pytest.raises(ChannelExistError):
            b.create_channel("p", {})
    finally:
        b.close()
