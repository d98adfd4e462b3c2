"""The archive's shape: one definition of its columns.

Theory of operation
-------------------
A store archive has nwaku's columns: the deterministic Waku message hash, the timestamp
(Unix ns), the pubsub and content topics, the payload, the meta and the version. They are
written down once, here, with their SQL type on each backend and their Arrow type; the
SQLite and PostgreSQL tables, the column list the archive's statements use, and the
Parquet schema of an export (which the simulator's store nodes write too and
``sdsync pipeline reconcile`` reads) are all built from :data:`ARCHIVE_COLUMNS`. The store
owns this shape; the simulator and the Spark pipeline import it from here.

The layout an archive is at has a number, :data:`SCHEMA_VERSION`, kept in the database:
a change to these columns (or to the backends' indexes) is a new number and one step in
:mod:`sdsync.store.migrations`, which brings archives written by earlier releases to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

Dialect = Literal["sqlite", "postgresql"]
#: The archive layout this code reads and writes (the steps to it: store/migrations.py).
SCHEMA_VERSION = 3


@dataclass(frozen=True)
class Column:
    name: str
    sqlite: str
    postgresql: str
    arrow: pa.DataType
    nullable: bool = False

    def ddl(self, dialect: Dialect) -> str:
        sql_type = self.sqlite if dialect == "sqlite" else self.postgresql
        return f"{self.name} {sql_type}" + ("" if self.nullable else " NOT NULL")


ARCHIVE_COLUMNS = (
    Column("message_hash", "BLOB", "bytea", pa.binary()),
    Column("timestamp", "INTEGER", "bigint", pa.int64()),
    Column("pubsub_topic", "TEXT", "text", pa.string()),
    Column("content_topic", "TEXT", "text", pa.string()),
    Column("payload", "BLOB", "bytea", pa.binary()),
    Column("meta", "BLOB", "bytea", pa.binary(), nullable=True),
    Column("version", "INTEGER", "bigint", pa.int32()),
)
COLUMNS = tuple(c.name for c in ARCHIVE_COLUMNS)
#: The key reconciliation and the pipeline read, by name.
MESSAGE_HASH, TIMESTAMP = COLUMNS[:2]
#: The archive as Parquet: what `sdsync store export` and the simulator's store nodes
#: write and `sdsync pipeline reconcile` reads.
ARCHIVE_SCHEMA = pa.schema([(c.name, c.arrow) for c in ARCHIVE_COLUMNS])


def create_table(dialect: Dialect, *, constraints: str = "", options: str = "") -> str:
    """``CREATE TABLE IF NOT EXISTS messages (...)`` with the archive's columns."""
    lines = [c.ddl(dialect) for c in ARCHIVE_COLUMNS]
    if constraints:
        lines.append(constraints)
    body = ",\n    ".join(lines)
    return (
        f"CREATE TABLE IF NOT EXISTS messages (\n    {body}\n){' ' + options if options else ''};"
    )
