"""One definition of the archive's columns: the tables of both backends are built from it."""

from __future__ import annotations

from sdsync.store import SqlArchive
from sdsync.store.schema import ARCHIVE_COLUMNS, ARCHIVE_SCHEMA, COLUMNS, create_table


def test_both_backends_tables_have_exactly_the_archive_columns(archive: SqlArchive) -> None:
    with archive._read() as conn:
        if archive.backend == "sqlite":
            rows = conn.execute("PRAGMA table_info(messages)").fetchall()
            found = [(r[1], not r[3]) for r in rows]  # name, nullable
        else:
            rows = conn.execute(
                "SELECT column_name, is_nullable = 'YES' FROM information_schema.columns"
                " WHERE table_name = 'messages' ORDER BY ordinal_position"
            ).fetchall()
            found = [(r[0], r[1]) for r in rows]
    assert found == [(c.name, c.nullable) for c in ARCHIVE_COLUMNS]


def test_the_parquet_schema_and_column_list_follow_the_same_definition() -> None:
    assert tuple(ARCHIVE_SCHEMA.names) == COLUMNS == tuple(c.name for c in ARCHIVE_COLUMNS)
    ddl = create_table("postgresql", constraints="PRIMARY KEY (timestamp)")
    assert ddl.startswith("CREATE TABLE IF NOT EXISTS messages (\n    message_hash bytea NOT NULL,")
    assert "meta bytea,\n" in ddl and ddl.endswith("PRIMARY KEY (timestamp)\n);")
