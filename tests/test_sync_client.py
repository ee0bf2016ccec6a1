"""``inferbus.SyncClient``, the blocking SDK, against the shared deployment (real nats-server, workers, Valkey)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import inferbus
from inferbus.schemas import InvalidArgument, NotFound, Unavailable

from conftest import MODELS
from test_reliability_lib import reference

pytestmark = pytest.mark.timeout(120)


def test_blocking_calls_from_many_threads_get_their_own_answers_and_typed_errors(deployment):
    """Eight threads share one SyncClient: every answer equals the model's own in-process answer for that
    thread's input; errors are the SDK's typed ones, raised in the calling thread; close stops the loop thread
    and a later call says the client is closed."""
    x = np.load(MODELS / "digits" / "data" / "test.npz")["X"][:64].astype(np.float32)
    before = {t.name for t in threading.enumerate()}
    with inferbus.SyncClient.connect(deployment.nats_url, deployment.prefix) as client:
        assert client.health().ready
        assert "digits" in [m.name for m in client.models().models]

        def one(i: int) -> None:
            feeds = {"pixels": x[i:i + 1] + np.float32(i * 1e-3)}
            out = client.infer("digits", feeds, timeout_s=10)
            np.testing.assert_allclose(out["logits"], reference("digits", feeds)["logits"], rtol=1e-5, atol=1e-5)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(64)))
        res = client.infer_result("digits", {"pixels": x[:2]}, timeout_s=10)
        assert res.outputs["logits"].shape == (2, 10) and res.model_name == "digits"
        with pytest.raises(NotFound):
            client.infer("no_such_model", {"pixels": x[:1]}, timeout_s=5)
        with pytest.raises(InvalidArgument) as ei:
            client.infer("digits", {"pixels": x[:1, :10]}, timeout_s=5)
        assert ei.value.field.startswith("inputs")
    assert {t.name for t in threading.enumerate()} <= before  # the loop thread is gone
    with pytest.raises(Unavailable, match="closed"):
        client.health()


def test_close_cancels_the_calls_other_threads_wait_in_and_a_call_from_its_own_loop_is_refused(nats_server):
    """Strategy threads blocked in calls when the program shuts the client down get Unavailable at once (they
    used to block forever: the loop they waited on was stopped). A call made on the client's own loop thread
    would wait for itself: RuntimeError, at once."""
    import asyncio
    import time

    import nats

    async def silent_server(ready: threading.Event, stop: threading.Event) -> None:
        nc = await nats.connect(nats_server.url)

        async def swallow(msg) -> None:  # takes the request, never answers
            pass

        await nc.subscribe("inferbus.infer.digits", cb=swallow)
        await nc.flush()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await nc.close()

    ready, stop = threading.Event(), threading.Event()
    server = threading.Thread(target=lambda: asyncio.run(silent_server(ready, stop)), daemon=True)
    server.start()
    assert ready.wait(10)
    client = inferbus.SyncClient.connect(nats_server.url, adaptive_attempt_timeout=False)
    outcomes: list[BaseException | None] = []

    def waiter() -> None:
        try:
            client.infer("digits", {"pixels": np.zeros((1, 64), np.float32)}, timeout_s=30)
            outcomes.append(None)
        except BaseException as exc:  # noqa: BLE001 (the test looks at what it was)
            outcomes.append(exc)

    try:
        threads = [threading.Thread(target=waiter) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)  # all four are waiting for an answer that never comes
        assert not outcomes

        async def from_its_own_loop():
            return client.health()

        with pytest.raises(RuntimeError, match="its own event loop"):
            asyncio.run_coroutine_threadsafe(from_its_own_loop(), client._loop).result(5)
        t0 = time.monotonic()
        client.close()
        for t in threads:
            t.join(5)
        assert time.monotonic() - t0 < 5 and not any(t.is_alive() for t in threads)
        assert len(outcomes) == 4 and all(isinstance(o, Unavailable) and "closed" in o.message for o in outcomes), \
            outcomes
    finally:
        client.close()
        stop.set()
        server.join(5)


def test_close_after_the_server_went_away_leaves_no_pending_task_behind(tmp_path):
    """A SyncClient whose server stopped with calls waiting (nats-py's subscription tasks still pending),
    then closed: the process ends without asyncio's ``Task was destroyed but it is pending!`` on stderr (its loop
    was stopped with nats-py's tasks pending: a fresh-user trial, 3 of 3 runs)."""
    import subprocess
    import sys
    import textwrap

    from conftest import ROOT

    script = textwrap.dedent(f"""
        import asyncio, threading, nats
        import inferbus
        from inferbus.bus import EmbeddedNats
        srv = EmbeddedNats(run_dir={str(tmp_path / "nats")!r})
        srv.start()
        ready = threading.Event()

        def responder():
            async def main():
                nc = await nats.connect(srv.url, allow_reconnect=False)
                async def answer(msg):
                    await msg.respond(b"ok")
                await nc.subscribe("echo", cb=answer)
                await nc.flush()
                ready.set()
                while not nc.is_closed:
                    await asyncio.sleep(0.05)
            asyncio.run(main())

        threading.Thread(target=responder, daemon=True).start()
        ready.wait(10)
        client = inferbus.SyncClient.connect(srv.url)
        assert client.request("echo", b"x", timeout_s=5.0)[0] == b"ok"  # its reply subscription is up
        srv.stop()
        def waiting():  # a call in flight when the server went away: it waits in the reconnect buffer
            try:
                client.request("echo", b"y", timeout_s=5.0)
            except inferbus.schemas.Unavailable:
                pass
        calls = [threading.Thread(target=waiting) for _ in range(4)]
        [c.start() for c in calls]
        import time
        time.sleep(1.0)
        client.close()
        [c.join(10) for c in calls]
        print("closed")
    """)
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "closed", (p.returncode, p.stdout, p.stderr[-2000:])
    assert "Task was destroyed" not in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
