"""The KServe Open Inference Protocol v2 REST inference API on the node's HTTP port (``inferbus up --http-port``,
alias ``--metrics-port``; docs/http.md): server metadata, model metadata and inference, bridged to the ingresses over
NATS on the node's own connection.

Source: the protocol's HTTP/REST API, https://kserve.github.io/website/docs/concepts/architecture/data-plane/v2-protocol
("Server Metadata", "Model Metadata", "Inference"; errors as ``{"error": "<message>"}``), and its binary tensor
extension as Triton documents it (https://github.com/triton-inference-server/server/blob/main/docs/protocol/
extension_binary_data.md).

==========================================================  ============================================================
``GET /v2``                                                 server metadata: the ingress's ``<p>.server`` answer, its
                                                            ``extensions`` those served over HTTP
                                                            (:data:`HTTP_EXTENSIONS`)
``GET /v2/models/<name>[/versions/<v>]``                    model metadata: ``<p>.models.<name>[.<v>]``'s JSON, as is
``POST /v2/models/<name>[/versions/<v>]/infer``             inference: ``<p>.infer.<name>[.<v>]``
==========================================================  ============================================================

A JSON inference body goes to the ingress as it came (``Content-Type: application/json``), and the ingress's JSON
answer is the HTTP body: the gateway parses neither. Only a request that uses the binary tensor extension (an
``Inference-Header-Content-Length`` header, or the text ``"binary_data`` in the body: a ``binary_data_output`` or
``binary_data`` parameter) is taken apart here: its JSON header and binary tensors become one MessagePack request
(each binary input as ``raw``), and the answer's outputs asked for in binary come back after the JSON header. An
error answer is the ingress's typed error as HTTP: its code's status (INVALID_ARGUMENT 400, NOT_FOUND 404,
PAYLOAD_TOO_LARGE 413, RESOURCE_EXHAUSTED 429, INTERNAL 500, UNAVAILABLE 503, DEADLINE_EXCEEDED 504), the OIP body
``{"error": "<message>"}``, and the headers ``Inferbus-Error-Code`` (the code), ``Inferbus-Error-Field`` (the
offending field, when there is one) and ``Retry-After`` (whole seconds, rounded up, when the ingress gave a hint).

The NATS path does not pass through here: the gateway runs in the node process (its HTTP server's threads, the
requests on the node's event loop, the supervisors' loop), not in an ingress, and an HTTP request costs an ingress
what the same NATS request costs it.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Mapping

HTTP_EXTENSIONS = ("binary_tensor_data", "statistics", "model_repository")
"""The OIP v2 extensions served over HTTP, as ``GET /v2`` lists them (:mod:`inferbus.actors._httpext`: statistics,
and the model repository's index, load and unload, the latter two only with ``--http-model-control``)."""

BINARY_HEADER = "Inference-Header-Content-Length"
"""The binary tensor extension's header: the byte length of the JSON part at the start of the body."""

BOUND_SLACK_S = 0.5
"""How much longer than a request's budget the HTTP thread waits for the node's event loop, seconds; past it the
answer is 504."""

METADATA_TIMEOUT_S = 1.0
"""The budget of a metadata request, seconds (as :meth:`Client.model`'s default)."""

_PASSED_HEADERS = ("Inferbus-Request-Id", "Inferbus-Client-Id", "Inferbus-Hedge", "traceparent", "tracestate")
"""HTTP request headers passed on to the ingress as they came (docs/architecture.md, "Headers")."""


@dataclass(frozen=True)
class HttpAnswer:
    """One HTTP answer of the gateway.

    Attributes:
        status: the HTTP status code.
        body: the body's bytes (JSON unless ``headers`` says otherwise).
        headers: headers beyond ``Content-Length`` (``Content-Type`` included where there is a body).
    """

    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


_CODE_OF_STATUS = {403: "PERMISSION_DENIED", 408: "DEADLINE_EXCEEDED", 414: "PAYLOAD_TOO_LARGE",
                   431: "PAYLOAD_TOO_LARGE", 501: "INVALID_ARGUMENT", 502: "INTERNAL", 505: "INVALID_ARGUMENT"}
"""The HTTP layer's own statuses that are no :class:`~inferbus.schemas.ErrorCode`'s (docs/http.md, "Errors")."""


def error_code_of(status: int) -> str:
    """The ``Inferbus-Error-Code`` of an HTTP error ``status`` (400-599): the :class:`~inferbus.schemas.ErrorCode`
    whose HTTP status it is (400 INVALID_ARGUMENT, 404 NOT_FOUND, 413 PAYLOAD_TOO_LARGE, 429 RESOURCE_EXHAUSTED, 500
    INTERNAL, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED), else the HTTP layer's: 403 PERMISSION_DENIED, 408
    DEADLINE_EXCEEDED, 414 and 431 PAYLOAD_TOO_LARGE, 501 (a transfer coding not understood) and 505 (an HTTP
    version not served) INVALID_ARGUMENT (the client's request that cannot be read, not a fault of the server), 502
    INTERNAL; any other 4xx (405, 411, 415, ...) INVALID_ARGUMENT, any other 5xx INTERNAL."""
    from ..schemas import ErrorCode

    for code in ErrorCode:
        if code.http_status == status:
            return code.value
    return _CODE_OF_STATUS.get(status) or ("INVALID_ARGUMENT" if status < 500 else "INTERNAL")


def error_answer(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> HttpAnswer:
    """An OIP v2 error answer: ``status`` and the body ``{"error": message}`` (JSON), with ``Inferbus-Error-Code``
    (:func:`error_code_of` ``status``, unless ``headers`` has one) and ``headers``."""
    if not any(k == "Inferbus-Error-Code" for k, _ in headers):
        headers = (("Inferbus-Error-Code", error_code_of(status)), *headers)
    return HttpAnswer(status, json.dumps({"error": message}).encode(),
                      (("Content-Type", "application/json"), *headers))


def from_error(err) -> HttpAnswer:
    """The HTTP answer of an :class:`~inferbus.schemas.InferbusError`: its code's HTTP status, ``{"error": its
    message}``, and ``Inferbus-Error-Code``, ``Inferbus-Error-Field`` (when it has a field) and ``Retry-After``
    (seconds, rounded up, when it has ``retry_after_ms``)."""
    headers = [("Inferbus-Error-Code", err.code.value)]
    if err.field:
        headers.append(("Inferbus-Error-Field", _header_text(err.field)))
    if err.retry_after_ms is not None:
        headers.append(("Retry-After", str(max(1, math.ceil(err.retry_after_ms / 1000.0)))))
    return error_answer(err.code.http_status, err.message, tuple(headers))


def _header_text(value: str) -> str:
    """``value`` as an HTTP header value can carry it (latin-1, no line breaks, at most 200 characters)."""
    value = " ".join(value.split())[:200]
    return value.encode("latin-1", "replace").decode("latin-1")


class NodeGateway:
    """The OIP v2 REST metadata and inference of one running :class:`~inferbus.actors.Node`, asked from the HTTP
    server's threads.

    Each method blocks its calling thread (never the node's loop) until the answer or the request's budget (plus
    :data:`BOUND_SLACK_S`) and never raises: whatever goes wrong is an :class:`HttpAnswer` with the status.

    Args:
        node: the node (its ``nc``, ``config.prefix``, ``config.ingress_options``, ``http_calls``).
        loop: the node's event loop (where its NATS connection works).
    """

    def __init__(self, node, loop: asyncio.AbstractEventLoop) -> None:
        from ._config import IngressConfig

        self.node = node
        self.loop = loop
        options = node.config.ingress_options
        self.default_timeout_ms = float(options.get("default_timeout_ms", IngressConfig.default_timeout_ms))
        self.max_request_bytes = int(options.get("max_request_bytes", 0) or 0)
        self.infer_enabled = bool(getattr(node.config, "http_infer", False))
        """Whether ``POST .../infer`` is served (``NodeConfig.http_infer``, ``up --http-infer``); off: 403."""
        self.model_control_enabled = bool(getattr(node.config, "http_model_control", False))
        """Whether ``POST /v2/repository/models/<m>/load|unload`` are served (``NodeConfig.http_model_control``,
        ``up --http-model-control``); off: 403."""
        self._client = None

    def max_body_bytes(self) -> int:
        """The largest request body accepted, bytes: the ingresses' ``max_request_bytes`` (``--max-request-bytes``),
        else the NATS server's ``max_payload`` (0 while not connected: unknown)."""
        if self.max_request_bytes:
            return self.max_request_bytes
        nc = self.node.nc
        return int(getattr(nc, "max_payload", 0) or 0) if nc is not None else 0

    # ------------------------------------------------------------------ the three calls

    def server_metadata(self) -> HttpAnswer:
        """``GET /v2``: the ingress's OIP v2 server metadata (``<p>.server``), ``extensions`` replaced by
        :data:`HTTP_EXTENSIONS`; 503/504 when no ingress answers within :data:`METADATA_TIMEOUT_S`."""

        async def ask(client):
            body, ct = await client.request(client.subjects.server, b"", timeout_s=METADATA_TIMEOUT_S,
                                            content_type="application/json")
            meta = json.loads(body)
            meta["extensions"] = list(HTTP_EXTENSIONS)
            return HttpAnswer(200, json.dumps(meta).encode(), (("Content-Type", "application/json"),))

        return self._run(ask, METADATA_TIMEOUT_S)

    def model_metadata(self, name: str, version: str | None) -> HttpAnswer:
        """``GET /v2/models/<name>[/versions/<version>]``: the ingress's OIP v2 model metadata JSON, as it answers
        ``<p>.models.<name>[.<version>]`` (``name``, ``versions``, ``platform``, ``inputs``/``outputs`` with
        ``name``, ``datatype``, ``shape``, -1 for a variable dimension, ``parameters``). 404 for an unknown model or
        version; 400 for a name or version that cannot be one; 503/504 when no ingress answers in time."""
        from ..client import _subject_token, _version_token
        from ..schemas import InvalidArgument

        try:
            subject_name = _subject_token(name, "model")
            version = _version_token(version)
        except InvalidArgument as err:
            return from_error(err)

        async def ask(client):
            subject = client.subjects.model(subject_name) + (f".{version}" if version is not None else "")
            body, ct = await client.request(subject, b"", timeout_s=METADATA_TIMEOUT_S,
                                            content_type="application/json")
            return HttpAnswer(200, body, (("Content-Type", "application/json"),))

        return self._run(ask, METADATA_TIMEOUT_S)

    def infer(self, name: str, version: str | None, body: bytes, headers: Mapping[str, str],
              started_at: float | None = None) -> HttpAnswer:
        """``POST /v2/models/<name>[/versions/<version>]/infer``: one inference through the ingresses' queue group
        (``<p>.infer.<name>[.<version>]``), as a NATS JSON client sends it.

        Args:
            name, version: from the path (``version`` None: the model's default version).
            body: the HTTP body: the OIP v2 JSON inference request, or with ``Inference-Header-Content-Length`` the
                binary tensor extension's JSON header and tensor bytes; MessagePack when ``Content-Type`` is
                ``application/msgpack`` (a 200 answered in MessagePack; an error in JSON, as every error answer:
                OIP v2's ``{"error": ...}``).
            headers: the HTTP request headers, names in any case (``Inferbus-Timeout-Ms``: the budget, ms, read as
                the ingress reads it; absent: the ingresses' ``--default-timeout-ms``; ``Inferbus-Request-Id``,
                ``Inferbus-Client-Id``, ``Inferbus-Hedge``, ``traceparent``, ``tracestate`` passed on).
            started_at: when the request arrived (``time.monotonic()`` s; None: now): the budget counts from it.

        Returns:
            200 with the ingress's answer (OIP v2 inference response, JSON unless asked otherwise; with binary
            outputs asked for, the JSON header then the outputs' bytes, ``Inference-Header-Content-Length`` saying
            where they start), or the error answer of :func:`from_error`: 400 (a malformed body, header or tensor,
            a wrong datatype, an unknown input), 404 (unknown model or version), 413 (over the body limit), 429,
            503, 504 (the budget ran out, or was 0 or less on arrival).
        """
        from ..bus import _headers as H
        from ..client import _subject_token, _version_token
        from ..schemas import DeadlineExceeded, InferbusError

        t0 = time.monotonic() if started_at is None else started_at
        lower = {k.lower(): v for k, v in headers.items()}
        try:
            subject_name = _subject_token(name, "model")
            version = _version_token(version)
            budget_ms = H.budget_ms(lower.get(H.TIMEOUT_MS.lower()), self.default_timeout_ms, strict=True)
            if budget_ms <= 0:
                raise DeadlineExceeded(f"the request's budget ({H.TIMEOUT_MS}) was already spent on arrival")
            encoding = lower.get("content-encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                return error_answer(415, f"Content-Encoding {encoding!r} is not accepted: send the body uncompressed")
            extra = {h: H.header_value(lower[h.lower()]) for h in _PASSED_HEADERS if h.lower() in lower}
            msgpack_in = (lower.get("content-type") or "").split(";")[0].strip().lower() in (
                "application/msgpack", "application/x-msgpack", "application/vnd.msgpack")
            if msgpack_in and BINARY_HEADER.lower() in lower:  # (the header was ignored until 2026-12-07)
                from ..schemas import InvalidArgument

                raise InvalidArgument(f"a MessagePack body (Content-Type: {lower['content-type'][:60]}) with "
                                      f"{BINARY_HEADER}: the binary tensor extension's body is a JSON header then "
                                      "the tensors' bytes; send it with Content-Type: application/json (or none), "
                                      f"or a MessagePack body without {BINARY_HEADER} (its tensors as raw bytes)",
                                      field=BINARY_HEADER)
            binary = None
            if not msgpack_in and (BINARY_HEADER.lower() in lower or b'"binary_data' in body):
                binary = _BinaryRequest.parse(body, lower.get(BINARY_HEADER.lower()))
        except InferbusError as err:
            return from_error(err)
        request_id = extra.pop("Inferbus-Request-Id", None)
        if binary is not None and binary.msgpack_body is not None:
            body, content_type = binary.msgpack_body, None
        else:
            content_type = None if msgpack_in else "application/json"
        budget_s = budget_ms / 1000.0

        async def ask(client):
            resp, rct = await client.request(client.subjects.infer(subject_name, version), body, timeout_s=budget_s,
                                             request_id=request_id, content_type=content_type,
                                             headers=extra or None, started_at=t0)
            return HttpAnswer(200, resp, (("Content-Type", rct or "application/msgpack"),))

        answer = self._run(ask, budget_s - (time.monotonic() - t0))
        if binary is None or answer.status != 200:
            return answer
        try:  # (on this thread, not the node's loop)
            return binary.answer(answer.body, dict(answer.headers)["Content-Type"])
        except InferbusError as err:
            return error_answer(502, f"the ingress's answer could not be read: {err.message}")

    # ------------------------------------------------------------------ on the node's loop

    def run_then(self, ask, wait_s: float, then) -> HttpAnswer:
        """``then(result)`` on this thread, ``result`` being what ``ask(client)`` (a coroutine function run on the
        node's loop, as :meth:`_run` runs it) returned; or :meth:`_run`'s error answer (the node stopping, no NATS
        connection, a typed error ``ask`` raised, no answer within ``wait_s`` + :data:`BOUND_SLACK_S`). For the
        answers the HTTP extensions (:mod:`inferbus.actors._httpext`) build off the node's loop."""
        box: list = []
        done = HttpAnswer(200)

        async def keep(client):
            box.append(await ask(client))
            return done

        got = self._run(keep, wait_s)
        return then(box[0]) if got is done else got

    def _run(self, ask, wait_s: float) -> HttpAnswer:
        """Run ``ask(client)`` (a coroutine function) on the node's loop; wait ``wait_s`` + :data:`BOUND_SLACK_S`
        at most."""
        from ._probes import on_node_loop

        def failed(why: str, text: str) -> HttpAnswer:
            if why == "timeout":
                return error_answer(504, text)
            return error_answer(503, text) if why == "stopped" else error_answer(500, f"the HTTP gateway {text}")

        return on_node_loop(self.loop, self._ask(ask), max(wait_s, 0.0) + BOUND_SLACK_S, failed,
                            getattr(self.node, "http_calls", None))

    async def _ask(self, ask) -> HttpAnswer:
        from ..client import Client
        from ..schemas import InferbusError

        node = self.node
        # (no refusal when the node is stopping: the HTTP server answers a request that came after the stop began
        # 503 itself, and one received before it is served: the node's stop waits for it, its drain)
        nc = node.nc
        # while nats-py reconnects (the embedded nats-server restarted, a blip) the request is kept in its buffer
        # and answered within its budget, as an SDK client's is (a fresh-user trial: 503 at once, the node back 1.8 s
        # later); only a connection that is gone for good or was never made is refused at once
        if nc is None or nc.is_closed:
            return error_answer(503, f"node {node.config.node_id} is not connected to NATS",
                                (("Retry-After", "1"),))
        if self._client is None or self._client.nc is not nc:  # (made on the loop: it keeps the loop it runs on)
            self._client = Client(nc, node.config.prefix)
        try:
            return await ask(self._client)
        except InferbusError as err:
            return from_error(err)
        except ValueError as exc:  # an answer that is not what it should be (JSON of server metadata)
            return error_answer(502, f"the ingress's answer could not be read: {exc}")


def _shown(value) -> str:
    """A JSON value as a message shows it: a scalar as JSON (100 characters at most), a container by its kind."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return json.dumps(value)[:100]


class _BinaryRequest:
    """A request that uses the binary tensor extension, taken apart: what the ingress gets, and how the answer's
    outputs are written (which in binary)."""

    def __init__(self, msgpack_body: bytes | None, all_binary: bool, per_output: dict[str, bool]) -> None:
        self.msgpack_body = msgpack_body
        self.all_binary = all_binary
        self.per_output = per_output

    @classmethod
    def parse(cls, body: bytes, header_length: str | None) -> "_BinaryRequest":
        """Read the JSON header (``body[:header_length]``, all of it when None) and the binary tensors after it.

        The JSON is read with the ingress's decoder (:func:`inferbus.schemas.decode`), so a body nested too deeply
        is refused as the ingress refuses it (400, ``the request body is nested too deeply to decode ...``); until
        2026-12-07 ``json.loads`` raised RecursionError past ~1,000 levels: a 500 and a traceback in the log. A
        whole body it refuses goes to the ingress as it came (which answers it in the same words).

        Raises:
            InvalidArgument: ``Inference-Header-Content-Length`` is not a length within the body; the header is not
                a JSON object (malformed, nested too deeply: the ingress's words, then which bytes); an input's
                ``binary_data_size`` is not an integer >= 0; the sizes do not add up to the bytes after the header.
        """
        from typing import Any

        from ..schemas import JSON, InvalidArgument, decode

        if header_length is None:
            try:
                req = decode(body, Any, JSON, what="request")
            except InvalidArgument:
                return cls(None, False, {})  # the ingress says what is wrong with it, as for any JSON body
            if not isinstance(req, dict):
                return cls(None, False, {})
            return cls._options(req, None)
        try:
            n = int(header_length.strip())
        except ValueError:
            n = -1
        if not 0 <= n <= len(body):
            raise InvalidArgument(f"{BINARY_HEADER} must be the byte length of the JSON header, from 0 to the body's "
                                  f"{len(body)} bytes, got {header_length[:40]!r}", field=BINARY_HEADER)
        try:
            req = decode(body[:n], Any, JSON, what="request")
        except InvalidArgument as err:  # the ingress's words, and which bytes they are about
            raise InvalidArgument(f"{err.message} (the JSON header: the body's first {n} bytes, {BINARY_HEADER})",
                                  field="body") from None
        if not isinstance(req, dict):
            raise InvalidArgument(f"the JSON header ({BINARY_HEADER}) is not an object: an OIP v2 inference request "
                                  f"is one", field="body")
        offset = n
        inputs = req.get("inputs")
        for i, t in enumerate(inputs if isinstance(inputs, list) else ()):
            params = t.get("parameters") if isinstance(t, dict) else None
            if not isinstance(params, dict) or "binary_data_size" not in params:
                continue
            size = params.pop("binary_data_size")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise InvalidArgument(f"binary_data_size must be an integer >= 0 (bytes), got {size!r}",
                                      field=f'inputs[{i}].parameters["binary_data_size"]')
            if offset + size > len(body):
                raise InvalidArgument(f"inputs[{i}]'s binary_data_size of {size} bytes goes past the body's end: "
                                      f"{len(body) - offset} bytes are left after the header and the inputs before",
                                      field=f'inputs[{i}].parameters["binary_data_size"]')
            t["raw"] = body[offset:offset + size]
            offset += size
            if not params:
                del t["parameters"]
        if offset != len(body):
            raise InvalidArgument(f"{len(body) - offset} bytes of the body follow the JSON header and the binary "
                                  f"inputs (binary_data_size adds up to {offset - n} of the {len(body) - n})",
                                  field="body")
        return cls._options(req, req)

    @classmethod
    def _options(cls, req: dict, send: dict | None) -> "_BinaryRequest":
        import msgspec

        from ..schemas import InvalidArgument

        params = req.get("parameters")
        if isinstance(params, dict) and not isinstance(params.get("binary_data_output", False), bool):
            raise InvalidArgument(f"binary_data_output must be true or false, got "
                                  f"{_shown(params['binary_data_output'])}",
                                  field='parameters["binary_data_output"]')
        all_binary = isinstance(params, dict) and params.get("binary_data_output") is True
        if isinstance(params, dict) and send is not None:
            params.pop("binary_data_output", None)  # (read here: it would only split the cache)
            if not params:
                del req["parameters"]
        per_output: dict[str, bool] = {}
        outputs = req.get("outputs")
        for i, o in enumerate(outputs if isinstance(outputs, list) else ()):
            if isinstance(o, dict) and isinstance(o.get("name"), str) and isinstance(o.get("parameters"), dict):
                flag = o["parameters"].get("binary_data")
                if flag is not None and not isinstance(flag, bool):
                    raise InvalidArgument(f"outputs[{i}]'s binary_data must be true or false, got "
                                          f"{_shown(flag)}", field=f'outputs[{i}].parameters["binary_data"]')
                if isinstance(flag, bool):
                    per_output[o["name"]] = flag
                    if send is not None:
                        del o["parameters"]["binary_data"]
                        if not o["parameters"]:
                            del o["parameters"]
        if send is None:
            return cls(None, all_binary, per_output)
        try:
            return cls(msgspec.msgpack.encode(send), all_binary, per_output)
        except (msgspec.EncodeError, OverflowError) as exc:  # an integer beyond 64 bits in the JSON header
            from ..schemas import InvalidArgument

            raise InvalidArgument(f"the JSON header ({BINARY_HEADER}) holds a value MessagePack cannot carry: {exc}",
                                  field="body") from None
        except RecursionError:  # (decoded a few frames higher up the stack: a header just under the decoder's bound)
            from ..schemas import InvalidArgument

            raise InvalidArgument("the request body is nested too deeply to encode as MessagePack (arrays/maps "
                                  "inside each other beyond the interpreter's recursion limit)", field="body") from None

    def answer(self, resp: bytes, content_type: str | None) -> HttpAnswer:
        """The HTTP answer for the ingress's reply ``resp``: JSON with the outputs asked in binary as
        ``parameters.binary_data_size`` and their bytes after it (``Inference-Header-Content-Length``), or plain
        JSON when none is."""
        import msgspec

        from ..schemas import decode_response, encode_response, output_from_numpy, output_to_numpy

        r = decode_response(resp, content_type)
        blobs: list[bytes | None] = []
        outs = []
        for i, o in enumerate(r.outputs):
            binary = self.per_output.get(o.name, self.all_binary)
            if binary:
                blob = bytes(o.raw) if o.raw is not None else output_from_numpy(
                    o.name, output_to_numpy(o, field=f"outputs[{i}]"), raw=True).raw
                blobs.append(blob)
                outs.append(msgspec.structs.replace(o, data=None, raw=None))
            else:
                blobs.append(None)
                outs.append(o if o.raw is None else output_from_numpy(o.name, output_to_numpy(o, field=f"outputs[{i}]"),
                                                                      raw=False))
        head = encode_response(msgspec.structs.replace(r, outputs=outs), "application/json")
        if not any(b is not None for b in blobs):
            return HttpAnswer(200, head, (("Content-Type", "application/json"),))
        doc = json.loads(head)
        for out, blob in zip(doc["outputs"], blobs):
            if blob is not None:
                out["parameters"] = {"binary_data_size": len(blob)}
        head = json.dumps(doc, separators=(",", ":")).encode()
        return HttpAnswer(200, b"".join([head, *(b for b in blobs if b is not None)]),
                          (("Content-Type", "application/octet-stream"), (BINARY_HEADER, str(len(head)))))


def status_line(status: int) -> str:
    """``"404 Not Found"``: the WSGI status line of ``status``."""
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Error"
