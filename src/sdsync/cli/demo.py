"""`sdsync demo`: the whole system end to end, on embedded defaults.

The full demo (the default) is the path data takes through sdsync:

1. **simulate** a group under loss with two store nodes, one of which has an outage, and
   a participant that goes offline for a while (the real engines on the simulator's
   virtual clock; ``sdsync simulate``'s outputs);
2. on a local Spark, **consolidate** the participants' logs against the message
   metadata (the canonical log, divergences, causal gaps), **reconcile** the two stores'
   archives (what the outage cost), and **report** on the run (delivery over time, time to
   consistency, bytes per message, per-participant lag);
3. tie it together in ``OUT/index.html`` and print a short summary.

``--quick`` keeps the original few-second demo: a deliberately small event loop on a
virtual clock where every broadcast copy is lost with probability ``loss`` or arrives
after a random latency, and each participant resends what is unacknowledged, sends sync
messages, sweeps its buffers and answers repair requests on a timer — the real core
engine converging, with no simulator and no Spark.
"""

from __future__ import annotations

import heapq
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from sdsync.core import ChannelConfig, MessageChannel, MessageDelivered
from sdsync.pipeline import pages  # plain formatting and HTML: no Spark
from sdsync.sim.config import (
    ChurnConfig,
    NetworkConfig,
    SimConfig,
    StoreOutage,
    WorkloadConfig,
    participant_name,
)

STEP_MS = 10
TICK_MS = 1_000
RESEND_AFTER_MS = 3_000
SYNC_EVERY_MS = 5_000


@dataclass
class Member:
    channel: MessageChannel
    sent: int = 0
    delivered: int = 0
    bytes_sent: int = 0
    next_sync_ms: int = 0


class DemoNetwork:
    """Broadcast with independent loss and uniform latency, on a virtual clock."""

    def __init__(self, participants: int, loss: float, seed: int) -> None:
        self.rng = random.Random(seed)
        self.loss = loss
        config = ChannelConfig()
        self.members = [
            Member(MessageChannel("demo", f"p{i}", now_ms=0, config=config))
            for i in range(participants)
        ]
        self.in_flight: list[tuple[int, int, int, bytes]] = []
        self.copies = 0
        self.lost = 0

    def broadcast(self, sender: int, data: bytes, now: int) -> None:
        self.members[sender].bytes_sent += len(data)
        for dest in range(len(self.members)):
            if dest == sender:
                continue
            self.copies += 1
            if self.rng.random() < self.loss:
                self.lost += 1
                continue
            arrival = now + self.rng.randint(20, 400)
            heapq.heappush(self.in_flight, (arrival, self.copies, dest, data))

    def deliver_due(self, now: int) -> None:
        while self.in_flight and self.in_flight[0][0] <= now:
            _, _, dest, data = heapq.heappop(self.in_flight)
            events = self.members[dest].channel.receive(data, now)
            self.members[dest].delivered += sum(isinstance(e, MessageDelivered) for e in events)

    def housekeeping(self, now: int) -> None:
        for index, member in enumerate(self.members):
            chan = member.channel
            chan.sweep_incoming(now)
            sweep = chan.sweep_outgoing()
            for entry in sweep.unacknowledged + sweep.possibly_acknowledged:
                if now - entry.last_sent_ms >= RESEND_AFTER_MS:
                    self.broadcast(index, chan.resend(entry.message_id, now), now)
            if now >= member.next_sync_ms:
                member.next_sync_ms = now + self.rng.randint(SYNC_EVERY_MS // 2, SYNC_EVERY_MS)
                sync = chan.send_sync(now)
                if sync is not None:
                    self.broadcast(index, sync.data, now)
            for data in chan.sweep_repair(now).data:
                self.broadcast(index, data, now)

    def converged(self) -> bool:
        first = self.members[0].channel.log_ids()
        return all(m.channel.log_ids() == first for m in self.members[1:]) and not any(
            m.channel.outgoing_ids() for m in self.members
        )


@dataclass
class DemoResult:
    network: DemoNetwork
    messages: int
    converged: bool
    virtual_ms: int


def run_demo(
    participants: int = 5,
    messages: int = 200,
    loss: float = 0.2,
    seed: int = 1,
    max_virtual_ms: int = 3_600_000,
) -> DemoResult:
    net = DemoNetwork(participants, loss, seed)
    send_times = sorted(net.rng.randint(0, messages * 200) for _ in range(messages))
    sent = 0
    now = 0
    while now <= max_virtual_ms:
        while sent < messages and send_times[sent] <= now:
            sender = net.rng.randrange(participants)
            out = net.members[sender].channel.send(f"message {sent} from p{sender}".encode(), now)
            net.members[sender].sent += 1
            net.broadcast(sender, out.data, now)
            sent += 1
        net.deliver_due(now)
        if now % TICK_MS == 0:
            net.housekeeping(now)
        if sent == messages and not net.in_flight and net.converged():
            break
        now += STEP_MS
    return DemoResult(net, messages, net.converged(), now)


def print_demo(result: DemoResult, console: Console) -> None:
    net = result.network
    table = Table(
        title=f"SDS demo: {len(net.members)} participants, {result.messages} messages, "
        f"{net.lost} of {net.copies} broadcast copies lost"
    )
    for column in ("participant", "sent", "delivered", "log entries", "unacked", "KiB sent"):
        table.add_column(column, justify="right")
    table.add_column("same log as p0", justify="center")
    reference = net.members[0].channel.log_ids()
    for member in net.members:
        chan = member.channel
        log = chan.log_ids()
        table.add_row(
            chan.participant_id,
            str(member.sent),
            str(member.delivered),
            str(len(log)),
            str(len(chan.outgoing_ids())),
            f"{member.bytes_sent / 1024:.0f}",
            "[green]yes[/green]" if log == reference else "[red]no[/red]",
        )
    console.print(table)
    if result.converged:
        console.print(
            f"[bold green]converged[/bold green]: every log holds the same "
            f"{len(reference)} entries in the same order after "
            f"{result.virtual_ms / 1000:.1f} s of virtual time"
        )
    else:
        console.print("[bold red]not converged[/bold red] within the time limit")


# -- the whole system ---------------------------------------------------------------------

STEPS = ("simulation", "consolidate", "reconcile", "report")
OUTAGE_MS = (120_000, 300_000)
OFFLINE_MS = (180_000, 330_000)


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
    from sdsync.cli.simulate import run_simulation
    from sdsync.pipeline.consolidate import consolidate
    from sdsync.pipeline.io import write_summary
    from sdsync.pipeline.progress import Progress
    from sdsync.pipeline.reconcile import Archive, reconcile
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
            Archive(store_name(i), str(sim_dir / ARCHIVES / store_name(i)))
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


def _window(span: tuple[int, int] | None) -> str:
    return "—" if span is None else f"{span[0] / 1000:,.0f}–{span[1] / 1000:,.0f} s"


def _write_page(config: SimConfig, result: FullDemo) -> None:
    from sdsync.pipeline.report import load_tables, report_sections

    sim, con, rec = result.simulation, result.consolidate, result.reconcile
    outage = f"{OUTAGE_MS[0] // 1000}–{OUTAGE_MS[1] // 1000} s"
    offline = f"{OFFLINE_MS[0] // 1000}–{OFFLINE_MS[1] // 1000} s"
    sections = [
        pages.Section(
            "The run",
            [
                f"{config.participants} participants, {sim['messages_sent']:,} messages over "
                f"{config.workload.duration_ms // 60_000} minutes of virtual time, "
                f"{config.network.loss:.0%} of all copies lost; two store nodes, s01 down "
                f"during {outage}; p{config.participants - 1:05d} offline during {offline}.",
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
                    [
                        "canonical entries",
                        "participants",
                        "divergent",
                        "missing",
                        "out of order",
                        "duplicates",
                        "causal gaps",
                    ],
                    [
                        [
                            pages.count(con["canonical_entries"]),
                            pages.count(con["participants"]),
                            pages.count(con["divergent_participants"]),
                            pages.count(con["missing_entries"]),
                            pages.count(con["order_violations"]),
                            pages.count(con["duplicates"]),
                            pages.count(con["causal_gaps"]),
                        ]
                    ],
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
                            _window(result.missing_window_ms[name]),
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


def print_full_demo(config: SimConfig, result: FullDemo, console: Console) -> None:
    sim, con, rec, rep = result.simulation, result.consolidate, result.reconcile, result.report
    ttc = rep["time_to_consistency_ms"]
    table = Table(title="sdsync demo", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row(
        "group",
        f"{config.participants} participants, {sim['messages_sent']:,} messages, "
        f"{config.network.loss:.0%} loss, store s01 down "
        f"{OUTAGE_MS[0] // 1000}–{OUTAGE_MS[1] // 1000} s, "
        f"{participant_name(config.participants - 1)} offline "
        f"{OFFLINE_MS[0] // 1000}–{OFFLINE_MS[1] // 1000} s",
    )
    converged = con["divergent_participants"] == 0 and con["causal_gaps"] == 0
    table.add_row(
        "consolidate",
        ("[green]identical logs[/]" if converged else "[red]logs diverge[/]")
        + f": {con['canonical_entries']:,} canonical entries, "
        f"{con['divergent_participants']} divergent participants, "
        f"{con['causal_gaps']} causal gaps",
    )
    for name in rec["archives"]:
        lacks = rec["missing_per_archive"][name]
        table.add_row(
            f"reconcile {name}",
            f"{rec['rows_per_archive'][name]:,} rows, lacks {lacks:,}"
            + (f" (sent {_window(result.missing_window_ms[name])})" if lacks else ""),
        )
    table.add_row(
        "report",
        f"delivery rate {rep['delivery_rate']:.4f}; time to consistency p50 "
        f"{pages.ms(ttc['p50'])}, p99 {pages.ms(ttc['p99'])}; "
        f"{rep['transmitted_bytes_per_message'] / 1000:,.0f} kB transmitted per message",
    )
    table.add_row("wall time", f"{result.seconds:.0f} s")
    console.print(table)
    console.print(f"report: [bold]{(result.out / 'index.html').resolve()}[/]")


def main(
    *,
    quick: bool,
    out: Path,
    participants: int | None,
    messages: int | None,
    loss: float,
    seed: int,
) -> int:
    """`sdsync demo`: the exit code (0 converged, 1 not, 2 the full demo cannot run here)."""
    console = Console()
    if quick:
        with console.status("running the group on a virtual clock…"):
            result = run_demo(participants or 5, messages or 200, loss, seed)
        print_demo(result, console)
        return 0 if result.converged else 1
    try:
        import pyspark  # noqa: F401
    except ImportError:
        console.print(
            "[red]error:[/] the full demo runs Spark: pip install 'sdsync[spark]' (Java 17+);"
            " `sdsync demo --quick` runs without it"
        )
        return 2
    config = demo_scenario(participants or 12, messages or 600, loss, seed)
    full = run_full_demo(config, out, console)
    print_full_demo(config, full, console)
    return 0 if full.ok else 1
