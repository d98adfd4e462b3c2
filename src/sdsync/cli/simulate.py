"""`sdsync simulate`: run a scenario on the simulator, write its outputs, judge the run.

The command is thin: flags are parsed into overrides of a :class:`SimConfig` (loaded from
``--config`` or the defaults; a ``--profile`` sets its protocol fields first, the flags
given beside it win), :func:`sdsync.demo.run_simulation` runs the
:class:`Simulation` under a progress bar and writes ``summary.json``, ``events.parquet``
and ``logs/``, and the summary is printed. Exit codes: 0 when every invariant holds, 1
when one fails (the summary says which), 2 on bad arguments — including a scenario file
that does not parse or validate.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from inspect import Parameter, Signature, signature
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sdsync.cli.errors import fail
from sdsync.cli.options import PROFILE_HELP
from sdsync.errors import LocalProtocolError
from sdsync.pipeline import pages  # plain formatting: no Spark
from sdsync.runtime import profile
from sdsync.sim.config import (
    ChurnConfig,
    PartitionConfig,
    SimConfig,
    load_config,
    profile_fields,
    with_overrides,
)


class ArgumentError(ValueError):
    """A flag value that does not parse; ``option`` names the flag."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


def _number(text: str, option: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ArgumentError(option, f"{text!r} is not a number") from None


def _seconds_to_ms(text: str, option: str) -> int:
    value = _number(text, option)
    if value < 0:
        raise ArgumentError(option, f"{text!r}: times are seconds >= 0")
    return round(value * 1000)


def parse_burst(text: str) -> dict[str, float]:
    """``ENTER,EXIT,LOSS`` → the Gilbert–Elliott parameters of ``[network]``."""
    parts = text.split(",")
    if len(parts) != 3:
        raise ArgumentError("--burst-loss", f"{text!r}: expected ENTER,EXIT,LOSS")
    enter, exit_, loss = (_number(p, "--burst-loss") for p in parts)
    return {"network.burst_enter": enter, "network.burst_exit": exit_, "network.burst_loss": loss}


def parse_latency(text: str) -> dict[str, float]:
    """``MEAN`` or ``MEAN,JITTER`` in milliseconds."""
    parts = text.split(",")
    if len(parts) not in (1, 2):
        raise ArgumentError("--latency-ms", f"{text!r}: expected MEAN or MEAN,JITTER")
    values = [_number(p, "--latency-ms") for p in parts]
    if min(values) < 0:
        raise ArgumentError("--latency-ms", f"{text!r}: latencies are >= 0")
    overrides = {"network.latency_ms": values[0]}
    if len(values) == 2:
        overrides["network.jitter_ms"] = values[1]
    return overrides


def _interval(text: str, option: str) -> tuple[int, int]:
    start, sep, end = text.partition("-")
    if not sep:
        raise ArgumentError(option, f"{text!r}: expected START_S-END_S")
    return _seconds_to_ms(start, option), _seconds_to_ms(end, option)


def parse_churn(text: str) -> ChurnConfig:
    """``PARTICIPANT:START_S-END_S[:lose]``, e.g. ``3:60-3660:lose``."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "lose"):
        raise ArgumentError("--churn", f"{text!r}: expected PARTICIPANT:START_S-END_S[:lose]")
    try:
        participant = int(parts[0])
    except ValueError:
        raise ArgumentError("--churn", f"{text!r}: {parts[0]!r} is not a participant") from None
    start, end = _interval(parts[1], "--churn")
    return ChurnConfig(participant, start, end, lose_volatile_state=len(parts) == 3)


def parse_partition(text: str) -> PartitionConfig:
    """``START_S-HEAL_S`` (halves) or ``START_S-HEAL_S:0,1,2[/3,4]`` (explicit groups;
    everyone not named forms one more group)."""
    window, sep, spec = text.partition(":")
    start, heal = _interval(window, "--partition")
    if not sep:
        return PartitionConfig(start, heal)
    try:
        groups = tuple(
            tuple(int(member) for member in group.split(",")) for group in spec.split("/")
        )
    except ValueError:
        raise ArgumentError(
            "--partition", f"{text!r}: groups are comma-separated participants, '/' between"
        ) from None
    return PartitionConfig(start, heal, groups)


@dataclass
class Flags:
    """Everything `sdsync simulate` takes besides ``--out`` and ``--events``, each field
    declared as its option (:func:`takes_flags` shows them to typer); None means "not
    given"."""

    config: Annotated[
        Path | None,
        typer.Option(
            "--config", exists=True, dir_okay=False, help="Scenario TOML; flags override it."
        ),
    ] = None
    participants: Annotated[int | None, typer.Option(min=2, help="Group size.")] = None
    messages: Annotated[
        int | None, typer.Option(min=0, help="Content messages over the workload.")
    ] = None
    rate: Annotated[
        float | None,
        typer.Option(min=0.0, help="Messages per participant per second (replaces --messages)."),
    ] = None
    loss: Annotated[
        float | None, typer.Option(min=0.0, max=1.0, help="Independent loss per copy.")
    ] = None
    burst_loss: Annotated[
        str | None,
        typer.Option(
            metavar="ENTER,EXIT,LOSS",
            help="Gilbert–Elliott: P(good→bad), P(bad→good) per copy, loss while bad.",
        ),
    ] = None
    latency_ms: Annotated[
        str | None, typer.Option(metavar="MEAN[,JITTER]", help="One-way latency, ms.")
    ] = None
    churn: Annotated[
        list[str] | None,
        typer.Option(
            metavar="P:START_S-END_S[:lose]",
            help="Participant P offline in [START, END) s; ':lose' drops volatile state. "
            "Repeatable; replaces the scenario's churn entries.",
        ),
    ] = None
    partition: Annotated[
        list[str] | None,
        typer.Option(
            metavar="START_S-HEAL_S[:0,1,2[/3,4]]",
            help="Partition into halves (or the given groups) until it heals. Repeatable; "
            "replaces the scenario's partitions.",
        ),
    ] = None
    stores: Annotated[int | None, typer.Option(min=0, help="Store nodes.")] = None
    repair: Annotated[
        bool | None, typer.Option("--repair/--no-repair", help="SDS-R on or off.")
    ] = None
    causal_history: Annotated[
        int | None, typer.Option(min=0, help="Causal history entries per message.")
    ] = None
    seed: Annotated[int | None, typer.Option(help="Seed of the whole run.")] = None
    duration_s: Annotated[
        float | None, typer.Option(min=0.001, help="Workload duration, seconds.")
    ] = None
    drain_s: Annotated[
        float | None,
        typer.Option(
            min=0.0, help="After the workload and the last fault, how long to wait for consistency."
        ),
    ] = None
    channels: Annotated[int | None, typer.Option(min=1, help="Channels per participant.")] = None
    duplicate: Annotated[
        float | None, typer.Option(min=0.0, max=1.0, help="P(a copy arrives twice).")
    ] = None
    reorder: Annotated[
        float | None, typer.Option(min=0.0, max=1.0, help="P(a copy is held back).")
    ] = None
    sync_interval_ms: Annotated[
        int | None, typer.Option(min=1, help="Base sync interval of every participant.")
    ] = None
    profile: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help=f"Causal history, bloom filter and sync interval of a {PROFILE_HELP} "
            "It overrides --config.",
        ),
    ] = None


def takes_flags(command: Callable[..., None]) -> Callable[..., None]:
    """``command``, with its ``flags: Flags`` parameter shown to typer as one option per
    field of :class:`Flags`, in their order; their values reach ``command`` as one Flags."""
    options = get_type_hints(Flags, include_extras=True)
    per_field = [
        Parameter(f.name, Parameter.KEYWORD_ONLY, default=f.default, annotation=options[f.name])
        for f in fields(Flags)
    ]
    # All keyword-only (typer passes values by name), so that a field may stand between
    # parameters of the command's own whatever their defaults.
    parameters: list[Parameter] = []
    for own in signature(command, eval_str=True).parameters.values():
        parameters += (
            per_field if own.name == "flags" else [own.replace(kind=Parameter.KEYWORD_ONLY)]
        )

    @functools.wraps(command)
    def parsed(**values: Any) -> None:
        flags = Flags(**{f.name: values.pop(f.name) for f in fields(Flags)})
        command(flags=flags, **values)

    parsed.__signature__ = Signature(parameters)  # type: ignore[attr-defined]
    return parsed


def build_config(flags: Flags) -> SimConfig:
    """The scenario file (or defaults) with the flags applied on top.

    Raises :class:`ArgumentError` for a flag that does not parse and
    :class:`LocalProtocolError` for a scenario or combination that is invalid.
    """
    config = load_config(flags.config) if flags.config is not None else SimConfig()
    overrides: dict[str, Any] = {
        "seed": flags.seed,
        "participants": flags.participants,
        "stores": flags.stores,
        "channels": flags.channels,
        "workload.messages": flags.messages,
        "workload.rate_per_participant_s": flags.rate,
        "network.loss": flags.loss,
        "network.duplicate": flags.duplicate,
        "network.reorder": flags.reorder,
        "protocol.repair": flags.repair,
        "protocol.causal_history": flags.causal_history,
        "protocol.sync_interval_ms": flags.sync_interval_ms,
    }
    if flags.duration_s is not None:
        overrides["workload.duration_ms"] = round(flags.duration_s * 1000)
    if flags.drain_s is not None:
        overrides["drain_ms"] = round(flags.drain_s * 1000)
    if flags.burst_loss is not None:
        overrides.update(parse_burst(flags.burst_loss))
    if flags.latency_ms is not None:
        overrides.update(parse_latency(flags.latency_ms))
    # Repeated flags replace the file's list rather than extend it: "flags override".
    if flags.churn:
        overrides["churn"] = tuple(parse_churn(c) for c in flags.churn)
    if flags.partition:
        overrides["partitions"] = tuple(parse_partition(p) for p in flags.partition)
    if flags.profile is not None:
        given = {name: value for name, value in overrides.items() if value is not None}
        overrides = profile_overrides(flags.profile) | given
    return with_overrides(config, overrides)


def profile_overrides(name: str) -> dict[str, Any]:
    """The scenario's protocol fields that the profile called ``name`` sets."""
    try:
        chosen = profile(name)
    except LocalProtocolError as exc:
        raise ArgumentError("--profile", str(exc)) from None
    return profile_fields(chosen)


def print_summary(summary: dict[str, Any], out: Path, console: Console) -> None:
    ok = bool(summary["invariants_hold"])
    ttc = summary["time_to_consistency_ms"]
    table = Table(title="sdsync simulate", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("seed", str(summary["seed"])),
        (
            "participants / stores / channels",
            (f"{summary['participants']} / {summary['stores']} / {summary['channels']}"),
        ),
        ("content messages sent", f"{summary['messages_sent']:,}"),
        ("receive events", f"{summary['receive_events']:,}"),
        ("delivery rate", f"{summary['delivery_rate']:.4%}"),
        ("identical logs", str(summary["identical_logs"])),
        ("causal order respected", str(summary["causal_order_ok"])),
        ("duplicate deliveries", str(summary["duplicates"])),
        ("irretrievably lost", str(summary["irretrievably_lost"])),
        ("time to consistency p50 / p99", f"{pages.ms(ttc['p50'])} / {pages.ms(ttc['p99'])}"),
        ("bytes on wire per content message", pages.size(summary["bytes_per_content_message"])),
        ("false acks", str(summary["false_acks"])),
        ("virtual time", f"{summary['virtual_ms'] / 1000:,.1f} s"),
        (
            "wall time (simulation / writing)",
            (f"{summary['wall_seconds']:.2f} s / {summary['write_seconds']:.2f} s"),
        ),
        ("receive events / s", f"{summary['receive_events_per_second']:,}"),
        ("invariants", "[green]hold[/]" if ok else "[red]FAIL[/]"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    for problem in summary["problems"]:
        console.print(f"[red]problem:[/] {escape(problem)}", highlight=False)
    console.print(f"wrote {out / 'summary.json'}")
    for name, path in summary["outputs"].items():
        if name != "summary":
            console.print(f"wrote {path}")


@takes_flags
def simulate_command(
    out: Annotated[Path, typer.Option("--out", file_okay=False, help="Directory for the outputs.")],
    flags: Flags,
    events: Annotated[
        bool, typer.Option("--events/--no-events", help="Write events.parquet.")
    ] = True,
) -> None:
    """Simulate a group on a virtual clock; write summary.json, events.parquet and logs/.

    Exit code 0 when every invariant holds, 1 when one fails, 2 on bad arguments.
    """
    from sdsync.demo import InvalidScenarioError, run_simulation

    err = Console(stderr=True)
    try:
        sim_config = build_config(flags)
    except ArgumentError as exc:
        raise typer.BadParameter(str(exc), param_hint=exc.option) from None
    except LocalProtocolError as exc:
        raise fail(str(exc)) from None
    try:
        # Fail before a long run, not after it, when the outputs cannot be written.
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise fail(f"cannot create --out {out}: {exc}") from None
    try:
        summary = run_simulation(sim_config, out, events=events, console=err)
    except InvalidScenarioError as exc:
        raise fail(str(exc)) from None
    print_summary(summary, out, Console())
    raise typer.Exit(0 if summary["invariants_hold"] else 1)
