"""Structured logging for every flexmig process: JSON in containers, readable text in a terminal.

One stream per process: structlog's own events, the standard library's `logging` records (the
kubernetes client, urllib3, grpc, ...) rendered by the same renderer, and uncaught exceptions (main
thread and other threads) as one error event with the traceback in a field, never as raw text. In JSON
every event carries `component` (the subcommand: controller, kubeletplugin, ...) and `version`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import types
from typing import Any, Literal

import structlog
from structlog.typing import EventDict, WrappedLogger

from api.buildinfo import version

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


class _Context:
    """Adds the process's component and version to every event (JSON only: a terminal stays short)."""

    def __init__(self, component: str | None) -> None:
        self.fields = {"component": component or "flexmig", "version": version()}

    def __call__(self, _logger: WrappedLogger, _name: str, event: EventDict) -> EventDict:
        for key, value in self.fields.items():
            event.setdefault(key, value)
        return event


_SERVICES = ("controller", "kubeletplugin")


class _OurHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the root handler this module installed, so reconfiguring replaces only it."""


def _route_stdlib(level: str, pre_chain: list[Any], renderer: Any) -> None:
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *pre_chain],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = _OurHandler(_CurrentStderr())
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _OurHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))


def _log_uncaught(
    exc_type: type[BaseException], exc: BaseException, tb: types.TracebackType | None, where: str
) -> None:
    structlog.get_logger("flexmig").error("uncaught exception", where=where, exc_info=(exc_type, exc, tb))


def _install_excepthooks() -> None:
    def main_hook(exc_type: type[BaseException], exc: BaseException, tb: types.TracebackType | None) -> None:
        if issubclass(exc_type, KeyboardInterrupt):
            sys.__excepthook__(exc_type, exc, tb)
            return
        _log_uncaught(exc_type, exc, tb, "main thread")

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is None:
            return
        name = args.thread.name if args.thread is not None else "?"
        _log_uncaught(args.exc_type, args.exc_value, args.exc_traceback, f"thread {name}")

    sys.excepthook = main_hook
    threading.excepthook = thread_hook


def configure_logging(level: str = "info", fmt: LogFormat = "auto", component: str | None = None) -> None:
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
    pre_chain: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if use_json:
        pre_chain.append(_Context(component))
    structlog.configure(
        processors=[
            *pre_chain,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        # Long-running services cache their loggers (speed); one-shot commands do not, so a command run
        # inside another process (tests, tools) leaves no logger bound to its configuration.
        cache_logger_on_first_use=component in _SERVICES,
    )
    if component in _SERVICES:
        # Long-running components: library records join the one stream. One-shot commands (status,
        # migrate-config, ...) keep library chatter (e.g. urllib3 retries) off their one-line errors.
        _route_stdlib(level, pre_chain, renderer)
        _install_excepthooks()


def level_from_env(default: str = "info") -> str:
    return os.environ.get("FLEXMIG_LOG_LEVEL", default)
