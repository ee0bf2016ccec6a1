"""Tests for inferbus.schemas: wire structs, codecs, tensor conversion, errors.

No servers needed. Property tests cover every OIP datatype in both encodings
(MessagePack, JSON) and both tensor forms (data, raw), zero-size shapes included.
"""

from __future__ import annotations

import json
import math
import pickle
import subprocess
import sys
import tracemalloc

import ml_dtypes
import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import inferbus.schemas as schemas
from inferbus.schemas import (
    DATATYPES,
    JSON,
    MSGPACK,
    ErrorCode,
    ErrorReply,
    Health,
    InferbusError,
    InferRequest,
    InferResponse,
    Internal,
    InvalidArgument,
    ModelList,
    ModelMetadata,
    RequestedOutput,
    RequestInput,
    ResponseOutput,
    ShmRef,
    TensorMetadata,
    Unavailable,
    datatype_of,
    decode,
    decode_error,
    decode_request,
    decode_response,
    encode,
    encode_error,
    encode_request,
    encode_response,
    error_class,
    input_from_numpy,
    input_to_numpy,
    is_json,
    numpy_dtype,
    output_from_numpy,
    output_to_numpy,
    tensor_nbytes,
)

pytestmark = pytest.mark.timeout(60)

ENCODINGS = [MSGPACK, JSON]
BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = {"FP16", "BF16", "FP32", "FP64"}


# ---------------------------------------------------------------- helpers


def req_of(*inputs: RequestInput, **kw) -> InferRequest:
    return InferRequest(inputs=list(inputs), **kw)


def decode_input(body: bytes, ct: str | None = None, i: int = 0) -> np.ndarray:
    req = decode_request(body, ct)
    return input_to_numpy(req.inputs[i], field=f"inputs[{i}]")


def raises_field(field: str | None, fn, /, *args, **kw) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as info:
        fn(*args, **kw)
    assert info.value.field == field, (info.value.field, str(info.value))
    assert info.value.code is ErrorCode.INVALID_ARGUMENT
    return info.value


def assert_same(a: np.ndarray, b: np.ndarray, *, bitwise: bool) -> None:
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    if a.dtype == object:
        assert a.ravel().tolist() == b.ravel().tolist()
        assert all(type(x) is bytes for x in b.ravel().tolist())
    elif bitwise:
        assert a.tobytes() == b.tobytes()
    elif a.dtype == BF16 or a.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            fa, fb = a.astype(np.float64), b.astype(np.float64)
        assert np.array_equal(fa, fb, equal_nan=True)
        finite = ~np.isnan(fa)  # JSON's "NaN" has no sign; -0.0 and -inf keep theirs
        assert np.array_equal(np.signbit(fa[finite]), np.signbit(fb[finite]))
    else:
        assert np.array_equal(a, b)


shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@st.composite
def arrays_of(draw, datatype: str, *, utf8_only: bool = False) -> np.ndarray:
    shape = draw(shapes)
    if datatype == "BYTES":
        n = math.prod(shape)
        if utf8_only:
            elem = st.text(max_size=8).map(lambda s: s.encode("utf-8"))
        else:
            elem = st.binary(max_size=8)
        values = draw(st.lists(elem, min_size=n, max_size=n))
        out = np.empty(n, dtype=object)
        out[:] = values
        return out.reshape(shape)
    if datatype == "BF16":  # every bit pattern: NaNs, infinities, subnormals, -0
        return draw(hnp.arrays(np.uint16, shape)).view(BF16)
    return draw(hnp.arrays(numpy_dtype(datatype), shape))


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("form", ["data", "raw"])
@pytest.mark.parametrize("ct", ENCODINGS)
@pytest.mark.parametrize("datatype", DATATYPES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip_every_datatype(datatype, ct, form, data):
    raw = form == "raw"
    # JSON carries BYTES data as text: only UTF-8 elements can take that path
    # (non-UTF-8 is tested below: raw works, data is refused).
    arr = data.draw(arrays_of(datatype, utf8_only=(ct == JSON and not raw)))
    assert datatype_of(arr.dtype) == datatype
    # floats in data form keep values, -0.0, inf, NaN-ness (not NaN payloads)
    bitwise = raw or datatype not in FLOATS

    # request: numpy -> RequestInput -> bytes -> RequestInput -> numpy
    req = req_of(input_from_numpy("x", arr, raw=raw), id="r-1")
    back = decode_input(encode_request(req, ct), ct)
    assert_same(arr, back, bitwise=bitwise)

    # response: numpy -> ResponseOutput -> bytes -> ResponseOutput -> numpy
    resp = InferResponse(model_name="m", outputs=[output_from_numpy("y", arr, raw=raw)])
    got = decode_response(encode_response(resp, ct), ct)
    assert got.model_name == "m" and got.outputs[0].name == "y"
    assert_same(arr, output_to_numpy(got.outputs[0], field="outputs[0]"), bitwise=bitwise)


@pytest.mark.parametrize("ct", ENCODINGS)
def test_round_trip_explicit_zero_size(ct):
    for datatype in DATATYPES:
        arr = np.empty((1, 0, 64), dtype=numpy_dtype(datatype))
        for raw in (True, False):
            t = input_from_numpy("x", arr, raw=raw)
            back = decode_input(encode_request(req_of(t), ct), ct)
            assert back.shape == (1, 0, 64) and back.dtype == arr.dtype


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(max_size=6), min_size=1, max_size=6))
def test_bytes_non_utf8(values):
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    # msgpack: data (list of bin) and raw both carry any bytes
    for raw in (True, False):
        body = encode_request(req_of(input_from_numpy("b", arr, raw=raw)))
        assert decode_input(body).tolist() == values
    # JSON: raw (base64 of the length-prefixed form) carries any bytes
    body = encode_request(req_of(input_from_numpy("b", arr, raw=True)), JSON)
    assert decode_input(body, JSON).tolist() == values


def test_bytes_non_utf8_json_data_is_refused_not_mangled():
    arr = np.array([b"ok", b"\xff\xfe"], dtype=object)
    req = req_of(input_from_numpy("b", arr, raw=False))
    err = raises_field("inputs[0].data", encode_request, req, JSON)
    assert "raw" in err.message
    # the caller's request is untouched
    assert req.inputs[0].data == [b"ok", b"\xff\xfe"]


def test_bytes_forms():
    one = RequestInput(name="s", datatype="BYTES", shape=[1], data="hé")
    assert input_to_numpy(one, field="inputs[0]").tolist() == ["hé".encode()]
    bare = RequestInput(name="s", datatype="BYTES", shape=[], data=b"\x00\xff")
    assert input_to_numpy(bare, field="inputs[0]").tolist() == b"\x00\xff"
    mixed = RequestInput(name="s", datatype="BYTES", shape=[2], data=[b"a", "b"])
    assert input_to_numpy(mixed, field="inputs[0]").tolist() == [b"a", b"b"]
    # OIP binary form: uint32 LE length before each element
    raw = b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x01\x00\x00\x00\xff"
    t = RequestInput(name="s", datatype="BYTES", shape=[3], raw=raw)
    assert input_to_numpy(t, field="inputs[0]").tolist() == [b"ab", b"", b"\xff"]
    elems = np.array([b"ab", b"", b"\xff"], dtype=object)
    assert output_from_numpy("s", elems, raw=True).raw == raw
    for bad in (raw[:-1], raw + b"\x00", b"\x02\x00"):
        t = RequestInput(name="s", datatype="BYTES", shape=[3], raw=bad)
        raises_field("inputs[0].raw", input_to_numpy, t, field="inputs[0]")
    # a huge claimed element count is refused before anything is allocated
    huge = RequestInput(name="s", datatype="BYTES", shape=[2**20, 2**20], raw=b"\x00" * 8)
    raises_field("inputs[0].raw", input_to_numpy, huge, field="inputs[0]")
    raises_field("inputs[0].raw", decode_request, encode_request(req_of(huge)))
    t = RequestInput(name="s", datatype="BYTES", shape=[2], data=[b"a", 3])
    raises_field("inputs[0].data", input_to_numpy, t, field="inputs[0]")


# ---------------------------------------------------------------- data form


@settings(max_examples=40, deadline=None)
@given(
    datatype=st.sampled_from(["FP32", "INT64", "BOOL", "BYTES", "UINT8"]),
    data=st.data(),
)
def test_nested_and_flat_data_give_the_same_array(datatype, data):
    arr = data.draw(arrays_of(datatype))
    nested = arr.tolist()
    flat = arr.ravel().tolist()
    a = input_to_numpy(RequestInput("x", datatype, list(arr.shape), data=nested), field="i")
    b = input_to_numpy(RequestInput("x", datatype, list(arr.shape), data=flat), field="i")
    assert_same(a, b, bitwise=True)
    assert_same(arr, a, bitwise=datatype != "FP32")


def test_nested_data_wire():
    for ct in ENCODINGS:
        body = encode_request(
            req_of(RequestInput("x", "INT32", [2, 3], data=[[1, 2, 3], [4, 5, 6]])), ct
        )
        assert decode_input(body, ct).tolist() == [[1, 2, 3], [4, 5, 6]]


@pytest.mark.parametrize(
    "shape,data",
    [
        ([2, 3], [[1, 2, 3], [4, 5]]),  # ragged
        ([2, 3], [[1, 2], [3, 4], [5, 6], [7, 8]]),  # wrong outer length
        ([2, 3], [[[1], [2], [3]], [[4], [5], [6]]]),  # nested too deep
        ([3], [[1], [2], [3]]),  # nested too deep, flat length right
        ([2, 2], [1, 2, [3], 4]),  # a list among flat elements
        ([2, 3], 7),  # scalar for many elements
        ([2, 3], {"a": 1}),
    ],
)
def test_wrong_nesting_names_the_data_field(shape, data):
    t = RequestInput("x", "INT32", shape, data=data)
    raises_field("inputs[0].data", input_to_numpy, t, field="inputs[0]")
    # and through the wire: decode already rejects what it can see cheaply
    for ct in ENCODINGS:
        body = encode_request(req_of(t), ct)
        raises_field("inputs[0].data", decode_input, body, ct)


def test_bytes_under_data_point_at_raw():
    """A fresh-user trial put a tensor's MessagePack bytes under ``data`` and read only ``... got bytes``: the
    message now says where bytes go."""
    t = RequestInput("x", "FP32", [1, 4], data=np.zeros(4, np.float32).tobytes())
    err = raises_field("inputs[0].data", input_to_numpy, t, field="inputs[0]")
    assert "got bytes; a tensor's bytes go in `raw` (row-major, little-endian), not `data`" in err.message, err.message


def test_wrong_nesting_message_points_at_the_element():
    t = RequestInput("x", "INT32", [2, 3], data=[[1, 2, 3], [4, 5]])
    err = raises_field("x.data", input_to_numpy, t, field="x")
    assert "data[1]" in err.message and "list of 3" in err.message


@pytest.mark.parametrize(
    "datatype,value",
    [
        ("UINT8", 300),
        ("UINT8", -1),
        ("INT8", 128),
        ("UINT64", -1),
        ("UINT64", 2**64),
        ("INT64", 2**63),
        ("INT32", 2.5),
        ("INT32", float("nan")),
        ("INT32", float("inf")),
        ("INT32", "abc"),
        ("INT32", True),
        ("INT32", None),
        ("BOOL", 1),
        ("BOOL", "true"),
        ("FP32", "abc"),
        ("FP32", True),
        ("FP32", None),
        ("FP64", 10**400),
        ("BYTES", 5),
    ],
)
def test_bad_elements_are_rejected(datatype, value):
    data = [True, value] if datatype == "BOOL" else [value, value]
    t = RequestInput("x", datatype, [2], data=data)
    err = raises_field("inputs[3].data", input_to_numpy, t, field="inputs[3]")
    assert "element" in err.message


def test_good_elements_are_accepted():
    def conv(datatype, data, shape=None):
        shape = [len(data)] if shape is None else shape
        return input_to_numpy(RequestInput("x", datatype, shape, data=data), field="i")

    assert conv("INT32", [3.0, -2]).tolist() == [3, -2]
    assert conv("UINT64", [2**64 - 1, 0]).tolist() == [2**64 - 1, 0]
    assert conv("INT64", [-(2**63), 2**63 - 1]).tolist() == [-(2**63), 2**63 - 1]
    assert conv("BOOL", [True, False]).tolist() == [True, False]
    assert conv("FP32", [1, 2.5]).tolist() == [1.0, 2.5]
    assert conv("FP32", 4, shape=[]).tolist() == 4.0  # bare scalar, prod(shape) == 1
    assert conv("INT8", [7], shape=[1, 1]).tolist() == [[7]]
    nf = conv("FP64", ["NaN", "Infinity", "-Infinity", 1])
    assert math.isnan(nf[0]) and nf[1] == math.inf and nf[2] == -math.inf


def test_fp16_rounding_rule():
    """Round to nearest, ties to even, once, from the float64 value (IEEE 754)."""
    vals = [65504.0, 65519.99, 65520.0, -65520.0, 1e6, 1e-8, 2.98e-8, 3e-8, 2**-24, -0.0, math.nan]
    got = input_to_numpy(RequestInput("x", "FP16", [len(vals)], data=vals), field="i")
    expected = [65504.0, 65504.0, math.inf, -math.inf, math.inf, 0.0, 0.0, 2**-24, 2**-24, -0.0]
    assert got.astype(np.float64)[:-1].tolist() == expected
    assert math.isnan(got[-1])
    assert np.signbit(got[9])
    # ties to even: 2049 lies halfway between 2048 and 2050 -> 2048; 2051 -> 2052
    got = input_to_numpy(RequestInput("x", "FP16", [2], data=[2049, 2051]), field="i")
    assert got.tolist() == [2048.0, 2052.0]


def test_bf16_rounding_is_single():
    # 1 + 2**-8 is a BF16 tie; a hair above it must round up (a float32 detour would
    # round it to the tie and then to even, 1.0).
    vals = [1 + 2**-8 + 2**-30, 1 + 2**-8, 1 + 3 * 2**-8, 3.4e38, -1e-45, 1e39]
    got = input_to_numpy(RequestInput("x", "BF16", [len(vals)], data=vals), field="i")
    assert got.dtype == BF16
    assert got.astype(np.float64).tolist()[:4] == [1.0078125, 1.0, 1.015625, math.inf]
    assert got[4] == 0 and np.signbit(got.astype(np.float32)[4])
    assert got.astype(np.float64)[5] == math.inf


# ---------------------------------------------------------------- raw form


def test_fp32_raw_is_zero_copy_little_endian():
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = input_from_numpy("x", arr)
    assert t.raw == arr.astype("<f4").tobytes()
    back = input_to_numpy(t, field="inputs[0]")
    assert np.shares_memory(back, np.frombuffer(t.raw, dtype=np.uint8))
    assert not back.flags.writeable
    # big-endian input is written little-endian
    big = arr.astype(">f4")
    assert input_from_numpy("x", big).raw == t.raw
    # non-contiguous input is written row-major
    assert input_from_numpy("x", arr.T).raw == np.ascontiguousarray(arr.T).tobytes()


def test_wrong_raw_length_names_the_raw_field():
    t = RequestInput("x", "FP32", [2, 3], raw=b"\x00" * 23)
    err = raises_field("inputs[0].raw", input_to_numpy, t, field="inputs[0]")
    assert "24" in err.message and "23" in err.message
    for ct in ENCODINGS:
        err = raises_field("inputs[0].raw", decode_request, encode_request(req_of(t), ct), ct)
        assert "24" in err.message and "23" in err.message


def test_bool_raw_must_be_0_or_1():
    ok = RequestInput("x", "BOOL", [3], raw=b"\x00\x01\x01")
    assert input_to_numpy(ok, field="i").tolist() == [False, True, True]
    bad = RequestInput("x", "BOOL", [3], raw=b"\x00\x02\x01")
    raises_field("i.raw", input_to_numpy, bad, field="i")


def test_bf16_is_never_reinterpreted():
    raw = bytes.fromhex("803f")  # BF16 1.0 (0x3f80); as FP16 it would be 1.875
    t = RequestInput("x", "BF16", [1], raw=raw)
    got = input_to_numpy(t, field="i")
    assert got.dtype == BF16 and float(got[0]) == 1.0
    assert numpy_dtype("BF16") == BF16
    assert datatype_of(BF16) == "BF16"
    assert datatype_of(np.float16) == "FP16" and datatype_of(np.uint16) == "UINT16"
    out = output_from_numpy("y", np.array([1.0, -2.5], dtype=BF16), raw=True)
    assert out.datatype == "BF16" and out.raw == bytes.fromhex("803f20c0")
    out = output_from_numpy("y", np.array([1.0, -2.5], dtype=BF16), raw=False)
    assert out.datatype == "BF16" and out.data == [1.0, -2.5]


# ---------------------------------------------------------------- datatypes


def test_datatype_table():
    assert DATATYPES == (
        "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
        "INT64", "FP16", "BF16", "FP32", "FP64", "BYTES",
    )  # fmt: skip
    for d in DATATYPES:
        assert datatype_of(numpy_dtype(d)) == d
    assert numpy_dtype("BYTES") == np.dtype(object)
    assert numpy_dtype("BOOL") == np.dtype(np.bool_)
    assert datatype_of(np.dtype("S3")) == "BYTES" and datatype_of(np.dtype("U3")) == "BYTES"
    assert tensor_nbytes("FP32", [2, 3]) == 24
    assert tensor_nbytes("BF16", [1, 0, 64]) == 0
    assert tensor_nbytes("UINT64", []) == 8
    for bad in ("FP8", "fp32", "", None):
        raises_field(None, numpy_dtype, bad)
    for bad in (np.complex64, np.float128 if hasattr(np, "float128") else np.complex128, "M8[s]"):
        raises_field(None, datatype_of, bad)
    raises_field(None, tensor_nbytes, "BYTES", [1])
    raises_field(None, tensor_nbytes, "FP32", [-1])


def test_unknown_datatype():
    for ct in ENCODINGS:
        body = encode(
            {"inputs": [{"name": "x", "datatype": "FP8", "shape": [1], "data": [1]}]}, ct
        )
        err = raises_field("inputs[0].datatype", decode_request, body, ct)
        assert "FP8" in err.message and "FP32" in err.message
    t = RequestInput("x", "FP8", [1], data=[1])  # built in Python, not validated
    raises_field("inputs[0].datatype", input_to_numpy, t, field="inputs[0]")


def test_shape_checks():
    for ct in ENCODINGS:
        for shape, field in (("abc", "inputs[0].shape"), ([1, -2], "inputs[0].shape[1]"),
                             ([1.5], "inputs[0].shape[0]"), ([True], "inputs[0].shape[0]")):
            body = encode({"inputs": [{"name": "x", "datatype": "FP32", "shape": shape}]}, ct)
            err = raises_field(field, decode_request, body, ct)
            assert field in err.message
    t = RequestInput("x", "FP32", [2, -1], data=[1.0, 2.0])
    raises_field("i.shape", input_to_numpy, t, field="i")
    # metadata allows -1 (variable dimension) but nothing below
    meta = TensorMetadata("x", "FP32", [-1, 64])
    assert decode(encode(meta), TensorMetadata) == meta
    raises_field("shape[0]", decode, encode({"name": "x", "datatype": "FP32", "shape": [-2]}),
                 TensorMetadata)


def test_presence_rules():
    none = RequestInput("x", "FP32", [1])
    both = RequestInput("x", "FP32", [1], data=[1.0], raw=b"\x00" * 4)
    shm = RequestInput("x", "FP32", [1], shm=ShmRef(region="r", byte_size=4))
    raises_field("inputs[0]", input_to_numpy, none, field="inputs[0]")
    raises_field("inputs[0]", input_to_numpy, both, field="inputs[0]")
    err = raises_field("inputs[0].shm", input_to_numpy, shm, field="inputs[0]")
    assert "shm not supported" in err.message
    for ct in ENCODINGS:
        raises_field("inputs[0]", decode_request, encode_request(req_of(none), ct), ct)
        raises_field("inputs[0]", decode_request, encode_request(req_of(both), ct), ct)
        got = decode_request(encode_request(req_of(shm), ct), ct)
        assert got.inputs[0].shm == ShmRef(region="r", offset=0, byte_size=4)
        bad = RequestInput("x", "FP32", [2], shm=ShmRef(region="r", byte_size=4))
        raises_field("inputs[0].shm.byte_size", decode_request, encode_request(req_of(bad), ct), ct)
        one = RequestInput("x", "FP32", [1], data=[1.0])
        dup = req_of(one, one)
        raises_field("inputs[1].name", decode_request, encode_request(dup, ct), ct)


# ---------------------------------------------------------------- codec errors


def test_wrong_field_type_names_the_field():
    for ct in ENCODINGS:
        body = encode({"inputs": [{"name": "x", "datatype": "FP32", "shape": "abc"}]}, ct)
        err = raises_field("inputs[0].shape", decode_request, body, ct)
        assert "inputs[0].shape" in err.message and "array" in err.message
        body = encode({"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]}, ct)
        raises_field("inputs[0].name", decode_request, body, ct)
        raises_field("inputs", decode_request, encode({"id": "x"}, ct), ct)
        raises_field("body", decode_request, encode([1, 2], ct), ct)
        raises_field("id", decode_request, encode({"inputs": [], "id": 5}, ct), ct)
        body = encode({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "raw": 5}]}, ct)
        raises_field("inputs[0].raw", decode_request, body, ct)
    raises_field("inputs[0].raw", decode_request,
                 b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"raw":"!!"}]}', JSON)


_X = {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}


@pytest.mark.parametrize("ct", ENCODINGS)
@pytest.mark.parametrize("bad", [[1, 2], {"b": 1}, None], ids=["list", "map", "null"])
def test_a_refused_parameter_value_names_its_key(ct, bad):
    """msgspec's path for a map's value is ``parameters[...]``; the field names the key, as the SDK's own check
    does, in the request's, an input's and a requested output's parameters, whichever key came first."""
    good = {"a": 1, "b": "s", "c": True, "d": 0.5}
    cases = [
        ({"inputs": [_X], "parameters": {**good, "temperature": bad, "z": 1}}, 'parameters["temperature"]'),
        ({"inputs": [_X, {**_X, "name": "y", "parameters": {**good, "k": bad}}]}, 'inputs[1].parameters["k"]'),
        ({"inputs": [_X], "outputs": [{"name": "o"}, {"name": "p", "parameters": {'q"\\é': bad}}]},
         'outputs[1].parameters["q\\"\\\\é"]'),  # the key as a JSON string
    ]
    for req, field in cases:
        err = raises_field(field, decode_request, encode(req, ct), ct)
        assert err.message.startswith(f"invalid request: {field}: Expected `bool | int | float | str`"), err.message
        assert "a string, a number or a boolean" in err.message, err.message
    body = b"\xef\xbb\xbf" + encode(cases[0][0], ct)  # a JSON body's byte order mark is skipped on the way
    if ct == JSON:
        raises_field('parameters["temperature"]', decode_request, body, ct)


def test_a_parameter_name_that_is_no_string_names_the_parameters_map():
    """Only MessagePack can send one (JSON's names are strings): the field is the map, not ``body``, and the
    message says the name; a non-string key elsewhere names the map holding it."""
    cases = [
        ({"inputs": [_X], "parameters": {"a": 1, 7: 1}}, "parameters", "got 7 (a MessagePack int)"),
        ({"inputs": [{**_X, "parameters": {(1, 2): 1}}]}, "inputs[0].parameters", "got (1, 2) (a MessagePack array)"),
        ({"inputs": [_X], "outputs": [{"name": "o", "parameters": {b"k": 1}}]}, "outputs[0].parameters",
         "got b'k' (a MessagePack bin)"),
        ({"inputs": [_X], "parameters": {None: 1}}, "parameters", "got None (a MessagePack nil)"),
    ]
    for req, field, said in cases:
        err = raises_field(field, decode_request, msgpack.packb(req))
        assert "a map key is not a string" in err.message and said in err.message, err.message
    err = raises_field("inputs[0]", decode_request, msgpack.packb({"inputs": [{**_X, 5: 1}]}))
    assert "a map key is not a string (Expected `str`, got `int`)" in err.message, err.message
    raises_field("body", decode_request, msgpack.packb({"inputs": [_X], 5: 1}))


def test_malformed_and_empty_bodies():
    raises_field("body", decode_request, b"")
    raises_field("body", decode_request, b"", JSON)
    raises_field("body", decode_request, b"\x81\xa6inputs")  # truncated
    raises_field("body", decode_request, b"{not json", JSON)
    raises_field("body", decode_request, encode(req_of()) + b"\x00")  # trailing bytes
    raises_field("body", decode_response, b"")
    err = raises_field("body", decode_request, b"\xc1")  # never-used msgpack byte
    assert "MessagePack" in err.message


def test_forged_length_header_is_rejected_without_allocating():
    head = b"\x81\xa6inputs\x91\x84\xa4name\xa1x\xa8datatype\xa4FP32\xa5shape\x91\x01"
    forged = {
        "bin32 4 GiB raw": head + b"\xa3raw\xc6\xff\xff\xff\xff" + b"abc",
        "str32 4 GiB data": head + b"\xa4data\xdb\xff\xff\xff\xff" + b"abc",
        "array32 4G data": head + b"\xa4data\xdd\xff\xff\xff\xff" + b"\x01",
        "map32 4G data": head + b"\xa4data\xdf\xff\xff\xff\xff" + b"\x01",
        "ext32 4 GiB data": head + b"\xa4data\xc9\xff\xff\xff\xff\x01" + b"abc",
        "array32 4G inputs": b"\x81\xa6inputs\xdd\xff\xff\xff\xff",
    }
    # positive control: tracemalloc does see what the decoder allocates
    big = encode_request(req_of(RequestInput("x", "UINT8", [8 << 20], raw=bytes(8 << 20))))
    tracemalloc.start()
    try:
        decode_request(big)
        _, peak = tracemalloc.get_traced_memory()
        assert peak >= 8 << 20
        for name, body in forged.items():
            tracemalloc.reset_peak()
            # (4G inputs: refused by MAX_TENSORS from the array's header, before the truncation is seen)
            raises_field("inputs" if name == "array32 4G inputs" else "body", decode_request, body)
            _, peak = tracemalloc.get_traced_memory()
            assert peak < 1 << 20, (name, peak)
    finally:
        tracemalloc.stop()


def test_content_type_selection():
    assert not is_json(None) and not is_json("") and not is_json(MSGPACK)
    assert is_json(JSON) and is_json("application/json; charset=utf-8")
    assert is_json("Application/JSON") and is_json("application/vnd.api+json")
    assert not is_json("text/plain")
    req = req_of(RequestInput("x", "INT32", [1], data=[7]))
    body = encode_request(req, "application/json; charset=utf-8")
    assert body.startswith(b"{")
    assert decode_input(body, "application/json;charset=UTF-8").tolist() == [7]
    assert decode_input(memoryview(encode_request(req))).tolist() == [7]


def test_unknown_fields_are_ignored_and_defaults_omitted():
    body = encode({"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [1],
                               "future": 1}], "extension": {"a": 1}})
    assert decode_input(body).tolist() == [1]
    plain = msgpack.unpackb(encode_request(req_of(RequestInput("x", "INT8", [1], data=[1]))))
    assert plain == {"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [1]}]}


def test_encode_errors_are_invalid_argument():
    raises_field(None, encode, {"x": object()})
    raises_field(None, encode, {"x": 2**70})
    # numpy values are encoded as plain numbers / lists
    assert msgpack.unpackb(encode({"a": np.float32(1.5), "b": np.arange(3)})) == {
        "a": 1.5, "b": [0, 1, 2]}


# ---------------------------------------------------------------- reference clients


def test_plain_msgpack_client_contract():
    """A client using only the reference msgpack package and plain dicts works."""
    x = np.arange(6, dtype="<f4").reshape(2, 3)
    body = msgpack.packb({
        "id": "req-7",
        "parameters": {"priority": 1},
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [2, 3], "raw": x.tobytes()},
            {"name": "n", "datatype": "INT64", "shape": [2, 2], "data": [[1, -2], [3, 2**40]]},
            {"name": "s", "datatype": "BYTES", "shape": [2], "data": [b"\x00\xff", "text"]},
            {"name": "b", "datatype": "BOOL", "shape": [3], "data": [True, False, True]},
            {"name": "h", "datatype": "BF16", "shape": [2], "raw": bytes.fromhex("803f0040")},
        ],
        "outputs": [{"name": "y"}],
    }, use_bin_type=True)
    req = decode_request(body)
    assert req.id == "req-7" and req.parameters == {"priority": 1}
    assert req.outputs == [RequestedOutput("y")]
    arrs = [input_to_numpy(t, field=f"inputs[{i}]") for i, t in enumerate(req.inputs)]
    assert np.array_equal(arrs[0], x) and arrs[0].dtype == np.float32
    assert arrs[1].tolist() == [[1, -2], [3, 2**40]] and arrs[1].dtype == np.int64
    assert arrs[2].tolist() == [b"\x00\xff", b"text"]
    assert arrs[3].tolist() == [True, False, True]
    assert arrs[4].dtype == BF16 and arrs[4].astype(np.float32).tolist() == [1.0, 2.0]

    # and our response is plain msgpack to that client
    resp = InferResponse(
        model_name="mlp", model_version="3", id="req-7",
        outputs=[output_from_numpy("y", np.array([[0.5, 1.5]], np.float32), raw=True),
                 output_from_numpy("z", np.array([1, 2], np.int32), raw=False)],
        parameters={"worker_id": "w1", "cache_hit": False, "total_us": 120},
    )
    plain = msgpack.unpackb(encode_response(resp))
    assert plain["model_name"] == "mlp" and plain["model_version"] == "3"
    assert plain["outputs"][0] == {"name": "y", "datatype": "FP32", "shape": [1, 2],
                                   "raw": np.array([0.5, 1.5], "<f4").tobytes()}
    assert plain["outputs"][1] == {"name": "z", "datatype": "INT32", "shape": [2], "data": [1, 2]}
    assert plain["parameters"]["total_us"] == 120


def test_plain_json_client_contract():
    body = json.dumps({
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [[1, 2.5]]},
            {"name": "r", "datatype": "INT16", "shape": [2], "raw": "AQD//w=="},  # 1, -1
            {"name": "s", "datatype": "BYTES", "shape": [1], "data": ["héllo"]},
        ]
    }).encode()
    req = decode_request(body, JSON)
    arrs = [input_to_numpy(t, field=f"inputs[{i}]") for i, t in enumerate(req.inputs)]
    assert arrs[0].tolist() == [[1.0, 2.5]]
    assert arrs[1].tolist() == [1, -1]
    assert arrs[2].tolist() == ["héllo".encode()]
    resp = InferResponse(model_name="m", outputs=[
        output_from_numpy("y", np.array([1.0, np.nan, np.inf], np.float32), raw=False)])
    plain = json.loads(encode_response(resp, JSON))
    assert plain["outputs"][0]["data"] == [1.0, "NaN", "Infinity"]


# ---------------------------------------------------------------- other messages


@pytest.mark.parametrize("ct", ENCODINGS)
def test_metadata_health_round_trip(ct):
    meta = ModelMetadata(
        name="mlp", versions=["1", "2"], platform="onnxruntime_onnx",
        inputs=[TensorMetadata("x", "FP32", [-1, 64])],
        outputs=[TensorMetadata("y", "FP32", [-1, 8])],
    )
    assert decode(encode(meta, ct), ModelMetadata, ct) == meta
    assert "parameters" not in (json.loads(encode(meta, JSON)))
    lst = ModelList(models=[meta, meta])
    assert decode(encode(lst, ct), ModelList, ct) == lst
    h = Health(live=True, ready=False, parameters={"region": "eu"})
    assert decode(encode(h, ct), Health, ct) == h
    raises_field("ready", decode, encode({"live": True, "ready": "yes"}, ct), Health, ct)
    raises_field("models[0].inputs", decode, encode({"models": [{
        "name": "m", "versions": [], "platform": "p", "inputs": 3, "outputs": []}]}, ct),
        ModelList, ct)


# ---------------------------------------------------------------- errors


def test_error_codes_table():
    table = {
        "INVALID_ARGUMENT": (400, False), "NOT_FOUND": (404, False),
        "DEADLINE_EXCEEDED": (504, False), "RESOURCE_EXHAUSTED": (429, True),
        "UNAVAILABLE": (503, True), "PAYLOAD_TOO_LARGE": (413, False),
        "INTERNAL": (500, False),
    }
    names = {
        "INVALID_ARGUMENT": "InvalidArgument", "NOT_FOUND": "NotFound",
        "DEADLINE_EXCEEDED": "DeadlineExceeded", "RESOURCE_EXHAUSTED": "ResourceExhausted",
        "UNAVAILABLE": "Unavailable", "PAYLOAD_TOO_LARGE": "PayloadTooLarge",
        "INTERNAL": "Internal",
    }
    assert [c.value for c in ErrorCode] == list(table)
    for name, (status, retry) in table.items():
        code = ErrorCode(name)
        assert (code.http_status, code.retryable) == (status, retry)
        cls = error_class(name)
        assert cls is error_class(code) and cls.code is code
        assert issubclass(cls, InferbusError) and cls.__name__ == names[name]
    with pytest.raises(ValueError):
        error_class("TEAPOT")


@pytest.mark.parametrize("ct", [None, JSON])
@pytest.mark.parametrize("code", list(ErrorCode))
def test_error_reply_round_trip(code, ct):
    err = error_class(code)("bad thing\nhappened", field="inputs[0].shape", retry_after_ms=25)
    headers, body = encode_error(err, ct)
    assert headers["Nats-Service-Error"] == "bad thing happened"
    assert headers["Nats-Service-Error-Code"] == str(code.http_status)
    assert headers["Inferbus-Error-Code"] == code.value
    assert headers["Content-Type"] == (JSON if ct else MSGPACK)
    reply = decode(body, ErrorReply, ct)
    assert reply.error.code == code.value and reply.error.field == "inputs[0].shape"
    back = decode_error(headers, body)
    assert type(back) is type(err)
    assert (back.message, back.field, back.retry_after_ms) == (
        "bad thing\nhappened", "inputs[0].shape", 25)


def test_error_reply_edge_cases():
    h, b = encode_error(InvalidArgument("x"))
    assert msgpack.unpackb(b) == {"error": {"code": "INVALID_ARGUMENT", "message": "x"}}
    # not an error reply
    assert decode_error(None, b"anything") is None
    assert decode_error({}, b"") is None
    assert decode_error({"Content-Type": MSGPACK}, encode(InferResponse("m", []))) is None
    # plain NATS micro error (headers only): class from the status
    got = decode_error({"Nats-Service-Error": "busy", "Nats-Service-Error-Code": "503"}, b"")
    assert type(got) is Unavailable and got.message == "busy"
    # lower-case header names, garbage body: headers win
    got = decode_error({"inferbus-error-code": "NOT_FOUND", "nats-service-error": "m?"}, b"\xc1")
    assert type(got) is schemas.NotFound and got.message == "m?"
    # unknown code and status -> Internal
    got = decode_error({"Nats-Service-Error-Code": "418", "Inferbus-Error-Code": "TEAPOT"}, b"")
    assert type(got) is Internal
    # a foreign exception is sent as INTERNAL
    h, b = encode_error(ZeroDivisionError("division by zero"))
    assert h["Inferbus-Error-Code"] == "INTERNAL" and h["Nats-Service-Error-Code"] == "500"
    assert decode_error(h, b).message == "ZeroDivisionError: division by zero"


def test_errors_carry_attributes_and_pickle():
    err = schemas.ResourceExhausted("queue full", retry_after_ms=10)
    assert err.code is ErrorCode.RESOURCE_EXHAUSTED and err.retryable
    assert err.field is None and str(err) == "queue full"
    assert str(InvalidArgument("bad", field="inputs[0]")) == "bad (field: inputs[0])"
    back = pickle.loads(pickle.dumps(InvalidArgument("bad", field="f", retry_after_ms=1)))
    assert type(back) is InvalidArgument
    assert (back.message, back.field, back.retry_after_ms) == ("bad", "f", 1)
    assert InferbusError.code is ErrorCode.INTERNAL
    assert issubclass(InferbusError, Exception)


def test_an_error_reply_cuts_a_long_message_and_field_and_keeps_a_short_one():
    """An error reply echoes what the request sent; a 4.3 MB input name made a reply over max_payload (a fresh-user
    trial). The message is cut to 2,000 characters in both the header and the body, the field to 200."""
    from inferbus.schemas._errors import MAX_ERROR_FIELD_CHARS, MAX_ERROR_MESSAGE_CHARS

    long = InvalidArgument("unknown input '" + "n" * 1_000_000 + "'", field="inputs." + "n" * 1000)
    for ct in (None, "application/json"):
        hdrs, body = encode_error(long, ct)
        back = decode_error(hdrs, body)
        kept = MAX_ERROR_MESSAGE_CHARS - len("... (1000016 more characters)")  # the note counts within the limit
        assert back.message.startswith("unknown input 'nnn") and back.message.endswith(
            f"... ({1_000_016 - kept} more characters)"), back.message[-40:]
        assert MAX_ERROR_MESSAGE_CHARS - 2 <= len(back.message) <= MAX_ERROR_MESSAGE_CHARS, len(back.message)
        assert hdrs["Nats-Service-Error"] == back.message
        assert back.field.startswith("inputs.nnn") and len(back.field) <= MAX_ERROR_FIELD_CHARS
        assert len(body) < 2 * MAX_ERROR_MESSAGE_CHARS
    short = InvalidArgument("x" * MAX_ERROR_MESSAGE_CHARS, field="inputs[0]")
    back = decode_error(*encode_error(short))
    assert (back.message, back.field) == (short.message, "inputs[0]")


def test_a_lone_surrogate_escape_in_json_data_is_named_not_called_truncated():
    """A fresh-user trial: ``"data": ["\\ud800"]`` was refused as "Input data was truncated" (msgspec's words for a
    lone surrogate in an untyped value), which sends a client looking for a cut-off body. A pair still decodes."""
    def body(d: bytes) -> bytes:
        return b'{"inputs":[{"name":"s","datatype":"BYTES","shape":[1],"data":[' + d + b']}]}'

    with pytest.raises(InvalidArgument) as ei:
        decode_request(body(b'"x\\ud800"'), "application/json")
    assert "lone UTF-16 surrogate escape (\\ud800) at byte" in ei.value.message and "truncated" not in ei.value.message
    assert ei.value.field == "body"
    with pytest.raises(InvalidArgument) as ei:  # a body really cut short is still called so
        decode_request(body(b'"x"')[:-5], "application/json")
    assert "truncated" in ei.value.message
    assert decode_request(body(b'"\\ud83d\\ude00"'), "application/json").inputs[0].data == ["\U0001F600"]


# ---------------------------------------------------------------- package surface


def test_exports():
    expected = {
        "ErrorCode", "InferbusError", "InvalidArgument", "NotFound", "DeadlineExceeded",
        "ResourceExhausted", "Unavailable", "PayloadTooLarge", "Internal", "error_class",
        "ErrorDetail", "ErrorReply", "encode_error", "decode_error",
        "DATATYPES", "MAX_PARAMETERS", "MAX_REQUEST_ID_CHARS", "MAX_TENSORS", "Datatype", "ShmRef", "RequestInput", "RequestedOutput", "InferRequest",
        "ResponseOutput", "InferResponse", "TensorMetadata", "ModelMetadata", "ModelList", "ModelReady",
        "ServerMetadata", "answers_raw",
        "Health",
        "MODEL_OPS", "ModelControlRequest", "ModelControlReply",
        "MSGPACK", "JSON", "is_json", "decode_request", "encode_request", "decode_response",
        "encode_response", "encode", "decode", "parameter_field",
        "numpy_dtype", "datatype_of", "input_to_numpy", "output_to_numpy", "input_from_numpy",
        "output_from_numpy", "tensor_nbytes", "preload_datatypes",
    }
    assert set(schemas.__all__) == expected
    assert len(schemas.__all__) == len(expected)
    for name in expected:
        assert getattr(schemas, name) is not None


def test_schemas_imports_nothing_else_of_inferbus():
    code = (
        "import sys, inferbus.schemas; "
        "bad = [m for m in sys.modules if m.startswith('inferbus') and m != 'inferbus' "
        "and not m.startswith('inferbus.schemas')]; print(bad); sys.exit(bool(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_struct_defaults():
    t = RequestInput("x", "FP32", [1], data=[1.0])
    assert (t.raw, t.shm, t.parameters) == (None, None, None)
    r = InferResponse(model_name="m", outputs=[])
    assert (r.model_version, r.id, r.parameters) == ("", None, {})
    assert ShmRef(region="r", byte_size=8).offset == 0
    assert ResponseOutput("y", "FP32", [0], raw=b"").data is None


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
@pytest.mark.parametrize("ct", ENCODINGS)
def test_half_precision_data_exhaustive(datatype, ct):
    """Every one of the 65536 FP16/BF16 bit patterns survives the data form
    (NaNs stay NaN; their payload is not kept)."""
    arr = np.arange(65536, dtype=np.uint16).view(numpy_dtype(datatype))
    out = output_from_numpy("y", arr, raw=False)
    body = encode_response(InferResponse("m", [out]), ct)
    got = output_to_numpy(decode_response(body, ct).outputs[0])
    assert got.dtype == arr.dtype
    nan = np.isnan(arr.astype(np.float32))
    assert np.array_equal(arr.view(np.uint16)[~nan], got.view(np.uint16)[~nan])
    assert np.isnan(got.astype(np.float32)[nan]).all()


@pytest.mark.parametrize("body", [b'{"inputs": []}', b' \n\t{"inputs": []}', b"[1, 2]", b'{"inputs": [}'])
def test_json_body_without_json_content_type_gets_the_hint(body):
    # JSON text read as MessagePack: '{' (0x7b) and '[' (0x5b) are positive fixints
    with pytest.raises(InvalidArgument) as ei:
        schemas.decode_request(body)
    assert ei.value.field == "body"
    assert ei.value.message.endswith("looks like JSON: send Content-Type: application/json"), ei.value.message
    assert "Expected `object`, got `int`" in ei.value.message


@pytest.mark.parametrize("body, ct, fmt", [
    (b"\xff\x00\x01", None, "a MessagePack map (or a JSON object, sent with Content-Type: application/json)"),
    (b"hello", None, "a MessagePack map (or a JSON object, sent with Content-Type: application/json)"),
    (b"[1, 2]", "application/json", "a JSON object")])
def test_a_body_that_is_no_map_is_refused_with_what_a_request_is(body, ct, fmt):
    """Garbage bytes (a fresh-user trial) and a JSON array were refused with msgspec's words alone (``body: Expected
    `object`, got `int```); the message now says what a request is."""
    with pytest.raises(InvalidArgument) as ei:
        schemas.decode_request(body, ct)
    assert ei.value.field == "body"
    assert ei.value.message.startswith("invalid request: body: not a map (Expected `object`, got `"), ei.value.message
    assert ei.value.message.endswith(f"a request is {fmt} of the KServe Open Inference Protocol v2 fields")
    # a model-management write's body is no OIP message: its refusal said it was (a fresh-user trial, 2026-12-05)
    with pytest.raises(InvalidArgument) as ei:
        schemas.decode(body, schemas.ModelControlRequest, ct)
    assert ei.value.message.endswith(f"a ModelControlRequest is {fmt} of the fields of a ModelControlRequest "
                                     f"(docs/models.md)"), ei.value.message


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_a_bare_nonfinite_json_literal_gets_the_string_spelling_hint(token):
    """JSON has no NaN/Infinity literals (RFC 8259 section 6); a body using them is refused with the spelling the
    decoders accept (found by a fresh-user trial: the message named only a byte offset)."""
    body = ('{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, %s]}]}' % token).encode()
    with pytest.raises(InvalidArgument) as ei:
        schemas.decode_request(body, "application/json")
    assert ei.value.field == "body" and 'send non-finite floats as the strings "NaN"' in ei.value.message
    quoted = body.replace(token.encode(), b'"' + token.encode() + b'"')
    req = schemas.decode_request(quoted, "application/json")  # the spelling the hint gives is accepted
    assert not np.isfinite(input_to_numpy(req.inputs[0], field="inputs[0]")[1])
    with pytest.raises(InvalidArgument) as ei:  # another malformed body gets no such hint
        schemas.decode_request(b'{"inputs": [x]}', "application/json")
    assert "NaN" not in ei.value.message


def test_no_json_hint_when_the_body_does_not_look_like_json_or_is_json():
    for body, ct in ((b"\x05", None), (b"xyz", None), (b'{"inputs": 5}', "application/json"), (b"{", "application/json")):
        with pytest.raises(InvalidArgument) as ei:
            schemas.decode_request(body, ct)
        assert "looks like JSON" not in ei.value.message, (body, ei.value.message)


def test_an_element_without_a_printable_value_is_named_by_its_type_not_a_memory_address():
    """A MessagePack extension inside ``data`` is refused naming the element and its kind; the message holds no
    ``<... object at 0x...>`` (found by a fresh-user trial)."""
    import msgpack

    body = msgpack.packb({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1],
                                      "data": [msgpack.ExtType(5, b"ab")]}]})
    req = decode_request(body, None)
    with pytest.raises(InvalidArgument) as ei:
        input_to_numpy(req.inputs[0], field="inputs[0]")
    assert "MessagePack extension" in ei.value.message and "0x" not in ei.value.message, ei.value.message
    assert ei.value.field == "inputs[0].data"


def test_datatype_mismatch_hints_at_numpy_defaults_only_where_they_apply():
    from inferbus.schemas._tensors import datatype_mismatch

    e = datatype_mismatch("x", "BF16", "FP64", "inputs[0].datatype")
    assert isinstance(e, InvalidArgument) and e.field == "inputs[0].datatype"
    assert e.message.startswith("input 'x' must be BF16, got FP64") and "ml_dtypes.bfloat16" in e.message
    assert "list of ints" in datatype_mismatch("x", "INT8", "INT64", "f").message
    assert datatype_mismatch("x", "BYTES", "FP64", "f").message == "input 'x' must be BYTES, got FP64"
    assert datatype_mismatch("x", "FP32", "FP16", "f").message == "input 'x' must be FP32, got FP16"


@pytest.mark.parametrize("ct", [None, "application/json"])
def test_a_shape_over_32_dimensions_is_refused_in_one_short_line(ct):
    """A fresh-user trial (2026-12-02): a 10,000-dimension shape was echoed whole in the error message."""
    from inferbus.schemas._oip import MAX_RANK

    t = {"name": "a", "datatype": "FP32", "shape": [1] * 10_000, "data": [1.0]}
    body = json.dumps({"inputs": [t]}).encode() if ct else msgpack.packb({"inputs": [t]})
    with pytest.raises(InvalidArgument) as ei:
        decode_request(body, ct)
    assert ei.value.field == "inputs[0].shape" and f"length <= {MAX_RANK}" in ei.value.message
    assert len(ei.value.message) < 200, ei.value.message
    t["shape"] = [1] * MAX_RANK  # the most is served
    body = json.dumps({"inputs": [t]}).encode() if ct else msgpack.packb({"inputs": [t]})
    assert decode_request(body, ct).inputs[0].shape == [1] * MAX_RANK


@pytest.mark.parametrize("first_use", ["decode_raw", "numpy_dtype", "data_list", "datatype_of"])
def test_ml_dtypes_is_imported_on_the_first_bf16_tensor_only(first_use):
    """The serving modules do not import ml_dtypes (0.7.0's import takes 1.5-2.3 s on the 2-core box, paid by every
    CLI command and actor process); the first BF16 tensor, whichever path it comes by in a fresh process, loads it
    and converts as before."""
    code = f"""
import sys
import inferbus.cli, inferbus.actors, inferbus.client, inferbus.loadgen, inferbus.schemas as s
assert "ml_dtypes" not in sys.modules, "imported at start-up"
import numpy as np
how = {first_use!r}
if how == "decode_raw":
    req = s.decode_request(s.encode_request(s.InferRequest(inputs=[s.RequestInput(
        name="x", datatype="BF16", shape=[2], raw=b"\\xc0?\\x00@")])))
    a = s.input_to_numpy(req.inputs[0], field="inputs[0]")
elif how == "numpy_dtype":
    a = np.frombuffer(b"\\xc0?\\x00@", s.numpy_dtype("BF16"))
elif how == "data_list":
    a = s.input_to_numpy(s.RequestInput(name="x", datatype="BF16", shape=[2], data=[1.5, 2]), field="inputs[0]")
else:
    import ml_dtypes
    assert s.datatype_of(np.dtype(ml_dtypes.bfloat16)) == "BF16"
    a = np.array([1.5, 2], ml_dtypes.bfloat16)
assert str(a.dtype) == "bfloat16" and a.astype(np.float32).tolist() == [1.5, 2.0], a
out = s.output_from_numpy("y", a, raw=True)
assert (out.datatype, out.raw) == ("BF16", b"\\xc0?\\x00@"), out
assert s.datatype_of(a.dtype) == "BF16"
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_a_bf16_request_is_decoded_and_checked_without_ml_dtypes():
    """Decoding a request with a BF16 input (its raw size checked) does not load ml_dtypes: an ingress refusing BF16
    for a model that takes FP32 must not first stall 1.3 s on the import (a fresh-user trial: the refusal took
    1,330 ms and every request in flight waited with it). A raw of the wrong size is still refused by size."""
    code = """
import sys
import inferbus.schemas as s
ok = s.encode_request(s.InferRequest(inputs=[s.RequestInput(name="x", datatype="BF16", shape=[1, 4], raw=bytes.fromhex("803f") * 4)]))
assert s.decode_request(ok).inputs[0].datatype == "BF16"
bad = s.encode_request(s.InferRequest(inputs=[s.RequestInput(name="x", datatype="BF16", shape=[1, 4], raw=bytes.fromhex("803f") * 3)]))
try:
    s.decode_request(bad)
    raise SystemExit("a 6-byte raw for 4 BF16 elements was accepted")
except s.InvalidArgument as exc:
    assert "needs 8" in exc.message, exc.message
assert "ml_dtypes" not in sys.modules, "decoding loaded ml_dtypes"
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr + p.stdout


@pytest.mark.parametrize("bf16_model", [False, True])
def test_the_ingress_loads_ml_dtypes_before_serving_only_for_a_bf16_model(tmp_path, bf16_model):
    """An ingress whose repository has a model with a BF16 tensor loads ml_dtypes when it is made, before it serves
    (its first BF16 request would otherwise stall every request in flight for the import); with none, it does not
    load it at all. The model: ONNX Identity, one input ``x`` of [-1, 4], BF16 or FP16."""
    import onnx
    from onnx import TensorProto, helper

    elem = TensorProto.BFLOAT16 if bf16_model else TensorProto.FLOAT16
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "id",
                              [helper.make_tensor_value_info("x", elem, [None, 4])],
                              [helper.make_tensor_value_info("y", elem, [None, 4])])
    d = tmp_path / "models" / "ident"
    (d / "1").mkdir(parents=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), d / "1" / "model.onnx")
    t = "TYPE_BF16" if bf16_model else "TYPE_FP16"
    (d / "config.json").write_text(json.dumps({
        "name": "ident", "platform": "onnxruntime_onnx", "max_batch_size": 8, "default_version": 1,
        "input": [{"name": "x", "data_type": t, "dims": [4]}], "output": [{"name": "y", "data_type": t, "dims": [4]}]}))
    code = f"""
import sys
from inferbus.actors._ingress import Ingress, IngressConfig
from inferbus.bus import BusConfig
ing = Ingress(IngressConfig(ingress_id="i-bf16", bus=BusConfig(servers=("nats://127.0.0.1:1",)),
                            models_dir={str(tmp_path / "models")!r}))
assert [t.datatype for t in next(iter(ing.repo.get("ident").versions.values())).inputs] == [{"BF16" if bf16_model else "FP16"!r}]
assert ("ml_dtypes" in sys.modules) is {bf16_model}, sys.modules.get("ml_dtypes")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr + p.stdout


def test_a_bfloat16_array_read_back_from_npy_gets_a_hint(tmp_path):
    """np.save keeps no ml_dtypes type: a bfloat16 array reads back as ``|V2``, which has no OIP datatype; the
    refusal says so and how to send it as BF16 (a fresh-user trial met the bare refusal through ``infer -i``).
    Other unsupported dtypes get no such hint."""
    np.save(tmp_path / "b.npy", np.array([1.5, 2.0], ml_dtypes.bfloat16))
    back = np.load(tmp_path / "b.npy")
    assert back.dtype == np.dtype("V2")
    with pytest.raises(InvalidArgument) as ei:
        schemas.datatype_of(back.dtype)
    assert "has no OIP v2 datatype" in ei.value.message and "arr.view(ml_dtypes.bfloat16)" in ei.value.message
    assert schemas.datatype_of(back.view(ml_dtypes.bfloat16).dtype) == "BF16"
    with pytest.raises(InvalidArgument) as ei:
        schemas.datatype_of(np.dtype(np.complex64))
    assert "bfloat16" not in ei.value.message


def test_an_empty_body_says_what_a_request_is():
    """A raw client's empty body got ``empty request body`` alone (a fresh-user trial); it now says what to send, as
    the error of a body that is no map does."""
    from inferbus.schemas import InvalidArgument, decode_request

    for ct in (None, "application/json"):
        with pytest.raises(InvalidArgument) as exc:
            decode_request(b"", ct)
        assert exc.value.field == "body" and exc.value.message.startswith("empty request body: a request is a ")
        assert '{"inputs": [...]}' in exc.value.message, exc.value.message
