"""The pipeline commands without Spark: exit code 2 and the extra to install, never a
traceback; and bad input refused with exit code 2, naming the file and the column, before
Spark starts (issue 39: it took a JVM's start-up, about 14 s, to say a path was wrong)."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testdeps import require
from typer.testing import CliRunner

from sdsync.cli.main import app


@pytest.mark.parametrize(
    "args",
    [
        ["reconcile", "--archive", "a=/nonexistent/a", "--archive", "b=/nonexistent/b"],
        ["report", "--events", "/nonexistent/events.parquet"],
    ],
    ids=["reconcile", "report"],
)
def test_a_pipeline_command_without_spark_names_the_extra(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A module set to None in sys.modules fails to import, as a missing package does (all
    # of pyspark's: a cached submodule would import without its parent); the pipeline's own
    # modules are dropped so they are imported again, without Spark.
    for name in ["pyspark", *(m for m in sys.modules if m.startswith("pyspark."))]:
        monkeypatch.setitem(sys.modules, name, None)
    for name in [m for m in sys.modules if m.startswith("sdsync.pipeline.")]:
        monkeypatch.delitem(sys.modules, name)
    result = CliRunner().invoke(app, ["pipeline", *args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "pip install 'sdsync[spark]'" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


# -- bad input is told before Spark starts ---------------------------------------------------

BAD_GRID_SWEEP = '[[sweep]]\nname = "x"\n[sweep.axes]\nstores = [0, 1]\n'


class SparkStartedError(Exception):
    """Raised by the stand-in for every way a command could start (or join) Spark."""


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Spark's entry points replaced by a stand-in that records the call and raises: a
    command that reaches them exits 1 with SparkStartedError, not 2. The targets are named as
    strings, so that this module starts no process to tests/noprocess.py's reading."""
    require("pyspark", "the pipeline needs the 'spark' extra")
    calls: list[str] = []

    def refuse(*args: object, **kwargs: object) -> None:
        calls.append("Spark")
        raise SparkStartedError

    monkeypatch.setattr("sdsync.pipeline.session.build_session", refuse)
    monkeypatch.setattr("pyspark.sql.SparkSession.Builder.getOrCreate", refuse)
    return calls


def write(path: Path, table: pa.Table) -> str:
    pq.write_table(table, path)
    return str(path)


def folder(path: Path, table: pa.Table) -> str:
    """A folder of one Parquet file, ``part-0.parquet``, as Spark writes them."""
    path.mkdir()
    write(path / "part-0.parquet", table)
    return str(path)


def inputs(root: Path) -> dict[str, str]:
    """Good and bad inputs of every kind, by name."""
    from sdsync.sim.output import EVENTS_SCHEMA, LOG_SCHEMA, MESSAGES_SCHEMA
    from sdsync.store.schema import ARCHIVE_SCHEMA

    (root / "empty").mkdir()
    (root / "not-parquet").mkdir()
    (root / "not-parquet" / "part-0.parquet").write_text("not Parquet")
    return {
        "missing": str(root / "absent"),
        "empty": str(root / "empty"),
        "not-parquet": str(root / "not-parquet"),
        "archive": folder(root / "archive", ARCHIVE_SCHEMA.empty_table()),
        "archive-no-timestamp": folder(
            root / "archive-no-timestamp",
            pa.table({"message_hash": pa.array([b"h" * 32])}),
        ),
        "archive-text-timestamp": folder(
            root / "archive-text-timestamp",
            pa.table({"message_hash": pa.array([b"h" * 32]), "timestamp": ["yesterday"]}),
        ),
        "logs": folder(root / "logs", LOG_SCHEMA.empty_table()),
        "logs-no-lamport": folder(
            root / "logs-no-lamport",
            LOG_SCHEMA.empty_table().drop_columns(["lamport"]),
        ),
        "messages-no-history": write(
            root / "messages.parquet",
            MESSAGES_SCHEMA.empty_table().drop_columns(["causal_history"]),
        ),
        "events-no-kind": write(
            root / "events.parquet", EVENTS_SCHEMA.empty_table().drop_columns(["kind"])
        ),
    }


def grid(root: Path, name: str, text: str) -> str:
    path = root / name
    path.write_text(text)
    return str(path)


# (command line with {name} for the inputs above, what the message must name)
BAD_INPUTS = {
    "reconcile: a missing archive": (
        "reconcile --archive {missing} --archive {archive}",
        ["{missing}", "no such file"],
    ),
    "reconcile: an empty folder": (
        "reconcile --archive {archive} --archive {empty}",
        ["{empty}", "no Parquet files"],
    ),
    "reconcile: not Parquet": (
        "reconcile --archive {archive} --archive {not-parquet}",
        ["{not-parquet}/part-0.parquet", "not a readable Parquet file"],
    ),
    "reconcile: a missing column": (
        "reconcile --archive {archive} --archive {archive-no-timestamp}",
        ["{archive-no-timestamp}/part-0.parquet", "missing column 'timestamp'"],
    ),
    "reconcile: a column of the wrong type": (
        "reconcile --archive {archive} --archive {archive-text-timestamp}",
        ["{archive-text-timestamp}/part-0.parquet", "column 'timestamp' is string"],
    ),
    "reconcile: one archive": ("reconcile --archive {archive}", ["two to 63 --archive"]),
    "reconcile: one name twice": (
        "reconcile --archive a={archive} --archive a={archive}",
        ["a is repeated"],
    ),
    "consolidate: a missing folder": ("consolidate --logs {missing}", ["{missing}"]),
    "consolidate: a missing column": (
        "consolidate --logs {logs-no-lamport}",
        ["{logs-no-lamport}/part-0.parquet", "missing column 'lamport'"],
    ),
    "consolidate: --events missing": (
        "consolidate --logs {logs} --events {missing}",
        ["{missing}", "no such file"],
    ),
    "consolidate: --events without a column": (
        "consolidate --logs {logs} --events {messages-no-history}",
        ["{messages-no-history}", "missing column 'causal_history'"],
    ),
    "report: a missing file": ("report --events {missing}", ["{missing}", "no such file"]),
    "report: not Parquet": (
        "report --events {not-parquet}",
        ["{not-parquet}/part-0.parquet", "not a readable Parquet file"],
    ),
    "report: a missing column": (
        "report --events {events-no-kind}",
        ["{events-no-kind}", "missing column 'kind'"],
    ),
    "sweep: a missing grid": ("sweep --grid {missing}", ["{missing}", "cannot read the grid"]),
    "sweep: a bad grid": ("sweep --grid {grid-typo}", ["{grid-typo}", "lozz"]),
    "sweep: a bad expect_broken": (
        "sweep --grid {grid-expect}",
        ["{grid-expect}", "'protocol.repair' is not an axis"],
    ),
    "sweep: an unknown headline measure": (
        "sweep --grid {grid-measure}",
        ["{grid-measure}", "unknown measure 'speed'"],
    ),
    "sweep: an unreadable --reuse": (
        "sweep --grid {grid} --reuse {not-parquet}/part-0.parquet",
        ["{not-parquet}/part-0.parquet", "cannot read earlier results"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_exits_2_naming_it_before_spark_starts(
    case: str, tmp_path: Path, no_spark: list[str]
) -> None:
    names = inputs(tmp_path)
    names["grid"] = grid(tmp_path, "grid.toml", BAD_GRID_SWEEP)
    names["grid-typo"] = grid(
        tmp_path, "typo.toml", BAD_GRID_SWEEP.replace("stores", '"network.lozz"')
    )
    names["grid-expect"] = grid(
        tmp_path,
        "expect.toml",
        BAD_GRID_SWEEP.replace(
            "[sweep.axes]", 'expect_broken = [{"protocol.repair" = false}]\n[sweep.axes]'
        ),
    )
    names["grid-measure"] = grid(
        tmp_path,
        "measure.toml",
        BAD_GRID_SWEEP
        + '[[headline]]\ntitle = "t"\nsweep = "x"\nrows = "stores"\ncolumns = "stores"\n'
        'measure = "speed"\n',
    )
    line, expected = BAD_INPUTS[case]
    out = tmp_path / "out"
    args = [part.format(**names) for part in line.split()]
    result = CliRunner().invoke(app, ["pipeline", *args, "--out", str(out)])
    assert not no_spark, f"{case}: Spark was started before the input was refused"
    assert result.exit_code == 2, result.output
    for part in expected:
        assert part.format(**names) in result.output, result.output
    assert not out.exists()  # nothing written for a command that never ran


def test_inputs_spark_reads_itself_are_left_to_spark(tmp_path: Path, no_spark: list[str]) -> None:
    # An hdfs:// path may well be readable by the cluster and not by this process: the
    # check leaves it alone, and the command goes on to start Spark (the stand-in).
    result = CliRunner().invoke(
        app,
        [
            "pipeline",
            "report",
            "--events",
            "hdfs://namenode/runs/events.parquet",
            "--out",
            str(tmp_path),
        ],
    )
    assert no_spark == ["Spark"]
    assert isinstance(result.exception, SparkStartedError)
