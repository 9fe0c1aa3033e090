"""The KV-safe name encoding (wal.kv_key): reversible, injective, within the KV key alphabet, stable.

The encoded forms are stored (JetStream KV keys, lease keys, spool file names), so fixed vectors pin
them, and each former copy's user is checked to build its names with it."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from streamingnode.client._spool import spool_path
from wal.kv_key import decode_key, encode_key

_KV_KEY = re.compile(r"[-/_=.a-zA-Z0-9]+")


@given(st.text(min_size=1))
def test_round_trip_in_the_kv_alphabet(text: str) -> None:
    try:
        text.encode()
    except UnicodeEncodeError:
        return  # a lone surrogate is no name the node accepts
    key = encode_key(text)
    assert _KV_KEY.fullmatch(key)
    assert key == key.lower()
    assert decode_key(key) == text


@given(st.text(), st.text())
def test_distinct_names_stay_distinct(a: str, b: str) -> None:
    try:
        a.encode(), b.encode()
    except UnicodeEncodeError:
        return
    assert (encode_key(a) == encode_key(b)) == (a == b)


def test_stored_forms_do_not_change() -> None:
    assert encode_key("p0") == "oaya"
    assert encode_key("channel/é") == "mnugc3tomvwc7q5j"
    assert decode_key("oaya") == "p0"


def test_spool_files_are_named_by_it() -> None:
    assert spool_path("/s", "prod", "p0") == f"/s/{encode_key('prod' + chr(0) + 'p0')}.spool"
    assert spool_path("/s", "prod", "p0") == "/s/obzg6zaaoaya.spool"
