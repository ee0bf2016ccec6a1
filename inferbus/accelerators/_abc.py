"""The accelerator protocol: one interface, one module per runtime (anyio's abc/_backends shape).

A *backend* loads an ONNX artifact at a precision into a *session*; the session
describes its tensors, warms up and runs inference on numpy arrays. Sessions are
not thread-safe unless stated: a worker runs one at a time on its own thread.

Error tree::

    AcceleratorError
    ├── BackendUnavailable   the runtime or device is missing here (import failed, no GPU)
    ├── ModelLoadError       the artifact cannot be loaded at that precision
    └── InferenceError       the runtime failed while running a request
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np


class AcceleratorError(Exception):
    """Base of every error raised by :mod:`inferbus.accelerators`."""


class BackendUnavailable(AcceleratorError):
    """The runtime or the device is not present on this machine."""


class ModelLoadError(AcceleratorError):
    """The model artifact could not be loaded (bad file, unsupported op or precision)."""


class InferenceError(AcceleratorError):
    """The runtime raised while running inference; the cause is chained."""


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output: OIP datatype name and shape (-1 = variable dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class DeviceInfo:
    """What a worker serves on: ``kind`` is ``cpu``, ``gpu`` or ``tpu``."""

    kind: str
    name: str
    index: int = 0
    backend: str = ""
    facts: dict = field(default_factory=dict)


@runtime_checkable
class Session(Protocol):
    """A loaded model, ready to run."""

    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    precision: str
    device: DeviceInfo

    def infer(self, inputs: dict[str, np.ndarray], output_names: list[str] | None = None) -> dict[str, np.ndarray]:
        """Run the model.

        Args:
            inputs: one array per model input, by name; dtypes and shapes already
                validated against :attr:`inputs`.
            output_names: outputs to compute (None = all).

        Returns:
            One array per requested output, by name.

        Raises:
            InferenceError: the runtime failed.
        """
        ...

    def warmup(self, batch_sizes: tuple[int, ...] = (1,)) -> None:
        """Run zero-filled inputs at each batch size so the first request pays no set-up cost."""
        ...

    def close(self) -> None: ...


class Backend(Protocol):
    """Loads artifacts into sessions for one runtime."""

    name: str

    def devices(self) -> list[DeviceInfo]:
        """Devices this backend can serve on here (empty when none)."""
        ...

    def load(self, path: Path, *, precision: str = "fp32", device_index: int = 0, threads: int = 1) -> Session:
        """Load an ONNX artifact.

        Raises:
            BackendUnavailable: the runtime is missing.
            ModelLoadError: the artifact or precision is not supported.
        """
        ...
