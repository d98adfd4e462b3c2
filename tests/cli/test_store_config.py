"""`sdsync store serve`'s configuration file (--config), --print-config, and its --help:
every option a key, flags and environment over the file, secrets never printed, clear
errors naming the file and key, a printed configuration that reads back the same, and a
help that keeps whole names at 80 columns with every option in one panel."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from sdsync.cli.main import app
from sdsync.cli.store import SERVE_PANELS

SERVE = ["store", "serve"]


def serve_command() -> object:
    return get_command(app).commands["store"].commands["serve"]  # type: ignore[attr-defined]


def run(args: list[str], env: dict[str, str] | None = None, columns: int = 400) -> tuple[int, str]:
    result = CliRunner(env={"COLUMNS": str(columns), **(env or {})}).invoke(app, [*SERVE, *args])
    return result.exit_code, result.output


def printed(args: list[str], env: dict[str, str] | None = None) -> dict[str, str]:
    code, out = run([*args, "--print-config"], env)
    assert code == 0, out
    return dict(re.findall(r"^([a-z-]+) = (.*)$", out, re.MULTILINE))


def test_every_option_is_in_exactly_one_panel() -> None:
    names = [p.name for p in serve_command().params]  # type: ignore[attr-defined]
    placed = [name for _, panel in SERVE_PANELS for name in panel]
    assert sorted(placed) == sorted(names), set(names) ^ set(placed)


def test_help_at_80_columns_keeps_every_name_whole_and_lines_short() -> None:
    code, out = run(["--help"], columns=80)
    assert code == 0
    assert all(len(line) <= 80 for line in out.splitlines()), max(out.splitlines(), key=len)
    for param in serve_command().params:  # type: ignore[attr-defined]
        for flag in (*param.opts, *param.secondary_opts):
            shown = re.findall(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", out)
            assert shown, f"{flag} not shown whole"
    heads = [line for line in out.splitlines() if line.startswith("  -")]
    params = serve_command().params  # type: ignore[attr-defined]
    assert len(heads) == len(set(heads)) == len(params) + 1  # each once, and --help
    assert "  --light / --no-light" in heads
    for title, _ in SERVE_PANELS:
        assert f"\n{title}:\n" in out
    assert "[default: 127.0.0.1:8645]" in out and "[env var: SDSYNC_NODEKEY]" in out


def test_the_file_sets_options_flags_and_environment_win(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(
        'listen = "127.0.0.1:9000"\nrelay_shard = [3, 7]\nlight = false\n'
        'lightpush-rate-limit = "10/1s"\ntoken = "from-file"\nretention-interval = 60\n'
    )
    values = printed(["--config", str(config)])
    assert values["listen"] == '"127.0.0.1:9000"' and values["relay-shard"] == "[3, 7]"
    assert values["light"] == "false" and values["lightpush-rate-limit"] == '"10/1s"'
    assert values["retention-interval"] == "60.0"
    over = printed(["--config", str(config), "--listen", "127.0.0.1:9001", "--light"])
    assert over["listen"] == '"127.0.0.1:9001"' and over["light"] == "true"


def test_print_config_refuses_what_a_start_would_refuse(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text("web = true\nlight = false\n")
    data = tmp_path / "data"
    code, out = run(["--config", str(config), "--data-dir", str(data), "--print-config"])
    assert code == 2 and "--light" in out and "the chat page uses the light services" in out
    ok, _ = run(["--relay-shard", "0", "--data-dir", str(data), "--print-config"])
    assert ok == 0 and not data.exists()  # checked, not started: no node key written


def test_secrets_are_never_printed(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text('token = "file-secret"\nsync-token = "sync-secret"\n')
    env = {"SDSYNC_NODEKEY": "07" * 32}
    code, out = run(["--config", str(config), "--print-config"], env)
    assert code == 0
    for secret in ("file-secret", "sync-secret", "07" * 32):
        assert secret not in out
    for key in ("token", "sync-token", "nodekey"):
        assert f"# {key}: set, not shown" in out


def test_the_printed_configuration_reads_back_the_same(tmp_path: Path) -> None:
    args = ["--relay-shard", "7", "--peer", "http://127.0.0.1:1", "--sync-method", "rbsr"]
    args += ["--retention", "capacity:100", "--no-light", "--log-format", "json"]
    code, first = run([*args, "--print-config"])
    assert code == 0
    saved = tmp_path / "printed.toml"
    saved.write_text(first)
    code, second = run(["--config", str(saved), "--print-config"])
    assert code == 0 and second == first


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("relay-shrd = [7]", "no option 'relay-shrd' (did you mean relay-shard?)"),
        ('relay-shard = ["x"]', "relay-shard = ['x']"),
        ("relay-shard = 7", "expected an array"),
        ("retention-interval = 0.5", "retention-interval = 0.5"),
        ("listen = ", "is not TOML"),
        ("config = 'other.toml'", "no option 'config'"),
    ],
)
def test_a_bad_file_names_itself_and_the_key(tmp_path: Path, text: str, says: str) -> None:
    config = tmp_path / "node.toml"
    config.write_text(text + "\n")
    code, out = run(["--config", str(config)])
    assert code == 2 and says in out and str(config) in out


def test_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    code, out = run(["--config", str(tmp_path / "absent.toml")])
    assert code == 2 and "absent.toml" in out


def test_serve_runs_on_what_the_file_says(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "node.toml"
    config.write_text(f'listen = "127.0.0.1:{port}"\ndata-dir = "{tmp_path / "data"}"\n')
    argv = [sys.executable, "-m", "sdsync.cli", *SERVE, "--config", str(config)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith(f"sdsync store: listening on http://127.0.0.1:{port} "), line
        assert str(tmp_path / "data" / "store.sqlite3") in line
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    assert process.returncode == 0
