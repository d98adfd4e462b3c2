"""The pipeline commands without Spark: exit code 2 and the extra to install, never a traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
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
