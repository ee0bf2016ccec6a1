"""Security and rate limits against real processes (issue 5, items 3 and 8).

* ``inferbus up --nats-token ...``: the embedded nats-server requires the token; connections without it are
  refused; the token never appears on an actor's command line (configs travel in 0600 files).
* an external nats-server with user/password over TLS: actors and the SDK connect with the options passed
  through from their config; wrong or missing credentials are refused.
* token-bucket rate limits, per client (``Inferbus-Client-Id``) and global, with a burst above the
  sustained rate: excess gets RESOURCE_EXHAUSTED at once with a retry-after hint.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import ssl
import stat
import subprocess
import sys
import time

import nats
import numpy as np
import pytest

from inferbus.actors import IngressConfig, WorkerConfig
from inferbus.bus import BusConfig, EmbeddedNats, free_port
from inferbus.client import Client
from inferbus.schemas import ResourceExhausted

from conftest import start_deployment, uvloop_backend as anyio_backend  # noqa: F401 (anyio_backend: uvloop only)
from test_reliability_lib import models_subset

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]
TOKEN = "s3cret-token-7f1c"
PREFIX = "sec"


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sec")
    models = models_subset(root / "models", ["typed"], {"typed": {"cache_ttl_ms": 0}})
    # node-wide: 60 req/s sustained, burst 30 (= 120 req/s for 0.5 s); per client: 20 req/s, burst 10
    d = start_deployment(root / "dep", workers=1, prefix=PREFIX, extra=[
        "--models", str(models), "--no-cache", "--nats-token", TOKEN, "--rate-limit", "60", "--rate-burst", "30",
        "--client-rate-limit", "20", "--client-rate-burst", "10"])
    yield d
    d.stop()


def feeds(i: int = 1):
    return {"a": np.array([[i]], np.int32), "b": np.zeros((1, 4), np.float16)}


async def test_embedded_server_requires_the_token_and_argv_never_shows_it(dep):
    with pytest.raises(Exception) as ei:
        await nats.connect(dep.nats_url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)
    assert "authorization" in str(ei.value).lower() or "auth" in repr(ei.value).lower()
    with pytest.raises(Exception):
        await nats.connect(dep.nats_url, token="wrong", allow_reconnect=False, max_reconnect_attempts=0,
                           connect_timeout=2)
    client = await Client.connect(dep.nats_url, PREFIX, token=TOKEN)
    try:
        h = await client.health()
        assert h.ready
        pids = [h.parameters["pid"]] + [w["pid"] for w in h.parameters["workers"].values()]
        for pid in pids:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
            assert TOKEN.encode() not in cmdline, cmdline
        configs = list(dep.run_dir.glob("*.config.json"))
        assert configs
        for path in configs:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        # every file of the run dir that holds the token is the owner's only: the embedded nats-server's config
        # (its authorization block) was 0644, readable by every local user in a --run-dir (a fresh-user trial)
        holding = [p for p in dep.run_dir.rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]
        assert any(p.name.startswith("nats-") and p.suffix == ".conf" for p in holding), holding
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in holding), \
            [(str(p), oct(p.stat().st_mode)) for p in holding]
    finally:
        await client.close()


async def test_cli_client_commands_take_the_token_from_the_environment(dep):
    """``inferbus models`` (as every client command) connects with ``INFERBUS_NATS_TOKEN`` from the environment,
    as ``inferbus up`` takes it; without it the secured server refuses, exit 3 (the client commands had no way to
    give credentials: found by a fresh-user trial)."""
    def models(env):
        return subprocess.run([sys.executable, "-m", "inferbus.cli", "models", "--nats-url", dep.nats_url, "--prefix",
                               PREFIX], capture_output=True, text=True, timeout=60,
                              env={"PATH": os.environ.get("PATH", ""), "COLUMNS": "200", **env})
    ok = await asyncio.to_thread(models, {"INFERBUS_NATS_TOKEN": TOKEN})
    assert ok.returncode == 0, ok.stderr
    assert "typed" in ok.stdout, ok.stdout
    refused = await asyncio.to_thread(models, {})
    # the server answers "Authorization Violation" and closes; the client may read the close first (a reset)
    assert refused.returncode == 3 and f"cannot reach NATS at {dep.nats_url}" in refused.stderr, refused.stderr
    assert "Authorization Violation" in refused.stderr or "Connection reset" in refused.stderr, refused.stderr


async def test_bench_load_generators_take_the_token_from_the_environment(dep):
    """``inferbus bench`` against a secured NATS: its load-generator processes connect with ``INFERBUS_NATS_TOKEN``
    as the command itself does (they connected with the URL alone, and the run failed: "a load generator failed ...
    Authorization Violation"). 8 requests at 16/s, under the deployment's rate limits."""
    def bench():
        return subprocess.run([sys.executable, "-m", "inferbus.cli", "bench", "typed", "--nats-url", dep.nats_url,
                               "--prefix", PREFIX, "--models", str(dep.run_dir.parent / "models"), "--rate", "16",
                               "--duration", "0.5", "--concurrency", "", "--json"], capture_output=True, text=True,
                              timeout=120, env={"PATH": os.environ.get("PATH", ""), "COLUMNS": "200",
                                                "INFERBUS_NATS_TOKEN": TOKEN})
    await asyncio.sleep(0.6)  # the buckets full again (earlier tests)
    p = await asyncio.to_thread(bench)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    steps = json.loads(p.stdout)
    assert steps and all(s["ok"] > 0 and not s["errors"] and s["wrong"] == 0 for s in steps), steps


async def test_per_client_rate_limit_refuses_at_once_with_retry_after(dep):
    await asyncio.sleep(0.6)  # buckets full again (earlier tests)
    a = await Client.connect(dep.nats_url, PREFIX, token=TOKEN, client_id="client-a")
    b = await Client.connect(dep.nats_url, PREFIX, token=TOKEN, client_id="client-b")
    try:
        outcomes = []
        for i in range(16):
            t0 = time.perf_counter()
            try:
                await a.infer("typed", feeds(i))
                outcomes.append(("ok", time.perf_counter() - t0, None))
            except ResourceExhausted as err:
                outcomes.append(("refused", time.perf_counter() - t0, err.retry_after_ms))
        ok = [o for o in outcomes if o[0] == "ok"]
        refused = [o for o in outcomes if o[0] == "refused"]
        assert 10 <= len(ok) <= 14, outcomes  # the burst of 10 (+ refill at 20/s while sending)
        assert refused and all(1 <= ra <= 50 for _, _, ra in refused)  # one token per 50 ms
        assert max(dt for _, dt, _ in refused) < 0.1  # refused at once
        await b.infer("typed", feeds())  # another client has its own bucket
        try:  # a fresh hint (an "ok" after the last refusal may have taken the token that one promised)
            await a.infer("typed", feeds())
        except ResourceExhausted as err:
            assert 1 <= err.retry_after_ms <= 50
            await asyncio.sleep(err.retry_after_ms / 1000 + 0.01)
            await a.infer("typed", feeds())  # after the hint, admitted again
    finally:
        await a.close()
        await b.close()


async def test_global_limit_burst_then_sustained_rate(dep):
    await asyncio.sleep(1.0)  # full buckets
    nc = await nats.connect(dep.nats_url, token=TOKEN)
    clients = [Client(nc, PREFIX, client_id=f"g{i}", retry_unavailable=False) for i in range(40)]
    results: list[tuple[float, bool, float]] = []
    rate, duration = 120.0, 2.0

    async def one(k: int, t_send: float):
        t0 = time.perf_counter()
        try:
            await clients[k % len(clients)].infer("typed", feeds(k), timeout_s=2)
            results.append((t_send, True, time.perf_counter() - t0))
        except ResourceExhausted:
            results.append((t_send, False, time.perf_counter() - t0))

    start = time.perf_counter()
    tasks = []
    for k in range(int(rate * duration)):  # open loop at 120 req/s: twice the sustained rate
        due = start + k / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(k, time.perf_counter() - start)))
    await asyncio.gather(*tasks)
    await nc.close()
    early = [ok for t, ok, _ in results if t < 0.35]
    late = [ok for t, ok, _ in results if 1.0 <= t < 2.0]
    assert all(early), f"{early.count(False)} refused during the burst"
    assert 35 <= sum(late) <= 85, sum(late)  # ~60 admitted per second once the burst is spent
    refused_latency = [dt for _, ok, dt in results if not ok]
    assert refused_latency and sorted(refused_latency)[len(refused_latency) // 2] < 0.05
    print(f"global limit: {sum(ok for _, ok, _ in results)}/{len(results)} admitted; "
          f"last second {sum(late)} (sustained 60/s)")


# ---- external nats-server: user/password over TLS -----------------------------------------------------------
def _make_tls(dirpath):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject, issuer, pub, signer, ca: bool):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(pub)
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                             x509.DNSName("localhost")]), critical=False)
        return b.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "inferbus test CA")])
    ca = cert(ca_name, ca_name, ca_key.public_key(), ca_key, True)
    key = ec.generate_private_key(ec.SECP256R1())
    srv = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]), ca_name, key.public_key(),
               ca_key, False)
    ckey = ec.generate_private_key(ec.SECP256R1())  # a client certificate, for mutual TLS
    client = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "inferbus test client")]), ca_name,
                  ckey.public_key(), ca_key, False)
    paths = {n: dirpath / f"{n}.pem" for n in ("ca", "cert", "key", "client_cert", "client_key")}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for c, k, name in ((srv, key, ""), (client, ckey, "client_")):
        paths[name + "cert"].write_bytes(c.public_bytes(serialization.Encoding.PEM))
        paths[name + "key"].write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                        serialization.NoEncryption()))
    return paths


async def test_external_nats_with_user_password_over_tls(tmp_path):
    tls = _make_tls(tmp_path)
    conf = (f'authorization {{ user: "ib", password: "pw-9x" }}\n'
            f'tls {{ cert_file: "{tls["cert"]}", key_file: "{tls["key"]}", timeout: 2 }}')
    models = models_subset(tmp_path / "models", ["typed"])
    with EmbeddedNats(run_dir=tmp_path / "nats", extra_config=conf, jetstream=False) as srv:
        url = f"tls://127.0.0.1:{srv.port}"
        bus = BusConfig(servers=(url,), prefix="ext", user="ib", password="pw-9x", tls_ca_file=str(tls["ca"]))
        procs = []
        try:
            for kind, cfg in (("worker", WorkerConfig(worker_id="w0", bus=bus, models_dir=str(models))),
                              ("ingress", IngressConfig(ingress_id="i0", bus=bus, models_dir=str(models)))):
                path = tmp_path / f"{kind}.json"
                path.write_text(cfg.to_json())
                os.chmod(path, 0o600)
                procs.append(subprocess.Popen([sys.executable, "-m", "inferbus.actors", kind, f"@{path}"],
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
            for p in procs:
                line = p.stdout.readline().strip()
                assert line == b"READY", line + p.stdout.read(4000)
            client = await Client.connect(url, "ext", user="ib", password="pw-9x", tls_ca_file=str(tls["ca"]))
            deadline = time.monotonic() + 30
            while not (await client.health()).ready:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            out = await client.infer("typed", feeds(21))
            assert out["a_times_2"][0, 0] == 42
            await client.close()
            ctx = ssl.create_default_context(cafile=str(tls["ca"]))
            for bad in (dict(user="ib", password="nope", tls=ctx),  # wrong password
                        dict(tls=ctx),                              # no credentials
                        dict(user="ib", password="pw-9x")):         # right password, server not verified
                with pytest.raises(Exception):
                    nc = await asyncio.wait_for(nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0,
                                                             connect_timeout=2, **bad), 10)
                    await nc.close()
        finally:
            for p in procs:
                p.terminate()
                p.wait(10)


async def test_a_password_in_the_nats_url_is_shown_nowhere(tmp_path):
    """``inferbus up --nats-url nats://u:PASSWORD@host:port`` (a fresh-user trial): the password was in the ``up``
    line, in every health reply (``nats_server`` of the ingress and of each worker, readable by any client on the
    bus), in the actors' ``reconnected to NATS`` log lines and in a second ``up``'s node-id refusal. Now none has it;
    only the actors' config files (mode 0600) keep it, as they must to connect."""
    secret = "pw-9b2e"
    with EmbeddedNats(run_dir=tmp_path / "nats", jetstream=False,
                      extra_config=f'authorization {{ user: "u", password: "{secret}" }}\n') as srv:
        url = f"nats://u:{secret}@127.0.0.1:{srv.port}"
        models = models_subset(tmp_path / "models", ["digits"])
        # a Redis password too (a later trial: in the up line and its warning); nothing listens there
        redis_url = f"redis://user:R3dis-77c1@127.0.0.1:{free_port()}/0"
        dep = start_deployment(tmp_path / "dep", workers=1, prefix="pw", extra=["--models", str(models),
                                                                               "--nats-url", url, "--redis-url",
                                                                               redis_url])
        try:
            assert f"NATS nats://u:***@127.0.0.1:{srv.port}" in dep.log.read_text(), dep.log.read_text()[-2000:]
            assert "L2 cache redis://user:***@127.0.0.1:" in dep.log.read_text(), dep.log.read_text()[-2000:]
            assert "R3dis-77c1" not in dep.log.read_text(), dep.log.read_text()[-2000:]
            client = await Client.connect(url, "pw")
            try:
                health = await client.health(timeout_s=5.0)
                text = json.dumps(health.parameters)
                assert secret not in text and f"127.0.0.1:{srv.port}" in text, text[:2000]
            finally:
                await client.close()
            second = subprocess.run([sys.executable, "-m", "inferbus.cli", "up", "--nats-url", url, "--prefix", "pw",
                                     "--models", str(models), "--workers", "1", "--run-dir", str(tmp_path / "dep2")],
                                    capture_output=True, text=True, timeout=120)
            assert second.returncode == 2 and "is in use on nats://u:***@" in second.stderr, second.stderr[-2000:]
            srv.stop()  # the actors reconnect once it is back: their log lines name the server
            srv.start()
            deadline = time.monotonic() + 20
            while "reconnected to NATS" not in (tmp_path / "dep" / "ingress-0.log").read_text():
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
            for log in (tmp_path / "dep").glob("*.log"):
                assert secret not in log.read_text(), log
            assert secret not in second.stdout + second.stderr
        finally:
            dep.stop()
