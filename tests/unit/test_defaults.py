"""The defaults shared by the SDK, the CLI, the Spark source and the node have one home
(streamingnode.wire.defaults); each entry point's default is read from there, so they cannot drift."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from typing import Any

from interceptors.dedup import DEFAULT_WINDOW, DedupInterceptor
from interceptors.recovery.streaming_wal import ChainConfig
from interceptors.redo import MAX_SECONDS as REDO_MAX_SECONDS
from interceptors.redo import RedoInterceptor
from interceptors.timetick.interceptor import TimeTickInterceptor
from streamingnode.cli import connection
from streamingnode.cli.entry import add_client_commands
from streamingnode.client import AsyncClient, Client, Consumer, Producer
from streamingnode.client._async import DEFAULT_ADDR as CLIENT_ADDR
from streamingnode.client._producer import NODE_DEDUP_WINDOW
from streamingnode.config import DEFAULT_ADDR as CONFIG_ADDR
from streamingnode.config import NodeConfig
from streamingnode.server.consume import DEFAULT_RESPONSE_BYTES
from streamingnode.spark._options import parse_connection
from streamingnode.wire import defaults as d
from streamingnode.wire.host_port import split_host_port
from wal.clock import TICK_INTERVAL, WINDOW_MS


def _default(fn: Callable[..., Any], name: str) -> Any:
    return inspect.signature(fn).parameters[name].default


def _cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_client_commands(parser.add_subparsers(dest="command"))
    return parser.parse_args(list(argv))


def test_where_a_node_is() -> None:
    assert CONFIG_ADDR == CLIENT_ADDR == connection.DEFAULT_ADDR == d.NODE_ADDR
    assert split_host_port(NodeConfig().listen)[1] == split_host_port(d.NODE_ADDR)[1] == d.NODE_PORT
    assert _default(AsyncClient, "addr") == _default(Client, "addr") == d.NODE_ADDR


def test_timeouts() -> None:
    for fn in (AsyncClient, Client):
        assert _default(fn, "timeout") == d.CALL_TIMEOUT
        assert _default(fn, "reconnect_timeout") == d.RECONNECT_TIMEOUT
    assert _default(Producer, "reconnect_timeout") == _default(Consumer, "reconnect_timeout") == d.RECONNECT_TIMEOUT
    assert _default(connection.connect, "reconnect_timeout") == d.RECONNECT_TIMEOUT
    assert _cli("consume", "--channel", "c").reconnect_timeout == d.RECONNECT_TIMEOUT
    assert parse_connection({"addr": "h:1"}).timeout == d.CALL_TIMEOUT


def test_batching() -> None:
    cli = _cli("produce", "--channel", "c")
    assert (cli.linger, cli.batch_bytes) == (d.LINGER, d.MAX_BATCH_BYTES)
    for fn in (AsyncClient.producer, Producer):
        assert _default(fn, "linger") == d.LINGER
        assert _default(fn, "max_batch_bytes") == d.MAX_BATCH_BYTES
        assert _default(fn, "max_batch_messages") == d.MAX_BATCH_MESSAGES


def test_message_sizes() -> None:
    for fn in (AsyncClient, Client):
        assert _default(fn, "max_message_bytes") == d.MAX_MESSAGE_BYTES
        assert _default(fn, "max_receive_bytes") == d.RESPONSE_BYTES == DEFAULT_RESPONSE_BYTES


def test_the_chain_and_the_sdk_agree_on_the_dedup_window() -> None:
    # The SDK may not import the chain (a layer contract), so its copy is held to the chain's here.
    assert NODE_DEDUP_WINDOW == ChainConfig().dedup_window == DEFAULT_WINDOW == _default(DedupInterceptor, "window")
    assert ChainConfig().redo_max_seconds == REDO_MAX_SECONDS == _default(RedoInterceptor, "max_seconds")


def test_the_tick_interval_and_the_clock_window() -> None:
    assert NodeConfig().tick_interval == ChainConfig().tick_interval == TICK_INTERVAL
    assert _default(TimeTickInterceptor, "interval") == TICK_INTERVAL
    assert ChainConfig().ts_window_ms == _default(TimeTickInterceptor, "window_ms") == WINDOW_MS
