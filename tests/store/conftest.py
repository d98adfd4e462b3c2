"""Fixtures of the store tests: one archive suite, run on SQLite and on PostgreSQL.

PostgreSQL is a throwaway cluster per test worker (see :mod:`sdsync.testing.pgcluster`),
started on first use. In CI (``CI`` or ``SDSYNC_REQUIRE_POSTGRES`` set) a cluster that
cannot start fails the tests; locally they are skipped with the reason.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdsync.store import SqlArchive, open_archive
from sdsync.testing.pgcluster import PostgresUnavailableError, TempCluster, start_cluster

_databases = itertools.count()


def postgres_required() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("SDSYNC_REQUIRE_POSTGRES"))


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[TempCluster]:
    try:
        cluster = start_cluster()
    except PostgresUnavailableError as exc:
        message = f"PostgreSQL is needed for the PostgreSQL archive tests: {exc}"
        if postgres_required():
            pytest.fail(message, pytrace=False)
        pytest.skip(message + " (install it with: apt-get install postgresql)")
    yield cluster
    cluster.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def archive_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh, empty archive location on each backend."""
    if request.param == "sqlite":
        return str(tmp_path_factory.mktemp("archive") / "store.sqlite3")
    cluster: TempCluster = request.getfixturevalue("pg_cluster")
    return cluster.create_database(f"t{os.getpid()}_{next(_databases)}")


@pytest.fixture
def archive(archive_url: str) -> Iterator[SqlArchive]:
    opened = open_archive(archive_url)
    yield opened
    opened.close()


@pytest.fixture
def sqlite_archive(tmp_path: Path) -> Iterator[SqlArchive]:
    """For tests about the node rather than the archive: SQLite only."""
    archive = open_archive(str(tmp_path / "store.sqlite3"))
    yield archive
    archive.close()  # idempotent: the node closes it too
