"""Inputs of a load run, their pre-encoded request bodies and their reference answers.

Inputs replay the model's shipped dataset rows (``models/<name>/data/test.npz``: for a model
with one input, the array named after it or ``X``, one row a request; the repository checks
that it fits), or, for a model without one or with several inputs, are drawn at random (normal floats, integers in [0, 100),
distinct UTF-8 strings for BYTES); ``distinct=True`` perturbs each one so that no two requests of a run are equal
(cache misses), ``distinct=False`` repeats one row (cache hits). The reference
outputs come from an in-process ONNX Runtime session with the worker's session
options (:class:`inferbus.accelerators.OnnxRuntimeBackend`), one row at a time,
so an answer computed at batch 1 matches byte for byte and one computed inside a
zero-wait batch matches within float tolerance.
"""

from __future__ import annotations

import msgspec
import numpy as np

from ..accelerators import InferenceError, OnnxRuntimeBackend
from ..accelerators._dtypes import numpy_dtype_for
from ..actors._repository import ModelRepository
from ..schemas import InferRequest, InferResponse, decode_error, encode_request, input_from_numpy, output_to_numpy
from ._result import ReplyParams

_response_decoder = msgspec.msgpack.Decoder(InferResponse)


class _ReplyOutput(msgspec.Struct):
    """What the load generator's fast judge reads of a response output: its name and ``raw`` bytes."""

    name: str
    raw: bytes | None = None


class _Reply(msgspec.Struct):
    outputs: list[_ReplyOutput] = []
    parameters: ReplyParams | None = None


_reply_decoder = msgspec.msgpack.Decoder(_Reply)

MAX_VERDICTS = 1 << 16
"""Answers judged by float tolerance that :meth:`Workload.check_reply` remembers (by input index and output bytes),
per workload; the table is cleared when full."""


class Workload:
    """Inputs and their reference outputs for one model version.

    Args:
        repo: the model repository. model: name. version: None = the model's default.
        pool: how many distinct inputs to prepare (reused cyclically); with
            ``distinct=False`` one input is prepared.
        distinct: perturb rows so that inputs never repeat within the pool.
        seed: of the random inputs for models without a dataset (BYTES inputs are ``r<index>e<element>``).
        offset: first global index of this pool, so that pools of several
            generator processes (offset = process index × pool) never overlap.

    Raises:
        KeyError: unknown model.
        InferenceError: the model fails on an input (the reference run); for drawn inputs the message says which
            dataset file would give it inputs it accepts.
    """

    def __init__(self, repo: ModelRepository, model: str, version: str | None = None, pool: int = 4096,
                 distinct: bool = True, seed: int = 0, offset: int = 0) -> None:
        m = repo.get(model)
        if m is None:
            raise KeyError(f"unknown model {model!r}")
        self.mv = m.version(version)
        rng = np.random.default_rng(seed)
        data = m.data_path(repo.root)
        self.inputs: list[dict[str, np.ndarray]] = []
        rows = None
        if data.is_file() and len(self.mv.inputs) == 1:
            # the array load_reference (the worker's precision check) takes: the input's name, else X; the
            # repository checked that it fits the input (rank, fixed dimensions, dtype) when it was read
            with np.load(data, allow_pickle=False) as z:
                rows = z[self.mv.inputs[0].name] if self.mv.inputs[0].name in z.files else z["X"]
        for i in range(pool if distinct else 1):
            gi = offset + i
            feed = {}
            for t in self.mv.inputs:
                shape = [1 if d < 0 else d for d in t.shape]
                if rows is not None:
                    j = gi % len(rows)
                    x = rows[j:j + 1].astype(numpy_dtype_for(t.datatype))  # one row, the batch axis kept
                    if distinct:
                        # (row, magnitude) = divmod of the global index: no two indices give the same input
                        _perturb(x, gi % x.size, gi // len(rows) + 1)
                else:
                    dt = numpy_dtype_for(t.datatype)
                    if dt.kind == "f":
                        x = rng.standard_normal(shape).astype(dt)
                    elif dt.kind in "iu":
                        x = rng.integers(0, 100, shape).astype(dt)
                    elif dt == object:  # BYTES: distinct UTF-8 strings (ONNX Runtime takes string tensors as text)
                        n = int(np.prod(shape))
                        x = np.array([f"r{gi}e{k}".encode() for k in range(n)], dtype=object).reshape(shape)
                    else:
                        x = np.zeros(shape, dtype=dt)
                feed[t.name] = x
            self.inputs.append(feed)
        sess = OnnxRuntimeBackend().load(self.mv.path)
        # the worker hands BYTES to ONNX Runtime as text and answers text outputs as UTF-8 bytes: the same here
        try:
            self.reference = [_bytes_out(sess.infer(_text_in(feed))) for feed in self.inputs]
        except InferenceError as exc:
            # (a fresh-user trial: a Gather over a 3-row table given integers in [0, 100) said only the runtime's
            # words, and which data file would mend it was left to guess)
            hit = "`bench --hit` (its first row, unchanged; computed each time when the model's cache_ttl_ms is 0)"
            if rows is not None and not distinct:
                raise
            if rows is not None:
                what = f"a row of {data} made distinct for a cache-miss load (integers + 1 or more, floats + 0.001)"
                mend = f"load it with {hit}"
            elif len(self.mv.inputs) == 1:
                what = "the random inputs drawn for a model without a dataset (normal floats, integers in [0, 100))"
                mend = (f"give it rows it accepts in {data} (array {self.mv.inputs[0].name!r} or X, a row a request; "
                        f"docs/models.md), with {hit} if a row made distinct fails too")
            else:
                what = "the random inputs drawn (normal floats, integers in [0, 100))"
                mend = "a model of several inputs is loaded with drawn inputs only"
            raise InferenceError(f"model {model!r} version {self.mv.version} fails on {what}: {exc}; {mend}") \
                from exc
        # the fast path compares raw bytes: only for fixed-size datatypes (BYTES outputs are judged decoded)
        self._ref_raw = [{k: (v.tobytes() if v.dtype != object else None) for k, v in ref.items()}
                         for ref in self.reference]
        self._bodies: list[bytes] | None = None
        self._verdicts: dict[tuple, bool] = {}

    def __len__(self) -> int:
        return len(self.inputs)

    @property
    def bodies(self) -> list[bytes]:
        """The requests, MessagePack with ``raw`` tensors, encoded once (what an SDK sends)."""
        if self._bodies is None:
            self._bodies = [encode_request(InferRequest(inputs=[input_from_numpy(k, v) for k, v in feed.items()]))
                            for feed in self.inputs]
        return self._bodies

    def check(self, i: int, outputs: dict[str, np.ndarray]) -> bool:
        """True when ``outputs`` (decoded arrays) match the reference of input ``i``."""
        ref = self.reference[i % len(self.reference)]
        if set(outputs) != set(ref):
            return False
        for name, want in ref.items():
            got = outputs[name]
            if got.shape != want.shape:
                return False
            if want.dtype.kind == "f":
                if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
                    return False
            elif not np.array_equal(got, want):
                return False
        return True

    def check_reply(self, i: int, headers: dict | None, body: bytes) -> tuple[str | None, bool, object]:
        """Judge one raw reply to request ``i``.

        Returns:
            ``(error code or None, correct, response parameters)``. Error codes are
            the wire codes (``INVALID_ARGUMENT`` ...), ``NO_RESPONDERS`` for the
            server's 503 status and ``BAD_REPLY`` for a body that does not decode.
            The parameters are a :class:`ReplyParams` (a dict when they do not fit its
            types, None without any).

        The judge runs in the generator, on the cores the system under test uses, so it is
        kept cheap: the reply is decoded only for its outputs' names and ``raw`` bytes and the
        parameters the recorder reads, and compared with the reference's bytes. An answer that
        differs in its bytes (e.g. computed inside a batch, whose float results may differ in
        the last bits) is decoded in full and compared within tolerance once per input and
        output bytes; the verdict is remembered (:data:`MAX_VERDICTS`). On a 2-core box, with the
        recorder's work, this took a byte-equal answer from 11.1 to 2.8 µs and a repeated
        tolerance one from 71 to 4.7 µs (docs/performance.md, twenty-fifth session).
        """
        if headers:
            if headers.get("Status") == "503":
                return "NO_RESPONDERS", False, None
            err = decode_error(headers, body)
            if err is not None:
                return err.code.value, False, None
        j = i % len(self._ref_raw)
        try:
            resp = _reply_decoder.decode(body)
        except msgspec.MsgspecError:  # not our types (e.g. a parameter of another type): the full judge
            return self._judge_full(j, body, None)
        ref = self._ref_raw[j]
        outs = resp.outputs
        if len(outs) == len(ref) and all(o.raw is not None and o.raw == ref.get(o.name) for o in outs):
            return None, True, resp.parameters
        if any(o.raw is None for o in outs):  # the data form or BYTES: judged decoded, not remembered
            return self._judge_full(j, body, None)
        key = (j, tuple((o.name, o.raw) for o in outs))
        verdict = self._verdicts.get(key)
        if verdict is None:
            err, verdict, _ = self._judge_full(j, body, key)
            if err is not None:
                return err, False, None
        return None, verdict, resp.parameters

    def _judge_full(self, j: int, body: bytes, key: tuple | None) -> tuple[str | None, bool, dict | None]:
        """Decode the reply to input ``j`` in full and judge it within tolerance (:meth:`check`); the verdict
        is remembered under ``key`` when given."""
        try:
            resp = _response_decoder.decode(body)
        except msgspec.MsgspecError:
            return "BAD_REPLY", False, None
        try:
            arrays = {o.name: output_to_numpy(o) for o in resp.outputs}
        except Exception:
            return None, False, resp.parameters
        verdict = self.check(j, arrays)
        if key is not None:
            if len(self._verdicts) >= MAX_VERDICTS:
                self._verdicts.clear()
            self._verdicts[key] = verdict
        return None, verdict, resp.parameters


def _perturb(x: np.ndarray, k: int, m: int) -> None:
    """Make element ``k`` of ``x`` (numbers: the repository allows reference rows for numeric inputs only)
    distinct by magnitude ``m`` >= 1, in place: floats + m·1e-3, integers + m (a float step was truncated
    away), booleans left as they are (two values cannot make a pool distinct)."""
    if x.dtype.kind in "iu":
        x.flat[k] = x.flat[k] + np.asarray(m).astype(x.dtype)
    elif x.dtype.kind != "b":
        x.flat[k] += np.float32(m * 1e-3)


def _text_in(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """BYTES inputs (object arrays of bytes) as text, as the worker feeds them to ONNX Runtime."""
    return {k: (np.array([b.decode("utf-8") for b in v.flat], dtype=object).reshape(v.shape) if v.dtype == object
                else v) for k, v in feed.items()}


def _bytes_out(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Text outputs as UTF-8 bytes, as a client decodes the worker's BYTES answer."""
    return {k: (np.array([x.encode("utf-8") if isinstance(x, str) else x for x in v.flat], dtype=object)
                .reshape(v.shape) if v.dtype == object else v) for k, v in outputs.items()}
