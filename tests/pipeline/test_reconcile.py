"""Reconcile equals a full outer join, on small archives of every awkward shape."""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from pyspark.testing import assertDataFrameEqual
from typer.testing import CliRunner

from sdsync.cli.main import app
from sdsync.errors import InputError
from sdsync.pipeline.progress import Progress
from sdsync.pipeline.reconcile import ParquetArchive, ReconcileOptions, parse_archive, reconcile

sys.path.insert(0, str(Path(__file__).parent))
from archives import Item, random_items, write_archive


def full_outer_join(spark: SparkSession, archives: list[ParquetArchive]) -> DataFrame:
    """The reference answer: join everything on (timestamp, message_hash)."""
    joined: DataFrame | None = None
    for a in archives:
        side = (
            spark.read.parquet(a.path)
            .select("timestamp", "message_hash")
            .distinct()
            .withColumn(f"in_{a.name}", sf.lit(a.name))
        )
        joined = (
            side if joined is None else joined.join(side, ["timestamp", "message_hash"], "full")
        )
    assert joined is not None
    held_by = sf.array_compact(sf.array(*[sf.col(f"in_{a.name}") for a in archives]))
    names = sf.array(*[sf.lit(a.name) for a in archives])
    return (
        joined.select("timestamp", "message_hash", sf.sort_array(held_by).alias("held_by"))
        .where(sf.size("held_by") < len(archives))
        .select(
            sf.explode(sf.array_except(names, sf.col("held_by"))).alias("archive"),
            "message_hash",
            "timestamp",
            "held_by",
        )
    )


def run(
    spark: SparkSession, tmp_path: Path, sets: dict[str, list[Item]], **options: Any
) -> tuple[dict[str, Any], DataFrame, list[ParquetArchive]]:
    archives = [
        ParquetArchive(name, str(write_archive(tmp_path / name, items, files=2)))
        for name, items in sets.items()
    ]
    out = tmp_path / "out"
    summary = reconcile(spark, archives, out, Progress(spark), ReconcileOptions(**options))
    return summary, spark.read.parquet(str(out / "missing")), archives


@pytest.mark.parametrize(
    ("method", "options"),
    [
        ("one pass", {}),
        ("two passes", {"one_pass_rows": 0}),
        ("two passes", {"arrow_files": False}),
    ],
    ids=["one-pass", "two-pass-arrow", "spark-reader"],
)
def test_random_losses_three_archives_equal_timestamps_and_duplicates(
    spark: SparkSession, tmp_path: Path, method: str, options: dict[str, Any]
) -> None:
    rng = random.Random(11)
    base = random_items(3000, rng)
    # Bursts of items sharing one timestamp: distinct items all the same.
    burst_ts = base[0][0]
    base += [(burst_ts, rng.randbytes(32)) for _ in range(40)]
    sets = {
        "a": [x for x in base if rng.random() > 0.01],
        "b": [x for x in base if rng.random() > 0.02] + base[:5],  # 5 duplicated rows
        "c": [x for x in base if not (base[0][0] <= x[0] < base[0][0] + 10**11)],  # outage
    }
    summary, missing, archives = run(spark, tmp_path, sets, leaf_items=64, **options)
    assertDataFrameEqual(missing, full_outer_join(spark, archives))
    assert summary["method"] == method
    assert summary["rows_per_archive"] == {name: len(items) for name, items in sets.items()}
    assert sum(summary["missing_per_archive"].values()) == missing.count() > 0
    assert summary["ranges_differing"] <= summary["ranges_compared"]
    # Drilling down pays off: far fewer rows compared exactly than held.
    assert summary["rows_compared_exactly"] < sum(summary["rows_per_archive"].values())
    on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert on_disk["missing_per_archive"] == summary["missing_per_archive"]


def test_identical_archives_compare_only_the_top(spark: SparkSession, tmp_path: Path) -> None:
    items = random_items(2000, random.Random(12))
    summary, missing, _ = run(spark, tmp_path, {"x": items, "y": list(reversed(items))})
    assert missing.count() == 0
    assert summary["ranges_differing"] == 0
    assert summary["rows_compared_exactly"] == 0
    assert len(summary["levels"]) == 1


def test_disjoint_and_empty(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(13)
    sets = {"p": random_items(300, rng), "q": random_items(200, rng), "empty": []}
    summary, missing, archives = run(spark, tmp_path, sets)
    assertDataFrameEqual(missing, full_outer_join(spark, archives))
    assert summary["missing_per_archive"] == {"p": 200, "q": 300, "empty": 500}


def test_all_empty(spark: SparkSession, tmp_path: Path) -> None:
    summary, missing, _ = run(spark, tmp_path, {"e1": [], "e2": []})
    assert missing.count() == 0
    assert summary["ranges_compared"] == 0
    assert missing.columns == ["archive", "message_hash", "timestamp", "held_by"]


def test_fingerprint_cache_is_reused_and_never_stale(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(14)
    base = random_items(1500, rng)
    sets = {"a": base, "b": base[10:]}
    first, _, archives = run(spark, tmp_path, sets, fingerprint_cache=True)
    assert first["fingerprint_cache"] == {"a": "written", "b": "written"}
    out = tmp_path / "out"
    again = reconcile(
        spark, archives, out, Progress(spark), ReconcileOptions(fingerprint_cache=True)
    )
    assert again["fingerprint_cache"] == {"a": "hit", "b": "hit"}
    assert again["missing_per_archive"] == first["missing_per_archive"] == {"a": 0, "b": 10}
    # A coarser run derives its leaves from the finer cache.
    coarse = reconcile(
        spark,
        archives,
        out,
        Progress(spark),
        ReconcileOptions(fingerprint_cache=True, leaf_items=1024),
    )
    assert coarse["leaf_shift"] > first["leaf_shift"]
    assert coarse["fingerprint_cache"]["a"] == "hit (finer)"
    assert coarse["missing_per_archive"] == {"a": 0, "b": 10}
    # Rewrite b with the same row count (same shift): the listing changed, the cache is stale.
    write_archive(Path(archives[1].path), base[:-10], files=2)
    for f in Path(archives[1].path).glob("part-*"):
        os.utime(f, ns=(1, 1))  # even an old mtime differs from the cached one
    stale = reconcile(
        spark, archives, out, Progress(spark), ReconcileOptions(fingerprint_cache=True)
    )
    assert stale["fingerprint_cache"] == {"a": "hit", "b": "written"}
    assertDataFrameEqual(spark.read.parquet(str(out / "missing")), full_outer_join(spark, archives))
    assert stale["missing_per_archive"] == {"a": 0, "b": 10}


def test_parse_archive() -> None:
    assert parse_archive("/data/store-1/") == ParquetArchive("store-1", "/data/store-1/")
    assert parse_archive("east=/data/s1") == ParquetArchive("east", "/data/s1")
    assert parse_archive("/data/day=3") == ParquetArchive("day=3", "/data/day=3")


# -- command line and bad input ----------------------------------------------------------


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, ["pipeline", "reconcile", *args])


def test_cli_exit_codes(spark: SparkSession, tmp_path: Path) -> None:
    items = random_items(100, random.Random(15))
    a = write_archive(tmp_path / "a", items)
    b = write_archive(tmp_path / "b", items)
    c = write_archive(tmp_path / "c", items[1:])
    same = invoke("--archive", str(a), "--archive", str(b), "--out", str(tmp_path / "o1"))
    assert same.exit_code == 0, same.output
    differ = invoke("--archive", str(a), "--archive", f"third={c}", "--out", str(tmp_path / "o2"))
    assert differ.exit_code == 1, differ.output
    summary = json.loads((tmp_path / "o2" / "summary.json").read_text())
    assert summary["missing_per_archive"] == {"a": 0, "third": 1}
    # The fields the issue names, exactly.
    assert summary["archives"] == ["a", "third"]
    assert summary["rows"] == {"a": 100, "third": 99}
    assert summary["missing"] == {"a": 0, "third": 1}
    assert summary["ranges_differing"] <= summary["ranges_compared"]
    assert summary["method"] == "one pass"
    two = invoke(
        *("--archive", str(a), "--archive", f"third={c}", "--out", str(tmp_path / "o3")),
        *("--one-pass-rows", "0"),
    )
    assert two.exit_code == 1, two.output
    summary = json.loads((tmp_path / "o3" / "summary.json").read_text())
    assert summary["method"] == "two passes"
    assert summary["missing_per_archive"] == {"a": 0, "third": 1}


def test_missing_column_names_file_and_column(spark: SparkSession, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = write_archive(tmp_path / "good", random_items(10, random.Random(16)))
    bad = tmp_path / "bad"
    bad.mkdir()
    pq.write_table(pa.table({"message_hash": [b"x" * 32]}), bad / "part-0.parquet")
    result = invoke("--archive", str(good), "--archive", str(bad), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert "part-0.parquet" in result.output
    assert "'timestamp'" in result.output


def test_unreadable_file_names_the_file(spark: SparkSession, tmp_path: Path) -> None:
    good = write_archive(tmp_path / "good", random_items(10, random.Random(17)))
    bad = write_archive(tmp_path / "bad", random_items(10, random.Random(18)))
    (bad / "part-999.parquet").write_bytes(b"definitely not parquet")
    result = invoke("--archive", str(good), "--archive", str(bad), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert "part-999.parquet" in result.output


def test_wrong_hash_size_names_file_and_column(spark: SparkSession, tmp_path: Path) -> None:
    good = write_archive(tmp_path / "good", random_items(10, random.Random(19)))
    short = write_archive(tmp_path / "short", [(5, b"\x01" * 31)])
    with pytest.raises(InputError) as info:
        reconcile(
            spark,
            [ParquetArchive("good", str(good)), ParquetArchive("short", str(short))],
            tmp_path / "o",
            Progress(spark),
        )
    assert info.value.column == "message_hash"
    assert info.value.path is not None and "part-000.parquet" in info.value.path
    assert "31-byte" in str(info.value)


def test_needs_two_distinct_archives(tmp_path: Path) -> None:
    a = write_archive(tmp_path / "a", [])
    assert invoke("--archive", str(a), "--out", str(tmp_path / "o")).exit_code == 2
    twice = invoke("--archive", str(a), "--archive", str(a), "--out", str(tmp_path / "o"))
    assert twice.exit_code == 2
    assert "unique" in twice.output


def test_master_and_remote_are_exclusive(tmp_path: Path) -> None:
    a = write_archive(tmp_path / "a", [])
    b = write_archive(tmp_path / "b", [])
    result = invoke(
        *("--archive", str(a), "--archive", str(b), "--out", str(tmp_path / "o")),
        *("--master", "local[1]", "--remote", "sc://localhost"),
    )
    assert result.exit_code == 2
    assert "mutually exclusive" in result.output


def test_leaf_table_stays_within_the_driver_budget(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(16)
    base = random_items(2000, rng)
    sets = {"x": base, "y": [x for x in base if rng.random() > 0.05]}
    summary, missing, archives = run(spark, tmp_path, sets, leaf_items=1, max_leaf_rows=64)
    assertDataFrameEqual(missing, full_outer_join(spark, archives))
    leaves = summary["levels"][-1]
    assert leaves["level"] == 0
    assert leaves["compared"] <= 2 * 32 + 1  # 64 leaf rows for two archives, within 2x
