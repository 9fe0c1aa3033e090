"""The short chaos run (part of ``make test``): three scenarios on a whole cluster in network namespaces
(3 NATS servers R3, 3 nodes, a client host), each checked by the history checker.  ``make chaos`` runs
the long one (tests/chaos/README.md).

- An owner cut off from NATS (the client still reaching it) must stop serving by its own clock within
  about its lease, and close the pchannel (its per-pchannel state leaves its metrics), while another
  node takes over; once healed, the close must have ended (``pchannel_closing`` gone).
- A node whose wall clock runs ahead by several leases (far beyond the documented bound) judges every
  other lease expired and takes pchannels over while their owners still append: fencing must keep
  every acknowledged message and order the terms.
- Random faults of every kind, then heal: nothing acknowledged is lost, duplicated or reordered.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chaos.cluster import NATS_HOSTS, NODE_HOSTS
from tests.chaos.nemesis import KINDS
from tests.chaos.runner import Run, chaos_run, print_table, run_checker, summary
from tests.seeds import draw_seed

pytestmark = [pytest.mark.chaos, pytest.mark.usefixtures("namespaces_ok"), pytest.mark.timeout(900)]

NS = "streamingnode_"


def _channel_state(samples: dict[str, float], pchannel: str) -> list[str]:
    """The series that exist only while ``pchannel`` is open on that node (its WAL's, transactions' and
    flusher's state), as opposed to the ownership view and counters that outlive a close."""
    label = f'pchannel="{pchannel}"'
    return sorted(k for k in samples if label in k and k.startswith((
        f"{NS}txn_in_flight", f"{NS}flusher_buffered_bytes", f"{NS}flusher_lag_seconds")))


def _wait(what: Callable[[], str], timeout: float, check: Callable[[], bool]) -> float:
    """Poll ``check()`` until true; returns the seconds it took (fails saying ``what()`` after ``timeout``)."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what()}")
        time.sleep(0.2)
    return time.monotonic() - start


def _cut_owner_from_nats(run: Run) -> None:
    c, lease, pch = run.cluster, run.cluster.lease_s, "c0"
    owner = run.nemesis.owners().get(pch)
    assert owner is not None, "no owner of c0 known before the fault"
    assert _channel_state(c.metrics(owner), pch), f"{owner} owns {pch} but shows none of its state"
    c.net.partition([owner], NATS_HOSTS)
    run.nemesis.h.nemesis(True, "partition-node-nats", owner, pchannel=pch)
    run.nemesis.counts["partition-node-nats"] += 1
    last: dict[str, float] = {}
    owned_key = f'{NS}pchannel_owned{{pchannel="{pch}"}}'

    def let_go() -> bool:
        last.clear()
        last.update(c.metrics(owner))
        return last.get(owned_key) == 0 and not _channel_state(last, pch)

    try:
        # A correct owner stops at its lease by its monotonic clock; the deadline is generous (a loaded
        # machine) but far below "until the partition heals", which is when a blind owner would stop.
        took = _wait(lambda: f"{owner}, cut from NATS, to give up {pch} and close it (last seen: owned="
                     f"{last.get(owned_key)}, state={_channel_state(last, pch)})", 6 * lease, let_go)
        run.facts["cut_owner_gave_up_after_s"] = round(took, 2)
        answer = c.client_python("from tests.chaos.workload import main; main(['probe', *__import__('sys').argv[1:]])",
                                 c.node_address(owner), pch).stdout.strip()
        run.facts["cut_owner_answers"] = answer
        assert not answer.startswith("OK"), f"{owner} still serves {pch} after giving it up: {answer}"
        # Another node takes it over meanwhile (the workload keeps appending there).
        _wait(lambda: f"another node to own {pch}", 10 * lease,
              lambda: run.nemesis.owners().get(pch) not in (None, owner))
        run.wait_acks(20)
    finally:
        c.net.heal()
        run.nemesis.h.nemesis(False, "partition-node-nats", owner, pchannel=pch)
    # Its close may wait on the log while NATS is out of reach; healed, it must end: nothing of the
    # pchannel (log, flusher, retention) keeps running on a node that no longer serves it.
    closing_key = f'{NS}pchannel_closing{{pchannel="{pch}"}}'

    def close_ended() -> bool:
        last.clear()
        last.update(c.metrics(owner))
        return bool(last) and closing_key not in last  # an empty scrape (no answer) proves nothing

    took = _wait(lambda: f"{owner} to end the close of {pch} after the heal (pchannel_closing="
                 f"{last.get(closing_key)}, scraped {len(last)} samples)", 10 * lease, close_ended)
    run.facts["cut_owner_close_ended_after_heal_s"] = round(took, 2)


def _stutter(run: Run, node: str, seconds: float) -> None:
    """Pause ``node`` for a few tens of milliseconds at a time, again and again (as GC or a starved VM
    would), while it takes pchannels over: its open spans pauses, so the old owner's appends land between
    the new owner's recovery read and its fence marker, the window the marker's expected sequence guards."""
    c, rng = run.cluster, run.nemesis.rng
    run.nemesis.h.nemesis(True, "stutter", node, seconds=seconds)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            c.pause(node)
            time.sleep(rng.uniform(0.02, 0.08))
            c.resume(node)
            time.sleep(rng.uniform(0.02, 0.08))
    finally:
        c.resume(node)
        run.nemesis.h.nemesis(False, "stutter", node)


def _skew_ahead(run: Run) -> None:
    c, lease = run.cluster, run.cluster.lease_s
    for node in (*NODE_HOSTS, *NODE_HOSTS[:1]):
        skew = 4 * lease  # 160 times the documented bound (2.5 % of the lease, SKEW_SHARE)
        c.skew(node, skew)
        run.nemesis.h.nemesis(True, "skew-beyond", node, skew_s=skew)
        run.nemesis.counts["skew-beyond"] += 1
        try:
            _stutter(run, node, 2 * lease)
            run.wait_acks(10)
        finally:
            c.skew(node, 0)
            run.nemesis.h.nemesis(False, "skew-beyond", node)
        run.wait_acks(10)


def _check(run_dir: Path) -> None:
    code = run_checker(run_dir)
    print_table(summary(run_dir))
    assert code == 0, f"the history checker found violations; the run is in {run_dir}"


def test_an_owner_cut_off_from_nats_stops_serving_by_its_own_clock_and_closes_the_pchannel(
    tmp_path: Path, record_property: object,
) -> None:
    seed = draw_seed("CHAOS_SEED", record_property)  # type: ignore[arg-type]
    run = chaos_run(tmp_path / "run", seed=seed, during=_cut_owner_from_nats)
    print(run.facts)
    _check(run.run_dir)


def test_a_node_whose_clock_runs_far_ahead_takes_leases_early_and_loses_nothing(
    tmp_path: Path, record_property: object,
) -> None:
    seed = draw_seed("CHAOS_SEED", record_property)  # type: ignore[arg-type]
    run = chaos_run(tmp_path / "run", seed=seed, during=_skew_ahead)
    _check(run.run_dir)


def test_random_faults_of_every_kind_lose_nothing_acknowledged(tmp_path: Path, record_property: object) -> None:
    seed = draw_seed("CHAOS_SEED", record_property)  # type: ignore[arg-type]
    run = chaos_run(tmp_path / "run", seed=seed, seconds=30, kinds=KINDS)
    _check(run.run_dir)
