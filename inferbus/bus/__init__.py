"""The bus: NATS connection, subjects, headers, deadlines, embedded servers.

Imports only :mod:`inferbus.schemas` of our own code.
"""

from . import _headers as headers
from ._busypoll import BusyPoll
from ._config import BusConfig, rotate_servers, server_url_problem, shown_servers, shown_url, split_servers
from ._connect import (ConnectionLost, close_connection, closed_on_purpose, connect, connected_server,
                       fail_pending_requests)
from ._fastpub import HeaderError, header_block, publish_raw, reply_block, send_pending
from ._embedded import (
    EmbeddedNats,
    EmbeddedServerError,
    EmbeddedValkey,
    free_port,
    gateway_mesh,
    nats_server_binary,
    valkey_server_binary,
)
from ._headers import deadline_from_headers, format_ms, remaining_ms
from ._subjects import Subjects, leading_zero_fix, version_problem

__all__ = [
    "BusConfig", "BusyPoll", "ConnectionLost", "EmbeddedNats", "EmbeddedServerError", "EmbeddedValkey", "HeaderError",
    "Subjects", "close_connection", "closed_on_purpose", "connect", "connected_server", "fail_pending_requests",
    "header_block", "leading_zero_fix", "publish_raw", "reply_block", "send_pending",
    "deadline_from_headers", "format_ms", "free_port", "gateway_mesh", "headers", "nats_server_binary", "remaining_ms",
    "rotate_servers", "server_url_problem", "shown_servers", "shown_url", "split_servers", "valkey_server_binary",
    "version_problem",
]
