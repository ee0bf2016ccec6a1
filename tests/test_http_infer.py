"""``inferbus up --http-port`` (alias of ``--metrics-port``): the KServe OIP v2 REST metadata and inference paths, as
a Triton/KServe HTTP client uses them (``GET /v2``, ``GET /v2/models/<m>[/versions/<v>]``, ``POST
/v2/models/<m>[/versions/<v>]/infer``, the binary tensor extension), against a real node (1 ingress, 1 worker,
embedded NATS and Valkey, ``--max-request-bytes 1 MiB``), each answer compared with what the same request gets over
NATS from :class:`inferbus.SyncClient`. HTTP with http.client; an optional test with ``tritonclient[http]``."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import struct
import time

import numpy as np
import pytest

from inferbus._version import __version__
from conftest import MODELS, command_lines, start_deployment
from inferbus import SyncClient
from inferbus.schemas import InvalidArgument

pytestmark = pytest.mark.timeout(120)

LIMIT_BYTES = 1 << 20


def http_address(dep) -> str:
    """``host:port`` of the OIP v2 REST line ``up`` prints after its ``inferbus up`` line."""
    deadline = time.monotonic() + 10
    while not (m := re.search(rb"OIP v2 REST http://(127\.0\.0\.1|0\.0\.0\.0):(\d+)/v2", dep.log.read_bytes())):
        assert time.monotonic() < deadline, dep.log.read_text()[-2000:]
        time.sleep(0.05)
    return f"127.0.0.1:{m.group(2).decode()}"  # (a node on every interface is reached on this host's)


def serving(dep):
    """Yield the started deployment ``dep`` with its ``http_address`` and a connected :class:`SyncClient` as
    ``client``; stop it after (a module fixture's body)."""
    try:
        dep.http_address = http_address(dep)
        with SyncClient.connect(dep.nats_url, dep.prefix) as client:
            dep.client = client
            yield dep
    finally:
        dep.stop()


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("http_infer")
    yield from serving(start_deployment(root / "dep", workers=1, prefix="hi",
                                        extra=["--ingress", "1", "--http-port", "0", "--http-host", "127.0.0.1",
                                               "--http-infer", "--http-idle-timeout-s", "3",
                                               "--max-request-bytes", str(LIMIT_BYTES)]))


@pytest.fixture(scope="module")
def pixels() -> np.ndarray:
    return np.load(MODELS / "digits" / "data" / "test.npz")["X"][:5].astype(np.float32)


def ask(node, path: str, method: str = "GET", body: bytes | None = None,
        headers: dict | None = None) -> tuple[int, dict[str, str], bytes]:
    """``(status, headers (lower-case names), body)`` of one HTTP request to the node's HTTP port."""
    host, port = node.http_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def post_json(node, path: str, doc, headers: dict | None = None):
    return ask(node, path, "POST", json.dumps(doc).encode(), {"Content-Type": "application/json", **(headers or {})})


def digits_request(x: np.ndarray, datatype: str = "FP32", **more) -> dict:
    return {"inputs": [{"name": "pixels", "datatype": datatype, "shape": list(x.shape), "data": x.ravel().tolist()}],
            **more}


def outputs_of(doc: dict) -> dict[str, np.ndarray]:
    """A JSON OIP v2 response's outputs (``data`` form) as numpy arrays of their datatype."""
    dtypes = {"FP32": np.float32, "INT32": np.int32}
    return {o["name"]: np.array(o["data"], dtype=dtypes[o["datatype"]]).reshape(o["shape"]) for o in doc["outputs"]}


def test_server_metadata_names_inferbus_its_version_and_the_extensions_served_over_http(node):
    status, headers, body = ask(node, "/v2")
    assert status == 200 and headers["content-type"] == "application/json", (status, body)
    assert json.loads(body) == {"name": "inferbus", "version": __version__,
                                "extensions": ["binary_tensor_data", "statistics", "model_repository"]}
    assert node.client.server_metadata().name == "inferbus"
    status, headers, body = ask(node, "/v2", "HEAD")
    assert (status, body) == (200, b"") and int(headers["content-length"]) > 0


def test_model_metadata_is_the_ingress_answer_404_for_unknown_400_for_malformed(node):
    status, headers, body = ask(node, "/v2/models/digits")
    assert status == 200 and headers["content-type"] == "application/json", (status, body)
    meta = json.loads(body)
    over_nats = node.client.model("digits")
    assert meta["name"] == "digits" and meta["versions"] == over_nats.versions == ["1", "2"]
    assert meta["platform"] == over_nats.platform == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]
    assert [o["name"] for o in meta["outputs"]] == ["logits", "probabilities"]
    assert all(o["shape"] == [-1, 10] and o["datatype"] == "FP32" for o in meta["outputs"])
    status, _, body = ask(node, "/v2/models/digits/versions/2")
    assert status == 200 and json.loads(body)["parameters"]["version"] == "2", body
    for path, want, text in (("/v2/models/no_such_model", 404, "unknown model 'no_such_model'"),
                             ("/v2/models/digits/versions/9", 404, "has no version '9'"),
                             ("/v2/models/digits/versions/v1", 400, "version 'v1' is not a number"),
                             ("/v2/models/a.b", 400, "")):
        status, headers, body = ask(node, path)
        assert status == want and headers["content-type"] == "application/json", (path, status, body)
        assert text in json.loads(body)["error"], (path, body)


@pytest.mark.parametrize("version", [None, "2"])
def test_infer_answers_what_the_same_request_gets_over_nats(node, pixels, version):
    path = "/v2/models/digits" + (f"/versions/{version}" if version else "") + "/infer"
    status, headers, body = post_json(node, path, digits_request(pixels, id="http-7"))
    assert status == 200 and headers["content-type"] == "application/json", (status, body)
    doc = json.loads(body)
    assert doc["model_name"] == "digits" and doc["id"] == "http-7"
    assert doc["model_version"] == (version or "1")
    got = outputs_of(doc)
    want = node.client.infer("digits", {"pixels": pixels}, version=version)
    assert set(got) == set(want) == {"logits", "probabilities"}
    for name in want:
        assert got[name].shape == (5, 10)
        np.testing.assert_array_equal(got[name], want[name])
    assert got["logits"].argmax(1).tolist() == want["logits"].argmax(1).tolist()


def test_the_json_body_goes_through_unparsed_and_the_reply_comes_back_as_the_body(node, pixels):
    """The HTTP body is the bytes a NATS JSON client sends: the reply is the bytes it gets (an unknown top-level field
    included, ignored by the ingress as on NATS)."""
    raw = json.dumps({**digits_request(pixels[:1], id="same"), "x_extra": 1}).encode()
    status, _, http_body = ask(node, "/v2/models/digits/infer", "POST", raw, {"Content-Type": "application/json"})
    nats_body, ct = node.client.request("hi.infer.digits", raw, timeout_s=2.0, content_type="application/json")
    assert status == 200 and ct == "application/json"
    a, b = json.loads(http_body), json.loads(nats_body)
    assert a["outputs"] == b["outputs"] and a["id"] == b["id"] == "same"


def test_malformed_body_is_400_with_the_ingress_message(node):
    bad = b'{"inputs": [{"name": "pixels", "datatype": "FP32", "shape": "1x64", "data": []}]}'
    status, headers, body = ask(node, "/v2/models/digits/infer", "POST", bad, {"Content-Type": "application/json"})
    with pytest.raises(InvalidArgument) as over_nats:
        node.client.request("hi.infer.digits", bad, timeout_s=2.0, content_type="application/json")
    assert status == 400 and headers["content-type"] == "application/json", (status, body)
    assert json.loads(body) == {"error": over_nats.value.message}
    assert headers["inferbus-error-code"] == "INVALID_ARGUMENT"
    assert headers["inferbus-error-field"] == over_nats.value.field == "inputs[0].shape"
    status, _, body = ask(node, "/v2/models/digits/infer", "POST", b"not json", {"Content-Type": "application/json"})
    assert status == 400 and "malformed JSON" in json.loads(body)["error"], body


def test_wrong_datatype_is_400_unknown_model_404(node, pixels):
    status, headers, body = post_json(node, "/v2/models/digits/infer",
                                      digits_request((pixels[:1] * 16).astype(np.int32), "INT32"))
    assert status == 400, (status, body)
    assert json.loads(body) == {"error": "input 'pixels' must be FP32, got INT32"}
    assert headers["inferbus-error-field"] == "inputs[0].datatype"
    status, headers, body = post_json(node, "/v2/models/no_such_model/infer", digits_request(pixels[:1]))
    assert status == 404 and json.loads(body) == {"error": "unknown model 'no_such_model'"}, body
    assert headers["inferbus-error-code"] == "NOT_FOUND"
    status, _, body = post_json(node, "/v2/models/digits/versions/9/infer", digits_request(pixels[:1]))
    assert status == 404 and "has no version '9'" in json.loads(body)["error"], body


def test_a_messagepack_body_is_answered_in_messagepack_and_its_errors_in_json(node, pixels):
    """``Content-Type: application/msgpack``: the answer is the MessagePack a NATS client gets (``application/msgpack``);
    an error is the HTTP error every OIP v2 client reads, JSON ``{"error": "<message>"}`` (``application/json``), the
    message the NATS client's, the code and field in the headers. Over NATS the same request's error body is
    MessagePack (docs/wire.md: a reply's body is in the request's encoding); docs/http.md said the HTTP answer was
    "answered in MessagePack", errors included."""
    import msgspec

    good = msgspec.msgpack.encode(digits_request(pixels[:2], id="mp"))
    status, headers, body = ask(node, "/v2/models/digits/infer", "POST", good, {"Content-Type": "application/msgpack"})
    assert status == 200 and headers["content-type"] == "application/msgpack", (status, headers, body[:300])
    doc = msgspec.msgpack.decode(body)
    nats_body, ct = node.client.request("hi.infer.digits", good, timeout_s=2.0)
    assert ct in (None, "application/msgpack") and doc["outputs"] == msgspec.msgpack.decode(nats_body)["outputs"]
    assert doc["id"] == "mp"
    wrong = msgspec.msgpack.encode(digits_request((pixels[:1] * 16).astype(np.int32), "INT32"))
    for path, body_sent, status_want, field in (("/v2/models/digits/infer", wrong, 400, "inputs[0].datatype"),
                                                ("/v2/models/digits/infer", b"\xc1", 400, "body"),
                                                ("/v2/models/no_such_model/infer", good, 404, "model")):
        status, headers, body = ask(node, path, "POST", body_sent, {"Content-Type": "application/msgpack"})
        subject = "hi.infer." + path.split("/")[3]
        with pytest.raises(Exception) as over_nats:
            node.client.request(subject, body_sent, timeout_s=2.0)
        assert status == status_want and headers["content-type"] == "application/json", (path, status, headers, body)
        assert json.loads(body) == {"error": over_nats.value.message}, (path, body)
        assert headers["inferbus-error-code"] == over_nats.value.code.value
        assert headers["inferbus-error-field"] == over_nats.value.field == field, (path, headers)


@pytest.mark.parametrize("content_type", ["application/msgpack", "application/x-msgpack; charset=binary"])
def test_a_messagepack_body_with_the_binary_header_is_400_naming_the_header(node, pixels, content_type):
    """``Inference-Header-Content-Length`` frames a JSON header then tensor bytes; with a MessagePack body the header
    was ignored and the body decoded as MessagePack (docs/http.md said a request "with the header" was taken apart):
    the combination is a client's mistake, 400 INVALID_ARGUMENT with the header as the field."""
    import msgspec

    good = msgspec.msgpack.encode(digits_request(pixels[:1]))
    status, headers, body = ask(node, "/v2/models/digits/infer", "POST", good,
                                {"Content-Type": content_type, "Inference-Header-Content-Length": str(len(good))})
    assert status == 400 and headers["content-type"] == "application/json", (status, headers, body[:300])
    assert headers["inferbus-error-code"] == "INVALID_ARGUMENT"
    assert headers["inferbus-error-field"] == "Inference-Header-Content-Length", headers
    assert json.loads(body)["error"].startswith("a MessagePack body (Content-Type: "), body


def test_oversized_body_is_413_before_it_is_sent_and_one_at_the_limit_is_served(node, pixels):
    doc = digits_request(pixels[:1])
    small = json.dumps(doc).encode()
    at_limit = small[:-1] + b" " * (LIMIT_BYTES - len(small)) + b"}"  # (JSON white space: the same request)
    assert len(at_limit) == LIMIT_BYTES
    status, _, body = ask(node, "/v2/models/digits/infer", "POST", at_limit, {"Content-Type": "application/json"})
    assert status == 200, body
    status, headers, body = ask(node, "/v2/models/digits/infer", "POST", at_limit + b" ",
                                {"Content-Type": "application/json"})
    assert status == 413 and headers["inferbus-error-code"] == "PAYLOAD_TOO_LARGE", (status, body)
    assert json.loads(body)["error"].startswith(f"request body of {LIMIT_BYTES + 1} bytes is over the limit of "
                                                f"{LIMIT_BYTES}")


def test_timeout_header_budget_0_is_504_not_a_number_400(node, pixels):
    for value, want, text in (("0", 504, "already spent on arrival"),
                              ("abc", 400, "Inferbus-Timeout-Ms must be a number of milliseconds, got 'abc'"),
                              ("5000", 200, "")):
        status, headers, body = post_json(node, "/v2/models/digits/infer", digits_request(pixels[:1]),
                                          {"Inferbus-Timeout-Ms": value})
        assert status == want, (value, status, body)
        if text:
            assert text in json.loads(body)["error"], body


def test_a_frozen_worker_is_504_after_the_budget_not_a_hung_request(node, pixels):
    """The worker frozen (SIGSTOP; still routed to within --health-timeout-s): the request's budget runs out and
    the HTTP answer is 504 DEADLINE_EXCEEDED, the ingress's typed error, well before the HTTP client's 30 s."""
    [pid] = [pid for pid, cmd in command_lines() if "inferbus.actors worker" in cmd and str(node.run_dir) in cmd]
    os.kill(pid, signal.SIGSTOP)
    try:
        fresh = pixels[:1] + 0.5  # (not an answer the cache holds)
        status, headers, body = post_json(node, "/v2/models/digits/infer", digits_request(fresh),
                                          {"Inferbus-Timeout-Ms": "300"})
    finally:
        os.kill(pid, signal.SIGCONT)
    assert status == 504 and headers["inferbus-error-code"] == "DEADLINE_EXCEEDED", (status, body)
    assert json.loads(body)["error"], body
    status, _, body = post_json(node, "/v2/models/digits/infer", digits_request(fresh))  # thawed: served again
    assert status == 200, body


def test_methods_head_options_405_and_unknown_paths(node):
    status, headers, _ = ask(node, "/v2/models/digits/infer")
    assert status == 405 and headers["allow"] == "OPTIONS, POST"
    status, headers, _ = ask(node, "/v2/models/digits/infer", "OPTIONS")
    assert status == 200 and headers["allow"] == "OPTIONS, POST"
    status, headers, _ = ask(node, "/v2", "POST", b"{}")
    assert status == 405 and headers["allow"] == "OPTIONS, GET, HEAD"
    status, headers, _ = ask(node, "/v2/models/digits", "OPTIONS")
    assert status == 200 and headers["allow"] == "OPTIONS, GET, HEAD"
    status, headers, body = ask(node, "/v2/models/digits", "HEAD")
    assert (status, body) == (200, b"") and int(headers["content-length"]) > 100
    status, _, body = ask(node, "/v2/models/digits/explain", "POST", b"{}")
    assert status == 404 and "POST /v2/models/<name>[/versions/<version>]/infer" in json.loads(body)["error"]
    status, _, _ = ask(node, "/v2/health/ready")  # the probes are still there
    assert status == 200
    host, port = node.http_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:  # neither Content-Length nor a chunked body
        s.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 411 ")


def test_a_chunked_body_is_read(node, pixels):
    """``Transfer-Encoding: chunked`` (what a streaming client sends): read whole by the server and served; until
    2026-12-07 (wsgiref) it was 411."""
    body = json.dumps(digits_request(pixels[:1])).encode()
    half = len(body) // 2
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:half], body[half:])) + b"0\r\n\r\n"
    host, port = node.http_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunked)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    assert got.startswith(b"HTTP/1.1 200 "), got[:300]
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["model_name"] == "digits"


def test_a_node_on_this_host_only_gives_no_open_inference_note(node):
    assert b"note: inference over HTTP is open" not in node.log.read_bytes()


def test_a_burst_of_connections_is_queued_not_dropped(node, pixels):
    """50 clients that connect at once are all answered at once. The listening socket's backlog was socketserver's
    default, 5: on the 2-core box 50 parallel curls got 5 % ``Connection reset by peer`` and others a 1 s stall (the
    kernel dropped their SYN or ACK, TcpExtListenOverflows), as did every ~7th of 60 connections opened one after
    another while the accept thread waited for the GIL."""
    host, port = node.http_address.rsplit(":", 1)
    socks, waits = [], []
    try:
        for _ in range(50):  # each connects and sends a whole request; the server reads them as it accepts them
            t0 = time.monotonic()
            s = socket.create_connection((host, int(port)), timeout=10)
            waits.append(time.monotonic() - t0)
            s.sendall(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
            socks.append(s)
        assert max(waits) < 0.5, [round(w, 3) for w in waits]  # a SYN dropped on overflow is resent after 1 s
        for s in socks:
            got = b""
            while chunk := s.recv(4096):
                got += chunk
            assert got.startswith(b"HTTP/1.0 200 "), got[:200]
    finally:
        for s in socks:
            s.close()


def test_a_client_that_goes_quiet_is_closed_without_a_traceback_and_a_half_body_is_408(node):
    """Slow-loris clients: one sends half its headers, one its headers and part of its body, then nothing. The
    server closes both after its socket timeout (``--http-idle-timeout-s 3`` here; 30 s by default); the second reads
    a 408 naming it. Until 2026-12-07 each printed a Python
    traceback of ~25 lines on ``up``'s stderr (socketserver's and wsgiref's own error output, not a log record: raw
    text with ``--log-format json`` too), and the second got wsgiref's text/plain 500."""
    host, port = node.http_address.rsplit(":", 1)
    before = node.log.read_bytes()
    heads = socket.create_connection((host, int(port)), timeout=60)
    body = socket.create_connection((host, int(port)), timeout=60)
    try:
        heads.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Le")
        body.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"inputs\": [")
        got = b""
        while chunk := body.recv(4096):
            got += chunk
        assert got.startswith(b"HTTP/1.1 408 ") and b"Inferbus-Error-Code: DEADLINE_EXCEEDED" in got, got[:300]
        assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"] == "the body did not arrive: no byte came for 3 s"
        assert heads.recv(4096) == b""  # closed, nothing written (no request line was complete)
    finally:
        heads.close()
        body.close()
    time.sleep(0.5)
    new = node.log.read_bytes()[len(before):]
    assert b"Traceback" not in new and b"Exception occurred" not in new, new[-3000:].decode(errors="replace")
    status, _, _ = ask(node, "/v2/health/ready")
    assert status == 200


@pytest.mark.parametrize("length", ["1_0", "+10", "10, 10", "0x0a"])
def test_a_content_length_that_is_not_digits_is_400(node, length):
    """``Content-Length`` is 1*DIGIT (RFC 9110 8.6): until 2026-12-07 the gateway read it with ``int()``, which took
    ``1_0`` and ``+10`` as 10, where a proxy in front may read it otherwise."""
    host, port = node.http_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + length.encode() + b"\r\n\r\n{\"inputs\":")
        got = b""
        while chunk := s.recv(4096):
            got += chunk
    assert got.startswith(b"HTTP/1.1 400 ") and b"Inferbus-Error-Code: INVALID_ARGUMENT" in got, got[:300]
    assert "Content-Length" in json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]  # (the server's own check now)


def test_binary_tensor_extension_in_and_out(node, pixels):
    """Triton's binary tensor extension: the JSON header, then the input's bytes (``binary_data_size``); outputs
    asked in binary come back after the answer's JSON header, ``Inference-Header-Content-Length`` saying where."""
    header = json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [5, 64],
                                     "parameters": {"binary_data_size": pixels.nbytes}}],
                         "outputs": [{"name": "logits", "parameters": {"binary_data": True}},
                                     {"name": "probabilities", "parameters": {"binary_data": False}}]}).encode()
    status, headers, body = ask(node, "/v2/models/digits/infer", "POST", header + pixels.astype("<f4").tobytes(),
                                {"Inference-Header-Content-Length": str(len(header))})
    assert status == 200, body
    n = int(headers["inference-header-content-length"])
    doc = json.loads(body[:n])
    want = node.client.infer("digits", {"pixels": pixels})
    logits, probabilities = doc["outputs"]
    assert logits["parameters"] == {"binary_data_size": 200} and "data" not in logits
    np.testing.assert_array_equal(np.frombuffer(body[n:], "<f4").reshape(5, 10), want["logits"])
    np.testing.assert_array_equal(np.array(probabilities["data"], np.float32).reshape(5, 10), want["probabilities"])
    # a JSON body asking for every output in binary
    status, headers, body = post_json(node, "/v2/models/digits/infer",
                                      digits_request(pixels, parameters={"binary_data_output": True}))
    n = int(headers["inference-header-content-length"])
    sizes = [o["parameters"]["binary_data_size"] for o in json.loads(body[:n])["outputs"]]
    assert status == 200 and sizes == [200, 200] and len(body) == n + 400
    np.testing.assert_array_equal(np.frombuffer(body[n + 200:], "<f4").reshape(5, 10), want["probabilities"])
    # BYTES: the 4-byte little-endian length before each element, as in raw
    elems = [b"abc", "dé".encode()]
    blob = b"".join(struct.pack("<I", len(e)) + e for e in elems)
    header = json.dumps({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [2, 1],
                                     "parameters": {"binary_data_size": len(blob)}}],
                         "outputs": [{"name": "doubled", "parameters": {"binary_data": True}}]}).encode()
    status, headers, body = ask(node, "/v2/models/strings/infer", "POST", header + blob,
                                {"Inference-Header-Content-Length": str(len(header))})
    assert status == 200, body
    n = int(headers["inference-header-content-length"])
    assert body[n:] == b"".join(struct.pack("<I", 2 * len(e)) + e + e for e in elems)
    # sizes that do not add up, a header length past the body: 400 naming them
    for length, tail, text in ((len(header), blob + b"x", "1 bytes of the body follow"),
                               (len(header), blob[:-1], "goes past the body's end"),
                               (len(header) + len(blob) + 1, blob, "must be the byte length of the JSON header")):
        status, _, body = ask(node, "/v2/models/strings/infer", "POST", header + tail,
                              {"Inference-Header-Content-Length": str(length)})
        assert status == 400 and text in json.loads(body)["error"], (length, body)


@pytest.mark.parametrize("with_header", [False, True])
@pytest.mark.parametrize("where, value, field", [
    ("request", "yes", 'parameters["binary_data_output"]'),
    ("request", 1, 'parameters["binary_data_output"]'),
    ("output", "true", 'outputs[1].parameters["binary_data"]'),
    ("output", [True], 'outputs[1].parameters["binary_data"]'),
])
def test_a_binary_flag_that_is_not_a_boolean_is_400_naming_it(node, pixels, with_header, where, value, field):
    """``binary_data_output`` and an output's ``binary_data`` are booleans; until 2026-12-07 another value
    (``"yes"``) was ignored: a JSON answer, where ``binary_data_size`` not an integer was refused. 400
    INVALID_ARGUMENT naming the field, with the binary header or without."""
    doc = digits_request(pixels[:1])
    if where == "request":
        doc["parameters"] = {"binary_data_output": value}
    else:
        doc["outputs"] = [{"name": "logits"}, {"name": "probabilities", "parameters": {"binary_data": value}}]
    body = json.dumps(doc).encode()
    headers = {"Content-Type": "application/json"}
    if with_header:
        headers["Inference-Header-Content-Length"] = str(len(body))
    status, got_headers, got = ask(node, "/v2/models/digits/infer", "POST", body, headers)
    assert status == 400, got[:300]
    assert got_headers["inferbus-error-code"] == "INVALID_ARGUMENT" and got_headers["inferbus-error-field"] == field
    shown = "an array" if isinstance(value, list) else json.dumps(value)
    assert json.loads(got)["error"].endswith(f"binary_data_output must be true or false, got {shown}"
                                             if where == "request" else
                                             f"outputs[1]'s binary_data must be true or false, got {shown}"), got


def nested(depth: int) -> list:
    """``[[[...]]]``, ``depth`` lists inside each other (built without recursion)."""
    out: list = []
    for _ in range(depth - 1):
        out = [out]
    return out


def deep_json(doc: dict, depth: int) -> bytes:
    """``doc`` as JSON with its ``"@"`` string replaced by lists nested ``depth`` deep (json.dumps would recurse)."""
    return json.dumps(doc).replace('"@"', "[" * depth + "]" * depth).encode()


def no_traceback_in_the_logs(node) -> None:
    for log in (node.log, node.run_dir / "node.log"):
        text = log.read_text(errors="replace")
        assert "Traceback" not in text and "RecursionError" not in text, (log, text[-3000:])


@pytest.mark.parametrize("depth", [900, 1100, 3000, 100_000])
def test_a_body_nested_too_deeply_is_the_ingress_400_not_a_500(node, depth):
    """Lists nested past the decoders' bound (the interpreter's recursion limit, ~1,000) in a JSON body asking for
    binary outputs, and in the binary tensor extension's JSON header: 400 INVALID_ARGUMENT with the ingress's own
    message (what the same JSON body gets over NATS), the connection kept, no traceback in ``up``'s output or
    node.log. Until 2026-12-07 the gateway's ``json.loads`` raised RecursionError past ~1,000 levels: 500 INTERNAL,
    the connection closed, ~35 lines of traceback per request (a fresh-user trial)."""
    doc = {"parameters": {"binary_data_output": True},
           "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": "@"}]}
    body = deep_json(doc, depth)
    with pytest.raises(InvalidArgument) as over_nats:
        node.client.request("hi.infer.digits", body, timeout_s=5.0, content_type="application/json")
    if depth < 1000:  # (within the bound: an answer about the data, from the ingress as over NATS)
        assert "nested too deeply" not in over_nats.value.message
    else:
        assert over_nats.value.message.startswith("the request body is nested too deeply to decode"), over_nats.value
    host, port = node.http_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/v2/models/digits/infer", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        got = resp.read()
        assert resp.status == 400 and not resp.will_close, (resp.status, got[:500])
        assert json.loads(got) == {"error": over_nats.value.message}
        assert resp.getheader("Inferbus-Error-Code") == "INVALID_ARGUMENT"
        # the binary tensor extension: the JSON header so nested, then 4 bytes of tensor
        header = deep_json({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 1], "data": "@"},
                                       {"name": "x", "datatype": "FP32", "shape": [1, 1],
                                        "parameters": {"binary_data_size": 4}}]}, depth)
        conn.request("POST", "/v2/models/digits/infer", body=header + b"\0\0\0\0",
                     headers={"Inference-Header-Content-Length": str(len(header))})
        resp = conn.getresponse()
        got = resp.read()
        assert resp.status == 400 and not resp.will_close, (resp.status, got[:500])
        assert resp.getheader("Inferbus-Error-Code") == "INVALID_ARGUMENT"
        if depth > 1000:  # (the ingress's words, then which bytes they are about)
            assert json.loads(got)["error"] == (f"{over_nats.value.message} (the JSON header: the body's first "
                                                f"{len(header)} bytes, Inference-Header-Content-Length)")
    finally:
        conn.close()
    no_traceback_in_the_logs(node)


def test_tritonclient_http_against_the_node(node, pixels):
    """Triton's own HTTP client (``pip install tritonclient[http]``), defaults (binary tensors) and JSON alike."""
    th = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is not installed (an optional check: "
                                                         "pip install -e '.[triton]')")
    from tritonclient.utils import InferenceServerException

    client = th.InferenceServerClient(node.http_address, connection_timeout=10, network_timeout=10)
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("digits")
        assert client.get_server_metadata()["extensions"] == ["binary_tensor_data", "statistics",
                                                              "model_repository"]
        assert client.get_model_metadata("digits", "2")["inputs"][0]["shape"] == [-1, 64]
        want = node.client.infer("digits", {"pixels": pixels}, version=2)
        for binary in (True, False):
            tensor = th.InferInput("pixels", list(pixels.shape), "FP32")
            tensor.set_data_from_numpy(pixels, binary_data=binary)
            result = client.infer("digits", [tensor], model_version="2", request_id="t-1")
            assert result.get_response()["id"] == "t-1"
            for name in want:
                np.testing.assert_array_equal(result.as_numpy(name), want[name])
        with pytest.raises(InferenceServerException) as err:
            client.infer("no_such_model", [tensor])
        assert err.value.status() == "404" and "unknown model" in err.value.message()
    finally:
        client.close()


def test_rate_limited_is_429_with_retry_after_and_the_client_id_header_is_passed_on(tmp_path, pixels):
    """A node of its own, 1 request per 100 s per ``Inferbus-Client-Id`` (burst 1): a client's second request is
    429 RESOURCE_EXHAUSTED with ``Retry-After`` (the ingress's hint, in whole seconds), another client's is served."""
    dep = start_deployment(tmp_path / "dep", workers=1, prefix="hr",
                           extra=["--http-port", "0", "--http-host", "0.0.0.0", "--http-infer", "--client-rate-limit", "0.01",
                                  "--client-rate-burst", "1"])
    try:
        dep.http_address = http_address(dep)
        doc = digits_request(pixels[:1])
        assert post_json(dep, "/v2/models/digits/infer", doc, {"Inferbus-Client-Id": "a"})[0] == 200
        status, headers, body = post_json(dep, "/v2/models/digits/infer", doc, {"Inferbus-Client-Id": "a"})
        assert status == 429 and headers["inferbus-error-code"] == "RESOURCE_EXHAUSTED", (status, body)
        assert "rate limit" in json.loads(body)["error"] and 90 <= int(headers["retry-after"]) <= 100, headers
        assert post_json(dep, "/v2/models/digits/infer", doc, {"Inferbus-Client-Id": "b"})[0] == 200
        # this node listens on every interface with --http-infer: up says inference is open there (the module's node,
        # on 127.0.0.1, does not)
        assert b"note: inference over HTTP is open to whoever reaches 0.0.0.0:" in dep.log.read_bytes()
    finally:
        dep.stop()


def test_an_infer_sent_while_the_node_reconnects_to_its_restarted_nats_is_answered_within_its_budget(tmp_path, pixels):
    """The node's embedded nats-server SIGKILLed and restarted by its supervisor: an HTTP infer sent meanwhile, with a
    10 s budget, is answered once the node is back (nats-py keeps it in its reconnect buffer, as the SDK's requests).
    Until 2026-12-07 the gateway answered 503 "not connected to NATS" at once (a fresh-user trial: back 1.8 s later)."""
    dep = start_deployment(tmp_path / "dep", workers=1, prefix="hn",
                           extra=["--http-port", "0", "--http-host", "127.0.0.1", "--http-infer"])
    try:
        dep.http_address = http_address(dep)
        doc = digits_request(pixels[:1])
        status, _, body = post_json(dep, "/v2/models/digits/infer", doc)
        assert status == 200, body
        expected = outputs_of(json.loads(body))
        nats_dir = str(dep.run_dir / "nats") + "/"
        [pid] = [p for p, cmd in command_lines() if "nats-server" in cmd and nats_dir in cmd]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5  # until the node has seen it gone (its connection is reconnecting)
        while b"exited: killed by signal 9" not in dep.log.read_bytes():
            assert time.monotonic() < deadline, dep.log.read_text()[-2000:]
            time.sleep(0.02)
        status, headers, body = post_json(dep, "/v2/models/digits/infer", doc, {"Inferbus-Timeout-Ms": "10000"})
        assert status == 200, (status, headers, body)
        for name, value in outputs_of(json.loads(body)).items():
            np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-5)
    finally:
        dep.stop()
