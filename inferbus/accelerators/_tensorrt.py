"""TensorRT backend (NVIDIA GPUs). NEVER RUN IN THIS WORKPLACE: TensorRT cannot be installed here
and the GPU host has none. Written against TensorRT's documented Python API (10.x and 11.x);
``tests/test_accelerators.py`` runs it where ``import tensorrt`` works and skips with that reason elsewhere.

Build (once per model × precision × GPU × TensorRT version, then cached on disk):

1. The ONNX artifact is prepared for the precision: ``fp32`` as is; ``fp16``
   via ``BuilderFlag.FP16`` on TensorRT 10 (weak typing), or on TensorRT 11,
   which removed that flag and builds strongly typed networks only, via our
   :func:`~._onnx_convert.to_fp16` graph rewrite; ``int8`` via explicit
   quantization: Q/DQ nodes calibrated on the model's reference rows
   (:func:`~._onnx_convert.quantize_qdq`), the replacement TensorRT documents
   for its INT8 calibrators (deprecated in 10.1, removed in 11).
2. ``trt.OnnxParser`` fills the network; one optimization profile covers batch
   1..``max_batch_size`` with the optimum at 1 (latency).
3. ``builder.build_serialized_network`` makes the plan, written to
   ``<cache_dir>/<sha256 of the model, 16 hex>-<precision>-<GPU model>-sm<cc>-trt<version>-b<max batch>.engine``.
   A plan is only valid for the GPU model and TensorRT version it was built
   with, hence the key.

Run: one execution context per session; device buffers for every I/O tensor
sized for the largest batch are allocated once (``cudaMalloc``) and bound with
``set_tensor_address``; each request copies its inputs into pinned buffers from
a :class:`~._cuda.PinnedBufferPool`, enqueues H2D copies, ``execute_async_v3``
and D2H copies on a stream from a :class:`~._cuda.StreamPool`, and waits on
that stream. For batch 1 the whole sequence (copies + execute) is captured
once into a CUDA graph (:class:`~._cuda.CudaGraph`) with dedicated pinned
buffers and replayed with one launch, as TensorRT's docs allow for
``enqueueV3`` after one ordinary call with fixed shapes and addresses.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path

import numpy as np

from ._abc import BackendUnavailable, DeviceInfo, InferenceError, ModelLoadError, PrecisionRefused, TensorInfo

log = logging.getLogger("inferbus.accelerators.tensorrt")

_TRT_TO_OIP = {"FLOAT": "FP32", "HALF": "FP16", "BF16": "BF16", "INT8": "INT8", "INT32": "INT32", "INT64": "INT64",
               "BOOL": "BOOL", "UINT8": "UINT8"}


def _import_trt():
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise BackendUnavailable("tensorrt is not installed (pip install tensorrt; it serves NVIDIA GPUs only)") from exc
    except Exception as exc:  # the wheel is there but its libraries are not
        raise BackendUnavailable(f"tensorrt does not import: {exc}") from exc
    return trt


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/inferbus/tensorrt`` (``~/.cache/inferbus/tensorrt``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "inferbus" / "tensorrt"


def engine_cache_key(model_bytes: bytes, precision: str, gpu_model: str, compute_capability: str,
                     trt_version: str, max_batch: int) -> str:
    """File name of a cached plan: every fact the plan depends on, filesystem-safe."""
    gpu = re.sub(r"[^A-Za-z0-9]+", "_", gpu_model).strip("_") or "gpu"
    cc = compute_capability.replace(".", "")
    return f"{hashlib.sha256(model_bytes).hexdigest()[:16]}-{precision}-{gpu}-sm{cc}-trt{trt_version}-b{max_batch}.engine"


class TensorRTSession:
    """A deserialized engine with its context, device buffers, pools and (batch 1) CUDA graph."""

    def __init__(self, trt, engine, device: DeviceInfo, precision: str, max_batch: int, pinned_pool=None,
                 streams=None, use_cuda_graph: bool = True) -> None:
        from ._cuda import DeviceBuffer, PinnedBufferPool, StreamPool

        self.precision = precision
        self.device = device
        self._trt = trt
        self._engine = engine
        self._ctx = engine.create_execution_context()
        self._max_batch = max_batch
        self._pool = pinned_pool or PinnedBufferPool()
        self._streams = streams or StreamPool(2)
        self._names_in, self._names_out = [], []
        self._dtype: dict[str, np.dtype] = {}
        self._shape: dict[str, tuple[int, ...]] = {}
        self._dev: dict[str, DeviceBuffer] = {}
        ins, outs = [], []
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            dt = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
            shape = tuple(int(d) for d in engine.get_tensor_shape(name))
            self._dtype[name], self._shape[name] = dt, shape
            full = tuple(max_batch if d < 0 else d for d in shape)
            self._dev[name] = DeviceBuffer(max(int(np.prod(full)) * dt.itemsize, 1))
            self._ctx.set_tensor_address(name, self._dev[name].ptr)
            info = TensorInfo(name, _TRT_TO_OIP.get(engine.get_tensor_dtype(name).name, "FP32"),
                              tuple(-1 if d < 0 else d for d in shape))
            if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
                self._names_in.append(name)
                ins.append(info)
            else:
                self._names_out.append(name)
                outs.append(info)
        self.inputs, self.outputs = tuple(ins), tuple(outs)
        self._graph = None
        self._graph_bufs = None
        self._use_graph = use_cuda_graph

    def _run(self, feeds: dict[str, np.ndarray], n: int, stream, host_in, host_out) -> None:
        from ._cuda import memcpy_async

        for name in self._names_in:
            shape = (n,) + self._shape[name][1:] if self._shape[name][0] < 0 else self._shape[name]
            if not self._ctx.set_input_shape(name, shape):
                raise InferenceError(f"tensorrt: input {name} shape {shape} outside the optimization profile")
            memcpy_async(self._dev[name].ptr, host_in[name].ptr, feeds[name].nbytes, "h2d", stream)
        if not self._ctx.execute_async_v3(int(stream)):
            raise InferenceError("tensorrt: execute_async_v3 returned false")
        for name in self._names_out:
            nbytes = int(np.prod(self._ctx.get_tensor_shape(name))) * self._dtype[name].itemsize
            memcpy_async(host_out[name].ptr, self._dev[name].ptr, nbytes, "d2h", stream)

    def infer(self, inputs: dict[str, np.ndarray], output_names: list[str] | None = None) -> dict[str, np.ndarray]:
        names = output_names or self._names_out
        first = inputs[self._names_in[0]]
        n = int(first.shape[0])
        if n > self._max_batch:
            raise InferenceError(f"tensorrt: batch {n} > engine max {self._max_batch}")
        feeds = {k: np.ascontiguousarray(inputs[k], dtype=self._dtype[k]) for k in self._names_in}
        try:
            if n == 1 and self._graph is not None:
                return self._replay(feeds, names)
            with self._streams.stream() as stream:
                bufs_in = {k: self._pool.acquire(feeds[k].nbytes) for k in self._names_in}
                bufs_out = {}
                try:
                    for k in self._names_out:
                        shape = (n,) + self._shape[k][1:] if self._shape[k][0] < 0 else self._shape[k]
                        bufs_out[k] = self._pool.acquire(int(np.prod(shape)) * self._dtype[k].itemsize)
                    for k, buf in bufs_in.items():
                        buf.view(feeds[k].dtype, feeds[k].shape)[...] = feeds[k]
                    self._run(feeds, n, stream, bufs_in, bufs_out)
                    self._streams.synchronize(stream)
                    out = {}
                    for k in names:
                        shape = tuple(self._ctx.get_tensor_shape(k))
                        out[k] = bufs_out[k].view(self._dtype[k], shape).copy()  # the buffer goes back to the pool
                    return out
                finally:
                    for b in list(bufs_in.values()) + list(bufs_out.values()):
                        b.release()
        except InferenceError:
            raise
        except Exception as exc:
            raise InferenceError(f"tensorrt: {exc}") from exc

    def _replay(self, feeds, names):
        stream, bufs_in, bufs_out = self._graph_bufs
        for k in self._names_in:
            bufs_in[k].view(feeds[k].dtype, feeds[k].shape)[...] = feeds[k]
        self._graph.launch(stream)
        self._streams.synchronize(stream)
        return {k: bufs_out[k].view(self._dtype[k], (1,) + self._shape[k][1:]).copy() for k in names}

    def _capture_batch1(self) -> None:
        """Capture copies + execute for batch 1 into a CUDA graph with pinned buffers held for the session."""
        from ._cuda import CudaGraph

        rt_stream = self._streams.streams[0]
        one = {k: np.zeros((1,) + self._shape[k][1:], self._dtype[k]) for k in self._names_in}
        bufs_in = {k: self._pool.acquire(v.nbytes) for k, v in one.items()}
        bufs_out = {k: self._pool.acquire(int(np.prod((1,) + self._shape[k][1:])) * self._dtype[k].itemsize)
                    for k in self._names_out}
        self._run(one, 1, rt_stream, bufs_in, bufs_out)  # one ordinary run first: flushes deferred updates
        self._streams.synchronize(rt_stream)
        self._graph = CudaGraph(rt_stream, lambda s: self._run(one, 1, s, bufs_in, bufs_out))
        self._graph_bufs = (rt_stream, bufs_in, bufs_out)

    def warmup(self, batch_sizes: tuple[int, ...] = (1,)) -> None:
        for b in sorted(set(batch_sizes)):
            if b > self._max_batch:
                continue
            feeds = {k: np.zeros((b,) + self._shape[k][1:], self._dtype[k]) for k in self._names_in}
            self.infer(feeds)
        if self._use_graph and self._graph is None and all(self._shape[k][0] in (-1, 1) for k in self._names_in):
            try:
                self._capture_batch1()
            except Exception as exc:  # not every engine can be captured: run without the graph
                log.warning("tensorrt: CUDA graph capture failed, batch 1 runs uncaptured: %s", exc)
                self._graph = None

    def close(self) -> None:
        if self._graph is not None:
            self._graph.close()
        for b in self._dev.values():
            b.free()
        self._ctx = None
        self._engine = None


class TensorRTBackend:
    """Builds (or loads cached) TensorRT engines from ONNX artifacts."""

    name = "tensorrt"

    def __init__(self, cache_dir: Path | None = None, max_batch_size: int = 64, workspace_bytes: int = 1 << 30,
                 calibration_rows: int = 128) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.max_batch_size = max_batch_size
        self.workspace_bytes = workspace_bytes
        self.calibration_rows = calibration_rows

    def devices(self) -> list[DeviceInfo]:
        trt = _import_trt()
        from ._devices import _gpus_cuda

        gpus = _gpus_cuda({})
        return [DeviceInfo("gpu", g.name, g.index, self.name, {**g.facts, "tensorrt": trt.__version__}) for g in gpus]

    def _prepare(self, trt, path: Path, precision: str) -> tuple[bytes, bool]:
        """ONNX bytes to parse and whether to set ``BuilderFlag.FP16``."""
        raw = path.read_bytes()
        if precision == "fp32":
            return raw, False
        if precision == "fp16":
            if hasattr(trt.BuilderFlag, "FP16"):  # TensorRT 10: weak typing
                return raw, True
            import onnx

            from ._onnx_convert import to_fp16

            return to_fp16(onnx.load_from_string(raw)).SerializeToString(), False
        if precision == "int8":
            from ._onnx_convert import quantize_qdq
            from ._precision import load_reference

            from ._onnxruntime import OnnxRuntimeBackend

            infos = OnnxRuntimeBackend().load(path).inputs
            calib = load_reference(path.parent.parent / "data" / "test.npz", infos, self.calibration_rows)
            if calib is None:
                raise PrecisionRefused("int8 needs calibration rows (data/test.npz) for its Q/DQ scales")
            return quantize_qdq(path, calib), False
        raise PrecisionRefused(f"tensorrt serves fp32, fp16 and int8, not {precision}")

    def _build(self, trt, onnx_bytes: bytes, fp16_flag: bool, logger) -> bytes:
        builder = trt.Builder(logger)
        flags = 0
        if fp16_flag is False and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
            flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse(onnx_bytes):
            errs = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise ModelLoadError(f"tensorrt could not parse the ONNX model: {errs}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, self.workspace_bytes)
        if fp16_flag:
            config.set_flag(trt.BuilderFlag.FP16)
        profile = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            t = network.get_input(i)
            dims = tuple(t.shape)
            if dims and dims[0] == -1:
                rest = tuple(dims[1:])
                profile.set_shape(t.name, (1,) + rest, (1,) + rest, (self.max_batch_size,) + rest)
        config.add_optimization_profile(profile)
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise ModelLoadError("tensorrt could not build an engine (see the TensorRT log above)")
        return bytes(plan)

    def load(self, path: Path, *, precision: str = "fp16", device_kind: str = "gpu", device_index: int = 0,
             threads: int = 1) -> TensorRTSession:
        """Build or load the cached engine for ``path`` at ``precision`` on GPU ``device_index``.

        Raises:
            BackendUnavailable: tensorrt / cuda-python / a GPU is missing, or ``device_kind`` is not ``gpu``.
            PrecisionRefused: the precision cannot be prepared (e.g. int8 without calibration rows).
            ModelLoadError: parsing or building failed.
        """
        trt = _import_trt()
        if device_kind != "gpu":
            raise BackendUnavailable("tensorrt serves gpu devices only")
        from ._cuda import check, cudart

        rt = cudart()
        check(rt.cudaSetDevice(device_index), f"cudaSetDevice({device_index})")
        prop = check(rt.cudaGetDeviceProperties(device_index), "cudaGetDeviceProperties")
        gpu_model = prop.name.decode(errors="replace").rstrip("\x00") if isinstance(prop.name, bytes) else str(prop.name)
        cc = f"{prop.major}.{prop.minor}"
        path = Path(path)
        logger = trt.Logger(trt.Logger.WARNING)
        key = engine_cache_key(path.read_bytes(), precision, gpu_model, cc, trt.__version__, self.max_batch_size)
        plan_path = self.cache_dir / key
        if plan_path.is_file():
            plan = plan_path.read_bytes()
            cached = True
        else:
            onnx_bytes, fp16_flag = self._prepare(trt, path, precision)
            plan = self._build(trt, onnx_bytes, fp16_flag, logger)
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = plan_path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(plan)
            tmp.replace(plan_path)  # atomic: concurrent workers never read half a plan
            cached = False
        engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
        if engine is None:
            raise ModelLoadError(f"tensorrt could not deserialize {plan_path}")
        info = DeviceInfo("gpu", f"gpu{device_index}", device_index, self.name,
                          {"model": gpu_model, "compute_capability": cc, "tensorrt": trt.__version__,
                           "engine": str(plan_path), "engine_cached": cached})
        return TensorRTSession(trt, engine, info, precision, self.max_batch_size)
