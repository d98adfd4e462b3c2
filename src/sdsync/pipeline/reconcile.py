"""``sdsync pipeline reconcile``: what each store archive lacks that another one holds.

Theory of operation
-------------------
The answer is what a full outer join of all archives on ``(timestamp, message_hash)``
gives, but a join shuffles and sorts every row of every archive.  Archives that were
filled from the same network mostly agree, so we first find *where* they differ, with
the range fingerprints of :mod:`sdsync.reconcile.fingerprint` (the function the stores'
range-based reconciliation uses), and compare rows exactly only there:

1. **Leaves.** Time is cut into aligned buckets ``leaf = timestamp >> shift``; ``shift``
   is chosen from the footers' row counts and time bounds so that a leaf holds about
   ``leaf_items`` (256) items of the largest archive (wider for archives so large that
   the leaf table would not fit the driver).  Per leaf and archive: the count
   and the sums of the eight 32-bit limbs of the hashes (:mod:`sdsync.pipeline.leaves`).
2. **Hierarchy.** A range at level ``L`` is ``leaf >> (4 L)`` (fanout 16).  Sums add, so
   every level is computed from the leaf table, never from the rows; being small, it is
   compared on the driver, with the stores' own fingerprint function.  Starting at the
   lowest level with at most 16 ranges, we fingerprint each range in each archive and
   keep the ranges whose fingerprints differ (a range an archive has no items in is the
   empty set); the next level looks only inside those.
3. **Exact.** Only rows of the differing leaves are compared item by item; who holds an
   item is a bit mask over the archives, and every archive not in it gets a row in
   ``OUT/missing/``.

How the rows are read decides how these steps are spread over Spark:

* **One pass** (local archives whose row groups are clustered in time, the usual case:
  :mod:`sdsync.pipeline.time_slices`).  Spark tasks each own a slice of time, read the
  row groups overlapping it with pyarrow, sum its leaves, find the leaves whose
  fingerprints differ and compare their rows right there, writing the missing rows
  into ``OUT/missing/`` themselves; they return the leaf table, from which the driver
  walks the hierarchy for the summary and the fingerprint cache.  No row is shuffled
  and every row is read once.  With every archive's leaves in the fingerprint cache,
  the hierarchy comes first and the tasks read only the slices holding differing
  leaves.
* **Two passes** (archives Spark's reader must read, or row groups spanning all of
  time).  One Spark job sums the leaves (:mod:`sdsync.pipeline.arrow_leaves` or
  :mod:`sdsync.pipeline.spark_fingerprint`), the driver walks the hierarchy, and a
  second job reads the rows of the differing leaves again and groups them by item in
  a hash aggregation.

Equal fingerprints mean equal sets up to a 2**-128 collision, so the result equals the
join's.  Duplicate rows inside one archive make its fingerprint differ, which costs an
exact comparison of that leaf but never a wrong answer (items are a set).

Output ``OUT/missing/``: ``archive`` string (the archive lacking the item),
``message_hash`` binary, ``timestamp`` long, ``held_by`` array<string> (sorted names of
the archives holding it); one row per (lacking archive, item).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as sf

from sdsync.errors import InputError
from sdsync.pipeline import ONE_PASS_ROWS, arrow_leaves, cache, time_slices
from sdsync.pipeline.io import (
    ParquetInput,
    inspect_parquet,
    is_local,
    schema_columns,
    write_summary,
)
from sdsync.pipeline.leaves import LIMB_COLUMNS, LeafTable, differing
from sdsync.pipeline.progress import Progress
from sdsync.pipeline.session import is_connect
from sdsync.pipeline.spark_fingerprint import hash_limbs
from sdsync.reconcile.fingerprint import MAX_LIMB_ITEMS
from sdsync.store.schema import ARCHIVE_SCHEMA, MESSAGE_HASH, TIMESTAMP
from sdsync.wire.waku import HASH_SIZE

ARCHIVE_COLUMNS = schema_columns(ARCHIVE_SCHEMA, MESSAGE_HASH, TIMESTAMP)
MAX_ARCHIVES = 63  # who holds an item is a bit mask in a long


@dataclass(frozen=True)
class ParquetArchive:
    """A store archive exported to Parquet (``--archive [NAME=]DIR``): its name in the
    output and where its files are. (:class:`sdsync.store.Archive` is the live database.)"""

    name: str
    path: str


@dataclass(frozen=True)
class ReconcileOptions:
    leaf_items: int = 256
    """Target items per leaf in the largest archive: smaller leaves cost a bigger leaf
    table, larger ones make more rows land in differing leaves."""
    max_leaf_rows: int = 1 << 22
    """About this many leaf rows at most (all archives together, ~88 bytes each; within
    a factor of two, leaf widths being powers of two) reach the driver: beyond, leaves
    hold more than ``leaf_items``."""
    fanout_bits: int = 4
    """log2 of the fanout of the range hierarchy (16)."""
    fingerprint_cache: bool = False
    arrow_files: bool = True
    """Read local archives' row groups with pyarrow and numpy inside Spark tasks
    (:mod:`sdsync.pipeline.time_slices`, :mod:`sdsync.pipeline.arrow_leaves`); False, or
    a non-local path, uses Spark's Parquet reader and column expressions."""
    one_pass_rows: int = ONE_PASS_ROWS
    """The most rows a one-pass task may hold at once (the row groups overlapping one
    slice of time); inputs that need more take two passes.  0: always two passes."""


@dataclass
class _Plan:
    archives: list[ParquetArchive]
    inputs: dict[str, ParquetInput]
    shift: int = 0
    min_ts: int | None = None
    max_ts: int | None = None
    cache_state: dict[str, str] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)

    @cached_property
    def bits(self) -> dict[str, int]:
        """Who holds an item is a bit mask over the archives, in name order."""
        return {name: 1 << i for i, name in enumerate(sorted(a.name for a in self.archives))}


def parse_archive(spec: str) -> ParquetArchive:
    """``NAME=DIR`` or ``DIR`` (named after its last path component)."""
    name, sep, path = spec.partition("=")
    if sep and name and "/" not in name and not os.path.exists(spec):
        return ParquetArchive(name, path)
    stripped = spec.rstrip("/")
    return ParquetArchive(os.path.basename(stripped) or stripped, spec)


def check_archives(archives: list[ParquetArchive]) -> None:
    if not 2 <= len(archives) <= MAX_ARCHIVES:
        raise InputError(f"reconcile needs two to {MAX_ARCHIVES} --archive, not {len(archives)}")
    names = [a.name for a in archives]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise InputError(
            f"archive names must be unique, {', '.join(duplicated)} is repeated "
            "(name them with --archive NAME=DIR)"
        )


def check_inputs(archives: list[ParquetArchive]) -> dict[str, ParquetInput]:
    """Two or more archives with distinct names, every local file readable with the
    columns :data:`ARCHIVE_COLUMNS` require; InputError naming the file and the column.
    Needs no Spark: run it before starting one.  By archive name, what the footers say
    (row counts and time bounds: the plan's sizes)."""
    check_archives(archives)
    return {
        a.name: inspect_parquet(a.path, ARCHIVE_COLUMNS, min_max=(TIMESTAMP,)) for a in archives
    }


def reconcile(
    spark: SparkSession,
    archives: list[ParquetArchive],
    out: Path,
    progress: Progress,
    options: ReconcileOptions | None = None,
    *,
    checked: dict[str, ParquetInput] | None = None,
) -> dict[str, Any]:
    """Run the reconciliation, write ``OUT/missing/`` and ``OUT/summary.json``.
    ``checked``: what :func:`check_inputs` returned for these archives (None: check them
    now), so that the footers of an archive of many files are read once."""
    options = options or ReconcileOptions()
    started = time.perf_counter()
    with progress.stage("check inputs"):
        plan = _Plan(archives, checked if checked is not None else check_inputs(archives))
        _choose_shift(spark, plan, options)
        slices = _time_slices(spark, plan, options)
    keys: dict[str, str] = {}
    tables = _cached_leaves(plan, options, keys)
    scanned = [a for a in archives if a.name not in tables]
    if slices is not None and scanned:
        tables = _one_pass(spark, plan, slices, out, progress)
        method = "one pass"
    else:
        tables.update(_scan_leaves(spark, plan, scanned, options, progress))
        method = "two passes" if slices is None else "one pass over the differing leaves"
    plan.rows = {a.name: int(tables[a.name].n.sum()) for a in archives}
    diff, levels = _compare_levels(tables, plan, options, progress)
    if method != "one pass":
        with progress.stage("exact comparison of differing leaves"):
            _exact(spark, plan, options, slices, diff, out)
    if options.fingerprint_cache and scanned:
        with progress.stage("write fingerprint caches"):
            for archive in scanned:
                _write_cache(plan, archive, tables[archive.name], keys)
    with progress.stage("summary"):
        missing = _missing_per_archive(out, archives)
    summary: dict[str, Any] = {
        "archives": [a.name for a in archives],
        "rows": plan.rows,
        "missing": missing,
        # The same two under the names of earlier releases.
        "rows_per_archive": plan.rows,
        "missing_per_archive": missing,
        "ranges_compared": sum(level["compared"] for level in levels),
        "ranges_differing": sum(level["differing"] for level in levels),
        "leaves_differing": levels[-1]["differing"] if levels and levels[-1]["level"] == 0 else 0,
        "rows_compared_exactly": levels[-1]["rows_in_differing"] if diff else 0,
        "levels": levels,
        "leaf_shift": plan.shift,
        "leaf_width_ns": 1 << plan.shift,
        "fanout": 1 << options.fanout_bits,
        "method": method,
        "time_slices": _slices_summary(slices),
        "fingerprint_cache": plan.cache_state,
        "inputs": {a.name: a.path for a in archives},
        "outputs": {"missing": str(out / "missing")},
        "stage_seconds": dict(progress.timings),
        "seconds": round(time.perf_counter() - started, 3),
    }
    write_summary(out, summary)
    return summary


# -- 1. leaves ---------------------------------------------------------------------------


def _choose_shift(spark: SparkSession, plan: _Plan, options: ReconcileOptions) -> None:
    """Pick the leaf width 2**shift from row counts and time bounds (footers or a scan)."""
    bounds: list[tuple[int, int]] = []
    largest = 0
    for archive in plan.archives:
        found = plan.inputs[archive.name]
        rows, minmax = found.rows, found.min_max.get(TIMESTAMP)
        if rows is None or TIMESTAMP not in found.min_max:
            rows, minmax = _scan_stats(spark, archive.path)
        largest = max(largest, rows)
        if minmax is not None:
            bounds.append(minmax)
        if rows > MAX_LIMB_ITEMS:
            raise InputError(
                f"{archive.path}: {rows} rows; archives of 2**31 rows or more are not "
                "supported yet (64-bit limb sums could overflow)",
                path=archive.path,
            )
    if not bounds:
        return
    plan.min_ts = min(b[0] for b in bounds)
    plan.max_ts = max(b[1] for b in bounds)
    span = plan.max_ts - plan.min_ts + 1
    per_archive = options.max_leaf_rows // len(plan.archives)
    leaves_wanted = max(1, min(largest // max(1, options.leaf_items), per_archive))
    plan.shift = max(0, (span // leaves_wanted).bit_length() - 1)


def _scan_stats(spark: SparkSession, path: str) -> tuple[int, tuple[int, int] | None]:
    row = (
        spark.read.parquet(path)
        .agg(sf.count(sf.lit(1)), sf.min(TIMESTAMP), sf.max(TIMESTAMP))
        .first()
    )
    assert row is not None
    rows = int(row[0])
    return rows, (None if row[1] is None else (int(row[1]), int(row[2])))


def _bad_row(message_hash: Column, timestamp: Column) -> Column:
    return (
        message_hash.isNull()
        | timestamp.isNull()
        | (sf.octet_length(message_hash) != sf.lit(HASH_SIZE))
    )


def _spark_leaves(spark: SparkSession, archive: ParquetArchive, shift: int) -> DataFrame:
    """Per leaf: n, the eight limb sums, and how many rows are malformed."""
    data = spark.read.parquet(archive.path)
    h, ts = sf.col(MESSAGE_HASH), sf.col(TIMESTAMP)
    limbs = hash_limbs(MESSAGE_HASH)
    return data.groupBy(sf.shiftright(ts, shift).alias("leaf")).agg(
        sf.count(sf.lit(1)).alias("n"),
        *[sf.sum(limb).alias(name) for limb, name in zip(limbs, LIMB_COLUMNS, strict=True)],
        sf.sum(_bad_row(h, ts).cast("long")).alias("bad"),
    )


def _time_slices(
    spark: SparkSession, plan: _Plan, options: ReconcileOptions
) -> time_slices.Plan | None:
    """The one-pass plan, if every archive's row groups can be read by our tasks and
    are clustered enough in time."""
    if not all(_reads_files(a, options) for a in plan.archives) or options.one_pass_rows <= 0:
        return None
    sources = [
        time_slices.Source(a.name, plan.bits[a.name], plan.inputs[a.name].files)
        for a in plan.archives
    ]
    tasks = _one_pass_tasks(spark)
    return time_slices.plan(sources, plan.shift, budget_rows=options.one_pass_rows, tasks=tasks)


def _one_pass_tasks(spark: SparkSession) -> int:
    """As many tasks as shuffle partitions, but locally no more than the cores: a task
    beyond them costs a Python task's start and re-reads the row groups straddling its
    edges (4 tasks on 2 cores took 10-25 % longer than 2).  A cluster's executors may
    come and go, so there the shuffle partitions stand."""
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or 1)
    if is_connect(spark) or not (spark.sparkContext.master or "").startswith("local"):
        return partitions
    return max(1, min(partitions, spark.sparkContext.defaultParallelism))


def _slices_summary(slices: time_slices.Plan | None) -> dict[str, int] | None:
    if slices is None:
        return None
    return {
        "tasks": len(slices.tasks),
        "slices": len(slices.slices),
        "row_groups": len(slices.groups),
        "peak_rows": slices.peak_rows,
    }


def _one_pass(
    spark: SparkSession, plan: _Plan, slices: time_slices.Plan, out: Path, progress: Progress
) -> dict[str, LeafTable]:
    """Run the one-pass tasks: they write ``OUT/missing/`` and emit the leaf rows."""
    name = "fingerprint, compare and write missing, one pass over time slices"
    with progress.stage(name, tasks=len(slices.tasks)):
        rows = _run_slices(spark, plan, slices, out, None)
    return _leaves_of(spark, plan.archives, rows)


def _run_slices(
    spark: SparkSession,
    plan: _Plan,
    slices: time_slices.Plan,
    out: Path,
    leaves: np.ndarray | None,
) -> pa.Table:
    missing = str(out / "missing")
    time_slices.begin_missing(missing)
    rows = time_slices.run(spark, slices, plan.shift, missing, leaves).toArrow()
    time_slices.end_missing(missing)
    return rows


def _scan_leaves(
    spark: SparkSession,
    plan: _Plan,
    archives: list[ParquetArchive],
    options: ReconcileOptions,
    progress: Progress,
) -> dict[str, LeafTable]:
    """The leaves of ``archives``, from one scan of all of them."""
    if not archives:
        return {}
    names = ", ".join(a.name for a in archives)
    with progress.stage(f"fingerprint leaves (scan: {names})"):
        rows = _scan(spark, plan, archives, options).toArrow()
    return _leaves_of(spark, archives, rows)


def _leaves_of(
    spark: SparkSession, archives: list[ParquetArchive], rows: pa.Table
) -> dict[str, LeafTable]:
    """Split the leaf rows (archive, leaf, n, s0..s7, bad) by archive; an archive with
    malformed rows is bad input."""
    tables: dict[str, LeafTable] = {}
    for archive in archives:
        mine = rows.filter(pc.equal(rows["archive"], archive.name))
        if pc.sum(mine["bad"]).as_py():
            raise _bad_rows_error(spark, archive)
        tables[archive.name] = LeafTable.from_arrow(mine)
    return tables


def _cached_leaves(
    plan: _Plan, options: ReconcileOptions, keys: dict[str, str]
) -> dict[str, LeafTable]:
    """The leaf tables the fingerprint caches hold (``keys``: the listing key of every
    archive whose cache can be written)."""
    tables: dict[str, LeafTable] = {}
    for archive in plan.archives:
        found = _try_cache(plan, archive, options, keys)
        if found is not None:
            tables[archive.name] = found
    return tables


def _scan(
    spark: SparkSession, plan: _Plan, archives: list[ParquetArchive], options: ReconcileOptions
) -> DataFrame:
    """(archive, leaf, n, s0..s7, bad) of ``archives``: one Spark job for all of them."""
    by_files = [a for a in archives if _reads_files(a, options)]
    parts = [
        _spark_leaves(spark, a, plan.shift).select(sf.lit(a.name).alias("archive"), "*")
        for a in archives
        if a not in by_files
    ]
    if by_files:
        units = arrow_leaves.list_units([(a.name, 0, plan.inputs[a.name].files) for a in by_files])
        sums = [sf.sum(c).alias(c) for c in ["n", *LIMB_COLUMNS, "bad"]]
        leaves = arrow_leaves.scan_leaves(spark, units, plan.shift)
        parts.append(leaves.groupBy("archive", "leaf").agg(*sums))
    return _union(parts)


def _reads_files(archive: ParquetArchive, options: ReconcileOptions) -> bool:
    return options.arrow_files and is_local(archive.path)


def _union(parts: list[DataFrame]) -> DataFrame:
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return result


def _try_cache(
    plan: _Plan, archive: ParquetArchive, options: ReconcileOptions, keys: dict[str, str]
) -> LeafTable | None:
    if not options.fingerprint_cache:
        plan.cache_state[archive.name] = "off"
        return None
    found = plan.inputs[archive.name]
    if not is_local(archive.path):
        plan.cache_state[archive.name] = "unsupported (not a local path)"
        return None
    keys[archive.name] = cache.listing_key(archive.path, found.files)
    meta = cache.load_meta(archive.path)
    if not cache.usable(meta, keys[archive.name], plan.shift):
        plan.cache_state[archive.name] = "miss"
        return None
    assert meta is not None
    plan.cache_state[archive.name] = "hit" if meta.shift == plan.shift else "hit (finer)"
    table = pq.read_table(cache.leaves_path(archive.path))
    return LeafTable.from_arrow(table).coarsen(plan.shift - meta.shift)


def _write_cache(
    plan: _Plan, archive: ParquetArchive, leaves: LeafTable, keys: dict[str, str]
) -> None:
    if archive.name not in keys:
        return
    target = Path(cache.begin_write(archive.path))
    target.mkdir(parents=True, exist_ok=True)
    pq.write_table(leaves.to_arrow(), target / "part-0.parquet")
    found = plan.inputs[archive.name]
    minmax = found.min_max.get(TIMESTAMP)
    cache.commit(
        archive.path,
        cache.CacheMeta(
            version=cache.CACHE_VERSION,
            key=keys[archive.name],
            shift=plan.shift,
            rows=found.rows or 0,
            min_ts=minmax[0] if minmax else None,
            max_ts=minmax[1] if minmax else None,
        ),
    )
    plan.cache_state[archive.name] = "written"


def _bad_rows_error(spark: SparkSession, archive: ParquetArchive) -> InputError:
    """Name the first file with a null or wrong-size message_hash (or a null timestamp)."""
    h, ts = sf.col(MESSAGE_HASH), sf.col(TIMESTAMP)
    row = (
        spark.read.parquet(archive.path)
        .where(_bad_row(h, ts))
        .select(
            sf.input_file_name().alias("file"),
            sf.when(ts.isNull(), TIMESTAMP).otherwise(MESSAGE_HASH).alias("column"),
            sf.octet_length(h).alias("size"),
        )
        .first()
    )
    file = str(row["file"]) if row else archive.path
    column = str(row["column"]) if row else MESSAGE_HASH
    if column == TIMESTAMP:
        what = "null timestamp"
    elif row is not None and row["size"] is not None:
        what = f"a {row['size']}-byte message_hash, expected {HASH_SIZE} bytes"
    else:
        what = "null message_hash"
    return InputError(f"{file}: column '{column}' has a {what}", path=file, column=column)


# -- 2. hierarchy ------------------------------------------------------------------------


def _top_level(plan: _Plan, options: ReconcileOptions) -> int | None:
    if plan.min_ts is None or plan.max_ts is None:
        return None
    lo, hi = plan.min_ts >> plan.shift, plan.max_ts >> plan.shift
    level = 0
    fanout = 1 << options.fanout_bits
    while (hi >> (options.fanout_bits * level)) - (lo >> (options.fanout_bits * level)) >= fanout:
        level += 1
    return level


def _compare_levels(
    tables: dict[str, LeafTable], plan: _Plan, options: ReconcileOptions, progress: Progress
) -> tuple[list[int], list[dict[str, int]]]:
    """Top-down: fingerprint only ranges whose parent differed.

    Returns the differing leaves and per-level counts.  The leaf tables are small (a few
    hundred items per leaf), so this runs on the driver with the stores' own fingerprint
    function.
    """
    top = _top_level(plan, options)
    levels: list[dict[str, int]] = []
    if top is None:
        return [], levels
    bits = options.fanout_bits
    parents: np.ndarray | None = None
    for level in range(top, -1, -1):
        with progress.stage(f"compare level {level}"):
            ranged = [tables[a.name].coarsen(bits * level) for a in plan.archives]
            ranges = np.unique(np.concatenate([r.leaf for r in ranged]))
            if parents is not None:
                ranges = ranges[np.isin(ranges >> bits, parents)]
            parents, rows = differing(ranged, ranges)
        levels.append(
            {
                "level": level,
                "range_width_ns": 1 << (plan.shift + bits * level),
                "compared": len(ranges),
                "differing": len(parents),
                "rows_in_differing": rows,
            }
        )
        if not len(parents):
            return [], levels
    assert parents is not None
    return parents.tolist(), levels


# -- 3. exact ----------------------------------------------------------------------------


def _exact(
    spark: SparkSession,
    plan: _Plan,
    options: ReconcileOptions,
    slices: time_slices.Plan | None,
    diff_leaves: list[int],
    out: Path,
) -> None:
    """Write ``OUT/missing/`` from the rows of the differing leaves."""
    leaves = np.asarray(diff_leaves, dtype=np.int64)
    if slices is not None:
        rows = _run_slices(spark, plan, slices.only(leaves), out, leaves)
        _leaves_of(spark, plan.archives, rows)  # only malformed rows come back
        return
    if not diff_leaves:
        held = spark.createDataFrame([], "timestamp long, message_hash binary, mask long")
    else:
        # A plain hash aggregation of the bits (a collect_set would fall back to sorting
        # after 128 keys per task).
        in_leaves = _rows_in_leaves(spark, plan, options, diff_leaves)
        held = in_leaves.groupBy(TIMESTAMP, MESSAGE_HASH).agg(sf.bit_or("bit").alias("mask"))
    _write_missing(held, plan, out)


def _rows_in_leaves(
    spark: SparkSession, plan: _Plan, options: ReconcileOptions, diff_leaves: list[int]
) -> DataFrame:
    """(bit, timestamp, message_hash) of every archive's rows in the differing leaves."""
    by_files = [a for a in plan.archives if _reads_files(a, options)]
    leaf_set = spark.createDataFrame([(leaf,) for leaf in diff_leaves], "leaf long")
    parts = [
        spark.read.parquet(a.path)
        .select(sf.lit(plan.bits[a.name]).cast("long").alias("bit"), TIMESTAMP, MESSAGE_HASH)
        .withColumn("leaf", sf.shiftright(TIMESTAMP, plan.shift))
        .join(sf.broadcast(leaf_set), "leaf", "left_semi")
        .drop("leaf")
        for a in plan.archives
        if a not in by_files
    ]
    if by_files:
        units = arrow_leaves.list_units(
            [(a.name, plan.bits[a.name], plan.inputs[a.name].files) for a in by_files]
        )
        parts.append(arrow_leaves.rows_in_leaves(spark, units, plan.shift, diff_leaves))
    return _union(parts)


def _write_missing(held: DataFrame, plan: _Plan, out: Path) -> None:
    """Write a row per (archive lacking, item) of ``held`` (timestamp, message_hash, mask)."""
    names = sorted(plan.bits)
    everyone = sum(plan.bits.values())

    def holders(present: bool) -> Column:
        return sf.array_compact(
            sf.array(
                *[
                    sf.when((sf.col("mask").bitwiseAND(plan.bits[n]) != 0) == present, sf.lit(n))
                    for n in names
                ]
            )
        )

    missing = held.where(sf.col("mask") != everyone).select(
        sf.explode(holders(False)).alias("archive"),
        MESSAGE_HASH,
        TIMESTAMP,
        holders(True).alias("held_by"),
    )
    # Sorted within each file, not globally: a global sort costs a sampling job.
    ordered = missing.sortWithinPartitions("archive", TIMESTAMP, MESSAGE_HASH)
    ordered.write.mode("overwrite").parquet(str(out / "missing"))


def _missing_per_archive(out: Path, archives: list[ParquetArchive]) -> dict[str, int]:
    """Counted from the written output's archive column (small: only what is missing)."""
    names = pq.read_table(str(out / "missing"), columns=["archive"])["archive"]
    counts = {r["values"]: r["counts"] for r in pc.value_counts(names).to_pylist()}
    return {a.name: int(counts.get(a.name, 0)) for a in archives}
