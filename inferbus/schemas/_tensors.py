"""Conversion between OIP v2 tensors and numpy arrays.

Datatypes map one to one (KServe OIP v2 "Tensor Data Types")::

    BOOL   np.bool_   1 byte (0 or 1)     INT8   int8    1      FP16  float16            2
    UINT8  uint8      1                   INT16  int16   2      BF16  ml_dtypes.bfloat16 2
    UINT16 uint16     2                   INT32  int32   4      FP32  float32            4
    UINT32 uint32     4                   INT64  int64   8      FP64  float64            8
    UINT64 uint64     8                                         BYTES object (bytes)     variable

``raw`` is row-major (C order), little-endian. BF16 is never reinterpreted as FP16 or
UINT16: raw BF16 bytes become a ``ml_dtypes.bfloat16`` array. ml_dtypes is imported on the
first BF16 tensor, not with this module (see :func:`_bf16`).

``data`` is a flat row-major list of ``prod(shape)`` elements, or a list nested
exactly like ``shape``; a bare scalar is accepted when ``prod(shape) == 1``.
Element rules: BOOL takes booleans only; integer datatypes take integers, and floats
without a fractional part, within the datatype's range; FP16/BF16/FP32/FP64 take
integers and floats (plus the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``,
which is how JSON carries non-finite values), each rounded once from its float64
value to the nearest representable value, ties to even (IEEE 754; past the largest
finite value it becomes ±inf, below half the smallest subnormal ±0); BYTES takes
bytes or str (encoded UTF-8).
Booleans are not numbers here. docs/wire.md has the full rules.
"""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._errors import InvalidArgument
from ._oip import DATATYPES, RequestInput, ResponseOutput

__all__ = [
    "numpy_dtype",
    "datatype_of",
    "tensor_nbytes",
    "input_to_numpy",
    "output_to_numpy",
    "input_from_numpy",
    "output_from_numpy",
    "preload_datatypes",
]

_OBJECT = np.dtype(object)
_BIG_ENDIAN_HOST = sys.byteorder == "big"


class _DtypeTable(dict):
    """datatype → dtype; the BF16 entry is added on its first lookup (:func:`_bf16`), any other miss is KeyError."""

    def __missing__(self, datatype: str) -> np.dtype[Any]:
        if datatype != "BF16":
            raise KeyError(datatype)
        _bf16()
        return self[datatype]


# Native dtypes, as returned by numpy_dtype() (BF16 added by _bf16()).
_NATIVE: dict[str, np.dtype[Any]] = _DtypeTable({
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": _OBJECT,
})
assert set(_NATIVE) | {"BF16"} == set(DATATYPES)

# Little-endian dtypes for reading `raw` (equal to the native ones on little-endian hosts).
_WIRE: dict[str, np.dtype[Any]] = _DtypeTable({k: v.newbyteorder("<") for k, v in _NATIVE.items()})

_ITEMSIZE: dict[str, int] = {**{k: v.itemsize for k, v in _NATIVE.items() if k != "BYTES"}, "BF16": 2}
"""Bytes per element of each fixed-size datatype (BYTES has none), BF16's without loading ml_dtypes: the decoder's
size checks use it, so a request is checked (and a BF16 input a model does not take refused) without the import."""

_BF16: np.dtype[Any] | None = None
"""``np.dtype(ml_dtypes.bfloat16)`` once :func:`_bf16` has run, else None."""


def preload_datatypes(datatypes: Any) -> None:
    """Load now what converting tensors of these OIP datatypes needs, rather than on the first such tensor.

    Only BF16 needs anything: ml_dtypes, whose 0.7.0 import holds the interpreter 1.3-2.3 s on the 2-core box. On
    a serving process's event loop that is a stall for every request in flight, so the ingress calls this for its
    models' datatypes before it serves (the workers' backends load ml_dtypes with a BF16 model). A client that
    receives BF16 outputs and cannot afford the pause on its first answer calls it (or imports ml_dtypes) at start.

    Args:
        datatypes: an iterable of datatype names (unknown names are ignored).

    Raises:
        ImportError: BF16 is among them and ml_dtypes (a dependency of inferbus) is not installed.
    """
    if "BF16" in set(datatypes):
        _bf16()


def _bf16() -> np.dtype[Any]:
    """``np.dtype(ml_dtypes.bfloat16)``, importing ml_dtypes and adding BF16 to the dtype tables on the first call.

    Lazy because importing ml_dtypes 0.7.0 takes 1.5-2.3 s on the 2-core CI box (0.16-0.19 s for 0.5 and 0.6,
    measured 2026-12-04 with ``python -X importtime``): every CLI command, actor process and load generator
    would pay it at start-up, though few models take BF16.

    Raises:
        ImportError: ml_dtypes (a dependency of inferbus) is not installed.
    """
    global _BF16
    if _BF16 is None:
        import ml_dtypes

        dt = np.dtype(ml_dtypes.bfloat16)
        _NATIVE["BF16"] = dt
        _WIRE["BF16"] = dt.newbyteorder("<")
        if not _BIG_ENDIAN_HOST:
            _RAW_AS_IS[dt] = "BF16"
        _BF16 = dt
    return _BF16


_INT_TYPES = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"})
_FLOAT_TYPES = frozenset({"FP16", "BF16", "FP32", "FP64"})
_INT_RANGE: dict[str, tuple[int, int]] = {
    k: (int(np.iinfo(_NATIVE[k]).min), int(np.iinfo(_NATIVE[k]).max)) for k in _INT_TYPES
}
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

_NUM_TYPES = frozenset({int, float})
_NUM_OR_STR = _NUM_TYPES | {str}
_BOOL_TYPES = frozenset({bool, np.bool_})
_BYTES_TYPES = frozenset({bytes, str, bytearray, memoryview})
_LIST_TYPES = (list, tuple)

_DATATYPE_LIST = ", ".join(DATATYPES)


# ---------------------------------------------------------------- datatypes


def datatype_mismatch(name: str, expected: str, got: str, field: str) -> InvalidArgument:
    """The error for input ``name`` sent as datatype ``got`` to a model that takes ``expected``.

    When ``got`` is FP64 or INT64 and ``expected`` is another numeric datatype, the message adds how that
    usually happens: FP64 (INT64) is numpy's default for a Python list of floats (ints) and for an array made
    without a dtype. It names the numpy dtype to convert to.
    """
    msg = f"input {name!r} must be {expected}, got {got}"
    if got in ("FP64", "INT64") and expected != "BYTES":
        kind = "floats" if got == "FP64" else "ints"
        want = "ml_dtypes.bfloat16" if expected == "BF16" else f"np.{_NATIVE[expected].name}"
        msg += (f" ({got} is numpy's default for a Python list of {kind} and for an array made without a dtype; "
                f"send np.asarray(x, dtype={want}))")
    return InvalidArgument(msg, field=field)


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    """The native numpy dtype for an OIP datatype.

    BF16 is ``ml_dtypes.bfloat16``, BYTES is ``np.dtype(object)`` (elements are
    ``bytes``), BOOL is ``np.bool_``; the rest are the same-named numpy types.

    Raises:
        InvalidArgument: ``datatype`` is not one of :data:`DATATYPES` (field None).
    """
    try:
        return _NATIVE[datatype]
    except (KeyError, TypeError):
        raise InvalidArgument(_unknown_datatype(datatype)) from None


def datatype_of(dtype: Any) -> str:
    """The OIP datatype for a numpy dtype (any byte order); inverse of :func:`numpy_dtype`.

    Object, ``bytes_`` (``S``) and ``str_`` (``U``) dtypes map to BYTES.

    Raises:
        InvalidArgument: the dtype has no OIP datatype (complex, float128, datetime,
            structured, other ml_dtypes types, ...).
    """
    try:
        return _DATATYPE_OF[dtype]  # the dtypes a server sees are few: answered from this table after the first
    except (KeyError, TypeError):
        pass
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise InvalidArgument(f"not a numpy dtype: {dtype!r}") from exc
    if dt.kind == "V" and "ml_dtypes" in sys.modules and dt == _bf16():  # a bfloat16 needs ml_dtypes loaded
        name = "BF16"
    elif dt.kind == "b":
        name = "BOOL"
    elif dt.kind in "OSU":
        name = "BYTES"
    else:
        name = _KIND_SIZE.get((dt.kind, dt.itemsize))
        if name is None:
            hint = ("; a bfloat16 array saved with np.save reads back as |V2 (.npy keeps no ml_dtypes type): view it "
                    "as ml_dtypes.bfloat16 (arr.view(ml_dtypes.bfloat16)) to send BF16"
                    if dt.kind == "V" and dt.names is None and dt.itemsize == 2 else "")
            raise InvalidArgument(f"numpy dtype {dt} has no OIP v2 datatype{hint}")
    if isinstance(dtype, np.dtype) and len(_DATATYPE_OF) < _DATATYPE_OF_MAX:
        _DATATYPE_OF[dtype] = name
    return name


_DATATYPE_OF: dict[np.dtype, str] = {}
"""numpy dtype → OIP datatype, filled by :func:`datatype_of` (dtype objects only, successful lookups only)."""
_DATATYPE_OF_MAX = 256


_KIND_SIZE = {
    ("u", 1): "UINT8",
    ("u", 2): "UINT16",
    ("u", 4): "UINT32",
    ("u", 8): "UINT64",
    ("i", 1): "INT8",
    ("i", 2): "INT16",
    ("i", 4): "INT32",
    ("i", 8): "INT64",
    ("f", 2): "FP16",
    ("f", 4): "FP32",
    ("f", 8): "FP64",
}


def tensor_nbytes(datatype: str, shape: Sequence[int]) -> int:
    """Size in bytes of a fixed-size tensor's ``raw`` form: ``prod(shape) * itemsize``.

    Raises:
        InvalidArgument: unknown datatype; BYTES (its size depends on the elements);
            a dimension that is not a non-negative integer.
    """
    dt = numpy_dtype(datatype)
    if dt is _OBJECT:
        raise InvalidArgument("BYTES tensors have no fixed byte size")
    _, count = _check_shape(shape, None)
    return count * dt.itemsize


def _unknown_datatype(datatype: object) -> str:
    return f"unknown datatype {datatype!r}; expected one of {_DATATYPE_LIST}"


def _check_shape(shape: Any, field: str | None) -> tuple[tuple[int, ...], int]:
    """Validate a shape; return it as a tuple and its element count."""
    if not isinstance(shape, _LIST_TYPES):
        raise InvalidArgument(
            f"shape must be a list of non-negative integers, got {type(shape).__name__}",
            field=f"{field}.shape" if field else None,
        )
    count = 1
    dims = []
    for i, d in enumerate(shape):
        if type(d) is not int:
            try:
                if isinstance(d, bool):
                    raise TypeError
                d = operator.index(d)
            except TypeError:
                raise InvalidArgument(
                    f"shape[{i}] must be a non-negative integer, got {d!r}", field=f"{field}.shape" if field else None
                ) from None
        if d < 0:
            raise InvalidArgument(
                f"shape[{i}] must be a non-negative integer, got {d}", field=f"{field}.shape" if field else None
            )
        dims.append(d)
        count *= d
    return tuple(dims), count


# ---------------------------------------------------------------- wire -> numpy


def input_to_numpy(t: RequestInput, *, field: str) -> np.ndarray:
    """The numpy array a :class:`RequestInput` carries.

    Args:
        t: the input tensor.
        field: its JSON path in the request (e.g. ``"inputs[0]"``), used in errors.

    Returns:
        An array of ``numpy_dtype(t.datatype)`` and shape ``t.shape``. From ``raw``
        it is a zero-copy, read-only view of ``t.raw`` (little-endian); from
        ``data`` it is a new array. BYTES gives an object array of ``bytes``.

    Raises:
        InvalidArgument: with ``field`` set to

        * ``f"{field}"``: none, or more than one, of data/raw/shm is set;
        * ``f"{field}.shm"``: shm is set (not supported on this path yet);
        * ``f"{field}.datatype"``: unknown datatype;
        * ``f"{field}.shape"``: a dimension is not a non-negative integer;
        * ``f"{field}.raw"``: raw length is not ``prod(shape) * itemsize`` (message
          states expected vs got), BOOL bytes other than 0/1, malformed BYTES form;
        * ``f"{field}.data"``: wrong element count or nesting, an element of the
          wrong type, a fractional or out-of-range value for an integer datatype.
    """
    if t.shm is not None:
        if t.data is not None or t.raw is not None:
            raise InvalidArgument(_exactly_one(t.data, t.raw, t.shm), field=field)
        raise InvalidArgument("shm not supported on this path", field=f"{field}.shm")
    return _to_numpy(t.datatype, t.shape, t.data, t.raw, field)


def output_to_numpy(o: ResponseOutput, *, field: str = "outputs[i]") -> np.ndarray:
    """The numpy array a :class:`ResponseOutput` carries; same rules and errors as
    :func:`input_to_numpy` (``field`` defaults to ``"outputs[i]"``)."""
    return _to_numpy(o.datatype, o.shape, o.data, o.raw, field)


def _exactly_one(data: Any, raw: Any, shm: Any = None) -> str:
    present = [n for n, v in (("data", data), ("raw", raw), ("shm", shm)) if v is not None]
    got = " and ".join(present) if present else "none"
    return f"exactly one of data, raw, shm must be set; got {got}"


def _to_numpy(datatype: str, shape: Any, data: Any, raw: Any, field: str) -> np.ndarray:
    try:
        dt = _WIRE[datatype] if type(datatype) is str else None  # [], not get(): BF16 is added on its first lookup
    except KeyError:
        dt = None
    if dt is None:
        raise InvalidArgument(_unknown_datatype(datatype), field=f"{field}.datatype")
    dims, count = _check_shape(shape, field)
    if raw is not None:
        if data is not None:
            raise InvalidArgument(_exactly_one(data, raw), field=field)
        if dt is _WIRE["BYTES"]:
            return _bytes_from_raw(raw, dims, count, field)
        return _from_raw(datatype, dt, raw, dims, count, field)
    if data is None:
        raise InvalidArgument(_exactly_one(data, raw), field=field)
    return _from_data(datatype, data, dims, count, field)


def _from_raw(
    datatype: str, dt: np.dtype[Any], raw: Any, dims: tuple[int, ...], count: int, field: str
) -> np.ndarray:
    nbytes = len(raw) if type(raw) is bytes else memoryview(raw).nbytes
    expected = count * dt.itemsize
    if nbytes != expected:
        raise InvalidArgument(
            f"raw has {nbytes} bytes but shape {list(dims)} of {datatype} needs "
            f"{expected} ({count} elements x {dt.itemsize} bytes)",
            field=f"{field}.raw",
        )
    arr = np.frombuffer(raw, dtype=dt)
    if datatype == "BOOL" and count and arr.view(np.uint8).max() > 1:
        raise InvalidArgument("BOOL raw bytes must each be 0 or 1", field=f"{field}.raw")
    return arr.reshape(dims)


def _bytes_from_raw(raw: Any, dims: tuple[int, ...], count: int, field: str) -> np.ndarray:
    """Parse the OIP binary BYTES form: per element a uint32 LE length, then the bytes."""
    buf = raw if type(raw) is bytes else bytes(raw)
    size = len(buf)
    if 4 * count > size:  # checked before allocating `count` slots
        raise InvalidArgument(
            f"BYTES raw has {size} bytes, too few for {count} elements (4-byte length each)",
            field=f"{field}.raw",
        )
    out = np.empty(count, dtype=_OBJECT)
    pos = 0
    from_bytes = int.from_bytes
    for i in range(count):
        if pos + 4 > size:
            raise InvalidArgument(
                f"BYTES raw ends after {i} of {count} elements", field=f"{field}.raw"
            )
        n = from_bytes(buf[pos : pos + 4], "little")
        pos += 4
        if pos + n > size:
            raise InvalidArgument(
                f"BYTES raw element {i} claims {n} bytes but only {size - pos} remain",
                field=f"{field}.raw",
            )
        out[i] = buf[pos : pos + n]
        pos += n
    if pos != size:
        raise InvalidArgument(
            f"BYTES raw has {size - pos} bytes after its {count} elements",
            field=f"{field}.raw",
        )
    return out.reshape(dims)


def _from_data(
    datatype: str, data: Any, dims: tuple[int, ...], count: int, field: str
) -> np.ndarray:
    where = f"{field}.data"
    if isinstance(data, _LIST_TYPES):
        if len(data) == count:
            types = set(map(type, data))
            if list in types or tuple in types:
                flat = _flatten(data, dims, where)
                types = set(map(type, flat))
            else:
                flat = data
        else:
            flat = _flatten(data, dims, where)
            types = set(map(type, flat))
        if list in types or tuple in types:
            raise InvalidArgument(
                f"data is nested deeper than shape {list(dims)}", field=where
            )
    elif count == 1 and not isinstance(data, dict):
        flat = [data]
        types = {type(data)}
    else:
        raise InvalidArgument(
            f"data must be a list of {count} elements (flat or nested as shape "
            f"{list(dims)}), got {type(data).__name__}"
            + ("; a tensor's bytes go in `raw` (row-major, little-endian), not `data`"
               if isinstance(data, (bytes, bytearray, memoryview)) else ""),
            field=where,
        )

    if datatype in _FLOAT_TYPES:
        return _floats(datatype, flat, types, dims, where)
    if datatype in _INT_TYPES:
        return _ints(datatype, flat, types, dims, where)
    if datatype == "BOOL":
        if not types <= _BOOL_TYPES:
            _bad_element(flat, _BOOL_TYPES, "booleans", datatype, where)
        return np.array(flat, dtype=np.bool_).reshape(dims)
    return _bytes_array(flat, types, dims, where)


def _flatten(data: Any, dims: tuple[int, ...], where: str) -> list[Any]:
    """Flatten a list nested exactly as ``dims``, one level at a time."""
    level: list[Any] = [data]
    for depth, n in enumerate(dims):
        nxt: list[Any] = []
        for i, node in enumerate(level):
            if not isinstance(node, _LIST_TYPES) or len(node) != n:
                at = "data" + "".join(
                    f"[{j}]" for j in (np.unravel_index(i, dims[:depth]) if depth else ())
                )
                got = (
                    f"a list of {len(node)}"
                    if isinstance(node, _LIST_TYPES)
                    else type(node).__name__
                )
                raise InvalidArgument(
                    f"data must be a flat list of {math.prod(dims)} elements or nested "
                    f"as shape {list(dims)}: {at} should be a list of {n}, got {got}",
                    field=where,
                )
            nxt.extend(node)
        level = nxt
    return level


def _bad_element(
    flat: Sequence[Any], allowed: frozenset[type], what: str, datatype: str, where: str
) -> None:
    for i, x in enumerate(flat):
        if type(x) not in allowed:
            raise InvalidArgument(
                f"data element {i} (row-major) is {type(x).__name__} {_short(x)}; "
                f"{datatype} takes {what}",
                field=where,
            )
    raise AssertionError("unreachable")  # pragma: no cover


def _short(x: Any) -> str:
    """``x`` for an error message: its repr cut to 40 characters; an object without a repr of its own (a
    MessagePack extension, ...) by its type only, not ``<... object at 0x...>``."""
    if type(x).__module__.startswith("msgspec"):
        return "(a MessagePack extension type)"
    if type(x).__repr__ is object.__repr__:
        return "(no printable value)"
    r = repr(x)
    return r if len(r) <= 40 else r[:37] + "..."


def _ints(
    datatype: str, flat: Sequence[Any], types: set[type], dims: tuple[int, ...], where: str
) -> np.ndarray:
    if not types <= _NUM_TYPES:
        _bad_element(flat, _NUM_TYPES, "integers", datatype, where)
    if float in types:
        for i, x in enumerate(flat):
            if type(x) is float and not x.is_integer():
                raise InvalidArgument(
                    f"data element {i} (row-major) is {x!r}; {datatype} takes integers",
                    field=where,
                )
    if flat:
        lo, hi = _INT_RANGE[datatype]
        if min(flat) < lo or max(flat) > hi:
            for i, x in enumerate(flat):
                if not lo <= x <= hi:
                    raise InvalidArgument(
                        f"data element {i} (row-major) is {_short(x)}, out of range for "
                        f"{datatype} [{lo}, {hi}]",
                        field=where,
                    )
    return np.array(flat, dtype=_NATIVE[datatype]).reshape(dims)


def _floats(
    datatype: str, flat: Sequence[Any], types: set[type], dims: tuple[int, ...], where: str
) -> np.ndarray:
    if not types <= _NUM_TYPES:
        converted = None
        if types <= _NUM_OR_STR:
            try:
                converted = [_NONFINITE[x] if type(x) is str else x for x in flat]
            except KeyError:
                pass
        if converted is None:
            for i, x in enumerate(flat):
                if type(x) not in _NUM_TYPES and not (type(x) is str and x in _NONFINITE):
                    raise InvalidArgument(
                        f"data element {i} (row-major) is {type(x).__name__} {_short(x)}; "
                        f'{datatype} takes numbers (or "NaN", "Infinity", "-Infinity")',
                        field=where,
                    )
        flat = converted  # type: ignore[assignment]
    target = _NATIVE[datatype]
    try:
        with np.errstate(over="ignore", under="ignore"):
            if datatype == "BF16":
                return _f64_to_bf16(np.array(flat, dtype=np.float64)).reshape(dims)
            return np.array(flat, dtype=target).reshape(dims)
    except OverflowError:
        for i, x in enumerate(flat):
            if type(x) is int:
                try:
                    float(x)
                except OverflowError:
                    raise InvalidArgument(
                        f"data element {i} (row-major) is an integer too large for a float",
                        field=where,
                    ) from None
        raise  # pragma: no cover


def _f64_to_bf16(x: np.ndarray) -> np.ndarray:
    """float64 -> bfloat16 with one correct rounding (nearest, ties to even).

    ml_dtypes casts float64 through float32, rounding twice, which can land on the
    wrong side of a bfloat16 tie (1 + 2**-8 + 2**-30 would give 1.0). Rounding to
    float32 *to odd* first and then to bfloat16 is exact, as float32 keeps 16 more
    significand bits than bfloat16 (Boldo & Melquiond, "When double rounding is odd").
    """
    r = x.astype(np.float32)
    inexact = np.isfinite(r) & (r.astype(np.float64) != x)
    if inexact.any():
        fix = inexact & ((r.view(np.uint32) & 1) == 0)
        if fix.any():
            toward = np.where(x[fix] > r[fix], np.float32(np.inf), np.float32(-np.inf))
            r[fix] = np.nextafter(r[fix], toward)
    return r.astype(_bf16())


def _bytes_array(
    flat: Sequence[Any], types: set[type], dims: tuple[int, ...], where: str
) -> np.ndarray:
    if not types <= _BYTES_TYPES:
        _bad_element(flat, _BYTES_TYPES, "bytes or str", "BYTES", where)
    if types != {bytes}:
        try:
            flat = [
                x if type(x) is bytes else x.encode("utf-8") if type(x) is str else bytes(x)
                for x in flat
            ]
        except UnicodeEncodeError as exc:
            raise InvalidArgument(
                f"BYTES str element cannot be encoded as UTF-8: {exc.reason}", field=where
            ) from exc
    out = np.empty(len(flat), dtype=_OBJECT)
    out[:] = flat
    return out.reshape(dims)


# ---------------------------------------------------------------- numpy -> wire


def output_from_numpy(name: str, arr: np.ndarray, *, raw: bool) -> ResponseOutput:
    """A :class:`ResponseOutput` holding ``arr``.

    Args:
        name: output name.
        arr: the array; any shape (0-d and zero-size included), any byte order,
            any memory layout; dtype per :func:`datatype_of`.
        raw: True: ``raw`` = row-major little-endian bytes (BYTES: the 4-byte
            length-prefixed form); False: ``data`` = flat row-major list
            (``arr.ravel().tolist()``; BF16 as Python floats; BYTES as ``bytes``).

    Raises:
        InvalidArgument: the dtype has no OIP datatype; a BYTES element is not
            bytes/str, or is 4 GiB or more in the raw form.
    """
    if raw and type(arr) is np.ndarray:  # a native little-endian array of a fixed-size datatype: the common answer
        datatype = _RAW_AS_IS.get(arr.dtype)
        if datatype is not None:
            return ResponseOutput(name=name, datatype=datatype, shape=list(arr.shape), raw=arr.tobytes())
    datatype, shape, data, raw_bytes = _from_numpy(name, arr, raw)
    return ResponseOutput(name=name, datatype=datatype, shape=shape, data=data, raw=raw_bytes)


_RAW_AS_IS: dict[np.dtype, str] = {} if _BIG_ENDIAN_HOST else {
    dt: name for name, dt in _NATIVE.items() if name != "BYTES"}
"""Native dtype → OIP datatype of the arrays whose ``raw`` form is their bytes as they are in memory
(``tobytes``, row-major): every fixed-size datatype on a little-endian host, none on a big-endian one."""


def input_from_numpy(name: str, arr: np.ndarray, *, raw: bool = True) -> RequestInput:
    """A :class:`RequestInput` holding ``arr``; same rules as :func:`output_from_numpy`
    (``raw`` defaults to True, the fast form)."""
    datatype, shape, data, raw_bytes = _from_numpy(name, arr, raw)
    return RequestInput(name=name, datatype=datatype, shape=shape, data=data, raw=raw_bytes)


def _from_numpy(name: str, arr: Any, raw: bool) -> tuple[str, list[int], Any, bytes | None]:
    if not isinstance(arr, np.ndarray):
        arr = np.asarray(arr)
    datatype = datatype_of(arr.dtype)
    shape = list(arr.shape)
    if datatype == "BYTES":
        elems = _bytes_elements(name, arr)
        if raw:
            return datatype, shape, None, _pack_bytes(name, elems)
        return datatype, shape, elems, None
    if raw:
        bo = arr.dtype.byteorder
        if bo == ">" or (bo == "=" and _BIG_ENDIAN_HOST):
            arr = arr.byteswap()  # same values label, little-endian memory
        return datatype, shape, None, arr.tobytes()
    if datatype == "BF16":
        return datatype, shape, arr.astype(np.float32).ravel().tolist(), None
    return datatype, shape, arr.ravel().tolist(), None


def _bytes_elements(name: str, arr: np.ndarray) -> list[bytes]:
    flat = arr.ravel().tolist()  # 'S' and 'U' give bytes / str; 'O' the objects
    out = []
    for i, x in enumerate(flat):
        t = type(x)
        if t is bytes:
            out.append(x)
        elif t is str:
            try:
                out.append(x.encode("utf-8"))
            except UnicodeEncodeError as exc:
                raise InvalidArgument(
                    f"output {name!r} element {i}: str cannot be encoded as UTF-8"
                ) from exc
        elif isinstance(x, (bytes, bytearray, memoryview)):
            out.append(bytes(x))
        else:
            raise InvalidArgument(
                f"tensor {name!r} element {i} is {t.__name__}; BYTES takes bytes or str"
            )
    return out


def _pack_bytes(name: str, elems: list[bytes]) -> bytes:
    parts = []
    for b in elems:
        n = len(b)
        if n > 0xFFFFFFFF:
            raise InvalidArgument(f"tensor {name!r}: a BYTES element of {n} bytes exceeds 4 GiB")
        parts.append(n.to_bytes(4, "little"))
        parts.append(b)
    return b"".join(parts)
