"""The one-pass reconciliation over time slices: its plan, its tasks (in-process, under
hypothesis) and the whole command on clustered archives with many row groups."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from archives import Item, archive_table, random_items
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual
from test_reconcile import full_outer_join

from sdsync.pipeline import time_slices
from sdsync.pipeline.arrow_leaves import LEAF_SCHEMA, hash_limbs
from sdsync.pipeline.io import list_data_files
from sdsync.pipeline.leaves import leaf_sums
from sdsync.pipeline.progress import Progress
from sdsync.pipeline.reconcile import ParquetArchive, ReconcileOptions, reconcile

SHIFT = 30  # ~1 s leaves: items over an hour spread over a few thousand leaves


def write_in_groups(
    directory: Path, files: list[list[Item]], row_group_size: int, *, in_order: bool = True
) -> Path:
    """An archive of the given files (each sorted by time if ``in_order``), in row groups
    of that size."""
    directory.mkdir(parents=True, exist_ok=True)
    for number, part in enumerate(files):
        table = archive_table(sorted(part) if in_order else part)
        target = directory / f"part-{number:03d}.parquet"
        pq.write_table(table, target, row_group_size=row_group_size)
    return directory


def sources_of(dirs: list[Path]) -> list[time_slices.Source]:
    return [time_slices.Source(d.name, 1 << i, list_data_files(str(d))) for i, d in enumerate(dirs)]


Missing = set[tuple[str, int, bytes, tuple[str, ...]]]


def run_in_process(
    plan: time_slices.Plan, directory: Path, leaves: np.ndarray | None = None
) -> tuple[pa.Table, Missing]:
    """All tasks without Spark: their leaf rows, and the rows written to ``directory``
    as (archive, timestamp, message_hash, held_by)."""
    time_slices.begin_missing(str(directory))
    batches = [
        batch
        for task in range(len(plan.tasks))
        for batch in time_slices.task_output(plan, SHIFT, task, str(directory), leaves)
    ]
    time_slices.end_missing(str(directory))
    leaf_rows = pa.Table.from_batches(batches, schema=LEAF_SCHEMA)
    rows: list[tuple[str, int, bytes, tuple[str, ...]]] = []
    for file in sorted(directory.glob("part-*.parquet")):
        part = pq.read_table(file).to_pylist()
        keys = [(r["timestamp"], r["message_hash"]) for r in part]
        assert keys == sorted(keys), f"{file.name} is not in time order"
        assert len({r["archive"] for r in part}) <= 1, "one file per archive and task"
        rows += [
            (r["archive"], r["timestamp"], r["message_hash"], tuple(r["held_by"])) for r in part
        ]
    assert len(rows) == len(set(rows)), "a missing row was written twice"
    return leaf_rows, set(rows)


def expected_missing(sets: dict[str, list[Item]]) -> Missing:
    holders: dict[Item, set[str]] = defaultdict(set)
    for name, items in sets.items():
        for item in items:
            holders[item].add(name)
    return {
        (name, ts, h, tuple(sorted(held)))
        for (ts, h), held in holders.items()
        for name in sets
        if name not in held
    }


def check_plan(plan: time_slices.Plan, budget: int) -> None:
    slices = plan.slices
    # Contiguous slices in contiguous task runs, each naming exactly the row groups
    # that overlap it.
    for before, after in itertools.pairwise(slices):
        assert before.hi == after.lo
    for s in slices:
        overlapping = {i for i, g in enumerate(plan.groups) if g.first < s.hi and g.last >= s.lo}
        assert set(s.groups) == overlapping
    assert plan.peak_rows == max(
        (sum(plan.groups[g].rows for g in s.groups) for s in slices), default=0
    )
    assert plan.peak_rows <= budget
    covered = {g for s in slices for g in s.groups}
    assert covered == set(range(len(plan.groups)))


Layout = tuple[dict[str, list[Item]], list[list[int]], int, int, bool]


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    """Sets of items for 2-3 archives (losses, an outage, duplicates, shared timestamps),
    how each archive is cut into files, its row-group size, the task count and whether
    the files are in time order."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    base = random_items(draw(st.integers(0, 400)), rng, start=1_700_000_000 * 10**9)
    if base:
        base += [(base[0][0], rng.randbytes(32)) for _ in range(draw(st.integers(0, 5)))]
    names = ["a", "b", "c"][: draw(st.integers(2, 3))]
    sets: dict[str, list[Item]] = {}
    for name in names:
        loss = draw(st.sampled_from([0.0, 0.02, 0.3]))
        items = [x for x in base if rng.random() >= loss]
        if draw(st.booleans()) and items:  # an outage
            lo = rng.choice(items)[0]
            items = [x for x in items if not lo <= x[0] < lo + 300 * 10**9]
        items += rng.sample(items, min(len(items), draw(st.integers(0, 3))))  # duplicates
        sets[name] = items
    cuts = [draw(st.lists(st.integers(0, 1), min_size=1, max_size=3)) for _ in names]
    return (
        sets,
        cuts,
        draw(st.sampled_from([7, 50, 1000])),
        draw(st.integers(1, 5)),
        draw(st.booleans()),
    )


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(layout=layouts())
def test_tasks_find_exactly_what_some_archive_lacks(
    tmp_path_factory: pytest.TempPathFactory, layout: Layout
) -> None:
    sets, cuts, row_group_size, tasks, in_order = layout
    root = tmp_path_factory.mktemp("layout")
    dirs = []
    for (name, items), cut in zip(sets.items(), cuts, strict=True):
        # Files either split time (clustered) or interleave (overlapping row groups).
        files: list[list[Item]] = [[] for _ in cut]
        for i, item in enumerate(sorted(items)):
            part = (i * len(cut)) // max(1, len(items)) if cut[0] else i % len(cut)
            files[part].append(item)
        for part in files if not in_order else []:
            random.Random(len(part)).shuffle(part)
        dirs.append(write_in_groups(root / name, files, row_group_size, in_order=in_order))
    plan = time_slices.plan(sources_of(dirs), SHIFT, budget_rows=10**6, tasks=tasks)
    assert plan is not None
    check_plan(plan, 10**6)
    leaf_rows, missing = run_in_process(plan, root / "missing")
    assert missing == expected_missing(sets)
    # Every archive's leaf rows are its true leaf sums, each leaf once.
    for name, items in sets.items():
        mine = leaf_rows.filter(pa.compute.equal(leaf_rows["archive"], name)).sort_by("leaf")
        limbs = hash_limbs(pa.array([h for _, h in items], pa.binary()))
        assert limbs is not None
        truth = leaf_sums(np.array([t for t, _ in items], dtype=np.int64), limbs, SHIFT)
        assert mine["leaf"].to_pylist() == truth.leaf.tolist()
        assert mine["n"].to_pylist() == truth.n.tolist()
        assert mine["s3"].to_pylist() == truth.sums[:, 3].tolist()
    # Told the differing leaves, the tasks find the same items without summing.
    leaves = np.unique(np.array([t >> SHIFT for _, t, _, _ in missing], dtype=np.int64))
    assert run_in_process(plan.only(leaves), root / "again", leaves)[1] == missing


def test_plan_refuses_more_rows_than_the_budget(tmp_path: Path) -> None:
    rng = random.Random(3)
    items = random_items(1000, rng)
    # Not in time order: every row group spans the whole hour, every slice holds all.
    interleaved = write_in_groups(tmp_path / "i", [items], 100, in_order=False)
    plan = time_slices.plan(sources_of([interleaved]), SHIFT, budget_rows=10**6, tasks=2)
    assert plan is not None and plan.peak_rows > 900
    assert time_slices.plan(sources_of([interleaved]), SHIFT, budget_rows=500, tasks=2) is None
    # Sorted into one file, each slice holds a row group or two.
    clustered = write_in_groups(tmp_path / "c", [items], 100)
    plan = time_slices.plan(sources_of([clustered]), SHIFT, budget_rows=500, tasks=3)
    assert plan is not None and plan.peak_rows <= 200
    assert len(plan.tasks) == 3
    check_plan(plan, 500)


def test_no_timestamp_statistics_means_no_plan(tmp_path: Path) -> None:
    items = random_items(50, random.Random(4))
    directory = tmp_path / "nostats"
    directory.mkdir()
    table = pa.table(
        {
            "message_hash": pa.array([h for _, h in items], pa.binary()),
            "timestamp": pa.array([t for t, _ in items], pa.int64()),
        }
    )
    pq.write_table(table, directory / "part-0.parquet", write_statistics=False)
    assert time_slices.plan(sources_of([directory]), SHIFT, budget_rows=10**6, tasks=2) is None


def test_reconcile_methods_agree_on_clustered_archives(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(21)
    base = random_items(6000, rng)
    outage = base[0][0]
    sets = {
        "a": [x for x in base if rng.random() > 0.005],
        "b": [x for x in base if not outage <= x[0] < outage + 60 * 10**9],
        "c": [x for x in base if rng.random() > 0.01] + base[:3],
    }
    # Different row-group sizes, so the archives' row groups straddle each other.
    archives = [
        ParquetArchive(name, str(write_in_groups(tmp_path / name, [items], size)))
        for (name, items), size in zip(sets.items(), (500, 700, 1100), strict=True)
    ]
    expected = full_outer_join(spark, archives)

    def run(out: str, **options: Any) -> dict[str, Any]:
        summary = reconcile(
            spark, archives, tmp_path / out, Progress(spark), ReconcileOptions(**options)
        )
        assertDataFrameEqual(spark.read.parquet(str(tmp_path / out / "missing")), expected)
        return summary

    one = run("one", leaf_items=32, one_pass_rows=5000)
    assert one["method"] == "one pass"
    assert one["time_slices"]["tasks"] == 2
    assert one["time_slices"]["peak_rows"] <= 5000
    two = run("two", leaf_items=32, one_pass_rows=1000)  # below the peak: two passes
    assert two["method"] == "two passes" and two["time_slices"] is None
    for key in ("missing_per_archive", "ranges_compared", "ranges_differing", "levels"):
        assert one[key] == two[key]
    run("cache", leaf_items=32, fingerprint_cache=True)
    warm = run("warm", leaf_items=32, fingerprint_cache=True)
    assert warm["method"] == "one pass over the differing leaves"
    assert warm["missing_per_archive"] == one["missing_per_archive"]


def test_missing_directory_keeps_only_complete_files(spark: SparkSession, tmp_path: Path) -> None:
    directory = tmp_path / "missing"
    directory.mkdir()
    (directory / "part-00007-000.parquet").write_bytes(b"from an earlier run")
    time_slices.begin_missing(str(directory))
    assert not list(directory.iterdir())
    (directory / ".part-00000-000.parquet.4242").write_bytes(b"a failed task attempt's")
    time_slices.end_missing(str(directory))
    assert sorted(p.name for p in directory.iterdir()) == ["_SUCCESS", "part-empty.parquet"]
    table = spark.read.parquet(str(directory))
    assert table.count() == 0
    assert table.columns == ["archive", "message_hash", "timestamp", "held_by"]


def test_a_retried_task_replaces_its_own_files(tmp_path: Path) -> None:
    """Spark runs a task again when its executor is lost, possibly after the first attempt
    wrote some or all of its files, or beside a speculative copy: the directory must end
    with exactly one run's files and rows."""
    items = random_items(4_000, random.Random(5))
    a = write_in_groups(tmp_path / "a", [sorted(items)], 500)
    b = write_in_groups(tmp_path / "b", [sorted(items[::3])], 500)
    plan = time_slices.plan(sources_of([a, b]), SHIFT, budget_rows=10**6, tasks=4)
    assert plan is not None and len(plan.tasks) == 4
    once = tmp_path / "once"
    _, expected = run_in_process(plan, once)
    files = sorted(p.name for p in once.iterdir())
    retried = tmp_path / "retried"
    time_slices.begin_missing(str(retried))
    for task in range(len(plan.tasks)):
        list(time_slices.task_output(plan, SHIFT, task, str(retried)))
    # Task 2 again (its executor was lost after it wrote), and an attempt killed midway.
    list(time_slices.task_output(plan, SHIFT, 2, str(retried)))
    killed = time_slices.task_output(plan, SHIFT, 1, str(retried))
    next(killed, None)
    (retried / ".part-00001-001.parquet.999").write_bytes(b"PAR1 half a file")
    time_slices.end_missing(str(retried))
    assert sorted(p.name for p in retried.iterdir()) == files
    rows = pq.read_table(retried, schema=pq.read_schema(next(retried.glob("part-*")))).to_pylist()
    assert {(r["archive"], r["timestamp"], r["message_hash"]) for r in rows} == {
        (archive, timestamp, message_hash) for archive, timestamp, message_hash, _ in expected
    }
    assert len(rows) == len(expected)
