"""GPU-only checks (NVIDIA): pinned pools and streams through cuda-python, a captured CUDA graph, JAX on the GPU.

Every test here skips, saying why, on a machine without cuda-python or a CUDA GPU (CI, the 2-core box).
They ran on the H200 host; the figures are in docs/performance.md ("GPU worker (H200)").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inferbus.accelerators import TOLERANCES, PoolExhausted, get_backend, load_checked, normalized_errors

MODELS = Path(__file__).resolve().parents[1] / "models"
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]


def _cuda_devices() -> int:
    try:
        from cuda.bindings import runtime as rt
    except ImportError:
        return -1
    err, n = rt.cudaGetDeviceCount()
    return n if int(err) == 0 else 0


N_GPU = _cuda_devices()
needs_cuda = pytest.mark.skipif(N_GPU <= 0, reason="no CUDA GPU here" if N_GPU == 0 else
                                "cuda-python (cuda.bindings) is not installed")


@needs_cuda
def test_pinned_pool_is_page_locked_and_reused():
    from inferbus.accelerators._cuda import PinnedBufferPool

    pool = PinnedBufferPool({64 * 1024: 4, 1 << 20: 2})
    assert pool.pinned
    bufs = [pool.acquire(1) for _ in range(6)]
    with pytest.raises(PoolExhausted):
        pool.acquire(1)
    ptrs = {b.ptr for b in bufs}
    for b in bufs:
        b.release()
    again = [pool.acquire(1) for _ in range(6)]
    assert {b.ptr for b in again} == ptrs  # the same memory: allocated once, never per request
    pool.close()


@needs_cuda
def test_roundtrip_through_the_gpu_on_a_pool_stream_and_a_graph():
    from inferbus.accelerators._cuda import CudaGraph, DeviceBuffer, PinnedBufferPool, StreamPool, memcpy_async

    pool, streams, dev = PinnedBufferPool({1 << 20: 2}), StreamPool(2), DeviceBuffer(1 << 20)
    try:
        with streams.stream() as s, pool.buffer(4096) as a, pool.buffer(4096) as b:
            src = a.view(np.float32, (1024,))
            src[:] = np.arange(1024, dtype=np.float32)
            memcpy_async(dev.ptr, a.ptr, 4096, "h2d", s)
            memcpy_async(b.ptr, dev.ptr, 4096, "d2h", s)
            streams.synchronize(s)
            np.testing.assert_array_equal(b.view(np.float32, (1024,)), src)
            g = CudaGraph(s, lambda st: (memcpy_async(dev.ptr, a.ptr, 4096, "h2d", st),
                                         memcpy_async(b.ptr, dev.ptr, 4096, "d2h", st)))
            src[:] = -1.0
            g.launch(s)
            streams.synchronize(s)
            assert (b.view(np.float32, (1024,)) == -1.0).all()
            g.close()
        with streams.stream(), streams.stream():
            with pytest.raises(PoolExhausted):
                with streams.stream():
                    pass
    finally:
        dev.free()
        streams.close()
        pool.close()


def _jax_gpu() -> bool:
    try:
        import jax

        return any(d.platform == "gpu" for d in jax.devices())
    except Exception:
        return False


@pytest.mark.skipif(not _jax_gpu(), reason="jax sees no GPU here")
@pytest.mark.parametrize("model", ["digits", "digits_cnn"])
def test_jax_gpu_serves_fp16_by_default_within_tolerance(model):
    s = load_checked(get_backend("jax"), MODELS / model / "1" / "model.onnx", precision="auto", device_kind="gpu",
                     reference_path=MODELS / model / "data" / "test.npz")
    assert s.device.kind == "gpu" and s.precision == "fp16", s.report
    X = np.load(MODELS / model / "data" / "test.npz")["X"].astype(np.float32)
    ref = get_backend("onnxruntime").load(MODELS / model / "1" / "model.onnx").infer({"pixels": X})
    s.warmup((1, 64))
    out = s.infer({"pixels": X})
    assert max(normalized_errors(out, ref).values()) <= TOLERANCES["fp16"]


@needs_cuda
def test_jax_gpu_spin_schedule_and_hostmem_transfer_in_a_fresh_process():
    """``cuda_schedule="spin"`` reaches the context XLA runs on (the driver reports the spin flag after a JAX load),
    and on the GPU the ``hostmem`` and ``memcpy`` transfers (packed outputs) give the same answers as PJRT's own.
    A fresh process: the schedule must be set before anything in the process creates the CUDA context."""
    import subprocess
    import sys

    code = f"""
import numpy as np
from inferbus.accelerators._jax import JaxBackend
from cuda.bindings import driver as drv
m = {str(MODELS / "digits" / "1" / "model.onnx")!r}
s = JaxBackend(transfer="hostmem", cuda_schedule="spin").load(m, precision="fp32", device_kind="gpu")
s.warmup((1, 4))
ref = JaxBackend(transfer="pjrt").load(m, precision="fp32", device_kind="gpu")
mem = JaxBackend(transfer="memcpy").load(m, precision="fp32", device_kind="gpu")
x = np.random.default_rng(1).random((3, 64), dtype=np.float32)
a, b, c = s.infer({{"pixels": x}}), ref.infer({{"pixels": x}}), mem.infer({{"pixels": x}})
assert s.transfer == "hostmem" and mem.transfer == "memcpy" and sorted(s._packed) == [1, 4], (s.transfer, s._packed)
for k in b:
    np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c[k], b[k], rtol=1e-5, atol=1e-6)
err, dev = drv.cuDeviceGet(0)
err, flags, active = drv.cuDevicePrimaryCtxGetState(dev)
assert int(flags) & 7 == 1 and int(active) == 1, (flags, active)
print("OK")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert p.returncode == 0 and "OK" in p.stdout, p.stdout + p.stderr[-3000:]


@pytest.mark.skipif(not _jax_gpu(), reason="jax sees no GPU here")
def test_jax_gpu_worker_serves_through_the_bus(tmp_path):
    """``inferbus up --backends jax`` on a GPU host (the two models JAX serves): one JAX worker per GPU, serving requests
    sent over NATS by the SDK, its answers within the fp16 tolerance of an in-process ONNX Runtime CPU run."""
    import asyncio
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import start_deployment

    from inferbus.client import Client

    dep = start_deployment(tmp_path / "run", workers=1, timeout_s=170, extra=["--backends", "jax", "--no-cache", "--model", "digits", "--model", "digits_cnn"])
    try:
        async def run():
            out = {}
            async with await Client.connect(dep.nats_url, dep.prefix) as c:
                for model in ("digits", "digits_cnn"):
                    X = np.load(MODELS / model / "data" / "test.npz")["X"].astype(np.float32)[:64]
                    ref = get_backend("onnxruntime").load(MODELS / model / "1" / "model.onnx")
                    rs = await asyncio.gather(*[c.infer_result(model, {"pixels": X[i:i + 1]}, timeout_s=20)
                                                for i in range(len(X))])
                    worst = max(max(normalized_errors(r.outputs, ref.infer({"pixels": X[i:i + 1]})).values())
                                for i, r in enumerate(rs))
                    out[model] = ({(r.parameters["backend"], r.parameters["device"], r.parameters["precision"])
                                   for r in rs}, worst)
            return out

        got = asyncio.run(run())
    finally:
        dep.stop()
    for model, (served_by, worst) in got.items():
        assert served_by == {("jax", "gpu0", "fp16")}, (model, served_by)
        assert worst <= TOLERANCES["fp16"], (model, worst)
