"""How the node and its actor processes write their log records: ``--log-level`` and ``--log-format``.

Two formats (:data:`inferbus._limits.LOG_FORMATS`):

- ``text``: lines for people. An actor process writes ``LEVEL message`` on stderr (the node copies each line into
  the run dir's ``<actor>.log`` after the UTC time it arrived); the node's ``node.log`` has
  ``<UTC time> LEVEL <logger>: message``.
- ``json``: one JSON object per line (JSON Lines), for a log shipper. Fields: ``ts`` (RFC 3339, UTC, ms:
  ``2026-12-07T08:32:32.029Z``), ``level`` (``debug``, ``info``, ``warning``, ``error``, ``critical``), ``logger``
  (the Python logger's name), ``actor`` (the process: ``node-n1``, ``worker-n1-w0``, ``ingress-n1-i0``,
  ``aggregator-n1-agg``...), ``msg``, and ``exc`` (the traceback, one string) when the record carries one.

The node's HTTP server's records (the ``waitress`` logger's) are the node's: :func:`route_logger`.

Imports nothing but the standard library (``inferbus up`` imports it before the node's heavy modules).
"""

from __future__ import annotations

import json
import logging
import sys
import time

from ._limits import LOG_FORMATS, LOG_LEVELS

LEVELS = {name: getattr(logging, name.upper()) for name in LOG_LEVELS}
"""``--log-level`` value → :mod:`logging` level number."""


def rfc3339_utc(t: float) -> str:
    """``t`` (seconds since the epoch) as RFC 3339 UTC with milliseconds: ``2026-12-07T08:32:32.029Z``."""
    sec = int(t)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{int((t - sec) * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    """Each record as one JSON object on one line: ``ts``, ``level``, ``logger``, ``actor``, ``msg``, and ``exc``
    (the formatted traceback) when the record has ``exc_info``, ``stack`` when it has ``stack_info``.

    Args:
        actor: the ``actor`` field of every record: the process that writes it (``node-n1``, ``worker-n1-w0``).
    """

    def __init__(self, actor: str) -> None:
        super().__init__()
        self.actor = actor

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": rfc3339_utc(record.created), "level": record.levelname.lower(), "logger": record.name,
               "actor": self.actor, "msg": record.getMessage()}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


class OncePerPeriod(logging.Filter):
    """Let one record of a logger through per ``period_s`` (monotonic s); the next one let through tells how many were
    left out since (a suffix to its message). Thread-safe enough for the SDK's export thread: a lost count under a
    race says one fewer."""

    def __init__(self, period_s: float) -> None:
        super().__init__()
        self.period_s = period_s
        self._next_at = 0.0
        self._left_out = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now < self._next_at:
            self._left_out += 1
            return False
        self._next_at = now + self.period_s
        if self._left_out:
            record.msg = f"{record.getMessage()} ({self._left_out} more such records of this logger left out in the " \
                         f"last {self.period_s:g} s)"
            record.args = ()
            self._left_out = 0
        return True


WAITRESS_LOG_PERIOD_S = 30.0
"""The node's HTTP server (waitress) writes one record per this many seconds of each repetitive message of its
(``Task queue depth is N`` under load, the connection bound reached and left); the next says how many were left
out. Errors, and records with a traceback, are never left out."""


class _OncePerPeriodPerMessage(logging.Filter):
    """:class:`OncePerPeriod` for each message template (``record.msg``, at most 64 kept; a new one past them is let
    through) of records below ERROR without a traceback; the others pass."""

    def __init__(self, period_s: float) -> None:
        super().__init__()
        self.period_s = period_s
        self._each: dict[str, OncePerPeriod] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR or record.exc_info or record.exc_text:
            return True
        key = str(record.msg)
        once = self._each.get(key)
        if once is None:
            if len(self._each) >= 64:
                return True
            once = self._each[key] = OncePerPeriod(self.period_s)
        return once.filter(record)


class _ToLogger(logging.Handler):
    """Hand each record (its logger's name kept) to ``target``'s handlers and those above it, as if logged there, when
    it is at ``target``'s effective level or above."""

    def __init__(self, target: logging.Logger) -> None:
        super().__init__()
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= self.target.getEffectiveLevel():
            self.target.handle(record)


def route_logger(name: str, target: logging.Logger, level: int, period_s: float | None = None):
    """Make logger ``name``'s records (a library's: ``waitress``) ``target``'s (``inferbus``): written by its handlers
    (node.log, up's stderr) in their format, at ``level`` and above (``--log-level``), no longer propagated to the
    root logger on their own (Python's last-resort handler wrote them on stderr as plain text: a fresh-user trial);
    ``period_s``: each repetitive message once per that many seconds (:class:`OncePerPeriod` per message; errors
    and tracebacks always). Returns the function that undoes it."""
    lg = logging.getLogger(name)
    handler = _ToLogger(target)
    if period_s is not None:
        handler.addFilter(_OncePerPeriodPerMessage(period_s))
    old = (lg.level, lg.propagate)
    lg.setLevel(level)
    lg.propagate = False
    lg.addHandler(handler)

    def undo() -> None:
        lg.removeHandler(handler)
        lg.setLevel(old[0])
        lg.propagate = old[1]

    return undo


def check_log_options(level: str, fmt: str) -> None:
    """Raise ``ValueError("log_level must be one of ..., got ...")`` (or ``log_format``) for a value not in
    :data:`~inferbus._limits.LOG_LEVELS` / :data:`~inferbus._limits.LOG_FORMATS`."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log_format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")


def formatter(fmt: str, actor: str, text: str) -> logging.Formatter:
    """The formatter of ``fmt``: :class:`JsonFormatter` for ``json``, else ``logging.Formatter(text)``."""
    return JsonFormatter(actor) if fmt == "json" else logging.Formatter(text)


def configure_actor_process(level: str, fmt: str, actor: str) -> None:
    """Set up logging in an actor process (``python -m inferbus.actors``): one handler on the root logger, writing
    to stderr in ``fmt`` (text: ``LEVEL message``; the node stamps each line with the time it read it).

    ``inferbus`` records at ``level`` and above are written; other libraries' (nats-py, asyncio) at ``warning`` and
    above (or ``level`` if higher). The routine records of the actor's own in-process loop supervisor (starts,
    orderly stops) are INFO records of ``inferbus.supervisor`` that say nothing an operator needs at ``info``: they
    are written at ``debug`` only; its warnings and errors (a loop that died) always are.

    Raises:
        ValueError: ``level`` or ``fmt`` is not one of the choices.
    """
    check_log_options(level, fmt)
    lvl = LEVELS[level]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt, actor, "%(levelname)s %(message)s"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(max(lvl, logging.WARNING))
    logging.getLogger("inferbus").setLevel(lvl)
    logging.getLogger("inferbus.supervisor").setLevel(lvl if lvl <= logging.DEBUG else max(lvl, logging.WARNING))
