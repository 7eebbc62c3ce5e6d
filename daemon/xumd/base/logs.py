"""Structured logging: JSON lines off a TTY (journald-friendly), readable console on a TTY."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, TextIO

# structlog's package imports `structlog.dev`, which imports rich (and through it pygments) when
# it is installed, only to pretty-print tracebacks on a console: about a sixth of the daemon's
# start-up imports (docs/PERFORMANCE.md, "Start-up"). The daemon writes JSON lines, and
# plain tracebacks on a console, so rich stays hidden while structlog loads: a None entry in
# sys.modules makes `import rich` raise ImportError, which structlog reads as "not installed".
# A later `import rich` (the CLI's tables, in a process that also logs) gets the real package.
_HIDE_RICH = "rich" not in sys.modules and "structlog" not in sys.modules
if _HIDE_RICH:
    sys.modules["rich"] = None  # type: ignore[assignment]
try:
    import structlog
finally:
    if _HIDE_RICH and "rich" in sys.modules and sys.modules["rich"] is None:
        del sys.modules["rich"]

LEVELS = ("debug", "info", "warning", "error")


def configure(level: str = "info", *, json: bool | None = None) -> None:
    """Log to stderr at `level`; JSON lines unless stderr is a terminal (or `json` says)."""
    as_json = not sys.stderr.isatty() if json is None else json
    numeric = getattr(logging, level.upper())
    processors: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_logger_factory,
        cache_logger_on_first_use=True,
    )


def get(name: str) -> structlog.stdlib.BoundLogger:
    """A logger whose every line names its module (`"logger": "xumd.rpc"`)."""
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger


class _NamedPrintLogger(structlog.PrintLogger):
    """A PrintLogger that knows its name, for `add_logger_name` (loggers are created lazily,
    at first use, so module-level `get()` calls made before `configure` still get it)."""

    def __init__(self, file: TextIO, name: str) -> None:
        super().__init__(file)
        self.name = name

    def msg(self, message: str) -> None:
        """Write one line; a line that cannot be written is counted, never raised. stderr on a
        full disk (ENOSPC), a reader gone (EPIPE: `xumd 2>&1 | tee` whose tee died), EIO: a
        log call sits between the steps of every operation, and one that raised ended the
        request half-way or, from a background task, the daemon. Once a line is written again,
        one more says how many were lost (`logs.lines_dropped`)."""
        global _dropped
        try:
            super().msg(message)
        except OSError:
            _dropped += 1
            return
        if _dropped:
            lost, _dropped = _dropped, 0
            note = {"lines": lost, "event": "logs.lines_dropped", "level": "warning"}
            try:
                super().msg(json.dumps({**note, "logger": "xumd.base.logs"}))
            except OSError:
                _dropped += lost + 1

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


_dropped = 0
"""Log lines not written since the last one that was (see `_NamedPrintLogger.msg`)."""


def _logger_factory(*args: Any) -> _NamedPrintLogger:
    return _NamedPrintLogger(sys.stderr, str(args[0]) if args else "xumd")
