"""Test hosts for the chaos runs: Linux network namespaces wired with iproute2 only.

One run builds a private *hub* namespace holding a bridge, and one namespace per host (three NATS
servers, three nodes, one client), each with a veth pair whose far end (``v-<host>``) is a port of the hub's bridge.
Addresses are in 10.77.0.0/24 and exist only inside the run's namespaces: the bridge is connected to
no interface of the machine, no namespace has a default route, so nothing leaves the run.  Namespace
names carry ``chaos<pid>-``, so two runs (a CI short run beside a long one) coexist, and a run that
died without cleaning up is found by its prefix and its dead pid (``remove_stale``).

Faults on the wire:

- a partition between two hosts is a ``blackhole`` route to the other's /32 on *both* sides (silent
  drops, as a cut cable: established TCP connections hang rather than reset);
- a slow or lossy link is a token-bucket rate limit (``tc ... tbf``) and random drops (nftables) on what a
  host sends (see ``Network.slow`` for why not ``netem``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import subprocess
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

SUBNET = "10.77.0"
PREFIX = "chaos"
IFACE = "eth0"
"""Each host's interface inside its namespace (its peer in the hub is named after the host)."""


class NamespacesUnavailableError(RuntimeError):
    """The machine cannot build the run's namespaces (not root, no iproute2, or no netns support)."""


def _run(args: Sequence[str], *, check: bool = True, input_text: str | None = None,
         ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, check=False, input=input_text)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def check_capable() -> None:
    """Raise ``NamespacesUnavailableError`` naming what is missing when this process cannot build and
    remove a namespace (the only reliable test is to try one)."""
    if os.geteuid() != 0:
        raise NamespacesUnavailableError(
            "the chaos harness needs root (it creates network namespaces, veth pairs and a bridge with "
            "iproute2); run it as root, as CI does")
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        made = _run(["ip", "netns", "add", probe], check=False)
    except FileNotFoundError as exc:
        raise NamespacesUnavailableError("the chaos harness needs iproute2 (`ip`) on PATH") from exc
    if made.returncode != 0:
        raise NamespacesUnavailableError(
            f"cannot create a network namespace here (`ip netns add` said: {made.stderr.strip()}); "
            "the chaos harness needs CAP_SYS_ADMIN and netns support (a container may need --privileged)")
    _run(["ip", "netns", "del", probe], check=False)


def namespaces() -> list[str]:
    out = _run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_stale() -> list[str]:
    """Delete the namespaces of earlier runs whose process is gone (a SIGKILLed harness); returns them."""
    removed = []
    for name in namespaces():
        found = re.fullmatch(rf"{PREFIX}(\d+)-.+", name)
        if found is None:
            continue
        pid = int(found.group(1))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _kill_inside(name)
            _run(["ip", "netns", "del", name], check=False)
            removed.append(name)
        except PermissionError:
            continue
    return removed


def _kill_inside(ns: str) -> None:
    """SIGKILL every process still running in namespace ``ns`` (a leftover server of a dead run)."""
    pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)


_CLONE_NEWNET = 0x40000000


def call_in(ns: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` in a thread that joined namespace ``ns`` (a network namespace is per thread: sockets
    the thread opens live there), and return what it returned.  Quicker than a process per question."""
    libc = ctypes.CDLL(None, use_errno=True)
    box: list[T] = []
    errors: list[BaseException] = []

    def inside() -> None:
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {ns}")
        finally:
            os.close(fd)
        try:
            box.append(fn())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=inside, name=f"in-{ns}")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return box[0]


@dataclass
class Host:
    name: str
    ns: str
    address: str


@dataclass
class Network:
    """The run's hub and hosts; ``build()`` creates them, ``destroy()`` removes them (idempotent)."""

    hosts_wanted: Sequence[str]
    hosts: dict[str, Host] = field(default_factory=dict)
    cut: set[tuple[str, str]] = field(default_factory=set)
    """Host pairs currently partitioned (both orders)."""
    shaped: set[str] = field(default_factory=set)
    """Hosts whose link is slowed (``slow``)."""

    def __post_init__(self) -> None:
        self.prefix = f"{PREFIX}{os.getpid()}-"
        self.hub = self.prefix + "hub"

    def build(self) -> Network:
        check_capable()
        remove_stale()
        try:
            _run(["ip", "netns", "add", self.hub])
            _run(["ip", "-n", self.hub, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", self.hub, "link", "set", "br0", "up"])
            for k, name in enumerate(self.hosts_wanted):
                self._add_host(name, f"{SUBNET}.{10 + k}")
        except BaseException:
            self.destroy()
            raise
        return self

    def _add_host(self, name: str, address: str) -> None:
        ns = self.prefix + name
        _run(["ip", "netns", "add", ns])
        self.hosts[name] = Host(name, ns, address)
        port = f"v-{name}"[:15]
        _run(["ip", "-n", self.hub, "link", "add", "name", port, "type", "veth", "peer", "name", IFACE, "netns", ns])
        _run(["ip", "-n", self.hub, "link", "set", "dev", port, "master", "br0", "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", IFACE])
        _run(["ip", "-n", ns, "link", "set", IFACE, "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def exec_prefix(self, host: str) -> list[str]:
        """The argv prefix that runs a command inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self.hosts[host].ns]

    def address(self, host: str) -> str:
        """``host``'s address (known before ``build``: the hosts are numbered in the order given)."""
        return f"{SUBNET}.{10 + list(self.hosts_wanted).index(host)}"

    # --- partitions ---------------------------------------------------------------------------------
    def partition(self, side_a: Iterable[str], side_b: Iterable[str]) -> None:
        """Cut every host of ``side_a`` from every host of ``side_b``, both ways."""
        b = list(side_b)
        for x in side_a:
            for y in b:
                if (x, y) in self.cut:
                    continue
                _run(["ip", "-n", self.hosts[x].ns, "route", "add", "blackhole", f"{self.address(y)}/32"])
                _run(["ip", "-n", self.hosts[y].ns, "route", "add", "blackhole", f"{self.address(x)}/32"])
                self.cut |= {(x, y), (y, x)}

    def heal(self) -> None:
        """Remove every partition."""
        for x, y in list(self.cut):
            _run(["ip", "-n", self.hosts[x].ns, "route", "del", "blackhole", f"{self.address(y)}/32"], check=False)
        self.cut.clear()

    # --- slow and lossy links -----------------------------------------------------------------------
    def slow(self, host: str, *, rate_kbit: int = 0, loss_pct: float = 0.0) -> None:
        """Throttle what ``host`` sends to ``rate_kbit`` (a token bucket whose queue holds up to a second
        of traffic: packets wait, so latency grows and varies with load) and drop ``loss_pct`` percent of
        its packets at random (nftables' ``numgen random``).

        This kernel has no ``sch_netem`` (``tc ... netem`` answers "qdisc kind is unknown"), so fixed
        delay and jitter come from queueing behind the rate limit instead."""
        ns = self.hosts[host].ns
        if rate_kbit:
            burst = max(4, rate_kbit // 8)  # kbit: about an eighth of a second at the rate
            _run(["tc", "-n", ns, "qdisc", "replace", "dev", IFACE, "root", "tbf", "rate", f"{rate_kbit}kbit",
                  "burst", f"{burst}kbit", "latency", "1000ms"])
        if loss_pct:
            rules = (f"table inet chaos {{\n chain out {{\n  type filter hook output priority 0;\n"
                     f"  numgen random mod 1000 < {int(loss_pct * 10)} drop\n }}\n}}\n")
            _run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input_text=rules)
        self.shaped.add(host)

    def unshape(self, host: str | None = None) -> None:
        for h in [host] if host else list(self.shaped):
            ns = self.hosts[h].ns
            _run(["tc", "-n", ns, "qdisc", "del", "dev", IFACE, "root"], check=False)
            _run(["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "chaos"], check=False)
            self.shaped.discard(h)

    def destroy(self) -> None:
        """Kill whatever still runs in the run's namespaces and delete them."""
        for host in self.hosts.values():
            _kill_inside(host.ns)
        for name in namespaces():
            if name.startswith(self.prefix):
                _run(["ip", "netns", "del", name], check=False)
        self.hosts.clear()
        self.cut.clear()
        self.shaped.clear()


__all__ = ["NamespacesUnavailableError", "Network", "check_capable", "remove_stale"]
