"""Upgrades: state directories written by earlier releases open, migrated in place, with
every message.

The fixtures in ``fixtures/state`` were made by the code of earlier commits
(``fixtures/make_state.py``, ``fixtures/state/README.md``): what ``sdsync chat
--state-dir`` left after two scripted sessions, for every earlier schema version, and what
``sdsync reliability serve --state-dir`` left where that code had the service. What they
hold is checked against ``manifest.json``, which the old code wrote as it made them, never
against the code under test. They are opened three ways: through the runtime's
:class:`ChannelState`, as the chat and the service open them on a restart, and by
``sdsync chat --print-log`` in a process. A state file written by a newer release must be
refused and left byte for byte; a migration that fails midway must leave the file at its
old version with all its data.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

import sdsync.reliability
from sdsync.chat import ChatOptions
from sdsync.chat.identity import load_identity
from sdsync.chat.session import SENT, ChatSession
from sdsync.cli import chat as cli_chat
from sdsync.cli import reliability as cli_reliability
from sdsync.cli.main import app
from sdsync.core import ChannelConfig, MessageChannel, MessageDelivered
from sdsync.errors import LocalProtocolError
from sdsync.runtime import ChannelDriver, ChannelState, ReliableChannel, RuntimeConfig
from sdsync.runtime import state as runtime_state
from sdsync.runtime.manager import ReliabilityManager
from sdsync.runtime.state import SCHEMA_VERSION, LogRecord
from sdsync.testing.memory import MemoryNetwork

FIXTURES = Path(__file__).parent / "fixtures" / "state"
MANIFEST: dict[str, Any] = json.loads((FIXTURES / "manifest.json").read_text(encoding="utf-8"))
NAMES = sorted(MANIFEST["fixtures"])
CHATS = [n for n in NAMES if MANIFEST["fixtures"][n]["kind"] == "chat"]
SERVICES = [n for n in NAMES if MANIFEST["fixtures"][n]["kind"] == "reliability"]
NOW_MS = int(time.time() * 1000)


def fixture(name: str) -> dict[str, Any]:
    found: dict[str, Any] = MANIFEST["fixtures"][name]
    return found


def unpack(name: str, into: Path) -> Path:
    """A copy of fixture ``name``'s state directory, its SQLite files unpacked (gzip only
    made them small: the bytes are those the old code wrote)."""
    state_dir = into / name
    shutil.copytree(FIXTURES / name, state_dir)
    for packed in state_dir.glob("*.sqlite.gz"):
        packed.with_suffix("").write_bytes(gzip.decompress(packed.read_bytes()))
        packed.unlink()
    return state_dir


def state_file(name: str, state_dir: Path) -> Path:
    return state_dir / str(fixture(name)["state_file"])


# -- the file, seen with the SQLite driver alone


def stored_version(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("SELECT schema_version FROM channel").fetchone()[0])
    finally:
        db.close()


def contents(path: Path) -> dict[str, tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]]:
    """Every table: its columns and its rows (in a stable order)."""
    db = sqlite3.connect(path)
    try:
        tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {
            t: (
                db.execute(f"PRAGMA table_info('{t}')").fetchall(),
                sorted(db.execute(f"SELECT * FROM '{t}'").fetchall(), key=repr),
            )
            for t in tables
        }
    finally:
        db.close()


def on_disk(path: Path) -> tuple[str, list[str]]:
    """The file byte for byte, and what lies beside it (no WAL or journal left behind)."""
    beside = sorted(p.name for p in path.parent.iterdir())
    return hashlib.sha256(path.read_bytes()).hexdigest(), beside


# -- what must be found


def expected_log(name: str) -> list[tuple[str, str, int, bytes]]:
    """The log as the old code showed it: (id, sender, Lamport timestamp, content)."""
    made = fixture(name)
    if made["kind"] == "chat":  # --print-log lines: the content as text
        return [
            (m["message_id"], m["sender_id"], m["lamport_timestamp"], m["text"].encode())
            for m in made["log"]
        ]
    return [
        (m["message_id"], m["sender_id"], m["lamport_timestamp"], bytes.fromhex(m["content"]))
        for m in made["log"]
    ]


def unacknowledged(name: str) -> list[str]:
    """Our messages nobody acknowledged: ids (the chat's), or messages (the service's)."""
    made = fixture(name)["unacknowledged"]
    return [m if isinstance(m, str) else m["message_id"] for m in made]


def as_log(records: list[LogRecord]) -> list[tuple[str, str, int, bytes]]:
    return [(r.message_id, r.sender_id, r.lamport_timestamp, r.content or b"") for r in records]


def open_state(name: str, path: Path) -> ChannelState:
    """The runtime's own way in: a driver over a channel of the fixture's ids."""
    made = fixture(name)
    channel = MessageChannel(
        made["channel_id"], made["participant_id"], now_ms=NOW_MS, config=ChannelConfig()
    )
    driver = ChannelDriver(channel, RuntimeConfig(), random.Random(0), NOW_MS)
    return ChannelState(path, driver)


def assert_every_message_found(name: str, state: ChannelState) -> None:
    made = fixture(name)
    assert as_log(state.history()) == expected_log(name)
    channel = state.channel
    assert channel.lamport_timestamp == made["lamport"]
    assert channel.outgoing_ids() == unacknowledged(name)
    assert channel.incoming_ids() == [m["message_id"] for m in made.get("waiting", [])]
    assert channel.missing_ids() == [m["message_id"] for m in made.get("missing", [])]
    # Every delivery was taken in the old sessions: the migration makes no event of them.
    assert state.events.read(0, 100) == []


# -- the runtime state


def test_there_is_a_fixture_of_every_earlier_schema_version() -> None:
    earlier = list(range(1, SCHEMA_VERSION))
    assert sorted(int(v) for v in MANIFEST["schema_versions"]) == earlier
    assert sorted(runtime_state._MIGRATIONS) == earlier  # a step from each of them
    assert sorted(fixture(n)["schema_version"] for n in CHATS) == earlier
    assert SERVICES  # the reliability service kept state from schema 3 on


@pytest.mark.parametrize("name", NAMES)
def test_each_fixture_is_at_the_version_its_code_wrote(name: str, tmp_path: Path) -> None:
    path = state_file(name, unpack(name, tmp_path))
    made = fixture(name)
    assert stored_version(path) == made["schema_version"] < SCHEMA_VERSION
    assert MANIFEST["schema_versions"][str(made["schema_version"])] == made["commit"]


@pytest.mark.parametrize("name", NAMES)
def test_the_runtime_state_migrates_each_fixture_with_every_message(
    name: str, tmp_path: Path
) -> None:
    path = state_file(name, unpack(name, tmp_path))
    state = open_state(name, path)
    try:
        assert_every_message_found(name, state)
    finally:
        state.close()
    assert stored_version(path) == SCHEMA_VERSION
    assert not Path(f"{path}-wal").exists()  # closed cleanly, everything in the file


@pytest.mark.parametrize("name", NAMES)
def test_opening_a_migrated_state_again_changes_nothing(name: str, tmp_path: Path) -> None:
    path = state_file(name, unpack(name, tmp_path))
    open_state(name, path).close()
    migrated = on_disk(path)
    state = open_state(name, path)
    try:
        assert_every_message_found(name, state)
    finally:
        state.close()
    assert on_disk(path) == migrated


@pytest.mark.parametrize("found", [SCHEMA_VERSION + 1, 99, 0])
@pytest.mark.parametrize("name", NAMES)
def test_a_state_file_at_a_version_this_release_does_not_know_is_refused_untouched(
    name: str, found: int, tmp_path: Path
) -> None:
    path = state_file(name, unpack(name, tmp_path))
    open_state(name, path).close()
    make_newer(path, found)
    before = on_disk(path)
    with pytest.raises(LocalProtocolError) as refused:
        open_state(name, path)
    assert on_disk(path) == before
    message = str(refused.value)
    assert f"its schema version is {found} and this sdsync's is {SCHEMA_VERSION}" in message
    if found > SCHEMA_VERSION:
        assert "written by a newer sdsync; upgrade sdsync or use another state directory" in message
    else:
        assert "no sdsync writes that version" in message


def make_newer(path: Path, version: int) -> None:
    """As a newer release might leave the file: its number, and a table this one cannot
    know of (the driver alone; its last close puts the WAL back into the file)."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("BEGIN")
        db.execute("UPDATE channel SET schema_version = ?", (version,))
        db.execute("CREATE TABLE sdsync_future (x INTEGER)")
        db.execute("COMMIT")
    finally:
        db.close()


def test_a_newer_state_file_without_a_table_of_ours_is_refused_untouched(tmp_path: Path) -> None:
    name = CHATS[-1]
    path = state_file(name, unpack(name, tmp_path))
    open_state(name, path).close()
    make_newer(path, SCHEMA_VERSION + 1)
    db = sqlite3.connect(path)
    db.execute("DROP TABLE wrapped")  # a newer release may have moved the wraps elsewhere
    db.commit()
    db.close()
    before = on_disk(path)
    with pytest.raises(LocalProtocolError, match="written by a newer sdsync"):
        open_state(name, path)
    assert on_disk(path) == before


@pytest.mark.parametrize("how", ["database", "code"])
@pytest.mark.parametrize("name", NAMES)
def test_a_migration_that_fails_midway_leaves_the_file_at_its_old_version(
    name: str, how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = state_file(name, unpack(name, tmp_path))
    version = fixture(name)["schema_version"]
    before = contents(path)
    if how == "database":  # the last SQL step fails after every earlier statement ran
        last = SCHEMA_VERSION - 1
        failing = runtime_state._MIGRATIONS[last] + "; ALTER TABLE no_such_table ADD COLUMN x"
        monkeypatch.setitem(runtime_state._MIGRATIONS, last, failing)
        raised: type[BaseException] = sqlite3.OperationalError
    else:  # our code fails after every SQL step ran

        def fail(self: ChannelState) -> None:
            raise RuntimeError("a step that fails")

        monkeypatch.setattr(ChannelState, "_events_from_v3", fail)
        raised = RuntimeError
    with pytest.raises(raised):
        open_state(name, path)
    assert stored_version(path) == version
    after = contents(path)
    # Every table the old code wrote keeps its columns and rows, and no table of the
    # current schema appears: it is created in the migration's transaction.
    assert after == before
    monkeypatch.undo()
    state = open_state(name, path)  # the next open migrates from the old version again
    try:
        assert_every_message_found(name, state)
    finally:
        state.close()
    assert stored_version(path) == SCHEMA_VERSION


# -- the chat, as `sdsync chat --state-dir` opens it


def chat_options(
    monkeypatch: pytest.MonkeyPatch, state_dir: Path, channel: str, *flags: str
) -> ChatOptions:
    """The options the current ``sdsync chat`` builds from its flags (it is not run)."""
    made: list[ChatOptions] = []

    def capture(options: ChatOptions) -> int:
        made.append(options)
        return 0

    monkeypatch.setattr(cli_chat, "chat_main", capture)
    args = ["chat", "--state-dir", str(state_dir), "--channel", channel, *flags]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return made[0]


def reopened_chat(options: ChatOptions) -> ReliableChannel:
    """What ``run_chat`` opens at start: the identity, then the channel over its state."""
    identity = load_identity(options.state_dir, options.name)
    return ReliableChannel(
        MemoryNetwork().transport(identity.participant_id),
        options.channel,
        identity.participant_id,
        config=options.config,
        runtime=options.runtime,
        state_dir=options.state_dir,
    )


@pytest.mark.parametrize("name", CHATS)
def test_a_chat_resumes_from_the_state_dir_of_an_earlier_release(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = fixture(name)
    state_dir = unpack(name, tmp_path)
    options = chat_options(monkeypatch, state_dir, made["channel_id"])
    identity = load_identity(state_dir, made["participant_id"])  # the name it was given
    assert identity.participant_id == made["participant_id"]
    assert identity.listen == made["listen"]

    async def resume() -> tuple[list[dict[str, Any]], dict[str, str], int]:
        channel = reopened_chat(options)
        try:
            session = ChatSession(channel, Console(file=io.StringIO()))
            session.resume()
            lines = [json.loads(line.to_json()) for line in session.log()]
            return lines, session.status, channel.channel.lamport_timestamp
        finally:
            await channel.close()

    lines, status, lamport = asyncio.run(resume())
    assert lines == made["log"]  # what the old chat's --print-log printed
    # The message nobody acknowledged is ours, still to resend, and shown as sent.
    assert status == {mid: SENT for mid in made["unacknowledged"]}
    assert lamport == made["lamport"]
    assert stored_version(state_file(name, state_dir)) == SCHEMA_VERSION


@pytest.mark.parametrize("name", CHATS)
def test_sdsync_chat_prints_the_log_of_an_earlier_release(name: str, tmp_path: Path) -> None:
    made = fixture(name)
    state_dir = unpack(name, tmp_path)
    # chat.json's listen address is the old run's (port 0): a free port here.
    command = [sys.executable, "-m", "sdsync.cli", "chat", "--state-dir", str(state_dir)]
    command += ["--channel", made["channel_id"], "--print-log"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == made["log"]
    assert f"you are {made['participant_id']} in channel {made['channel_id']}" in done.stderr
    assert stored_version(state_file(name, state_dir)) == SCHEMA_VERSION


@pytest.mark.parametrize("name", CHATS)
def test_a_chat_refuses_a_state_dir_of_a_newer_release_untouched(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = fixture(name)
    state_dir = unpack(name, tmp_path)
    path = state_file(name, state_dir)
    open_state(name, path).close()
    make_newer(path, SCHEMA_VERSION + 1)
    before = on_disk(path)
    options = chat_options(monkeypatch, state_dir, made["channel_id"])
    with pytest.raises(LocalProtocolError, match="written by a newer sdsync"):
        reopened_chat(options)
    assert on_disk(path) == before


# -- the reliability service, as `sdsync reliability serve --state-dir` opens it


def served_manager(monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> ReliabilityManager:
    """The manager the current ``sdsync reliability serve`` makes from its flags and the
    state directory, channels reopened, with the gRPC server left out."""
    made: list[ReliabilityManager] = []

    class NoServer:
        def __init__(self, manager: ReliabilityManager, listen: str, **_: object) -> None:
            made.append(manager)
            self.port = 0

    monkeypatch.setattr(sdsync.reliability, "ReliabilityServer", NoServer)
    monkeypatch.setattr(cli_reliability, "_run", lambda server, address: None)
    args = ["reliability", "serve", "--state-dir", str(state_dir), "--listen", "127.0.0.1:0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return made[0]


@pytest.mark.parametrize("name", SERVICES)
def test_the_reliability_service_reopens_the_state_dir_of_an_earlier_release(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = fixture(name)
    room = made["channel_id"]
    state_dir = unpack(name, tmp_path)
    manager = served_manager(monkeypatch, state_dir)
    transmits: list[tuple[str, str, bytes]] = []
    manager.on_transmit = lambda channel, kind, mid, data: transmits.append((kind, mid, data))
    try:
        assert manager.participant_id == made["participant_id"]  # from <state-dir>/participant
        assert manager.channels() == [room]  # a channel the application never closed
        assert as_log(manager.history(room)) == expected_log(name)
        channel = manager.channel(room)
        assert channel.lamport_timestamp == made["lamport"]
        assert channel.outgoing_ids() == unacknowledged(name)
        (waiting,), (missing,) = made["waiting"], made["missing"]
        assert channel.unmet_dependencies(waiting["message_id"]) == [missing["message_id"]]
        assert manager.read_events(room, 0) == []  # every event was taken before
        # The waiting message's stored bytes: delivered once the application has what it
        # missed.
        manager.mark_dependencies_met([missing["message_id"]], room)
        events = [d.event for d in manager.read_events(room, 0)]
        ready = [
            (e.message_id, e.lamport_timestamp, e.content)
            for e in events
            if isinstance(e, MessageDelivered)
        ]
        content = bytes.fromhex(waiting["content"])
        assert ready == [(waiting["message_id"], waiting["lamport_timestamp"], content)]
        # The unacknowledged message's stored bytes: resent as the old code wrapped them.
        manager.tick(NOW_MS + 86_400_000)
        (ours,) = made["unacknowledged"]
        resent = [
            data for kind, mid, data in transmits if (kind, mid) == ("resend", ours["message_id"])
        ]
        assert resent, transmits
        assert {hashlib.sha256(data).hexdigest() for data in resent} == {ours["data_sha256"]}
    finally:
        manager.close()
    assert stored_version(state_file(name, state_dir)) == SCHEMA_VERSION


@pytest.mark.parametrize("name", SERVICES)
def test_the_reliability_service_refuses_a_state_dir_of_a_newer_release_untouched(
    name: str, tmp_path: Path
) -> None:
    state_dir = unpack(name, tmp_path)
    path = state_file(name, state_dir)
    open_state(name, path).close()
    make_newer(path, SCHEMA_VERSION + 1)
    before = on_disk(path)
    args = ["reliability", "serve", "--state-dir", str(state_dir), "--listen", "127.0.0.1:0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2  # refused at start, before it listens
    assert "written by a newer sdsync" in " ".join(result.output.split())
    assert on_disk(path) == before


def test_the_fixtures_are_what_their_readme_says() -> None:
    readme = (FIXTURES / "README.md").read_text(encoding="utf-8")
    for name in NAMES:
        made = fixture(name)
        assert name in readme and made["commit"] in readme
        assert (FIXTURES / name / f"{made['state_file']}.gz").exists()
    assert "make_state.py" in readme
