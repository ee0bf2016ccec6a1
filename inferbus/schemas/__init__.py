"""inferbus.schemas: the wire messages, their encodings and the error codes.

Imports nothing else of inferbus. The public names are listed in ``__all__``; the
private modules are ``_oip`` (KServe OIP v2 structs), ``_tensors`` (numpy
conversion), ``_codec`` (MessagePack/JSON encode/decode) and ``_errors`` (typed
errors and their NATS micro wire form). docs/wire.md describes the wire contract.
"""

from ._codec import (
    JSON,
    MSGPACK,
    decode,
    decode_request,
    decode_response,
    encode,
    encode_request,
    encode_response,
    is_json,
    parameter_field,
)
from ._control import MODEL_OPS, ModelControlReply, ModelControlRequest
from ._errors import (
    DeadlineExceeded,
    ErrorCode,
    ErrorDetail,
    ErrorReply,
    InferbusError,
    Internal,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    ResourceExhausted,
    Unavailable,
    decode_error,
    encode_error,
    error_class,
)
from ._oip import (
    DATATYPES,
    MAX_PARAMETERS,
    MAX_REQUEST_ID_CHARS,
    MAX_TENSORS,
    Datatype,
    Health,
    InferRequest,
    InferResponse,
    ModelList,
    ModelMetadata,
    ModelReady,
    RequestedOutput,
    ServerMetadata,
    RequestInput,
    ResponseOutput,
    ShmRef,
    TensorMetadata,
    answers_raw,
)
from ._tensors import (
    datatype_of,
    input_from_numpy,
    input_to_numpy,
    numpy_dtype,
    output_from_numpy,
    output_to_numpy,
    preload_datatypes,
    tensor_nbytes,
)

__all__ = [
    # errors
    "ErrorCode",
    "InferbusError",
    "InvalidArgument",
    "NotFound",
    "DeadlineExceeded",
    "ResourceExhausted",
    "Unavailable",
    "PayloadTooLarge",
    "Internal",
    "error_class",
    "ErrorDetail",
    "ErrorReply",
    "encode_error",
    "decode_error",
    # OIP v2 messages
    "DATATYPES",
    "MAX_PARAMETERS",
    "MAX_REQUEST_ID_CHARS",
    "MAX_TENSORS",
    "Datatype",
    "ShmRef",
    "RequestInput",
    "RequestedOutput",
    "InferRequest",
    "ResponseOutput",
    "InferResponse",
    "TensorMetadata",
    "answers_raw",
    "ModelMetadata",
    "ModelReady",
    "ServerMetadata",
    "ModelList",
    "Health",
    # model management
    "MODEL_OPS",
    "ModelControlRequest",
    "ModelControlReply",
    # codec
    "MSGPACK",
    "JSON",
    "is_json",
    "parameter_field",
    "decode_request",
    "encode_request",
    "decode_response",
    "encode_response",
    "encode",
    "decode",
    # tensors
    "numpy_dtype",
    "datatype_of",
    "input_to_numpy",
    "output_to_numpy",
    "input_from_numpy",
    "output_from_numpy",
    "preload_datatypes",
    "tensor_nbytes",
]
