"""Consolidate on hand-made logs: every kind of divergence, each asserted exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual
from typer.testing import CliRunner

from sdsync.cli.main import app
from sdsync.pipeline.consolidate import consolidate
from sdsync.pipeline.progress import Progress
from sdsync.sim.output import LOG_SCHEMA

MESSAGES_SCHEMA = pa.schema(
    [
        ("channel", pa.string()),
        ("message_id", pa.string()),
        ("causal_history", pa.list_(pa.string())),
        ("archived", pa.bool_()),
    ]
)

# Channel "c": the canonical order is m1 (1), m2 (2), m3 (3), m4 (3, ties by id).
GOOD = [(1, "m1"), (2, "m2"), (3, "m3"), (3, "m4")]
LOGS: dict[str, list[tuple[int, str]]] = {
    "p1": GOOD,
    "p2": [(1, "m1"), (3, "m3"), (3, "m4")],  # lacks m2
    "p3": [(1, "m1"), (3, "m3"), (2, "m2"), (3, "m4"), (3, "m4")],  # m2 late; m4 twice
    "p4": [*GOOD, (9, "zz")],  # an entry the metadata has never heard of
}
MESSAGES = [
    ("c", "m1", [], None),
    ("c", "m2", ["m1"], None),
    ("c", "m3", ["m2", "lost"], None),  # "lost" is in no log and no archive
    ("c", "m4", ["m3", "kept"], None),  # "kept" is in no log, but archived
    ("c", "kept", [], True),
]


def write_logs(directory: Path, logs: dict[str, list[tuple[int, str]]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for participant, entries in logs.items():
        table = pa.table(
            {
                "participant": [participant] * len(entries),
                "channel": ["c"] * len(entries),
                "position": list(range(len(entries))),
                "lamport": [lamport for lamport, _ in entries],
                "message_id": [mid for _, mid in entries],
            },
            schema=LOG_SCHEMA,
        )
        pq.write_table(table, directory / f"{participant}.parquet")
    return directory


def write_messages(path: Path, rows: list[tuple[str, str, list[str], bool | None]]) -> Path:
    columns = list(zip(*rows, strict=True))
    pq.write_table(pa.table([list(c) for c in columns], schema=MESSAGES_SCHEMA), path)
    return path


@pytest.fixture(scope="module")
def result(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("consolidate")
    logs = write_logs(root / "logs", LOGS)
    events = write_messages(root / "messages.parquet", MESSAGES)
    summary = consolidate(spark, str(logs), str(events), root / "out", Progress(spark))
    return root / "out", summary


def read(spark: SparkSession, out: Path, name: str) -> Any:
    return spark.read.parquet(str(out / name))


def test_canonical_log(spark: SparkSession, result: tuple[Path, dict[str, Any]]) -> None:
    out, _ = result
    holders = {"m1": 4, "m2": 3, "m3": 4, "m4": 4}  # p2 lacks m2
    expected = [
        ("c", i, lamport, mid, holders[mid], False) for i, (lamport, mid) in enumerate(GOOD)
    ]
    assertDataFrameEqual(
        read(spark, out, "canonical"),
        spark.createDataFrame(
            expected,
            "channel string, position int, lamport long, message_id string, holders long, "
            "lamport_conflict boolean",
        ),
    )


def test_divergences(spark: SparkSession, result: tuple[Path, dict[str, Any]]) -> None:
    out, _ = result
    assertDataFrameEqual(
        read(spark, out, "missing"),
        spark.createDataFrame(
            [("p2", "c", "m2", 2, 1)],
            "participant string, channel string, message_id string, lamport long, "
            "canonical_position int",
        ),
    )
    assertDataFrameEqual(
        read(spark, out, "extra"),
        spark.createDataFrame(
            [("p4", "c", 4, 9, "zz")],
            "participant string, channel string, position long, lamport long, message_id string",
        ),
    )
    assertDataFrameEqual(
        read(spark, out, "order_violations"),
        spark.createDataFrame(
            [("p3", "c", 2, 2, "m2", 3, "m3")],
            "participant string, channel string, position long, lamport long, "
            "message_id string, previous_lamport long, previous_message_id string",
        ),
    )
    assertDataFrameEqual(
        read(spark, out, "duplicates"),
        spark.createDataFrame(
            [("p3", "c", "m4", 2, [3, 4])],
            "participant string, channel string, message_id string, count long, "
            "positions array<long>",
        ),
    )
    assertDataFrameEqual(
        read(spark, out, "causal_gaps"),
        spark.createDataFrame(
            [("c", "lost", ["m3"])], "channel string, message_id string, needed_by array<string>"
        ),
    )
    assertDataFrameEqual(
        read(spark, out, "participants").select("participant", "divergent"),
        spark.createDataFrame(
            [("p1", False), ("p2", True), ("p3", True), ("p4", True)],
            "participant string, divergent boolean",
        ),
    )


def test_summary(result: tuple[Path, dict[str, Any]]) -> None:
    out, summary = result
    on_disk = json.loads((out / "summary.json").read_text())
    expected = {
        "channels": 1,
        "participants": 4,
        "canonical_entries": 4,
        "divergent_participants": 3,
        "order_violations": 1,
        "duplicates": 1,
        "causal_gaps": 1,
        "missing_entries": 1,
        "extra_entries": 1,
    }
    assert {k: on_disk[k] for k in expected} == expected
    assert summary["seconds"] > 0


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, ["pipeline", "consolidate", *args])


def test_cli_clean_logs_exit_0_and_divergent_exit_1(spark: SparkSession, tmp_path: Path) -> None:
    clean = write_logs(tmp_path / "clean", {"p1": GOOD, "p2": GOOD})
    ok = invoke("--logs", str(clean), "--out", str(tmp_path / "o1"))
    assert ok.exit_code == 0, ok.output
    summary = json.loads((tmp_path / "o1" / "summary.json").read_text())
    assert summary["divergent_participants"] == 0
    assert summary["extra_entries"] == 0  # without --events nothing can be extra
    divergent = write_logs(tmp_path / "div", {"p1": GOOD, "p2": GOOD[:2]})
    bad = invoke("--logs", str(divergent), "--out", str(tmp_path / "o2"))
    assert bad.exit_code == 1, bad.output


def test_missing_column_names_file_and_column(tmp_path: Path) -> None:
    logs = write_logs(tmp_path / "logs", {"p1": GOOD})
    pq.write_table(
        pa.table({"participant": ["p9"], "channel": ["c"], "position": [0], "message_id": ["x"]}),
        logs / "p9.parquet",
    )
    result = invoke("--logs", str(logs), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert "p9.parquet" in result.output
    assert "'lamport'" in result.output


def test_wrong_type_and_unreadable_events(tmp_path: Path) -> None:
    logs = write_logs(tmp_path / "logs", {"p1": GOOD})
    events = tmp_path / "events.parquet"
    pq.write_table(
        pa.table({"channel": ["c"], "message_id": ["m1"], "causal_history": ["m0"]}), events
    )
    result = invoke("--logs", str(logs), "--events", str(events), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert "events.parquet" in result.output
    assert "'causal_history'" in result.output
    events.write_bytes(b"PAR1 but not really")
    result = invoke("--logs", str(logs), "--events", str(events), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert "events.parquet" in result.output
    missing_dir = invoke("--logs", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert missing_dir.exit_code == 2
    assert "nope" in missing_dir.output
