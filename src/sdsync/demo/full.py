"""The full demo (``sdsync demo``): the whole system end to end, on embedded defaults.

Theory of operation
-------------------
The path data takes through sdsync:

1. **simulate** a group under loss with two store nodes, one of which has an outage, and
   a participant that goes offline for a while (the real engines on the simulator's
   virtual clock; ``sdsync simulate``'s outputs);
2. on a local Spark, **consolidate** the participants' logs against the message
   metadata (the canonical log, divergences, causal gaps), **reconcile** the two stores'
   archives (what the outage cost), and **report** on the run (delivery over time, time to
   consistency, bytes per message, per-participant lag);
3. tie it together in ``OUT/index.html`` and ``OUT/summary.json``.

Progress goes to the console given; ``sdsync demo`` prints the summary.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from rich.console import Console

from sdsync.demo.simulation import run_simulation
from sdsync.pipeline import pages  # plain formatting and HTML: no Spark
from sdsync.sim.config import (
    ChurnConfig,
    NetworkConfig,
    SimConfig,
    StoreOutage,
    WorkloadConfig,
    participant_name,
)

STEPS = ("simulation", "consolidate", "reconcile", "report")
OUTAGE_MS = (120_000, 300_000)
OFFLINE_MS = (180_000, 330_000)
# The page's consolidate table: column heading → key of consolidate's summary.
CONSOLIDATE_COLUMNS = {
    "canonical entries": "canonical_entries",
    "participants": "participants",
    "divergent": "divergent_participants",
    "missing": "missing_entries",
    "out of order": "order_violations",
    "duplicates": "duplicates",
    "causal gaps": "causal_gaps",
}


def demo_scenario(participants: int, messages: int, loss: float, seed: int) -> SimConfig:
    """Ten minutes of group chat under loss; store s01 is down from minute 2 to 5 and the
    last participant is offline from minute 3 to 5.5 (it keeps its state)."""
    return SimConfig(
        seed=seed,
        participants=participants,
        stores=2,
        drain_ms=1_800_000,
        network=NetworkConfig(latency_ms=100.0, jitter_ms=50.0, loss=loss),
        workload=WorkloadConfig(messages=messages, duration_ms=600_000),
        store_outages=(StoreOutage(1, *OUTAGE_MS),),
        churn=(ChurnConfig(participants - 1, *OFFLINE_MS),),
    )


@dataclass
class FullDemo:
    out: Path
    simulation: dict[str, Any]
    consolidate: dict[str, Any]
    reconcile: dict[str, Any]
    report: dict[str, Any]
    missing_window_ms: dict[str, tuple[int, int] | None]
    seconds: float

    @property
    def ok(self) -> bool:
        """The group converged: the archives' difference is the demo's finding, not a fault."""
        return bool(self.simulation["invariants_hold"]) and not (
            self.consolidate["divergent_participants"] or self.consolidate["causal_gaps"]
        )


def run_full_demo(config: SimConfig, out: Path, console: Console) -> FullDemo:
    """Simulate, then consolidate, reconcile and report on Spark; write OUT/index.html."""
    from sdsync.pipeline.consolidate import consolidate
    from sdsync.pipeline.io import write_summary
    from sdsync.pipeline.progress import Progress
    from sdsync.pipeline.reconcile import ParquetArchive, reconcile
    from sdsync.pipeline.report import report
    from sdsync.pipeline.session import SessionOptions, build_session
    from sdsync.sim.output import ARCHIVES, EVENTS, LOGS, MESSAGES, store_name

    started = time.perf_counter()
    console.rule("1. simulate")
    simulated = run_simulation(config, out / "simulation", events=True, console=console)
    console.print(
        f"[green]✓[/] {simulated['messages_sent']:,} messages, "
        f"{simulated['receive_events']:,} receive events "
        f"[dim]({simulated['wall_seconds']:.1f} s)[/]"
    )
    sim_dir = out / "simulation"
    console.rule("2. Spark: consolidate, reconcile, report")
    with console.status("starting Spark (local)…"):
        # C1-only JIT: these jobs are short (see SessionOptions.fast_start).
        spark, owned = build_session(SessionOptions(fast_start=True, app_name="sdsync-demo"))
    try:
        # One Progress per command: each summary.json has its own stage timings.
        console.print("[bold]consolidate[/] the logs against the message metadata")
        consolidated = consolidate(
            spark,
            str(sim_dir / LOGS),
            str(sim_dir / MESSAGES),
            out / "consolidate",
            Progress(spark, console),
        )
        archives = [
            ParquetArchive(store_name(i), str(sim_dir / ARCHIVES / store_name(i)))
            for i in range(config.stores)
        ]
        console.print("[bold]reconcile[/] the store archives")
        reconciled = reconcile(spark, archives, out / "reconcile", Progress(spark, console))
        console.print("[bold]report[/] on the events")
        reported = report(spark, str(sim_dir / EVENTS), out / "report", Progress(spark, console))
    finally:
        if owned:  # a session we joined (the tests') is not ours to stop
            spark.stop()
    result = FullDemo(
        out,
        simulated,
        consolidated,
        reconciled,
        reported,
        _missing_windows(out / "reconcile" / "missing", [a.name for a in archives]),
        round(time.perf_counter() - started, 1),
    )
    _write_page(config, result)
    write_summary(out, _summary(result))
    return result


def _summary(result: FullDemo) -> dict[str, Any]:
    """OUT/summary.json: the verdict, each step's headline numbers, where the rest is."""
    sim, con, rec, rep = result.simulation, result.consolidate, result.reconcile, result.report
    return {
        "converged": result.ok,
        "simulation": {
            k: sim[k]
            for k in ("seed", "participants", "messages_sent", "invariants_hold", "problems")
        },
        "consolidate": {
            k: con[k] for k in ("canonical_entries", "divergent_participants", "causal_gaps")
        },
        "reconcile": {
            "rows_per_archive": rec["rows_per_archive"],
            "missing_per_archive": rec["missing_per_archive"],
            "missing_sent_ms": result.missing_window_ms,
        },
        "report": {
            k: rep[k] for k in ("delivery_rate", "unconverged_messages", "time_to_consistency_ms")
        },
        "outputs": {
            "index": str(result.out / "index.html"),
            **{step: str(result.out / step) for step in STEPS},
        },
        "seconds": result.seconds,
    }


def _missing_windows(missing: Path, names: list[str]) -> dict[str, tuple[int, int] | None]:
    """Per archive: the virtual-time span (ms) of the messages it lacks, if any."""
    from sdsync.sim.engine import EPOCH_NS

    rows = pq.read_table(missing, columns=["archive", "timestamp"]).to_pylist()
    windows: dict[str, tuple[int, int] | None] = {}
    for name in names:
        times = [(r["timestamp"] - EPOCH_NS) // 1_000_000 for r in rows if r["archive"] == name]
        windows[name] = (min(times), max(times)) if times else None
    return windows


def format_window(span: tuple[int, int] | None) -> str:
    """A span of virtual time in ms as seconds, e.g. "121–300 s"."""
    return "—" if span is None else f"{span[0] / 1000:,.0f}–{span[1] / 1000:,.0f} s"


def _write_page(config: SimConfig, result: FullDemo) -> None:
    from sdsync.pipeline.report import load_tables, report_sections

    sim, con, rec = result.simulation, result.consolidate, result.reconcile
    outage, offline = format_window(OUTAGE_MS), format_window(OFFLINE_MS)
    last = participant_name(config.participants - 1)
    sections = [
        pages.Section(
            "The run",
            [
                f"{config.participants} participants, {sim['messages_sent']:,} messages over "
                f"{config.workload.duration_ms // 60_000} minutes of virtual time, "
                f"{config.network.loss:.0%} of all copies lost; two store nodes, s01 down "
                f"during {outage}; {last} offline during {offline}.",
                f"Simulator verdict: invariants {'hold' if sim['invariants_hold'] else 'FAIL'}"
                f" (identical logs: {sim['identical_logs']}, causal order: "
                f"{sim['causal_order_ok']}, duplicates: {sim['duplicates']}).",
            ],
            links=[("simulation/summary.json", "simulation/summary.json")],
        ),
        pages.Section(
            "Consolidate: one canonical log per channel",
            [
                "Every participant's final log against the union of all of them, ordered by "
                "(Lamport timestamp, message id); causal gaps are dependencies in no log and "
                "no archive (irretrievably lost)."
            ],
            tables=[
                pages.Table(
                    list(CONSOLIDATE_COLUMNS),
                    [[pages.count(con[key]) for key in CONSOLIDATE_COLUMNS.values()]],
                )
            ],
            links=[("consolidate/summary.json", "consolidate/summary.json")],
        ),
        pages.Section(
            "Reconcile: what the store outage cost",
            [
                "Each archive holds every WakuMessage its store heard (content, resends, "
                "syncs, repairs), keyed by the deterministic message hash. Rows are compared "
                "only in the time ranges whose fingerprints differ."
            ],
            tables=[
                pages.Table(
                    ["archive", "rows", "lacks", "lacked messages were sent during"],
                    [
                        [
                            name,
                            pages.count(rec["rows_per_archive"][name]),
                            pages.count(rec["missing_per_archive"][name]),
                            format_window(result.missing_window_ms[name]),
                        ]
                        for name in rec["archives"]
                    ],
                )
            ],
            links=[("reconcile/summary.json", "reconcile/summary.json")],
        ),
        *report_sections(result.report, load_tables(result.out / "report"), prefix="report/"),
    ]
    pages.write_page(result.out, "sdsync demo: the whole system end to end", sections)
