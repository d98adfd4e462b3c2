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
range of delivery rate, time to consistency p50/p99, bytes per message and false acks —
and rendered as ``OUT/evidence.md``, one PNG per sweep and ``OUT/index.html``.

On a cluster the executors need ``sdsync`` installed (the same version as the driver)
and ``OUT`` on a file system they share with the driver for the per-run summaries;
``results.parquet`` and the evidence are written by the driver.

Exit code 1 when some run breaks an invariant (or fails), 0 when all hold.
"""

from __future__ import annotations

import dataclasses
import json
import logging
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

from sdsync.pipeline import pages, plots
from sdsync.pipeline.grid import Grid, Sweep, axis_value, column_name, load_grid
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


# Result columns taken from a run's summary.json: name, Arrow type, how to read it.
METRICS: tuple[tuple[str, pa.DataType, Callable[[Summary], Any]], ...] = (
    ("invariants_hold", pa.bool_(), _field("invariants_hold")),
    ("delivery_rate", pa.float64(), _field("delivery_rate")),
    ("ttc_p50_ms", pa.float64(), _ttc("p50")),
    ("ttc_p90_ms", pa.float64(), _ttc("p90")),
    ("ttc_p99_ms", pa.float64(), _ttc("p99")),
    ("ttc_max_ms", pa.float64(), _ttc("max")),
    ("bytes_per_message", pa.float64(), _field("bytes_per_content_message")),
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
            *[(name, kind) for name, kind, _ in METRICS],
            ("error", pa.string()),
            ("summary_json", pa.string()),
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

    runs: tuple[tuple[str, tuple[str, ...], str], ...]
    """(run, sweeps, configuration JSON) by task index."""
    axes: tuple[str, ...]
    schema: pa.Schema
    runs_dir: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # The engine logs ignored bloom filters and the like; the summary counts them.
        logging.getLogger("sdsync").setLevel(logging.ERROR)
        for batch in batches:
            for index in batch.column("id").to_pylist():
                yield self._run(*self.runs[index])

    def _run(self, run: str, sweeps: tuple[str, ...], config_json: str) -> pa.RecordBatch:
        config = config_from_dict(json.loads(config_json))
        row: dict[str, Any] = {"run": run, "sweeps": list(sweeps), "error": None}
        row.update({column_name(a): axis_value(config, a) for a in self.axes})
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


def sweep(spark: SparkSession, grid_path: Path, out: Path, progress: Progress) -> dict[str, Any]:
    """Run every point of the grid, write results, evidence and ``summary.json``."""
    started = time.perf_counter()
    with progress.stage("check inputs"):
        grid = load_grid(grid_path)
    out.mkdir(parents=True, exist_ok=True)
    results = _simulate(spark, grid, out, progress)
    pq.write_table(results, out / RESULTS)
    with progress.stage("evidence"):
        frame = spark.createDataFrame(results)
        tables = {s.name: _aggregate(frame, s) for s in grid.sweeps}
        sections = _sections(grid, out, tables, results)
        title = "SDS reliability sweep"
        (out / EVIDENCE).write_text(pages.markdown(title, sections))
        pages.write_page(out, title, sections)
    rows = results.to_pylist()
    summary: dict[str, Any] = {
        "grid": str(grid_path),
        "runs": len(rows),
        "runs_breaking_invariants": [r["run"] for r in rows if not r["invariants_hold"]],
        "runs_failed": [r["run"] for r in rows if r["error"] is not None],
        "sweeps": {name: table.to_pylist() for name, table in tables.items()},
        "outputs": {
            "results": str(out / RESULTS),
            "evidence": str(out / EVIDENCE),
            "index": str(out / "index.html"),
            "runs": str(out / "runs"),
        },
        "stage_seconds": dict(progress.timings),
        "seconds": round(time.perf_counter() - started, 3),
    }
    write_summary(out, summary)
    return summary


def _simulate(spark: SparkSession, grid: Grid, out: Path, progress: Progress) -> pa.Table:
    schema = results_schema(grid)
    runner = RunPoints(
        tuple((p.run, p.sweeps, p.config_json) for p in grid.points),
        grid.axes,
        schema,
        str((out / "runs").resolve()),
    )
    n = len(grid.points)
    with progress.stage(f"simulate {n} runs", tasks=n):
        # One partition per point: one simulation per task.
        frame = spark.range(0, n, 1, numPartitions=n).mapInArrow(runner, _ddl(schema))
        table = frame.toArrow()
    return table.cast(schema).sort_by("run")


_MEASURES = {
    "delivery_rate": "delivery_rate",
    "ttc_p50": "ttc_p50_ms",
    "ttc_p99": "ttc_p99_ms",
    "bytes_per_message": "bytes_per_message",
    "false_acks": "false_acks",
    "unconverged": "unconverged_messages",
    "told_missing": "told_missing_pairs",
}


def _aggregate(results: DataFrame, sweep: Sweep) -> pa.Table:
    """Per value of the sweep's own axes: runs, invariants held, mean/min/max of each
    measure over the common axes."""
    keys = [column_name(a) for a in sweep.own]
    measures: list[Column] = []
    for name, column in _MEASURES.items():
        value = sf.col(column).cast("double")
        measures += [
            sf.avg(value).alias(f"{name}_mean"),
            sf.min(value).alias(f"{name}_min"),
            sf.max(value).alias(f"{name}_max"),
        ]
    return (
        results.where(sf.array_contains("sweeps", sweep.name))
        .groupBy(*keys)
        .agg(
            sf.count(sf.lit(1)).alias("runs"),
            sf.count_if("invariants_hold").alias("invariants_hold"),
            *measures,
        )
        .orderBy(*keys)
        .toArrow()
    )


def _label(row: dict[str, Any], own: tuple[str, ...]) -> str:
    if len(own) == 1:
        return str(row[column_name(own[0])])
    return "\n".join(f"{a.rsplit('.', 1)[-1]}={row[column_name(a)]}" for a in own)


def _mean(row: dict[str, Any], name: str, cell: Callable[[float | None], str]) -> str:
    mean, low, high = (cell(row[f"{name}_{k}"]) for k in ("mean", "min", "max"))
    return mean if low == high else f"{mean} ({low}–{high})"


def _sweep_table(rows: list[dict[str, Any]], own: tuple[str, ...]) -> pages.Table:
    return pages.Table(
        [
            *own,
            "runs",
            "invariants hold",
            "delivery rate",
            "TTC p50",
            "TTC p99",
            "bytes / msg",
            "false acks",
            "unconverged msgs",
            "told, not got",
        ],
        [
            [
                *[str(r[column_name(a)]) for a in own],
                str(r["runs"]),
                f"{r['invariants_hold']}/{r['runs']}",
                _mean(r, "delivery_rate", pages.rate),
                _mean(r, "ttc_p50", pages.ms),
                _mean(r, "ttc_p99", pages.ms),
                _mean(r, "bytes_per_message", pages.size),
                _mean(r, "false_acks", pages.count),
                _mean(r, "unconverged", pages.count),
                _mean(r, "told_missing", pages.count),
            ]
            for r in rows
        ],
        caption="mean over the runs (seeds), range in brackets when they differ; "
        "TTC over the messages that reached everyone; told, not got = (participant, message) "
        "pairs missing at the end although a causal history had named the message to them",
    )


def _panels(rows: list[dict[str, Any]]) -> list[plots.Panel]:
    def scaled(value: float | None, scale: float) -> float | None:
        return None if value is None else value / scale

    def panel(
        title: str, ylabel: str, *names: str, scale: float = 1.0, log: bool = False
    ) -> plots.Panel:
        # Several series in a panel are percentiles: the legend says which.
        mean, low, high = (
            {n.rsplit("_", 1)[-1]: [scaled(r[f"{n}_{k}"], scale) for r in rows] for n in names}
            for k in ("mean", "min", "max")
        )
        return plots.Panel(title, ylabel, mean, low, high, log)

    return [
        panel("Delivery rate", "deliveries / deliveries owed", "delivery_rate"),
        panel("Time to consistency", "s (log scale)", "ttc_p50", "ttc_p99", scale=1e3, log=True),
        panel("Bytes on the wire per content message", "kB", "bytes_per_message", scale=1e3),
        panel("False acknowledgements", "per run", "false_acks"),
    ]


def _sections(
    grid: Grid, out: Path, tables: dict[str, pa.Table], results: pa.Table
) -> list[pages.Section]:
    sections = [_grid_section(grid, results)]
    for sweep in grid.sweeps:
        own = sweep.own
        rows = tables[sweep.name].to_pylist()
        figure = f"sweep-{column_name(sweep.name.replace(' ', '-'))}.png"
        plots.panels(
            out / figure,
            f"Sweep: {sweep.name}",
            " × ".join(own),
            [_label(r, own) for r in rows],
            _panels(rows),
        )
        sections.append(
            pages.Section(
                f"Sweep: {sweep.name}",
                tables=[_sweep_table(rows, own)],
                figures=[pages.Figure(figure, f"{sweep.name}: mean, range over seeds")],
            )
        )
    sections.append(_runs_section(grid, results))
    return sections


def _grid_section(grid: Grid, results: pa.Table) -> pages.Section:
    rows = results.to_pylist()
    holding = sum(1 for r in rows if r["invariants_hold"])
    return pages.Section(
        "Grid",
        [
            *([grid.description] if grid.description else []),
            f"{grid.path}: {len(grid.sweeps)} sweeps, {len(rows)} runs "
            f"(points shared between sweeps run once); invariants hold in {holding} of them.",
            "Each sweep varies its own axes around the base scenario; the common axes "
            f"({', '.join(grid.common_axes) or 'none'}) are replicated in every sweep.",
        ],
        links=[(RESULTS, RESULTS)],
    )


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
                    "TTC p50",
                    "TTC p99",
                    "bytes / msg",
                    "false acks",
                ],
                [
                    [
                        r["run"],
                        *[str(r[column_name(a)]) for a in axes],
                        "error" if r["error"] else ("hold" if r["invariants_hold"] else "FAIL"),
                        pages.rate(r["delivery_rate"]),
                        pages.ms(r["ttc_p50_ms"]),
                        pages.ms(r["ttc_p99_ms"]),
                        pages.size(r["bytes_per_message"]),
                        pages.count(r["false_acks"]),
                    ]
                    for r in results.to_pylist()
                ],
            )
        ],
    )
