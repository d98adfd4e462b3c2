"""Parquet export: the pipeline's archive reader accepts it, and it holds every message."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pyarrow.dataset as ds
import pytest
from storetest import HOUR, PUBSUB, T0, in_order, make_messages
from testdeps import require

from sdsync.pipeline.io import binary_column, inspect_parquet, long_column, string_column
from sdsync.store import SqlArchive, export_parquet

# What `sdsync pipeline reconcile` checks (its ARCHIVE_COLUMNS), plus the other columns.
ARCHIVE_COLUMNS = [binary_column("message_hash"), long_column("timestamp")]
ALL_COLUMNS = [
    *ARCHIVE_COLUMNS,
    string_column("pubsub_topic"),
    string_column("content_topic"),
    binary_column("payload"),
    binary_column("meta"),
]


def test_pipeline_columns_match_reconcile() -> None:
    reconcile = require("sdsync.pipeline.reconcile", "the pipeline needs the 'spark' extra")
    assert [c.name for c in reconcile.ARCHIVE_COLUMNS] == [c.name for c in ARCHIVE_COLUMNS]


def test_export_is_read_back_whole_by_the_pipeline_reader(
    archive: SqlArchive, tmp_path: Path
) -> None:
    messages = in_order(make_messages(500, span=3 * HOUR))
    archive.insert(messages)
    out = tmp_path / "export"
    report = export_parquet(archive, out)
    assert report.rows == 500

    found = inspect_parquet(str(out), ALL_COLUMNS, min_max=("timestamp",))
    assert found.rows == 500
    assert found.min_max["timestamp"] == (messages[0].timestamp, messages[-1].timestamp)
    assert {"content_topic", "hour"} <= found.columns
    # T0 is 22:13 UTC: three hours of messages touch four clock hours.
    assert len(found.files) == report.files == 3 * 4  # content topics x hours
    topic_dir = out / f"content_topic={quote('/app/1/chat/proto', safe='')}"
    assert sorted(p.name for p in topic_dir.iterdir()) == [
        "hour=2023111422",
        "hour=2023111423",
        "hour=2023111500",
        "hour=2023111501",
    ]
    table = ds.dataset(out, format="parquet", partitioning="hive").to_table()
    rows = sorted(table.to_pylist(), key=lambda r: (r["timestamp"], r["message_hash"]))
    assert [(r["message_hash"], r["timestamp"]) for r in rows] == [
        (m.message_hash, m.timestamp) for m in messages
    ]
    first = rows[0]
    assert (first["pubsub_topic"], first["content_topic"]) == (
        PUBSUB,
        messages[0].message.content_topic,
    )
    assert (first["payload"], first["meta"], first["version"]) == (
        messages[0].message.payload,
        b"",
        0,
    )


def test_export_of_a_window_and_refusal_to_overwrite(archive: SqlArchive, tmp_path: Path) -> None:
    messages = in_order(make_messages(100, span=2 * HOUR))
    archive.insert(messages)
    out = tmp_path / "export"
    assert export_parquet(archive, out, start=T0, end=T0 + HOUR).rows == sum(
        m.timestamp < T0 + HOUR for m in messages
    )
    with pytest.raises(FileExistsError, match="give --overwrite"):
        export_parquet(archive, out)
    assert export_parquet(archive, out, overwrite=True).rows == 100
