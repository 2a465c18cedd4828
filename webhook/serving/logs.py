"""Log records as one JSON object per line (or one escaped text line), for everything the process
logs: our modules, gunicorn's arbiter and worker, the kubernetes client's watch threads, uncaught
exceptions in any thread.

Values a client controls (object names, kinds) are written by `json.dumps` in both formats, so a
newline or a quote in them is escaped and can never start a line of its own; a traceback goes
into one field of its one line.
"""
from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any

from gunicorn import glogging

FORMATS = ("json", "text")
LEVELS = ("debug", "info", "warning", "error")
FIELDS = "fields"  # `extra={FIELDS: {...}}` adds these keys to the line
# Attributes every LogRecord has; anything else on a record came from `extra` and is written too.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _timestamp(record: logging.LogRecord) -> str:
    """RFC 3339 in UTC with milliseconds, as log collectors parse it."""
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    extra = {k: v for k, v in vars(record).items() if k not in _STANDARD and k != FIELDS}
    return {**extra, **(getattr(record, FIELDS, None) or {})}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {"time": _timestamp(record), "level": record.levelname.lower(),
                                 "logger": record.name, "message": record.getMessage()}
        entry.update(_fields(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """`TIME LEVEL logger: message key=value ...`, every value JSON-quoted (escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        message = json.dumps(record.getMessage())[1:-1]  # escaped, without the quotes
        pairs = "".join(f" {k}={json.dumps(v, default=str)}" for k, v in _fields(record).items())
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {message}{pairs}"
        if record.exc_info:
            line += " exception=" + json.dumps(self.formatException(record.exc_info))
        return line


class _StderrHandler(logging.StreamHandler):
    """Writes to sys.stderr as it is when the record comes (pytest and embedding tools swap it)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def configure(log_format: str, level: str) -> None:
    """One handler on stderr for every logger, in `log_format`, at `level` and above."""
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())

    def log_uncaught(args: threading.ExceptHookArgs) -> None:
        logging.getLogger("webhook.thread").error(
            "uncaught exception in thread %s", args.thread.name if args.thread else "?",
            exc_info=args.exc_value or True)

    threading.excepthook = log_uncaught
    sys.excepthook = lambda kind, value, trace: logging.getLogger("webhook").critical(
        "uncaught exception", exc_info=(kind, value, trace))


class GunicornLogger(glogging.Logger):
    """gunicorn's logger with its own stderr handler taken away: its lines go to the root handler
    that `configure` set, in the same format, at the level the command line chose."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for logger in (self.error_log, self.access_log):
            logger.handlers[:] = []
            logger.propagate = True
            logger.setLevel(logging.NOTSET)
