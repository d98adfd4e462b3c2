"""`sdsync store serve` as a real process (listen line, clean SIGTERM) and `store export`."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from storetest import make_messages
from typer.testing import CliRunner

from sdsync.cli.main import app
from sdsync.store import open_archive


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
