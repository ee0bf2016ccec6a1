"""Package attributes imported on first access: a module ``__getattr__`` (PEP 562) for a package whose public names
would otherwise import heavy modules when the package is imported (``inferbus``: the client and nats-py;
``inferbus.bus``: the embedded servers and the supervisor). Imports nothing but :mod:`importlib`."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_getattr(package: str, table: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: a name in ``table`` (name → the module that defines it) is imported from
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
