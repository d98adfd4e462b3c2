"""`sdsync pipeline report`: exit codes and bad input (the happy path is in test_demo)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from sdsync.cli.main import app
from sdsync.demo import FullDemo


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, ["pipeline", "report", *args])


def test_exit_1_when_a_message_never_reached_everyone(
    spark: SparkSession, demo_run: FullDemo, tmp_path: Path
) -> None:
    events = pq.read_table(demo_run.out / "simulation" / "events.parquet")
    deliver = pc.equal(events.column("kind"), "deliver")
    first = events.filter(deliver).slice(0, 1).to_pylist()[0]
    lost = pc.and_(
        pc.and_(deliver, pc.equal(events.column("participant"), first["participant"])),
        pc.equal(events.column("message_id"), first["message_id"]),
    )
    pq.write_table(events.filter(pc.invert(lost)), tmp_path / "events.parquet")
    out = tmp_path / "out"
    result = invoke("--events", str(tmp_path / "events.parquet"), "--out", str(out))
    assert result.exit_code == 1, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["unconverged_messages"] == 1 and summary["never_delivered_pairs"] == 1
    assert summary["delivery_rate"] < 1.0
    lag = {r["participant"]: r for r in pq.read_table(out / "participant_lag.parquet").to_pylist()}
    assert lag[first["participant"]]["never_delivered"] == 1
    assert (out / "index.html").is_file() and (out / "time_to_consistency.png").is_file()


def test_bad_input_exits_2_naming_file_and_column(spark: SparkSession, tmp_path: Path) -> None:
    no_kind = tmp_path / "no_kind.parquet"
    pq.write_table(
        pa.table(
            {
                "time_ms": pa.array([1], pa.int64()),
                "participant": ["p00000"],
                "channel": ["channel-0"],
                "message_id": ["m"],
                "bytes": pa.array([1], pa.int64()),
            }
        ),
        no_kind,
    )
    result = invoke("--events", str(no_kind), "--out", str(tmp_path / "o1"))
    assert result.exit_code == 2
    assert str(no_kind) in result.output and "'kind'" in result.output
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    result = invoke("--events", str(garbage), "--out", str(tmp_path / "o2"))
    assert result.exit_code == 2 and "not a readable Parquet file" in result.output
    result = invoke("--events", str(tmp_path / "absent"), "--out", str(tmp_path / "o3"))
    assert result.exit_code == 2 and "no such file" in result.output
    assert not (tmp_path / "o1" / "summary.json").exists()
