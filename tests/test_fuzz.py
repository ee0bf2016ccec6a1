"""Fuzzing the public and worker subjects with hypothesis (issue 5, item 7, last bullet).

Requests are generated from the served models' own metadata (right and wrong names, datatypes, shapes,
element values and forms), plus arbitrary MessagePack documents, random bytes, JSON bodies and random
headers (content type, budget, request id, client id, hedge policy). Each request must get either a typed
error reply (never INTERNAL, never a timeout) or an answer equal to the model run in this process; and no
actor process may die (worker pids from their load reports, the ingress pid from its health reply).

CI runs 10,000 requests (500 hypothesis examples of 20 requests in flight at once) against the shared
deployment.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time

import msgpack
import nats
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from inferbus.client import Client
from inferbus.schemas import (
    DATATYPES, ErrorCode, decode_error, decode_request, decode_response, input_to_numpy, is_json, output_to_numpy,
)
from inferbus.schemas._internal import FORWARD_TAG

from conftest import MODELS
from test_reliability_lib import Reports, reference

pytestmark = pytest.mark.timeout(600)


class _Loop:
    """An event loop in a thread, so hypothesis's synchronous examples can talk to NATS."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def bus(deployment):
    lp = _Loop()

    async def setup():
        nc = await nats.connect(deployment.nats_url)
        client = Client(nc, deployment.prefix)
        meta = {m.name: m for m in (await client.models()).models}
        reports = await Reports.start(nc, deployment.prefix)
        await reports.wait(lambda r: len(r) >= 1, what="worker reports")
        return nc, client, meta, reports

    nc, client, meta, reports = lp.run(setup())
    yield lp, nc, client, meta, reports, deployment.prefix
    lp.run(nc.close())
    lp.close()


# ---- strategies -------------------------------------------------------------------------------------------------
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=True),
                     st.text(max_size=8), st.binary(max_size=16))
_docs = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                     max_leaves=12)
_header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=24)


_STRATEGIES: dict = {}


def _cached(key, make):
    """The strategy ``make()`` built once per ``key`` (strategies are validated when first drawn: rebuilding
    one per draw cost more than half of the generation time)."""
    s = _STRATEGIES.get(key)
    if s is None:
        s = _STRATEGIES[key] = make()
    return s


def _ints(lo: int, hi: int):
    return _cached(("ints", lo, hi), lambda: st.integers(lo, hi))


def _sampled(*options):
    return _cached(("sampled", options), lambda: st.sampled_from(options))


def _binary(lo: int, hi: int):
    return _cached(("binary", lo, hi), lambda: st.binary(min_size=lo, max_size=hi))


_BOOLS = st.booleans()
_HEADER_VALUE = _header_text.filter(lambda s: s.strip())
_INGRESS_ID = _header_text.filter(lambda s: s.strip() and "." not in s and " " not in s)
_TIMEOUT_VALUES = st.one_of(_header_text, st.sampled_from(["0", "-5", "NaN", "1e12", "0.0001", "inf", "500", "2000"]))
_HEDGE_VALUES = st.one_of(_header_text, st.sampled_from(["p95", "5", "off", "-1", "p0"]))
_SEQ_VALUES = st.one_of(st.integers(-5, 10**12).map(str), _header_text)
_REQUEST_IDS = st.text(max_size=10)
_PARAMETERS = st.dictionaries(st.text(max_size=4), _scalars, max_size=2)
_BYTES_ELEMENTS = st.text(max_size=5).map(str.encode)


_ELEMENTS: dict = {}
_DATATYPE_CHOICES = st.sampled_from(DATATYPES + ("FP8", ""))
_SHAPES = st.lists(st.integers(-2, 5), max_size=4)
_NAMES = st.text(max_size=6)


def _element(datatype: str):
    if datatype not in _ELEMENTS:
        _ELEMENTS[datatype] = _element_strategy(datatype)
    return _ELEMENTS[datatype]


def _element_strategy(datatype: str):
    if datatype == "BOOL":
        return st.booleans()
    if datatype in ("FP16", "BF16", "FP32", "FP64"):
        return st.one_of(st.floats(width=32, allow_nan=True), st.integers(-70000, 70000),
                         st.sampled_from(["NaN", "Infinity", "-Infinity"]))
    if datatype == "BYTES":
        return st.one_of(st.binary(max_size=12), st.text(max_size=6))
    lo, hi = ((0, 2**64 - 1) if datatype.startswith("UINT") else (-2**63, 2**63 - 1))
    return st.integers(lo, hi) | st.integers(-300, 300)


@st.composite
def _tensor(draw, info, valid: bool = False, rows: int | None = None):
    """One input for ``info`` (TensorMetadata): ``valid`` ones are right; others sometimes wrong in one way."""
    bad = (lambda k: False) if valid else (lambda k: not draw(_ints(0, k)))
    name = draw(_NAMES) if bad(9) else info.name
    datatype = draw(_DATATYPE_CHOICES) if bad(7) else info.datatype
    shape = [d if d >= 0 else (rows if rows is not None and i == 0 else draw(_ints(0, 3)))
             for i, d in enumerate(info.shape)]
    if bad(6):
        shape = draw(_SHAPES)
    count = math.prod(d for d in shape if d >= 0) if all(d >= 0 for d in shape) else 0
    form = draw(_sampled("data", "data", "raw", "nested", *(() if valid else ("junk",))))
    t = {"name": name, "datatype": datatype, "shape": shape}
    if form == "raw" and datatype in DATATYPES and datatype != "BYTES":
        itemsize = np.dtype(_np_types[datatype]).itemsize
        size = draw(_ints(0, 64)) if bad(5) else count * itemsize
        raw = draw(_binary(size, size))
        if datatype == "BOOL" and not bad(3):
            raw = bytes(x & 1 for x in raw)
        t["raw"] = raw
    elif form == "raw" and datatype == "BYTES":
        elems = draw(_cached(("bytes", count), lambda: st.lists(_BYTES_ELEMENTS, min_size=count, max_size=count)))
        t["raw"] = b"".join(len(e).to_bytes(4, "little") + e for e in elems)
    elif form == "junk":
        t["data"] = draw(_docs)
    else:
        el = _element(datatype if datatype in DATATYPES else "FP32")
        n = draw(_ints(0, 6)) if bad(6) else count
        if n > 6 and datatype in _np_types:  # many elements: one draw of bytes, numpy makes the values (fast)
            itemsize = np.dtype(_np_types[datatype]).itemsize
            flat = _values(datatype, draw(_binary(n * itemsize, n * itemsize)))
        else:
            flat = draw(_cached(("list", datatype, n), lambda: st.lists(el, min_size=n, max_size=n)))
        if form == "nested" and len(shape) == 2 and shape[1] and n == count:
            flat = [flat[i:i + shape[1]] for i in range(0, n, shape[1])]
        t["data"] = flat
    if bad(12):
        t["data"], t["raw"] = [], b""  # both forms: invalid
    return t


def _values(datatype: str, raw: bytes) -> list:
    """Python values of the ``datatype`` elements in ``raw`` (any bit pattern: NaN, inf, extremes)."""
    if datatype == "BOOL":
        return [bool(x & 1) for x in raw]
    if datatype == "BF16":
        import ml_dtypes

        return np.frombuffer(raw, "<u2").view(ml_dtypes.bfloat16).astype(np.float32).tolist()
    return np.frombuffer(raw, _np_types[datatype]).tolist()


_np_types = {"BOOL": "?", "UINT8": "u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8", "INT8": "i1",
             "INT16": "<i2", "INT32": "<i4", "INT64": "<i8", "FP16": "<f2", "BF16": "<u2", "FP32": "<f4",
             "FP64": "<f8"}


@st.composite
def _request(draw, meta: dict):
    names = sorted(meta)
    model = draw(_sampled(*names, "nosuchmodel"))
    kind = draw(_sampled(*["oip"] * 6, "doc", "bytes", "json"))
    headers = {}
    if draw(_BOOLS):
        headers["Inferbus-Timeout-Ms"] = draw(_TIMEOUT_VALUES)
    if draw(_BOOLS):
        headers["Inferbus-Request-Id"] = draw(_HEADER_VALUE)
    if not draw(_ints(0, 4)):
        headers["Inferbus-Client-Id"] = draw(_HEADER_VALUE)
    if not draw(_ints(0, 5)):
        headers["Inferbus-Hedge"] = draw(_HEDGE_VALUES)
    if not draw(_ints(0, 8)):
        headers["traceparent"] = draw(_HEADER_VALUE)
    version = None
    if model in meta and not draw(_ints(0, 8)):
        version = draw(_sampled(*meta[model].versions, "99", "x"))
    if kind == "bytes":
        return model, version, draw(_binary(0, 64)), headers
    if kind == "doc":
        return model, version, msgpack.packb(draw(_docs), use_bin_type=True), headers
    md = meta.get(model) or meta[names[0]]
    valid = draw(_ints(0, 2)) == 0  # a third are well-formed requests (answers are checked)
    rows = draw(_ints(0, 4))
    req = {"inputs": [draw(_tensor(info, valid, rows)) for info in md.inputs]}
    if not valid and not draw(_ints(0, 5)):
        req["inputs"] = draw(st.permutations(req["inputs"]))[: draw(_ints(0, len(req["inputs"])))]
    if draw(_BOOLS):
        req["id"] = draw(_REQUEST_IDS)
    if not draw(_ints(0, 3)):
        outs = [o.name for o in md.outputs] + ["nope"]
        req["outputs"] = [{"name": n} for n in draw(_cached(("outs", md.name), lambda: st.lists(st.sampled_from(outs), max_size=3)))]
    if not draw(_ints(0, 6)):
        req["parameters"] = draw(_PARAMETERS)
    if kind == "json":
        headers["Content-Type"] = "application/json"
        try:
            body = json.dumps(req, default=lambda o: o.decode("latin-1") if isinstance(o, bytes) else str(o)).encode()
        except (TypeError, ValueError):
            body = b"{"
        return model, version, body, headers
    if not draw(_ints(0, 10)):
        headers["Content-Type"] = draw(_sampled("application/json", "text/plain", "application/msgpack"))
    return model, version, msgpack.packb(req, use_bin_type=True), headers


# ---- checks -------------------------------------------------------------------------------------------------------
def _expected(model: str, version, body: bytes, ct) -> dict | None:
    """The in-process answer for a request the server accepted (decoded the same way)."""
    req = decode_request(body, ct)
    feeds = {}
    for i, t in enumerate(req.inputs):
        arr = input_to_numpy(t, field=f"inputs[{i}]")
        if arr.dtype == object:
            arr = np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(arr) if arr.size else arr
        feeds[t.name] = arr
    ref = reference(model, feeds, version or "1")
    if req.outputs:
        ref = {o.name: ref[o.name] for o in req.outputs}
    return ref


async def _send(nc, prefix, meta, model, version, body, headers):
    subject = f"{prefix}.infer.{model}" + (f".{version}" if version else "")
    msg = await nc.request(subject, body, timeout=10, headers=headers or None)
    err = decode_error(msg.headers, msg.data)
    if err is not None:
        assert err.code in ErrorCode and err.code is not ErrorCode.INTERNAL, (err, body[:200], headers)
        return err.code.value
    resp = decode_response(msg.data, (msg.headers or {}).get("Content-Type"))
    ref = _expected(model, version, body, headers.get("Content-Type"))
    got = {o.name: output_to_numpy(o, field="outputs") for o in resp.outputs}
    assert set(got) == set(ref), (set(got), set(ref))
    for k, v in ref.items():
        g = got[k]
        if v.dtype == object:
            assert [x if isinstance(x, bytes) else x.encode() for x in g.ravel()] == \
                   [x.encode() if isinstance(x, str) else x for x in v.ravel()]
        else:
            np.testing.assert_allclose(g.astype(np.float64), v.astype(np.float64), rtol=1e-5, atol=1e-5,
                                       equal_nan=True)
    return "ok"


@st.composite
def _forged_forward(draw, meta: dict):
    """A message on a worker subject that did not come from an ingress."""
    model = draw(_sampled(*sorted(meta)))
    h = {"Inferbus-Msg": draw(_sampled(FORWARD_TAG, FORWARD_TAG, "inferbus.v0.forward", "")),
         "Inferbus-Model": model if draw(_ints(0, 5)) else draw(_header_text),
         "Inferbus-Version": draw(_sampled(*meta[model].versions, "9")),
         "Inferbus-Seq": draw(_SEQ_VALUES),
         "Inferbus-Timeout-Ms": draw(_sampled("500", "0", "x", "-1", "1e9"))}
    if draw(_BOOLS):
        h["Inferbus-Ingress"] = draw(_INGRESS_ID)
    if draw(_BOOLS):
        h["Inferbus-Request-Id"] = draw(_HEADER_VALUE)
    if draw(_BOOLS):
        h["Inferbus-Cache-Key"] = draw(_HEADER_VALUE)
    body = msgpack.packb({"inputs": [draw(_tensor(i)) for i in meta[model].inputs]}, use_bin_type=True) \
        if draw(_ints(0, 3)) else draw(_binary(0, 40))
    return {k: v for k, v in h.items() if v.strip()}, body


def _actor_pids(lp, client, reports) -> tuple:
    async def get():
        await asyncio.sleep(0.3)
        h = await client.health()
        return h.parameters["pid"], {w: s["pid"] for w, s in h.parameters["workers"].items() if s["health"] != "down"}
    return lp.run(get())


def _fuzz(bus, n_requests: int, batch: int = 20):
    """Send at least ``n_requests`` fuzzed requests, ``batch`` at once per hypothesis example (one example's
    requests are in flight together), plus up to one forged worker message per example."""
    lp, nc, client, meta, reports, prefix = bus
    before = _actor_pids(lp, client, reports)
    outcomes: dict[str, int] = {}
    forged_sent = [0]
    workers = sorted(before[1])

    @settings(max_examples=-(-n_requests // batch), deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(_request(meta), min_size=batch, max_size=batch), st.lists(_forged_forward(meta), max_size=1),
           st.randoms(use_true_random=False))
    def example(requests, forged, rnd):
        async def go():
            rs = await asyncio.gather(*(_send(nc, prefix, meta, *r) for r in requests))
            for h, body in forged:  # worker subjects: typed error or answer, never a crash
                msg = await nc.request(f"{prefix}._w.{rnd.choice(workers)}", body, timeout=10, headers=h)
                err = decode_error(msg.headers, msg.data)
                assert err is None or err.code is not ErrorCode.INTERNAL, (err, h)
                forged_sent[0] += 1
            return rs
        for r in lp.run(go()):
            outcomes[r] = outcomes.get(r, 0) + 1

    t0 = time.perf_counter()
    example()
    elapsed = time.perf_counter() - t0
    after = _actor_pids(lp, client, reports)
    assert after == before, f"an actor died: {before} -> {after}"
    assert all(max(p) == min(p) for p in reports.pids.values()), reports.pids
    total = sum(outcomes.values())
    print(f"fuzz: {total} requests (+ {forged_sent[0]} forged worker messages) in {elapsed:.1f}s, "
          f"outcomes {dict(sorted(outcomes.items()))}; 0 actor deaths")
    assert total >= n_requests, total  # hypothesis ran every example
    assert outcomes.get("ok", 0) > total * 0.05  # the generator produces valid requests too
    return outcomes


def test_fuzz_10k_requests_typed_errors_or_correct_answers(bus):
    _fuzz(bus, 10_000)
