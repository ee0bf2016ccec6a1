"""Node failover drills, short versions (CI): real processes, real faults, figures asserted.

The full soak (10 minutes, a fault every 30 s) is a documented command, not part of CI:
``inferbus chaos run soak --duration 600 --rate 200 --json`` (see docs/reliability.md).
"""

from __future__ import annotations

import pytest

from chaos.node_drills import DrillOptions, cache_loss, soak, worker_crash, worker_hang
from conftest import MODELS, uvloop_backend as anyio_backend  # noqa: F401 (anyio_backend: uvloop only)

pytestmark = [pytest.mark.anyio]


def _opts(**kw) -> DrillOptions:
    base = dict(duration_s=6.0, rate_qps=60.0, timeout_s=1.0, workers=2, models_dir=str(MODELS), health_timeout_s=1.0)
    base.update(kw)
    return DrillOptions(**base)


def _common(f, *, frozen: bool = False):
    assert f.requests > 0
    assert f.wrong == 0
    if frozen:
        # a worker frozen in the middle of computing a request finishes it when it thaws, and the client's retry may
        # have run it elsewhere meanwhile: the one duplicate the design allows (docs/failure-semantics.md, "A worker
        # that freezes"; a clean-clone CI run, 2026-12-03: one, sent at the instant of the SIGSTOP). The fence must
        # stop every other: nothing sent after the freeze began, and at 60 requests/s no more than the batch it
        # caught (1-2 requests)
        assert f.duplicates == f.extra["duplicates_in_flight_at_fault"] <= 2, f.extra
    else:
        assert f.duplicates == 0
    assert f.extra["executions_audited"] >= f.ok  # the audit saw every answered execution
    print(f.to_dict())


@pytest.mark.timeout(90)
async def test_worker_crash_drill():
    f = await worker_crash(_opts())
    _common(f)
    assert f.availability >= 0.99  # the SDK retries the requests the dead worker held
    assert f.detection_ms is not None and f.detection_ms < 1000
    assert f.recovery_ms is not None


@pytest.mark.timeout(90)
async def test_worker_hang_drill():
    f = await worker_hang(_opts(duration_s=8.0))
    _common(f, frozen=True)
    assert f.availability >= 0.99
    # taken out of routing within its health window (1 s here) plus report/sweep periods
    assert f.detection_ms is not None and f.detection_ms < 1000 + 600
    assert f.recovery_ms is not None


@pytest.mark.timeout(90)
async def test_cache_loss_drill():
    f = await cache_loss(_opts(duration_s=12.0))
    _common(f)
    assert f.availability == 1.0  # no answer depends on the L2 cache
    # recovery is Valkey's restart (the first PING it answers), not the drill's hold before the heal (4 s here)
    assert f.recovery_ms is not None and f.recovery_ms < 3500, f.recovery_ms


@pytest.mark.timeout(120)
async def test_soak_short():
    # 30 s: a worker restart takes 3-8 s on a loaded 2-core box, and each fault waits for the previous recovery
    f = await soak(_opts(duration_s=30.0, fault_every_s=6.0, hang_s=1.5))
    _common(f)
    assert len(f.extra["faults"]) >= 3
    swaps = [e["info"] for e in f.extra["faults"] if e["fault"] == "model-swap"]
    # the writes' own answer times in ms (they were shifted by the injection's monotonic instant: -88741 ms), and
    # the heal's instant in seconds after the injection
    assert swaps and all(0 < i["swap_ms"] < 10_000 and 0 < i["heal_ms"] < 10_000 and 0 < i["healed_at"] < 60
                         for i in swaps), swaps
    assert f.availability >= 0.98
    assert f.extra["rss_kib"]
