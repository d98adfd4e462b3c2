"""The `sdsync` command."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from sdsync.core import BloomParams, ChannelConfig, RepairConfig
from sdsync.core.config import MESSAGE_ID_SCHEMES
from sdsync.errors import LocalProtocolError

app = typer.Typer(
    help="Scalable Data Sync for distributed logs.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def demo(
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
    from sdsync.cli.demo import main as run

    code = run(
        quick=quick, out=out, participants=participants, messages=messages, loss=loss, seed=seed
    )
    raise typer.Exit(code)


@app.command()
def peer(
    participant: Annotated[str, typer.Option(help="Our participant (sender) id.")],
    stdio: Annotated[
        bool, typer.Option("--stdio", help="Speak JSON lines on stdin/stdout.")
    ] = False,
    channel: Annotated[str, typer.Option(help="Channel id.")] = "0",
    causal_history: Annotated[int, typer.Option(min=0)] = 200,
    bloom_capacity: Annotated[int, typer.Option(min=1)] = 10_000,
    bloom_error_rate: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.001,
    possible_acks_threshold: Annotated[int, typer.Option(min=1)] = 2,
    lost_timeout_ms: Annotated[int | None, typer.Option(min=1)] = None,
    repair: Annotated[bool, typer.Option("--repair/--no-repair", help="SDS-R.")] = True,
    repair_t_min_ms: Annotated[int, typer.Option(min=0)] = 30_000,
    repair_t_max_ms: Annotated[int, typer.Option(min=1)] = 120_000,
    repair_response_groups: Annotated[int, typer.Option(min=1)] = 1,
    message_id: Annotated[
        str,
        typer.Option(
            "--message-id",
            help="Default message ids: 'payload' (sha256 of the payload, as @waku/sds) or"
            " 'sender-lamport-payload' (sdsync's library default, never colliding).",
        ),
    ] = "payload",
) -> None:
    """Conformance peer: one JSON request per line in, one JSON reply per line out."""
    from sdsync.cli.peer import PeerSession, serve

    if not stdio:
        raise typer.BadParameter("only --stdio is supported", param_hint="--stdio")
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    if message_id not in MESSAGE_ID_SCHEMES:
        choices = " or ".join(MESSAGE_ID_SCHEMES)
        raise typer.BadParameter(f"must be {choices}", param_hint="--message-id")
    try:
        config = ChannelConfig(
            causal_history_size=causal_history,
            bloom=BloomParams(bloom_capacity, bloom_error_rate),
            possible_acks_threshold=possible_acks_threshold,
            lost_timeout_ms=lost_timeout_ms,
            repair=RepairConfig(
                enabled=repair,
                t_min_ms=repair_t_min_ms,
                t_max_ms=repair_t_max_ms,
                response_groups=repair_response_groups,
            ),
            message_id_scheme=message_id,  # checked above
        )
    except (ValueError, LocalProtocolError) as exc:
        raise typer.BadParameter(str(exc)) from None
    serve(PeerSession(channel, participant, config))


@app.command()
def simulate(
    out: Annotated[Path, typer.Option("--out", file_okay=False, help="Directory for the outputs.")],
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", exists=True, dir_okay=False, help="Scenario TOML; flags override it."
        ),
    ] = None,
    participants: Annotated[int | None, typer.Option(min=2, help="Group size.")] = None,
    messages: Annotated[
        int | None, typer.Option(min=0, help="Content messages over the workload.")
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(min=0.0, help="Messages per participant per second (replaces --messages)."),
    ] = None,
    loss: Annotated[
        float | None, typer.Option(min=0.0, max=1.0, help="Independent loss per copy.")
    ] = None,
    burst_loss: Annotated[
        str | None,
        typer.Option(
            metavar="ENTER,EXIT,LOSS",
            help="Gilbert–Elliott: P(good→bad), P(bad→good) per copy, loss while bad.",
        ),
    ] = None,
    latency_ms: Annotated[
        str | None, typer.Option(metavar="MEAN[,JITTER]", help="One-way latency, ms.")
    ] = None,
    churn: Annotated[
        list[str] | None,
        typer.Option(
            metavar="P:START_S-END_S[:lose]",
            help="Participant P offline in [START, END) s; ':lose' drops volatile state. "
            "Repeatable; replaces the scenario's churn entries.",
        ),
    ] = None,
    partition: Annotated[
        list[str] | None,
        typer.Option(
            metavar="START_S-HEAL_S[:0,1,2[/3,4]]",
            help="Partition into halves (or the given groups) until it heals. Repeatable; "
            "replaces the scenario's partitions.",
        ),
    ] = None,
    stores: Annotated[int | None, typer.Option(min=0, help="Store nodes.")] = None,
    repair: Annotated[
        bool | None, typer.Option("--repair/--no-repair", help="SDS-R on or off.")
    ] = None,
    causal_history: Annotated[
        int | None, typer.Option(min=0, help="Causal history entries per message.")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the whole run.")] = None,
    duration_s: Annotated[
        float | None, typer.Option(min=0.001, help="Workload duration, seconds.")
    ] = None,
    drain_s: Annotated[
        float | None,
        typer.Option(min=0.0, help="After the workload, how long to wait for consistency."),
    ] = None,
    channels: Annotated[int | None, typer.Option(min=1, help="Channels per participant.")] = None,
    duplicate: Annotated[
        float | None, typer.Option(min=0.0, max=1.0, help="P(a copy arrives twice).")
    ] = None,
    reorder: Annotated[
        float | None, typer.Option(min=0.0, max=1.0, help="P(a copy is held back).")
    ] = None,
    sync_interval_ms: Annotated[
        int | None, typer.Option(min=1, help="Base sync interval of every participant.")
    ] = None,
    events: Annotated[
        bool, typer.Option("--events/--no-events", help="Write events.parquet.")
    ] = True,
) -> None:
    """Simulate a group on a virtual clock; write summary.json, events.parquet and logs/.

    Exit code 0 when every invariant holds, 1 when one fails, 2 on bad arguments.
    """
    from sdsync.cli.simulate import (
        ArgumentError,
        Flags,
        InvalidScenarioError,
        build_config,
        print_summary,
        run_simulation,
    )

    flags = Flags(
        config=config,
        participants=participants,
        messages=messages,
        rate=rate,
        loss=loss,
        burst_loss=burst_loss,
        latency_ms=latency_ms,
        churn=churn,
        partition=partition,
        stores=stores,
        repair=repair,
        causal_history=causal_history,
        seed=seed,
        duration_s=duration_s,
        drain_s=drain_s,
        channels=channels,
        duplicate=duplicate,
        reorder=reorder,
        sync_interval_ms=sync_interval_ms,
    )
    err = Console(stderr=True)

    def bad(message: str) -> typer.Exit:
        # Escaped: messages quote TOML tables like "[network]", which rich reads as markup.
        err.print(f"[red]error:[/] {escape(message)}", highlight=False)
        return typer.Exit(2)

    try:
        sim_config = build_config(flags)
    except ArgumentError as exc:
        raise typer.BadParameter(str(exc), param_hint=exc.option) from None
    except LocalProtocolError as exc:
        raise bad(str(exc)) from None
    try:
        # Fail before a long run, not after it, when the outputs cannot be written.
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise bad(f"cannot create --out {out}: {exc}") from None
    try:
        summary = run_simulation(sim_config, out, events=events, console=err)
    except InvalidScenarioError as exc:
        raise bad(str(exc)) from None
    print_summary(summary, out, Console())
    raise typer.Exit(0 if summary["invariants_hold"] else 1)


def main() -> None:  # pragma: no cover - console entry point
    app()


from sdsync.cli.pipeline import pipeline_app  # noqa: E402

app.add_typer(pipeline_app, name="pipeline")

from sdsync.cli.store import store_app  # noqa: E402

app.add_typer(store_app, name="store")

from sdsync.cli.chat import chat_command  # noqa: E402

app.command("chat")(chat_command)
