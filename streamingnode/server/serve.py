"""The server's lifecycle: start a node and its gRPC server, serve until a signal, drain and stop.

``start_server`` opens the node, listens, recovers every channel and only then reports SERVING
(health); ``RunningServer.stop`` drains in the reverse order.  ``serve`` is the process's main loop;
``ServerThread`` runs a server on a private loop for tests and synchronous embedders.

The boundary is decided here before anything opens: TLS (``tls_cert``/``tls_key``, mutual with
``tls_client_ca``; the files are checked by ``tls``), bearer tokens (``auth_tokens``, see ``auth``;
a file without a token is warned about), and the protected mode that refuses to listen beyond
loopback with neither tokens nor client certificates unless told to.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from streamingnode.config import NodeConfig
from streamingnode.node.node import Node
from streamingnode.observability.logs import default_to_stderr
from streamingnode.observability.tracing import Tracing
from streamingnode.server.auth import AuthInterceptor, TokenTable
from streamingnode.server.reflection import enable_reflection
from streamingnode.server.service import SERVICE_NAME, StreamingNodeService, add_service
from streamingnode.server.tls import load_tls
from streamingnode.wire.defaults import MIN_PING_INTERVAL
from streamingnode.wire.host_port import connectable, is_loopback_host, split_host_port
from wal.errors import InvalidArgumentError, UnavailableError

log = structlog.get_logger(__name__)

R = TypeVar("R")


class RunningServer:
    """A started node and its gRPC server.  ``address`` is the bound host:port."""

    def __init__(
        self, node: Node, server: grpc.aio.Server, health: health_aio.HealthServicer, address: str,
        metrics_address: str | None = None,
    ) -> None:
        self.node = node
        self.server = server
        self.health = health
        self.address = address
        self.metrics_address = metrics_address
        """host:port of ``/metrics``, or None when it is turned off."""
        self.owned_tracing: Tracing | None = None
        """The tracing made from ``trace_exporter``: shut down (its spans flushed) when the server stops."""
        self._stopped = asyncio.Event()

    async def stop(self, grace: float | None = None) -> None:
        """Drain: health NOT_SERVING, refuse new calls, let calls in flight finish for ``grace``
        seconds, then close every WAL cleanly."""
        if self._stopped.is_set():
            return
        grace = self.node.config.drain_seconds if grace is None else grace
        await self.health.enter_graceful_shutdown()
        self.node.draining.set()
        await self.server.stop(grace)
        await self.node.aclose()
        if self.owned_tracing is not None:
            await asyncio.to_thread(self.owned_tracing.shutdown)  # blocks while it exports what is left
        self._stopped.set()
        log.info("node stopped", address=self.address)


async def start_server(config: NodeConfig, *, tracing: Tracing | None = None) -> RunningServer:
    """Open the node, listen, recover every channel, then report SERVING.

    ``tracing`` (a provider of the caller's, who shuts it down) overrides ``config.trace_exporter``;
    otherwise the server makes that exporter's provider and shuts it down when it stops.
    """
    default_to_stderr()  # embedded (no `serve` set logging up): never the host program's stdout
    # Everything that can refuse the configuration does so before the node opens its data.
    check_protected_mode(config)
    tokens = TokenTable.load(config.auth_tokens) if config.auth_tokens is not None else None
    if tokens is not None and not tokens:
        # Fail-closed, and the operator is told why every client will be refused.
        log.warning("the tokens file holds no token: every call of the service will be refused (UNAUTHENTICATED)",
                    auth_tokens=str(config.auth_tokens))
    credentials = server_credentials(config)
    owned = Tracing.from_exporter(config.trace_exporter) if tracing is None else None
    try:
        node = await Node.start(config, tracing if tracing is not None else owned)
    except BaseException:
        if owned is not None:
            owned.shutdown()
        raise
    try:
        auth = AuthInterceptor(tokens, config.max_unary_request_bytes) if tokens is not None else None
        server = grpc.aio.server(interceptors=[auth] if auth is not None else None, options=[
            ("grpc.max_receive_message_length", config.max_request_bytes),
            ("grpc.max_send_message_length", config.max_request_bytes),
            ("grpc.so_reuseport", 0),
            # The SDK pings every connection (its keepalive, to leave a hung node within seconds):
            # accept pings without calls and up to one a second, or the node answers GOAWAY
            # too_many_pings (its defaults allow one every five minutes, with calls only).
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", int(MIN_PING_INTERVAL * 1000)),
        ])
        service = StreamingNodeService(node)
        if auth is not None:
            # The authentication layer answers before the servicer runs: its refusals are counted and
            # logged by the servicer's refusal counter all the same.
            auth.on_refusal = service.refusals.note
            auth.trimmer = service.trimmer
        add_service(service, server)
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        enable_reflection((SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name), server)
        for name in ("", SERVICE_NAME):
            await health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        address = _listen(server, config.listen, credentials)
        node.advertise = node.advertise or address
        # Metrics come up before recovery, so a long recovery is visible while it runs.
        metrics_address = await node.metrics.serve(config.metrics_listen) if config.metrics_listen else None
        await server.start()
        running = RunningServer(node, server, health, address, metrics_address)
        running.owned_tracing = owned
        try:
            await node.open_all()
        except BaseException:
            await server.stop(0)
            raise
        for name in ("", SERVICE_NAME):
            await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    except BaseException:
        await node.aclose()
        if owned is not None:
            owned.shutdown()
        raise
    log.info("serving", address=address, metrics=metrics_address, data_dir=str(config.data_dir),
             durability=config.durability, tls="mutual" if config.tls_client_ca else "on" if credentials else "off",
             auth="tokens" if tokens is not None else "none")
    return running


def is_loopback(listen: str) -> bool:
    """True when the host of ``listen`` (host:port) is a loopback address or ``localhost``."""
    try:
        return is_loopback_host(split_host_port(listen)[0])
    except ValueError:
        return False  # not an address: binding it fails later, with the address named


def check_protected_mode(config: NodeConfig) -> None:
    """Refuse to listen beyond loopback with neither tokens nor client certificates, unless
    ``allow_unauthenticated`` says so (anyone who reaches the port could otherwise destroy channels)."""
    if is_loopback(config.listen) or config.auth_tokens is not None or config.tls_client_ca is not None:
        return
    if config.allow_unauthenticated:
        log.warning("serving without authentication on a non-loopback address", listen=config.listen)
        return
    raise InvalidArgumentError(
        f"refusing to listen on {config.listen[:200]!r} without authentication: give a tokens file "
        "(--auth-tokens) or a client CA for mutual TLS (--tls-client-ca), listen on loopback, or accept "
        "the risk with --allow-unauthenticated (STREAMINGNODE_ALLOW_UNAUTHENTICATED=1)", field="listen")


def server_credentials(config: NodeConfig) -> grpc.ServerCredentials | None:
    """TLS credentials from ``tls_cert``/``tls_key`` (requiring client certificates chained to
    ``tls_client_ca`` when set); None when the node serves plaintext.  The files are checked first
    (``tls.load_tls``): a bad one is refused naming the file and the problem."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    material = load_tls(config.tls_cert, config.tls_key, config.tls_client_ca)
    try:
        return grpc.ssl_server_credentials([(material.key, material.chain)], root_certificates=material.client_ca,
                                           require_client_auth=material.client_ca is not None)
    except (ValueError, TypeError) as exc:  # grpc checks only that the PEMs are non-empty here
        raise InvalidArgumentError(f"bad TLS configuration: {exc}", field="tls_cert") from None


def _listen(server: grpc.aio.Server, listen: str, credentials: grpc.ServerCredentials | None = None) -> str:
    """Bind ``listen`` (TLS only, when ``credentials``); return a connectable host:port (the real port
    when 0 was asked for)."""
    try:
        port = server.add_insecure_port(listen) if credentials is None else server.add_secure_port(listen, credentials)
    except RuntimeError:
        port = 0
    if port == 0:
        # The TLS files were checked before (``tls``): what is left is the address.
        raise UnavailableError(f"cannot listen on {listen!r}: address in use or invalid", address=listen)
    try:
        return connectable(split_host_port(listen)[0], port)
    except ValueError:
        return listen  # a form gRPC binds but host:port does not describe: named as given


async def serve(config: NodeConfig, on_ready: Callable[[RunningServer], None] | None = None) -> None:
    """Run until SIGTERM or SIGINT, then drain and close (the process then exits 0)."""
    running = await start_server(config)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    # Before the ready line: whoever waits for it may send SIGTERM at once, and must get a drain.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if on_ready is not None:
        on_ready(running)
    await stop.wait()
    log.info("draining", address=running.address)
    await running.stop()


_END_TASKS_SECONDS = 10.0
"""How long ``ServerThread.stop`` waits for the tasks it cancels to end."""


async def _end_tasks() -> None:
    """Cancel what is still running on this loop and wait for it to end, as ``asyncio.run`` does at
    its end.  A task left pending when its loop closes is destroyed later by the garbage collector,
    and its cleanup then reaches for the closed loop ("Event loop is closed"): a NATS client whose
    close failed half way (its servers unreachable) leaves its subscriptions' readers so."""
    me = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not me]
    for task in left:
        task.cancel()
    if not left:
        return
    done, pending = await asyncio.wait(left, timeout=_END_TASKS_SECONDS)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.warning("a task failed while the server stopped", task=task.get_name(), error=repr(task.exception()))
    for task in pending:
        log.warning("a task did not end when cancelled at the server's stop", task=repr(task))


class ServerThread:
    """A node served from a private event loop on a thread: for tests and embedding next to
    synchronous code.  ``with ServerThread(config) as srv: srv.address``."""

    def __init__(self, config: NodeConfig, *, tracing: Tracing | None = None) -> None:
        self.config = config
        self.tracing = tracing
        self.address = ""
        self.metrics_address: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._running: RunningServer | None = None

    def start(self) -> ServerThread:
        """Start the loop's thread and the server on it; returns once the node serves."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="streamingnode-server", daemon=True)
        self._thread.start()
        started = start_server(self.config, tracing=self.tracing)
        self._running = asyncio.run_coroutine_threadsafe(started, self._loop).result()
        self.address = self._running.address
        self.metrics_address = self._running.metrics_address
        return self

    @property
    def node(self) -> Node:
        assert self._running is not None
        return self._running.node

    def run(self, coro: Awaitable[R]) -> R:
        """Run ``coro`` on the server's loop (to inspect the node from a test)."""
        assert self._loop is not None, "ServerThread.run before start"

        async def _wrap() -> R:
            return await coro
        return asyncio.run_coroutine_threadsafe(_wrap(), self._loop).result()

    def stop(self, grace: float = 1.0) -> None:
        """Drain and stop the server (see ``RunningServer.stop``), then the thread and its loop."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._running is not None:
            asyncio.run_coroutine_threadsafe(self._running.stop(grace), loop).result()
            self._running = None
        if thread.is_alive():
            asyncio.run_coroutine_threadsafe(_end_tasks(), loop).result()
            asyncio.run_coroutine_threadsafe(loop.shutdown_asyncgens(), loop).result()
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
        loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["RunningServer", "ServerThread", "check_protected_mode", "is_loopback", "serve", "server_credentials",
           "start_server"]
