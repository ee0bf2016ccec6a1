"""Accelerator backends behind one protocol (:mod:`._abc`), one module per runtime.

=============  ====================================  =========================  ===========================
backend        devices                               precisions                 module
=============  ====================================  =========================  ===========================
onnxruntime    CPU slots (GPU with onnxruntime-gpu)  fp32, int8 (CPU)           :mod:`._onnxruntime`
jax            TPU cores, GPUs, CPU                  fp32, fp16, bf16           :mod:`._jax`
tensorrt       NVIDIA GPUs                           fp32, fp16, int8           :mod:`._tensorrt` (never run here)
=============  ====================================  =========================  ===========================

Workers load through :func:`load_checked`, which checks the precision against
FP32 on the model's reference inputs and falls back to FP32 (:mod:`._precision`).
GPU host memory comes from fixed-size pinned pools and a stream pool
(:mod:`._cuda`); :func:`discover_devices` finds what is here (:mod:`._devices`).
"""

from .._limits import BACKENDS  # (defined there, so the CLI's help reads it without importing the accelerators)
from ._abc import (
    DEVICE_KINDS, PRECISIONS, AcceleratorError, Backend, BackendUnavailable, DeviceInfo, InferenceError,
    ModelLoadError, PoolExhausted, PrecisionRefused, Session, TensorInfo, check_precision, default_precision,
    rows_problem, zero_feeds,
)
from ._devices import DevicePlan, discover_devices, plan_workers
from ._onnxruntime import OnnxRuntimeBackend, OrtSession
from ._precision import TOLERANCES, CheckedSession, PrecisionReport, load_checked, load_reference, normalized_errors


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (one of :data:`BACKENDS`).

    The runtime itself is imported when the backend first loads a model or
    lists devices, so asking for one never costs its import time.

    Raises:
        BackendUnavailable: unknown name.
    """
    if name == "onnxruntime":
        return OnnxRuntimeBackend()
    if name == "jax":
        from ._jax import JaxBackend

        return JaxBackend()
    if name == "tensorrt":
        from ._tensorrt import TensorRTBackend

        return TensorRTBackend()
    raise BackendUnavailable(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")


def batch_buckets(max_batch_size: int) -> tuple[int, ...]:
    """Batch sizes to compile/warm for a model: powers of two up to ``max_batch_size`` (and it), at least (1,)."""
    sizes, b = [], 1
    while b < max(max_batch_size, 1):
        sizes.append(b)
        b *= 2
    sizes.append(max(max_batch_size, 1))
    return tuple(sorted(set(sizes)))


__all__ = [
    "AcceleratorError", "BACKENDS", "Backend", "BackendUnavailable", "CheckedSession", "DEVICE_KINDS", "DeviceInfo",
    "DevicePlan", "InferenceError", "ModelLoadError", "OnnxRuntimeBackend", "OrtSession", "PRECISIONS",
    "PoolExhausted", "PrecisionRefused", "PrecisionReport", "Session", "TOLERANCES", "TensorInfo", "batch_buckets",
    "check_precision", "default_precision", "discover_devices", "get_backend", "load_checked", "load_reference",
    "normalized_errors", "plan_workers", "rows_problem", "zero_feeds",
]
