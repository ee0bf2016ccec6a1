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
