"""The bus: NATS connection, subjects, headers, deadlines, embedded servers.

Imports only :mod:`inferbus.schemas` of our own code. The embedded servers (``EmbeddedNats``, ``EmbeddedValkey``,
``EmbeddedServerError``, ``free_port``, ``gateway_mesh``, ``nats_server_binary``, ``valkey_server_binary``, from
:mod:`._embedded`, which imports the OS-process supervision of :mod:`inferbus.supervisor`) are imported on first
use, so a client (``inferbus health``, the SDK) does not load them.
"""

from __future__ import annotations

from .. import _lazy_getattr
from . import _headers as headers
from ._busypoll import BusyPoll
from ._config import BusConfig, rotate_servers, server_url_problem, shown_servers, shown_url, split_servers
from ._connect import (ConnectionLost, close_connection, closed_on_purpose, connect, connected_server,
                       fail_pending_requests)
from ._fastpub import HeaderError, header_block, publish_raw, reply_block, send_pending
from ._headers import deadline_from_headers, format_ms, remaining_ms
from ._subjects import Subjects, leading_zero_fix, version_problem

_LAZY = {name: "inferbus.bus._embedded" for name in (
    "EmbeddedNats", "EmbeddedServerError", "EmbeddedValkey", "free_port", "gateway_mesh", "nats_server_binary",
    "valkey_server_binary")}

__all__ = [
    "BusConfig", "BusyPoll", "ConnectionLost", "EmbeddedNats", "EmbeddedServerError", "EmbeddedValkey", "HeaderError",
    "Subjects", "close_connection", "closed_on_purpose", "connect", "connected_server", "fail_pending_requests",
    "header_block", "leading_zero_fix", "publish_raw", "reply_block", "send_pending",
    "deadline_from_headers", "format_ms", "free_port", "gateway_mesh", "headers", "nats_server_binary", "remaining_ms",
    "rotate_servers", "server_url_problem", "shown_servers", "shown_url", "split_servers", "valkey_server_binary",
    "version_problem",
]


__getattr__ = _lazy_getattr("inferbus.bus", _LAZY, globals())
"""Imports a name of ``_LAZY`` from its module on first access (:func:`inferbus._lazy_getattr`)."""


def __dir__() -> list[str]:
    """What the module holds, and the embedded-server names not imported yet."""
    return sorted(set(globals()) | set(_LAZY))
