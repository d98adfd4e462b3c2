"""Run a scenario on the simulator under a progress bar and write its outputs.

The full demo's first step, and all the work of ``sdsync simulate``: both show the run on
a console while the simulator advances its virtual clock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from sdsync.errors import LocalProtocolError
from sdsync.sim.config import SimConfig


class InvalidScenarioError(ValueError):
    """The configuration parses but the engine rejects it."""


def run_simulation(
    config: SimConfig, out: Path, *, events: bool, console: Console
) -> dict[str, Any]:
    """Run under a progress bar on ``console``, write the outputs, return the summary.

    Raises :class:`InvalidScenarioError` when the engine rejects the protocol parameters (they
    are validated where they are used, when the simulation is built).
    """
    from sdsync.sim.engine import Simulation
    from sdsync.sim.output import write_outputs

    progress = Progress(
        TextColumn("[bold]simulating[/]"),
        BarColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task("", total=1)
    holder: list[Simulation] = []

    def report(now_ms: int, deadline_ms: int) -> None:
        received = holder[0].recorder.receive_events if holder else 0
        progress.update(
            task,
            total=deadline_ms,
            completed=now_ms,
            description=f"virtual {now_ms / 1000:,.0f} s · {received:,} receive events",
        )

    try:
        sim = Simulation(config, record_events=events, progress=report)
    except (LocalProtocolError, ValueError) as exc:
        # Only construction is guarded: an error during the run is a bug, not bad input.
        raise InvalidScenarioError(f"invalid protocol parameters: {exc}") from None
    holder.append(sim)
    with progress:
        sim.run()
        # A run ends early once every log is consistent: show it as complete.
        progress.update(
            task,
            completed=progress.tasks[0].total or 1,
            description=f"done at virtual {sim.now / 1000:,.1f} s · "
            f"{sim.recorder.receive_events:,} receive events",
        )
    with console.status("writing outputs…"):
        return write_outputs(sim, out, events=events)
