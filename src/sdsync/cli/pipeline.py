"""``sdsync pipeline …``: the Spark data pipeline's commands.

Exit codes, for every command: 0 — ran, found no problem; 1 — ran, found differences
or violations; 2 — bad input (an unreadable file, a missing column, a bad option), with
a message naming the file and the column.  Progress goes to stderr, the summary table
to stdout; the full summary is ``OUT/summary.json``.

Every command checks its inputs before it starts Spark, which takes seconds (a JVM):
a wrong path or a missing column is told at once, not after the wait.  Each job module's
``check_inputs`` does it without Spark, from the files' Parquet footers (and the grid),
and hands what it read to the job.  It checks the local inputs only, a plain path or
``file:``: ``hdfs://``, ``s3a://`` and the like are read by Spark's Hadoop file systems,
whose clients and credentials this process may not have, so Spark checks those itself and
a read error it raises is mapped to the same exit code 2.  A plain path is checked
whatever the master (a cluster, Spark Connect): the jobs read its footers in this process
anyway (reconcile plans from them), and a cluster's inputs must be on a file system this
process shares (docs/pipeline.md).

Spark is imported only when a command runs, so ``sdsync --help`` stays fast and works
without the ``spark`` extra.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sdsync.cli.errors import fail
from sdsync.cli.help import LISTED
from sdsync.pipeline import ONE_PASS_ROWS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sdsync.pipeline.progress import Progress

pipeline_app = typer.Typer(
    help="The data pipeline on Spark (local[*] by default; --master or --remote for a cluster).",
    no_args_is_help=True,
    add_completion=False,
)

Master = Annotated[
    str | None,
    typer.Option(help="Spark master URL (default local[*]; spark-submit sets its own)."),
]
Remote = Annotated[str | None, typer.Option(help="Spark Connect URL, e.g. sc://host:15002.")]

Checked = TypeVar("Checked")


def spark_missing(exc: ImportError) -> typer.Exit:
    """Exit code 2, saying which extra to install."""
    return fail(
        f"the pipeline needs the 'spark' extra: pip install 'sdsync[spark]' ({exc})",
        console=Console(stderr=True),
    )


def _run(
    master: str | None,
    remote: str | None,
    out: Path,
    check: Callable[[], Checked],
    job: Callable[[SparkSession, Progress, Checked], dict[str, Any]],
) -> dict[str, Any]:
    """Check the inputs (``check``, without Spark), start (or join) Spark, run ``job`` on
    what ``check`` returned; map bad input to exit code 2."""
    err = Console(stderr=True)
    if master and remote:
        raise fail("--master and --remote are mutually exclusive", console=err)
    try:
        from sdsync.errors import InputError
        from sdsync.pipeline.io import input_error_from_spark
        from sdsync.pipeline.progress import Progress
        from sdsync.pipeline.session import SessionOptions, build_session
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise spark_missing(exc) from None
    try:
        checked = check()
    except InputError as exc:
        raise fail(str(exc), console=err) from None
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise fail(f"cannot create --out {out}: {exc}", console=err) from None
    try:
        with err.status("starting Spark…"):
            try:
                spark, owned = build_session(SessionOptions(master=master, remote=remote))
            except ImportError as exc:  # Spark Connect's client needs more packages
                raise fail(
                    f"--remote needs pip install 'pyspark[connect]==4.3.0' ({exc})", console=err
                ) from None
        try:
            return job(spark, Progress(spark, err), checked)
        finally:
            if owned:  # a session we joined (spark-submit, tests) is not ours to stop
                spark.stop()
    except InputError as exc:
        raise fail(str(exc), console=err) from None
    except Exception as exc:
        mapped = input_error_from_spark(exc)
        if mapped is None:
            raise
        raise fail(str(mapped), console=err) from None


def _print(title: str, rows: Mapping[str, Any]) -> None:
    table = Table(title=title, show_header=False)
    for key, value in rows.items():
        table.add_row(key, escape(str(value)))
    Console().print(table)


@pipeline_app.command(cls=LISTED)
def consolidate(
    logs: Annotated[
        str, typer.Option("--logs", help="Directory (or file) of per-participant log Parquet.")
    ],
    out: Annotated[Path, typer.Option("--out", file_okay=False, help="Output directory.")],
    events: Annotated[
        str | None,
        typer.Option(
            "--events",
            help="Message metadata Parquet: channel, message_id, causal_history "
            "array<string>, optional archived boolean.",
        ),
    ] = None,
    master: Master = None,
    remote: Remote = None,
) -> None:
    """Canonical log per channel, and how each participant's log departs from it.

    Per participant: missing, extra, out-of-order and duplicate entries; with --events,
    causal gaps (dependencies in no log and no archive).

    Exit code 0 when every participant matches and nothing is lost, 1 otherwise, 2 on
    bad input.
    """

    try:
        from sdsync.pipeline.consolidate import ConsolidateInputs, check_inputs
        from sdsync.pipeline.consolidate import consolidate as run
    except ImportError as exc:
        raise spark_missing(exc) from None

    def job(spark: SparkSession, progress: Progress, checked: ConsolidateInputs) -> dict[str, Any]:
        return run(spark, logs, events, out, progress, checked=checked)

    summary = _run(master, remote, out, lambda: check_inputs(logs, events), job)
    keys = (
        "channels",
        "participants",
        "canonical_entries",
        "divergent_participants",
        "missing_entries",
        "extra_entries",
        "order_violations",
        "duplicates",
        "causal_gaps",
    )
    _print(f"consolidate → {out}", {k: summary[k] for k in keys})
    problems = summary["divergent_participants"] or summary["causal_gaps"]
    raise typer.Exit(1 if problems else 0)


@pipeline_app.command(cls=LISTED)
def reconcile(
    archive: Annotated[
        list[str],
        typer.Option(
            "--archive",
            metavar="[NAME=]DIR",
            help="A store archive (Parquet: message_hash, timestamp, …). Repeat: two or more.",
        ),
    ],
    out: Annotated[Path, typer.Option("--out", file_okay=False, help="Output directory.")],
    fingerprint_cache: Annotated[
        bool,
        typer.Option(
            "--fingerprint-cache/--no-fingerprint-cache",
            help="Write leaf fingerprints beside each archive and reuse them while the "
            "archive's files are unchanged.",
        ),
    ] = False,
    leaf_items: Annotated[
        int, typer.Option(min=1, help="Target items per leaf range in the largest archive.")
    ] = 256,
    one_pass_rows: Annotated[
        int,
        typer.Option(
            min=0,
            help="Most rows a task may hold at once to reconcile local archives in one "
            "pass over slices of time; archives needing more (row groups not clustered "
            "in time), or 0, take two passes.",
        ),
    ] = ONE_PASS_ROWS,
    master: Master = None,
    remote: Remote = None,
) -> None:
    """For every archive, each message another archive holds and it lacks (OUT/missing/).

    Exit code 0 when all archives hold the same messages, 1 otherwise, 2 on bad input.
    """
    try:  # parsing the archives needs the pipeline's modules, which need Spark
        from sdsync.pipeline.io import ParquetInput
        from sdsync.pipeline.reconcile import ReconcileOptions, check_inputs, parse_archive
        from sdsync.pipeline.reconcile import reconcile as run
    except ImportError as exc:
        raise spark_missing(exc) from None

    archives = [parse_archive(a) for a in archive]
    options = ReconcileOptions(
        leaf_items=leaf_items, fingerprint_cache=fingerprint_cache, one_pass_rows=one_pass_rows
    )

    def job(
        spark: SparkSession, progress: Progress, checked: dict[str, ParquetInput]
    ) -> dict[str, Any]:
        return run(spark, archives, out, progress, options, checked=checked)

    summary = _run(master, remote, out, lambda: check_inputs(archives), job)
    rows: dict[str, Any] = {}
    for name in summary["archives"]:
        rows[f"{name}: rows"] = summary["rows_per_archive"][name]
        rows[f"{name}: missing"] = summary["missing_per_archive"][name]
    rows["ranges compared / differing"] = (
        f"{summary['ranges_compared']} / {summary['ranges_differing']}"
    )
    rows["rows compared exactly"] = summary["rows_compared_exactly"]
    rows["method"] = summary["method"]
    _print(f"reconcile → {out}", rows)
    raise typer.Exit(1 if any(summary["missing_per_archive"].values()) else 0)


@pipeline_app.command(cls=LISTED)
def report(
    events: Annotated[
        str, typer.Option("--events", help="A simulation's events.parquet (sdsync simulate).")
    ],
    out: Annotated[Path, typer.Option("--out", file_okay=False, help="Output directory.")],
    master: Master = None,
    remote: Remote = None,
) -> None:
    """One simulation: delivery over time, time to consistency, bytes per message, lag.

    Writes Parquet tables, PNG figures, OUT/index.html and OUT/summary.json.  Exit code 0
    when every message reached every participant, 1 otherwise, 2 on bad input.
    """

    from sdsync.pipeline.pages import ms, size

    try:
        from sdsync.pipeline.io import ParquetInput
        from sdsync.pipeline.report import check_inputs
        from sdsync.pipeline.report import report as run
    except ImportError as exc:
        raise spark_missing(exc) from None

    def job(spark: SparkSession, progress: Progress, checked: ParquetInput) -> dict[str, Any]:
        return run(spark, events, out, progress, checked=checked)

    summary = _run(master, remote, out, lambda: check_inputs(events), job)
    ttc = summary["time_to_consistency_ms"]
    _print(
        f"report → {out}",
        {
            "participants": summary["participants"],
            "messages": summary["messages"],
            "delivery rate": f"{summary['delivery_rate']:.4f}",
            "unconverged messages": summary["unconverged_messages"],
            "time to consistency p50 / p99": f"{ms(ttc['p50'])} / {ms(ttc['p99'])}",
            "bytes transmitted per message": size(summary["transmitted_bytes_per_message"]),
            "report": summary["outputs"]["index"],
        },
    )
    raise typer.Exit(1 if summary["unconverged_messages"] else 0)


@pipeline_app.command(cls=LISTED)
def sweep(
    grid: Annotated[
        Path,
        typer.Option(
            "--grid", dir_okay=False, help="Grid TOML (e.g. scenarios/grids/default.toml)."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", file_okay=False, help="Output directory.")],
    reuse: Annotated[
        Path | None,
        typer.Option(
            "--reuse",
            dir_okay=False,
            help="An earlier results.parquet: its runs with the same configuration (same "
            "sdsync version, no error) are not run again.",
        ),
    ] = None,
    evidence: Annotated[
        Path | None,
        typer.Option(
            "--evidence",
            dir_okay=False,
            help="Also publish the evidence page here (e.g. docs/evidence.md), its figures "
            "and results.parquet in the folder named after it.",
        ),
    ] = None,
    master: Master = None,
    remote: Remote = None,
) -> None:
    """Simulator runs over a parameter grid, one Spark task each; evidence tables and plots.

    Writes OUT/results.parquet (one row per run, with its whole summary.json),
    OUT/runs/RUN/summary.json, OUT/evidence.md, PNG plots and OUT/index.html.  Exit code
    0 when every run keeps every invariant but those the grid expects to break
    (expect_broken), 1 otherwise, 2 on a bad grid.
    """

    try:
        from sdsync.pipeline.sweep import SweepInputs, check_inputs
        from sdsync.pipeline.sweep import sweep as run
    except ImportError as exc:
        raise spark_missing(exc) from None

    def job(spark: SparkSession, progress: Progress, checked: SweepInputs) -> dict[str, Any]:
        return run(spark, grid, out, progress, reuse=reuse, evidence=evidence, checked=checked)

    summary = _run(master, remote, out, lambda: check_inputs(grid, reuse), job)
    unexpected = summary["runs_breaking_invariants_unexpectedly"]
    rows: dict[str, Any] = {
        "runs": summary["runs"],
        "reused": summary["runs_reused"],
        "runs breaking invariants": _breaking(summary),
    }
    held = summary["runs_expected_to_break_that_held"]
    if held:  # the comparison the grid meant did not happen: worth a look, not a failure
        rows["expected to break, but held"] = f"{len(held)}: {', '.join(held)}"
    rows["evidence"] = summary["outputs"]["evidence"]
    rows["report"] = summary["outputs"]["index"]
    _print(f"sweep → {out}", rows)
    raise typer.Exit(1 if unexpected else 0)


def _breaking(summary: Mapping[str, Any]) -> str:
    """``2 unexpected: r001, r007; 3 as expected (stores = 0, protocol.repair = false):
    r042, r043, r044`` — each group of expected ones under the grid's reason."""
    unexpected = summary["runs_breaking_invariants_unexpectedly"]
    said = f"{len(unexpected)} unexpected" + (f": {', '.join(unexpected)}" if unexpected else "")
    as_expected = summary["runs_breaking_invariants_as_expected"]
    if not as_expected:
        return said
    by_reason: dict[str, list[str]] = {}
    for run in as_expected:
        by_reason.setdefault(summary["runs_expected_to_break"][run], []).append(run)
    groups = "; ".join(f"({why}): {', '.join(runs)}" for why, runs in by_reason.items())
    return f"{said}; {len(as_expected)} as expected {groups}"
