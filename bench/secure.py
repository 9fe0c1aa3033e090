"""The cost of TLS and a bearer token on durable produce, against plaintext in the same run.

    .venv/bin/python bench/secure.py [--count N] [--runs 5] [--latency-count 2000] [--size 1024]

Every run starts two nodes, one after the other, each in its own process and fresh data directory
(``produce_consume``'s ``_node``): **plain**, plaintext gRPC on loopback with no authentication, and
**secure**, TLS only (a server certificate from a CA made by trustme for the run) with a tokens file,
the SDK client trusting that CA and sending ``authorization: Bearer <token>`` on every call, so each
call crosses the interceptor's hash lookup and each stream its permission check.  Which goes first
alternates between runs, against drift on a noisy host.  Against each node, exactly as
``produce_consume`` measures the SDK (its own helpers):

* **durable produce**: ``--count`` messages of ``--size`` bytes through ``client.producer`` with
  ``send_nowait`` (msgs/s, and the node's CPU per message);
* **single-message produce latency**: ``--latency-count`` times one message, waiting for its ack.

Reported: median throughput of each and their ratio (target >= 0.85 of plaintext), latency p50/p99
pooled over the runs and the p99 difference (target <= +0.3 ms).  Benchmarks are not tests: they
assert nothing about speed.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import Run, prepare_process, repeat, tmpdir, verdict  # noqa: I001
import produce_consume as pc

import trustme

from streamingnode.server.auth import hash_token

THROUGHPUT_TARGET = 0.85
P99_BUDGET_MS = 0.3
PCHANNELS = "tput,lat"


def _secure_setup(root: str) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The serve flags of the secure node and the client keywords that reach it."""
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    files = {
        "ca.pem": ca.cert_pem.bytes(),
        "server.pem": b"".join(b.bytes() for b in leaf.cert_chain_pems),
        "server-key.pem": leaf.private_key_pem.bytes(),
    }
    token = secrets.token_urlsafe(32)
    files["tokens.toml"] = (f'[[token]]\nprincipal = "bench"\nsha256 = "{hash_token(token)}"\n'
                            'permissions = ["produce:*", "consume:*"]\n').encode()
    for name, data in files.items():
        Path(root, name).write_bytes(data)
    serve = ("--tls-cert", os.path.join(root, "server.pem"), "--tls-key", os.path.join(root, "server-key.pem"),
             "--auth-tokens", os.path.join(root, "tokens.toml"))
    return serve, {"token": token, "tls_ca": os.path.join(root, "ca.pem")}


def _measure(args: argparse.Namespace, root: str, kind: str, r: Run, lat: dict[str, list[float]]) -> None:
    sdk = pc._sdk()
    serve: tuple[str, ...] = ()
    connect: dict[str, Any] = {"token": ""}
    if kind == "secure":
        serve, connect = _secure_setup(tmpdir(root, "pki"))
    with pc._node(tmpdir(root, f"node-{kind}"), tmpdir(root, f"logs-{kind}"), PCHANNELS, extra=serve) as node:
        addr = node.match.group(1)
        produce = pc._produce_sdk(sdk, addr, "tput", args.count, args.size, args.linger, args.max_batch_bytes,
                                  args.sdk_window, **connect)
        r[f"produce_{kind}"] = pc._timed(node, args.count, r, f"produce_{kind}", produce)
        m = args.latency_count
        lat[kind] += pc._timed(node, m, r, f"lat_{kind}", pc._latency_sdk(sdk, addr, "lat", m, args.size, **connect))


def _one_run(args: argparse.Namespace, root: str, index: int, lat: dict[str, list[float]]) -> Run:
    r: Run = {}
    for kind in ("plain", "secure") if index % 2 == 0 else ("secure", "plain"):
        _measure(args, root, kind, r, lat)
    r["ratio"] = r["produce_secure"] / r["produce_plain"]
    return r


def _report(args: argparse.Namespace, runs: list[Run], lat: dict[str, list[float]]) -> None:
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    p50 = {k: pc._pct(v, 0.50) for k, v in lat.items()}
    p99 = {k: pc._pct(v, 0.99) for k, v in lat.items()}
    print(f"TLS + token vs plaintext, SDK, durable, {args.size} B payloads, {args.runs} runs alternating "
          f"(medians; latency pooled over {len(lat['plain'])} sends each)")
    print(f"{'':<8} {'produce msgs/s':>15} {'node CPU us/msg':>16} {'client CPU us/msg':>18} {'single p50 ms':>14} "
          f"{'single p99 ms':>14}")
    for kind in ("plain", "secure"):
        print(f"{kind:<8} {med[f'produce_{kind}']:>15,.0f} {med[f'produce_{kind}_srv_us']:>16.1f} "
              f"{med[f'produce_{kind}_cli_us']:>18.1f} {p50[kind]:>14.3f} {p99[kind]:>14.3f}")
    ratio = med["produce_secure"] / med["produce_plain"]
    extra = p99["secure"] - p99["plain"]
    # Each run measures both back to back, so the median of the per-run ratios is the paired figure;
    # the ratio of the medians is printed beside it.
    paired = statistics.median(r["ratio"] for r in runs)
    print(f"throughput secure/plain, paired (median of per-run ratios): {verdict(paired, THROUGHPUT_TARGET)}; ratio of "
          f"medians {ratio:.2f}; per-run " + ", ".join(f"{r['ratio']:.2f}" for r in runs))
    missed = "" if extra <= P99_BUDGET_MS else ", MISSED"
    print(f"single-message p99: {extra:+.3f} ms (budget +{P99_BUDGET_MS} ms{missed}); "
          f"p50 {p50['secure'] - p50['plain']:+.3f} ms")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--count", type=int, default=100_000, help="messages per produce (default 100,000)")
    p.add_argument("--size", type=int, default=1024, help="payload bytes (default 1024)")
    p.add_argument("--runs", type=int, default=5, help="runs, each plain and secure (default 5)")
    p.add_argument("--latency-count", type=int, default=2000, help="single-message sends per node (default 2000)")
    p.add_argument("--linger", type=float, default=0.005, help="SDK producer linger, seconds (default 0.005)")
    p.add_argument("--max-batch-bytes", type=int, default=1 << 20, help="SDK producer max_batch_bytes (default 1 MiB)")
    p.add_argument("--sdk-window", type=int, default=8000, help="unanswered send_nowait futures (default 8000)")
    p.add_argument("--dir", default=None, help="parent of the temporary directories (default: system temp)")
    args = p.parse_args(argv)
    if min(args.count, args.size, args.runs, args.latency_count) < 1:
        p.error("every size and count must be >= 1")
    prepare_process()
    lat: dict[str, list[float]] = {"plain": [], "secure": []}

    def describe(r: Run) -> str:
        return f"produce msgs/s plain {r['produce_plain']:,.0f}, secure {r['produce_secure']:,.0f} ({r['ratio']:.2f})"

    runs = repeat(args, "secure", lambda a, root, i: _one_run(a, root, i, lat), describe)
    _report(args, runs, lat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
