"""Precision modes, their load-time check against FP32, and the NaN guard (issue 4, item 4).

At load, :func:`load_checked` computes the **FP32 ONNX Runtime (CPU)** answer
on the model's reference inputs (``<model>/data/test.npz``, first
``reference_rows`` rows) and compares the candidate session's answer with it:

* error metric, per output: ``max|y - y_ref| / max(max|y_ref|, 1e-6)``, the
  largest deviation as a fraction of the output's largest magnitude (so logits
  of size ~20 and probabilities of size ~1 are judged alike);
* the candidate is refused when that exceeds :data:`TOLERANCES` for its
  precision, or when it is non-finite anywhere the reference is finite.

A refused precision falls back to FP32 on the same backend, which passes the
same check at the FP32 tolerance (or the model is not served by that worker at
all: :class:`ModelLoadError`). Refusals are logged and kept in the session's
:class:`PrecisionReport` (exposed in the worker's load report and replies).
With no reference inputs a reduced precision is refused ("cannot be checked")
and FP32 is served unchecked.

The same ONNX Runtime reference is what the cross-backend test uses, so "the
same request gives the same answer whichever worker served it" holds within
the served precision's tolerance.

At serve time a reduced-precision session is wrapped with its FP32 twin: an
answer with a NaN or Inf in it is recomputed at FP32 and the FP32 answer is
served (counted in :attr:`CheckedSession.nan_fallbacks`), so NaN is never
served where FP32 is finite.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ._abc import (
    AcceleratorError, BackendUnavailable, DeviceInfo, ModelLoadError, PrecisionRefused, TensorInfo, check_precision,
)

log = logging.getLogger("inferbus.accelerators.precision")

TOLERANCES: dict[str, float] = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 5e-2, "int8": 8e-2}
"""Largest allowed normalized error (see the module docstring) vs the FP32 ONNX Runtime reference.

Why these values: fp32 differs from the reference only by summation order (observed ≤ 1e-6 on the
shipped models; 1e-4 leaves room for other BLAS/XLA kernels); fp16 has a 2^-11 unit roundoff, and with
fp32 accumulation the observed error is ≤ 1.5e-3 (1e-2 = ~7x margin); bf16 has 2^-8 (observed ≤ 1.3e-2);
int8 dynamic quantization steps are 1/255 of each tensor's range (observed ≤ 1.2e-2 on the MLP, 2.4e-2
on the CNN). The figures per model are in docs/accelerators.md.
"""

MIN_SCALE = 1e-6


@dataclass(frozen=True)
class PrecisionReport:
    """What precision a session serves and why.

    Attributes:
        requested: what was asked for, ``auto`` resolved (``fp16`` on GPU/TPU).
        served: what the session runs at.
        tolerance: the served precision's tolerance (None when unchecked).
        max_error: normalized max error vs the FP32 reference (None when unchecked).
        rows: reference rows compared (0 when unchecked).
        refused: ``(precision, reason)`` for every precision tried and refused.
    """

    requested: str
    served: str
    tolerance: float | None = None
    max_error: float | None = None
    rows: int = 0
    refused: tuple[tuple[str, str], ...] = ()
    errors_by_output: dict = field(default_factory=dict)

    @property
    def fell_back(self) -> bool:
        return self.served != self.requested

    def to_dict(self) -> dict:
        d = asdict(self)
        d["refused"] = [list(r) for r in self.refused]
        return d


def normalized_errors(candidate: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict[str, float]:
    """Per output: ``max|y - ref| / max(max|ref|, 1e-6)`` over finite reference entries; ``inf`` when the
    candidate is non-finite where the reference is finite."""
    out = {}
    for name, ref in reference.items():
        y = np.asarray(candidate[name], dtype=np.float64)
        r = np.asarray(ref, dtype=np.float64)
        if y.shape != r.shape:
            out[name] = float("inf")
            continue
        fin = np.isfinite(r)
        if (~np.isfinite(y) & fin).any():
            out[name] = float("inf")
            continue
        if not fin.any():
            out[name] = 0.0
            continue
        scale = max(float(np.abs(r[fin]).max()), MIN_SCALE)
        out[name] = float(np.abs(y[fin] - r[fin]).max() / scale)
    return out


def load_reference(npz_path: Path | None, inputs: tuple[TensorInfo, ...], rows: int = 256) -> dict | None:
    """Reference inputs from a model's ``data/test.npz``: ``X`` for a single-input model, else one array
    per input name; the first ``rows`` rows, in the inputs' datatypes. None when absent or unusable."""
    if npz_path is None or not Path(npz_path).is_file():
        return None
    from ._dtypes import numpy_dtype_for

    with np.load(npz_path, allow_pickle=False) as z:
        keys = set(z.files)
        feeds = {}
        for t in inputs:
            if t.name in keys:
                arr = z[t.name]
            elif len(inputs) == 1 and "X" in keys:
                arr = z["X"]
            else:
                return None
            feeds[t.name] = np.ascontiguousarray(arr[:rows]).astype(numpy_dtype_for(t.datatype), copy=False)
    return feeds


class CheckedSession:
    """A session with its precision report and, for reduced precision, its FP32 twin as NaN guard.

    Behaves as the wrapped session (same ``inputs``/``outputs``/``device``); ``precision`` is the served one.
    Not thread-safe, like the sessions it wraps.
    """

    def __init__(self, inner, report: PrecisionReport, fp32_twin=None) -> None:
        self.inner = inner
        self.report = report
        self.precision = report.served
        self.inputs = inner.inputs
        self.outputs = inner.outputs
        self.device: DeviceInfo = inner.device
        self._twin = fp32_twin
        self.nan_fallbacks = 0

    def infer(self, inputs: dict[str, np.ndarray], output_names: list[str] | None = None) -> dict[str, np.ndarray]:
        out = self.inner.infer(inputs, output_names)
        if self._twin is not None:
            for arr in out.values():
                if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                    self.nan_fallbacks += 1
                    log.warning("%s answer had NaN/Inf; served the FP32 answer instead", self.precision)
                    return self._twin.infer(inputs, output_names)
        return out

    def warmup(self, batch_sizes: tuple[int, ...] = (1,)) -> None:
        self.inner.warmup(batch_sizes)
        if self._twin is not None:
            self._twin.warmup(batch_sizes[:1])

    def close(self) -> None:
        self.inner.close()
        if self._twin is not None:
            self._twin.close()

    def __getattr__(self, name):  # backend extras (e.g. JaxSession.lowered_text)
        return getattr(self.inner, name)


def _reference_outputs(path: Path, feeds: dict) -> dict[str, np.ndarray]:
    from ._onnxruntime import OnnxRuntimeBackend

    ref = OnnxRuntimeBackend().load(path, precision="fp32")
    try:
        return ref.infer(feeds)
    finally:
        ref.close()


def load_checked(backend, path: Path, *, precision: str = "auto", device_kind: str = "cpu", device_index: int = 0,
                 threads: int = 1, reference: dict | None = None, reference_path: Path | None = None,
                 reference_rows: int = 256, guard: bool = True) -> CheckedSession:
    """Load ``path`` at ``precision`` if it passes its check against FP32, else at FP32.

    Args:
        backend: a :class:`Backend`.
        precision: ``auto`` (fp16 on gpu/tpu, fp32 on cpu) or one of ``PRECISIONS``.
        reference: reference inputs by name; default read from ``reference_path``
            (a ``test.npz``) with :func:`load_reference`.
        reference_rows: rows of ``reference_path`` to use.
        guard: keep an FP32 twin of a reduced-precision session to recompute NaN/Inf answers.

    Returns:
        A :class:`CheckedSession` whose ``report`` says what is served and why.

    Raises:
        BackendUnavailable: the backend or device is missing (nothing to fall back to).
        ModelLoadError: even FP32 fails to load or to match the reference within the FP32 tolerance.
        ValueError: ``precision`` is not a known precision.
    """
    requested = check_precision(precision, device_kind)
    path = Path(path)
    refused: list[tuple[str, str]] = []
    ref_out = None

    def attempt(prec: str):
        nonlocal reference, ref_out
        sess = backend.load(path, precision=prec, device_kind=device_kind, device_index=device_index, threads=threads)
        if reference is None and reference_path is not None:
            reference = load_reference(reference_path, sess.inputs, reference_rows)
        if reference is None:
            if prec != "fp32":
                sess.close()
                raise PrecisionRefused(f"{prec} cannot be checked: the model has no reference inputs (data/test.npz)")
            return sess, None, {}
        if ref_out is None:
            ref_out = _reference_outputs(path, reference)
        try:
            got = sess.infer(reference)
        except AcceleratorError as exc:
            sess.close()
            raise PrecisionRefused(f"{prec} failed on the reference inputs: {exc}") from exc
        errs = normalized_errors(got, {k: ref_out[k] for k in got})
        worst = max(errs.values()) if errs else 0.0
        if worst > TOLERANCES[prec]:
            sess.close()
            what = "non-finite where FP32 is finite" if worst == float("inf") else f"error {worst:.3g}"
            raise PrecisionRefused(f"{prec}: {what} > tolerance {TOLERANCES[prec]:g} "
                                   f"(vs onnxruntime FP32 on {len(next(iter(reference.values())))} reference rows; "
                                   f"per output {', '.join(f'{k}={v:.3g}' for k, v in errs.items())})")
        return sess, worst, errs

    chain = [requested] if requested == "fp32" else [requested, "fp32"]
    for prec in chain:
        try:
            sess, worst, errs = attempt(prec)
        except BackendUnavailable:
            raise
        except ModelLoadError as exc:
            if prec == "fp32":
                raise ModelLoadError(f"{path} on {backend.name}: {exc}") from exc
            refused.append((prec, str(exc)))
            log.warning("%s on %s %s: refused %s (%s); falling back to fp32", path, backend.name, device_kind,
                        prec, exc)
            continue
        rows = len(next(iter(reference.values()))) if reference else 0
        report = PrecisionReport(requested=requested, served=prec,
                                 tolerance=TOLERANCES[prec] if worst is not None else None,
                                 max_error=worst, rows=rows, refused=tuple(refused), errors_by_output=errs)
        twin = None
        if guard and prec != "fp32":
            twin = backend.load(path, precision="fp32", device_kind=device_kind, device_index=device_index,
                                threads=threads)
        return CheckedSession(sess, report, twin)
    raise AssertionError("unreachable")  # pragma: no cover
