"""The bus layer against a real nats-server: connect policy, embedded servers."""

from __future__ import annotations

import time

import pytest
from nats.errors import NoServersError

from inferbus.bus import BusConfig, EmbeddedNats, connect, free_port
from inferbus.client import Client
from inferbus.schemas import DeadlineExceeded, Unavailable

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_wrong_credentials_fail_fast_then_reconnect_forever(tmp_path):
    with EmbeddedNats(run_dir=tmp_path, extra_config='authorization { token: "s3cret" }') as srv:
        t0 = time.monotonic()
        with pytest.raises(Unavailable) as ei:  # the SDK's typed error, nats-py's chained
            await Client.connect(srv.url)
        assert isinstance(ei.value.__cause__, NoServersError) and srv.url in ei.value.message
        assert time.monotonic() - t0 < 5
        nc = await connect(BusConfig(servers=(srv.url,), token="s3cret"))
        try:
            assert nc.is_connected
            assert nc.options["max_reconnect_attempts"] == -1  # once connected: reconnect for ever
        finally:
            await nc.close()


async def test_unreachable_server_fails_fast():
    t0 = time.monotonic()
    with pytest.raises(NoServersError):
        await connect(BusConfig(servers=(f"nats://127.0.0.1:{free_port()}",), connect_timeout_s=0.5))
    assert time.monotonic() - t0 < 5


def test_bus_config_validation():
    with pytest.raises(ValueError, match="connect_attempts"):
        BusConfig(connect_attempts=0)
    with pytest.raises(ValueError, match="prefix"):
        BusConfig(prefix="a b")
    # a token inferbus puts after a prefix: a deployment on 'inferbus' would take this one's messages
    for prefix in ("inferbus.ingresses.n1-i0", "inferbus.models", "desk.infer", "a._w", "a.b.nodes"):
        with pytest.raises(ValueError, match="which inferbus puts after a prefix"):
            BusConfig(prefix=prefix)
    for prefix in ("models", "desk.eu", "infer-x.y", "a.modelsx", "_x.y"):  # first token, or not a whole token
        assert BusConfig(prefix=prefix).prefix == prefix
    assert BusConfig.from_dict(BusConfig(servers=("nats://x:1",)).to_dict()).servers == ("nats://x:1",)


async def test_embedded_nats_runs_on_the_cores_it_is_given(tmp_path):
    """``EmbeddedNats(cpus=...)``: the server process and every one of its threads run with that affinity (set
    before exec, so the Go runtime starts with it), and it serves."""
    import os
    from pathlib import Path

    mine = os.sched_getaffinity(0)
    with EmbeddedNats(run_dir=tmp_path, cpus=(0,)) as srv:
        tasks = list(Path(f"/proc/{srv.proc.pid}/task").iterdir())
        assert len(tasks) > 1 and all(os.sched_getaffinity(int(t.name)) == {0} for t in tasks)
        nc = await connect(BusConfig(servers=(srv.url,)))

        async def echo(msg) -> None:
            await msg.respond(msg.data)

        try:
            sub = await nc.subscribe("echo", cb=echo)
            assert (await nc.request("echo", b"x", timeout=2)).data == b"x"
            await sub.unsubscribe()
        finally:
            await nc.close()
    assert os.sched_getaffinity(0) == mine  # set in the child only


def test_embedded_nats_restarts_on_the_same_port(tmp_path):
    srv = EmbeddedNats(run_dir=tmp_path).start()
    try:
        port = srv.port
        srv.kill()
        srv.start()
        assert srv.port == port and srv.proc.poll() is None
    finally:
        srv.stop()


@pytest.mark.parametrize("attempts", [1, 2])
async def test_the_first_connect_tries_each_server_connect_attempts_times(attempts):
    """nats-py tries a server until its failures exceed ``max_reconnect_attempts``: once more than asked (a
    fresh-user trial timed ``connect_timeout_s=0.5, connect_attempts=1`` at 2.06 s). A server that accepts TCP and
    never says INFO (so that each try is one accepted connection that times out) is now tried exactly
    ``connect_attempts`` times."""
    import asyncio

    accepted = []

    async def silent(reader, writer):
        accepted.append(time.monotonic())
        try:
            await reader.read()  # until the client gives up and closes
        finally:
            writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        t0 = time.monotonic()
        with pytest.raises(NoServersError):
            await connect(BusConfig(servers=(f"nats://127.0.0.1:{port}",), connect_timeout_s=0.3,
                                    connect_attempts=attempts))
        took_s = time.monotonic() - t0
        await asyncio.sleep(0.3)  # a further try would have been accepted by now
        assert len(accepted) == attempts, (accepted, took_s)
        assert took_s < attempts * 0.3 + 1.0, took_s
    finally:
        server.close()
        await server.wait_closed()


_GUARD_SCRIPT = """
import asyncio, sys
from inferbus.actors._common import ConnectionGuard, connect_logged
from inferbus.bus import BusConfig, close_connection

async def main(url, how):
    nc = await connect_logged(BusConfig(servers=(url,)), "guard-test")
    if how == "close":  # our own close: nothing more happens
        await close_connection(nc)
    else:  # a payload within max_payload whose headers take it over: nats-py sends it, the server says -ERR
        await nc.publish("guard.x", b"x" * (nc.max_payload - 100), headers={"H": "y" * 1000})
        await nc.flush(timeout=2)
    await asyncio.sleep(3)
    print("still running", nc.is_closed, flush=True)

ConnectionGuard.exit_on_close = sys.argv[3] == "exit"
asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.parametrize("how,guard", [("server", "exit"), ("server", "stay"), ("close", "exit")])
def test_a_connection_nats_py_closed_for_good_ends_an_actor_process(nats_server, how, guard):
    """A fresh-user trial: nats-server closed an ingress's connection ("maximum payload exceeded": a reply whose
    headers nats-py did not count), nats-py does not reconnect after such a ``-ERR``, and the ingress process lived
    on without a connection, so its supervisor never restarted it and the node answered "no responders" for good.
    Now an actor process (``run_actor`` sets ``ConnectionGuard.exit_on_close``) whose connection nats-py closed by
    itself exits at once with status 75 and a line naming the server's error, for its supervisor to restart; one
    that closed its connection itself (``close_connection``) goes on, and so does a program that runs actors in its
    own process (the line only)."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _GUARD_SCRIPT, nats_server.url, how, guard], capture_output=True,
                       text=True, timeout=20)
    if how == "close":
        assert p.returncode == 0 and "still running True" in p.stdout, (p.returncode, p.stdout, p.stderr)
        assert "was closed" not in p.stderr, p.stderr
    elif guard == "exit":
        assert p.returncode == 75 and "still running" not in p.stdout, (p.returncode, p.stdout, p.stderr)
        assert "guard-test: the NATS connection was closed" in p.stderr and "exiting (status 75)" in p.stderr, p.stderr
        assert "maximum payload" in p.stderr.lower(), p.stderr
    else:
        assert p.returncode == 0 and "still running True" in p.stdout, (p.returncode, p.stdout, p.stderr)
        assert "the NATS connection was closed" in p.stderr and "exiting" not in p.stderr, p.stderr


@pytest.mark.timeout(60)
async def test_a_reconnect_gives_up_a_stopped_server_within_reconnect_timeout_s(tmp_path):
    """A fresh-user trial froze a whole primary region (SIGSTOP): a stopped server accepts the TCP connection and
    never sends INFO, and nats-py waited ``connect_timeout`` (2 s) on each such server of the client's list before
    the next, so SDK clients had no answer for 3.1-4.7 s. Once connected a reconnect now waits
    ``reconnect_timeout_s`` (0.5 s) per server. Here a client's list is [S1, S2, S3], S1 and S2 are stopped, and the
    client must be answered through S3 within the stale detection (0.5 s) + one 0.5 s wait + slack, where 2 s per
    stopped server took more than 2.5 s."""
    import os
    import signal

    import numpy as np  # noqa: F401 (the SDK's import)

    servers = [EmbeddedNats(run_dir=tmp_path / f"s{i}", port=free_port()).start() for i in range(3)]
    stopped = []
    try:
        responder = await connect(BusConfig(servers=(servers[2].url,)))

        async def echo(msg):
            await msg.respond(msg.data)

        await responder.subscribe("echo", cb=echo)
        async with await Client.connect([s.url for s in servers]) as client:
            assert client.nc.connected_url.port == servers[0].port
            for s in servers[:2]:
                os.kill(s.proc.pid, signal.SIGSTOP)
                stopped.append(s)
            t0 = time.monotonic()
            while True:  # the SDK retries a lost attempt within the budget; S1 and S2 hold no responder
                try:
                    body, _ = await client.request("echo", b"x", timeout_s=1.0)
                    if client.nc.connected_url.port == servers[2].port:
                        break
                except (Unavailable, DeadlineExceeded):
                    pass
                assert time.monotonic() - t0 < 10, "never reached S3"
            took_s = time.monotonic() - t0
        print(f"answered through S3 {took_s:.2f} s after S1 and S2 stopped")
        assert body == b"x" and took_s < 2.2, took_s
        await responder.close()
    finally:
        for s in stopped:
            os.kill(s.proc.pid, signal.SIGCONT)
        for s in servers:
            s.stop()


def test_each_prefix_has_a_lease_bucket_of_its_own():
    """``desk.eu``, ``desk-eu`` and ``desk_eu`` shared the bucket ``desk_eu_regions`` (both ``.`` and ``-`` became
    ``_``), so two deployments on one witness would have shared a lease and a fencing term."""
    import itertools
    import re

    from inferbus.actors._lease import bucket_name
    from inferbus.bus._config import prefix_problem

    names = ["desk.eu", "desk-eu", "desk_eu", "desk__eu", "desk_.eu", "a.b_c", "a_b.c", "a_b_c", "a.b.c", "_x.y",
             "__x.y", "x_.y", "x__.y", "a-.b", "a.-b", "inferbus"]
    names += ["".join(p) for p in itertools.product("a_.-", repeat=4)]  # every short mix of the separators
    valid = sorted({n for n in names if prefix_problem(n) is None})
    buckets = {bucket_name(n) for n in valid}
    assert len(buckets) == len(valid), [n for n in valid if [bucket_name(m) for m in valid].count(bucket_name(n)) > 1]
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", b) for b in buckets)
    assert bucket_name("desk.eu") == "desk_eu_regions" and bucket_name("inferbus") == "inferbus_regions"


def test_ingress_of_reads_back_the_id_at_ingress_put_in():
    from inferbus.bus import Subjects

    s = Subjects("p")
    for subject in ("p.health", "p.infer.digits.2", "p.models.digits.ready"):
        at = s.at_ingress(subject, "n1-i0")
        assert s.ingress_of(at) == "n1-i0", at
        assert s.ingress_of(subject) is None, subject
    assert s.ingress_of("p.ingresses") is None and s.ingress_of("p.ingresses..health") is None
    assert s.ingress_of("q.ingresses.n1-i0.health") is None
