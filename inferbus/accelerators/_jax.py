"""JAX backend: the TPU path; also runs on GPU (CUDA) and CPU (XLA).

An ONNX artifact goes through :mod:`._onnx_jax` into one pure function,
``jax.jit`` wraps it once, and :meth:`JaxSession.warmup` compiles it for each
declared batch size before the first request. The parameters are put on the
device once at load and stay there; only the request's inputs and outputs cross
the host-device boundary. How the parameters reach the program
(``params_as_constants``):

* constants (the default up to ``CONST_PARAMS_MAX_BYTES`` of parameters): the
  jitted function closes over the device arrays, so a call passes only the
  request's inputs and dispatches through ``jax.jit``'s C++ fast path. Measured
  on the H200 host (``bench/jax_dispatch.py``, digits MLP fp32, batch 1, p50):
  resident-input dispatch 71 µs vs 95 µs for ``Compiled(params, inputs)``; a
  worker's whole call with DLPack transfers 250 µs vs 479 µs (``memcpy``
  transfers, the GPU default since, below).
* arguments: ``jit(...).lower(params, specs).compile()`` per batch size, called
  as ``Compiled(params, inputs)`` (large models: no parameter bytes baked into
  the executable).

Batch sizes: a request of ``n`` rows runs on the smallest compiled batch size
``>= n``, zero-padded, and the first ``n`` output rows are returned. That
assumes rows are independent (true of every model here: no op mixes rows);
a request larger than every compiled size runs in chunks of the largest one
(so request sizes cannot make the session compile without bound); with no size
compiled yet, the exact size is compiled on first use (a one-off stall of tens
of ms, logged) and kept, up to ``max_compiled`` executables. A model whose rows
do not follow the batch (``[N, N]`` outputs, a constant output) runs each
request at its own size, so every new size compiles; past ``max_compiled``
sizes the least recently used one is dropped (with parameters as constants,
whose executables live in ``jax.jit``'s own cache, that cache is cleared and
every size compiles again on its next use), logged at warning: memory stays
bounded and no request size is refused.

Precision: ``fp32`` (matmuls at ``Precision.HIGHEST``: no TF32), ``fp16`` and
``bf16`` (fp32 accumulation; see :mod:`._onnx_jax`). ``int8`` is not offered
by this backend (load raises :class:`ModelLoadError`, and the precision check
falls back to FP32).

Host transfers (``transfer``): ``pjrt`` lets the executable move numpy inputs and outputs itself;
``dlpack`` copies with CuPy (``cudaMemcpy``) and hands the device buffers to and from XLA through DLPack,
because on the H200 host PJRT's transfers cost ~200 µs each way for a few hundred bytes; ``memcpy`` keeps
one device input array per input and compiled batch size for the session's life and copies each request
into it and each output out of XLA's result with one host-synchronous copy each way (``cudaMemcpy``
through CuPy from/to pinned staging buffers on a GPU, ``memmove`` on the CPU device), addressing the arrays
by ``unsafe_buffer_pointer()``: no per-call device allocation and no DLPack capsule. That is safe because
every call is sequential (the session's lock) and host-synchronous: a call writes its input only after the
previous computation finished (``block_until_ready``), and reads its outputs only after its own did.
``hostmem`` keeps each input in a JAX array in ``pinned_host`` memory (JAX memory kinds) and compiles the copies
into the program: it moves the inputs to the device and its one output back to ``pinned_host`` memory, so a call
is a ``memmove`` of the request into the input's host buffer, one dispatch, one wait and a ``memmove`` out — no
CuPy call at all. With ``memcpy`` and ``hostmem`` the program's outputs are *packed*: one flat byte array holding
every output (``lax.bitcast_convert_type`` to bytes, concatenated), so a call waits on one array and copies
one buffer out instead of one per output (digits has two; each cost a wait, an address lookup and a copy, ~15 µs
on the H200 host, ``bench/jax_floor.py``); the host splits it by byte offsets. A failure of any fast path
switches the session to ``pjrt`` for good.

Devices: the process uses ``jax.devices(kind)[index]``. When the process sees
exactly one device of that kind (the node gives each GPU worker its own
``CUDA_VISIBLE_DEVICES``), that one is used and the asked-for index is kept as
the host's number for it.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
from pathlib import Path

import numpy as np

from ._abc import BackendUnavailable, DeviceInfo, InferenceError, ModelLoadError, TensorInfo

log = logging.getLogger("inferbus.accelerators.jax")

TRANSFERS = ("pjrt", "dlpack", "memcpy", "hostmem")
"""Host transfer paths of a :class:`JaxSession` (module docstring)."""

AUTO_TRANSFER_GPU = "memcpy"
"""``transfer="auto"`` on a GPU (CPU and TPU devices: ``pjrt``; a GPU without CuPy: ``pjrt``). Measured on the
H200 host (``bench/jax_dispatch.py --context``, batch 1, p50, session call back to back): memcpy 158-325 µs
against dlpack 417-778 µs in the same run; a JAX GPU worker's compute stage 459 vs 619 µs (MLP) and 446 vs
969 µs (CNN), docs/performance.md."""

DEFAULT_CUDA_SCHEDULE = "auto"
"""``JaxBackend.cuda_schedule`` when neither the argument nor ``INFERBUS_CUDA_SCHEDULE`` says: CUDA's heuristic."""

CONST_PARAMS_MAX_BYTES = 64 << 20
"""``params_as_constants=None`` closes over the parameters when they total at most this many bytes."""

# ONNX elem type → OIP datatype (https://onnx.ai/onnx/api/mapping.html, DESIGN §3)
_ONNX_TO_OIP = {1: "FP32", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32", 7: "INT64", 9: "BOOL",
                10: "FP16", 11: "FP64", 12: "UINT32", 13: "UINT64", 16: "BF16"}
_PLATFORM_KIND = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}


def _import_jax():
    try:
        import jax
    except ImportError as exc:
        raise BackendUnavailable("jax is not installed (pip install 'inferbus[jax]')") from exc
    return jax


def _compute_dtype(precision: str):
    if precision == "fp32":
        return np.dtype(np.float32)
    if precision == "fp16":
        return np.dtype(np.float16)
    if precision == "bf16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    raise ModelLoadError(f"the jax backend serves fp32, fp16 and bf16, not {precision}")


def _tensor_infos(values, skip=()) -> tuple[TensorInfo, ...]:
    out = []
    for v in values:
        if v.name in skip:
            continue
        tt = v.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        out.append(TensorInfo(v.name, _ONNX_TO_OIP.get(tt.elem_type, f"ONNX{tt.elem_type}"), dims))
    return tuple(out)


def _device_info(d, index: int | None = None) -> DeviceInfo:
    import jax

    kind = _PLATFORM_KIND.get(d.platform, d.platform)
    idx = d.id if index is None else index
    facts = {"platform": d.platform, "device_kind": getattr(d, "device_kind", ""), "jax": jax.__version__}
    try:
        stats = d.memory_stats() or {}
        if "bytes_limit" in stats:
            facts["memory_bytes"] = int(stats["bytes_limit"])
    except Exception:  # not every platform reports memory
        pass
    if hasattr(d, "compute_capability"):
        facts["compute_capability"] = str(d.compute_capability)
    return DeviceInfo(kind, f"{kind}{idx}", idx, "jax", facts)


class JaxSession:
    """A model compiled by XLA for one device; not thread-safe (one inference thread per worker).

    Attributes:
        precision: served precision (``fp32``/``fp16``/``bf16``).
        device: where it runs.
        compiled_batch_sizes: batch sizes compiled so far (ascending).
    """

    def __init__(self, program, jdev, device: DeviceInfo, precision: str, inputs, outputs,
                 max_compiled: int = 16, transfer: str = "auto", params_as_constants: bool | None = None) -> None:
        import jax
        from jax.sharding import SingleDeviceSharding

        self.precision = precision
        self.device = device
        self.inputs: tuple[TensorInfo, ...] = inputs
        self.outputs: tuple[TensorInfo, ...] = outputs
        self._program = program
        self._jdev = jdev
        self._sharding = SingleDeviceSharding(jdev)
        self._params = jax.device_put(program.params, jdev)  # once: parameters live on the device
        self._jit = jax.jit(program)
        if params_as_constants is None:
            params_as_constants = sum(int(np.asarray(v).nbytes) for v in program.params.values()) \
                <= CONST_PARAMS_MAX_BYTES
        self.params_as_constants = bool(params_as_constants)
        """True: the parameters are closed over (one jitted function of the inputs, C++ dispatch)."""
        params = self._params
        self._const_fn = (jax.jit(lambda feeds: program(params, feeds), in_shardings=self._sharding,
                                  out_shardings=self._sharding) if self.params_as_constants else None)
        self._compiled: dict[int, object] = {}
        """Batch size → a callable ``f(inputs) -> outputs`` ready to run at that size."""
        self._sizes: list[int] = []
        self._max_compiled = max_compiled
        self.evictions = 0
        """Times a new request size found ``max_compiled`` sizes compiled and made room (:meth:`_evict`)."""
        self._lock = threading.Lock()
        from ._dtypes import numpy_dtype_for

        self._in_dtypes = {t.name: numpy_dtype_for(t.datatype) for t in inputs}
        self._batched = all(len(t.shape) > 0 and t.shape[0] == -1 for t in inputs + outputs) and \
            self._rows_follow_batch()
        """Requests are padded to a compiled batch size, or cut into chunks of the largest: only when rows are
        independent by their shapes (:meth:`_rows_follow_batch`); else each request runs at its own size."""
        self._all_outputs = [t.name for t in outputs]
        self._cupy = None
        self._cuda_ordinal = getattr(jdev, "local_hardware_id", None) or 0
        auto = transfer == "auto"
        if auto:
            transfer = AUTO_TRANSFER_GPU if device.kind == "gpu" else "pjrt"
        if transfer == "hostmem" and not self.params_as_constants:
            transfer = "memcpy"  # the packed program closes over the parameters
        if transfer in ("dlpack", "memcpy", "hostmem") and device.kind == "gpu":
            try:
                import cupy

                self._cupy = cupy  # hostmem: only for the pinned output buffer (numpy memory without it)
            except ImportError:
                if transfer != "hostmem":
                    if not auto:  # a setting that cannot work here must not stop the worker: PJRT's path serves
                        log.warning("jax: transfer=%r on a GPU needs CuPy, which is not installed; using pjrt",
                                    transfer)
                    transfer = "pjrt"
        if transfer == "dlpack" and self._cupy is None:
            log.warning("jax: transfer='dlpack' is for GPUs (CuPy device memory); using pjrt on %s", device.kind)
            transfer = "pjrt"
        if transfer not in TRANSFERS:
            raise ValueError(f"transfer must be auto or one of {', '.join(TRANSFERS)}, got {transfer!r}")
        self.transfer = transfer
        """The host transfer path in use: ``pjrt``, ``dlpack``, ``memcpy`` or ``hostmem`` (module docstring)."""
        self._packed: dict[int, tuple[object, tuple, int]] = {}
        """memcpy/hostmem: batch size → (packed program, layout ``(name, dtype, shape, offset, nbytes)`` per output,
        total bytes); a batch size missing here runs the unpacked program (one wait and copy per output)."""
        self._pack_fns: dict[str, object] = {}
        self._bufs: dict[int, dict[str, tuple[object, int, np.ndarray]]] = {}
        """memcpy: batch size → input name → (device array, its device address, host staging array)."""
        self._out_staging: dict[tuple[str, int], np.ndarray] = {}
        """memcpy: (output name, bytes) → host staging buffer (pinned on a GPU)."""

    @property
    def compiled_batch_sizes(self) -> tuple[int, ...]:
        return tuple(self._sizes)

    def _shape(self, t: TensorInfo, batch: int) -> tuple[int, ...]:
        return tuple(batch if (i == 0 and d == -1) else (d if d >= 0 else 1) for i, d in enumerate(t.shape))

    def _compile(self, batch: int):
        import jax

        if not self._batched and len(self._compiled) >= self._max_compiled:
            with self._lock:  # before compiling: a cleared jit cache must not take the new size with it
                self._evict()
        specs = {t.name: jax.ShapeDtypeStruct(self._shape(t, batch), self._in_dtypes[t.name], sharding=self._sharding)
                 for t in self.inputs}
        try:
            if self._const_fn is not None:
                # compile by calling: the executable lands in jit's own cache, which the C++ dispatch uses
                zeros = {k: jax.device_put(np.zeros(v.shape, v.dtype), self._jdev) for k, v in specs.items()}
                jax.block_until_ready(self._const_fn(zeros))
                compiled = self._const_fn
            else:
                compiled = functools.partial(self._jit.lower(self._params, specs).compile(), self._params)
        except Exception as exc:
            raise ModelLoadError(f"XLA could not compile the model at batch {batch}: {exc}") from exc
        with self._lock:
            if len(self._compiled) >= self._max_compiled:
                raise ModelLoadError(f"more than {self._max_compiled} compiled batch sizes; declare fewer")
            self._compiled[batch] = compiled
            self._sizes = sorted(self._compiled)
        if self.transfer in ("memcpy", "hostmem") and self._const_fn is not None:
            try:
                self._prepare_packed(batch, specs)
            except Exception as exc:  # the unpacked program still serves (memcpy) or PJRT does (hostmem)
                log.warning("jax: packed outputs unavailable at batch %d (%s)", batch, exc)
                if self.transfer == "hostmem":  # its inputs live in host memory: PJRT's path from here on
                    with self._lock:
                        self.transfer = "pjrt"
                        self._bufs.clear()
                        self._packed.clear()
        return compiled

    def _evict(self) -> None:
        """Make room for one more size of a model that runs each request at its own size (caller holds the lock):
        drop the least recently used size, or, where the executables live in ``jax.jit``'s caches (parameters as
        constants, packed outputs), clear those caches and every size with them (no per-entry eviction there)."""
        self.evictions += 1
        if self._const_fn is not None:
            log.warning("jax: more than %d request sizes of a model that runs each at its own size; clearing its "
                        "compiled sizes %s (each compiles again on its next use)", self._max_compiled,
                        sorted(self._compiled))
            self._const_fn.clear_cache()
            for fn in self._pack_fns.values():
                fn.clear_cache()
            self._compiled.clear()
            self._packed.clear()
            self._bufs.clear()
        else:
            old = next(iter(self._compiled))
            log.warning("jax: more than %d request sizes of a model that runs each at its own size; dropping size "
                        "%d, the least recently used", self._max_compiled, old)
            del self._compiled[old]
            self._packed.pop(old, None)
            self._bufs.pop(old, None)
        self._sizes = sorted(self._compiled)
        self._out_staging.clear()  # (output, bytes) buffers: one per size here, made again on use

    def _pack_fn(self, kind: str):
        """The jitted program with packed outputs: ``kind`` ``memcpy`` (device in, device out) or ``hostmem``
        (``pinned_host`` in and out, the copies inside the program)."""
        fn = self._pack_fns.get(kind)
        if fn is not None:
            return fn
        import jax
        import jax.numpy as jnp
        from jax import lax
        from jax.sharding import SingleDeviceSharding

        program, params, names = self._program, self._params, list(self._all_outputs)
        dev = self._sharding
        host = SingleDeviceSharding(self._jdev, memory_kind="pinned_host") if kind == "hostmem" else dev

        def as_bytes(a):
            if a.dtype == jnp.bool_:
                a = a.astype(jnp.uint8)
            return lax.bitcast_convert_type(a, jnp.uint8).reshape(-1)

        def packed(feeds):
            if kind == "hostmem":
                feeds = {k: jax.device_put(v, dev) for k, v in feeds.items()}
            outs = program(params, feeds)
            y = jnp.concatenate([as_bytes(outs[k]) for k in names]) if len(names) > 1 else as_bytes(outs[names[0]])
            return jax.device_put(y, host) if kind == "hostmem" else y

        fn = self._pack_fns[kind] = jax.jit(packed, in_shardings=host, out_shardings=host)
        return fn

    def _prepare_packed(self, batch: int, specs: dict) -> None:
        """Compile and check the packed program for ``batch``: the byte layout from the unpacked outputs' shapes."""
        import jax

        shapes = jax.eval_shape(self._const_fn, specs)
        layout, off = [], 0
        for k in self._all_outputs:
            dt, shape = np.dtype(shapes[k].dtype), tuple(shapes[k].shape)
            nb = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            layout.append((k, dt, shape, off, nb))
            off += nb
        fn = self._pack_fn(self.transfer)
        zeros = {k: np.zeros(v.shape, v.dtype) for k, v in specs.items()}
        ins = self._input_buffers(batch, zeros)
        y = fn({k: v[0] for k, v in ins.items()})
        y.block_until_ready()
        if y.shape != (off,):
            raise ValueError(f"packed output is {y.shape}, expected ({off},)")
        self._packed[batch] = (fn, tuple(layout), off)

    def _rows_follow_batch(self) -> bool:
        """Whether every output has the batch first and the rest of its shape the same at 1 and at 2 rows, by
        abstract evaluation (``jax.eval_shape``: nothing compiled or run). A model whose output is ``[N, N]`` or a
        constant ``[4]`` was padded to a compiled size and cut back by rows: wrong answers even for one request
        (:func:`inferbus.accelerators.rows_problem` says why for the worker)."""
        import jax

        from ._abc import batch_shapes_problem

        shapes = {}
        for b in (1, 2):
            specs = {t.name: jax.ShapeDtypeStruct(self._shape(t, b), self._in_dtypes[t.name]) for t in self.inputs}
            try:
                out = jax.eval_shape(self._jit, self._params, specs)
            except Exception:  # noqa: BLE001 - not traceable at these sizes: run each request at its own size
                return False
            shapes[b] = {k: tuple(v.shape) for k, v in out.items()}
        return batch_shapes_problem(shapes) is None

    def lowered_text(self, batch: int = 1, optimized: bool = True) -> str:
        """The program as XLA sees it: HLO after optimization (fusions) or StableHLO before."""
        import jax

        specs = {t.name: jax.ShapeDtypeStruct(self._shape(t, batch), self._in_dtypes[t.name], sharding=self._sharding)
                 for t in self.inputs}
        lowered = self._const_fn.lower(specs) if self._const_fn is not None else self._jit.lower(self._params, specs)
        return lowered.compile().as_text() if optimized else lowered.as_text()

    def _pick(self, n: int):
        if not self._batched:
            compiled = self._compiled.pop(n, None)
            if compiled is None:
                return n, self._compile(n)
            self._compiled[n] = compiled  # most recently used last: the eviction order of _compile
            return n, compiled
        for b in self._sizes:
            if b >= n:
                return b, self._compiled[b]
        log.info("jax: compiling batch size %d on first use", n)
        return n, self._compile(n)

    def infer(self, inputs: dict[str, np.ndarray], output_names: list[str] | None = None) -> dict[str, np.ndarray]:
        names = output_names or self._all_outputs
        try:
            first = inputs[self.inputs[0].name]
            n = int(first.shape[0]) if first.ndim else 1
            if self._batched and self._sizes and n > self._sizes[-1]:
                # larger than every compiled size: chunks of the largest one, so a client's batch sizes can
                # never make the session compile (and stall) without bound
                step = self._sizes[-1]
                parts = [self.infer({k: v[i:i + step] for k, v in inputs.items()}, names) for i in range(0, n, step)]
                return {k: np.concatenate([p[k] for p in parts], axis=0) for k in names}
            b, compiled = self._pick(n)
            feeds = {}
            for t in self.inputs:
                x = inputs[t.name]
                if x.dtype != self._in_dtypes[t.name]:
                    x = x.astype(self._in_dtypes[t.name])
                if b != n:
                    pad = np.zeros((b - n,) + x.shape[1:], dtype=x.dtype)
                    x = np.concatenate([x, pad], axis=0)
                feeds[t.name] = x
            if self.transfer != "pjrt":
                try:
                    if self.transfer in ("memcpy", "hostmem"):
                        return self._infer_memcpy(compiled, feeds, names, n, b)
                    return self._infer_dlpack(compiled, feeds, names, n, b)
                except Exception as exc:  # never again in this session: PJRT's own transfers still work
                    log.warning("jax: %s transfers failed (%s); using PJRT transfers", self.transfer, exc)
                    self.transfer = "pjrt"
            # numpy in, numpy out: the executable transfers the inputs to its device itself. Measured on the
            # H200 host and here: an explicit jax.device_put or copy_to_host_async per call only adds overhead.
            outs = compiled(feeds)
            if b != n:
                return {k: np.asarray(outs[k])[:n] for k in names}
            return {k: np.asarray(outs[k]) for k in names}
        except (ModelLoadError, KeyError) as exc:
            raise InferenceError(f"jax: {exc}") from exc
        except Exception as exc:
            raise InferenceError(f"jax: {exc}") from exc

    def _infer_dlpack(self, compiled, feeds, names, n, b):
        """GPU host path through CuPy: ``cudaMemcpy`` in and out, handed to/from XLA by DLPack (no PJRT transfer).

        On the H200 host PJRT's own transfers cost ~200 µs each way for a few hundred bytes (device_put, then
        the output's np.asarray), against ~12 µs for a plain cudaMemcpy round trip; DLPack hands CuPy's
        device memory to XLA without a copy.
        """
        cp = self._cupy
        import jax

        with cp.cuda.Device(self._cuda_ordinal):
            ins = {k: jax.dlpack.from_dlpack(cp.asarray(v)) for k, v in feeds.items()}
            outs = compiled(ins)
            res = {k: cp.from_dlpack(outs[k]).get() for k in names}
        return {k: v[:n] for k, v in res.items()} if b != n else res

    def _host_buffer(self, nbytes: int) -> np.ndarray:
        """A host staging buffer of ``nbytes`` (uint8): pinned (``cudaMallocHost`` through CuPy) on a GPU."""
        if self._cupy is not None:
            mem = self._cupy.cuda.alloc_pinned_memory(max(nbytes, 1))
            return np.frombuffer(mem, np.uint8, nbytes)
        return np.empty(nbytes, np.uint8)

    def _copy(self, dst: int, src: int, nbytes: int, to_device: bool) -> None:
        """One host-synchronous copy of ``nbytes`` between a host address and an array's address: ``cudaMemcpy``
        for a GPU array (``memcpy``), ``memmove`` where the array's buffer is host memory (``hostmem``, CPU)."""
        if self._cupy is not None and self.transfer != "hostmem":
            rt = self._cupy.cuda.runtime
            rt.memcpy(dst, src, nbytes, rt.memcpyHostToDevice if to_device else rt.memcpyDeviceToHost)
        else:
            ctypes.memmove(dst, src, nbytes)

    def _input_buffers(self, b: int, feeds: dict[str, np.ndarray]) -> dict[str, tuple[object, int, np.ndarray]]:
        bufs = self._bufs.get(b)
        if bufs is None:
            import jax

            bufs = {}
            for name, x in feeds.items():
                if self.transfer == "hostmem":  # the array's own buffer is host memory: no staging
                    from jax.sharding import SingleDeviceSharding

                    arr = jax.device_put(np.zeros(x.shape, x.dtype),
                                         SingleDeviceSharding(self._jdev, memory_kind="pinned_host"))
                    arr.block_until_ready()
                    bufs[name] = (arr, arr.unsafe_buffer_pointer(), None)
                    continue
                arr = jax.device_put(np.zeros(x.shape, x.dtype), self._jdev)
                arr.block_until_ready()
                staging = self._host_buffer(x.nbytes).view(x.dtype).reshape(x.shape)
                bufs[name] = (arr, arr.unsafe_buffer_pointer(), staging)
            self._bufs[b] = bufs
        return bufs

    def _infer_memcpy(self, compiled, feeds, names, n, b):
        """Inputs copied into the session's own arrays, outputs copied out of XLA's results (module docstring,
        ``memcpy`` and ``hostmem``). ``feeds`` are already padded to ``b`` rows and in the compiled dtypes."""
        with self._lock:
            bufs = self._input_buffers(b, feeds)
            args = {}
            for name, x in feeds.items():
                arr, ptr, staging = bufs[name]
                if x.shape != arr.shape or x.dtype != arr.dtype:
                    raise ValueError(f"input {name!r} is {x.dtype}{list(x.shape)}, compiled for "
                                     f"{arr.dtype}{list(arr.shape)}")
                if staging is None:  # hostmem: straight into the input array's pinned host buffer
                    x = np.ascontiguousarray(x)
                    self._copy(ptr, x.ctypes.data, x.nbytes, to_device=True)
                else:
                    np.copyto(staging, x)
                    self._copy(ptr, staging.ctypes.data, staging.nbytes, to_device=True)
                args[name] = arr
            packed = self._packed.get(b)
            if packed is not None:
                return self._unpack(packed, args, names, n, b)
            outs = compiled(args)
            res = {}
            for k in names:
                o = outs[k]
                o.block_until_ready()
                nbytes = o.nbytes
                staging = self._out_staging.get((k, nbytes))
                if staging is None:
                    staging = self._out_staging[(k, nbytes)] = self._host_buffer(nbytes)
                self._copy(staging.ctypes.data, o.unsafe_buffer_pointer(), nbytes, to_device=False)
                host = staging.view(o.dtype).reshape(o.shape)
                res[k] = host[:n].copy() if (b != n and host.ndim) else host.copy()
            return res

    def _unpack(self, packed, args, names, n, b):
        """Run the packed program and split its one byte array into the named outputs (copies the caller owns)."""
        fn, layout, total = packed
        y = fn(args)
        y.block_until_ready()
        buf = self._out_staging.get(("", total))
        if buf is None:
            buf = self._out_staging[("", total)] = self._host_buffer(total)
        self._copy(buf.ctypes.data, y.unsafe_buffer_pointer(), total, to_device=False)
        res = {}
        for k, dt, shape, off, nb in layout:
            if k in names:
                host = buf[off:off + nb].view(dt).reshape(shape)
                res[k] = host[:n].copy() if (b != n and host.ndim) else host.copy()
        return res

    def warmup(self, batch_sizes: tuple[int, ...] = (1,)) -> None:
        """Compile (ahead of time) and run once at each batch size, zero inputs."""
        sizes = sorted(set(batch_sizes)) if self._batched else [1]
        for b in sizes:
            if b not in self._compiled:
                self._compile(b)
            feeds = {t.name: np.zeros(self._shape(t, b), self._in_dtypes[t.name]) for t in self.inputs}
            self.infer(feeds)

    def close(self) -> None:
        self._compiled.clear()
        self._params = None


class JaxBackend:
    """Loads ONNX models into XLA executables on a TPU core, GPU or CPU."""

    name = "jax"

    def __init__(self, transfer: str | None = None, params_as_constants: bool | None = None,
                 cuda_schedule: str | None = None) -> None:
        if cuda_schedule is None:
            cuda_schedule = os.environ.get("INFERBUS_CUDA_SCHEDULE", DEFAULT_CUDA_SCHEDULE)
        from ._cuda import SCHEDULES

        if cuda_schedule not in SCHEDULES:
            raise ValueError(f"JaxBackend.cuda_schedule must be one of {', '.join(SCHEDULES)}, got {cuda_schedule!r}")
        self.cuda_schedule = cuda_schedule
        """How the process waits for its GPU (``_cuda.set_device_schedule``), set before JAX makes its CUDA context
        on the first GPU load: by default ``INFERBUS_CUDA_SCHEDULE``, else ``DEFAULT_CUDA_SCHEDULE``."""
        if transfer is None:
            transfer = os.environ.get("INFERBUS_JAX_TRANSFER", "auto")
        if transfer != "auto" and transfer not in TRANSFERS:
            raise ValueError(f"JaxBackend.transfer must be auto or one of {', '.join(TRANSFERS)}, got {transfer!r}")
        self.transfer = transfer
        """Host transfer path of its sessions: ``auto`` (``AUTO_TRANSFER_GPU`` on a GPU, else ``pjrt``),
        ``pjrt``, ``dlpack``, ``memcpy`` or ``hostmem`` (module docstring); by default the environment variable
        ``INFERBUS_JAX_TRANSFER``, else ``auto``. Raises ValueError for another name."""
        self.params_as_constants = params_as_constants
        """Parameters closed over (True), passed per call (False), or by size (None, see ``CONST_PARAMS_MAX_BYTES``)."""

    def devices(self) -> list[DeviceInfo]:
        """Every device JAX sees here (TPU cores, GPUs; CPU when there is no accelerator)."""
        jax = _import_jax()
        out = []
        for d in jax.devices():
            out.append(_device_info(d))
        return out

    def _resolve(self, device_kind: str, device_index: int):
        jax = _import_jax()
        platform = {"gpu": "gpu", "tpu": "tpu", "cpu": "cpu"}.get(device_kind)
        if platform is None:
            raise BackendUnavailable(f"unknown device kind {device_kind!r} (cpu, gpu, tpu)")
        if platform == "gpu" and self.cuda_schedule != "auto":
            from ._cuda import set_device_schedule

            try:
                set_device_schedule(self.cuda_schedule)
            except Exception as exc:  # no cuda-python, or a context made earlier: CUDA's own heuristic
                log.warning("jax: CUDA schedule %r not set (%s)", self.cuda_schedule, exc)
        try:
            devs = jax.devices(platform)
        except RuntimeError as exc:
            raise BackendUnavailable(f"jax sees no {device_kind} here: {exc}") from exc
        for d in devs:
            if d.id == device_index:
                return d, _device_info(d, device_index)
        if len(devs) == 1:  # isolated process (CUDA_VISIBLE_DEVICES=<index>): the one it sees
            return devs[0], _device_info(devs[0], device_index)
        raise BackendUnavailable(f"jax has no {device_kind} {device_index}; it sees {[d.id for d in devs]}")

    def load(self, path: Path, *, precision: str = "fp32", device_kind: str = "cpu", device_index: int = 0,
             threads: int = 1) -> JaxSession:
        """Convert ``path`` and place its parameters on the device (compilation happens in ``warmup``).

        Raises:
            BackendUnavailable: jax, onnx or the device is missing.
            ModelLoadError: unreadable file, an op the converter lacks, or ``int8``.
        """
        _import_jax()
        try:
            import onnx
        except ImportError as exc:
            raise BackendUnavailable("the jax backend needs the onnx package (pip install 'inferbus[jax]')") from exc
        from ._onnx_jax import OnnxJaxProgram, UnsupportedGraph

        cdt = _compute_dtype(precision)
        jdev, info = self._resolve(device_kind, device_index)
        try:
            model = onnx.load(str(path))
            program = OnnxJaxProgram(model, cdt)
        except UnsupportedGraph as exc:
            raise ModelLoadError(f"{path}: {exc}") from exc
        except Exception as exc:
            raise ModelLoadError(f"cannot load {path}: {exc}") from exc
        init_names = {i.name for i in model.graph.initializer}
        inputs = _tensor_infos(model.graph.input, skip=init_names)
        outputs = _tensor_infos(model.graph.output)
        for t in inputs + outputs:
            if t.datatype in ("INT64", "UINT64", "FP64"):
                raise ModelLoadError(f"{path}: tensor {t.name!r} is {t.datatype}; the jax backend runs without "
                                     f"jax_enable_x64, so 64-bit graph inputs/outputs are not served")
        return JaxSession(program, jdev, info, precision, inputs, outputs, transfer=self.transfer,
                          params_as_constants=self.params_as_constants)
