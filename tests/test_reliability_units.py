"""In-process checks of the reliability building blocks (no bus needed): circuit breaker, token buckets,
hedge policies and latency quantiles, the dedupe table, router health, cache keys."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from inferbus.actors._breaker import BreakerState, CircuitBreaker
from inferbus.actors._cache import cache_key
from inferbus.actors._dedupe import RecentResults, dedupe_key
from inferbus.actors._hedge import HedgeBudget, HedgePolicyError, LatencyWindow, parse_policy
from inferbus.actors._ratelimit import RateLimiter, TokenBucket
from inferbus.actors._router import CLIENT_ERROR, NEUTRAL, OK, SERVER_ERROR, Router, forget_after_s
from inferbus.schemas import input_from_numpy, input_to_numpy
from inferbus.schemas._internal import LoadReport

pytestmark = pytest.mark.timeout(30)


# ---- circuit breaker ------------------------------------------------------------------------------
def test_breaker_opens_after_consecutive_failures_and_probes():
    b = CircuitBreaker(failure_threshold=5, open_s=30.0)
    for _ in range(4):
        b.on_failure(0.0)
    b.on_success()  # a success resets the count
    for _ in range(4):
        b.on_failure(1.0)
    assert b.state is BreakerState.CLOSED and b.allows(1.0)
    b.on_failure(1.0)
    assert b.state is BreakerState.OPEN and b.trips == 1
    # what health shows: the state the next request would see, without the change allows() makes
    assert b.state_at(30.9) is BreakerState.OPEN and b.state_at(31.0) is BreakerState.HALF_OPEN
    assert b.state is BreakerState.OPEN
    assert not b.allows(30.9)  # open for 30 s
    assert b.allows(31.0) and b.state is BreakerState.HALF_OPEN
    probe = b.on_send()
    assert probe and not b.allows(31.0)  # one probe at a time
    b.on_failure(31.5, probe)  # the probe failed: open again, timer restarted
    assert b.state is BreakerState.OPEN and not b.allows(61.0) and b.allows(61.6)
    probe = b.on_send()
    b.on_neutral(probe)  # a deadline/shed/cancel says nothing: still half-open, slot free
    assert b.state is BreakerState.HALF_OPEN and b.allows(61.7)
    probe = b.on_send()
    b.on_success(probe)
    assert b.state is BreakerState.CLOSED and b.consecutive_failures == 0


def test_breaker_ignores_late_outcomes_while_open():
    b = CircuitBreaker(failure_threshold=2, open_s=10.0)
    b.on_failure(0.0)
    b.on_failure(0.0)
    assert b.state is BreakerState.OPEN
    b.on_success()  # a request sent before opening completes late: not a verdict
    assert b.state is BreakerState.OPEN
    b.on_failure(5.0)  # a late failure does not restart the timer
    assert b.allows(10.0)
    with pytest.raises(ValueError):
        CircuitBreaker(failure_threshold=0)


def _report(wid, **kw):
    base = dict(worker_id=wid, pid=1, device_kind="cpu", device_name="cpu0", backend="onnxruntime",
                precision="fp32", models=["m:1"], queue_depth=0, in_flight=0, capacity=8, ewma_service_us=10.0,
                completed=0, errors=0)
    base.update(kw)
    return LoadReport(**base)


def test_router_health_breaker_and_client_errors():
    r = Router(health_timeout_s=5.0, max_error_rate=0.01, min_window_requests=20, breaker_failures=3,
               breaker_open_s=1.0)
    r.on_report(_report("a"), now=0.0)
    r.on_report(_report("b"), now=0.0)
    # client errors never count against a worker
    for _ in range(10):
        w = r.pick("m:1", 0.1)
        probe = r.on_sent(w)
        r.on_done(w.worker_id, 100.0, outcome=CLIENT_ERROR, probe=probe, now=0.1)
    assert all(w.breaker.state is BreakerState.CLOSED for w in r.workers.values())
    # 3 consecutive server errors on "a" open its breaker; "b" takes everything
    for _ in range(3):
        r.on_sent(r.workers["a"])
        r.on_done("a", 100.0, outcome=SERVER_ERROR, now=0.2)
    assert r.status(0.2)["a"]["breaker"] == "open" and r.health_reason(r.workers["a"], 0.2) == "breaker_open"
    assert {r.pick("m:1", 0.3).worker_id for _ in range(20)} == {"b"}
    assert "m:1" in r.ready_models(0.3)
    # half-open after 1 s: one probe goes to "a"
    picks = [r.pick("m:1", 1.5, exclude="b")]
    assert picks[0].worker_id == "a" and r.on_sent(picks[0]) is True
    assert r.pick("m:1", 1.5, exclude="b") is None  # the probe slot is taken
    r.on_done("a", 100.0, outcome=OK, probe=True, now=1.6)
    assert r.workers["a"].breaker.state is BreakerState.CLOSED
    # error rate over the window: unhealthy, unless every worker is (panic mode)
    r.on_report(_report("a", window_requests=50, error_rate=0.04), now=2.0)
    r.on_report(_report("b"), now=2.0)
    assert r.health_reason(r.workers["a"], 2.0) == "error_rate"
    assert {r.pick("m:1", 2.0).worker_id for _ in range(20)} == {"b"}
    r.on_report(_report("b", window_requests=50, error_rate=0.5), now=2.1)
    seen = set()
    for _ in range(40):  # sent, so their queues grow: equal load spreads (without, 'a' wins every score tie)
        w = r.pick("m:1", 2.1)
        r.on_sent(w)
        seen.add(w.worker_id)
    assert seen == {"a", "b"}
    # too few requests to judge: healthy
    r.on_report(_report("a", window_requests=19, error_rate=1.0), now=2.2)
    assert r.health_reason(r.workers["a"], 2.2) == "ok"
    # silent: no report for longer than health_timeout_s
    assert r.health_reason(r.workers["a"], 7.3) == "silent" and r.pick("m:1", 7.3) is None
    r.on_done("a", 1.0, outcome=NEUTRAL)


def test_router_forgets_a_worker_silent_past_forget_after_s_and_learns_it_again():
    """A worker with no report for ``forget_after_s`` leaves the table, its breaker and load with it (health,
    ``status``, the model index); not the colocated one, one the caller still holds requests of, nor any while the
    ingress is behind its input. A completion of a request sent to it before finds nothing (or the worker learned
    again: its in-flight count stays >= 0, its fresh breaker takes the old probe's verdict as nothing), and a report
    from it makes it a new worker with a closed breaker. Before, a worker of a node SIGKILLed whole (no ``down``
    event) stayed ``silent`` in every other node's health for ever."""
    assert forget_after_s(5.0) == 60.0 and forget_after_s(10.0) == 120.0  # max(60 s, 12 x health_timeout_s)
    r = Router(health_timeout_s=1.0, forget_after_s=10.0, breaker_failures=1, breaker_open_s=100.0)
    r.local_worker_id = "local"
    for wid in ("a", "b", "gone", "local", "held"):
        r.on_report(_report(wid, server=f"s-{wid}"), now=0.0)
    gone, held = r.workers["gone"], r.workers["held"]
    for w in (gone, held):
        probe = r.on_sent(w)  # in flight when it goes silent
        assert probe is False and w.in_flight == 1
    r.on_silent("gone", now=2.0)  # (the ingress's silent-worker check) its breaker opens
    assert r.status(2.0)["gone"]["breaker"] == "open" and "gone" in r._not_closed
    for t in (1.0, 5.0, 10.0):
        r.on_report(_report("a", server="s-a"), now=t)
        r.on_report(_report("b", server="s-b"), now=t)
    assert r.forget(9.9) == [] and r.status(9.9)["gone"]["health"] == "silent"  # not yet: 9.9 s silent
    r.behind_until = 11.0
    assert r.forget(10.5) == []  # this ingress reads its reports behind a backlog: no report age is judged
    r.behind_until = 0.0
    assert r.forget(10.5, keep={"held"}) == ["gone"]  # the colocated worker and a held one stay
    assert set(r.status(10.5)) == {"a", "b", "local", "held"} and "gone" not in r._not_closed
    assert all(w is not gone for ws in r._by_model.values() for w in ws)
    assert {r.pick("m:1", 10.5).worker_id for _ in range(20)} <= {"a", "b"}
    r.on_done("gone", 100.0, outcome=SERVER_ERROR, probe=True, now=10.6)  # its request's late verdict: nothing
    assert "gone" not in r.workers
    # it reports again (a node restarted under the same id): a new worker, breaker closed, routed to
    r.on_report(_report("gone", pid=2, server="s-gone"), now=11.0)
    back = r.workers["gone"]
    assert back is not gone and back.breaker.state is BreakerState.CLOSED and back.in_flight == 0
    assert r.status(11.0)["gone"]["health"] == "ok" and back in r._by_model["m:1"]
    r.on_done("gone", 100.0, outcome=SERVER_ERROR, probe=True, now=11.1)  # a verdict of a request sent before
    assert back.in_flight == 0 and back.completed == 1
    # the held one goes once nothing holds it; the colocated one never
    assert r.forget(30.0) == ["a", "b", "gone", "held"] and list(r.workers) == ["local"]
    assert r.pick("m:1", 30.0) is None and r.ready_models(30.0) == set()
    assert not r._multi_server


# ---- rate limits -------------------------------------------------------------------------------------
def test_token_bucket_burst_then_sustained_rate():
    # "R for T seconds, then throttle": burst = (R - rate) * T. Here 300/s for 2 s, then 100/s.
    rate, peak, secs = 100.0, 300.0, 2.0
    b = TokenBucket(rate, (peak - rate) * secs, now=0.0)
    admitted = []
    t, dt = 0.0, 1.0 / peak
    while t < 4.0:
        if b.take(t) == 0.0:
            admitted.append(t)
        t += dt
    first = sum(1 for a in admitted if a < secs * 0.95)
    assert first >= peak * secs * 0.95 * 0.99  # everything admitted during the burst
    late = sum(1 for a in admitted if 3.0 <= a < 4.0)
    assert rate * 0.95 <= late <= rate * 1.05  # then the sustained rate


def test_rate_limiter_per_client_and_retry_after():
    rl = RateLimiter(client_rate_per_s=10.0, client_burst=5.0)
    assert [rl.check("a", 0.0) for _ in range(5)] == [None] * 5
    scope, wait_ms = rl.check("a", 0.0)
    assert scope == "client" and wait_ms == 100  # one token per 100 ms
    assert rl.check("b", 0.0) is None  # another client has its own bucket
    assert rl.check("a", 0.1) is None
    g = RateLimiter(rate_per_s=1000.0, burst=2.0, client_rate_per_s=1000.0, client_burst=10.0)
    assert g.check("x", 0.0) is None and g.check("y", 0.0) is None
    assert g.check("z", 0.0) == ("global", 1)
    assert g.clients["z"].tokens == 10.0  # refused globally: the client's token is given back
    small = RateLimiter(client_rate_per_s=1.0, max_clients=3)
    for i in range(10):
        small.check(str(i), float(i))
    assert len(small.clients) == 3
    with pytest.raises(ValueError):
        TokenBucket(0, 1)


# ---- hedging -----------------------------------------------------------------------------------------
def test_hedge_policies_and_quantiles():
    assert parse_policy(None) is None and parse_policy("off") is None
    assert parse_policy(20) == ("fixed", 20.0) and parse_policy("12.5") == ("fixed", 12.5)
    assert parse_policy("p95") == ("quantile", 0.95) and parse_policy("auto") == ("quantile", 0.95)
    assert parse_policy("p99.9")[1] == pytest.approx(0.999)
    for bad in ("p0", "p100", "soon", -1, 0, "nan", True):
        with pytest.raises(HedgePolicyError):
            parse_policy(bad)
    lw = LatencyWindow(size=100)
    for i in range(19):
        lw.add(float(i))
    assert lw.quantile(0.95, 0.0) is None  # too few samples
    for i in range(19, 100):
        lw.add(float(i))
    assert lw.quantile(0.95, 1.0) == 95.0 and lw.quantile(0.5, 1.0) == 50.0
    budget = HedgeBudget(ratio=0.1, burst=2.0)
    assert budget.try_spend() and budget.try_spend() and not budget.try_spend()
    for _ in range(10):
        budget.on_request()
    assert budget.try_spend() and not budget.try_spend()


# ---- dedupe table ------------------------------------------------------------------------------------
def test_recent_results_bounds_and_keys():
    k1 = dedupe_key("m:1", "id-1", b"body")
    assert k1 != dedupe_key("m:1", "id-1", b"other body")  # an id reused with other inputs is another request
    assert k1 != dedupe_key("m:2", "id-1", b"body")
    # the same version re-pinned to other files (models load): another request
    assert dedupe_key("m:1", "id-1", b"body", "sha256:aa") != dedupe_key("m:1", "id-1", b"body", "sha256:bb")
    rr = RecentResults(ttl_s=1.0, max_entries=3, max_bytes=100)
    rr.put(k1, {"h": "1"}, b"x" * 10, now=0.0)
    assert rr.get(k1, 0.5) == ({"h": "1"}, b"x" * 10)
    assert rr.get(k1, 1.5) is None  # expired
    for i in range(5):
        rr.put(("m", str(i), b""), {}, b"y" * 30, now=2.0)
    assert len(rr) == 3 and rr.bytes == 90
    rr.put(("m", "big", b""), {}, b"z" * 101, now=2.0)  # over max_bytes: not kept
    assert rr.get(("m", "big", b""), 2.0) is None


# ---- cache keys --------------------------------------------------------------------------------------
def _key(arr, outputs=None, model="m", version="1", name="x", raw=True):
    t = input_from_numpy(name, arr, raw=raw)
    return cache_key(model, version, [t], [input_to_numpy(t, field="inputs[0]")], outputs, raw, None)


def test_cache_keys_separate_shape_datatype_outputs_version():
    data = np.arange(6, dtype=np.float32)
    same_bytes_int = np.frombuffer(data.tobytes(), dtype=np.int32)
    keys = {_key(data.reshape(2, 3)), _key(data.reshape(3, 2)), _key(same_bytes_int.reshape(2, 3))}
    assert len(keys) == 3  # FP32[2,3], FP32[3,2], INT32[2,3]: same bytes, three keys
    k = _key(data.reshape(2, 3))
    assert _key(data.reshape(2, 3), outputs=["a"]) != k != _key(data.reshape(2, 3), outputs=["b"])
    assert _key(data.reshape(2, 3), outputs=["a", "b"]) != _key(data.reshape(2, 3), outputs=["b", "a"])
    assert _key(data.reshape(2, 3), version="2") != k
    assert _key(data.reshape(2, 3), raw=False) != k  # the answer's tensor form differs


# ---- nothing on the wire is unpickled or evaluated ----------------------------------------------------
def test_no_pickle_or_eval_in_the_package():
    root = Path(__file__).resolve().parents[1] / "inferbus"
    pattern = re.compile(r"\bpickle\.loads?\(|\bmarshal\.loads?\(|\beval\(|\bexec\(|allow_pickle\s*=\s*True|"
                         r"\byaml\.load\(|\bshelve\.|\bdill\.|\bcloudpickle\.")
    hits = [f"{p.relative_to(root)}:{i + 1}: {line.strip()}"
            for p in root.rglob("*.py") for i, line in enumerate(p.read_text().splitlines()) if pattern.search(line)]
    assert not hits, hits


# ---- router: the colocated worker's fast path ---------------------------------------------------------
_worker_states = st.fixed_dictionaries({
    "alive": st.booleans(), "draining": st.booleans(), "age_s": st.sampled_from([0.0, 0.3, 1.0, 6.0]),
    "ewma": st.sampled_from([0.0, 5.0, 30.0, 60.0, 400.0]), "in_flight": st.integers(0, 12),
    "queue_depth": st.integers(0, 12), "kind": st.sampled_from(["cpu", "gpu"]),
    "server": st.sampled_from(["s1", "s2"]), "region": st.sampled_from(["", "eu", "us"]),
    "window": st.sampled_from([0, 200]), "error_rate": st.sampled_from([0.0, 0.5]),
    "failures": st.sampled_from([0, 0, 0, 3]), "model": st.booleans()})


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states=st.lists(_worker_states, min_size=1, max_size=12), region=st.sampled_from(["", "eu"]),
       server=st.sampled_from(["", "s1"]), seed=st.integers(0, 2**16), exclude=st.sampled_from([None, "w1", "w0"]))
def test_router_local_fast_path_picks_what_the_full_scan_picks(states, region, server, seed, exclude):
    """Whenever pick() returns the colocated worker without pricing the others, the full scan (with any
    random draw) returns it too; and the fast path is taken in the plain colocated case."""
    r = Router(health_timeout_s=5.0, min_window_requests=100, breaker_failures=3, region=region, local_worker_id="w0")
    r.server = server
    for i, s in enumerate(states):
        r.on_report(_report(f"w{i}", pid=i + 1, device_kind=s["kind"], ewma_service_us=s["ewma"],
                            queue_depth=s["queue_depth"], server=s["server"], region=s["region"],
                            draining=s["draining"], window_requests=s["window"], error_rate=s["error_rate"],
                            models=["m:1"] if s["model"] or i == 0 else ["other:1"]), now=10.0 - s["age_s"])
    for i, s in enumerate(states):
        w = r.workers[f"w{i}"]
        w.in_flight = s["in_flight"]
        for _ in range(s["failures"]):
            r.on_done(w.worker_id, 1.0, outcome=SERVER_ERROR, now=10.0)
        if not s["alive"]:
            r.on_down(w.worker_id)
    assert r._not_closed == {w.worker_id for w in r.workers.values() if w.breaker.state is not BreakerState.CLOSED}
    lw = r.workers["w0"]
    fast = exclude != "w0" and not r._breaker_pending("m:1") and r._local_wins(lw, "m:1", 10.0, exclude)
    for k in range(8):
        r._rng.seed(seed + k)
        full = r._pick_scan("m:1", 10.0, exclude)
        r._rng.seed(seed + k)
        assert r.pick("m:1", 10.0, exclude) is full
        if fast:
            assert full is lw


def test_router_local_fast_path_is_taken_when_the_local_worker_is_idle():
    r = Router(local_worker_id="a")
    for wid in "abcdefgh":
        r.on_report(_report(wid, ewma_service_us=40.0 if wid == "a" else 30.0), now=0.0)
    a = r.workers["a"]
    assert r._local_wins(a, "m:1", 0.1) and r.pick("m:1", 0.1) is a
    a.in_flight = 10  # 11 x 30 (its class's price) - 250 > 30: a remote worker is cheaper, the full scan decides
    assert not r._local_wins(a, "m:1", 0.1) and r.pick("m:1", 0.1) is not a
    a.in_flight = 0
    r.on_report(_report("b", ewma_service_us=0.0), now=0.1)
    for _ in range(5):  # an open breaker anywhere: the full scan (a probe may be due)
        r.on_done("b", 1.0, outcome=SERVER_ERROR, now=0.1)
    assert r._not_closed == {"b"} and r.workers["b"].breaker.state is BreakerState.OPEN
    assert r._breaker_pending("m:1") and not r._breaker_pending("other:1")
    assert r.pick("m:1", 0.2) is a  # chosen by the full scan
    r.on_report(_report("b"), now=40.0)
    assert r.pick("m:1", 40.0, exclude="a").worker_id == "b"  # HALF_OPEN probe
    assert r._not_closed == {"b"}
    r.on_done("b", 1.0, outcome=OK, probe=True, now=40.1)
    assert r._not_closed == set() and r.workers["b"].breaker.state is BreakerState.CLOSED
    # a dead worker's open breaker (nothing will close it) does not keep the fast path off
    for _ in range(5):
        r.on_done("c", 1.0, outcome=SERVER_ERROR, now=40.2)
    assert r._breaker_pending("m:1")
    r.on_down("c")
    r.on_report(_report("a", ewma_service_us=40.0), now=40.2)
    assert r._not_closed == {"c"} and not r._breaker_pending("m:1") and r._local_wins(a, "m:1", 40.3)


def test_router_local_fast_path_prices_by_the_class_when_its_fastest_worker_is_routable():
    """With one device class, the fast path prices the local worker as the full choice does (by the class's
    least EWMA) while the worker that has it is routable, not by the local worker's own higher EWMA: in a burst
    the local worker keeps its requests without the full pass as long as the full pass would keep them."""
    r = Router(health_timeout_s=5.0, local_worker_id="a")
    for wid in "abcdefgh":
        r.on_report(_report(wid, ewma_service_us=60.0 if wid == "a" else 30.0), now=0.0)
    a = r.workers["a"]
    a.in_flight = 8  # 8 x 30 = 240 < 250: the full choice keeps it local ((8 + 1) x 30 - 250 = 20 < 30)
    assert r._pick_scan("m:1", 0.1, None) is a
    scans = r.scans
    assert r._local_wins(a, "m:1", 0.1) and r.pick("m:1", 0.1) is a  # by its own EWMA: 9 x 60 - 250 > 30
    assert r.scans == scans  # no full pass (counts.route_scans)
    a.in_flight = 9  # 9 x 30 = 270 > 250: a remote worker is cheaper; the fast path says so too
    assert not r._local_wins(a, "m:1", 0.1) and r.pick("m:1", 0.1) is not a
    assert r.scans == scans + 1
    a.in_flight = 8
    assert not r._local_wins(a, "m:1", 0.1, exclude="b")  # the fastest is excluded: priced by its own EWMA
    r.on_report(_report("b", ewma_service_us=30.0, draining=True), now=0.1)
    assert not r._local_wins(a, "m:1", 0.2)  # the fastest is draining: the class's price is not known here
    r.on_report(_report("b", ewma_service_us=30.0), now=0.1)
    assert r._local_wins(a, "m:1", 0.2)
    r.on_report(_report("h", ewma_service_us=30.0, device_kind="gpu"), now=0.2)
    assert not r._local_wins(a, "m:1", 0.3)  # two device classes: priced by its own EWMA again
    assert r._pick_scan("m:1", 0.3, None) is a


def test_router_prices_a_worker_busy_with_a_long_batch_by_its_age():
    """Another ingress's one legal multi-second request is on worker "a" (its inference thread has been
    computing for 2 s): an ingress that did not send it must not see "a" as idle and tie it with "b"; a normal
    batch (a few service times old) changes nothing."""
    r = Router()
    cap = 100_000
    r.on_report(_report("a", ewma_service_us=300.0, computing_ms=2000.0, capacity=cap), now=0.0)
    r.on_report(_report("b", ewma_service_us=300.0, capacity=cap), now=0.0)
    assert r.workers["a"].queue_depth >= 2000 * 1000 // 300 - 1
    assert {r.pick("m:1", 0.1).worker_id for _ in range(50)} == {"b"}
    # both busy: the younger long batch is the shorter expected wait
    r.on_report(_report("b", ewma_service_us=300.0, computing_ms=500.0, capacity=cap), now=0.2)
    assert {r.pick("m:1", 0.3).worker_id for _ in range(50)} == {"b"}
    # at most a full mailbox (8 here): "b" is preferred until its own queue is as long, then "a" takes its share
    # (uncapped, a burst all went to "b", whose mailbox shed what "a" would have queued)
    r.on_report(_report("a", ewma_service_us=300.0, computing_ms=2000.0), now=0.35)
    r.on_report(_report("b", ewma_service_us=300.0), now=0.35)
    assert r.workers["a"].queue_depth == 8
    st = r.status(0.35)["a"]  # the health reply shows the mailbox as reported, and the priced part apart
    assert st["queue_depth"] == 0 and st["long_batch_depth"] == 8 and st["computing_ms"] == 2000.0
    picks = []
    for _ in range(20):
        w = r.pick("m:1", 0.36)
        r.on_sent(w)
        picks.append(w.worker_id)
    assert picks[:8] == ["b"] * 8 and "a" in picks[8:], picks
    for w in ("a", "b"):
        r.workers[w].in_flight = 0
    # the batch ended: "a" is priced by its mailbox again, and a short batch (3 ms, 10 service times) is normal
    r.on_report(_report("a", ewma_service_us=300.0, computing_ms=3.0), now=0.4)
    r.on_report(_report("b", ewma_service_us=300.0), now=0.4)
    assert r.workers["a"].queue_depth == 0
    seen = set()
    for _ in range(20):  # sent, so their queues grow: equal load spreads
        w = r.pick("m:1", 0.5)
        r.on_sent(w)
        seen.add(w.worker_id)
    assert seen == {"a", "b"}


def test_the_router_marks_when_a_worker_reported_itself_behind_its_input():
    """``WorkerState.behind_at``: a report with a subscription backlog or a queue marks the worker behind at that time; a report
    without one leaves the mark (the ingress forgets, not blames, a request missing within 2 × ``pending_grace_s``
    of it); requests found expired or shed do not mark it (they also pile up behind a hung model's batch); a report
    after a gap of reports marks the gap (a frozen worker's backlog is no overload)."""
    r = Router()
    r.on_report(_report("w1"), now=10.0)  # reports every 100 ms (LoadReport.interval_ms)
    assert r.workers["w1"].behind_at == float("-inf")
    r.on_report(_report("w1", backlog_msgs=40), now=10.1)
    assert r.workers["w1"].behind_at == 10.1
    r.on_report(_report("w1"), now=10.2)  # caught up: the mark stays where it was
    assert r.workers["w1"].behind_at == 10.1
    r.on_report(_report("w1", expired=3, shed=1), now=10.3)
    assert r.workers["w1"].behind_at == 10.1
    assert r.workers["w1"].gap_at == float("-inf")
    r.on_report(_report("w1", backlog_msgs=9), now=12.3)  # 2 s after the last: it was frozen
    assert r.workers["w1"].gap_at == 12.3 and r.workers["w1"].behind_at == 12.3
    r.on_report(_report("w1", queue_depth=5), now=12.4)  # requests queued at the worker: behind too
    assert r.workers["w1"].behind_at == 12.4 and r.workers["w1"].gap_at == 12.3


def test_a_report_after_a_gap_from_a_busy_process_marks_it_behind_not_frozen():
    """A gap of reports is a freeze (``gap_at``) only when the report after it says the process used little CPU
    through it (``LoadReport.cpu_ratio`` < ``GAP_BUSY_CPU_RATIO``); a process that ran through its gap (a colocated
    process working off its own ingress's backlog, the second trial of 2026-12-05) was behind, an overload
    (``behind_at``). While the gap lasts, :meth:`WorkerState.in_report_gap` says so (the ingress waits for the
    report before it judges what went missing there)."""
    from inferbus.actors._router import GAP_BUSY_CPU_RATIO, REPORT_GAP_INTERVALS
    r = Router()
    r.on_report(_report("w1", cpu_ratio=0.1), now=10.0)
    w = r.workers["w1"]
    assert not w.in_report_gap(10.0 + REPORT_GAP_INTERVALS * 0.1 - 0.01)
    assert w.in_report_gap(10.0 + REPORT_GAP_INTERVALS * 0.1 + 0.01)  # 100 ms reports: over 1 s is a gap
    r.on_report(_report("w1", cpu_ratio=0.97), now=12.0)  # busy through the gap
    assert (w.behind_at, w.gap_at) == (12.0, float("-inf")) and not w.in_report_gap(12.5)
    r.on_report(_report("w1", cpu_ratio=GAP_BUSY_CPU_RATIO - 0.01), now=14.0)  # stopped through it: frozen
    assert (w.behind_at, w.gap_at) == (12.0, 14.0)
    r.on_report(_report("w1"), now=16.0)  # unmeasured (an older worker): frozen, as before cpu_ratio
    assert w.gap_at == 16.0
    r.on_report(_report("w1", interval_ms=1000, cpu_ratio=0.0), now=20.0)  # its interval is its own: 4 s is no gap
    assert w.gap_at == 16.0 and w.report_interval_s == 1.0 and not w.in_report_gap(29.0) and w.in_report_gap(30.5)
    r.on_down("w1")
    assert not w.in_report_gap(40.0)  # a dead worker is no gap: its requests are failed by the down event


def test_router_leaves_its_region_when_every_worker_there_has_gone_silent():
    """A fresh-user trial (``cluster up``, one worker per region): the primary region's only worker SIGSTOPped, every
    request with a 1 s budget failed for 1.5 s while the standby region's worker idled, because the router kept to its
    own region's worker until the suspicion age (2.5 s). Past ``REGION_FRESH_S`` (0.5 s) of silence of every worker
    of its region, a worker of another region that reports is picked; while one of its region reports, or while the
    ingress is behind its own input (report ages are its lag then), its region is kept."""
    from inferbus.actors._router import REGION_FRESH_S

    r = Router(health_timeout_s=5.0, region="A")
    r.on_report(_report("a0", region="A"), now=10.0)
    r.on_report(_report("b0", region="B"), now=10.0)
    assert {r.pick("m:1", 10.2).worker_id for _ in range(10)} == {"a0"}  # its region, while it reports
    r.on_report(_report("b0", region="B"), now=10.0 + REGION_FRESH_S + 0.1)  # a0 silent since 10.0
    t = 10.0 + REGION_FRESH_S + 0.15
    assert r.health_reason(r.workers["a0"], t) == "ok"  # not yet quiet (2.5 s): only the region preference moves
    assert {r.pick("m:1", t).worker_id for _ in range(10)} == {"b0"}
    r.behind_until = t + 1.0  # behind its own input: the ages are this ingress's lag, its region is kept
    assert {r.pick("m:1", t).worker_id for _ in range(10)} == {"a0"}
    r.behind_until = 0.0
    r.on_report(_report("a1", region="A"), now=t)  # another worker of its region reports: back to its region
    assert {r.pick("m:1", t + 0.01).worker_id for _ in range(10)} <= {"a0", "a1"}
    r.on_report(_report("b0", region="B"), now=t)  # every worker silent: no fresher one elsewhere, its region kept
    assert r.pick("m:1", t + 0.9).region == "A"
