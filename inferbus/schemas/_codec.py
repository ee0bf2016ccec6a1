"""Encode and decode wire messages: MessagePack by default, JSON on request.

The encoding follows the message's ``Content-Type`` header (DESIGN §3): JSON when it
is ``application/json`` (parameters such as ``; charset=utf-8`` allowed, and any
``application/*+json``), MessagePack for anything else, including no header.

Every decode failure becomes :class:`~inferbus.schemas.InvalidArgument`; its ``field``
is the JSON path of the offending field (``"inputs[0].shape"``, ``"inputs[0].name"``
for a missing field), or None when the body is not valid MessagePack/JSON at all.
Decoders are built once and reused (msgspec), and a MessagePack length header that
claims more bytes than the body holds is rejected before anything is allocated.

JSON differences (JSON has no binary type and no NaN):

* ``bytes`` fields (``raw``) are base64 strings;
* BYTES ``data`` elements are strings (UTF-8); encoding bytes that are not valid
  UTF-8 as JSON ``data`` raises InvalidArgument: send such tensors as ``raw``;
* non-finite floats in FP16/BF16/FP32/FP64 ``data`` are the strings ``"NaN"``,
  ``"Infinity"``, ``"-Infinity"`` (the proto3 JSON mapping's spelling); the decoders
  accept them in either encoding.
"""

from __future__ import annotations

import math
import re
from typing import Any, TypeVar

import msgspec
import numpy as np

from ._errors import InvalidArgument
from ._oip import (DATATYPES, MAX_PARAMETERS, MAX_TENSORS, InferRequest, InferResponse, ParameterValue, RequestInput,
                   ResponseOutput)
from ._tensors import _ITEMSIZE

__all__ = [
    "MSGPACK",
    "JSON",
    "is_json",
    "decode_request",
    "encode_request",
    "decode_response",
    "encode_response",
    "encode",
    "decode",
    "parameter_field",
]

#: Content-Type of MessagePack bodies (the default).
MSGPACK = "application/msgpack"
#: Content-Type of JSON bodies.
JSON = "application/json"

T = TypeVar("T")


def is_json(content_type: str | None) -> bool:
    """True when ``content_type`` selects JSON: ``application/json`` (any case, with
    or without parameters such as ``; charset=utf-8``) or ``application/*+json``.
    None, ``application/msgpack`` and every other value select MessagePack."""
    if not content_type:
        return False
    if content_type == JSON:
        return True
    if content_type == MSGPACK:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == JSON or (media.startswith("application/") and media.endswith("+json"))


def _enc_hook(obj: Any) -> Any:
    # numpy scalars (incl. bfloat16) and arrays in parameters or data.
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise NotImplementedError(f"cannot encode objects of type {type(obj).__name__}")


_mp_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_json_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)

_decoders: dict[tuple[Any, bool], Any] = {}


def _decoder(type_: Any, json: bool) -> Any:
    key = (type_, json)
    dec = _decoders.get(key)
    if dec is None:
        dec = msgspec.json.Decoder(type_) if json else msgspec.msgpack.Decoder(type_)
        _decoders[key] = dec
    return dec


_mp_request = _decoder(InferRequest, False)
_json_request = _decoder(InferRequest, True)
_mp_response = _decoder(InferResponse, False)
_json_response = _decoder(InferResponse, True)

# ---------------------------------------------------------------- error translation

_AT = re.compile(r"^(?P<msg>.*) - at `\$(?P<path>[^`]*)`$", re.S)
_AT_KEY = re.compile(r"^(?P<msg>.*) - at `key` in `\$(?P<path>[^`]*)`$", re.S)
"""msgspec's words for a map key of the wrong type (a MessagePack key that is not a string): the path is the map's."""
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]+)`$")
_DATATYPE_LIST = ", ".join(DATATYPES)


def _validation_error(exc: msgspec.ValidationError, what: str) -> InvalidArgument:
    """msgspec's "<text> - at `$.inputs[0].shape`" -> InvalidArgument(field="inputs[0].shape"); a map key of the
    wrong type ("<text> - at `key` in `$.inputs[0].parameters`") names the map (``body`` for the request's own)."""
    text = str(exc)
    path = ""
    m = _AT.match(text)
    if m:
        text, path = m["msg"], m["path"]
    elif m := _AT_KEY.match(text):
        text, path = f"a map key is not a string ({m['msg']})", m["path"]
    m = _MISSING.match(text)
    if m:
        path = f"{path}.{m['name']}"
    field = path.lstrip(".") or "body"  # no path: the body as a whole is not a request object
    if field.endswith(".datatype") and text.startswith("Invalid enum value"):
        value = text[len("Invalid enum value") :]
        text = f"unknown datatype{value}; expected one of {_DATATYPE_LIST}"
    message = f"invalid {what}: {field}: {text}"
    return InvalidArgument(message, field=field)


def _decode_error(exc: msgspec.DecodeError, what: str, json: bool) -> InvalidArgument:
    fmt = "JSON" if json else "MessagePack"
    return InvalidArgument(f"malformed {fmt} {what}: {exc}", field="body")


_JSON_HINT = "; looks like JSON: send Content-Type: application/json"
_LONE_SURROGATE = re.compile(rb"(?<!\\)\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
                             rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")
"""A ``\\uD800``-``\\uDFFF`` escape in JSON text that is not half of a high-low pair."""


_NONFINITE_HINT = ('; JSON has no NaN or Infinity literals: send non-finite floats as the strings "NaN", '
                   '"Infinity", "-Infinity"')
_AT_BYTE = re.compile(r"\(byte (\d+)\)")


def _bare_nonfinite(message: str, body: bytes | memoryview) -> bool:
    """True when the JSON parser stopped (``message`` names the byte) at a bare ``NaN``/``Infinity`` token."""
    m = _AT_BYTE.search(message)
    if m is None:
        return False
    at = int(m[1])
    tail = bytes(body[max(at - 1, 0):at + 9])
    return any(tok in tail for tok in (b"NaN", b"Infinity"))


_BOM = b"\xef\xbb\xbf"
"""UTF-8 byte order mark: RFC 8259 section 8.1 lets a JSON parser ignore one at the start of a text."""


def looks_like_json(body: bytes | memoryview) -> bool:
    """True when ``body`` starts, after a UTF-8 byte order mark and ASCII whitespace, with ``{`` or ``[``
    (MessagePack fixints there)."""
    head = bytes(body[:64])
    if head[:3] == _BOM:
        head = head[3:]
    return head.lstrip(b" \t\r\n")[:1] in (b"{", b"[")


def _bound_hint(field: str, message: str) -> str:
    """What the request's bounded fields may hold, for the msgspec ``message`` that refused ``field``: a
    ``parameters`` map's length or value (:data:`MAX_PARAMETERS`, OIP v2's ``$parameter``), the ``inputs`` or
    ``outputs`` list's length (:data:`MAX_TENSORS`); empty for any other refusal."""
    if "parameters" in field:
        if "length <=" in message:
            return f" (a parameters map holds at most {MAX_PARAMETERS} entries)"
        if "Expected `bool | int | float | str`" in message:
            return " (OIP v2: a parameter's value is a string, a number or a boolean)"
    elif field in ("inputs", "outputs") and "length <=" in message:
        return f" (a request lists at most {MAX_TENSORS} {field})"
    return ""


def parameter_field(name: str, path: str = "parameters") -> str:
    """The error ``field`` of parameter ``name``'s value in the ``parameters`` map at ``path`` (``parameters``,
    ``inputs[0].parameters``): ``parameters["temperature"]``, the name as a JSON string in brackets, so that any
    name (quotes, dots, brackets) reads back unambiguously. The ingress's refusals and the SDK's pre-send checks
    name a parameter this way."""
    return f"{path}[{msgspec.json.encode(name).decode()}]"


_STEP = re.compile(r"\.?([^.\[]+)|\[(\d+)\]")
_VALUE_REFUSED = "[...]"
"""msgspec's path for a map's value: it does not say which key held it."""


_MSGPACK_KINDS = {tuple: "array", bytes: "bin", type(None): "nil", msgspec.msgpack.Ext: "ext"}
"""The MessagePack type of a map key as msgspec decodes it, where its Python type's name says another."""


def _raw_at(body: bytes | memoryview, path: str, json: bool) -> Any:
    """The encoded value at ``path`` (``inputs[1].parameters``) in ``body``, as a :class:`msgspec.Raw`, the
    maps and lists on the way decoded one level each (what they hold is skipped, not built)."""
    mod = msgspec.json if json else msgspec.msgpack
    raw: Any = body
    for name, index in _STEP.findall(path):
        raw = mod.decode(raw, type=dict[str, msgspec.Raw])[name] if name else \
            mod.decode(raw, type=list[msgspec.Raw])[int(index)]
    return raw


def _name_parameter(err: InvalidArgument, body: bytes | memoryview, json: bool) -> InvalidArgument:
    """``err`` (a refusal in a ``parameters`` map, msgspec's words) naming the parameter: a refused value's key in
    ``field`` (``inputs[0].parameters["k"]``, a JSON string in brackets), a name that is not a string in the message.

    Run only once a body was refused: it reads ``body`` again up to the map. ``err`` comes back as it was when the
    map cannot be read apart from the rest (a value nested beyond the decoder's recursion limit, a duplicate key
    whose last value is a good one)."""
    field = err.field or ""
    value = field.endswith(_VALUE_REFUSED)
    path = field[:-len(_VALUE_REFUSED)] if value else field
    mod = msgspec.json if json else msgspec.msgpack
    try:
        if value:
            for key, raw in mod.decode(_raw_at(body, path, json), type=dict[str, msgspec.Raw]).items():
                try:
                    mod.decode(raw, type=ParameterValue)
                except msgspec.ValidationError:
                    named = parameter_field(key, path)
                    return InvalidArgument(err.message.replace(field, named, 1), field=named)
        else:
            for key in mod.decode(_raw_at(body, path, json), type=dict[Any, msgspec.Raw]):
                if not isinstance(key, str):
                    kind = _MSGPACK_KINDS.get(type(key), type(key).__name__)
                    return InvalidArgument(f"{err.message}: a parameter's name is a string, got {key!r} (a "
                                           f"MessagePack {kind})", field=field)
    except (msgspec.ValidationError, msgspec.DecodeError, LookupError, RecursionError):
        pass
    return err


def _decode(dec: Any, body: bytes | memoryview, what: str, json: bool, bom: bool = True) -> Any:
    if len(body) == 0:  # what one is, as for a body that is no map (a fresh-user trial: "empty request body" alone)
        fields = ("the KServe Open Inference Protocol v2 fields, e.g. {\"inputs\": [...]}" if what in ("request", "response")
                  else f"the fields of a {what} (docs/models.md)")
        raise InvalidArgument(f"empty {what} body: a {what} is a MessagePack map (or a JSON object, sent with "
                              f"Content-Type: application/json) of {fields}", field="body")
    try:
        return dec.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        if json and bom and bytes(body[:3]) == _BOM:  # RFC 8259 8.1: a parser may ignore one (msgspec does not);
            return _decode(dec, body[3:], what, json, False)  # off the serving path: only a body that failed
        if isinstance(exc, msgspec.ValidationError):
            err = _validation_error(exc, what)
            if err.field.endswith("parameters" + _VALUE_REFUSED) or (
                    err.field.endswith("parameters") and ": a map key is not a string" in err.message):
                err = _name_parameter(err, body, json)  # msgspec's path names no key: the body is read again
            if err.field is not None and (hint := _bound_hint(err.field, str(exc))):
                err = InvalidArgument(err.message + hint, field=err.field)
            if err.field == "body" and str(exc).startswith("Expected `object`"):
                # the body as a whole is no map (a fresh-user trial: garbage bytes got only msgspec's words)
                fmt = ("a JSON object" if json else "a MessagePack map" if looks_like_json(body) else
                       "a MessagePack map (or a JSON object, sent with Content-Type: application/json)")
                fields = ("the KServe Open Inference Protocol v2 fields" if what in ("request", "response") else
                          f"the fields of a {what} (docs/models.md)")
                err = InvalidArgument(f"invalid {what}: body: not a map ({exc}): a {what} is {fmt} of {fields}",
                                      field="body")
        else:
            err = _decode_error(exc, what, json)
            if json and _bare_nonfinite(str(exc), body):
                err = InvalidArgument(err.message + _NONFINITE_HINT, field=err.field)
            elif json and str(exc) == "Input data was truncated" and (m := _LONE_SURROGATE.search(bytes(body))):
                # msgspec says "truncated" of a complete body whose lone surrogate escape is in an untyped value
                # (a tensor's data); in a typed string it says what it is (a fresh-user trial)
                err = InvalidArgument(f"malformed JSON {what}: a lone UTF-16 surrogate escape "
                                      f"({m.group().decode()}) at byte {m.start()}: JSON text cannot carry it "
                                      f"(RFC 8259 8.2); send BYTES that are not UTF-8 text as MessagePack bin or "
                                      f"as base64 raw", field="body")
        if not json and looks_like_json(body):
            err = InvalidArgument(err.message + _JSON_HINT, field=err.field)
        raise err from exc
    except RecursionError:  # msgspec's decoder recurses per nesting level (Python's recursion limit applies)
        raise InvalidArgument(f"the {what} body is nested too deeply to decode (arrays/maps inside each other "
                              f"beyond the interpreter's recursion limit)", field="body") from None


# ---------------------------------------------------------------- light validation


def _check_tensors(tensors: list[Any], prefix: str) -> None:
    """Cheap per-tensor checks done at decode time (O(number of tensors)): unique
    names, exactly one of data/raw/shm, the outer length of ``data`` (``prod(shape)``
    flat, or ``shape[0]`` nested), raw and shm sizes of fixed-size datatypes, and
    at least 4 bytes per element in BYTES raw.
    Element-level checks of ``data`` happen in input_to_numpy/output_to_numpy."""
    seen: set[str] = set()
    for i, t in enumerate(tensors):
        if t.name in seen:
            raise InvalidArgument(
                f"duplicate tensor name {t.name!r}", field=f"{prefix}[{i}].name"
            )
        seen.add(t.name)
        shm = getattr(t, "shm", None)
        present = (t.data is not None) + (t.raw is not None) + (shm is not None)
        if present != 1:
            slots = (("data", t.data), ("raw", t.raw), ("shm", shm))
            names = [n for n, v in slots if v is not None]
            got = " and ".join(names) if names else "none"
            raise InvalidArgument(
                f"exactly one of data, raw, shm must be set; got {got}", field=f"{prefix}[{i}]"
            )
        if t.data is not None:
            data, shape = t.data, t.shape
            count = math.prod(shape)
            if isinstance(data, (list, tuple)):
                ok = len(data) == count or (len(shape) > 1 and len(data) == shape[0])
            else:
                ok = count == 1 and not isinstance(data, dict)
            if not ok:
                got = f"a list of {len(data)}" if isinstance(data, (list, tuple)) else (
                    type(data).__name__
                )
                raise InvalidArgument(
                    f"data must be a flat list of {count} elements or nested as shape "
                    f"{shape}, got {got}",
                    field=f"{prefix}[{i}].data",
                )
            continue
        if t.datatype == "BYTES":
            count = math.prod(t.shape)
            if t.raw is not None and len(t.raw) < 4 * count:
                raise InvalidArgument(
                    f"BYTES raw has {len(t.raw)} bytes, too few for {count} elements "
                    "(4-byte length each)",
                    field=f"{prefix}[{i}].raw",
                )
            continue
        expected = math.prod(t.shape) * _ITEMSIZE[t.datatype]
        if t.raw is not None:
            if len(t.raw) != expected:
                raise InvalidArgument(
                    f"raw has {len(t.raw)} bytes but shape {t.shape} of {t.datatype} needs "
                    f"{expected}",
                    field=f"{prefix}[{i}].raw",
                )
        elif shm.byte_size != expected:
            raise InvalidArgument(
                f"shm.byte_size is {shm.byte_size} but shape {t.shape} of {t.datatype} needs "
                f"{expected}",
                field=f"{prefix}[{i}].shm.byte_size",
            )


def _check_request(req: InferRequest) -> InferRequest:
    _check_tensors(req.inputs, "inputs")
    if req.outputs:
        seen: set[str] = set()
        for i, o in enumerate(req.outputs):
            if o.name in seen:
                raise InvalidArgument(
                    f"duplicate output name {o.name!r}", field=f"outputs[{i}].name"
                )
            seen.add(o.name)
    return req


# ---------------------------------------------------------------- JSON preparation

_FLOAT_TYPES = frozenset({"FP16", "BF16", "FP32", "FP64"})


def _nonfinite_str(x: float) -> str:
    return "NaN" if x != x else ("Infinity" if x > 0 else "-Infinity")


def _json_floats(data: Any) -> Any:
    """Return data with non-finite floats as strings; the same object when all finite."""
    if isinstance(data, (float, np.floating)):
        return data if math.isfinite(data) else _nonfinite_str(float(data))
    if isinstance(data, (list, tuple)):
        try:
            if all(map(math.isfinite, data)):
                return data
        except (TypeError, OverflowError):  # nested lists, strings, huge ints
            pass
        return [_json_floats(x) for x in data]
    return data


def _json_bytes(data: Any, where: str) -> Any:
    """Return BYTES data with every bytes element decoded as UTF-8 text."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidArgument(
                "BYTES element is not valid UTF-8; JSON carries BYTES data as text, "
                "send this tensor as raw instead",
                field=where,
            ) from exc
    if isinstance(data, (list, tuple)):
        return [_json_bytes(x, where) for x in data]
    return data


def _json_tensors(tensors: list[Any], prefix: str | None) -> list[Any] | None:
    """A copy of ``tensors`` made JSON-safe, or None when nothing needs changing."""
    out: list[Any] | None = None
    for i, t in enumerate(tensors):
        where = f"{prefix}[{i}].data" if prefix else "data"
        data = t.data
        if data is None:
            continue
        if t.datatype == "BYTES":
            new = _json_bytes(data, where)
        elif t.datatype in _FLOAT_TYPES:
            new = _json_floats(data)
        else:
            continue
        if new is not data:
            if out is None:
                out = list(tensors)
            out[i] = msgspec.structs.replace(t, data=new)
    return out


def _json_ready(obj: Any) -> Any:
    if isinstance(obj, InferRequest):
        inputs = _json_tensors(obj.inputs, "inputs")
        return obj if inputs is None else msgspec.structs.replace(obj, inputs=inputs)
    if isinstance(obj, InferResponse):
        outputs = _json_tensors(obj.outputs, "outputs")
        return obj if outputs is None else msgspec.structs.replace(obj, outputs=outputs)
    if isinstance(obj, (RequestInput, ResponseOutput)):
        fixed = _json_tensors([obj], None)
        return obj if fixed is None else fixed[0]
    return obj


# ---------------------------------------------------------------- public API


def encode(obj: Any, content_type: str | None = None) -> bytes:
    """Encode any wire struct (or plain data) as MessagePack, or JSON per ``content_type``.

    numpy scalars and arrays inside are encoded as Python numbers / nested lists.
    The object is not modified; JSON preparation (see module docs) works on copies.

    Raises:
        InvalidArgument: a value cannot be encoded (unsupported type, integer beyond
            64 bits, non-UTF-8 BYTES data as JSON).
    """
    try:
        if is_json(content_type):
            return _json_encoder.encode(_json_ready(obj))
        return _mp_encoder.encode(obj)
    except (TypeError, ValueError, OverflowError, NotImplementedError) as exc:
        raise InvalidArgument(f"cannot encode {type(obj).__name__}: {exc}") from exc


def decode(body: bytes | memoryview, type: type[T], content_type: str | None = None, *,
           what: str | None = None) -> T:
    """Decode ``body`` as ``type`` (any msgspec-supported type, e.g. ModelMetadata,
    ModelList, Health, ErrorReply; ``typing.Any`` for plain maps and lists) from MessagePack, or JSON per
    ``content_type``, with the ingress's decoder and its refusals (:func:`decode_request`'s words): a body nested
    beyond the interpreter's recursion limit (~1,000 levels) is InvalidArgument ``the <what> body is nested too
    deeply to decode ...``, never a RecursionError. The HTTP gateway reads client JSON with it
    (``inferbus/actors/_gateway.py``, ``_httpext.py``), so that its refusals are the ingress's.

    An :class:`InferRequest` / :class:`InferResponse` gets the same checks as
    :func:`decode_request` / :func:`decode_response`.

    Args:
        what: what the body is, in error messages (``"request"``); default the type's name.

    Raises:
        InvalidArgument: empty body, malformed body (field ``body``), nested too deeply (field ``body``), or a
            field of the wrong type / missing (field = its JSON path).
    """
    json = is_json(content_type)
    name = what or getattr(type, "__name__", "message")
    value = _decode(_decoder(type, json), body, name, json)
    if isinstance(value, InferRequest):
        _check_request(value)
    elif isinstance(value, InferResponse):
        _check_tensors(value.outputs, "outputs")
    return value


def decode_request(body: bytes | memoryview, content_type: str | None = None) -> InferRequest:
    """Decode and check an :class:`InferRequest` (MessagePack, or JSON per ``content_type``).

    Checks beyond types (cheap, O(inputs)): input names unique, exactly one of
    data/raw/shm per input, the outer length of ``data`` (``prod(shape)`` when flat,
    ``shape[0]`` when nested), ``raw`` length and ``shm.byte_size`` equal to
    ``prod(shape) * itemsize`` for fixed-size datatypes, requested output names unique.
    Element-level checks of ``data`` (types, ranges, full nesting) happen in
    :func:`input_to_numpy`.

    Raises:
        InvalidArgument: ``field`` ``"body"`` for an empty, malformed or too deeply nested body
            (beyond Python's recursion limit, ~1,000 levels); otherwise the
            JSON path: ``"inputs[0].shape"`` (wrong type), ``"inputs[0].shape[1]"``
            (negative), ``"inputs[0].datatype"`` (unknown), ``"inputs[0].name"``
            (missing or duplicate), ``"inputs[0]"`` (none or several of
            data/raw/shm), ``"inputs[0].raw"`` (wrong length), ``"inputs[0].data"``
            (wrong outer length), ``"inputs"`` (missing), ``'parameters["k"]'`` (a parameter value that is no
            string, number or boolean; ``inputs[0].parameters["k"]``, ``outputs[0].parameters["k"]`` likewise; the
            key as a JSON string), ``"inputs[0].parameters"`` (a MessagePack parameter name that is no string).
            A body that fails to decode under a ``content_type`` that is neither MessagePack nor JSON (``text/csv``:
            read as MessagePack) says so at the end of the message.
    """
    json = is_json(content_type)
    try:
        req = _decode(_json_request if json else _mp_request, body, "request", json)
    except InvalidArgument as err:
        if not json and content_type and content_type != MSGPACK and (hint := _unread_type_hint(content_type)):
            raise InvalidArgument(err.message + hint, field=err.field) from err.__cause__
        raise
    return _check_request(req)


_MSGPACK_TYPES = frozenset({MSGPACK, "application/x-msgpack", "application/vnd.msgpack"})
"""Media types read as MessagePack that say so (RFC 9512 registers ``application/msgpack``; the others are older
names in use)."""


def _unread_type_hint(content_type: str) -> str:
    """The end of a decode error's message for a request sent with ``content_type``, a media type that is neither
    MessagePack nor JSON (read as MessagePack, as every type but JSON is: "" for a MessagePack one)."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media in _MSGPACK_TYPES:
        return ""
    return (f"; Content-Type {content_type[:60]!r} is neither {MSGPACK} nor {JSON}: the body was read as "
            f"MessagePack")


def encode_request(req: InferRequest, content_type: str | None = None) -> bytes:
    """Encode an :class:`InferRequest`; see :func:`encode` for errors."""
    return encode(req, content_type)


def decode_response(body: bytes | memoryview, content_type: str | None = None) -> InferResponse:
    """Decode and check an :class:`InferResponse` (MessagePack, or JSON per ``content_type``).

    Same checks as :func:`decode_request`, applied to ``outputs``. A malformed response
    raises InvalidArgument too (naming the field, ``"outputs[0].raw"`` etc.): the
    caller decides whether that is its own fault or the server's. Check for an error
    reply with :func:`decode_error` first.

    Raises:
        InvalidArgument: as :func:`decode_request`, with ``outputs[...]`` paths.
    """
    json = is_json(content_type)
    resp = _decode(_json_response if json else _mp_response, body, "response", json)
    _check_tensors(resp.outputs, "outputs")
    return resp


def encode_response(resp: InferResponse, content_type: str | None = None) -> bytes:
    """Encode an :class:`InferResponse`; see :func:`encode` for errors."""
    return encode(resp, content_type)
