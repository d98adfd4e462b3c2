"""Leaf sums and the rows of differing leaves, read row group by row group in Spark tasks.

Theory of operation
-------------------
Spark's Parquet reader turns every value into a row before an expression sees it, and
reading the limbs of a hash then takes 32 table look-ups per row
(:mod:`sdsync.pipeline.spark_fingerprint`).  When every executor can open the archive's
files (a local or shared file system) we do better: each Spark task (``mapInArrow``)
opens one row group with pyarrow, reads only ``timestamp`` and ``message_hash``, and
works on whole Arrow buffers with numpy.  A binary column of 32-byte values has one
contiguous data buffer, so viewing it as big-endian 32-bit words *is* the (rows, 8)
matrix of limbs, most significant first, without a copy.  Per leaf (``timestamp >>
shift``, the same arithmetic shift as Spark's) the count and the limb sums are one
``np.add.reduceat`` over the rows in leaf order (archives are usually written in time
order; otherwise a stable argsort).  A task emits one row per leaf it saw, so the leaf
table's shuffle stays a few hundred bytes per leaf and task.

A row group with a null or a wrongly sized hash, or a null timestamp, emits only how
many such rows it has (``bad``); the caller names the file and column from that.

The exact phase opens the same row groups again and emits only the rows whose leaf is in
the sorted array of differing leaves that travels with the task.

The units (archive, file, row group) are listed from the footers on the driver; the ids
of ``spark.range(units)`` select them, split into as few tasks as there are shuffle
partitions, since starting a Python task costs far more than a row group takes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from sdsync.pipeline.leaves import LIMB_COLUMNS, LeafTable, leaf_sums
from sdsync.reconcile.fingerprint import LIMBS
from sdsync.store.schema import MESSAGE_HASH, TIMESTAMP
from sdsync.wire.waku import HASH_SIZE

COLUMNS = [TIMESTAMP, MESSAGE_HASH]
LEAF_SCHEMA = pa.schema(
    [
        ("archive", pa.string()),
        ("leaf", pa.int64()),
        *[(name, pa.int64()) for name in ["n", *LIMB_COLUMNS]],
        ("bad", pa.int64()),
    ]
)
ArrowColumn: TypeAlias = pa.Array | pa.ChunkedArray
ROW_SCHEMA = pa.schema([("bit", pa.int64()), (TIMESTAMP, pa.int64()), (MESSAGE_HASH, pa.binary())])


@dataclass(frozen=True)
class Unit:
    """One task's share of the work: a row group of one archive's file."""

    archive: str
    bit: int
    file: str
    row_group: int


def list_units(archives: list[tuple[str, int, list[str]]]) -> list[Unit]:
    """The row groups of ``(archive name, bit, files)``, from the footers, the archives
    interleaved so that a task's run of consecutive units mixes them."""
    per_archive = [
        [
            Unit(name, bit, file, group)
            for file in files
            for group in range(pq.ParquetFile(file).metadata.num_row_groups)
        ]
        for name, bit, files in archives
    ]
    longest = max(map(len, per_archive), default=0)
    return [units[i] for i in range(longest) for units in per_archive if i < len(units)]


def spark_schema(schema: pa.Schema) -> str:
    kinds = {pa.string(): "string", pa.int64(): "long", pa.binary(): "binary"}
    return ", ".join(f"{f.name} {kinds[f.type]}" for f in schema)


def _per_unit(
    spark: SparkSession,
    units: list[Unit],
    work: Callable[[Unit], Iterator[pa.RecordBatch]],
    schema: pa.Schema,
) -> DataFrame:
    def run(ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in ids:
            for unit_id in batch.column(0).to_pylist():
                yield from work(units[unit_id])

    # A Python task costs about a second to start on a small machine, so there are only
    # as many as shuffle partitions (sized to the cores), each working on several units.
    tasks = min(len(units), int(spark.conf.get("spark.sql.shuffle.partitions") or 1))
    return spark.range(0, len(units), 1, max(1, tasks)).mapInArrow(run, spark_schema(schema))


def read_row_group(file: str, index: int) -> pa.Table:
    """``timestamp`` and ``message_hash`` of one row group, in that order."""
    return pq.ParquetFile(file).read_row_group(index, columns=COLUMNS).select(COLUMNS)


def _read(unit: Unit) -> Iterator[pa.RecordBatch]:
    return iter(read_row_group(unit.file, unit.row_group).to_batches())


def hash_limbs(hashes: pa.Array) -> np.ndarray | None:
    """The (rows, 8) big-endian uint32 limbs of 32-byte hashes, or None if any hash is
    null or of another size."""
    rows = len(hashes)
    if hashes.null_count:
        return None
    if rows == 0:
        return np.zeros((0, LIMBS), dtype=">u4")
    if pa.types.is_fixed_size_binary(hashes.type):
        if hashes.type.byte_width != HASH_SIZE:
            return None
        start, data = hashes.offset * HASH_SIZE, hashes.buffers()[1]
    else:
        width = np.int64 if pa.types.is_large_binary(hashes.type) else np.int32
        offsets = np.frombuffer(
            hashes.buffers()[1],
            dtype=width,
            count=rows + 1,
            offset=hashes.offset * np.dtype(width).itemsize,
        )
        if np.any(np.diff(offsets) != HASH_SIZE):
            return None
        start, data = int(offsets[0]), hashes.buffers()[2]
    return np.frombuffer(data, dtype=">u4", count=rows * LIMBS, offset=start).reshape(rows, LIMBS)


def bad_rows(timestamp: ArrowColumn, hashes: ArrowColumn) -> int:
    """Rows with a null timestamp or a null or wrongly sized hash."""
    wrong = pc.fill_null(pc.not_equal(pc.binary_length(hashes), HASH_SIZE), True)
    return int(pc.sum(pc.or_(wrong, pc.is_null(timestamp))).as_py() or 0)


def leaf_rows(archive: str, table: LeafTable) -> pa.RecordBatch:
    """The leaf rows of one archive's ``table``."""
    columns = [table.leaf, table.n, *table.sums.T, np.zeros(len(table.leaf), dtype=np.int64)]
    names = pa.array([archive] * len(table.leaf), pa.string())
    return pa.RecordBatch.from_arrays([names, *map(pa.array, columns)], schema=LEAF_SCHEMA)


def bad_leaf_row(archive: str, timestamps: ArrowColumn, hashes: ArrowColumn) -> pa.RecordBatch:
    """The row saying how many rows of ``archive`` are malformed (the caller raises)."""
    zeros = [pa.array([0], pa.int64()) for _ in range(LIMBS + 2)]
    bad = pa.array([bad_rows(timestamps, hashes)], pa.int64())
    return pa.RecordBatch.from_arrays([pa.array([archive]), *zeros, bad], schema=LEAF_SCHEMA)


def _leaf_batch(unit: Unit, batch: pa.RecordBatch, shift: int) -> pa.RecordBatch:
    limbs = hash_limbs(batch.column(1)) if batch.column(0).null_count == 0 else None
    if limbs is None:
        return bad_leaf_row(unit.archive, batch.column(0), batch.column(1))
    return leaf_rows(unit.archive, leaf_sums(batch.column(0).to_numpy(), limbs, shift))


def scan_leaves(spark: SparkSession, units: list[Unit], shift: int) -> DataFrame:
    """Rows (archive, leaf, n, s0..s7, bad), one per leaf per task: group to merge them."""

    def work(unit: Unit) -> Iterator[pa.RecordBatch]:
        for batch in _read(unit):
            if batch.num_rows:
                yield _leaf_batch(unit, batch, shift)

    return _per_unit(spark, units, work, LEAF_SCHEMA)


def rows_in_leaves(
    spark: SparkSession, units: list[Unit], shift: int, leaves: Sequence[int]
) -> DataFrame:
    """Rows (bit, timestamp, message_hash) of the archives whose leaf is in ``leaves``."""
    wanted = np.unique(np.asarray(leaves, dtype=np.int64))

    def work(unit: Unit) -> Iterator[pa.RecordBatch]:
        if not len(wanted):
            return
        for batch in _read(unit):
            leaf = batch.column(0).to_numpy() >> shift
            at = np.minimum(np.searchsorted(wanted, leaf), len(wanted) - 1)
            keep = wanted[at] == leaf
            if keep.any():
                picked = batch.filter(pa.array(keep))
                bit = pa.array(np.full(picked.num_rows, unit.bit, dtype=np.int64))
                hashes = picked.column(1).cast(pa.binary())
                yield pa.RecordBatch.from_arrays([bit, picked.column(0), hashes], schema=ROW_SCHEMA)

    return _per_unit(spark, units, work, ROW_SCHEMA)
