"""Public wire messages: the KServe Open Inference Protocol (OIP) v2 shapes.

Field names and meanings follow the KServe OIP v2 REST/gRPC specification
(https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/), so a
plain MessagePack or JSON client that knows OIP v2 can talk to inferbus with nothing
else. Two additions, both optional: ``raw`` (a tensor's bytes inline, little-endian,
row-major; the analogue of OIP gRPC ``raw_input_contents``) and ``shm`` (a same-host
shared-memory reference, the OIP shared-memory extension's region/offset/byte_size).

All structs decode strictly: a field of the wrong type, a ``datatype`` outside
:data:`DATATYPES` or a negative dimension in a request/response tensor shape is a
decode error naming the field (see :mod:`inferbus.schemas._codec`). Unknown fields are
ignored (forward compatibility). Optional fields that hold their default are omitted
from the encoded message.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

__all__ = [
    "DATATYPES",
    "MAX_REQUEST_ID_CHARS",
    "MAX_PARAMETERS",
    "MAX_TENSORS",
    "Datatype",
    "ShmRef",
    "RequestInput",
    "RequestedOutput",
    "InferRequest",
    "ResponseOutput",
    "InferResponse",
    "TensorMetadata",
    "ModelMetadata",
    "ModelList",
    "Health",
]

MAX_REQUEST_ID_CHARS = 256
"""The longest request id (a body's ``id``, the ``Inferbus-Request-Id`` header), in characters: every reply echoes
it in a header, and a worker keeps 2 KiB of ``max_payload`` for an answer's headers. A longer one is refused
(INVALID_ARGUMENT, ``field`` ``id`` or ``Inferbus-Request-Id``): ids of up to 4 MB were taken, and an answer that fit
the worker's check with a 2,000-character id got no reply at all (its publish failed), a fresh-user trial. OIP v2
sets no bound; a UUID is 36 characters."""

MAX_PARAMETERS = 128
"""The most entries a request's, an input's or a requested output's ``parameters`` map may hold. A longer map is
refused (INVALID_ARGUMENT, ``field`` ``parameters``, ``inputs[i].parameters`` ...) from its MessagePack/JSON header,
before its entries are decoded: a map of 600,000 entries (7 MB, under ``max_payload``) took 0.2 s to decode in each
actor that read it, and ten of them at once froze the workers for 1.5-1.9 s and failed other clients' requests (a
fresh-user trial, 2026-12-06). OIP v2 sets no bound; Triton's own parameters are a handful."""

MAX_TENSORS = 4096
"""The most ``inputs`` a request may list, and the most ``outputs`` it may ask for. A longer list is refused
(INVALID_ARGUMENT, ``field`` ``inputs`` / ``outputs``) from its MessagePack header, before its entries are decoded:
150,000 one-element inputs (6 MB) took 0.22 s to decode (and another read at the worker). An ONNX model with more
inputs than this cannot be served over this protocol; OIP v2 sets no bound."""

ParameterValue = str | int | float | bool
"""A parameter's value: OIP v2's ``$parameter`` is ``$string : $string | $number | $boolean`` (the KServe Open
Inference Protocol, REST, "Parameters"), as Triton reads it; a list, a map or null is refused (INVALID_ARGUMENT)."""

_Parameters = Annotated[dict[str, ParameterValue], msgspec.Meta(max_length=MAX_PARAMETERS)]

#: The OIP v2 tensor datatypes, in the spec's order.
DATATYPES: tuple[str, ...] = (
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "BF16",
    "FP32",
    "FP64",
    "BYTES",
)

#: Type of a ``datatype`` field: a ``str`` restricted to :data:`DATATYPES` on decode.
Datatype = Literal[
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "BF16",
    "FP32",
    "FP64",
    "BYTES",
]

_Dim = Annotated[int, msgspec.Meta(ge=0)]
_MetaDim = Annotated[int, msgspec.Meta(ge=-1)]
_NonNeg = Annotated[int, msgspec.Meta(ge=0)]
MAX_RANK = 32
"""Most dimensions of a tensor's ``shape`` (numpy 1.x's ``NPY_MAXDIMS``; numpy 2 allows 64). A longer shape is
refused at decode (msgspec checks it in C): a 10,000-dimension shape used to be echoed whole in the error message
(a fresh-user trial, 2026-12-02)."""
_Shape = Annotated[list[_Dim], msgspec.Meta(max_length=MAX_RANK)]


class ShmRef(msgspec.Struct, kw_only=True):
    """A tensor held in a same-host shared-memory region.

    Attributes:
        region: name of a region registered with the server.
        offset: start of the tensor in the region, bytes, >= 0 (default 0).
        byte_size: length of the tensor, bytes, >= 0.
    """

    region: str
    offset: _NonNeg = 0
    byte_size: _NonNeg


class RequestInput(msgspec.Struct, omit_defaults=True):
    """One input tensor of an :class:`InferRequest` (OIP v2 ``$request_input``).

    Exactly one of ``data``, ``raw`` and ``shm`` carries the values:

    * ``data``: the elements, a flat row-major list of ``prod(shape)`` elements or a
      list nested exactly like ``shape``; BYTES elements are bin (bytes) or UTF-8 str.
    * ``raw``: the tensor's bytes, row-major, little-endian, ``prod(shape) * itemsize``
      bytes; BYTES uses the OIP binary form (a 4-byte little-endian length before
      each element). MessagePack carries it as bin, JSON as a base64 string.
    * ``shm``: a :class:`ShmRef`.

    Attributes:
        name: input name, as in the model metadata.
        datatype: one of :data:`DATATYPES`.
        shape: dimensions, each >= 0; ``[]`` is a scalar, a 0 makes an empty tensor.
        parameters: OIP per-tensor parameters: read by no model served here (accepted, not used).

    Convert with :func:`inferbus.schemas.input_to_numpy` / ``input_from_numpy``.
    """

    name: str
    datatype: Datatype
    shape: _Shape
    data: Any = None
    raw: bytes | None = None
    shm: ShmRef | None = None
    parameters: _Parameters | None = None


class RequestedOutput(msgspec.Struct, omit_defaults=True):
    """An output the caller wants (OIP v2 ``$request_output``); none listed = all."""

    name: str
    parameters: _Parameters | None = None


class InferRequest(msgspec.Struct, omit_defaults=True):
    """An inference request (OIP v2 ``$inference_request``).

    Attributes:
        inputs: the input tensors, names unique.
        id: caller's request id, echoed in the response; the idempotency key when the
            ``Inferbus-Request-Id`` header is absent. At most :data:`MAX_REQUEST_ID_CHARS` characters.
        parameters: OIP request parameters: read by no model served here, not echoed in the response, part of
            the cache key.
        outputs: outputs to return; None returns every output.
    """

    inputs: Annotated[list[RequestInput], msgspec.Meta(max_length=MAX_TENSORS)]
    id: Annotated[str, msgspec.Meta(max_length=MAX_REQUEST_ID_CHARS)] | None = None
    parameters: _Parameters | None = None
    outputs: Annotated[list[RequestedOutput], msgspec.Meta(max_length=MAX_TENSORS)] | None = None


def answers_raw(req: "InferRequest") -> bool:
    """The tensor form of the answer to ``req``, in either encoding: ``raw`` (True) when its first input came
    ``raw`` (base64 in JSON) or it has no input, else ``data`` (False). JSON answers were always ``data``: a JSON
    request of 24,000 rows of 64 FP32 in ``raw`` fit ``max_payload`` and its answer did not (PAYLOAD_TOO_LARGE; a
    fresh-user trial, 2026-12-05). Part of the result cache's key (answers of both forms are cached apart)."""
    return req.inputs[0].raw is not None if req.inputs else True


class ResponseOutput(msgspec.Struct, omit_defaults=True):
    """One output tensor of an :class:`InferResponse` (OIP v2 ``$response_output``).

    Same value rules as :class:`RequestInput` (``data`` or ``raw``; no ``shm``).
    Convert with :func:`inferbus.schemas.output_to_numpy` / ``output_from_numpy``.
    """

    name: str
    datatype: Datatype
    shape: _Shape
    data: Any = None
    raw: bytes | None = None


class InferResponse(msgspec.Struct, omit_defaults=True):
    """An inference response (OIP v2 ``$inference_response``).

    Attributes:
        model_name: the model that answered.
        outputs: the output tensors.
        model_version: the version that answered ("" when unversioned).
        id: the request's ``id``, echoed.
        parameters: serving facts: worker id, device, backend, precision, cache hit,
            region, fencing term, timings in µs (queue, compute, total).
    """

    model_name: str
    outputs: list[ResponseOutput]
    model_version: str = ""
    id: str | None = None
    parameters: dict[str, Any] = {}


class TensorMetadata(msgspec.Struct):
    """A model input/output as the model declares it (OIP v2 ``$metadata_tensor``).

    ``shape`` dimensions are >= 0, or -1 for a variable dimension (e.g. batch).
    """

    name: str
    datatype: Datatype
    shape: list[_MetaDim]


class ModelMetadata(msgspec.Struct, omit_defaults=True):
    """Model metadata (OIP v2 ``$metadata_model_response``), answered on
    ``<prefix>.models.<model>``.

    Attributes:
        name: model name.
        versions: available versions.
        platform: serving platform, e.g. ``"onnxruntime_onnx"``.
        inputs, outputs: tensor metadata.
        parameters: extra facts (omitted from the wire when empty).
    """

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    parameters: dict[str, Any] = {}


class ModelList(msgspec.Struct):
    """``{models: [ModelMetadata, ...]}``, answered on ``<prefix>.models``."""

    models: list[ModelMetadata]


class ServerMetadata(msgspec.Struct):
    """Server metadata (OIP v2 ``$metadata_server_response``), answered on ``<prefix>.server``.

    Attributes:
        name: ``"inferbus"``.
        version: the inferbus package version that answered (e.g. ``"0.1.0"``).
        extensions: the protocol extensions served (``"model_repository"``: the load, unload and default
            writes of docs/models.md).
    """

    name: str
    version: str
    extensions: list[str]


class ModelReady(msgspec.Struct):
    """Whether one model version is ready (OIP v2 model ready, as KServe's gRPC ``ModelReadyResponse`` with the
    version it was read for), answered on ``<prefix>.models.<model>.ready`` (the default version) and
    ``<prefix>.models.<model>.<version>.ready``.

    Attributes:
        name: the model.
        version: the version read (the default version when the subject names none).
        ready: a live worker whose breaker is not open serves it, and this ingress can serve it (the same test
            as ``<prefix>.health``'s ``ready`` for every default version).
    """

    name: str
    version: str
    ready: bool


class Health(msgspec.Struct, omit_defaults=True):
    """Liveness/readiness, answered on ``<prefix>.health`` (OIP v2 health, both
    flags in one message). ``parameters`` holds extra facts (omitted when empty)."""

    live: bool
    ready: bool
    parameters: dict[str, Any] = {}
