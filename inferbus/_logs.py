"""How the node and its actor processes write their log records: ``--log-level`` and ``--log-format``.

Two formats (:data:`inferbus._limits.LOG_FORMATS`):

- ``text``: lines for people. An actor process writes ``LEVEL message`` on stderr (the node copies each line into
  the run dir's ``<actor>.log`` after the UTC time it arrived); the node's ``node.log`` has
  ``<UTC time> LEVEL <logger>: message``.
- ``json``: one JSON object per line (JSON Lines), for a log shipper. Fields: ``ts`` (RFC 3339, UTC, ms:
  ``2026-12-07T08:32:32.029Z``), ``level`` (``debug``, ``info``, ``warning``, ``error``, ``critical``), ``logger``
  (the Python logger's name), ``actor`` (the process: ``node-n1``, ``worker-n1-w0``, ``ingress-n1-i0``,
  ``aggregator-n1-agg``...), ``msg``, and ``exc`` (the traceback, one string) when the record carries one.

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
