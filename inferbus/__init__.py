"""inferbus: ML inference served by actors on the NATS message bus.

``inferbus.Client`` (the async SDK, :mod:`inferbus.client`), ``inferbus.SyncClient`` (the same, blocking, for code
without an event loop), ``inferbus.InferResult`` and the typed
errors (``InferbusError``, ``InvalidArgument``, ``NotFound``, ``DeadlineExceeded``,
``ResourceExhausted``, ``Unavailable``, ``PayloadTooLarge``, ``Internal``, from
:mod:`inferbus.schemas`) are imported on first use, so ``import inferbus.schemas`` does not pull in
the client and its NATS dependency.
"""

from __future__ import annotations

from ._lazy import lazy_getattr

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


__getattr__ = lazy_getattr("inferbus", _LAZY, globals())
"""Imports a name of ``_LAZY`` from its module on first access (:func:`inferbus._lazy.lazy_getattr`)."""


def __dir__() -> list[str]:
    """The public names and the module's dunders (not the helper this file imports, ``lazy_getattr``)."""
    return sorted({k for k in globals() if k.startswith("__") and k.endswith("__")} | set(_LAZY))
