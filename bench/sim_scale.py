"""Simulator speed and memory at growing group sizes, causal history 200.

Each size runs ``sdsync.sim`` in a fresh child process (so one run's heap never inflates
the next one's figures) on the same scenario shape: one channel, one store node, 5 %
independent loss, latency 100 ± 50 ms, the library's protocol defaults (causal history
200, bloom filter 10,000 / 0.001, SDS-R on) except the sync interval, which grows with the
group (``600 ms × participants``: every sync a participant hears resets its timer, so the
group as a whole sends about one sync per 0.6 s whatever its size; see
``scenarios/participants-1000.toml``). Bigger groups get fewer messages, so that each run
takes tens of seconds rather than hours: a broadcast is one copy per other participant.

Reported per size, from the child:

* virtual duration of the run (it stops once every log is complete), wall time of the
  simulation and of writing its outputs (events, logs, messages, archives, as
  ``sdsync simulate`` does);
* receive events (copies handed to an engine) and receive events per wall second;
* peak RSS (``ru_maxrss``) at the end of the simulation and after writing, and peak
  memory per participant: the simulation's peak RSS less the RSS of the child after its
  imports, over the group size.

``--profile N`` runs one size under cProfile instead and prints the top functions by
cumulative and by own time; ``--tracemalloc N`` prints the allocation sites holding most
memory at the end of the run (before writing), per participant. Both slow the run, so
their timings are not comparable with the table's.

Timing never fails: the exit status is 0 whenever the bench completes.

Usage::

    .venv/bin/python bench/sim_scale.py [--sizes 100,1000,10000] [--json FILE]
    .venv/bin/python bench/sim_scale.py --profile 1000 [--top 25]
    .venv/bin/python bench/sim_scale.py --tracemalloc 1000
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from sdsync.sim.config import NetworkConfig, ProtocolConfig, SimConfig, WorkloadConfig
from sdsync.sim.engine import Simulation
from sdsync.sim.output import write_outputs

CAUSAL_HISTORY = 200
SYNC_MS_PER_PARTICIPANT = 600
DEFAULT_SIZES = "100,1000,10000"
KB = 1024


def workload(participants: int) -> WorkloadConfig:
    """Messages over one minute: fewer for bigger groups (each is a copy per member), but
    more than the causal history, so that the late messages carry full 200-entry ones."""
    messages = max(250, min(1000, 300_000 // participants))
    return WorkloadConfig(messages=messages, duration_ms=60_000)


def scenario(participants: int) -> SimConfig:
    return SimConfig(
        seed=1,
        participants=participants,
        stores=1,
        network=NetworkConfig(loss=0.05),
        workload=workload(participants),
        protocol=ProtocolConfig(
            causal_history=CAUSAL_HISTORY,
            sync_interval_ms=SYNC_MS_PER_PARTICIPANT * participants,
        ),
    )


def peak_rss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux


def current_rss_kb() -> int:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() // KB


def run_one(participants: int) -> dict[str, Any]:
    """One measured run in this process (the child's job)."""
    baseline_kb = current_rss_kb()
    config = scenario(participants)
    started = time.perf_counter()
    sim = Simulation(config)
    sim.run()
    simulate_s = time.perf_counter() - started
    simulate_peak_kb = peak_rss_kb()
    with tempfile.TemporaryDirectory() as out:
        summary = write_outputs(sim, Path(out))
    events = sim.recorder.receive_events
    return {
        "participants": participants,
        "messages": summary["messages_sent"],
        "virtual_s": sim.now / 1000,
        "simulate_s": simulate_s,
        "write_s": summary["write_seconds"],
        "receive_events": events,
        "receive_events_per_s": events / simulate_s,
        "simulate_peak_rss_mb": simulate_peak_kb / KB,
        "peak_rss_mb": peak_rss_kb() / KB,
        "peak_kb_per_participant": (simulate_peak_kb - baseline_kb) / participants,
        "invariants_hold": summary["invariants_hold"],
    }


def profile_one(participants: int, top: int) -> None:
    sim = Simulation(scenario(participants))
    profiler = cProfile.Profile()
    profiler.runcall(sim.run)
    print(f"{participants} participants, {sim.recorder.receive_events:,} receive events")
    stats = pstats.Stats(profiler, stream=sys.stdout).strip_dirs()
    for order in ("cumulative", "tottime"):
        print(f"\n--- top {top} by {order} ---")
        stats.sort_stats(order).print_stats(top)


def trace_one(participants: int, top: int) -> None:
    tracemalloc.start()
    sim = Simulation(scenario(participants))
    sim.run()
    snapshot = tracemalloc.take_snapshot()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"{participants} participants: traced {current / KB / KB:,.1f} MB at the end, "
        f"peak {peak / KB / KB:,.1f} MB ({peak / KB / participants:,.1f} kB per participant)"
    )
    print(f"\n--- top {top} allocation sites at the end, per participant ---")
    for stat in snapshot.statistics("lineno")[:top]:
        frame = stat.traceback[0]
        print(
            f"{stat.size / KB / participants:10.2f} kB  {stat.count / participants:10.1f} blocks"
            f"  {frame.filename.split('/src/')[-1]}:{frame.lineno}"
        )


def measure(participants: int) -> dict[str, Any]:
    child = subprocess.run(
        [sys.executable, __file__, "--child", str(participants)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(child.stdout)
    return result


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        "| participants | messages | virtual s | simulate s | write s | receive events "
        "| receive ev/s | peak RSS MB (sim / +write) | peak kB / participant | invariants |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['participants']:,} | {r['messages']:,} | {r['virtual_s']:,.1f} "
            f"| {r['simulate_s']:,.1f} | {r['write_s']:,.1f} | {r['receive_events']:,} "
            f"| {r['receive_events_per_s']:,.0f} "
            f"| {r['simulate_peak_rss_mb']:,.0f} / {r['peak_rss_mb']:,.0f} "
            f"| {r['peak_kb_per_participant']:,.1f} "
            f"| {'hold' if r['invariants_hold'] else 'FAIL'} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="comma-separated group sizes")
    parser.add_argument("--json", type=Path, help="also write every number here")
    parser.add_argument("--profile", type=int, metavar="N", help="cProfile one run of N")
    parser.add_argument("--tracemalloc", type=int, metavar="N", help="heap of one run of N")
    parser.add_argument("--top", type=int, default=25, help="entries per profile listing")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(run_one(args.child)))
        return
    if args.profile is not None:
        profile_one(args.profile, args.top)
        return
    if args.tracemalloc is not None:
        trace_one(args.tracemalloc, args.top)
        return
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        print(f"running {size:,} participants …", file=sys.stderr, flush=True)
        rows.append(measure(size))
    print(
        f"causal history {CAUSAL_HISTORY}, 1 store, 5 % loss, "
        f"sync interval {SYNC_MS_PER_PARTICIPANT} ms x participants, seed 1"
    )
    print_table(rows)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
