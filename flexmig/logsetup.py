"""Structured logging for every flexmig process: JSON in containers, readable text in a terminal."""

from __future__ import annotations

import logging
import os
import sys
from typing import Literal

import structlog

LogFormat = Literal["auto", "json", "console"]
_LEVELS = ("debug", "info", "warning", "error")


class _CurrentStderr:
    """A file that writes to whatever `sys.stderr` is at call time.

    Binding the stream object at configuration would keep writing to a stream that was swapped out
    and closed later (a test harness capturing output, a daemon redirecting stderr).
    """

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str = "info", fmt: LogFormat = "auto") -> None:
    """Configure structlog once per process.

    `auto` picks JSON unless stderr is a terminal, so a DaemonSet's logs are machine-readable while a
    developer running `flexmig simulate` sees aligned, coloured lines.
    """
    if level.lower() not in _LEVELS:
        raise ValueError(f"log level: {level!r} is not one of {', '.join(_LEVELS)}")
    if fmt not in ("auto", "json", "console"):
        raise ValueError(f"log format: {fmt!r} is not one of auto, json, console")
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )


def level_from_env(default: str = "info") -> str:
    return os.environ.get("FLEXMIG_LOG_LEVEL", default)
