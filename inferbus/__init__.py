"""inferbus: ML inference served by actors on the NATS message bus.

``inferbus.Client`` (the async SDK, :mod:`inferbus.client`), ``inferbus.SyncClient`` (the same, blocking, for code
without an event loop), ``inferbus.InferResult`` and the typed
errors (``InferbusError``, ``InvalidArgument``, ``NotFound``, ``DeadlineExceeded``,
``ResourceExhausted``, ``Unavailable``, ``PayloadTooLarge``, ``Internal``, from
:mod:`inferbus.schemas`) are imported on first use, so ``import inferbus.schemas`` does not pull in
the client and its NATS dependency.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def _lazy_getattr(package: str, table: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package`` (this one's and :mod:`inferbus.bus`'s: one helper, here so that importing
    the package loads no other module of it): a name in ``table`` (name → the module that defines it) is imported from
    that module on first access and stored in ``namespace`` (the package's ``globals()``), so that later accesses
    find it without this call.

    The returned function raises AttributeError for a name not in ``table``, worded as Python words it for a
    module (``module 'inferbus' has no attribute 'x'``)."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__


_LAZY = {
    "Client": "inferbus.client",
    "SyncClient": "inferbus.client",
    "InferResult": "inferbus.client",
    "InferbusError": "inferbus.schemas",
    "InvalidArgument": "inferbus.schemas",
    "NotFound": "inferbus.schemas",
    "DeadlineExceeded": "inferbus.schemas",
    "ResourceExhausted": "inferbus.schemas",
    "Unavailable": "inferbus.schemas",
    "PayloadTooLarge": "inferbus.schemas",
    "Internal": "inferbus.schemas",
}

__all__ = sorted(_LAZY)


__getattr__ = _lazy_getattr("inferbus", _LAZY, globals())
"""Imports a name of ``_LAZY`` from its module on first access (:func:`_lazy_getattr`)."""


def __dir__() -> list[str]:
    """The public names and the module's dunders (not this file's helpers, ``_lazy_getattr`` and its imports)."""
    return sorted({k for k in globals() if k.startswith("__") and k.endswith("__")} | set(_LAZY))
