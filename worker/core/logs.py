"""structlog set-up: readable console locally, JSON in pods; every job's lines also
go to the job's own `log.jsonl` in the store.

Context (`tenant`, `sweep_id`, `job_id`, `model`, `strategy`) is bound once with
`structlog.contextvars` and carried by every line.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
from collections.abc import Iterator

import structlog
import structlog.tracebacks

from worker.core import settings
from worker.core.safetext import terminal, terminal_lines

_capture: contextvars.ContextVar[list[dict] | None] = contextvars.ContextVar("decodebench_log_capture", default=None)
JOB_LOG_VALUE_CHARS = 64 * 1024  # one value of a job's log line (an error, a traceback): head and tail kept
_SECRET_KEYS = ("password", "secret", "token", "access_key", "credentials", "authorization")


def _redact(logger, method, event: dict) -> dict:
    """Never log a secret: values of keys such as `password` or `hf_token` are masked."""
    for key in list(event):
        k = key.lower()
        if k in _SECRET_KEYS or k.endswith(tuple("_" + s for s in _SECRET_KEYS)):
            event[key] = "***"
    return event


def _tee_to_job(logger, method, event: dict) -> dict:
    buf = _capture.get()
    if buf is not None:
        line = _TRACEBACK_TEXT(logger, method, dict(event)) if event.get("exc_info") else event  # its text, kept
        line = {k: _bounded(v) if isinstance(v, str) else v for k, v in line.items()}
        buf.append(json.loads(json.dumps(line, default=str)))
    return event


def _bounded(text: str) -> str:
    """A log.jsonl value of at most about JOB_LOG_VALUE_CHARS characters: its head and its tail (a traceback's
    last lines name the error), the middle's length said. A crash whose message holds a tensor's repr, twice in
    the job's log (`job.failed`, `job.traceback`), made a log the server refuses (DECODEBENCH_API_MAX_LOG_MB)."""
    if len(text) <= JOB_LOG_VALUE_CHARS:
        return text
    half = JOB_LOG_VALUE_CHARS // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half:,} characters left out ...]\n{text[-half:]}"


def _visible(logger, method, event: dict) -> dict:
    """On the console, names and reasons (user input) have their escape sequences shown, not run.
    (JSON escapes them by itself.)"""
    return {
        k: (terminal_lines(v) if k in ("exception", "stack") else terminal(v)) if isinstance(v, str) else v
        for k, v in event.items()
    }


class _Stderr:
    """Writes to whatever sys.stderr is now (pytest and click's runner swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


# An exception's traceback, in both formats, without its frames' locals: they hold request bodies, specs
# and payloads (megabytes a line) and may hold secrets.
_TRACEBACK_DICT = structlog.processors.ExceptionRenderer(
    structlog.tracebacks.ExceptionDictTransformer(show_locals=False, use_rich=False)
)


# A job's log.jsonl: the traceback as plain text (`exception`), without its frames' locals.
_TRACEBACK_TEXT = structlog.processors.ExceptionRenderer()


def _traceback_text(tty: bool):
    """The console's exception formatter: rich's (structlog's default, less the locals) for a person at a
    terminal, else the standard library's (a log file gets no colour codes, and no second of rendering)."""
    if not tty or getattr(structlog.dev, "rich", None) is None:
        return structlog.dev.plain_traceback
    return structlog.dev.RichTracebackFormatter(show_locals=False)


def configure(fmt: str | None = None, level: str | None = None) -> None:
    """Configure structlog once per process. fmt: console|json (env DECODEBENCH_LOG_FORMAT)."""
    fmt = settings.get("log_format", fmt)
    level_name = str(settings.get("log_level", level)).upper()
    console_level = getattr(logging, level_name, logging.INFO)

    def console_filter(logger, method, event: dict) -> dict:
        """The level applies to the console only: a job's log.jsonl keeps its info lines."""
        if logging.getLevelNamesMapping().get(event.get("level", "info").upper(), logging.INFO) < console_level:
            raise structlog.DropEvent
        return event

    tty = sys.stderr.isatty()
    renderer = (
        [_TRACEBACK_DICT, structlog.processors.JSONRenderer()]
        if fmt == "json"
        else [_visible, structlog.dev.ConsoleRenderer(colors=tty, exception_formatter=_traceback_text(tty))]
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact,
            _tee_to_job,
            console_filter,
            *renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(min(console_level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),
        cache_logger_on_first_use=False,
    )


@contextlib.contextmanager
def job_context(**bound) -> Iterator[list[dict]]:
    """Bind job context and capture every log line emitted inside, for log.jsonl."""
    buf: list[dict] = []
    token = _capture.set(buf)
    with structlog.contextvars.bound_contextvars(**bound):
        try:
            yield buf
        finally:
            _capture.reset(token)
