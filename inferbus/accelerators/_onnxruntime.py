"""ONNX Runtime backend (CPU; CUDA / TensorRT execution providers when onnxruntime-gpu is present).

Session options are set for latency at batch 1: one intra-op and one inter-op
thread (the worker owns one CPU slot), sequential execution, all graph
optimizations, no thread spinning between requests.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ._abc import BackendUnavailable, DeviceInfo, InferenceError, ModelLoadError, TensorInfo

# ONNX Runtime type strings → OIP datatypes (https://onnxruntime.ai/docs/api/python/api_summary.html)
_ORT_TO_OIP = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16", "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64", "tensor(int8)": "INT8", "tensor(int16)": "INT16", "tensor(int32)": "INT32",
    "tensor(int64)": "INT64", "tensor(float16)": "FP16", "tensor(bfloat16)": "BF16", "tensor(float)": "FP32",
    "tensor(double)": "FP64", "tensor(string)": "BYTES",
}


def _import_ort():
    try:
        import onnxruntime as ort
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise BackendUnavailable("onnxruntime is not installed") from exc
    return ort


def _dims(shape) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape)


class OrtSession:
    """An ``onnxruntime.InferenceSession`` behind the :class:`Session` protocol."""

    def __init__(self, sess, precision: str, device: DeviceInfo) -> None:
        self._sess = sess
        self.precision = precision
        self.device = device
        self.inputs = tuple(TensorInfo(i.name, _ORT_TO_OIP.get(i.type, i.type), _dims(i.shape)) for i in sess.get_inputs())
        self.outputs = tuple(TensorInfo(o.name, _ORT_TO_OIP.get(o.type, o.type), _dims(o.shape)) for o in sess.get_outputs())
        self._all_outputs = [o.name for o in self.outputs]

    def infer(self, inputs: dict[str, np.ndarray], output_names: list[str] | None = None) -> dict[str, np.ndarray]:
        names = output_names or self._all_outputs
        try:
            results = self._sess.run(names, inputs)
        except Exception as exc:
            raise InferenceError(f"onnxruntime: {exc}") from exc
        return dict(zip(names, results))

    def warmup(self, batch_sizes: tuple[int, ...] = (1,)) -> None:
        from ._dtypes import numpy_dtype_for

        for b in batch_sizes:
            feeds = {}
            for t in self.inputs:
                shape = tuple(b if i == 0 and d < 0 else (d if d >= 0 else 1) for i, d in enumerate(t.shape))
                dt = numpy_dtype_for(t.datatype)
                feeds[t.name] = np.zeros(shape, dtype=dt) if t.datatype != "BYTES" else np.full(shape, b"", dtype=object)
            self.infer(feeds)

    def close(self) -> None:
        self._sess = None


class OnnxRuntimeBackend:
    """Loads ONNX models into ONNX Runtime sessions."""

    name = "onnxruntime"

    def devices(self) -> list[DeviceInfo]:
        ort = _import_ort()
        out = [DeviceInfo("cpu", f"cpu{i}", i, self.name) for i in range(os.cpu_count() or 1)]
        if "CUDAExecutionProvider" in ort.get_available_providers():
            out.append(DeviceInfo("gpu", "cuda:0", 0, self.name))
        return out

    def load(self, path: Path, *, precision: str = "fp32", device_index: int = 0, threads: int = 1,
             device_kind: str = "cpu") -> OrtSession:
        """Load ``path`` into a latency-tuned session.

        Args:
            path: ONNX file.
            precision: ``fp32`` (as exported). Other precisions come from the precision module.
            device_index: CPU slot (informational) or CUDA device.
            threads: intra-op threads (1 = run on the calling thread).
            device_kind: ``cpu`` or ``gpu`` (CUDA execution provider).

        Raises:
            ModelLoadError: the file is missing or not a valid model.
            BackendUnavailable: a GPU was asked for and the CUDA provider is absent.
        """
        ort = _import_ort()
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.log_severity_level = 3
        providers = ["CPUExecutionProvider"]
        if device_kind == "gpu":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise BackendUnavailable("onnxruntime has no CUDAExecutionProvider here (install onnxruntime-gpu)")
            providers = [("CUDAExecutionProvider", {"device_id": device_index}), "CPUExecutionProvider"]
        try:
            sess = ort.InferenceSession(str(path), sess_options=so, providers=providers)
        except Exception as exc:
            raise ModelLoadError(f"cannot load {path}: {exc}") from exc
        dev = DeviceInfo(device_kind, f"{device_kind}{device_index}", device_index, self.name)
        return OrtSession(sess, precision, dev)
