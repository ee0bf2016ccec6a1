"""Security options not covered by test_reliability_security.py (issue 5, item 8), against real processes.

* NKey authentication: an external nats-server that admits one user nkey; ``inferbus up --nats-url ...
  --nats-nkey-seed <file>`` serves through it and the SDK connects with ``nkeys_seed``; no seed, or another
  user's seed, is refused. Without the ``nkeys`` package the connect fails with an error that says to install
  ``inferbus[nkeys]``.
* Mutual TLS: an external nats-server with ``verify: true``; ``inferbus up --tls-ca --tls-cert --tls-key``
  serves through it; a client without a certificate is refused.
* Size limits: ``--nats-max-payload`` sets the embedded server's max_payload (and so the SDK's check before
  sending), ``--max-request-bytes``, ``--max-tensor-bytes`` and ``--max-bytes-elements`` give PAYLOAD_TOO_LARGE at once, the tensor
  one naming the input.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import time

import msgpack
import nats
import numpy as np
import pytest

from inferbus.bus import BusConfig, EmbeddedNats, connect
from inferbus.client import Client
from inferbus.schemas import PayloadTooLarge, Unavailable, decode_error

from conftest import ROOT, assert_in_no_argv, start_deployment, uvloop_backend as anyio_backend  # noqa: F401 (anyio_backend: uvloop only)
from test_reliability_lib import models_subset
from test_reliability_security import _make_tls

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


def feeds(i: int = 1):
    return {"a": np.array([[i]], np.int32), "b": np.zeros((1, 4), np.float16)}


def _user_seed(path) -> str:
    """Write a fresh user nkey seed to ``path`` (0600) and return its public key."""
    import nkeys

    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    path.write_bytes(seed)
    os.chmod(path, 0o600)
    return nkeys.from_seed(bytearray(seed)).public_key.decode()


async def _connect_once(url: str, **kw):
    nc = await asyncio.wait_for(nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0,
                                             connect_timeout=2, **kw), 10)
    await nc.close()


async def _refused(url: str, **kw) -> None:
    """A plain nats-py connect with ``kw`` fails (each test also shows the same form with the right
    credentials succeeds, so the failure is the server's refusal, not a wrong argument)."""
    with pytest.raises(Exception):
        await _connect_once(url, **kw)


async def _serve_through(tmp_path, url: str, extra: list[str], **client_kw) -> None:
    """``inferbus up --nats-url url <extra>``: ready, answers ``typed`` through the SDK, then stopped."""
    models = models_subset(tmp_path / "models", ["typed"])
    dep = await asyncio.to_thread(start_deployment, tmp_path / "dep", workers=1, prefix="sec2", extra=[
        "--models", str(models), "--no-cache", "--nats-url", url] + extra)
    try:
        client = await Client.connect(url, "sec2", **client_kw)
        try:
            assert (await client.health()).ready
            out = await client.infer("typed", feeds(21), timeout_s=5)
            assert out["a_times_2"][0, 0] == 42
        finally:
            await client.close()
    finally:
        await asyncio.to_thread(dep.stop)
    said = dep.log.read_text()
    assert "inferbus stopped" in said and "Traceback" not in said, said[-3000:]
    # nats-py's TLS upgrade made asyncio print this at every stop (it told a user nothing): filtered out
    assert "eof_received" not in said, said[-3000:]


async def test_nkey_authentication_end_to_end(tmp_path):
    seed = tmp_path / "user.nk"
    public = _user_seed(seed)
    other = tmp_path / "other.nk"
    _user_seed(other)
    conf = f'authorization {{ users = [ {{ nkey: "{public}" }} ] }}'
    with EmbeddedNats(run_dir=tmp_path / "nats", extra_config=conf) as srv:
        url = f"nats://127.0.0.1:{srv.port}"
        await _serve_through(tmp_path, url, ["--nats-nkey-seed", str(seed)], nkeys_seed=str(seed))
        await _connect_once(url, nkeys_seed=str(seed))
        await _refused(url)                           # no credentials
        await _refused(url, nkeys_seed=str(other))    # a user the server does not know
        await _refused(url, token="guess")


async def test_nkey_seed_without_the_nkeys_package_says_what_to_install(tmp_path, monkeypatch):
    seed = tmp_path / "user.nk"
    _user_seed(seed)
    monkeypatch.setitem(sys.modules, "nkeys", None)  # `import nkeys` now fails as if it were not installed
    with EmbeddedNats(run_dir=tmp_path / "nats", jetstream=False) as srv:
        with pytest.raises(ImportError, match=r"inferbus\[nkeys\]"):
            await connect(BusConfig(servers=(srv.url,), nkeys_seed=str(seed)))
        with pytest.raises(ImportError, match=r"inferbus\[nkeys\]"):
            await Client.connect(srv.url, nkeys_seed=str(seed))


async def test_mutual_tls_end_to_end(tmp_path):
    tls = _make_tls(tmp_path)
    conf = (f'tls {{ cert_file: "{tls["cert"]}", key_file: "{tls["key"]}", ca_file: "{tls["ca"]}", '
            f'verify: true, timeout: 2 }}')
    with EmbeddedNats(run_dir=tmp_path / "nats", extra_config=conf) as srv:
        url = f"tls://127.0.0.1:{srv.port}"
        files = dict(tls_ca_file=str(tls["ca"]), tls_cert_file=str(tls["client_cert"]),
                     tls_key_file=str(tls["client_key"]))
        await _serve_through(tmp_path, url, ["--tls-ca", str(tls["ca"]), "--tls-cert", str(tls["client_cert"]),
                                             "--tls-key", str(tls["client_key"])], **files)
        ctx = ssl.create_default_context(cafile=str(tls["ca"]))
        ctx.load_cert_chain(str(tls["client_cert"]), str(tls["client_key"]))
        await _connect_once(url, tls=ctx)
        await _refused(url, tls=ssl.create_default_context(cafile=str(tls["ca"])))  # no client certificate
        (tmp_path / "stranger").mkdir()
        stranger = _make_tls(tmp_path / "stranger")
        ctx = ssl.create_default_context(cafile=str(tls["ca"]))
        ctx.load_cert_chain(str(stranger["client_cert"]), str(stranger["client_key"]))
        await _refused(url, tls=ctx)  # a certificate from another CA
        # a server certificate the client cannot verify (no CA given): nats-py retried the handshake without end,
        # and the SDK and every CLI command hung until killed; now it is UNAVAILABLE naming the cause, in bounded time
        t0 = time.monotonic()
        with pytest.raises(Unavailable, match="CERTIFICATE_VERIFY_FAILED"):
            await Client.connect(url, tls_cert_file=str(tls["client_cert"]), tls_key_file=str(tls["client_key"]))
        assert time.monotonic() - t0 < 30
    # TLS files without --nats-url: the embedded server would not use them (they were ignored without a word)
    p = subprocess.run([sys.executable, "-m", "inferbus.cli", "up", "--no-cache", "--nats-port", "0", "--tls-ca",
                        str(tls["ca"]), "--tls-cert", str(tls["client_cert"]), "--tls-key", str(tls["client_key"])],
                       capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "up: --tls-ca and --tls-cert and --tls-key apply to a NATS given with --nats-url" in p.stderr, p.stderr


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    root = tmp_path_factory.mktemp("limits")
    models = models_subset(root / "models", ["typed", "strings"])
    d = start_deployment(root / "dep", workers=1, prefix="lim", extra=[
        "--models", str(models), "--no-cache", "--nats-max-payload", "65536", "--max-request-bytes", "32768",
        "--max-tensor-bytes", "1024", "--max-bytes-elements", "40"])
    yield d
    d.stop()


def _strings_body(n: int) -> bytes:
    return msgpack.packb({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [1, 1],
                                      "raw": n.to_bytes(4, "little") + b"y" * n}]})


async def test_size_limits_refuse_at_once_and_name_what_is_too_large(limited):
    nc = await nats.connect(limited.nats_url)
    client = Client(nc, "lim")
    try:
        assert nc.max_payload == 65536  # --nats-max-payload reached the embedded server
        # over max_payload: the SDK refuses before sending, naming the server's limit
        t0 = time.perf_counter()
        with pytest.raises(PayloadTooLarge, match="65536"):
            await client.infer("strings", {"s": np.array([[b"x" * 70_000]], dtype=object)})
        assert time.perf_counter() - t0 < 0.5

        async def send(body: bytes):
            t0 = time.perf_counter()
            msg = await nc.request("lim.infer.strings", body, timeout=5)
            return decode_error(msg.headers, msg.data), msg, time.perf_counter() - t0

        # under max_payload, over --max-request-bytes: the ingress refuses the body
        err, _, took = await send(_strings_body(40_000))
        assert isinstance(err, PayloadTooLarge) and "32768" in err.message and took < 1.0, (err, took)
        # under the body limit, one tensor over --max-tensor-bytes: refused, naming the input
        err, _, took = await send(_strings_body(2_000))
        assert isinstance(err, PayloadTooLarge) and err.field == "inputs[0]" and "'s'" in err.message, err
        assert "1024" in err.message and took < 1.0
        # at the tensor limit (1,024 bytes of element data): answered, byte-exact
        err, msg, _ = await send(_strings_body(1024))
        assert err is None, err
        echo = next(o for o in msgpack.unpackb(msg.data)["outputs"] if o["name"] == "echo")
        got = echo["raw"] if "raw" in echo else b"".join(len(v).to_bytes(4, "little") + v for v in echo["data"])
        assert got == (1024).to_bytes(4, "little") + b"y" * 1024
        # more BYTES elements than --max-bytes-elements (a fresh-user trial: 2,000,000 empty elements held the
        # ingress 0.9 s, everyone else waiting): refused from the shape, naming the input and the limit
        many = lambda n: msgpack.packb({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [n, 1],  # noqa: E731
                                                    "raw": b"\0\0\0\0" * n}]})
        err, _, took = await send(many(41))
        assert isinstance(err, PayloadTooLarge) and err.field == "inputs[0]" and "'s'" in err.message, err
        assert "41 elements" in err.message and "40" in err.message and took < 1.0, (err, took)
        err, msg, _ = await send(many(40))  # at the limit: answered
        assert err is None, err
        # the next good request on another model succeeds
        assert (await client.infer("typed", feeds(4)))["a_times_2"][0, 0] == 8
    finally:
        await nc.close()


def _three_misses_filled(dep, prefix: str, first: int, r) -> None:
    """Three misses of ``typed`` through the SDK, each answered right, then their three L2 fills in the Valkey ``r``
    (redis-py, with the password): the aggregator authenticated."""
    async def ask() -> None:
        c = await Client.connect(dep.nats_url, prefix)
        try:
            for i in range(first, first + 3):
                out = await c.infer("typed", feeds(i), timeout_s=5)
                assert out["a_times_2"][0, 0] == 2 * i
        finally:
            await c.close()

    asyncio.run(ask())
    deadline = time.monotonic() + 10
    while r.dbsize() < 3:  # the aggregator's fills, written with the password
        assert time.monotonic() < deadline, r.dbsize()
        time.sleep(0.05)


def test_a_valkey_that_requires_a_password_through_inferbus_redis_url(tmp_path, monkeypatch):
    """The embedded Valkey has no password (a fresh-user trial, docs/failure-semantics.md#security); the way out the
    docs give: a Valkey of one's own with ``requirepass``, named by ``INFERBUS_REDIS_URL`` (not argv: ``ps`` shows
    argv). The node fills it (so it authenticated), prints the URL with the password masked, and a client without
    the password is refused by that Valkey."""
    import redis

    from inferbus.bus import free_port
    from inferbus.bus._embedded import valkey_server_binary

    secret = "s3cret-" + os.urandom(6).hex()
    conf = tmp_path / "valkey.conf"
    conf.write_text(f"requirepass {secret}\n")
    conf.chmod(0o600)
    port = free_port()
    vk = subprocess.Popen([str(valkey_server_binary()), str(conf), "--port", str(port), "--bind", "127.0.0.1",
                           "--save", "", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dep = None
    try:
        r = redis.Redis(port=port, password=secret)
        deadline = time.monotonic() + 20
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "valkey-server did not start"
                time.sleep(0.05)
        monkeypatch.setenv("INFERBUS_REDIS_URL", f"redis://:{secret}@127.0.0.1:{port}/0")
        models = models_subset(tmp_path / "models", ["typed"])
        dep = start_deployment(tmp_path / "dep", workers=1, prefix="vkp", extra=["--models", str(models)])
        head = dep.log.read_text()
        assert f"redis://:***@127.0.0.1:{port}/0" in head and secret not in head, head[:600]

        _three_misses_filled(dep, "vkp", 100, r)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).dbsize()
        # a wrong password is told as refused credentials, not "does not answer ... until it does" (a trial)
        from inferbus.cli import _redis_problem

        problem = asyncio.run(_redis_problem(f"redis://:wrong@127.0.0.1:{port}/0"))
        assert problem is not None and problem.startswith("AuthenticationError"), problem
        assert asyncio.run(_redis_problem(f"redis://:{secret}@127.0.0.1:{port}/0")) is None
    finally:
        if dep is not None:
            dep.stop()
        vk.kill()
        vk.wait()


def test_the_embedded_valkey_requires_a_password_of_its_own_kept_out_of_ps(tmp_path):
    """Any local user could read and write the embedded Valkey (no password; a fresh-user trial, 2026-12-06), and an
    entry written there is served as a hit by an ingress that reads L2. Now each ``inferbus up`` gives it a random
    password of its own, in 0600 files only (``<run-dir>/valkey/valkey.conf``, the actors' configs), not in any
    process's argv; the node fills it (so it authenticates), prints its URL with the password masked, and a client
    without the password is refused."""
    import redis

    from conftest import embedded_valkey_url

    models = models_subset(tmp_path / "models", ["typed"])
    dep = start_deployment(tmp_path / "dep", workers=1, prefix="evp", extra=["--models", str(models), "--l2-lookup"])
    try:
        url = embedded_valkey_url(dep.run_dir)
        secret = url.split("@")[0].rsplit(":", 1)[1]
        assert len(secret) >= 24, url
        conf = dep.run_dir / "valkey" / "valkey.conf"
        assert (conf.stat().st_mode & 0o777) == 0o600
        head = dep.log.read_text()
        assert "L2 cache redis://:***@127.0.0.1:" in head and secret not in head, head[:600]
        assert_in_no_argv(secret)  # (ps shows every user argv)

        r = redis.Redis.from_url(url)
        _three_misses_filled(dep, "evp", 200, r)
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).dbsize()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).set("evp:poison", b"x")
    finally:
        dep.stop()
