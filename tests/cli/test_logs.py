"""Long-running commands' logs (cli/logs.py): another library's record on one line,
never its traceback, ours with theirs; ``--log-format json`` one object a line."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sdsync.cli.logs import JsonFormatter, LogFormat, OneLine, configure_logging
from sdsync.store.schema import SCHEMA_VERSION

# py-libp2p's identify writes the traceback into its message, and says it at ERROR.
IDENTIFY = (
    "Error sending identify response to %s: %s (type: %s)\n%s",
    (
        "16Uiu2HAm",
        "stream reset",
        "<class 'StreamError'>",
        "Traceback (most recent call last):\n  File x\nStreamError",
    ),
)


def record(
    name: str, msg: str, args: tuple[object, ...], *, exc: BaseException | None = None
) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, exc_info)


def formatted(rec: logging.LogRecord, log_format: LogFormat = LogFormat.text) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(OneLine())
    handler.setFormatter(JsonFormatter() if log_format is LogFormat.json else logging.Formatter())
    handler.handle(rec)
    return stream.getvalue()


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_a_librarys_traceback_in_its_message_is_cut_to_one_line() -> None:
    out = formatted(record("libp2p.identity.identify.identify", *IDENTIFY))
    expected = (
        "Error sending identify response to 16Uiu2HAm: stream reset (type: <class 'StreamError'>)"
    )
    assert out == expected + "\n"


def test_a_librarys_exception_becomes_its_type_and_message() -> None:
    exc = raised(ConnectionResetError("peer went away"))
    out = formatted(record("aiohttp.server", "Error handling request", (), exc=exc))
    assert out == "Error handling request (ConnectionResetError: peer went away)\n"


def test_our_own_tracebacks_are_kept() -> None:
    exc = raised(ValueError("a bug of ours"))
    out = formatted(record("sdsync.store.node", "failed", (), exc=exc))
    assert out.startswith("failed\nTraceback (most recent call last):") and "a bug of ours" in out


def test_json_lines_hold_time_level_logger_message_and_our_traceback() -> None:
    lines = [
        formatted(record("libp2p.identity.identify.identify", *IDENTIFY), LogFormat.json),
        formatted(
            record("sdsync.store", "boom %d", (1,), exc=raised(KeyError("k"))), LogFormat.json
        ),
    ]
    first, second = (json.loads(line) for line in lines)
    assert all(line.count("\n") == 1 for line in lines)
    assert first["level"] == "ERROR" and first["logger"] == "libp2p.identity.identify.identify"
    assert first["message"].startswith("Error sending identify response") and "exc" not in first
    assert first["time"].endswith("+00:00")
    assert second["message"] == "boom 1" and "KeyError" in second["exc"]


def test_configure_logging_replaces_the_handlers_and_takes_libp2ps_records(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """py-libp2p cuts its loggers off at import (propagate False, no handler): its records
    reach logging's last resort, which is ours — one line, and only at INFO."""
    root, libp2p = logging.getLogger(), logging.getLogger("libp2p")
    saved = root.handlers[:], root.level, logging.lastResort, libp2p.propagate, libp2p.handlers[:]
    libp2p.propagate, libp2p.handlers[:] = False, []  # as `import libp2p` leaves it
    try:
        configure_logging(logging.INFO, LogFormat.json)
        configure_logging(logging.INFO, LogFormat.json)  # twice: still one handler
        assert len(root.handlers) == 1
        logging.getLogger("libp2p.x").error(IDENTIFY[0], *IDENTIFY[1])
        logging.getLogger("sdsync.y").warning("ours")
        err = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
        assert [(e["logger"], e["message"].split(":")[0]) for e in err] == [
            ("libp2p.x", "Error sending identify response to 16Uiu2HAm"),
            ("sdsync.y", "ours"),
        ]
        configure_logging(logging.WARNING, LogFormat.text)  # not verbose: py-libp2p is quiet
        logging.getLogger("libp2p.x").error(IDENTIFY[0], *IDENTIFY[1])
        logging.getLogger("sdsync.y").warning("ours")
        quiet = capsys.readouterr().err.splitlines()
        assert len(quiet) == 1 and quiet[0].endswith("WARNING sdsync.y: ours")
    finally:
        root.handlers[:], logging.lastResort = saved[0], saved[2]
        root.setLevel(saved[1])
        libp2p.propagate, libp2p.handlers[:] = saved[3], saved[4]


def test_store_serve_logs_json_lines(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "sdsync.cli", "store", "serve", "--data-dir", str(tmp_path)]
    argv += ["--listen", "127.0.0.1:0", "--verbose", "--log-format", "json"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("sdsync store: listening on")
        time.sleep(0.5)
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    entries = [json.loads(line) for line in err.splitlines()]
    assert all({"time", "level", "logger", "message"} <= entry.keys() for entry in entries)
    started = [e for e in entries if e["message"].startswith("started: ")]
    assert len(started) == 1 and started[0]["logger"] == "sdsync.store", entries
    assert (
        f"(schema {SCHEMA_VERSION})" in started[0]["message"]
        and "relay none" in started[0]["message"]
    )
