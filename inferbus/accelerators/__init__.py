"""Accelerator backends behind one protocol (:mod:`._abc`), one module per runtime."""

from ._abc import (
    AcceleratorError, Backend, BackendUnavailable, DeviceInfo, InferenceError, ModelLoadError, Session, TensorInfo,
)
from ._onnxruntime import OnnxRuntimeBackend, OrtSession


def get_backend(name: str) -> Backend:
    """The backend called ``name``.

    Raises:
        BackendUnavailable: unknown name or the runtime is missing here.
    """
    if name == "onnxruntime":
        return OnnxRuntimeBackend()
    raise BackendUnavailable(f"unknown backend {name!r}; available: onnxruntime")


__all__ = [
    "AcceleratorError", "Backend", "BackendUnavailable", "DeviceInfo", "InferenceError", "ModelLoadError",
    "OnnxRuntimeBackend", "OrtSession", "Session", "TensorInfo", "get_backend",
]
