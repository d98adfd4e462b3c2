"""`sdsync demo`: the whole system end to end (:mod:`sdsync.demo.full`), or with
``--quick`` a few-second group on a toy network (:mod:`sdsync.demo.quick`); this module
parses the flags and prints the summaries."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from sdsync.cli.errors import fail
from sdsync.pipeline import pages  # plain formatting: no Spark

if TYPE_CHECKING:
    from sdsync.demo import FullDemo, QuickDemo
    from sdsync.sim.config import SimConfig


def demo_command(
    quick: Annotated[
        bool,
        typer.Option("--quick", help="Only a small in-process group (no simulator, no Spark)."),
    ] = False,
    out: Annotated[
        Path, typer.Option("--out", file_okay=False, help="Where the full demo writes.")
    ] = Path("out/demo"),
    participants: Annotated[
        int | None, typer.Option(min=2, help="Group size [12; --quick: 5].")
    ] = None,
    messages: Annotated[
        int | None, typer.Option(min=1, help="Content messages [600; --quick: 200].")
    ] = None,
    loss: Annotated[float, typer.Option(min=0.0, max=0.95, help="Loss per copy.")] = 0.2,
    seed: Annotated[int, typer.Option(help="Seed of the whole run.")] = 1,
) -> None:
    """The whole system end to end: simulate a lossy group with store nodes (one has an
    outage), consolidate, reconcile and report on local Spark; writes OUT/index.html.

    Exit code 0 when the group converged, 1 when it did not, 2 when Spark is missing.
    """
    from sdsync.demo import demo_scenario, run_full_demo, run_quick_demo

    console = Console()
    if quick:
        with console.status("running the group on a virtual clock…"):
            result = run_quick_demo(participants or 5, messages or 200, loss, seed)
        print_quick_demo(result, console)
        raise typer.Exit(0 if result.converged else 1)
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise fail(
            "the full demo runs Spark: pip install 'sdsync[spark]' (Java 17+);"
            " `sdsync demo --quick` runs without it",
            console=console,
        ) from None
    config = demo_scenario(participants or 12, messages or 600, loss, seed)
    full = run_full_demo(config, out, console)
    print_full_demo(config, full, console)
    raise typer.Exit(0 if full.ok else 1)


def print_quick_demo(result: QuickDemo, console: Console) -> None:
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


def print_full_demo(config: SimConfig, result: FullDemo, console: Console) -> None:
    from sdsync.demo.full import OFFLINE_MS, OUTAGE_MS, format_window
    from sdsync.sim.config import participant_name

    sim, con, rec, rep = result.simulation, result.consolidate, result.reconcile, result.report
    ttc = rep["time_to_consistency_ms"]
    table = Table(title="sdsync demo", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row(
        "group",
        f"{config.participants} participants, {sim['messages_sent']:,} messages, "
        f"{config.network.loss:.0%} loss, store s01 down {format_window(OUTAGE_MS)}, "
        f"{participant_name(config.participants - 1)} offline {format_window(OFFLINE_MS)}",
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
            + (f" (sent {format_window(result.missing_window_ms[name])})" if lacks else ""),
        )
    table.add_row(
        "report",
        f"delivery rate {rep['delivery_rate']:.4f}; time to consistency p50 "
        f"{pages.ms(ttc['p50'])}, p99 {pages.ms(ttc['p99'])}; "
        f"{pages.size(rep['transmitted_bytes_per_message'])} transmitted per message",
    )
    table.add_row("wall time", f"{result.seconds:.0f} s")
    console.print(table)
    console.print(f"report: [bold]{(result.out / 'index.html').resolve()}[/]")
