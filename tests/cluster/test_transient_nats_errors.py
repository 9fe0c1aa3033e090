"""Which NATS errors a node rides out at start (``streamingnode.cluster.connection.transient``): those a
cluster that is forming or electing answers for a while, and none that a retry cannot cure."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import pytest

from streamingnode.cluster.connection import transient


@pytest.mark.parametrize("exc", [
    nats.errors.TimeoutError(), TimeoutError(), ConnectionRefusedError(), nats.errors.NoRespondersError(),
    nats.js.errors.NoStreamResponseError(), nats.errors.ConnectionReconnectingError(),
    nats.errors.StaleConnectionError(), nats.errors.NoServersError(), nats.errors.OutboundBufferLimitError(),
    nats.js.errors.ServiceUnavailableError(code=503, description="JetStream system temporarily unavailable"),
    nats.js.errors.APIError(code=503, err_code=10008, description="JetStream system temporarily unavailable"),
    nats.js.errors.ServerError(code=500, err_code=10005, description="insufficient resources"),
    nats.js.errors.APIError(code=500, err_code=10074, description="no suitable peers for placement"),
], ids=repr)
def test_errors_of_a_forming_cluster_are_transient(exc: BaseException) -> None:
    assert transient(exc)


@pytest.mark.parametrize("exc", [
    nats.js.errors.BadRequestError(code=400, err_code=10058, description="stream name already in use"),
    nats.js.errors.KeyNotFoundError(), nats.js.errors.KeyWrongLastSequenceError(),
    nats.errors.AuthorizationError(), nats.errors.ConnectionClosedError(), ValueError("a bug"),
], ids=repr)
def test_other_errors_are_not(exc: BaseException) -> None:
    assert not transient(exc)
