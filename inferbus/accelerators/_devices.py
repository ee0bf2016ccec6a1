"""Device discovery and the worker plan: one worker process per GPU, TPU chip or CPU slot (issue 4, item 3).

Discovery never initialises an accelerator runtime in the calling process:
importing JAX and touching a GPU would create a CUDA context and, by default,
pre-allocate 75 % of every visible GPU's memory in the *node* process. So
GPU/TPU facts come from a short-lived probe subprocess
(``python -m inferbus.accelerators._devices``) that prints JSON and exits.

What each source contributes:

* CPU slots: ``os.sched_getaffinity`` (the cores this process may use).
* GPUs: NVML (``pynvml`` from nvidia-ml-py) if present, else cuda-python
  (``cuda.bindings.runtime.cudaGetDeviceCount`` / ``cudaGetDeviceProperties``),
  else what JAX reports.
* TPUs and JAX's view: ``jax.devices()`` (TPU chips; GPUs JAX can drive).
* TensorRT: whether ``import tensorrt`` works (its version).

:func:`plan_workers` turns the chosen backends into worker placements, each
with the environment that isolates its device: ``CUDA_VISIBLE_DEVICES=<i>``
for a GPU worker; for a TPU worker ``TPU_VISIBLE_CHIPS=<i>``,
``TPU_PROCESS_BOUNDS=1,1,1``, ``TPU_CHIPS_PER_PROCESS_BOUNDS=1,1,1``, a
``TPU_PROCESS_PORT`` of its own and ``ALLOW_MULTIPLE_LIBTPU_LOAD=1`` (the
variables the PJRT TPU runtime reads for one chip per process, as documented
in pytorch/xla's PJRT guide; never run here: there is no TPU in this
workplace). JAX GPU workers also get ``XLA_PYTHON_CLIENT_PREALLOCATE=false``:
the models are small and several workers may share a GPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field

from ._abc import BackendUnavailable, DeviceInfo

TPU_BASE_PORT = 8476
"""First ``TPU_PROCESS_PORT`` handed to TPU workers (the runtime's default port)."""


@dataclass(frozen=True)
class DevicePlan:
    """One worker to start: which backend on which device, and its environment additions."""

    backend: str
    device_kind: str
    device_index: int
    env: dict = field(default_factory=dict)
    facts: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.backend}:{self.device_kind}{self.device_index}"


@dataclass(frozen=True)
class Discovery:
    """What was found here.

    Attributes:
        cpus: CPU slots (core ids).
        gpus: one :class:`DeviceInfo` per GPU (``backend`` empty: any may serve it).
        tpus: one per TPU chip JAX sees.
        jax: JAX version and platform, or None when jax does not import.
        tensorrt: TensorRT version, or None when it does not import.
        onnxruntime_providers: ONNX Runtime's execution providers.
        notes: why a source gave nothing (``{"nvml": "not installed", ...}``).
    """

    cpus: tuple[int, ...]
    gpus: tuple[DeviceInfo, ...] = ()
    tpus: tuple[DeviceInfo, ...] = ()
    jax: dict | None = None
    tensorrt: str | None = None
    onnxruntime_providers: tuple[str, ...] = ()
    notes: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"cpus": list(self.cpus), "gpus": [g.to_dict() for g in self.gpus],
                "tpus": [t.to_dict() for t in self.tpus], "jax": self.jax, "tensorrt": self.tensorrt,
                "onnxruntime_providers": list(self.onnxruntime_providers), "notes": dict(self.notes)}

    @classmethod
    def from_dict(cls, d: dict) -> "Discovery":
        dev = lambda x: DeviceInfo(x["kind"], x["name"], x["index"], x.get("backend", ""), x.get("facts", {}))  # noqa: E731
        return cls(cpus=tuple(d["cpus"]), gpus=tuple(dev(g) for g in d["gpus"]), tpus=tuple(dev(t) for t in d["tpus"]),
                   jax=d.get("jax"), tensorrt=d.get("tensorrt"),
                   onnxruntime_providers=tuple(d.get("onnxruntime_providers", ())), notes=dict(d.get("notes", {})))

    def serving(self, kind: str, backends: tuple[str, ...] | None = None) -> str:
        """Which backend serves a device of ``kind`` here, among ``backends`` (default: all), or ``none``."""
        allowed = backends or ("tensorrt", "jax", "onnxruntime")
        if kind == "gpu":
            if "tensorrt" in allowed and self.tensorrt:
                return "tensorrt"
            if "jax" in allowed and self.jax and self.jax.get("platform") == "gpu":
                return "jax"
            if "onnxruntime" in allowed and "CUDAExecutionProvider" in self.onnxruntime_providers:
                return "onnxruntime"
            return "none"
        if kind == "tpu":
            return "jax" if "jax" in allowed and self.jax else "none"
        return "onnxruntime" if "onnxruntime" in allowed else ("jax" if "jax" in allowed and self.jax else "none")


def _cpus() -> tuple[int, ...]:
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover
        return tuple(range(os.cpu_count() or 1))


def _gpus_nvml(notes: dict) -> list[DeviceInfo]:
    try:
        import pynvml
    except ImportError:
        notes["nvml"] = "pynvml (nvidia-ml-py) not installed"
        return []
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        notes["nvml"] = f"nvmlInit failed: {exc}"
        return []
    out = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            out.append(DeviceInfo("gpu", f"gpu{i}", i, "", {"model": name, "memory_bytes": int(mem),
                                                            "compute_capability": f"{major}.{minor}", "source": "nvml"}))
    finally:
        pynvml.nvmlShutdown()
    return out


def _gpus_cuda(notes: dict) -> list[DeviceInfo]:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        notes["cuda-python"] = "cuda-python (cuda.bindings) not installed"
        return []
    err, n = cudart.cudaGetDeviceCount()
    if int(err) != 0:
        notes["cuda-python"] = f"cudaGetDeviceCount: {err}"
        return []
    out = []
    for i in range(n):
        err, prop = cudart.cudaGetDeviceProperties(i)
        if int(err) != 0:
            continue
        name = prop.name.decode(errors="replace").rstrip("\x00") if isinstance(prop.name, bytes) else str(prop.name)
        out.append(DeviceInfo("gpu", f"gpu{i}", i, "", {"model": name, "memory_bytes": int(prop.totalGlobalMem),
                                                        "compute_capability": f"{prop.major}.{prop.minor}",
                                                        "source": "cuda-python"}))
    return out


def probe() -> Discovery:
    """Discover devices *in this process* (initialises runtimes: call it in a throwaway process)."""
    notes: dict = {}
    try:
        import onnxruntime as ort

        providers = tuple(ort.get_available_providers())
    except ImportError:  # pragma: no cover - core dependency
        providers = ()
    gpus = _gpus_nvml(notes) or _gpus_cuda(notes)
    tpus: list[DeviceInfo] = []
    jax_facts = None
    try:
        import jax

        devs = jax.devices()
        plat = devs[0].platform if devs else "cpu"
        plat = "gpu" if plat in ("cuda", "rocm") else plat
        jax_facts = {"version": jax.__version__, "platform": plat, "devices": len(devs)}
        if plat == "tpu":
            for d in devs:
                tpus.append(DeviceInfo("tpu", f"tpu{d.id}", d.id, "jax", {"model": getattr(d, "device_kind", "")}))
        if plat == "gpu" and not gpus:
            for d in devs:
                gpus.append(DeviceInfo("gpu", f"gpu{d.id}", d.id, "", {"model": getattr(d, "device_kind", ""),
                                                                        "source": "jax"}))
    except ImportError:
        notes["jax"] = "not installed"
    except Exception as exc:
        notes["jax"] = f"jax.devices() failed: {exc}"
    trt = None
    try:
        import tensorrt

        trt = tensorrt.__version__
    except ImportError:
        notes["tensorrt"] = "not installed (pip install tensorrt; it serves NVIDIA GPUs only)"
    except Exception as exc:  # a broken install: libraries missing
        notes["tensorrt"] = f"import failed: {exc}"
    return Discovery(_cpus(), tuple(gpus), tuple(tpus), jax_facts, trt, providers, notes)


def discover_devices(timeout_s: float = 120.0) -> Discovery:
    """Discover devices in a probe subprocess (so this process never holds a GPU context).

    Raises:
        BackendUnavailable: the probe failed or timed out (its stderr in the message).
    """
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        cp = subprocess.run([sys.executable, "-m", "inferbus.accelerators._devices"], capture_output=True,
                            text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as exc:
        raise BackendUnavailable(f"device probe timed out after {timeout_s}s") from exc
    if cp.returncode < 0:  # killed by a signal (the OOM killer's SIGKILL...): its stderr is often empty
        sig = -cp.returncode
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "unknown signal"
        raise BackendUnavailable(f"device probe failed (killed by signal {sig} ({name})): {cp.stderr[-2000:]}")
    if cp.returncode != 0:
        raise BackendUnavailable(f"device probe failed ({cp.returncode}): {cp.stderr[-2000:]}")
    return Discovery.from_dict(json.loads(cp.stdout.strip().splitlines()[-1]))


def plan_workers(backends: tuple[str, ...], discovery: Discovery, cpu_workers: int = 0) -> list[DevicePlan]:
    """One worker per device each backend serves, in a stable order.

    * ``onnxruntime``: ``cpu_workers`` CPU slots (0 = one per slot), device index = slot number.
    * ``jax``: one per TPU chip, else one per GPU, else one CPU worker (XLA on CPU).
    * ``tensorrt``: one per GPU.

    Raises:
        BackendUnavailable: a backend is unknown, its runtime is missing, or it has no device here.
    """
    plans: list[DevicePlan] = []
    for b in backends:
        if b == "onnxruntime":
            n = cpu_workers or len(discovery.cpus) or 1
            for i in range(n):
                plans.append(DevicePlan("onnxruntime", "cpu", i))
        elif b == "jax":
            if discovery.jax is None:
                raise BackendUnavailable(f"backend jax: {discovery.notes.get('jax', 'not installed')} "
                                         "(pip install 'inferbus[jax]')")
            if discovery.jax.get("platform") == "tpu" and discovery.tpus:
                for k, t in enumerate(discovery.tpus):
                    plans.append(DevicePlan("jax", "tpu", t.index, {
                        "TPU_VISIBLE_CHIPS": str(t.index), "TPU_PROCESS_BOUNDS": "1,1,1",
                        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_PORT": str(TPU_BASE_PORT + k),
                        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}, dict(t.facts)))
            elif discovery.jax.get("platform") == "gpu" and discovery.gpus:
                for g in discovery.gpus:
                    plans.append(DevicePlan("jax", "gpu", g.index, {
                        "CUDA_VISIBLE_DEVICES": str(g.index), "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
                        dict(g.facts)))
            else:
                plans.append(DevicePlan("jax", "cpu", 0))
        elif b == "tensorrt":
            if discovery.tensorrt is None:
                raise BackendUnavailable(f"backend tensorrt: {discovery.notes.get('tensorrt', 'not installed')}")
            if not discovery.gpus:
                raise BackendUnavailable("backend tensorrt: no NVIDIA GPU found")
            for g in discovery.gpus:
                plans.append(DevicePlan("tensorrt", "gpu", g.index, {"CUDA_VISIBLE_DEVICES": str(g.index)},
                                        dict(g.facts)))
        else:
            raise BackendUnavailable(f"unknown backend {b!r}; known: onnxruntime, jax, tensorrt")
    return plans


if __name__ == "__main__":  # the probe subprocess: one JSON line on stdout
    d = probe()
    sys.stdout.write(json.dumps(d.to_dict()) + "\n")
