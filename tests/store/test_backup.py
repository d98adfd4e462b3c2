"""`sdsync store backup`: a consistent copy of a live SQLite archive, or nothing at PATH.

The load test runs a real `sdsync store serve` taking POSTs from a thread while backups
are taken as separate processes: each must hold every message answered before it began.
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from storeprocess import SYNC_TOKEN, TOPIC, ingest_messages, store_serve
from storetest import PUBSUB, T0, make_messages
from typer.testing import CliRunner

import sdsync.store.backup as backup_module
from sdsync.cli.main import app
from sdsync.store import StoredMessage, open_archive
from sdsync.store.backup import (
    BackupFailed,
    BackupRefusedError,
    backup_archive,
    postgres_advice,
)
from sdsync.wire.waku import WakuMessage

ARCHIVE = "store.sqlite3"  # the CLI's name for it under --data-dir
BACKUP = [sys.executable, "-m", "sdsync.cli", "store", "backup"]


def bulky_messages(n: int, payload_bytes: int, seed: int = 7) -> list[StoredMessage]:
    """``n`` messages of ``payload_bytes`` each: an archive of many pages."""
    rng = random.Random(seed)
    return [
        StoredMessage.of(
            PUBSUB,
            WakuMessage(rng.randbytes(payload_bytes), "/app/1/bulk/proto", timestamp=T0 + i),
        )
        for i in range(n)
    ]


def make_archive(data_dir: Path, messages: list[StoredMessage]) -> Path:
    path = data_dir / ARCHIVE
    archive = open_archive(str(path))
    try:
        archive.insert(messages)
    finally:
        archive.close()
    return path


def backup_hashes(path: Path) -> set[bytes]:
    """Every hash in the backup file alone (``immutable``: no -wal beside it is read or
    made)."""
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        return {row[0] for row in conn.execute("SELECT message_hash FROM messages")}
    finally:
        conn.close()


def leftovers(directory: Path, keep: set[str]) -> set[str]:
    """Files in ``directory`` other than ``keep``: partial copies, journals.  A stopped
    archive's read-only reader leaves an empty -wal and a -shm beside it: not counted."""
    side = {ARCHIVE + "-shm"}
    wal = directory / (ARCHIVE + "-wal")
    if wal.exists() and wal.stat().st_size == 0:
        side.add(wal.name)
    return set(os.listdir(directory)) - keep - side


def run_backup(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["store", "backup", *args])
    return result.exit_code, result.output


# -- (a) a backup opens as an archive and holds every message


def test_backup_of_a_live_archive_opens_and_holds_every_message(tmp_path: Path) -> None:
    messages = make_messages(500)
    source = make_archive(tmp_path, messages)
    live = open_archive(str(source))  # as a serving node holds it
    try:
        target = tmp_path / "backups" / "store-backup.sqlite3"
        target.parent.mkdir()
        code, output = run_backup(str(target), "--data-dir", str(tmp_path))
        assert code == 0, output
        assert "backed up 500 messages (" in output
        assert f"from {source} to {target} in " in output
        copy = open_archive(str(target))
        try:
            assert copy.count() == 500
            assert {m.message_hash for m in copy.messages()} == {m.message_hash for m in messages}
        finally:
            copy.close()
        # The source was opened read-only, sent no PRAGMA: still the archive's WAL mode.
        assert source.read_bytes()[18:20] == b"\x02\x02"
        assert live.count() == 500
    finally:
        live.close()
    assert leftovers(target.parent, {target.name}) == set()


def test_backup_is_one_snapshot_while_the_archive_is_written_between_steps(
    tmp_path: Path,
) -> None:
    """The copy never restarts however often the archive is written between its steps,
    and holds what was committed when it began: no more, no less."""
    before = bulky_messages(3_000, 900)
    source = make_archive(tmp_path, before)
    live = open_archive(str(source))
    writes = iter(bulky_messages(2_000, 900, seed=8))
    copied: list[int] = []

    def write_between_steps(done: int, total: int) -> None:
        copied.append(done)
        assert done <= total
        live.insert([next(writes) for _ in range(10)])  # another connection's commit

    try:
        report = backup_archive(
            str(source), tmp_path / "copy.sqlite3", progress=write_between_steps, step_pages=16
        )
        assert live.count() == 3_000 + 10 * len(copied)
    finally:
        live.close()
    assert len(copied) > 20, "the copy should take many steps"
    assert copied == sorted(copied), "the copy restarted"
    assert report.messages == 3_000
    assert backup_hashes(report.path) == {m.message_hash for m in before}


# -- (b) under load: a serving node, POSTs from a thread, backups as processes


def test_backups_under_load_hold_every_message_answered_before_they_began(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "node"
    data_dir.mkdir()
    make_archive(data_dir, bulky_messages(20_000, 1_000))  # ~37 MB: ten steps a copy
    answered: list[tuple[float, set[bytes]]] = []  # (when the POST was answered, its hashes)
    stop = threading.Event()
    failures: list[BaseException] = []

    with store_serve(data_dir, TOPIC, flags=["--token", SYNC_TOKEN]) as store:

        def load() -> None:
            batch = 0
            try:
                while not stop.is_set():
                    hashes = ingest_messages(store, 20, f"load {batch}")
                    answered.append((time.monotonic(), {bytes.fromhex(h) for h in hashes}))
                    batch += 1
            except BaseException as exc:
                failures.append(exc)

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        try:
            while len(answered) < 5:
                assert not failures, failures
                time.sleep(0.05)
            runs: list[tuple[float, float, Path, str]] = []
            for k in range(5):
                path = tmp_path / f"backup-{k}.sqlite3"
                began = time.monotonic()
                done = subprocess.run(
                    [*BACKUP, str(path), "--data-dir", str(data_dir)],
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=False,
                )
                assert done.returncode == 0, done.stderr
                runs.append((began, time.monotonic(), path, done.stdout))
        finally:
            stop.set()
            loader.join(timeout=60)
        assert not failures, failures

    for began, _, path, stdout in runs:
        held = backup_hashes(path)
        before = set().union(*(hashes for at, hashes in answered if at < began))
        assert before <= held, f"{len(before - held)} answered messages missing from {path}"
        assert f"backed up {len(held)} messages" in stdout
        assert len(held) >= 20_000 + len(before)
    # The node kept answering while the copies ran: a backup blocks no writer.
    during = [at for began, ended, _, _ in runs for at, _ in answered if began <= at <= ended]
    assert during, "no POST was answered while a backup ran"


# -- (c) an existing PATH


def test_an_existing_path_is_refused_and_kept_unless_overwrite(tmp_path: Path) -> None:
    make_archive(tmp_path, make_messages(50))
    target = tmp_path / "backup.sqlite3"
    target.write_bytes(b"an earlier backup")
    code, output = run_backup(str(target), "--data-dir", str(tmp_path))
    assert code == 2
    assert "exists (give --overwrite to replace it)" in output
    assert target.read_bytes() == b"an earlier backup"

    code, output = run_backup(str(target), "--data-dir", str(tmp_path), "--overwrite")
    assert code == 0, output
    assert len(backup_hashes(target)) == 50
    assert leftovers(tmp_path, {ARCHIVE, target.name}) == set()


def test_the_archive_itself_and_a_leftover_wal_beside_path_are_refused(tmp_path: Path) -> None:
    source = make_archive(tmp_path, make_messages(10))
    code, output = run_backup(str(source), "--data-dir", str(tmp_path), "--overwrite")
    assert code == 2
    assert "is the archive itself" in output
    target = tmp_path / "backup.sqlite3"
    wal = tmp_path / "backup.sqlite3-wal"
    wal.write_bytes(b"")  # what a read-only reader of an earlier backup leaves: harmless
    code, output = run_backup(str(target), "--data-dir", str(tmp_path))
    assert code == 0, output
    wal.write_bytes(b"frames of another database")
    code, output = run_backup(str(target), "--data-dir", str(tmp_path), "--overwrite")
    assert code == 2
    assert "SQLite would apply it" in output
    assert len(backup_hashes(target)) == 10


# -- (d) a failure midway leaves PATH as it was, and no partial file


@pytest.mark.parametrize("stop", [RuntimeError("boom"), KeyboardInterrupt()])
def test_a_failure_midway_leaves_nothing_at_path(tmp_path: Path, stop: BaseException) -> None:
    source = make_archive(tmp_path, bulky_messages(1_000, 900))
    target = tmp_path / "backup.sqlite3"
    steps: list[int] = []

    def fail_on_third_step(done: int, total: int) -> None:
        steps.append(done)
        if len(steps) == 3:
            raise stop

    with pytest.raises(type(stop)):
        backup_archive(str(source), target, progress=fail_on_third_step, step_pages=8)
    assert len(steps) == 3
    assert leftovers(tmp_path, {ARCHIVE}) == set()

    target.write_bytes(b"an earlier backup")
    steps.clear()
    with pytest.raises(type(stop)):
        backup_archive(
            str(source), target, overwrite=True, progress=fail_on_third_step, step_pages=8
        )
    assert target.read_bytes() == b"an earlier backup"
    assert leftovers(tmp_path, {ARCHIVE, target.name}) == set()


def test_a_disk_failure_midway_exits_1_with_nothing_at_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_archive(tmp_path, bulky_messages(2_000, 900))
    steps: list[int] = []

    def disk_full_midway(progress: object, page_size: int) -> object:
        def step(status: int, remaining: int, pages: int) -> None:
            steps.append(remaining)
            if len(steps) == 2:
                raise sqlite3.OperationalError("database or disk is full")

        return step

    monkeypatch.setattr(backup_module, "_step_reporter", disk_full_midway)
    monkeypatch.setattr(backup_module, "STEP_PAGES", 8)
    target = tmp_path / "backup.sqlite3"
    code, output = run_backup(str(target), "--data-dir", str(tmp_path))
    assert code == 1, output
    assert "backup failed: cannot copy the archive" in output
    assert "database or disk is full" in output
    assert len(steps) == 2
    assert leftovers(tmp_path, {ARCHIVE}) == set()


def test_a_copy_that_does_not_check_out_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_archive(tmp_path, make_messages(20))

    def refuse(partial: Path, expected: int) -> None:
        raise BackupFailed(f"the copy holds {expected - 1} messages, the archive held {expected}")

    monkeypatch.setattr(backup_module, "_verify", refuse)
    code, output = run_backup(str(tmp_path / "b.sqlite3"), "--data-dir", str(tmp_path))
    assert code == 1
    assert "the copy holds 19 messages, the archive held 20" in output
    assert leftovers(tmp_path, {ARCHIVE}) == set()


# -- (e) not an archive, (f) PostgreSQL


def test_what_is_not_an_archive_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite3"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.commit()
    conn.close()
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"not a database, " * 100)
    target = tmp_path / "backup.sqlite3"
    for source, why in [
        (other, "has no messages table"),
        (junk, "not an sdsync archive"),
        (tmp_path / "missing.sqlite3", "no archive at"),
    ]:
        code, output = run_backup(str(target), "--db", str(source))
        assert code == 2, output
        assert why in output
        assert not target.exists()
    code, output = run_backup(str(target), "--data-dir", str(tmp_path / "empty"))
    assert code == 2
    assert "no archive at" in output
    assert leftovers(tmp_path, {other.name, junk.name}) == set()


@pytest.mark.parametrize("url", ["postgresql://sdsync@db.example/store", "postgres://h/db"])
def test_a_postgresql_archive_is_refused_with_pg_dump_advice(tmp_path: Path, url: str) -> None:
    target = tmp_path / "store.dump"
    code, output = run_backup(str(target), "--db", url)
    assert code == 2
    flat = " ".join(output.split())
    assert f"pg_dump --format=custom --file {target} DBURL" in flat
    assert f"pg_restore --clean --if-exists --dbname DBURL {target}" in flat
    assert not target.exists()
    with pytest.raises(BackupRefusedError) as refused:
        backup_archive(url, target)
    assert str(refused.value) == postgres_advice(target.absolute())
