"""The accelerator protocol: one interface, one module per runtime (anyio's abc/_backends shape).

A *backend* loads an ONNX artifact at a precision into a *session*; the session
describes its tensors, warms up and runs inference on numpy arrays. Sessions are
not thread-safe unless stated: a worker runs one at a time on its own thread.

Error tree::

    AcceleratorError
    ├── BackendUnavailable   the runtime or device is missing here (import failed, no GPU)
    ├── ModelLoadError       the artifact cannot be loaded at that precision
    │   └── PrecisionRefused the precision was tried and failed its check against FP32
    ├── InferenceError       the runtime failed while running a request
    └── PoolExhausted        a pinned-buffer or stream pool has nothing free (bounded, never grows)

Precisions are the strings of :data:`PRECISIONS`; ``auto`` resolves per device
kind (:func:`default_precision`): FP16 on GPU and TPU, FP32 on CPU.
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


class PrecisionRefused(ModelLoadError):
    """A reduced precision failed its load-time check against the FP32 reference (over tolerance or non-finite)."""


class InferenceError(AcceleratorError):
    """The runtime raised while running inference; the cause is chained."""


class PoolExhausted(AcceleratorError):
    """Every buffer (or stream) of a fixed-size pool is in use; pools never grow past their bound."""


PRECISIONS = ("fp32", "fp16", "bf16", "int8")
"""Precisions a backend may serve; ``auto`` is accepted wherever a precision is asked for."""

DEVICE_KINDS = ("cpu", "gpu", "tpu")


def default_precision(device_kind: str) -> str:
    """What ``auto`` means on a device kind: ``fp16`` on ``gpu`` and ``tpu``, ``fp32`` on ``cpu`` (DESIGN §5)."""
    return "fp16" if device_kind in ("gpu", "tpu") else "fp32"


def check_precision(precision: str, device_kind: str) -> str:
    """``precision`` validated and with ``auto`` resolved.

    Raises:
        ValueError: not ``auto`` and not one of :data:`PRECISIONS`.
    """
    if precision == "auto":
        return default_precision(device_kind)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be auto or one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output: OIP datatype name and shape (-1 = variable dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class DeviceInfo:
    """What a worker serves on.

    ``kind`` is ``cpu``, ``gpu`` or ``tpu``; ``index`` the CPU slot, CUDA device
    ordinal or TPU core as the host numbers it; ``name`` a short label
    (``gpu0``); ``facts`` what the runtime told us (model name, memory bytes,
    compute capability, runtime versions), JSON-serialisable.
    """

    kind: str
    name: str
    index: int = 0
    backend: str = ""
    facts: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "index": self.index, "backend": self.backend,
                "facts": dict(self.facts)}


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


def zero_feeds(inputs: tuple[TensorInfo, ...], batch: int) -> dict[str, np.ndarray]:
    """Zero-filled inputs (``b""`` for BYTES) of ``batch`` rows: a variable first dimension takes ``batch``, any
    other variable dimension 1; the warm-ups' and :func:`rows_problem`'s feeds."""
    from ._dtypes import numpy_dtype_for

    feeds = {}
    for t in inputs:
        shape = tuple(batch if i == 0 and d < 0 else (d if d >= 0 else 1) for i, d in enumerate(t.shape))
        feeds[t.name] = (np.full(shape, b"", dtype=object) if t.datatype == "BYTES"
                         else np.zeros(shape, dtype=numpy_dtype_for(t.datatype)))
    return feeds


def rows_problem(sess: "Session") -> str | None:
    """Why requests of ``sess``'s model cannot be merged into one run or cut into chunks by rows; None when they
    can. They can when every input has a variable first dimension and, run at 1 and at 2 rows (zero inputs), every
    output has that many rows first and the rest of its shape the same at both: what Triton requires of a model
    with ``max_batch_size`` > 0 (the batch is the first dimension of every input and output). A model that fails
    this was merged and split by rows anyway: a constant output ``[4]`` of a batch of 4 was cut into one-row
    pieces, an output ``[N, N]`` handed one client the products of another's rows (a fresh-user trial,
    2026-12-05). Shapes only: a model that mixes rows while keeping them in place (a softmax across the batch) is
    not seen; ``max_batch_size`` > 0 says its rows are independent."""
    if not sess.inputs:
        return "it has no inputs"
    for t in sess.inputs:
        if not t.shape or t.shape[0] != -1:
            return f"input {t.name!r} has shape {list(t.shape)}: its first dimension is not variable"
    shapes = {}
    for b in (1, 2):
        try:
            out = sess.infer(zero_feeds(sess.inputs, b))
        except Exception as exc:  # noqa: BLE001 - the runtime's words, whatever it raised
            return f"it cannot run {b} rows of zeros: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        shapes[b] = {name: tuple(np.shape(arr)) for name, arr in out.items()}
    return batch_shapes_problem(shapes)


def batch_shapes_problem(shapes: dict[int, dict[str, tuple[int, ...]]]) -> str | None:
    """The rule of :func:`rows_problem` over the outputs' shapes at 1 and at 2 rows (``{1: {name: shape}, 2:
    {...}}``, run or evaluated abstractly: the JAX session's ``jax.eval_shape``): why rows cannot be merged or cut,
    or None when every output has that many rows first and the rest of its shape the same at both."""
    for b in (1, 2):
        for name, shape in shapes[b].items():
            if not shape or shape[0] != b:
                return f"output {name!r} has shape {list(shape)} for {b} row(s): its first dimension is not the batch"
    for name, one in shapes[1].items():
        two = shapes[2].get(name, ())
        if one[1:] != two[1:]:
            return (f"output {name!r} has shape {list(one)} for 1 row and {list(two)} for 2: the rest of its shape "
                    f"changes with the batch")
    return None


class Backend(Protocol):
    """Loads artifacts into sessions for one runtime."""

    name: str

    def devices(self) -> list[DeviceInfo]:
        """Devices this backend can serve on here (empty when none).

        Raises:
            BackendUnavailable: the runtime is missing.
        """
        ...

    def load(self, path: Path, *, precision: str = "fp32", device_kind: str = "cpu", device_index: int = 0,
             threads: int = 1) -> Session:
        """Load an ONNX artifact onto one device at one precision (no accuracy check: see
        :func:`inferbus.accelerators.load_checked`, which workers use).

        Args:
            path: the ONNX file.
            precision: one of :data:`PRECISIONS` (not ``auto``).
            device_kind: ``cpu``, ``gpu`` or ``tpu``.
            device_index: which device of that kind.
            threads: CPU threads the runtime may use (CPU backends).

        Raises:
            BackendUnavailable: the runtime or that device is missing.
            ModelLoadError: the artifact, an op of it, or the precision is not supported here.
        """
        ...
