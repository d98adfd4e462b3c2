"""`sdsync store serve` as a real process (listen line, clean SIGTERM) and `store export`."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from storeprocess import TOPIC, store_serve
from storetest import make_messages
from typer.testing import CliRunner

from sdsync.cli.main import app
from sdsync.store import open_archive
from sdsync.transport.nodekey import NODEKEY_FILE, NodeKey


def test_serve_prints_where_it_listens_and_stops_on_sigterm(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sdsync.cli",
            "store",
            "serve",
            "--data-dir",
            str(tmp_path),
            "--listen",
            "127.0.0.1:0",
            "--retention",
            "capacity:100",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("sdsync store: listening on http://127.0.0.1:"), line
        url = line.split()[4]
        with urllib.request.urlopen(f"{url}/store/v3/messages?pageSize=5") as response:
            assert json.load(response)["statusCode"] == 200
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert "stopped" in out
    assert (tmp_path / "store.sqlite3").exists() and (tmp_path / "last_online").exists()


def test_export_command_writes_parquet(tmp_path: Path) -> None:
    archive = open_archive(str(tmp_path / "store.sqlite3"))
    archive.insert(make_messages(40))
    archive.close()
    out = tmp_path / "parquet"
    result = CliRunner().invoke(
        app, ["store", "export", "--data-dir", str(tmp_path), "--parquet", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "exported 40 messages" in result.output
    assert any(out.rglob("*.parquet"))
    missing = CliRunner().invoke(
        app, ["store", "export", "--data-dir", str(tmp_path / "none"), "--parquet", str(out)]
    )
    assert missing.exit_code == 2


def test_export_names_overwrite_and_refuses_an_empty_range(tmp_path: Path) -> None:
    """A second export into the same folder names --overwrite (not pyarrow's wording); an
    archive with nothing in the range exits 1 and writes no folder (issue 39)."""
    archive = open_archive(str(tmp_path / "store.sqlite3"))
    archive.insert(make_messages(10))
    archive.close()
    out = tmp_path / "parquet"
    argv = ["store", "export", "--data-dir", str(tmp_path), "--parquet", str(out)]
    assert CliRunner().invoke(app, argv).exit_code == 0
    again = CliRunner().invoke(app, argv)
    assert again.exit_code == 2 and "give --overwrite" in again.output, again.output
    assert CliRunner().invoke(app, [*argv, "--overwrite"]).exit_code == 0
    empty = CliRunner().invoke(app, [*argv[:-1], str(tmp_path / "empty"), "--start", str(2**62)])
    assert empty.exit_code == 1 and "nothing to export" in empty.output, empty.output
    assert not (tmp_path / "empty").exists()


def test_serve_refuses_a_shard_topic_of_another_cluster(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["store", "serve", "--data-dir", str(tmp_path), "--pubsub-topic", "/waku/2/rs/2/0"],
    )
    assert result.exit_code == 2
    assert "not on cluster 1" in result.output


def test_serve_refuses_the_chat_page_without_light_services(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["store", "serve", "--data-dir", str(tmp_path), "--web", "--no-light"]
    )
    assert result.exit_code == 2
    assert "the chat page uses the light services" in result.output


def test_serve_refuses_a_chat_page_address_that_is_no_websocket(tmp_path: Path) -> None:
    argv = ["store", "serve", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0", "--web"]
    result = CliRunner().invoke(app, [*argv, "--web-address", "/ip4/127.0.0.1/tcp/443"])
    assert result.exit_code == 2
    assert "is not a WebSocket address" in re.sub(r"[│\s]+", " ", result.output)


def test_serve_keeps_its_peer_id_across_a_sigkill_and_takes_a_given_key(tmp_path: Path) -> None:
    def peer_ids(store_relay_addrs: list[str]) -> set[str]:
        return {addr.rsplit("/p2p/", 1)[1] for addr in store_relay_addrs}

    with store_serve(tmp_path, TOPIC) as first:
        first.process.kill()  # SIGKILL: nothing is written at exit
        first.process.wait()
    key = NodeKey.from_hex((tmp_path / NODEKEY_FILE).read_text())
    assert peer_ids(first.relay_addrs) == {key.peer_id}
    with store_serve(tmp_path, TOPIC) as second:
        assert peer_ids(second.relay_addrs) == {key.peer_id}
    given = "0x" + "07" * 32
    with store_serve(tmp_path, TOPIC, flags=["--nodekey", given]) as third:
        assert peer_ids(third.relay_addrs) == {NodeKey.from_hex(given).peer_id} != {key.peer_id}
    assert NodeKey.from_hex((tmp_path / NODEKEY_FILE).read_text()) == key


def test_serve_refuses_a_bad_node_key_naming_the_flag(tmp_path: Path) -> None:
    base = ["store", "serve", "--data-dir", str(tmp_path), "--relay-shard", "7"]
    runner = CliRunner(env={"COLUMNS": "400"})  # the error on one line, however long its path
    bad = runner.invoke(app, [*base, "--nodekey", "12ab"])
    assert bad.exit_code == 2 and "--nodekey" in bad.output and "64 hex" in bad.output
    both = runner.invoke(app, [*base, "--nodekey", "07" * 32, "--nodekey-file", "k"])
    assert both.exit_code == 2 and "not both" in both.output
    (tmp_path / NODEKEY_FILE).write_text("not a key")
    kept = runner.invoke(app, base)
    assert kept.exit_code == 2 and "--data-dir" in kept.output
    assert f"{tmp_path / NODEKEY_FILE} is not a node key" in kept.output


def test_the_printed_chat_command_runs_from_where_serve_was_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve --web` prints ``sdsync chat …`` only when the PATH finds this sdsync; else
    the path it was started by (issue 39: after ``make``, ``.venv/bin/sdsync``)."""
    from sdsync.cli import store as store_cli

    program = tmp_path / "bin" / "sdsync"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setattr("sys.argv", [str(program), "store", "serve"])
    monkeypatch.setenv("PATH", "/nonexistent")
    assert store_cli._sdsync() == str(program)
    monkeypatch.setenv("PATH", str(program.parent))
    assert store_cli._sdsync() == "sdsync"


def test_a_node_listening_on_websocket_only_says_why_it_prints_no_chat_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 39: with only a WebSocket --relay-listen, `serve --web` printed no chat line
    and no reason (a terminal chat dials TCP only: a WebSocket command would not run)."""
    from sdsync.cli import store as store_cli

    ws = "/ip4/127.0.0.1/tcp/60001/ws/p2p/12D3KooWEyoppNCUx8Yx66oV9fJnriXwCcXwDDUA2kj6vnc6iDEp"
    store_cli._print_chat_help("http://127.0.0.1:8645", [ws])
    out = capsys.readouterr().out
    assert "terminal chat: none" in out and "--relay-listen /ip4/127.0.0.1/tcp/0" in out
    assert "--peer" not in out
