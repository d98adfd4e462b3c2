"""Which archive backend a database names: the one module that knows them all.

The backends (:mod:`~sdsync.store.sqlite`, :mod:`~sdsync.store.postgres`) build on the
contract in :mod:`~sdsync.store.archive`; choosing between them sits above all three, so
the contract never imports its own implementations.  A new backend is a module below this
one and a scheme here.
"""

from __future__ import annotations

from sdsync.store.archive import SqlArchive

__all__ = ["open_archive", "sqlite_path"]

_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def sqlite_path(db: str) -> str | None:
    """The SQLite file ``db`` names (``sqlite://`` prefix optional); None for a
    PostgreSQL URL."""
    return None if db.startswith(_POSTGRES_SCHEMES) else db.removeprefix("sqlite://")


def open_archive(db: str) -> SqlArchive:
    """The archive at ``db``: a ``postgresql://`` URL, or a SQLite file path
    (``sqlite://`` prefix optional)."""
    path = sqlite_path(db)
    if path is None:
        # Imported on demand: psycopg is only needed by nodes that use PostgreSQL.
        from sdsync.store.postgres import PostgresArchive

        return PostgresArchive(db)
    from sdsync.store.sqlite import SqliteArchive

    return SqliteArchive(path)
