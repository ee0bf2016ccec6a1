"""Typed errors and their wire form (NATS micro error headers + an error body).

Every error inferbus reports to a caller is an :class:`InferbusError`. Each subclass
fixes one :class:`ErrorCode`; the code decides the HTTP-style status sent in the
``Nats-Service-Error-Code`` header and whether a client may retry the request::

    Exception
     └── InferbusError                 (base; code INTERNAL when raised bare)
          ├── InvalidArgument          INVALID_ARGUMENT    400  not retryable
          ├── NotFound                 NOT_FOUND           404  not retryable
          ├── DeadlineExceeded         DEADLINE_EXCEEDED   504  not retryable
          ├── ResourceExhausted        RESOURCE_EXHAUSTED  429  retryable
          ├── Unavailable              UNAVAILABLE         503  retryable
          ├── PayloadTooLarge          PAYLOAD_TOO_LARGE   413  not retryable
          └── Internal                 INTERNAL            500  not retryable

Wire form of an error reply (see docs/wire.md):

* headers, following the NATS micro convention (nats.go/nats.py ``micro``):
  ``Nats-Service-Error`` (the message), ``Nats-Service-Error-Code`` (the HTTP status
  as decimal text), plus ``Inferbus-Error-Code`` (the symbolic code) and
  ``Content-Type``;
* body ``{"error": {"code", "message", "field"?, "retry_after_ms"?}}``
  (:class:`ErrorReply`), MessagePack by default or JSON.

A client error (INVALID_ARGUMENT, NOT_FOUND, PAYLOAD_TOO_LARGE) never trips a
circuit breaker; :attr:`ErrorCode.retryable` says which codes are worth retrying on
another replica.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, ClassVar

import msgspec

__all__ = [
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
]

#: Header names (NATS micro convention + ours).
H_SERVICE_ERROR = "Nats-Service-Error"
H_SERVICE_ERROR_CODE = "Nats-Service-Error-Code"
H_ERROR_CODE = "Inferbus-Error-Code"
H_CONTENT_TYPE = "Content-Type"


class ErrorCode(str, Enum):
    """Symbolic error code carried in ``Inferbus-Error-Code`` and the error body.

    Values are the names themselves (``ErrorCode("NOT_FOUND") is ErrorCode.NOT_FOUND``).
    The codes mirror the gRPC status names used by KServe; the HTTP statuses are
    the ones KServe's REST API and the NATS micro ``Nats-Service-Error-Code`` use.
    """

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    UNAVAILABLE = "UNAVAILABLE"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    INTERNAL = "INTERNAL"

    @property
    def http_status(self) -> int:
        """HTTP status sent as ``Nats-Service-Error-Code``: 400 404 504 429 503 413 500."""
        return _HTTP_STATUS[self]

    @property
    def retryable(self) -> bool:
        """True for UNAVAILABLE and RESOURCE_EXHAUSTED: the same request may succeed
        on another replica or later. Every other code is final for this request."""
        return self in _RETRYABLE

    def __str__(self) -> str:  # "INVALID_ARGUMENT", not "ErrorCode.INVALID_ARGUMENT"
        return self.value


_HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_ARGUMENT: 400,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.DEADLINE_EXCEEDED: 504,
    ErrorCode.RESOURCE_EXHAUSTED: 429,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.INTERNAL: 500,
}
_RETRYABLE = frozenset({ErrorCode.UNAVAILABLE, ErrorCode.RESOURCE_EXHAUSTED})


class InferbusError(Exception):
    """Base of every inferbus error; one subclass per :class:`ErrorCode`.

    Args:
        message: human-readable text; sent as the ``Nats-Service-Error`` header and the
            body's ``message`` (line breaks are flattened in the header only).
        field: JSON path of the offending request field, e.g. ``"inputs[0].shape"``,
            or None when the error is not about one field.
        retry_after_ms: a hint, in milliseconds, for when a retry may succeed (mostly
            with RESOURCE_EXHAUSTED / UNAVAILABLE); None when there is no hint.

    Attributes:
        code: the class's :class:`ErrorCode` (INTERNAL on the base class).
        message, field, retry_after_ms: as given.

    Instances pickle with all attributes, so they cross process boundaries intact.
    """

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        retry_after_ms: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.retry_after_ms = retry_after_ms

    @property
    def retryable(self) -> bool:
        """Shorthand for ``self.code.retryable``."""
        return self.code.retryable

    def __str__(self) -> str:
        if self.field:
            return f"{self.message} (field: {self.field})"
        return self.message

    def __repr__(self) -> str:
        extra = ""
        if self.field is not None:
            extra += f", field={self.field!r}"
        if self.retry_after_ms is not None:
            extra += f", retry_after_ms={self.retry_after_ms!r}"
        return f"{type(self).__name__}({self.message!r}{extra})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.field, self.retry_after_ms))


def _rebuild(
    cls: type[InferbusError], message: str, field: str | None, retry_after_ms: int | None
) -> InferbusError:
    return cls(message, field=field, retry_after_ms=retry_after_ms)


class InvalidArgument(InferbusError):
    """The request is malformed or fails validation (400). ``field`` names the part."""

    code = ErrorCode.INVALID_ARGUMENT


class NotFound(InferbusError):
    """The model, version or named tensor does not exist (404)."""

    code = ErrorCode.NOT_FOUND


class DeadlineExceeded(InferbusError):
    """The request's time budget (``Inferbus-Timeout-Ms``) ran out (504)."""

    code = ErrorCode.DEADLINE_EXCEEDED


class ResourceExhausted(InferbusError):
    """Rate limit or a full queue; retry later or elsewhere (429, retryable)."""

    code = ErrorCode.RESOURCE_EXHAUSTED


class Unavailable(InferbusError):
    """No replica can serve the request right now (503, retryable)."""

    code = ErrorCode.UNAVAILABLE


class PayloadTooLarge(InferbusError):
    """The message or a tensor exceeds a configured size limit (413)."""

    code = ErrorCode.PAYLOAD_TOO_LARGE


class Internal(InferbusError):
    """A bug or unexpected failure on the serving side (500)."""

    code = ErrorCode.INTERNAL


_CLASSES: dict[ErrorCode, type[InferbusError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        DeadlineExceeded,
        ResourceExhausted,
        Unavailable,
        PayloadTooLarge,
        Internal,
    )
}
_BY_STATUS: dict[int, type[InferbusError]] = {
    code.http_status: cls for code, cls in _CLASSES.items()
}


def error_class(code: ErrorCode | str) -> type[InferbusError]:
    """The :class:`InferbusError` subclass for ``code``.

    Args:
        code: an :class:`ErrorCode` or its name, e.g. ``"NOT_FOUND"``.

    Raises:
        ValueError: ``code`` is not one of the seven codes.
    """
    return _CLASSES[ErrorCode(code)]


class ErrorDetail(msgspec.Struct, omit_defaults=True):
    """Body of an error reply: ``{code, message, field?, retry_after_ms?}``.

    ``code`` is an :class:`ErrorCode` name; ``field`` the JSON path of the offending
    request field; ``retry_after_ms`` a retry hint in milliseconds. Optional fields
    are omitted from the wire when None.
    """

    code: str
    message: str
    field: str | None = None
    retry_after_ms: int | None = None


class ErrorReply(msgspec.Struct):
    """Error reply body: ``{"error": ErrorDetail}``."""

    error: ErrorDetail


_mp_encoder = msgspec.msgpack.Encoder()
_json_encoder = msgspec.json.Encoder()

MAX_ERROR_MESSAGE_CHARS = 2000
"""An error reply's message is cut to this many characters (and its ``field`` to :data:`MAX_ERROR_FIELD_CHARS`),
the rest replaced by ``... (N more characters)``: a message echoes what the request sent (an input name, a datatype,
a header's value), and the reply carries it twice (the ``Nats-Service-Error`` header and the body), so an echo of a
4.3 MB input name made a 9 MB reply. nats-py checks a publish's payload against ``max_payload`` but not its headers,
and nats-server closed the connection of the process that sent it ("maximum payload exceeded", a fresh-user trial:
the node's only ingress was gone for good after one request)."""
MAX_ERROR_FIELD_CHARS = 200


def fmt_ms(ms: float) -> str:
    """A duration in ms for an error message: whole ms from 10 ms up, 3 significant digits below (0.5, not 0)."""
    return f"{ms:.0f}" if ms >= 10 else f"{ms:.3g}"


def _cut(text: str, limit: int) -> str:
    """``text`` when at most ``limit`` characters, else its start and a note of how many characters were left out,
    ``limit`` characters in all (the note came on top: 2,026 for a limit of 2,000, a fresh-user trial)."""
    if len(text) <= limit:
        return text
    keep = max(limit - len(f"... ({len(text)} more characters)"), 0)  # the note's count has at most this many digits
    return f"{text[:keep]}... ({len(text) - keep} more characters)"
_mp_error_decoder = msgspec.msgpack.Decoder(ErrorReply)
_json_error_decoder = msgspec.json.Decoder(ErrorReply)


def encode_error(
    err: BaseException, content_type: str | None = None
) -> tuple[dict[str, str], bytes]:
    """Encode an error as NATS micro error headers plus an :class:`ErrorReply` body.

    Args:
        err: the error. An exception that is not an :class:`InferbusError` is sent as
            INTERNAL with message ``"<TypeName>: <text>"``.
        content_type: the request's Content-Type; JSON (``application/json``, with or
            without parameters) gives a JSON body, anything else MessagePack.

    Returns:
        ``(headers, body)``: headers ``Nats-Service-Error`` (the message, CR/LF
        replaced by spaces), ``Nats-Service-Error-Code`` (e.g. ``"400"``),
        ``Inferbus-Error-Code`` (e.g. ``"INVALID_ARGUMENT"``) and ``Content-Type``. The
        message is cut to :data:`MAX_ERROR_MESSAGE_CHARS` characters and the field to
        :data:`MAX_ERROR_FIELD_CHARS`, so that a reply stays a few KB whatever the request echoed.

    Source: NATS micro service error convention (ADR-32, ``Nats-Service-Error*``).
    """
    if not isinstance(err, InferbusError):
        text = str(err)
        err = Internal(f"{type(err).__name__}: {text}" if text else type(err).__name__)
    code = err.code
    message, field = err.message, err.field
    if len(message) > MAX_ERROR_MESSAGE_CHARS:
        message = _cut(message, MAX_ERROR_MESSAGE_CHARS)
    if field is not None and len(field) > MAX_ERROR_FIELD_CHARS:
        field = _cut(field, MAX_ERROR_FIELD_CHARS)
    detail = ErrorDetail(
        code=code.value,
        message=message,
        field=field,
        retry_after_ms=err.retry_after_ms,
    )
    from ._codec import JSON, MSGPACK, is_json  # _codec imports this module

    if is_json(content_type):
        body = _json_encoder.encode(ErrorReply(detail))
        ctype = JSON
    else:
        body = _mp_encoder.encode(ErrorReply(detail))
        ctype = MSGPACK
    headers = {
        H_SERVICE_ERROR: _header_safe(message),
        H_SERVICE_ERROR_CODE: str(code.http_status),
        H_ERROR_CODE: code.value,
        H_CONTENT_TYPE: ctype,
    }
    return headers, body


def _header_safe(text: str) -> str:
    # A NATS header value cannot hold CR or LF; the body keeps the exact text.
    if "\r" in text or "\n" in text:
        text = text.replace("\r\n", " ").replace("\r", " ").replace("\n", " ")
    return text


def _header(headers: dict[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    lname = name.lower()
    for key, val in headers.items():
        if key.lower() == lname:
            return val
    return None


def decode_error(headers: dict[str, str] | None, body: bytes | memoryview) -> InferbusError | None:
    """Turn an error reply back into the :class:`InferbusError` it encodes.

    A message is an error reply when its headers carry ``Nats-Service-Error-Code``,
    ``Nats-Service-Error`` or ``Inferbus-Error-Code`` (header names matched
    case-insensitively); otherwise this returns None without reading the body.

    The class comes from the body's ``code``, else ``Inferbus-Error-Code``, else the
    HTTP status in ``Nats-Service-Error-Code`` (so plain NATS micro services map too),
    else :class:`Internal`; an unknown code also gives :class:`Internal`. The message,
    field and retry hint come from the body when it decodes (JSON when it starts with
    ``{``, MessagePack otherwise), else from ``Nats-Service-Error``.

    Never raises for a malformed error reply: the worst case is an :class:`Internal`
    carrying whatever text was found.
    """
    if not headers:
        return None
    status = _header(headers, H_SERVICE_ERROR_CODE)
    header_msg = _header(headers, H_SERVICE_ERROR)
    header_code = _header(headers, H_ERROR_CODE)
    if status is None and header_msg is None and header_code is None:
        return None

    detail: ErrorDetail | None = None
    if body:
        try:
            if bytes(body[:1]) == b"{":
                detail = _json_error_decoder.decode(body).error
            else:
                detail = _mp_error_decoder.decode(body).error
        except (msgspec.DecodeError, msgspec.ValidationError):
            detail = None

    cls: type[InferbusError] | None = None
    for candidate in (detail.code if detail else None, header_code):
        if candidate:
            try:
                cls = error_class(candidate)
                break
            except ValueError:
                continue
    if cls is None and status is not None:
        try:
            cls = _BY_STATUS.get(int(status.strip()))
        except ValueError:
            cls = None
    if cls is None:
        cls = Internal

    if detail is not None:
        return cls(detail.message, field=detail.field, retry_after_ms=detail.retry_after_ms)
    return cls(header_msg or f"error reply with status {status or 'unknown'}")
