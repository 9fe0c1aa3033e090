"""``host:port``: one parser and one formatter for every address the node, its CLI and its clients read
or print, IPv6 brackets included (``[::1]:9091``, as gRPC and URLs write it).

Standard library only: the config imports it, and the CLI loads the config for ``--help``.
"""

from __future__ import annotations

import ipaddress

FORMS = "host:port, [IPv6]:port or :port"
"""The accepted forms, as error messages name them."""

_WILDCARDS = frozenset({"", "0.0.0.0", "::"})  # noqa: S104  (names of "every interface", never bound here)


def split_host_port(text: str) -> tuple[str, int]:
    """``(host, port)`` from ``host:port``, ``[v6]:port`` or ``:port`` (empty host: every interface);
    the host without brackets.  ``ValueError`` naming the accepted forms for anything else, a port
    outside 0..65535 included."""
    host, sep, port_text = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    # An unbracketed host with a colon is an IPv6 address whose port cannot be told from its last group.
    if not sep or not port_text.isascii() or not port_text.isdigit() or ("[" in host or "]" in host) \
            or (":" in host and not bracketed) or (bracketed and ":" not in host):
        raise ValueError(f"not an address: {text[:200]!r} (expected {FORMS})")
    port = int(port_text)
    if port > 65535:  # the largest TCP port
        raise ValueError(f"port {port} of {text[:200]!r} is outside 0..65535")
    return host, port


def join_host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets (``[::1]:9091``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def connectable(host: str, port: int) -> str:
    """The address a client on this machine dials for a listener bound to ``host``: a wildcard host
    (every interface) becomes 127.0.0.1."""
    return join_host_port("127.0.0.1" if host in _WILDCARDS else host, port)


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1); False for a wildcard or a name
    that may resolve anywhere."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = ["FORMS", "connectable", "is_loopback_host", "join_host_port", "split_host_port"]
