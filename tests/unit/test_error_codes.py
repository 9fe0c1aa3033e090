"""One table of error codes (wal.error_codes): every code has a row, and each module that acts on a
code reads its set from the table.  The sets are pinned to what the modules kept before the table, so
moving a flag is a decision a test names, not a side effect."""

from __future__ import annotations

import grpc

from interceptors import redo
from streamingnode.client import _calls, _routing, _sender
from streamingnode.server import produce, refusals
from streamingnode.wire.codes import GRPC_CODE
from wal import errors
from wal.error_codes import RETRIABLE, TABLE, Behaviour, ErrorCode, codes_with

E = ErrorCode
_NODE_GONE_OR_TRANSIENT = {
    E.UNAVAILABLE, E.ON_SHUTDOWN, E.DEADLINE_EXCEEDED, E.RESOURCE_EXHAUSTED, E.REDO, E.STORAGE_FULL, E.NOT_OWNER}
_RESENT_IN_BAND = {E.UNAVAILABLE, E.RESOURCE_EXHAUSTED, E.REDO, E.NOT_OWNER, E.DEADLINE_EXCEEDED}


def test_every_code_has_a_row_and_a_real_grpc_status() -> None:
    assert set(TABLE) == set(ErrorCode)
    assert {c: s.name for c, s in GRPC_CODE.items()} == {c: r.grpc_status for c, r in TABLE.items()}
    assert all(isinstance(s, grpc.StatusCode) for s in GRPC_CODE.values())
    assert errors.ErrorCode is ErrorCode


def test_each_module_reads_its_set_from_the_table() -> None:
    assert {c for c in ErrorCode if errors.StreamingError("x", code=c).retriable} == RETRIABLE \
        == {E.UNAVAILABLE, E.RESOURCE_EXHAUSTED, E.REDO, E.STORAGE_FULL, E.NOT_OWNER}
    assert redo._PASS_THROUGH == codes_with(Behaviour.NOT_REDONE) == {E.STORAGE_FULL}
    # DEADLINE_EXCEEDED reopens a stream (a hung node, or one cut off from the log: issue 34).
    assert _calls._RECONNECT == codes_with(Behaviour.RECONNECT) == {
        E.UNAVAILABLE, E.ON_SHUTDOWN, E.CHANNEL_FENCED, E.RESOURCE_EXHAUSTED, E.REDO, E.NOT_OWNER, E.DEADLINE_EXCEEDED}
    assert _routing._NODE_GONE == codes_with(Behaviour.NODE_GONE) == {E.UNAVAILABLE, E.ON_SHUTDOWN}
    assert _routing._TIMED_OUT == codes_with(Behaviour.OUTCOME_UNKNOWN) == {E.DEADLINE_EXCEEDED}
    # An owner lookup asks the next seed on anything transient (NOT_OWNER is answered on its own).
    assert _routing._ASK_NEXT_SEED == _NODE_GONE_OR_TRANSIENT
    # An idempotent producer resends a batch answered with one of these after a pause, within its outage.
    assert _sender._RESEND_LATER == _RESENT_IN_BAND
    assert _sender._ENDS_STREAM == codes_with(Behaviour.RESEND_ON_NEW_STREAM) == {
        E.CHANNEL_FENCED, E.ON_SHUTDOWN, E.NOT_OWNER}
    assert produce._STREAM_ENDING == codes_with(Behaviour.ENDS_PRODUCE_STREAM) == {
        E.CHANNEL_FENCED, E.CHANNEL_NOT_EXIST, E.ON_SHUTDOWN, E.PRODUCER_FENCED}
    assert refusals._ROUTINE == codes_with(Behaviour.ROUTINE) == {E.ON_SHUTDOWN, E.CHANNEL_FENCED, E.NOT_OWNER}


def test_grpc_statuses_are_those_the_wire_contract_names() -> None:
    s = grpc.StatusCode
    assert GRPC_CODE[E.CHANNEL_FENCED] is s.FAILED_PRECONDITION
    assert GRPC_CODE[E.MESSAGE_TOO_LARGE] is s.INVALID_ARGUMENT  # never a code clients retry
    assert GRPC_CODE[E.STORAGE_FULL] is s.RESOURCE_EXHAUSTED
    assert GRPC_CODE[E.TXN_TOO_LARGE] is GRPC_CODE[E.TXN_EXPIRED] is s.ABORTED
    assert GRPC_CODE[E.REDO] is GRPC_CODE[E.ON_SHUTDOWN] is GRPC_CODE[E.UNAVAILABLE] is s.UNAVAILABLE
