"""Parquet export of an archive, in the layout the Spark pipeline reads.

Theory of operation
-------------------
``sdsync pipeline reconcile --archive DIR`` reads store archives as Parquet datasets
(:mod:`sdsync.pipeline.io`).  The export streams the archive in (timestamp, hash)
order, in batches, into a Hive-partitioned dataset::

    DIR/content_topic=<URL-escaped topic>/hour=<YYYYMMDDHH, UTC>/part-<n>.parquet

with these columns:

================  ===========  ===================================================
``message_hash``  binary       the 32-byte deterministic message hash
``timestamp``     int64        Unix time in nanoseconds
``pubsub_topic``  string
``content_topic`` string       partition directory (Spark and pyarrow restore it)
``payload``       binary
``meta``          binary       empty when the message had none
``version``       int32
``hour``          int32        partition directory: UTC hour of ``timestamp``
================  ===========  ===================================================

As Spark's own ``partitionBy`` does, the partition columns live in the directory
names only.  Partitioning by content topic lets an application's analysis read only
its topics; by hour, lets a reconciliation read only the hours it compares.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

from sdsync.store.archive import Archive
from sdsync.store.schema import ARCHIVE_SCHEMA
from sdsync.waku.messages import StoredMessage

HOUR_NS = 3_600 * 10**9
BATCH_ROWS = 50_000
# The archive columns plus the hour partition key (hours since the epoch).
EXPORT_SCHEMA = ARCHIVE_SCHEMA.append(pa.field("hour", pa.int32()))
PARTITIONING = ds.partitioning(
    pa.schema([("content_topic", pa.string()), ("hour", pa.int32())]), flavor="hive"
)


@dataclass
class ExportReport:
    directory: Path
    rows: int = 0
    files: int = 0


def export_parquet(
    archive: Archive,
    directory: Path,
    *,
    start: int | None = None,
    end: int | None = None,
    overwrite: bool = False,
) -> ExportReport:
    """Write the messages with ``start <= timestamp < end`` (default: all) to ``directory``.

    FileExistsError if ``directory`` holds files and not ``overwrite``; a report of 0 rows
    (and no directory made) if no message is in the range."""
    if not overwrite and directory.is_dir() and any(directory.iterdir()):
        raise FileExistsError(f"{directory} is not empty (give --overwrite to replace its export)")
    report = ExportReport(directory)

    def counted(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            report.rows += batch.num_rows
            yield batch

    def file_written(_: object) -> None:
        report.files += 1

    ds.write_dataset(
        counted(_batches(archive.messages(start, end))),
        directory,
        schema=EXPORT_SCHEMA,
        format="parquet",
        partitioning=PARTITIONING,
        basename_template="part-{i}.parquet",
        existing_data_behavior="delete_matching" if overwrite else "error",
        file_visitor=file_written,
    )
    return report


def _batches(messages: Iterator[StoredMessage]) -> Iterator[pa.RecordBatch]:
    hours: dict[int, int] = {}
    columns: dict[str, list[object]] = {name: [] for name in EXPORT_SCHEMA.names}
    for stored in messages:
        msg = stored.message
        hour = stored.timestamp // HOUR_NS
        if hour not in hours:
            hours[hour] = int(time.strftime("%Y%m%d%H", time.gmtime(hour * 3_600)))
        row = (
            stored.message_hash,
            stored.timestamp,
            stored.pubsub_topic,
            msg.content_topic,
            msg.payload,
            msg.meta,
            msg.version,
            hours[hour],
        )
        for name, value in zip(EXPORT_SCHEMA.names, row, strict=True):
            columns[name].append(value)
        if len(columns["timestamp"]) >= BATCH_ROWS:
            yield pa.RecordBatch.from_pydict(columns, schema=EXPORT_SCHEMA)
            columns = {name: [] for name in EXPORT_SCHEMA.names}
    if columns["timestamp"]:
        yield pa.RecordBatch.from_pydict(columns, schema=EXPORT_SCHEMA)
