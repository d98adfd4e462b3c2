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
   ``leaf_items`` (256) items of the largest archive.  One scan per archive reads only
   ``timestamp`` and ``message_hash`` and sums, per leaf, the count and the eight 32-bit
   limbs of the hashes (:mod:`sdsync.pipeline.spark_fingerprint`).  The scan's only
   shuffle is the map-side-combined leaf table: a few hundred bytes per leaf.
2. **Hierarchy.** A range at level ``L`` is ``leaf >> (4 L)`` (fanout 16).  Sums add, so
   every level is computed from the small leaf table, never from the rows.  Starting at
   the lowest level with at most 16 ranges, we fingerprint each range in each archive
   and keep the ranges whose fingerprints differ (a range an archive has no items in is
   the empty set); the next level looks only inside those.
3. **Exact.** Rows of the differing leaves are read again, grouped by
   ``(timestamp, message_hash)`` with a bit mask of the archives holding each item (a
   plain hash aggregation); ``held_by`` is the sorted array of those archives, and every
   archive not in it gets a row in ``OUT/missing/``.

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
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.types import ArrayType, BinaryType, LongType, StringType, StructField, StructType

from sdsync.pipeline import cache
from sdsync.pipeline.io import (
    InputError,
    ParquetInput,
    binary_column,
    inspect_parquet,
    is_local,
    long_column,
    write_summary,
)
from sdsync.pipeline.progress import Progress
from sdsync.pipeline.spark_fingerprint import fingerprint_expr, hash_limbs, limb_names
from sdsync.reconcile.fingerprint import HASH_SIZE, MAX_LIMB_ITEMS

ARCHIVE_COLUMNS = [binary_column("message_hash"), long_column("timestamp")]
LIMB_COLUMNS = limb_names()
MAX_ARCHIVES = 63  # who holds an item is a bit mask in a long
MISSING_SCHEMA = StructType(
    [
        StructField("archive", StringType(), False),
        StructField("message_hash", BinaryType(), False),
        StructField("timestamp", LongType(), False),
        StructField("held_by", ArrayType(StringType(), False), False),
    ]
)


@dataclass(frozen=True)
class Archive:
    """A store archive: its name in the output and where its Parquet files are."""

    name: str
    path: str


@dataclass(frozen=True)
class ReconcileOptions:
    leaf_items: int = 256
    """Target items per leaf in the largest archive: smaller leaves cost a bigger leaf
    table, larger ones make more rows land in differing leaves."""
    fanout_bits: int = 4
    """log2 of the fanout of the range hierarchy (16)."""
    fingerprint_cache: bool = False


@dataclass
class _Plan:
    archives: list[Archive]
    inputs: dict[str, ParquetInput]
    shift: int = 0
    min_ts: int | None = None
    max_ts: int | None = None
    cache_state: dict[str, str] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)


def parse_archive(spec: str) -> Archive:
    """``NAME=DIR`` or ``DIR`` (named after its last path component)."""
    name, sep, path = spec.partition("=")
    if sep and name and "/" not in name and not os.path.exists(spec):
        return Archive(name, path)
    stripped = spec.rstrip("/")
    return Archive(os.path.basename(stripped) or stripped, spec)


def check_archives(archives: list[Archive]) -> None:
    if not 2 <= len(archives) <= MAX_ARCHIVES:
        raise InputError(f"reconcile needs two to {MAX_ARCHIVES} --archive, not {len(archives)}")
    names = [a.name for a in archives]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise InputError(
            f"archive names must be unique, {', '.join(duplicated)} is repeated "
            "(name them with --archive NAME=DIR)"
        )


def reconcile(
    spark: SparkSession,
    archives: list[Archive],
    out: Path,
    progress: Progress,
    options: ReconcileOptions | None = None,
) -> dict[str, Any]:
    """Run the reconciliation, write ``OUT/missing/`` and ``OUT/summary.json``."""
    options = options or ReconcileOptions()
    started = time.perf_counter()
    check_archives(archives)
    with progress.stage("check inputs"):
        plan = _Plan(
            archives,
            {
                a.name: inspect_parquet(a.path, ARCHIVE_COLUMNS, min_max=("timestamp",))
                for a in archives
            },
        )
        _choose_shift(spark, plan, options)
    leaves = _leaf_table(spark, plan, options, progress)
    cached = [leaves]
    try:
        diff, levels, level_caches = _compare_levels(leaves, plan, options, progress)
        cached.extend(level_caches)
        at_leaves = levels[-1] if levels and levels[-1]["level"] == 0 else None
        exact_rows = at_leaves["rows_in_differing"] if at_leaves and diff is not None else 0
        with progress.stage("exact comparison of differing leaves"):
            _write_missing(spark, plan, diff, out)
    finally:
        for frame in cached:
            frame.unpersist()
    with progress.stage("summary"):
        missing = _missing_per_archive(spark, out, archives)
    summary: dict[str, Any] = {
        "archives": [a.name for a in archives],
        "rows_per_archive": plan.rows,
        "missing_per_archive": missing,
        "ranges_compared": sum(level["compared"] for level in levels),
        "ranges_differing": sum(level["differing"] for level in levels),
        "leaves_differing": levels[-1]["differing"] if levels and levels[-1]["level"] == 0 else 0,
        "rows_compared_exactly": exact_rows,
        "levels": levels,
        "leaf_shift": plan.shift,
        "leaf_width_ns": 1 << plan.shift,
        "fanout": 1 << options.fanout_bits,
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
        rows, minmax = found.rows, found.min_max.get("timestamp")
        if rows is None or "timestamp" not in found.min_max:
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
    leaves_wanted = max(1, largest // max(1, options.leaf_items))
    plan.shift = max(0, (span // leaves_wanted).bit_length() - 1)


def _scan_stats(spark: SparkSession, path: str) -> tuple[int, tuple[int, int] | None]:
    row = (
        spark.read.parquet(path)
        .agg(sf.count(sf.lit(1)), sf.min("timestamp"), sf.max("timestamp"))
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


def _scan_leaves(spark: SparkSession, archive: Archive, shift: int) -> DataFrame:
    """Per leaf: n, the eight limb sums, and how many rows are malformed."""
    data = spark.read.parquet(archive.path)
    h, ts = sf.col("message_hash"), sf.col("timestamp")
    limbs = hash_limbs("message_hash")
    return data.groupBy(sf.shiftright(ts, shift).alias("leaf")).agg(
        sf.count(sf.lit(1)).alias("n"),
        *[sf.sum(limb).alias(name) for limb, name in zip(limbs, LIMB_COLUMNS, strict=True)],
        sf.sum(_bad_row(h, ts).cast("long")).alias("bad"),
    )


def _coarsen(leaves: DataFrame, by: int) -> DataFrame:
    if by == 0:
        return leaves
    return leaves.groupBy(sf.shiftright("leaf", by).alias("leaf")).agg(
        sf.sum("n").alias("n"), *[sf.sum(c).alias(c) for c in LIMB_COLUMNS]
    )


def _leaf_table(
    spark: SparkSession, plan: _Plan, options: ReconcileOptions, progress: Progress
) -> DataFrame:
    """All archives' leaves, (archive, leaf, n, s0..s7, bad), persisted: every level uses it."""
    parts: list[DataFrame] = []
    scanned: list[Archive] = []
    keys: dict[str, str] = {}
    for archive in plan.archives:
        part = _try_cache(spark, plan, archive, options, keys)
        if part is None:
            part = _scan_leaves(spark, archive, plan.shift)
            scanned.append(archive)
        else:
            part = part.withColumn("bad", sf.lit(0).cast("long"))
        parts.append(part.select(sf.lit(archive.name).alias("archive"), "*"))
    table = _union(parts).persist(StorageLevel.MEMORY_AND_DISK)
    names = ", ".join(a.name for a in scanned) or "none, all cached"
    with progress.stage(f"fingerprint leaves (scan: {names})"):
        per_archive = (
            table.groupBy("archive").agg(sf.sum("bad").alias("bad"), sf.sum("n").alias("rows"))
        ).collect()
    bad = {r["archive"]: r["bad"] for r in per_archive}
    rows = {r["archive"]: int(r["rows"]) for r in per_archive}
    plan.rows = {a.name: rows.get(a.name, 0) for a in plan.archives}
    for archive in scanned:
        if bad.get(archive.name):
            table.unpersist()
            raise _bad_rows_error(spark, archive)
    if options.fingerprint_cache and scanned:
        with progress.stage("write fingerprint caches"):
            for archive in scanned:
                _write_cache(plan, archive, table, keys)
    return table  # the persisted frame itself, so that the caller's unpersist frees it


def _union(parts: list[DataFrame]) -> DataFrame:
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return result


def _try_cache(
    spark: SparkSession,
    plan: _Plan,
    archive: Archive,
    options: ReconcileOptions,
    keys: dict[str, str],
) -> DataFrame | None:
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
    return _coarsen(spark.read.parquet(cache.leaves_path(archive.path)), plan.shift - meta.shift)


def _write_cache(plan: _Plan, archive: Archive, table: DataFrame, keys: dict[str, str]) -> None:
    if archive.name not in keys:
        return
    target = cache.begin_write(archive.path)
    mine = table.where(sf.col("archive") == archive.name).drop("archive", "bad")
    mine.coalesce(1).write.mode("overwrite").parquet(target)
    found = plan.inputs[archive.name]
    minmax = found.min_max.get("timestamp")
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


def _bad_rows_error(spark: SparkSession, archive: Archive) -> InputError:
    """Name the first file with a null or wrong-size message_hash (or a null timestamp)."""
    h, ts = sf.col("message_hash"), sf.col("timestamp")
    row = (
        spark.read.parquet(archive.path)
        .where(_bad_row(h, ts))
        .select(
            sf.input_file_name().alias("file"),
            sf.when(ts.isNull(), "timestamp").otherwise("message_hash").alias("column"),
            sf.octet_length(h).alias("size"),
        )
        .first()
    )
    file = str(row["file"]) if row else archive.path
    column = str(row["column"]) if row else "message_hash"
    if column == "timestamp":
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


def _compare_ranges(ranged: DataFrame, names: list[str]) -> DataFrame:
    """Per range: whether the archives' fingerprints differ, and its rows (all archives).

    One aggregation with a column group per archive (a pivot), so each level costs one
    shuffle; an archive with no items in a range sums to (0, 0…), the empty set, whose
    fingerprint is the empty set's, exactly what a store would report.
    """
    sums = []
    for i, name in enumerate(names):
        mine = sf.col("archive") == sf.lit(name)
        for column in ["n", *LIMB_COLUMNS]:
            total = sf.coalesce(sf.sum(sf.when(mine, sf.col(column))), sf.lit(0).cast("long"))
            sums.append(total.alias(f"{column}_{i}"))
    per_archive = ranged.groupBy("range").agg(*sums)
    fingerprints = [
        fingerprint_expr(f"n_{i}", [f"{c}_{i}" for c in LIMB_COLUMNS]) for i in range(len(names))
    ]
    rows = sum((sf.col(f"n_{i}") for i in range(len(names))), sf.lit(0).cast("long"))
    return per_archive.select(
        "range",
        (sf.size(sf.array_distinct(sf.array(*fingerprints))) > 1).alias("differs"),
        rows.alias("n"),
    )


def _compare_levels(
    leaves: DataFrame, plan: _Plan, options: ReconcileOptions, progress: Progress
) -> tuple[DataFrame | None, list[dict[str, int]], list[DataFrame]]:
    """Top-down: fingerprint only ranges whose parent differed.

    Returns the differing leaves (None if none), per-level counts, and the persisted
    per-level comparisons, which the caller frees once the leaves have been used.
    """
    top = _top_level(plan, options)
    levels: list[dict[str, int]] = []
    cached: list[DataFrame] = []
    if top is None:
        return None, levels, cached
    names = [a.name for a in plan.archives]
    bits = options.fanout_bits
    parent: DataFrame | None = None
    for level in range(top, -1, -1):
        ranged = leaves.withColumn("range", sf.shiftright("leaf", bits * level))
        if parent is not None:
            ranged = ranged.withColumn("parent", sf.shiftright("leaf", bits * (level + 1))).join(
                sf.broadcast(parent.withColumnRenamed("range", "parent")), "parent", "left_semi"
            )
        compared = _compare_ranges(ranged, names).persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(compared)
        with progress.stage(f"compare level {level}"):
            row = compared.agg(
                sf.count(sf.lit(1)).alias("compared"),
                sf.count_if("differs").alias("differing"),
                sf.coalesce(sf.sum(sf.when(sf.col("differs"), sf.col("n"))), sf.lit(0)).alias(
                    "rows"
                ),
            ).first()
        assert row is not None
        levels.append(
            {
                "level": level,
                "range_width_ns": 1 << (plan.shift + bits * level),
                "compared": int(row["compared"]),
                "differing": int(row["differing"]),
                "rows_in_differing": int(row["rows"]),
            }
        )
        parent = compared.where("differs").select("range")
        if row["differing"] == 0:
            parent = None
            break
    return parent, levels, cached


# -- 3. exact ----------------------------------------------------------------------------


def _write_missing(
    spark: SparkSession, plan: _Plan, diff_leaves: DataFrame | None, out: Path
) -> None:
    """Group only the rows of differing leaves by item; list who lacks each item."""
    target = str(out / "missing")
    if diff_leaves is None:
        empty = spark.createDataFrame([], MISSING_SCHEMA).coalesce(1)
        empty.write.mode("overwrite").parquet(target)
        return
    leaf_set = sf.broadcast(diff_leaves.withColumnRenamed("range", "leaf"))
    # Who holds an item, as a bit mask over the archives: a plain hash aggregation (a
    # collect_set would fall back to sorting after 128 keys per task).
    names = sorted(a.name for a in plan.archives)
    bit = {name: 1 << i for i, name in enumerate(names)}
    everyone = (1 << len(names)) - 1
    rows = _union(
        [
            spark.read.parquet(a.path)
            .select(sf.lit(bit[a.name]).cast("long").alias("bit"), "timestamp", "message_hash")
            .withColumn("leaf", sf.shiftright("timestamp", plan.shift))
            .join(leaf_set, "leaf", "left_semi")
            for a in plan.archives
        ]
    )
    held = rows.groupBy("timestamp", "message_hash").agg(sf.bit_or("bit").alias("mask"))

    def holders(present: bool) -> Column:
        return sf.array_compact(
            sf.array(
                *[
                    sf.when((sf.col("mask").bitwiseAND(bit[n]) != 0) == present, sf.lit(n))
                    for n in names
                ]
            )
        )

    missing = held.where(sf.col("mask") != everyone).select(
        sf.explode(holders(False)).alias("archive"),
        "message_hash",
        "timestamp",
        holders(True).alias("held_by"),
    )
    # Sorted within each file, not globally: a global sort costs a sampling job.
    ordered = missing.sortWithinPartitions("archive", "timestamp", "message_hash")
    ordered.write.mode("overwrite").parquet(target)


def _missing_per_archive(spark: SparkSession, out: Path, archives: list[Archive]) -> dict[str, int]:
    counts = {
        r["archive"]: int(r["count"])
        for r in spark.read.parquet(str(out / "missing")).groupBy("archive").count().collect()
    }
    return {a.name: counts.get(a.name, 0) for a in archives}
