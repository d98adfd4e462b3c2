"""When to sync: our policy against js-waku's, in the same run, on the same seeds.

Both suppress a sync after a received one (a full interval, then the random draw) and
bring the next sync forward when content arrives. They differ in one rule: js-waku lets
every received sync defer ours again, even the sync that would acknowledge content we
just delivered; ours keeps that sync due until a message acknowledged the content to its
sender — ours, or another participant's naming it in its causal history
(``RuntimeConfig.defer_owed_acknowledgements``; docs/runtime.md, "When a participant
syncs"). Two scenarios, each simulated with both policies:

* **group**: 50 participants, 2,000 messages in a minute, 30 % loss — a large, busy
  group, where one sync acknowledges a message for everyone and extra syncs are pure cost;
* **talk**: 3 participants taking turns (60 messages over 10 minutes), 10 % loss — a
  small chat, where each received sync pushed js-waku's acknowledgement back again.

Per run: bytes on the wire per content message, syncs sent, time to consistency p50/p99,
and the time from a send to the sender's acknowledgement (p50/p99/max, from the event
table), and whether the invariants held; then each figure's ratio ours / js-waku's.
Timing never fails: the exit status is 0 whenever the bench completes.

Usage::

    .venv/bin/python bench/sync_policy.py [--seeds 7,1,2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from collections.abc import Callable
from typing import Any

from sdsync.sim.config import NetworkConfig, ProtocolConfig, SimConfig, WorkloadConfig
from sdsync.sim.engine import Simulation

# Participants, independent loss, content messages, and the time they are spread over.
SCENARIOS: dict[str, tuple[int, float, int, int]] = {
    "group": (50, 0.3, 2_000, 60_000),
    "talk": (3, 0.1, 60, 600_000),
}
POLICIES = {"ours": False, "js-waku": True}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ack_delays_s(sim: Simulation) -> list[float]:
    """Seconds from each content send to its sender's (first) acknowledgement."""
    cols = sim.recorder.columns
    sent: dict[str, int] = {}
    acked: dict[str, int] = {}
    columns = (cols["time_ms"], cols["kind"], cols["message_id"])
    for time_ms, kind, message_id in zip(*columns, strict=True):
        if kind == "send":
            sent.setdefault(message_id, time_ms)
        elif kind == "ack":
            acked.setdefault(message_id, time_ms)
    return [(acked[m] - t) / 1000 for m, t in sent.items() if m in acked]


def config(scenario: str, policy: str, seed: int) -> SimConfig:
    participants, loss, messages, duration_ms = SCENARIOS[scenario]
    return SimConfig(
        seed=seed,
        participants=participants,
        network=NetworkConfig(loss=loss),
        workload=WorkloadConfig(messages=messages, duration_ms=duration_ms),
        protocol=ProtocolConfig(defer_owed_acknowledgements=POLICIES[policy]),
    )


def run_one(scenario: str, policy: str, seed: int) -> dict[str, Any]:
    sim = Simulation(config(scenario, policy, seed))
    sim.run()
    summary = sim.recorder.summary()
    delays = ack_delays_s(sim)
    ttc = summary["time_to_consistency_ms"]
    return {
        "scenario": scenario,
        "policy": policy,
        "seed": seed,
        "bytes_per_message": summary["bytes_per_content_message"],
        "syncs": summary["transmissions"]["sync"],
        "ttc_p50_s": ttc["p50"] / 1000,
        "ttc_p99_s": ttc["p99"] / 1000,
        "ack_p50_s": percentile(delays, 0.5),
        "ack_p99_s": percentile(delays, 0.99),
        "ack_max_s": max(delays, default=float("nan")),
        "acknowledged": len(delays),
        "invariants_hold": summary["invariants_hold"],
    }


FIGURES: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("bytes_per_message", "bytes/msg", lambda v: f"{v / 1e6:.2f} MB"),
    ("syncs", "syncs", lambda v: f"{v:,.0f}"),
    ("ttc_p50_s", "TTC p50", lambda v: f"{v:.1f} s"),
    ("ttc_p99_s", "TTC p99", lambda v: f"{v:.1f} s"),
    ("ack_p50_s", "ack p50", lambda v: f"{v:.1f} s"),
    ("ack_p99_s", "ack p99", lambda v: f"{v:.1f} s"),
    ("ack_max_s", "ack max", lambda v: f"{v:.1f} s"),
)


def mean(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.fmean(r[key] for r in rows)


def report(rows: list[dict[str, Any]]) -> None:
    header = ["scenario", "policy", *(label for _, label, _ in FIGURES), "invariants"]
    print(" | ".join(header))
    for scenario in SCENARIOS:
        by_policy = {
            p: [r for r in rows if (r["scenario"], r["policy"]) == (scenario, p)] for p in POLICIES
        }
        for policy, runs in by_policy.items():
            cells = [fmt(mean(runs, key)) for key, _, fmt in FIGURES]
            held = sum(r["invariants_hold"] for r in runs)
            print(" | ".join([scenario, policy, *cells, f"{held}/{len(runs)} hold"]))
        ratios = [
            f"{mean(by_policy['ours'], key) / mean(by_policy['js-waku'], key):.2f}x"
            for key, _, _ in FIGURES
        ]
        print(" | ".join([scenario, "ours / js-waku", *ratios, ""]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="7,1,2", help="comma-separated seeds [7,1,2]")
    parser.add_argument("--json", help="also write every run's figures to this file")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    # A busy group at 30 % loss evicts from full incoming buffers: expected, counted.
    logging.getLogger("sdsync").setLevel(logging.ERROR)
    rows = []
    for scenario in SCENARIOS:
        for seed in seeds:
            for policy in POLICIES:
                row = run_one(scenario, policy, seed)
                print(f"  {scenario} seed {seed} {policy}: done", file=sys.stderr)
                rows.append(row)
    print(f"seeds {', '.join(map(str, seeds))}; means over the seeds")
    report(rows)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
