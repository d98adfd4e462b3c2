"""The `sdsync` command."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer
from rich.console import Console

from sdsync.core import BloomParams, ChannelConfig, RepairConfig
from sdsync.errors import LocalProtocolError

app = typer.Typer(
    help="Scalable Data Sync for distributed logs.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def demo(
    participants: Annotated[int, typer.Option(min=2, help="Group size.")] = 5,
    messages: Annotated[int, typer.Option(min=1, help="Content messages to send.")] = 200,
    loss: Annotated[float, typer.Option(min=0.0, max=0.95, help="Loss per copy.")] = 0.2,
    seed: Annotated[int, typer.Option(help="Seed of the whole run.")] = 1,
) -> None:
    """Run a lossy in-process group chat and show that every log converged."""
    from sdsync.cli.demo import print_demo, run_demo

    console = Console()
    with console.status("running the group on a virtual clock…"):
        result = run_demo(participants, messages, loss, seed)
    print_demo(result, console)
    raise typer.Exit(0 if result.converged else 1)


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
) -> None:
    """Conformance peer: one JSON request per line in, one JSON reply per line out."""
    from sdsync.cli.peer import PeerSession, serve

    if not stdio:
        raise typer.BadParameter("only --stdio is supported", param_hint="--stdio")
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
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
        )
    except (ValueError, LocalProtocolError) as exc:
        raise typer.BadParameter(str(exc)) from None
    serve(PeerSession(channel, participant, config))


def main() -> None:  # pragma: no cover - console entry point
    app()
