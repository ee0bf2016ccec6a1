"""Names too long for a NATS subject (inferbus/bus/_subjects.py, ``MAX_NAME_BYTES``, ``MAX_VERSION``,
``MAX_CONTROL_LINE_BYTES``). A fresh-user trial: ``GET /v2/models/<4,100 characters>/ready`` made the node send a
request whose protocol line was over the server's ``max_control_line`` (4096 bytes); nats-server answered ``-ERR
'maximum control line exceeded'`` and closed the node's own connection, nats-py does not reconnect after that, and
every ``/v2`` path answered 503 from then on (the warning said "nats-py retries by itself"). The SDK's Client died the
same way. Now such a name is INVALID_ARGUMENT (HTTP 400) before anything is sent, everywhere, and the node and the
client go on serving; a node whose connection is closed for good all the same (a server configured with a smaller
``max_control_line``) says so and connects anew. Against a real ``inferbus up`` and a real nats-server."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
import urllib.parse

import numpy as np
import pytest

from conftest import MODELS, ROOT, command_lines, start_deployment
from conftest import uvloop_backend as anyio_backend  # noqa: F401  (process-heavy: one loop is enough)
from inferbus.bus import EmbeddedNats
from inferbus.bus._subjects import (LINE_OVERHEAD_BYTES, LONGEST_SUBJECT_BYTES, MAX_CONTROL_LINE_BYTES,
                                    MAX_NAME_BYTES, MAX_PREFIX_BYTES, MAX_REPLY_BYTES, reply_bytes)
from inferbus.client import Client
from inferbus.model_admin import model_control
from inferbus.schemas import InvalidArgument, NotFound, decode_error
from test_http_infer import ask, http_address, post_json

pytestmark = pytest.mark.timeout(120)

PREFIX = "ln"
HUGE = "a" * 4100  # the trial's name: its subject alone is over the server's max_control_line
OVER = "b" * (MAX_NAME_BYTES + 1)  # the smallest name over the limit (it was served, or NOT_FOUND)
WIDE = "\u00e9" * (MAX_NAME_BYTES // 2 + 1)  # 65 characters, 130 bytes of UTF-8: bytes are counted
LONG_VERSION = "1" * 5000
NODE_ID = "long-node-id-" + "x" * 35  # 48 characters (up to 64 are taken)
PIXELS = np.load(MODELS / "digits" / "data" / "test.npz")["X"][:1].astype(np.float32)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("long_names")
    # a long node id: the worker subject (<p>._w.<node id>-w0) is longer than <p>.infer.digits, as a reply subject
    # that fits a client's line does not fit the ingress's forward (test_the_ingress_refuses_a_reply_subject_...)
    dep = start_deployment(root / "dep", workers=1, prefix=PREFIX,
                           extra=["--ingress", "1", "--http-port", "0", "--http-host", "127.0.0.1", "--http-infer",
                                  "--http-model-control", "--node-id", NODE_ID])
    try:
        dep.http_address = http_address(dep)
        yield dep
    finally:
        dep.stop()


def pids_of(node, text: str) -> list[int]:
    return sorted(pid for pid, cmd in command_lines() if text in cmd and str(node.run_dir) in cmd)


def assert_serving(node) -> None:
    """The node answers over HTTP at once: a model ready, an inference, every actor up on ``/metrics``."""
    status, _, body = ask(node, "/v2/models/digits/ready")
    assert status == 200, (status, body)
    status, _, body = post_json(node, "/v2/models/digits/infer", {"inputs": [
        {"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": PIXELS.ravel().tolist()}]})
    assert status == 200 and json.loads(body)["model_name"] == "digits", (status, body)
    status, _, body = ask(node, "/metrics")
    ups = re.findall(rb"^inferbus_actor_up\{[^}]*\} (\S+)$", body, re.M)
    assert status == 200 and ups and all(float(v) == 1.0 for v in ups), ups


def test_static_bounds_keep_every_subject_far_below_the_servers_control_line():
    """The longest subject built from a caller's names, with nats-py's reply inbox, fits the line the server takes; so
    does a worker subject with the longest reply subject an ingress forwards."""
    assert LONGEST_SUBJECT_BYTES == 430
    assert LONGEST_SUBJECT_BYTES + 56 + LINE_OVERHEAD_BYTES <= MAX_CONTROL_LINE_BYTES
    longest_worker = MAX_PREFIX_BYTES + len("._w.") + 64 + len("-tensorrt-gpu") + 10  # node id <= 64 characters
    assert longest_worker + MAX_REPLY_BYTES + LINE_OVERHEAD_BYTES <= MAX_CONTROL_LINE_BYTES


def _paths(name: str, version: str | None = None) -> list[tuple[str, str]]:
    q = urllib.parse.quote(name)
    v = f"/versions/{version}" if version else ""
    return [("GET", f"/v2/models/{q}{v}/ready"), ("GET", f"/v2/models/{q}{v}"), ("GET", f"/v2/models/{q}{v}/stats"),
            ("POST", f"/v2/models/{q}{v}/infer"), ("OPTIONS", f"/v2/models/{q}{v}/ready"),
            ("HEAD", f"/v2/models/{q}{v}")] + (
        [] if version else [("POST", f"/v2/repository/models/{q}/load"), ("POST", f"/v2/repository/models/{q}/unload")])


NAME_SAID = f"a name is at most {MAX_NAME_BYTES} bytes"


@pytest.mark.parametrize("name,version,field,said", [
    (HUGE, None, "model", NAME_SAID), (OVER, None, "model", NAME_SAID), (WIDE, None, "model", NAME_SAID),
    ("digits", LONG_VERSION, "model_version", "over the largest version"),
    ("digits", "9" * 20, "model_version", "over the largest version"),
    ("digits", "0" * 4999 + "1", "model_version", "(5000 digits) has leading zeros")],
    ids=["4100-characters", "129-bytes", "130-bytes-65-characters", "version-5000-digits", "version-over-2-63",
         "version-5000-digits-leading-zeros"])
def test_a_name_too_long_is_400_on_every_path_and_the_node_keeps_serving(node, name, version, field, said):
    """Each path that puts a model name (or version) into a subject: 400 with ``Inferbus-Error-Code:
    INVALID_ARGUMENT`` naming the field, at once, and the same node serves the next request. On the old code the
    4,100-character name made every later request 503 (the node's connection closed for good); 129 or 130 bytes
    were 404 (or 503 on a load), 20 digits 404, and 5,000 digits with a leading zero a 500 (Python's int() refuses
    more than 4,300 digits)."""
    ingress = pids_of(node, "inferbus.actors ingress")
    for method, path in _paths(name, version):
        body = b"{}" if method == "POST" else None
        status, headers, text = ask(node, path, method, body, {"Content-Type": "application/json"} if body else None)
        assert status == 400, (method, path[:80], status, text[:300])
        assert headers.get("inferbus-error-code") == "INVALID_ARGUMENT", (method, headers)
        if method not in ("HEAD",):
            assert headers.get("inferbus-error-field") == field, (method, path[:80], headers)
            error = json.loads(text)["error"]
            assert said in error, error
            assert len(error) < 400, error  # the name is shown cut, not 4,100 characters of it
        assert_serving(node)
    assert pids_of(node, "inferbus.actors ingress") == ingress and ingress  # no process restarted


def test_the_longest_name_allowed_is_an_unknown_model_not_a_refusal(node):
    """A name of exactly ``MAX_NAME_BYTES`` bytes is a name: 404 unknown model, and the node serves on."""
    name = "c" * MAX_NAME_BYTES
    status, headers, text = ask(node, f"/v2/models/{name}/versions/{2**63 - 1}/ready")
    assert status == 404 and headers["inferbus-error-code"] == "NOT_FOUND", (status, text)
    status, headers, text = ask(node, f"/v2/models/{name}")
    assert status == 404 and headers["inferbus-error-field"] == "model", (status, text)
    assert_serving(node)


@pytest.mark.anyio
async def test_the_client_refuses_a_name_too_long_before_sending_and_keeps_working(node):
    """``Client.infer("a" * 5000, ...)`` raised Unavailable "the NATS connection is closed" and the Client was dead
    afterwards; a 129-byte name was NOT_FOUND after the round trip. Now InvalidArgument naming the field, before
    anything is sent (the server sees no request), and the same Client serves the next call."""
    async with await Client.connect(node.nats_url, PREFIX) as client:
        sent_before = client.nc.stats["out_msgs"]
        calls = [
            ("model", lambda n: client.infer(n, {"pixels": PIXELS}, timeout_s=5)),
            ("model", lambda n: client.model(n, timeout_s=5)),
            ("model", lambda n: client.model_ready(n, timeout_s=5)),
            ("model", lambda n: model_control(client, "load", n, timeout_s=5)),
        ]
        for name in ("a" * 5000, HUGE, OVER, WIDE):
            for field, call in calls:
                with pytest.raises(InvalidArgument) as ei:
                    await call(name)
                assert ei.value.field == field and f"a name is at most {MAX_NAME_BYTES} bytes" in ei.value.message, \
                    ei.value
        for version in (LONG_VERSION, "9" * 20, 2**63):
            for call in (lambda: client.infer("digits", {"pixels": PIXELS}, version=version, timeout_s=5),
                         lambda: client.model("digits", version, timeout_s=5),
                         lambda: client.model_ready("digits", version, timeout_s=5)):
                with pytest.raises(InvalidArgument) as ei:
                    await call()
                assert ei.value.field == "model_version" and "over the largest version" in ei.value.message, ei.value
        with pytest.raises(InvalidArgument) as ei:
            await client.health(ingress="i" * 5000, timeout_s=5)
        assert ei.value.field == "ingress", ei.value
        # a subject built by hand: the line the server would refuse is refused here (field subject)
        with pytest.raises(InvalidArgument) as ei:
            await client.request(f"{PREFIX}.infer.{'d' * 4050}", b"", timeout_s=5)
        assert ei.value.field == "subject" and "max_control_line" in ei.value.message, ei.value
        assert client.nc.stats["out_msgs"] == sent_before  # nothing was sent
        assert client.nc.is_connected
        out = await client.infer("digits", {"pixels": PIXELS}, timeout_s=5)
        assert out["logits"].shape == (1, 10)
        assert (await client.model("digits", "2", timeout_s=5)).name == "digits"
        # the longest name allowed reaches the ingress: an unknown model
        with pytest.raises(NotFound):
            await client.infer("e" * MAX_NAME_BYTES, {"pixels": PIXELS}, version=2**63 - 1, timeout_s=5)
        assert reply_bytes(client.nc) == 56


@pytest.mark.anyio
async def test_the_ingress_refuses_a_name_too_long_as_the_sdk_does(node):
    """What a raw NATS client sends: a model name over the limit that reaches an ingress (inference, metadata, a
    model-management write) is INVALID_ARGUMENT naming the field, as the SDK says it before sending (it was
    NOT_FOUND, unknown model)."""
    import nats

    nc = await nats.connect(node.nats_url)
    try:
        for name in (OVER, WIDE, "f" * 3000):
            for subject, body in ((f"{PREFIX}.infer.{name}", b"{}"), (f"{PREFIX}.models.{name}", b""),
                                  (f"{PREFIX}.models.{name}.ready", b""), (f"{PREFIX}.models.{name}.load", b"{}")):
                msg = await nc.request(subject, body, timeout=5, headers={"Content-Type": "application/json"})
                err = decode_error(msg.headers, msg.data)
                assert isinstance(err, InvalidArgument) and err.field == "model", (subject[:60], err)
                assert f"a name is at most {MAX_NAME_BYTES} bytes" in err.message, err
    finally:
        await nc.close()


@pytest.mark.anyio
async def test_the_ingress_refuses_a_reply_subject_it_could_not_forward_and_lives_on(node):
    """A reply subject of 4,040 bytes with ``<p>.infer.digits`` fits a raw client's own line (~4,070 bytes), but the
    ingress forwards the request to a worker with it (``HPUB <p>._w.<node id>-w0 <reply> ...``), a longer line here
    (~4,115 bytes): the server closed the ingress's connection, its process exited to be restarted and the request was
    never answered. Now refused at once (INVALID_ARGUMENT, field ``reply``) on that reply subject; the same ingress
    process serves on."""
    import nats

    ingress = pids_of(node, "inferbus.actors ingress")
    body = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": PIXELS.ravel().tolist()}]}
    nc = await nats.connect(node.nats_url)
    try:
        reply = "_LONG." + "r" * 4034
        sub = await nc.subscribe(reply, max_msgs=1)
        await nc.publish(f"{PREFIX}.infer.digits", json.dumps(body).encode(), reply=reply,
                         headers={"Content-Type": "application/json"})
        msg = await sub.next_msg(timeout=5)
        err = decode_error(msg.headers, msg.data)
        assert isinstance(err, InvalidArgument) and err.field == "reply", err
        assert f"over the limit of {MAX_REPLY_BYTES}" in err.message, err
        await asyncio.sleep(0.5)  # (an ingress whose connection was closed exits at once)
        msg = await nc.request(f"{PREFIX}.infer.digits", json.dumps(body).encode(), timeout=5,
                               headers={"Content-Type": "application/json"})
        assert decode_error(msg.headers, msg.data) is None, msg.data
    finally:
        await nc.close()
    assert pids_of(node, "inferbus.actors ingress") == ingress and ingress  # the same process: not restarted
    assert "exiting (status" not in (node.run_dir / "ingress-0.log").read_text()


@pytest.mark.anyio
async def test_a_worker_sent_a_forward_naming_an_ingress_id_too_long_lives_on(node):
    """A message on a worker's own subject whose ``Inferbus-Fwd`` names an ingress of 4,085 characters (no ingress
    sent it: a raw client on the bus). The worker answered it, then published its completion notice on
    ``<p>._done.<that id>``, a line over the server's ``max_control_line``: its connection closed and its process
    exited to be restarted. Now no notice is sent for such an id; the same worker process answers and serves on."""
    import nats

    from inferbus.bus import headers as H

    worker = pids_of(node, "inferbus.actors worker")
    body = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": PIXELS.ravel().tolist()}]}
    nc = await nats.connect(node.nats_url)
    try:
        fwd = H.fwd_value(1, "x" * 4085, "digits", "1", 5000.0, time.time() * 1000 + 5000, "", "", "")
        msg = await nc.request(f"{PREFIX}._w.{NODE_ID}-w0", json.dumps(body).encode(), timeout=5,
                               headers={H.FWD: fwd, "Content-Type": "application/json"})
        assert decode_error(msg.headers, msg.data) is None, msg.data
        await asyncio.sleep(0.5)  # (a worker whose connection was closed exits at once)
    finally:
        await nc.close()
    assert pids_of(node, "inferbus.actors worker") == worker and worker  # the same process: not restarted
    assert_serving(node)


def test_a_node_whose_connection_is_closed_for_good_says_so_and_connects_anew(tmp_path):
    """A server configured with a smaller ``max_control_line`` than the 4096 bytes inferbus assumes (200 here)
    closes the node's connection on a request whose subject fits the name bounds but not that line; nats-py does not
    reconnect after the server's ``-ERR``. The node said "lost its NATS connection ...; nats-py retries by itself",
    which it did not: 503 on every ``/v2`` path for good. Now it says the connection was closed and why, makes a new
    one, and serves again."""
    run = tmp_path / "run"
    with EmbeddedNats(run_dir=tmp_path / "nats", extra_config="max_control_line: 200") as srv:
        log = tmp_path / "up.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen([sys.executable, "-m", "inferbus.cli", "up", "--nats-url", srv.url, "--workers",
                                     "1", "--no-cache", "--models", str(MODELS), "--http-port", "0", "--http-host",
                                     "127.0.0.1", "--run-dir", str(run), "--prefix", "lc"],
                                    stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while b"serving; Ctrl-C" not in log.read_bytes():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.05)

            class Dep:
                http_address = re.search(rb"http://(127\.0\.0\.1:\d+)/v2", log.read_bytes()).group(1).decode()

            assert ask(Dep, "/v2/models/digits/ready")[0] == 200
            # 128 + 19 digits: within the bounds; the ready request's line is ~240 bytes, over this server's 200
            status, _, _ = ask(Dep, f"/v2/models/{'g' * MAX_NAME_BYTES}/versions/{2**63 - 1}/ready")
            assert status in (404, 503), status
            deadline = time.monotonic() + 20
            while (got := ask(Dep, "/v2/models/digits/ready"))[0] != 200:
                assert time.monotonic() < deadline, (got, log.read_text()[-2000:])
                time.sleep(0.1)
            text = " ".join(log.read_text().split())  # (rich wraps the lines to the terminal's width)
            assert ("node n1: its NATS connection (127.0.0.1:" in text and
                    "was closed (nats: maximum control line exceeded), and nats-py does not reconnect after that; "
                    "connecting anew" in text), text[-2000:]
            assert re.search(r"node n1: connected to NATS again \(127\.0\.0\.1:\d+\) with a new connection", text), \
                text[-2000:]
            assert "retries by itself" not in text, text[-2000:]
            assert ask(Dep, "/v2/health/ready")[0] == 200
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, log.read_text()[-2000:]


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inferbus.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_the_cli_refuses_names_too_long_and_the_node_serves_on(node, tmp_path):
    """``models load``, ``models default``, ``infer`` and ``health --ingress`` with a name over the limit: the
    INVALID_ARGUMENT naming it, exit 2, before anything is sent (the command's own connection died, exit 1
    "connection closed", and a 129-byte name was NOT_FOUND); the node serves on."""
    np.save(tmp_path / "in.npy", PIXELS)
    given = f"pixels={tmp_path / 'in.npy'}"
    for argv in (("models", "load", HUGE), ("models", "load", OVER), ("models", "default", OVER, "1"),
                 ("infer", HUGE, "-i", given), ("infer", OVER, "-i", given),
                 ("health", "--ingress", "i" * 5000)):
        cmd, rest = argv[0], argv[1:]
        p = _cli(cmd, "--nats-url", node.nats_url, "--prefix", PREFIX, *rest)
        assert p.returncode == 2, (argv[:2], p.returncode, p.stdout[-500:], p.stderr[-800:])
        assert "INVALID_ARGUMENT" in p.stdout + p.stderr or "error:" in p.stderr, (p.stdout, p.stderr)
        assert f"a name is at most {MAX_NAME_BYTES} bytes" in " ".join((p.stdout + p.stderr).split()), p
        assert "Traceback" not in p.stderr and "closed" not in p.stdout + p.stderr, p.stderr
    assert_serving(node)


@pytest.mark.parametrize("argv,said", [
    (("up", "--nats-port", "0", "--prefix", "p" * (MAX_PREFIX_BYTES + 1)),
     f"up: --prefix must be at most {MAX_PREFIX_BYTES} characters"),
    (("health", "--nats-url", "nats://127.0.0.1:{port}", "--prefix", "p" * 5000),
     f"health: --prefix must be at most {MAX_PREFIX_BYTES} characters"),
    (("region", "promote", "r" * 5000, "--nats-url", "nats://127.0.0.1:{port}"),
     "region promote: REGION must be a region name of at most 64 characters, got 5000"),
])
def test_a_prefix_or_region_too_long_is_a_usage_error_before_connecting(argv, said):
    """Every subject starts with the prefix, and a region name is a subject token: refused in one line, exit 2,
    before anything is sent (a 5,000-character one made subjects the server closed the connection for; the
    prefix of ``up`` was taken)."""
    from inferbus.bus import free_port

    port = free_port()  # nothing listens there: a refusal that does not come ends "cannot reach NATS", exit 3
    p = _cli(*(a.replace("{port}", str(port)) for a in argv))
    assert p.returncode == 2, (p.returncode, p.stdout[-500:], p.stderr[-800:])
    assert p.stderr.startswith(f"error: {said}"), p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert "p" * 41 not in p.stderr and "r" * 41 not in p.stderr  # shown cut


def test_a_repository_folder_whose_name_is_too_long_is_refused_when_read(tmp_path):
    """A model folder named with more than ``MAX_NAME_BYTES`` bytes of UTF-8 was served, though no request could
    name it (the SDK, the gateway and the CLI refuse such a name): refused when the repository is read, naming the
    folder and the limit, so ``inferbus up`` exits 2; one of exactly the limit is served."""
    import shutil

    from inferbus.actors import ModelRepository
    from inferbus.actors._repository import ModelConfigError

    for name, n in ((OVER, MAX_NAME_BYTES + 1), (WIDE, 2 * len(WIDE))):
        root = tmp_path / f"models-{n}-{len(name)}"
        (root / name / "1").mkdir(parents=True)
        shutil.copy(MODELS / "digits" / "1" / "model.onnx", root / name / "1" / "model.onnx")
        (root / name / "config.json").write_text("{}")
        for read in (lambda: ModelRepository(root), lambda: ModelRepository(root, [name]).scan_model(name)):
            with pytest.raises(ModelConfigError) as ei:
                read()
            said = str(ei.value)
            assert said.startswith(f"{root / name / 'config.json'}: "), said
            assert (f"is {n} bytes of UTF-8; a name is at most {MAX_NAME_BYTES} bytes (it goes into NATS subjects, "
                    f"whose length the server bounds): rename the folder") in said, said
    p = _cli("up", "--nats-port", "0", "--workers", "1", "--no-cache", "--models", str(tmp_path / f"models-129-129"),
             "--run-dir", str(tmp_path / "run"))
    assert p.returncode == 2 and p.stderr.startswith("error: up: the model repository cannot be served: "), p.stderr
    assert f"a name is at most {MAX_NAME_BYTES} bytes" in " ".join(p.stderr.split()), p.stderr
    root = tmp_path / "fits"
    (root / ("m" * MAX_NAME_BYTES) / "1").mkdir(parents=True)
    shutil.copy(MODELS / "digits" / "1" / "model.onnx", root / ("m" * MAX_NAME_BYTES) / "1" / "model.onnx")
    (root / ("m" * MAX_NAME_BYTES) / "config.json").write_text("{}")
    assert [m.name for m in ModelRepository(root)] == ["m" * MAX_NAME_BYTES]
