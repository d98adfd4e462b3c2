"""How a long-running command logs: plain lines for a terminal, or one JSON object a line
for a log shipper (``--log-format json``), and never a library's traceback for what a
remote peer did.

A service node hears from peers it does not control; when one goes away mid-exchange
or sends garbage, py-libp2p and aiohttp log an error with a traceback (py-libp2p even
writes the traceback into the message), dozens of lines for an event that is nobody's
bug here.  :class:`OneLine` cuts every record from a logger outside ``sdsync`` to its
first line, with the exception's type and message in place of its traceback.  Our own
loggers keep theirs: a traceback from sdsync is a bug worth the lines.  And py-libp2p's
records, which call every departed peer and failed redial an error, show only at INFO
(``--verbose``): what matters of them is said once by our own loggers.  (py-libp2p cuts
its loggers off at import; their records go to logging's last resort, which is ours.)
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from enum import StrEnum

__all__ = ["JsonFormatter", "LogFormat", "OneLine", "configure_logging"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LogFormat(StrEnum):
    text = "text"
    json = "json"


class OneLine(logging.Filter):
    """Every record of a logger outside ``sdsync`` on one line, without a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "sdsync" or record.name.startswith("sdsync."):
            return True
        message = record.getMessage()
        first = message.split("\n", 1)[0].rstrip()
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            first = f"{first} ({type(exc).__name__}: {exc})".replace("\n", " ")
        record.msg, record.args = first, None
        record.exc_info = record.exc_text = record.stack_info = None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, and the
    traceback as ``exc`` where a record keeps one."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(
    level: int, log_format: LogFormat = LogFormat.text, *, text_format: str = TEXT_FORMAT
) -> None:
    """Log to stderr at ``level`` in ``log_format``, other libraries' records on one line."""
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(_handler(log_format, text_format))
    root.setLevel(level)
    # Importing py-libp2p cuts its loggers off from ours (propagate = False, no handler),
    # so its records reach logging's last resort, which would print them raw, traceback
    # and all.  Ours takes its place: one line each, and only at INFO (--verbose), since
    # py-libp2p logs a peer's departure and each failed redial at ERROR, a line a dial,
    # and our redial says each change once (transport/redial.py).
    last_resort = _handler(log_format, text_format)
    last_resort.setLevel(level if level <= logging.INFO else logging.CRITICAL)
    logging.lastResort = last_resort


def _handler(log_format: LogFormat, text_format: str) -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(OneLine())
    handler.setFormatter(
        JsonFormatter() if log_format is LogFormat.json else logging.Formatter(text_format)
    )
    return handler
