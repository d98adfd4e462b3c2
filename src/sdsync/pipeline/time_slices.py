"""Reconciling local archives in one pass: Spark tasks over slices of time.

Theory of operation
-------------------
The two-pass method of :mod:`sdsync.pipeline.reconcile` (sum the leaves, compare them on
the driver, read the rows of the differing leaves again and group them in a Spark
shuffle) reads every row twice as soon as the differences are spread over the archives,
and shuffles every row it compares.  When the executors can open the archives' files
and their row groups are clustered in time — the store's export, the simulator's
archives, anything written in time order; the footers' timestamp statistics say so —
one pass does it, and no row leaves the task that read it:

* The driver cuts time at the leaves where row groups start (:func:`plan`).  A slice
  ``[lo, hi)`` of leaves then needs exactly the row groups overlapping it, of every
  archive.  Slices go to Spark tasks in contiguous runs of about equal rows; within a
  task a row group is read once, kept while the slices still overlap it and dropped
  after its last leaf.
* Per slice, each archive's leaf sums (:func:`sdsync.pipeline.leaves.sorted_leaf_sums`,
  row group by row group, merged) and the leaves whose fingerprints differ
  (:func:`sdsync.pipeline.leaves.differing`, the stores' fingerprint function); then,
  over the rows of those leaves only, the exact comparison: sorted by ``(timestamp,
  message_hash)`` the copies of an item are neighbours, and the archives holding it are
  the bits of those neighbours.
* The task writes the missing rows itself, one Parquet file per archive lacking
  something, in time order, to ``OUT/missing/`` (which, like any Spark output, the
  executors must be able to reach); a file appears under its final name only when
  complete, so a retried task replaces its own.  What goes back through Spark is the
  leaf table, a few hundred bytes per leaf, which the driver needs for the hierarchy,
  the summary and the fingerprint cache.

A slice holds every row group overlapping it in one task's memory.  When the footers say
some slice would exceed the budget (row groups each spanning most of the time, as in an
archive written straight out of a shuffle), :func:`plan` returns None and the caller
falls back to the two-pass method.

When the differing leaves are known in advance (every archive's leaves came from the
fingerprint cache), :meth:`Plan.only` keeps the slices holding one, and their tasks go
straight to the exact comparison: each row group they read is cut down to the rows of
those leaves as soon as it is read.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from sdsync.pipeline.arrow_leaves import (
    COLUMNS,
    LEAF_SCHEMA,
    bad_leaf_row,
    hash_limbs,
    leaf_rows,
    read_row_group,
    spark_schema,
)
from sdsync.pipeline.io import UnknownBoundsError, row_group_bounds
from sdsync.pipeline.leaves import LeafTable, differing, sorted_leaf_sums
from sdsync.reconcile.fingerprint import LIMBS
from sdsync.store.schema import MESSAGE_HASH, TIMESTAMP
from sdsync.wire.waku import HASH_SIZE

MISSING_SCHEMA = pa.schema(
    [
        ("archive", pa.string()),
        (MESSAGE_HASH, pa.binary()),
        (TIMESTAMP, pa.int64()),
        ("held_by", pa.list_(pa.string())),
    ]
)
"""``OUT/missing/``: a row per (archive lacking an item, item), ``held_by`` the sorted
names of the archives holding it."""
FLUSH_ROWS = 1 << 16
"""Missing rows buffered per archive before a row group is written."""


@dataclass(frozen=True)
class Source:
    """An archive to read: its name, its bit in the masks, its files."""

    name: str
    bit: int
    files: list[str]


@dataclass(frozen=True)
class RowGroup:
    source: int
    """Index of the archive in :attr:`Plan.sources`."""
    file: str
    index: int
    rows: int
    first: int
    """Leaf of the smallest timestamp (from the footer's statistics)."""
    last: int


@dataclass(frozen=True)
class Slice:
    lo: int
    hi: int
    """Leaves ``lo <= leaf < hi``."""
    groups: tuple[int, ...]
    """Indices into :attr:`Plan.groups` of the row groups overlapping the slice."""


@dataclass(frozen=True)
class Plan:
    sources: list[Source]
    groups: list[RowGroup]
    tasks: list[list[Slice]]
    peak_rows: int
    """The most rows a task holds at once (the row groups of its largest slice)."""

    @property
    def slices(self) -> list[Slice]:
        return [s for task in self.tasks for s in task]

    def only(self, leaves: np.ndarray) -> Plan:
        """The slices holding one of ``leaves`` (sorted), spread over as many tasks."""
        wanted = [s for s in self.slices if _holds_any(leaves, s.lo, s.hi)]
        return replace(self, tasks=_split(self.groups, wanted, len(self.tasks)))


def _holds_any(leaves: np.ndarray, lo: int, hi: int) -> bool:
    at = int(np.searchsorted(leaves, lo))
    return at < len(leaves) and int(leaves[at]) < hi


def row_groups(sources: list[Source], shift: int) -> list[RowGroup] | None:
    """Every non-empty row group with the leaves it spans; None if a footer has no
    timestamp statistics (nothing tells where its rows are in time)."""
    groups: list[RowGroup] = []
    for number, source in enumerate(sources):
        for file in source.files:
            try:
                bounds = row_group_bounds(pq.read_metadata(file), TIMESTAMP)
            except UnknownBoundsError:
                return None
            groups += [
                RowGroup(number, file, index, rows, low >> shift, high >> shift)
                for index, rows, low, high in bounds
            ]
    return groups


def plan(sources: list[Source], shift: int, *, budget_rows: int, tasks: int) -> Plan | None:
    """Slices of time for ``tasks`` tasks; None if one pass cannot stay in the budget."""
    groups = row_groups(sources, shift)
    if groups is None:
        return None
    slices: list[Slice] = []
    peak = 0
    starts = sorted({g.first for g in groups})
    bounds = [*starts, max((g.last for g in groups), default=0) + 1]
    by_first = sorted(range(len(groups)), key=lambda i: groups[i].first)
    active: list[int] = []
    taken = 0
    for lo, hi in itertools.pairwise(bounds):
        while taken < len(by_first) and groups[by_first[taken]].first < hi:
            active.append(by_first[taken])
            taken += 1
        active = [g for g in active if groups[g].last >= lo]
        peak = max(peak, sum(groups[g].rows for g in active))
        if peak > budget_rows:
            return None
        slices.append(Slice(lo, hi, tuple(active)))
    return Plan(sources, groups, _split(groups, slices, tasks), peak)


def _split(groups: list[RowGroup], slices: list[Slice], tasks: int) -> list[list[Slice]]:
    """Contiguous runs of slices with about equal rows to read (a row group counts in
    the first slice of a run that needs it)."""
    weights: list[int] = []
    previous: set[int] = set()
    for s in slices:
        weights.append(sum(groups[g].rows for g in s.groups if g not in previous))
        previous = set(s.groups)
    count = max(1, min(tasks, len(slices)))
    share = max(1, sum(weights)) / count
    runs: list[list[Slice]] = [[]]
    done = 0
    for s, weight in zip(slices, weights, strict=True):
        if runs[-1] and done + weight > share * len(runs) and len(runs) < count:
            runs.append([])
        runs[-1].append(s)
        done += weight
    return [run for run in runs if run]


def run(
    spark: SparkSession,
    plan: Plan,
    shift: int,
    missing: str,
    leaves: np.ndarray | None = None,
) -> DataFrame:
    """The tasks' leaf rows (:data:`~sdsync.pipeline.arrow_leaves.LEAF_SCHEMA`); as a
    side effect of running them, the missing rows in the directory ``missing`` (see
    :func:`begin_missing`).  Given the differing ``leaves`` (sorted), the tasks only
    write the missing rows of those leaves and emit no leaf rows but the malformed."""

    def tasks(ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in ids:
            for task in batch.column(0).to_pylist():
                yield from task_output(plan, shift, task, missing, leaves)

    count = max(1, len(plan.tasks))
    return spark.range(0, len(plan.tasks), 1, count).mapInArrow(tasks, spark_schema(LEAF_SCHEMA))


def task_output(
    plan: Plan, shift: int, task: int, missing: str, leaves: np.ndarray | None = None
) -> Iterator[pa.RecordBatch]:
    """Run task number ``task`` of ``plan`` (in Spark, :func:`run` does)."""
    writers = [_MissingWriter(missing, task, number) for number in range(len(plan.sources))]
    yield from _Task(plan, shift, leaves, writers).run(plan.tasks[task])
    for writer in writers:
        writer.close()


def begin_missing(directory: str) -> None:
    """Empty the output directory the tasks write their files into."""
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)


def end_missing(directory: str) -> None:
    """After the tasks: drop what failed attempts left, and make sure the directory
    reads as a table even with no missing rows (readers infer the schema from a file)."""
    for name in os.listdir(directory):
        if name.startswith("."):
            os.remove(os.path.join(directory, name))
    if not os.listdir(directory):
        pq.write_table(MISSING_SCHEMA.empty_table(), os.path.join(directory, "part-empty.parquet"))
    open(os.path.join(directory, "_SUCCESS"), "wb").close()


class _MissingWriter:
    """One task's missing rows of one archive: a Parquet file in time order, written
    under a hidden name and renamed when complete (a retried task replaces it)."""

    def __init__(self, directory: str, task: int, source: int) -> None:
        name = f"part-{task:05d}-{source:03d}.parquet"
        self.path = os.path.join(directory, name)
        self.partial = os.path.join(directory, f".{name}.{os.getpid()}")
        self.buffered: list[pa.Table] = []
        self.rows = 0
        self.writer: pq.ParquetWriter | None = None

    def add(self, rows: pa.Table) -> None:
        self.buffered.append(rows)
        self.rows += rows.num_rows
        if self.rows >= FLUSH_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self.rows:
            return
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.partial, MISSING_SCHEMA)
        self.writer.write_table(pa.concat_tables(self.buffered))
        self.buffered, self.rows = [], 0

    def close(self) -> None:
        self._flush()
        if self.writer is not None:
            self.writer.close()
            os.replace(self.partial, self.path)


@dataclass(frozen=True)
class _Rows:
    """Rows of one row group in leaf order."""

    leaf: np.ndarray
    timestamp: np.ndarray
    limbs: np.ndarray
    """(rows, 8) big-endian uint32: the hashes."""

    def between(self, lo: int, hi: int) -> _Rows:
        a, b = np.searchsorted(self.leaf, [lo, hi])
        return _Rows(self.leaf[a:b], self.timestamp[a:b], self.limbs[a:b])

    def in_leaves(self, sorted_leaves: np.ndarray) -> _Rows:
        """The rows whose leaf is one of ``sorted_leaves``, found as runs of rows (far
        fewer leaves than rows are looked up)."""
        at = _runs(
            np.searchsorted(self.leaf, sorted_leaves, "left"),
            np.searchsorted(self.leaf, sorted_leaves, "right"),
        )
        if len(at) == len(self.leaf):
            return self
        return _Rows(self.leaf[at], self.timestamp[at], self.limbs[at])

    @staticmethod
    def concat(parts: list[_Rows]) -> _Rows:
        parts = [p for p in parts if len(p.leaf)]
        if len(parts) == 1:
            return parts[0]
        if not parts:
            empty = np.zeros(0, np.int64)
            return _Rows(empty, empty, np.zeros((0, LIMBS), ">u4"))
        return _Rows(
            np.concatenate([p.leaf for p in parts]),
            np.concatenate([p.timestamp for p in parts]),
            # As bytes: a concatenation of the limbs would swap them into native order.
            np.concatenate([p.limbs.view(np.uint8) for p in parts]).view(">u4"),
        )


class _Task:
    def __init__(
        self,
        plan: Plan,
        shift: int,
        leaves: np.ndarray | None,
        writers: list[_MissingWriter],
    ) -> None:
        self.plan, self.shift, self.leaves, self.writers = plan, shift, leaves, writers
        self.loaded: dict[int, _Rows] = {}
        self.bits = np.array([s.bit for s in plan.sources], dtype=np.int64)
        self.everyone = int(np.bitwise_or.reduce(self.bits)) if len(self.bits) else 0
        self.by_name = sorted(plan.sources, key=lambda source: source.name)

    def run(self, slices: list[Slice]) -> Iterator[pa.RecordBatch]:
        for s in slices:
            for g in [g for g in self.loaded if self.plan.groups[g].last < s.lo]:
                del self.loaded[g]
            for g in s.groups:
                if g not in self.loaded:
                    yield from self._load(g)
            yield from self._slice(s)

    def _load(self, number: int) -> Iterator[pa.RecordBatch]:
        group = self.plan.groups[number]
        table = read_row_group(group.file, group.index)
        timestamps = _one_array(table.column(TIMESTAMP))
        hashes = _one_array(table.column(MESSAGE_HASH))
        limbs = hash_limbs(hashes)
        if timestamps.null_count or limbs is None:
            # The driver names the file and column; the rows count as absent meanwhile.
            self.loaded[number] = _Rows.concat([])
            yield bad_leaf_row(self.plan.sources[group.source].name, timestamps, hashes)
            return
        ts = timestamps.to_numpy()
        leaf = ts >> self.shift
        if np.any(leaf[1:] < leaf[:-1]):
            order = np.argsort(leaf, kind="stable")
            leaf, ts, limbs = leaf[order], ts[order], limbs[order]
        rows = _Rows(leaf, ts, limbs)
        # Told the differing leaves, the task never looks at the other rows again.
        self.loaded[number] = rows if self.leaves is None else rows.in_leaves(self.leaves)

    def _slice(self, s: Slice) -> Iterator[pa.RecordBatch]:
        """Sum and compare the slice's leaves, then write the missing rows of those that
        differ.  Row groups are summed one by one and their sums merged: concatenating a
        slice's rows would copy them all, while only the differing leaves' rows are
        concatenated, to be grouped."""
        parts: list[list[_Rows]] = [[] for _ in self.plan.sources]
        for g in s.groups:
            parts[self.plan.groups[g].source].append(self.loaded[g].between(s.lo, s.hi))
        if self.leaves is not None:
            self._write_missing([_Rows.concat(p) for p in parts])
            return
        tables = [LeafTable.merge([sorted_leaf_sums(r.leaf, r.limbs) for r in p]) for p in parts]
        for source, table in zip(self.plan.sources, tables, strict=True):
            if len(table.leaf):
                yield leaf_rows(source.name, table)
        diff = differing(tables, np.unique(np.concatenate([t.leaf for t in tables])))[0]
        if len(diff):
            self._write_missing([_Rows.concat([r.in_leaves(diff) for r in p]) for p in parts])

    def _write_missing(self, rows: list[_Rows]) -> None:
        """Group the items of ``rows`` (per source); hand each source's writer the
        items it lacks, in (timestamp, message_hash) order.  Sorted in that order, the
        copies of an item are neighbours: a sort and a comparison of neighbours cost a
        third of a hash aggregation, and the output wants that order anyway."""
        every = _Rows.concat(rows)
        if not len(every.leaf):
            return
        data = np.ascontiguousarray(every.limbs).view(np.uint8)
        row_source = np.repeat(np.arange(len(rows)), [len(r.leaf) for r in rows])
        keys = pa.table({TIMESTAMP: every.timestamp, MESSAGE_HASH: _hashes(data)})
        order = pc.sort_indices(keys, sort_keys=[(c, "ascending") for c in COLUMNS]).to_numpy()
        timestamp, data = every.timestamp[order], data[order]
        words = data.view(np.uint64)
        new = (timestamp[1:] != timestamp[:-1]) | np.any(words[1:] != words[:-1], axis=1)
        starts = np.flatnonzero(np.concatenate(([True], new)))
        mask = np.bitwise_or.reduceat(self.bits[row_source[order]], starts)
        lacking = mask != self.everyone
        if not lacking.any():
            return
        first, mask = starts[lacking], mask[lacking]
        timestamps = pa.array(timestamp[first])
        hashes = _hashes(data[first]).cast(pa.binary())
        held_by = self._held_by(mask)
        for number, source in enumerate(self.plan.sources):
            lacks = (mask & source.bit) == 0
            if lacks.any():
                keep = pa.array(lacks)
                n = int(lacks.sum())
                self.writers[number].add(
                    pa.table(
                        [
                            pa.array([source.name] * n, pa.string()),
                            hashes.filter(keep),
                            timestamps.filter(keep),
                            held_by.filter(keep),
                        ],
                        schema=MISSING_SCHEMA,
                    )
                )

    def _held_by(self, mask: np.ndarray) -> pa.Array:
        """The sorted names of the archives in each mask."""
        masks, inverse = np.unique(mask, return_inverse=True)
        names = [[s.name for s in self.by_name if int(m) & s.bit] for m in masks]
        return pa.array(names, pa.list_(pa.string())).take(pa.array(inverse))


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array: a single chunk as it is (combine_chunks would copy it)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _hashes(data: np.ndarray) -> pa.Array:
    """The (rows, 32) bytes as an Arrow array of hashes, without a copy."""
    return pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(HASH_SIZE), len(data), [None, pa.py_buffer(data)]
    )


def _runs(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The indices ``start <= i < end`` of every run, in order."""
    lengths = ends - starts
    offsets = np.cumsum(lengths) - lengths
    return np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()))
