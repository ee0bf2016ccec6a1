"""ONNX Runtime backend (CPU; CUDA / TensorRT execution providers when onnxruntime-gpu is present).

Session options are set for latency at batch 1: one intra-op and one inter-op
thread (the worker owns one CPU slot, and the node pins it there with
``--pin-cpus``), sequential execution, all graph optimizations, no thread
spinning between requests.

Precisions:

* ``fp32``: the artifact as exported (CPU, CUDA EP, TensorRT EP).
* ``int8`` on CPU: ONNX Runtime dynamic quantization
  (``onnxruntime.quantization.quantize_dynamic``: int8 weights per output
  channel, activations quantized per tensor at run time). ORT's dynamic
  quantizer handles ``MatMul`` and ``Conv`` but not ``Gemm``, so each plain
  ``Gemm`` (alpha = beta = 1, no transA) is first rewritten as ``MatMul`` +
  ``Add`` with the weight transposed when ``transB`` is set. Needs the ``onnx``
  package; without it int8 is refused (and the check falls back to FP32).
* ``fp16`` on GPU through the TensorRT execution provider (``trt_fp16_enable``)
  when onnxruntime-gpu ships it; on CPU and the CUDA EP fp16 is refused (no
  fp16 kernels worth serving there).
"""

from __future__ import annotations

import os
import platform
import tempfile
from pathlib import Path

import numpy as np

from ._abc import (BackendUnavailable, DeviceInfo, InferenceError, ModelLoadError, PrecisionRefused, TensorInfo,
                   zero_feeds)

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


#: An input larger than this many times the largest warm-up input (and than :data:`SHRINK_MIN_BYTES`) runs with
#: ONNX Runtime's CPU arena shrinkage, and so does the run after it (the first run's outputs still hold their
#: region when it ends).
SHRINK_OVER_WARMUP = 4
SHRINK_MIN_BYTES = 1 << 20


class OrtSession:
    """An ``onnxruntime.InferenceSession`` behind the :class:`Session` protocol.

    Memory: ONNX Runtime's CPU arena grows to the largest run and keeps it. A worker that served one legal
    30,000-row ``digits_cnn`` request (7.7 MB in) held ~1.6 GB of RSS while idle after it (a fresh-user trial,
    2026-12-02). A run whose input is over :data:`SHRINK_OVER_WARMUP` times the largest warm-up input (at least
    :data:`SHRINK_MIN_BYTES`) therefore runs with the run option ``memory.enable_memory_arena_shrinkage`` =
    ``cpu:0`` (ONNX Runtime's ``onnxruntime_run_options_config_keys.h``), and so does the next run: measured in
    one process on the 2-core box, that 30,000-row run left 790 MB of RSS without it, 306 MB after the run itself
    and 72 MB after the next (57 MB after warm-up). Runs of the sizes warmed up never shrink (no cost on the
    serving path beyond a size check). CPU sessions only."""

    def __init__(self, sess, precision: str, device: DeviceInfo) -> None:
        self._sess = sess
        self.precision = precision
        self.device = device
        self.inputs = tuple(TensorInfo(i.name, _ORT_TO_OIP.get(i.type, i.type), _dims(i.shape)) for i in sess.get_inputs())
        self.outputs = tuple(TensorInfo(o.name, _ORT_TO_OIP.get(o.type, o.type), _dims(o.shape)) for o in sess.get_outputs())
        self._all_outputs = [o.name for o in self.outputs]
        self._shrink_over_bytes = SHRINK_MIN_BYTES if device.kind == "cpu" else float("inf")
        """An input larger than this (bytes) runs with arena shrinkage (:meth:`warmup` raises it)."""
        self._shrink_next = False
        self._shrink_opts = None
        if device.kind == "cpu":
            import onnxruntime as ort

            self._shrink_opts = ort.RunOptions()
            self._shrink_opts.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        self.arena_shrinks = 0
        """Runs made with arena shrinkage since the session was created."""

    def infer(self, inputs: dict[str, np.ndarray], output_names: list[str] | None = None) -> dict[str, np.ndarray]:
        names = output_names or self._all_outputs
        opts = None
        if self._shrink_next:
            opts, self._shrink_next = self._shrink_opts, False
        over = self._shrink_over_bytes
        for a in inputs.values():
            if a.nbytes > over:
                opts, self._shrink_next = self._shrink_opts, True
                break
        try:
            results = self._sess.run(names, inputs, opts)
        except Exception as exc:
            raise InferenceError(f"onnxruntime: {exc}") from exc
        if opts is not None:
            self.arena_shrinks += 1
        return dict(zip(names, results))

    def warmup(self, batch_sizes: tuple[int, ...] = (1,)) -> None:
        for b in batch_sizes:
            feeds = zero_feeds(self.inputs, b)
            if self._shrink_opts is not None:
                for a in feeds.values():
                    self._shrink_over_bytes = max(self._shrink_over_bytes, SHRINK_OVER_WARMUP * a.nbytes)
            self.infer(feeds)

    def close(self) -> None:
        self._sess = None


def _cpu_slots() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def quantize_int8(path: Path) -> bytes:
    """The ONNX model at ``path`` dynamically quantized to int8 (Gemm rewritten first), as serialized bytes.

    Raises:
        PrecisionRefused: the onnx package is missing or quantization failed.
    """
    try:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:
        raise PrecisionRefused("int8 on onnxruntime needs the onnx package (pip install onnx)") from exc
    try:
        from ._onnx_convert import gemm_to_matmul

        model = gemm_to_matmul(onnx.load(str(path)))
        with tempfile.TemporaryDirectory(prefix="inferbus-int8-") as tmp:
            src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
            onnx.save(model, str(src))
            # reduce_range: 7-bit weights, so u8 x s8 products cannot saturate int16 on CPUs without VNNI
            # (observed here on AVX2: full range gave a 0.29 error on digits' probabilities, 7-bit 0.028)
            quantize_dynamic(src, dst, per_channel=True, reduce_range=True, weight_type=QuantType.QInt8,
                             op_types_to_quantize=["MatMul"])
            return dst.read_bytes()
    except Exception as exc:
        raise PrecisionRefused(f"int8 dynamic quantization failed: {exc}") from exc


class OnnxRuntimeBackend:
    """Loads ONNX models into ONNX Runtime sessions."""

    name = "onnxruntime"

    def devices(self) -> list[DeviceInfo]:
        """One CPU slot per core this process may run on; a GPU when onnxruntime-gpu has the CUDA EP."""
        ort = _import_ort()
        facts = {"cpu_model": _cpu_model(), "onnxruntime": ort.__version__, "threads": 1}
        out = [DeviceInfo("cpu", f"cpu{i}", i, self.name, facts) for i in _cpu_slots()]
        providers = ort.get_available_providers()
        if "CUDAExecutionProvider" in providers:
            out.append(DeviceInfo("gpu", "gpu0", 0, self.name, {"onnxruntime": ort.__version__,
                                                                  "providers": providers}))
        return out

    def load(self, path: Path, *, precision: str = "fp32", device_kind: str = "cpu", device_index: int = 0,
             threads: int = 1) -> OrtSession:
        """Load ``path`` into a latency-tuned session.

        Args:
            path: ONNX file.
            precision: ``fp32``; ``int8`` (CPU, dynamic quantization); ``fp16`` (GPU with the TensorRT EP).
            device_kind: ``cpu`` or ``gpu`` (CUDA / TensorRT execution providers).
            device_index: CPU slot (informational: pinning is the node's job) or CUDA device.
            threads: intra-op threads (1 = run on the calling thread).

        Raises:
            ModelLoadError: the file is missing or not a valid model.
            PrecisionRefused: the precision is not offered on that device here.
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
        providers: list = ["CPUExecutionProvider"]
        available = ort.get_available_providers()
        if device_kind == "gpu":
            if "CUDAExecutionProvider" not in available:
                raise BackendUnavailable("onnxruntime has no CUDAExecutionProvider here (install onnxruntime-gpu)")
            providers = [("CUDAExecutionProvider", {"device_id": device_index}), "CPUExecutionProvider"]
            if precision == "fp16":
                if "TensorrtExecutionProvider" not in available:
                    raise PrecisionRefused("fp16 on onnxruntime-gpu needs the TensorRT execution provider")
                providers.insert(0, ("TensorrtExecutionProvider", {"device_id": device_index, "trt_fp16_enable": True}))
            elif precision not in ("fp32",):
                raise PrecisionRefused(f"onnxruntime on GPU serves fp32 (and fp16 with TensorRT), not {precision}")
        elif device_kind != "cpu":
            raise BackendUnavailable(f"onnxruntime does not serve {device_kind} devices")
        elif precision not in ("fp32", "int8"):
            raise PrecisionRefused(f"onnxruntime on CPU serves fp32 and int8, not {precision}")
        if not Path(path).is_file():
            raise ModelLoadError(f"cannot load {path}: no such file")
        source: str | bytes = str(path)
        if precision == "int8":
            source = quantize_int8(Path(path))
        try:
            sess = ort.InferenceSession(source, sess_options=so, providers=providers)
        except Exception as exc:
            raise ModelLoadError(f"cannot load {path}: {exc}") from exc
        facts = {"onnxruntime": ort.__version__, "providers": sess.get_providers(), "threads": threads}
        dev = DeviceInfo(device_kind, f"{device_kind}{device_index}", device_index, self.name, facts)
        return OrtSession(sess, precision, dev)
