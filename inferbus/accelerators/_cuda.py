"""GPU memory for serving: pinned host buffer pools, a CUDA stream pool, CUDA graphs (issue 4, item 2).

All through cuda-python's runtime bindings (``cuda.bindings.runtime``, the
``cudart`` API one to one). Memory is taken once and reused:

* :class:`PinnedBufferPool`: page-locked host buffers in fixed size classes
  (64 KiB, 1 MiB, 16 MiB by default), allocated with ``cudaMallocHost`` when
  the pool is made and freed only by :meth:`~PinnedBufferPool.close`. A request
  takes the smallest class that fits; when that class is all in use it takes a
  larger one; when every fitting buffer is in use :class:`PoolExhausted` is
  raised (the pool never grows, so memory use is known at start-up). Copies
  from pinned memory are true asynchronous DMA; from pageable memory the
  driver stages them through its own pinned bounce buffer, synchronously.
* :class:`StreamPool`: ``cudaStreamNonBlocking`` streams made once; one is
  held per in-flight inference and given back after.
* :class:`DeviceBuffer`: a plain ``cudaMalloc`` allocation (never managed memory).
* :class:`CudaGraph`: capture what a callable enqueues on a stream
  (``cudaStreamBeginCapture`` / ``cudaStreamEndCapture`` /
  ``cudaGraphInstantiate``) and replay it with one ``cudaGraphLaunch``. Valid
  only while the captured buffers stay where they are, so it is used with
  fixed shapes and pool buffers.

Every wrapper raises :class:`BackendUnavailable` where cuda-python or a GPU is
missing. The pool logic takes an *allocator* so it can run over plain host
memory where there is no GPU (:class:`HostAllocator`, not page-locked): that is
how the pool's bookkeeping is tested on CPU-only machines.
"""

from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ._abc import AcceleratorError, BackendUnavailable, PoolExhausted

KiB, MiB = 1024, 1024 * 1024
DEFAULT_CLASSES: dict[int, int] = {64 * KiB: 64, 1 * MiB: 16, 16 * MiB: 4}
"""Size class (bytes) → buffers of that size: 4 MiB + 16 MiB + 64 MiB = 84 MiB pinned per worker."""


def cudart():
    """``cuda.bindings.runtime`` (cuda-python ≥ 12.6), or the older ``cuda.cudart`` module.

    Raises:
        BackendUnavailable: cuda-python is not installed.
    """
    try:
        from cuda.bindings import runtime as rt
    except ImportError:
        try:
            from cuda import cudart as rt  # cuda-python < 12.6
        except ImportError as exc:
            raise BackendUnavailable("cuda-python is not installed (pip install cuda-python)") from exc
    return rt


SCHEDULES = {"auto": 0, "spin": 1, "yield": 2, "blocking": 4}
"""``cudaDeviceSchedule*`` values (CUDA runtime API, ``cudaSetDeviceFlags``): how a host thread waits for the GPU."""

_schedule_set: str | None = None


def set_device_schedule(schedule: str) -> str:
    """Set how this process's host threads wait for the current GPU (``cudaSetDeviceFlags``).

    ``spin`` busy-waits (lowest wake-up latency, one core busy while waiting), ``yield`` spins but yields the core,
    ``blocking`` sleeps on an OS primitive, ``auto`` leaves CUDA's heuristic. It must run before anything creates
    the device's primary context: XLA (JAX) then finds the context active with these flags, keeps them and logs
    one harmless ``cuda_context.cc`` error that they differ from its own. Measured on the H200 host
    (``bench/jax_floor.py``, docs/performance.md): with ``spin`` the wait on a batch-1 JAX call dropped from
    35-76 to 24-49 µs. Idempotent per process.

    Returns:
        ``set`` on success, ``kept`` when a previous call already set it, ``auto`` (nothing done) for ``auto``.

    Raises:
        ValueError: an unknown schedule name.
        BackendUnavailable: cuda-python or a GPU is missing.
        AcceleratorError: CUDA refused (e.g. the context was already active with other flags).
    """
    global _schedule_set
    if schedule not in SCHEDULES:
        raise ValueError(f"CUDA schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if schedule == "auto":
        return "auto"
    if _schedule_set == schedule:
        return "kept"
    rt = cudart()
    check(rt.cudaSetDeviceFlags(SCHEDULES[schedule]), f"cudaSetDeviceFlags({schedule})")
    check(rt.cudaFree(0), "cudaFree(0) (creating the primary context)")
    _schedule_set = schedule
    return "set"


def check(result, what: str = "CUDA call"):
    """Unpack a cuda-python ``(err, *values)`` tuple; raise on an error code.

    Raises:
        AcceleratorError: the call returned an error (its name and number in the message).
    """
    if isinstance(result, tuple):
        err, rest = result[0], result[1:]
    else:
        err, rest = result, ()
    if int(err) != 0:
        name = getattr(err, "name", str(err))
        raise AcceleratorError(f"{what} failed: {name} ({int(err)})")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


# ------------------------------------------------------------------------------ allocators
class CudaHostAllocator:
    """Page-locked host memory via ``cudaMallocHost`` / ``cudaFreeHost``."""

    pinned = True

    def __init__(self) -> None:
        self._rt = cudart()

    def alloc(self, nbytes: int) -> int:
        return int(check(self._rt.cudaMallocHost(nbytes), f"cudaMallocHost({nbytes})"))

    def free(self, ptr: int) -> None:
        check(self._rt.cudaFreeHost(ptr), "cudaFreeHost")


class HostAllocator:
    """Ordinary (pageable) host memory; for machines without a GPU and for testing the pool logic."""

    pinned = False

    def __init__(self) -> None:
        self._blocks: dict[int, ctypes.Array] = {}

    def alloc(self, nbytes: int) -> int:
        block = (ctypes.c_ubyte * nbytes)()
        ptr = ctypes.addressof(block)
        self._blocks[ptr] = block
        return ptr

    def free(self, ptr: int) -> None:
        self._blocks.pop(ptr, None)


# ------------------------------------------------------------------------------ pinned pool
class PinnedBuffer:
    """One buffer of a pool: ``ptr`` (host address), ``nbytes`` (its class size); see :meth:`view`."""

    __slots__ = ("ptr", "nbytes", "_pool", "_in_use")

    def __init__(self, ptr: int, nbytes: int, pool: "PinnedBufferPool") -> None:
        self.ptr, self.nbytes, self._pool, self._in_use = ptr, nbytes, pool, False

    def view(self, dtype, shape) -> np.ndarray:
        """A numpy array over the first bytes of this buffer (no copy).

        Raises:
            ValueError: the array would not fit.
        """
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) if len(shape) else 1
        if n * dt.itemsize > self.nbytes:
            raise ValueError(f"{shape} {dt} needs {n * dt.itemsize} bytes; buffer has {self.nbytes}")
        raw = (ctypes.c_ubyte * (n * dt.itemsize)).from_address(self.ptr)
        return np.frombuffer(raw, dtype=dt, count=n).reshape(shape)

    def release(self) -> None:
        self._pool.release(self)


@dataclass(frozen=True)
class SizeClassStats:
    """One size class: ``size_bytes``, buffers ``total``, ``in_use`` now, ``peak`` in use, ``acquired`` and
    ``exhausted`` (requests that found none free in this class) since start."""

    size_bytes: int
    total: int
    in_use: int
    peak: int
    acquired: int
    exhausted: int


class PinnedBufferPool:
    """Fixed-size pinned host buffers, allocated once (see the module docstring).

    Args:
        classes: size in bytes → number of buffers (default :data:`DEFAULT_CLASSES`).
        allocator: :class:`CudaHostAllocator` (default) or :class:`HostAllocator`.

    Thread-safe: acquire/release may be called from any thread.

    Raises:
        BackendUnavailable: cuda-python is missing (default allocator).
        AcceleratorError: ``cudaMallocHost`` failed (everything allocated so far is freed again).
    """

    def __init__(self, classes: dict[int, int] | None = None, allocator=None) -> None:
        self.classes = dict(sorted((classes or DEFAULT_CLASSES).items()))
        if any(s <= 0 or n <= 0 for s, n in self.classes.items()):
            raise ValueError("PinnedBufferPool: every size class needs size > 0 bytes and count > 0")
        self.allocator = allocator if allocator is not None else CudaHostAllocator()
        self.pinned = getattr(self.allocator, "pinned", False)
        self._lock = threading.Lock()
        self._free: dict[int, list[PinnedBuffer]] = {s: [] for s in self.classes}
        self._all: list[PinnedBuffer] = []
        self._peak = {s: 0 for s in self.classes}
        self._acquired = {s: 0 for s in self.classes}
        self._exhausted = {s: 0 for s in self.classes}
        try:
            for size, count in self.classes.items():
                for _ in range(count):
                    buf = PinnedBuffer(self.allocator.alloc(size), size, self)
                    self._all.append(buf)
                    self._free[size].append(buf)
        except BaseException:
            self.close()
            raise

    @property
    def max_bytes(self) -> int:
        return max(self.classes)

    @property
    def total_bytes(self) -> int:
        return sum(s * n for s, n in self.classes.items())

    def acquire(self, nbytes: int) -> PinnedBuffer:
        """A free buffer of at least ``nbytes`` (the smallest class that has one).

        Raises:
            ValueError: ``nbytes`` exceeds the largest class.
            PoolExhausted: every buffer large enough is in use.
        """
        if nbytes > self.max_bytes:
            raise ValueError(f"{nbytes} bytes exceed the largest pinned buffer ({self.max_bytes} bytes)")
        with self._lock:
            for size in self.classes:
                if size < nbytes:
                    continue
                free = self._free[size]
                if free:
                    buf = free.pop()
                    buf._in_use = True
                    self._acquired[size] += 1
                    used = self.classes[size] - len(free)
                    if used > self._peak[size]:
                        self._peak[size] = used
                    return buf
                self._exhausted[size] += 1
        raise PoolExhausted(f"no free pinned buffer of >= {nbytes} bytes (classes {self.stats()})")

    def release(self, buf: PinnedBuffer) -> None:
        """Give ``buf`` back. Releasing a buffer twice, or one of another pool, raises ``ValueError``."""
        if buf._pool is not self or not buf._in_use:
            raise ValueError("buffer released twice or not from this pool")
        with self._lock:
            buf._in_use = False
            self._free[buf.nbytes].append(buf)

    @contextmanager
    def buffer(self, nbytes: int):
        """``with pool.buffer(n) as buf:`` acquire, and release however the block ends."""
        buf = self.acquire(nbytes)
        try:
            yield buf
        finally:
            self.release(buf)

    def stats(self) -> tuple[SizeClassStats, ...]:
        with self._lock:
            return tuple(SizeClassStats(s, n, n - len(self._free[s]), self._peak[s], self._acquired[s],
                                        self._exhausted[s]) for s, n in self.classes.items())

    def close(self) -> None:
        """Free every buffer (also those still acquired: their views become invalid). Idempotent."""
        with self._lock:
            for buf in self._all:
                try:
                    self.allocator.free(buf.ptr)
                except Exception:
                    pass
            self._all.clear()
            self._free = {s: [] for s in self.classes}


# ------------------------------------------------------------------------------ streams, device memory, graphs
class StreamPool:
    """``size`` non-blocking CUDA streams made once; :meth:`stream` lends one exclusively.

    Raises:
        BackendUnavailable: cuda-python missing.  AcceleratorError: stream creation failed.
    """

    def __init__(self, size: int = 4) -> None:
        if size < 1:
            raise ValueError(f"StreamPool.size must be >= 1, got {size!r}")
        self._rt = rt = cudart()
        self._lock = threading.Lock()
        self.streams = [check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "cudaStreamCreateWithFlags")
                        for _ in range(size)]
        self._free = list(self.streams)
        self.lent = 0

    @contextmanager
    def stream(self):
        """Lend a stream for one inference.

        Raises:
            PoolExhausted: all ``size`` streams are lent.
        """
        with self._lock:
            if not self._free:
                raise PoolExhausted(f"all {len(self.streams)} CUDA streams are in use")
            s = self._free.pop()
            self.lent += 1
        try:
            yield s
        finally:
            with self._lock:
                self._free.append(s)

    def synchronize(self, stream) -> None:
        check(self._rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    def close(self) -> None:
        for s in self.streams:
            try:
                self._rt.cudaStreamDestroy(s)
            except Exception:
                pass
        self.streams, self._free = [], []


class DeviceBuffer:
    """``nbytes`` of device memory from ``cudaMalloc`` (plain allocation, never managed memory)."""

    def __init__(self, nbytes: int) -> None:
        self._rt = cudart()
        self.nbytes = nbytes
        self.ptr = int(check(self._rt.cudaMalloc(nbytes), f"cudaMalloc({nbytes})"))

    def free(self) -> None:
        if self.ptr:
            self._rt.cudaFree(self.ptr)
            self.ptr = 0


def memcpy_async(dst: int, src: int, nbytes: int, kind: str, stream) -> None:
    """``cudaMemcpyAsync``; ``kind`` is ``h2d``, ``d2h`` or ``d2d``."""
    rt = cudart()
    k = {"h2d": rt.cudaMemcpyKind.cudaMemcpyHostToDevice, "d2h": rt.cudaMemcpyKind.cudaMemcpyDeviceToHost,
         "d2d": rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice}[kind]
    check(rt.cudaMemcpyAsync(dst, src, nbytes, k, stream), f"cudaMemcpyAsync {kind}")


class CudaGraph:
    """What ``enqueue(stream)`` puts on ``stream``, captured once and replayed with one launch.

    Raises:
        AcceleratorError: capture or instantiation failed (e.g. ``enqueue`` synchronized inside the capture).
    """

    def __init__(self, stream, enqueue) -> None:
        rt = self._rt = cudart()
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        check(rt.cudaStreamBeginCapture(stream, mode), "cudaStreamBeginCapture")
        try:
            enqueue(stream)
        finally:
            graph = check(rt.cudaStreamEndCapture(stream), "cudaStreamEndCapture")
        self.graph = graph
        self.exec = check(rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")

    def launch(self, stream) -> None:
        check(self._rt.cudaGraphLaunch(self.exec, stream), "cudaGraphLaunch")

    def close(self) -> None:
        try:
            self._rt.cudaGraphExecDestroy(self.exec)
            self._rt.cudaGraphDestroy(self.graph)
        except Exception:
            pass
