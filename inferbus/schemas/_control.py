"""Model-management requests and replies (``<p>.models.<model>.load|unload|default``).

The body is MessagePack or JSON like every public message (``Content-Type``); an
empty body is an empty request. Errors come back as typed error replies
(:mod:`inferbus.schemas._errors`). See docs/models.md for the semantics.
"""

from __future__ import annotations

import msgspec

MODEL_OPS = ("load", "unload", "default")
"""The model-management operations, in the order the CLI lists them."""


class ModelControlRequest(msgspec.Struct, omit_defaults=True):
    """The body of a model-management request.

    ``version``: the model version the operation acts on, a string of digits or an integer (``2`` is ``"2"``, as
    in config.json). ``load`` without one loads every version in the repository folder that is not served yet;
    ``unload`` and ``default`` need one.
    """

    version: str | int | None = None


class ModelControlReply(msgspec.Struct, omit_defaults=True):
    """The answer to a model-management request that succeeded.

    ``workers``: per worker that had to act, ``loaded``, ``drained`` or ``failed: <reason>``.
    ``revision``: the model's serving-state revision after the write (+1 per write).
    ``elapsed_ms``: from the request's arrival at the ingress to the reply, ms.
    """

    model: str
    op: str
    versions: list[str]
    """Versions served after the operation."""
    default_version: str
    revision: int
    version: str | None = None
    workers: dict[str, str] = {}
    elapsed_ms: float = 0.0
    changed: bool = True
    """False when the state already was what the request asked for (the request is idempotent)."""
