"""``sdsync pipeline sweep``: simulator runs over a parameter grid, as Spark tasks.

Theory of operation
-------------------
The grid (:mod:`sdsync.pipeline.grid`) becomes ``spark.range(n)`` in *n* partitions —
one simulation per task, so Spark spreads the runs over every executor core and a
failed executor's runs are retried elsewhere.  ``mapInArrow`` hands each task its
index as an Arrow batch; the task runs that point's :class:`~sdsync.sim.engine.Simulation`
(no event table: only the verdict and the metrics are needed), writes the run's
``summary.json`` under ``OUT/runs/RUN/`` and returns one Arrow row: the grid values, the
metrics, and the whole summary as JSON.  Points are numbered costliest first, and Spark
starts tasks in partition order, so the long runs do not end up last on one core.

The rows come back to the driver (one per run: small) and are written to
``OUT/results.parquet``.  The evidence is built from them with Spark aggregations —
per sweep, grouped by the sweep's own axes, over the common ones (the seeds): mean and
range of delivery (overall, and of messages to everyone within 1 and 10 minutes and
ever), time to consistency p50/p99, bytes per message by kind and the bloom filters'
share of them — plus the grid's headline pivots, and rendered as ``OUT/evidence.md``,
one PNG per sweep and ``OUT/index.html``.  ``--evidence PATH`` writes the same page to
``PATH`` as well (a docs page), with its figures and ``results.parquet`` in a folder
named after it, so the published numbers always come from the file beside them.

A run is identified by its configuration (the same seed replays it bit for bit), so a
sweep may **reuse** the rows of an earlier ``results.parquet`` (``--reuse FILE``): runs
with the same configuration, made by the same sdsync version without error, are not run
again.  That resumes an interrupted sweep, regenerates the evidence of a finished one in
seconds, and lets a grid's costly slices be run once.

On a cluster the executors need ``sdsync`` installed (the same version as the driver)
and ``OUT`` on a file system they share with the driver for the per-run summaries;
``results.parquet`` and the evidence are written by the driver.

A grid may declare runs **expected to break** the invariants (``expect_broken``, the
comparisons: no store and no SDS-R under loss).  Each result row says whether it was
(``expected_to_break``); the summary lists the runs breaking invariants unexpectedly and
as expected apart, and the runs expected to break that held.

Exit code 1 when some run breaks an invariant unexpectedly (or fails), 0 otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as sf

from sdsync import __version__
from sdsync.errors import InputError
from sdsync.pipeline import pages, plots
from sdsync.pipeline.grid import (
    Grid,
    Headline,
    Point,
    Sweep,
    column_name,
    describe,
    load_grid,
)
from sdsync.pipeline.io import write_summary
from sdsync.pipeline.progress import Progress
from sdsync.sim.config import config_from_dict
from sdsync.sim.engine import Simulation

RESULTS = "results.parquet"
EVIDENCE = "evidence.md"

Summary = dict[str, Any]


def _ttc(key: str) -> Callable[[Summary], Any]:
    return lambda s: s["time_to_consistency_ms"][key]


def _sent(kind: str) -> Callable[[Summary], Any]:
    return lambda s: s["transmissions"][kind]


def _field(key: str) -> Callable[[Summary], Any]:
    return lambda s: s[key]


def _within(key: str) -> Callable[[Summary], Any]:
    return lambda s: s["delivered_to_everyone"][key]


def _per_message(kind: str) -> Callable[[Summary], Any]:
    def read(s: Summary) -> float:
        sent = s["messages_sent"]
        return s["bytes_by_kind"].get(kind, 0) / sent if sent else 0.0

    return read


# Result columns taken from a run's summary.json: name, Arrow type, how to read it.
METRICS: tuple[tuple[str, pa.DataType, Callable[[Summary], Any]], ...] = (
    ("invariants_hold", pa.bool_(), _field("invariants_hold")),
    ("delivery_rate", pa.float64(), _field("delivery_rate")),
    ("ttc_p50_ms", pa.float64(), _ttc("p50")),
    ("ttc_p90_ms", pa.float64(), _ttc("p90")),
    ("ttc_p99_ms", pa.float64(), _ttc("p99")),
    ("ttc_max_ms", pa.float64(), _ttc("max")),
    ("bytes_per_message", pa.float64(), _field("bytes_per_content_message")),
    ("delivered_1min", pa.float64(), _within("within_1_min")),
    ("delivered_10min", pa.float64(), _within("within_10_min")),
    ("delivered_ever", pa.float64(), _within("ever")),
    ("unlearnable_messages", pa.int64(), _field("unlearnable_messages")),
    ("content_bytes_per_message", pa.float64(), _per_message("content")),
    ("resend_bytes_per_message", pa.float64(), _per_message("resend")),
    ("sync_bytes_per_message", pa.float64(), _per_message("sync")),
    ("repair_bytes_per_message", pa.float64(), _per_message("repair")),
    ("store_bytes_per_message", pa.float64(), _per_message("store_query")),
    ("bloom_share", pa.float64(), _field("bloom_share")),
    ("bloom_ignored", pa.int64(), lambda s: sum(s["bloom_ignored"].values())),
    ("false_acks", pa.int64(), _field("false_acks")),
    ("messages_sent", pa.int64(), _field("messages_sent")),
    ("unconverged_messages", pa.int64(), _field("unconverged_messages")),
    ("missing_pairs", pa.int64(), _field("missing_pairs")),
    ("told_missing_pairs", pa.int64(), _field("told_missing_pairs")),
    ("irretrievably_lost", pa.int64(), _field("irretrievably_lost")),
    ("duplicates", pa.int64(), _field("duplicates")),
    ("identical_logs", pa.bool_(), _field("identical_logs")),
    ("receive_events", pa.int64(), _field("receive_events")),
    ("store_queries", pa.int64(), _field("store_queries")),
    ("resends", pa.int64(), _sent("resend")),
    ("syncs", pa.int64(), _sent("sync")),
    ("repairs", pa.int64(), _sent("repair")),
    ("virtual_ms", pa.int64(), _field("virtual_ms")),
    ("wall_seconds", pa.float64(), _field("wall_seconds")),
)

_SPARK_TYPES = {
    pa.bool_(): "boolean",
    pa.int64(): "bigint",
    pa.float64(): "double",
    pa.string(): "string",
    pa.list_(pa.string()): "array<string>",
}


def _axis_type(grid: Grid, axis: str) -> pa.DataType:
    """The Arrow type of an axis, from the values its points actually hold."""
    values = [p.value(axis) for p in grid.points]
    if all(isinstance(v, bool) for v in values):
        return pa.bool_()
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return pa.int64()
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return pa.float64()
    return pa.string()


def results_schema(grid: Grid) -> pa.Schema:
    return pa.schema(
        [
            ("run", pa.string()),
            ("sweeps", pa.list_(pa.string())),
            *[(column_name(a), _axis_type(grid, a)) for a in grid.axes],
            ("expected_to_break", pa.bool_()),
            *[(name, kind) for name, kind, _ in METRICS],
            ("error", pa.string()),
            ("summary_json", pa.string()),
            ("config_json", pa.string()),
            ("sdsync_version", pa.string()),
        ]
    )


def _ddl(schema: pa.Schema) -> str:
    return ", ".join(f"`{f.name}` {_SPARK_TYPES[f.type]}" for f in schema)


# -- executors --------------------------------------------------------------------------


@dataclass(frozen=True)
class RunPoints:
    """The ``mapInArrow`` function: one grid point per input row, one result row out.

    Pickled to the executors, so it carries plain data: the points' configurations as
    JSON, the axes, and where to put each run's summary.json.
    """

    runs: tuple[tuple[str, tuple[str, ...], str, str], ...]
    """(run, sweeps, configuration JSON, the point's columns as JSON) by task index."""
    schema: pa.Schema
    runs_dir: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # The engine logs ignored bloom filters and the like; the summary counts them.
        logging.getLogger("sdsync").setLevel(logging.ERROR)
        for batch in batches:
            for index in batch.column("id").to_pylist():
                yield self._run(*self.runs[index])

    def _run(
        self, run: str, sweeps: tuple[str, ...], config_json: str, values: str
    ) -> pa.RecordBatch:
        config = config_from_dict(json.loads(config_json))
        row: dict[str, Any] = {
            "run": run,
            "sweeps": list(sweeps),
            "error": None,
            "config_json": config_json,
            "sdsync_version": __version__,
        }
        row.update(json.loads(values))
        try:
            sim = Simulation(config, record_events=False)
            sim.run()
            summary = sim.recorder.summary()
        except Exception:  # a bug in one run must not cost the others
            row["error"] = traceback.format_exc(limit=5)
            row["invariants_hold"] = False
            return pa.RecordBatch.from_pylist([row], schema=self.schema)
        summary["config"] = dataclasses.asdict(config)
        summary["run"] = run
        row.update({name: read(summary) for name, _, read in METRICS})
        row["summary_json"] = json.dumps(summary, sort_keys=False)
        write_summary(Path(self.runs_dir) / run, summary)
        return pa.RecordBatch.from_pylist([row], schema=self.schema)


# -- driver -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepInputs:
    """The grid and the rows ``--reuse`` offers, read and checked without Spark."""

    grid: Grid
    previous: dict[str, dict[str, Any]]
    """Reusable result rows by configuration JSON."""


def check_inputs(grid_path: Path, reuse: Path | None = None) -> SweepInputs:
    """Read and validate the grid (every point, the headlines) and the ``reuse`` file;
    InputError naming the file. Needs no Spark: run it before starting one."""
    grid = load_grid(grid_path)
    _check_headlines(grid)
    previous = _reusable(reuse, results_schema(grid)) if reuse is not None else {}
    return SweepInputs(grid, previous)


def sweep(
    spark: SparkSession,
    grid_path: Path,
    out: Path,
    progress: Progress,
    *,
    reuse: Path | None = None,
    evidence: Path | None = None,
    checked: SweepInputs | None = None,
) -> dict[str, Any]:
    """Run every point of the grid (but those ``reuse`` has), write results, evidence
    and ``summary.json``; ``evidence``: also publish the page there.  ``checked``: what
    :func:`check_inputs` returned for these inputs (None: check them now)."""
    started = time.perf_counter()
    with progress.stage("check inputs"):
        inputs = checked or check_inputs(grid_path, reuse)
    grid, previous = inputs.grid, inputs.previous
    out.mkdir(parents=True, exist_ok=True)
    results = _simulate(spark, grid, out, progress, previous)
    pq.write_table(results, out / RESULTS)
    with progress.stage("evidence"):
        frame = spark.createDataFrame(results.drop_columns(["summary_json"]))
        tables = {s.name: _aggregate(frame, s) for s in grid.sweeps}
        pivots = [_pivot(frame, grid, h) for h in grid.headlines]
        sections = _sections(grid, out, tables, pivots, results)
        title = "SDS reliability sweep"
        (out / EVIDENCE).write_text(pages.markdown(title, sections))
        pages.write_page(out, title, sections)
        if evidence is not None:
            _publish(evidence, out, title, sections)
    rows = results.to_pylist()
    summary: dict[str, Any] = {
        "grid": str(grid_path),
        "runs": len(rows),
        "runs_reused": sum(1 for r in rows if r["config_json"] in previous),
        **_verdicts(grid, rows),
        "runs_failed": [r["run"] for r in rows if r["error"] is not None],
        # Wall times differ from run to run: the page shows them, the summary keeps answers.
        "sweeps": {
            name: table.drop_columns(
                [c for c in table.column_names if c.startswith("wall_seconds")]
            ).to_pylist()
            for name, table in tables.items()
        },
        "outputs": {
            "results": str(out / RESULTS),
            "evidence": str(out / EVIDENCE),
            "index": str(out / "index.html"),
            "runs": str(out / "runs"),
            **({"published": str(evidence)} if evidence is not None else {}),
        },
        "stage_seconds": dict(progress.timings),
        "seconds": round(time.perf_counter() - started, 3),
    }
    write_summary(out, summary)
    return summary


def _point_columns(grid: Grid, point: Point) -> dict[str, Any]:
    """What a result row takes from the grid: the point's axis values, and whether it is
    expected to break (from today's grid, also for a reused row)."""
    columns: dict[str, Any] = {column_name(a): point.value(a) for a in grid.axes}
    columns["expected_to_break"] = point.expected_to_break
    return columns


def _verdicts(grid: Grid, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Which runs broke the invariants, told apart by whether the grid expected it.

    A run that raised broke nothing as expected: it is a bug, whatever the grid says.
    ``runs_breaking_invariants`` (every run that broke them) is kept for the readers of
    earlier summaries."""
    why = {p.run: p.expected_break for p in grid.points if p.expected_break is not None}
    broken = [r["run"] for r in rows if not r["invariants_hold"]]
    failed = {r["run"] for r in rows if r["error"] is not None}
    as_expected = [run for run in broken if run in why and run not in failed]
    return {
        "runs_breaking_invariants": broken,
        "runs_breaking_invariants_unexpectedly": [
            run for run in broken if run not in why or run in failed
        ],
        "runs_breaking_invariants_as_expected": as_expected,
        "runs_expected_to_break": why,
        "runs_expected_to_break_that_held": [
            r["run"] for r in rows if r["run"] in why and r["invariants_hold"]
        ],
    }


def _reusable(path: Path, schema: pa.Schema) -> dict[str, dict[str, Any]]:
    """The error-free rows of an earlier results file made by this version, by
    configuration; nothing (said on stderr) when its columns are not today's."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"{path}: cannot read earlier results ({exc})", path=str(path)) from None
    wanted = {name for name, _, _ in METRICS} | {"config_json", "sdsync_version"}
    if not wanted <= set(table.column_names):
        logging.getLogger("sdsync.pipeline").warning(
            "%s: results of another sdsync version (columns differ): nothing reused", path
        )
        return {}
    return {
        row["config_json"]: row
        for row in table.to_pylist()
        if row["error"] is None and row["sdsync_version"] == __version__
    }


def _simulate(
    spark: SparkSession,
    grid: Grid,
    out: Path,
    progress: Progress,
    previous: dict[str, dict[str, Any]],
) -> pa.Table:
    schema = results_schema(grid)
    fresh = [p for p in grid.points if p.config_json not in previous]
    kept = [
        {
            **previous[p.config_json],
            "run": p.run,
            "sweeps": list(p.sweeps),
            **_point_columns(grid, p),
        }
        for p in grid.points
        if p.config_json in previous
    ]
    runner = RunPoints(
        tuple((p.run, p.sweeps, p.config_json, json.dumps(_point_columns(grid, p))) for p in fresh),
        schema,
        str((out / "runs").resolve()),
    )
    for row in kept:  # runs/ holds every run's summary, reused or not
        write_summary(out / "runs" / row["run"], json.loads(row["summary_json"]))
    n = len(fresh)
    reused = f" ({len(kept)} reused)" if kept else ""
    tables = [pa.Table.from_pylist(kept, schema=schema)]
    with progress.stage(f"simulate {n} runs{reused}", tasks=n):
        if n:
            # One partition per point: one simulation per task.
            frame = spark.range(0, n, 1, numPartitions=n).mapInArrow(runner, _ddl(schema))
            tables.append(frame.toArrow().cast(schema))
    return pa.concat_tables(tables).sort_by("run")


# Measures aggregated per sweep point: name → (result column, how a cell shows it).
Cell = Callable[[float | None], str]
_MEASURES: dict[str, tuple[str, Cell]] = {
    "delivery_rate": ("delivery_rate", pages.rate),
    "delivered_1min": ("delivered_1min", pages.rate),
    "delivered_10min": ("delivered_10min", pages.rate),
    "delivered_ever": ("delivered_ever", pages.rate),
    "ttc_p50": ("ttc_p50_ms", pages.ms),
    "ttc_p99": ("ttc_p99_ms", pages.ms),
    "unlearnable": ("unlearnable_messages", pages.count),
    "told_missing": ("told_missing_pairs", pages.count),
    "false_acks": ("false_acks", pages.count),
    "bytes_relay": ("bytes_per_message", pages.size),
    "bytes_content": ("content_bytes_per_message", pages.size),
    "bytes_resend": ("resend_bytes_per_message", pages.size),
    "bytes_sync": ("sync_bytes_per_message", pages.size),
    "bytes_repair": ("repair_bytes_per_message", pages.size),
    "bytes_store": ("store_bytes_per_message", pages.size),
    "bloom_share": ("bloom_share", pages.share),
    "wall_seconds": ("wall_seconds", pages.count),
}
MEASURES = {column: cell for column, cell in _MEASURES.values()}
"""Result columns a headline may show, and how."""


def _check_headlines(grid: Grid) -> None:
    for headline in grid.headlines:
        if headline.measure not in MEASURES:
            known = ", ".join(MEASURES)
            raise InputError(
                f"{grid.path}: headline {headline.title!r}: unknown measure "
                f"{headline.measure!r} (known: {known})",
                path=grid.path,
            )


def _stats(column: str, name: str) -> list[Column]:
    value = sf.col(column).cast("double")
    return [
        sf.avg(value).alias(f"{name}_mean"),
        sf.min(value).alias(f"{name}_min"),
        sf.max(value).alias(f"{name}_max"),
    ]


def _aggregate(results: DataFrame, sweep: Sweep) -> pa.Table:
    """Per value of the sweep's own axes: runs, invariants held, mean/min/max of each
    measure over the common axes, and the simulation time the point took."""
    keys = [column_name(a) for a in sweep.own]
    measures = [c for name, (column, _) in _MEASURES.items() for c in _stats(column, name)]
    return (
        results.where(sf.array_contains("sweeps", sweep.name))
        .groupBy(*keys)
        .agg(
            sf.count(sf.lit(1)).alias("runs"),
            sf.count_if("invariants_hold").alias("invariants_hold"),
            sf.count_if("expected_to_break").alias("expected_to_break"),
            sf.sum("wall_seconds").alias("wall_seconds_total"),
            *measures,
        )
        .orderBy(*keys)
        .toArrow()
    )


def _pivot(results: DataFrame, grid: Grid, headline: Headline) -> pages.Table:
    """Rows × columns of one sweep's runs: the measure's mean (range over the rest)."""
    rows, columns = column_name(headline.rows), column_name(headline.columns)
    chosen = results.where(sf.array_contains("sweeps", headline.sweep))
    for axis, value in headline.where:
        chosen = chosen.where(sf.col(column_name(axis)) == sf.lit(value))
    cells = {
        (r[rows], r[columns]): r
        for r in chosen.groupBy(rows, columns)
        .agg(sf.count(sf.lit(1)).alias("runs"), *_stats(headline.measure, "m"))
        .toArrow()
        .to_pylist()
    }
    row_values = sorted({k[0] for k in cells}, key=_order)
    column_values = sorted({k[1] for k in cells}, key=_order)
    cell = MEASURES[headline.measure]
    sweep = next(s for s in grid.sweeps if s.name == headline.sweep)
    fixed = dict(headline.where)
    rest = [a for a in sweep.axes if a not in (headline.rows, headline.columns, *fixed)]
    only = "".join(f", {a} = {v}" for a, v in headline.where)
    return pages.Table(
        [f"{headline.rows} ↓ {headline.columns} →", *(str(v) for v in column_values)],
        [
            [
                str(r),
                *(
                    _mean(cells[(r, c)], "m", cell) if (r, c) in cells else "—"
                    for c in column_values
                ),
            ]
            for r in row_values
        ],
        caption=f"{headline.title}: {headline.measure}, mean over "
        f"{', '.join(rest) or 'the runs'} (range in brackets when they differ); "
        f"sweep '{headline.sweep}'{only}",
    )


def _order(value: Any) -> tuple[int, Any]:
    """Numbers in numeric order, then names (preset values) as the grid lists them."""
    return (0, value) if isinstance(value, int | float) else (1, str(value))


def _label(row: dict[str, Any], own: tuple[str, ...]) -> str:
    """The point's values, in the order of the axes the figure's x label names."""
    return "/".join(str(row[column_name(a)]) for a in own)


def _mean(row: dict[str, Any], name: str, cell: Cell) -> str:
    mean, low, high = (cell(row[f"{name}_{k}"]) for k in ("mean", "min", "max"))
    return mean if low == high else f"{mean} ({low}–{high})"


def _columns(row: dict[str, Any], names: tuple[str, ...]) -> list[str]:
    return [_mean(row, name, _MEASURES[name][1]) for name in names]


_DELIVERY = (
    "delivery_rate",
    "delivered_1min",
    "delivered_10min",
    "delivered_ever",
    "ttc_p50",
    "ttc_p99",
    "unlearnable",
    "told_missing",
    "false_acks",
)
_BYTES = (
    "bytes_relay",
    "bytes_content",
    "bytes_resend",
    "bytes_sync",
    "bytes_repair",
    "bytes_store",
    "bloom_share",
)


def _sweep_tables(rows: list[dict[str, Any]], own: tuple[str, ...]) -> list[pages.Table]:
    keys = [[str(r[column_name(a)]) for a in own] for r in rows]
    delivery = pages.Table(
        [
            *own,
            "runs",
            "invariants hold",
            "delivery rate",
            "to all ≤ 1 min",
            "to all ≤ 10 min",
            "to all, ever",
            "TTC p50",
            "TTC p99",
            "unlearnable msgs",
            "told, not got",
            "false acks",
        ],
        [
            [*key, str(r["runs"]), _holding(r), *_columns(r, _DELIVERY)]
            for key, r in zip(keys, rows, strict=True)
        ],
        caption="Delivery: mean over the runs (seeds), range in brackets when they differ. "
        "Invariants hold: in how many of the runs, and how many the grid expects to break "
        "them (expect_broken). "
        "Delivery rate = deliveries / deliveries owed; to all = share of messages that "
        "reached every participant within 1 or 10 minutes of being sent, or by the end; "
        "TTC over the messages that reached everyone; unlearnable = messages that some "
        "participant could not have learnt of without a store (no copy and no causal "
        "history naming them reached it); told, not got = (participant, message) pairs "
        "missing at the end although a causal history had named the message to them",
    )
    volume = pages.Table(
        [*own, "relay / msg", "content", "resend", "sync", "repair", "store query", "bloom share"],
        [[*key, *_columns(r, _BYTES)] for key, r in zip(keys, rows, strict=True)],
        caption="Bytes per content message, mean over the runs: relay = every copy on the "
        "relay network (content, resend, sync and repair broadcasts, one copy per "
        "receiver); store query = requests and responses of by-hint queries and "
        "catch-ups (not part of relay); bloom share = the bloom filters' part of the "
        "relay bytes",
    )
    return [delivery, volume]


def _holding(row: dict[str, Any]) -> str:
    """``3/3``, or ``0/3 (3 expected to break)``."""
    held = f"{row['invariants_hold']}/{row['runs']}"
    expected = row["expected_to_break"]
    return f"{held} ({expected} expected to break)" if expected else held


def _panels(rows: list[dict[str, Any]]) -> list[plots.Panel]:
    def scaled(value: float | None, scale: float) -> float | None:
        return None if value is None else value / scale

    def panel(
        title: str, ylabel: str, *names: str, scale: float = 1.0, log: bool = False
    ) -> plots.Panel:
        # Several series in a panel: the legend says which (the name's last part).
        mean, low, high = (
            {n.rsplit("_", 1)[-1]: [scaled(r[f"{n}_{k}"], scale) for r in rows] for n in names}
            for k in ("mean", "min", "max")
        )
        return plots.Panel(title, ylabel, mean, low, high, log)

    return [
        panel(
            "Messages delivered to everyone",
            "share of messages",
            "delivered_1min",
            "delivered_10min",
            "delivered_ever",
        ),
        panel("Time to consistency", "s (log scale)", "ttc_p50", "ttc_p99", scale=1e3, log=True),
        panel(
            "Bytes per content message",
            "kB (log scale)",
            "bytes_relay",
            "bytes_store",
            scale=1e3,
            log=True,
        ),
        panel("Bloom filters' share of relay bytes", "share", "bloom_share"),
    ]


def _sections(
    grid: Grid,
    out: Path,
    tables: dict[str, pa.Table],
    pivots: list[pages.Table],
    results: pa.Table,
) -> list[pages.Section]:
    sections = [_grid_section(grid, results)]
    if pivots:
        sections.append(pages.Section("Headlines", tables=pivots))
    for sweep in grid.sweeps:
        own = sweep.own
        rows = tables[sweep.name].to_pylist()
        figure = f"sweep-{column_name(sweep.name.replace(' ', '-'))}.png"
        plots.panels(
            out / figure,
            f"Sweep: {sweep.name}",
            " / ".join(a.rsplit(".", 1)[-1] for a in own),
            [_label(r, own) for r in rows],
            _panels(rows),
        )
        sections.append(
            pages.Section(
                f"Sweep: {sweep.name}",
                paragraphs=[_cost_line(rows)],
                tables=_sweep_tables(rows, own),
                figures=[pages.Figure(figure, f"{sweep.name}: mean, range over seeds")],
            )
        )
    sections.append(_runs_section(grid, results))
    return sections


def _cost_line(rows: list[dict[str, Any]]) -> str:
    runs = sum(r["runs"] for r in rows)
    total = sum(r["wall_seconds_total"] or 0.0 for r in rows)
    longest = max((r["wall_seconds_max"] or 0.0 for r in rows), default=0.0)
    return (
        f"{runs} runs, {total / 60:,.1f} minutes of simulation on one core in all "
        f"(the longest run {longest:,.0f} s)."
    )


def _publish(evidence: Path, out: Path, title: str, sections: list[pages.Section]) -> None:
    """The page at ``evidence``, its figures and results.parquet in the folder beside it
    named after it (docs/evidence.md → docs/evidence/)."""
    folder = evidence.with_suffix("")
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out / RESULTS, folder / RESULTS)
    moved = []
    for section in sections:
        for figure in section.figures:
            shutil.copyfile(out / figure.path, folder / figure.path)
        moved.append(
            dataclasses.replace(
                section,
                figures=[
                    pages.Figure(f"{folder.name}/{f.path}", f.caption) for f in section.figures
                ],
                links=[(text, f"{folder.name}/{path}") for text, path in section.links],
            )
        )
    evidence.write_text(pages.markdown(title, moved))


def _grid_section(grid: Grid, results: pa.Table) -> pages.Section:
    rows = results.to_pylist()
    holding = sum(1 for r in rows if r["invariants_hold"])
    return pages.Section(
        "Grid",
        [
            *([grid.description] if grid.description else []),
            f"{grid.path}: {len(grid.sweeps)} sweeps, {len(rows)} runs "
            f"(points shared between sweeps run once); invariants hold in {holding} of them.",
            *_expected_line(grid, rows),
            "Each sweep varies its own axes around the base scenario; the common axes "
            f"({', '.join(grid.common_axes) or 'none'}) are replicated in every sweep.",
        ],
        links=[(RESULTS, RESULTS)],
    )


def _expected_line(grid: Grid, rows: list[dict[str, Any]]) -> list[str]:
    """What the grid expects to break, and how that went; nothing if it expects none."""
    expected = [
        f"sweep '{s.name}': {describe(match)}" for s in grid.sweeps for match in s.expect_broken
    ]
    if not expected:
        return []
    verdicts = _verdicts(grid, rows)
    held = verdicts["runs_expected_to_break_that_held"]
    return [
        f"Expected to break the invariants (the comparisons): {'; '.join(expected)}. "
        f"{len(verdicts['runs_breaking_invariants_as_expected'])} runs break them as "
        f"expected, {len(verdicts['runs_breaking_invariants_unexpectedly'])} unexpectedly"
        + (f"; expected to break but held: {', '.join(held)}." if held else ".")
    ]


def _invariants(row: dict[str, Any]) -> str:
    if row["error"]:
        return "error"
    verdict = "hold" if row["invariants_hold"] else "FAIL"
    # A reader scanning for FAIL must see at once which ones the grid meant.
    return f"{verdict} (expected to break)" if row["expected_to_break"] else verdict


def _runs_section(grid: Grid, results: pa.Table) -> pages.Section:
    axes = grid.axes
    return pages.Section(
        "All runs",
        tables=[
            pages.Table(
                [
                    "run",
                    *axes,
                    "invariants",
                    "delivery rate",
                    "to all, ever",
                    "TTC p50",
                    "TTC p99",
                    "relay / msg",
                    "store / msg",
                    "wall",
                ],
                [
                    [
                        r["run"],
                        *[str(r[column_name(a)]) for a in axes],
                        _invariants(r),
                        pages.rate(r["delivery_rate"]),
                        pages.rate(r["delivered_ever"]),
                        pages.ms(r["ttc_p50_ms"]),
                        pages.ms(r["ttc_p99_ms"]),
                        pages.size(r["bytes_per_message"]),
                        pages.size(r["store_bytes_per_message"]),
                        f"{r['wall_seconds']:,.0f} s" if r["wall_seconds"] is not None else "—",
                    ]
                    for r in results.to_pylist()
                ],
            )
        ],
    )
