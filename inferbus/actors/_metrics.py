"""Prometheus metrics of one node, read at scrape time (``inferbus up --metrics-port``; docs/observability.md).

One HTTP endpoint per node (``inferbus up``), like Triton's ``:8002/metrics`` per server: the node process
serves it with prometheus-client's WSGI app on the node's HTTP server (:mod:`inferbus.actors._http`, waitress). A scrape asks every
actor process of this node for its ``$SRV.STATS`` (NATS micro, one request answered by each instance) on the
node's own NATS connection and turns the counters and state the actors keep (the ingresses' ``counts``, router view,
latency window and per-model counts, the workers' load-report fields and per-model runs, the aggregator's fills, the
region manager's role) into metric families. A scrape costs each actor process one ``$SRV.STATS`` answer. The
per-model counts are the only ones kept for metrics alone: on the request path a plain ``list.append`` per forward
settled at the ingress and per model run at the worker, and an increment per cache hit and per error answer, folded
into histogram buckets off the request path (:mod:`inferbus.actors._modelstats`); no prometheus-client object is
touched there.

Collection runs on the HTTP server's thread: :meth:`NodeCollector.collect` hands the gathering to the node's
event loop (``asyncio.run_coroutine_threadsafe``) and waits at most ``wait_s`` (default 1 s) for every actor
this node started to answer; one that does not is ``inferbus_actor_up 0`` and its metrics are missing from
that scrape (Prometheus's own ``up`` says whether the node process answered at all). Replies from processes
of other nodes or prefixes on a shared NATS are ignored (matched by process id and subject prefix).

Each scrape also has ``process_cpu_seconds_total``, ``process_resident_memory_bytes`` (and the rest of
prometheus-client's :class:`~prometheus_client.ProcessCollector` series) of every process of the node, labelled
``child`` as ``inferbus_child_running`` is: read by the node process from ``/proc/<pid>`` of each child its
supervisors know (after the bus gathering, on the HTTP server's thread), so they cost the actors nothing. Linux only:
without ``/proc`` there are no ``process_*`` series.

The same HTTP server answers the KServe Open Inference Protocol v2 health paths (``/v2/health/live``,
``/v2/health/ready``, ``/v2/models/<name>[/versions/<version>]/ready``) and ``HEAD``: :mod:`inferbus.actors._probes`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Iterator

from prometheus_client import ProcessCollector
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric,
                                     SummaryMetricFamily)

from ..bus import Subjects
from ._modelstats import BATCH_BOUNDS, LATENCY_BOUNDS_S

log = logging.getLogger("inferbus.metrics")

SERVICES = ("inferbus-ingress", "inferbus-worker", "inferbus-aggregator", "inferbus-region")
"""The NATS micro services a scrape asks for ``$SRV.STATS``."""

SCRAPE_WAIT_S = 1.0
"""How long a scrape waits for the node's actors to answer, seconds (it returns as soon as all have)."""

BREAKER_STATES = ("closed", "open", "half_open")

# ingress ``counts`` keys with a metric of their own: key → (name, help, extra labels); every other key is
# ``inferbus_ingress_events_total{event=<key>}``, so a count added later is never dropped silently
_REJECTED = ("inferbus_ingress_rejected", "Requests refused before forwarding, by reason.")
_LOST = ("inferbus_ingress_lost", "Forwards whose completion never came back, by cause.")
_HITS = ("inferbus_cache_hits", "Requests answered from a cache, by level.")
_INGRESS_COUNTS: dict[str, tuple[str, str, dict[str, str]]] = {
    "requests": ("inferbus_ingress_requests", "Inference requests the ingress received (with a reply subject).", {}),
    "ok_forwarded": ("inferbus_ingress_forwards", "Requests forwarded to a worker (cache misses and models "
                     "without caching), over the bus or in-process.", {}),
    "local_forwards": ("inferbus_ingress_local_forwards", "Forwards handed to the colocated worker in-process "
                       "(--colocate), no bus hop.", {}),
    "errors": ("inferbus_ingress_errors", "Requests the ingress itself answered with a typed error (refused "
               "before forwarding, or a colocated worker's failure).", {}),
    "l1_hits": (*_HITS, {"level": "l1"}),
    "l2_hits": (*_HITS, {"level": "l2"}),
    **{k: (*_REJECTED, {"reason": k}) for k in ("rate_limited", "too_large", "unavailable", "backlog_shed",
                                                 "expired_on_arrival", "attempts_abandoned")},
    "expired_unanswered": ("inferbus_ingress_expired_unanswered", "Requests past their client's deadline on arrival "
                           "dropped without an answer because the ingress was behind (a part of "
                           "rejected{reason=expired_on_arrival}).", {}),
    "hedges": ("inferbus_hedges", "Hedged copies sent.", {}),
    "hedge_wins": ("inferbus_hedge_wins", "Requests whose hedged copy answered first.", {}),
    "lost": (*_LOST, {"cause": "worker"}),
    "lost_in_reconnect": (*_LOST, {"cause": "reconnect"}),
    "lost_while_behind": (*_LOST, {"cause": "behind"}),
    "lost_while_busy": (*_LOST, {"cause": "worker_busy"}),
    "lost_while_worker_behind": (*_LOST, {"cause": "worker_behind"}),
}

# worker stats (``Worker._stats_data``) that are counters since the process started: key → (name, help, labels)
_DROPPED = ("inferbus_worker_dropped", "Requests the worker did not compute, by reason.")
_DEDUP = ("inferbus_worker_dedup", "Duplicate requests (same id and body) answered without computing again, by how.")
_WORKER_COUNTERS: dict[str, tuple[str, str, dict[str, str]]] = {
    "received": ("inferbus_worker_received", "Requests the worker took (over NATS or from its colocated "
                 "ingress).", {}),
    "computed": ("inferbus_worker_computed", "Requests run through a model (a deduplicated request counts once).",
                 {}),
    "batches": ("inferbus_worker_batches", "Model runs (computed / batches = mean batch size).", {}),
    "completed": ("inferbus_worker_completed", "Requests answered with a result.", {}),
    "errors": ("inferbus_worker_errors", "Server-side failures (INTERNAL); never client errors.", {}),
    **{k: (*_DROPPED, {"reason": k}) for k in ("expired", "shed", "cancelled", "stall_fenced")},
    "too_large_before_compute": (*_DROPPED, {"reason": "too_large"}),
    "dedup_hits": (*_DEDUP, {"how": "recent_result"}),
    "dedup_joins": (*_DEDUP, {"how": "joined"}),
    "stalls": ("inferbus_worker_stalls", "Times the worker process was found frozen longer than its stall fence.",
               {}),
    "chunked": ("inferbus_worker_chunked", "Large requests run in chunks of chunk_rows rows.", {}),
    "served_between_chunks": ("inferbus_worker_served_between_chunks", "Small requests computed between two "
                              "chunks of a large one.", {}),
}
# worker stats that are numbers but no count since the process started (states, windows, settings, ids): exported
# as gauges or not at all. Every other number is a count: a metric above, or ``inferbus_worker_events_total{event}``
# (decoded, input_failures, stop_refused today), so a count added later is never dropped silently
_WORKER_NOT_COUNTS = frozenset({"pid", "queue_depth", "in_flight", "capacity", "ewma_service_us", "interval_ms",
                                "window_s", "window_requests", "window_errors", "error_rate", "backlog_msgs",
                                "device_index", "computing_ms", "cpu_ratio"})

# every metric family a scrape can have, by type: what the collector's describe() declares, so that prometheus-client's
# ``/metrics?name[]=...`` (its registry maps the names a collector describes to the collector; a collector that
# describes none is never asked, and the answer was empty) finds them. tests/test_metrics.py checks that every family
# the collector makes is here.
_DESCRIBED: dict[str, str] = {
    **{name: "counter" for name, _, _ in (*_INGRESS_COUNTS.values(), *_WORKER_COUNTERS.values())},
    **dict.fromkeys(("inferbus_request_errors", "inferbus_ingress_events", "inferbus_cache_l2_breaker_trips",
                     "inferbus_breaker_trips", "inferbus_model_request_success", "inferbus_model_cache_hits",
                     "inferbus_model_request_failure", "inferbus_worker_events", "inferbus_model_computed",
                     "inferbus_model_runs", "inferbus_child_restarts", "inferbus_cache_l2_fills",
                     "inferbus_cache_l2_fill_failures", "inferbus_region_lease_renewals",
                     "inferbus_region_lease_renewal_failures", "inferbus_region_lease_lost_races",
                     "inferbus_region_lease_disconnects"), "counter"),
    **dict.fromkeys(("inferbus_actor_up", "inferbus_child_running", "inferbus_scrape_duration_seconds",
                     "inferbus_ingress_pending_requests", "inferbus_ingress_backlog_requests",
                     "inferbus_cache_l1_entries", "inferbus_cache_l1_bytes", "inferbus_cache_l2_lookups_in_flight",
                     "inferbus_cache_l2_breaker_state", "inferbus_model_ready",
                     "inferbus_forward_latency_window_seconds", "inferbus_forward_latency_window_samples",
                     "inferbus_breaker_state", "inferbus_worker_routable", "inferbus_worker_in_flight_requests_seen",
                     "inferbus_worker_info", "inferbus_worker_queued_requests", "inferbus_worker_in_flight_requests",
                     "inferbus_worker_backlog_requests",
                     "inferbus_worker_mailbox_capacity_requests", "inferbus_worker_service_time_seconds",
                     "inferbus_worker_error_ratio", "inferbus_model_loaded", "inferbus_model_load_failed",
                     "inferbus_model_compute_seconds", "inferbus_cache_l2_fills_queued", "inferbus_region_primary",
                     "inferbus_region_term", "inferbus_region_model_writes"), "gauge"),
    "inferbus_ingress_handler_seconds": "summary",
    # per process of the node (child), from /proc: prometheus-client's ProcessCollector's names
    "process_cpu_seconds": "counter",
    **dict.fromkeys(("process_resident_memory_bytes", "process_virtual_memory_bytes", "process_start_time_seconds",
                     "process_open_fds", "process_max_fds"), "gauge"),
    **dict.fromkeys(("inferbus_forward_latency_seconds", "inferbus_model_batch_size",
                     "inferbus_model_compute_duration_seconds"), "histogram"),
}
_FAMILY_CLASSES = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "summary": SummaryMetricFamily,
                   "histogram": HistogramMetricFamily}

_LE_LATENCY = tuple(repr(float(b)) for b in LATENCY_BOUNDS_S)
_LE_BATCH = tuple(repr(float(b)) for b in BATCH_BOUNDS)


@dataclass(frozen=True)
class Expected:
    """The actor processes of one node that a scrape waits for, and how to recognize their answers.

    Args:
        prefix: the node's subject prefix (answers of another prefix's actors are ignored).
        ingress_ids: ingress ids (``<node_id>-i<j>``).
        worker_ids: worker ids (``<node_id>-w<k>``, ``<node_id>-<backend>-<kind><k>``).
        aggregator_ids: aggregator ids (``<node_id>-agg``).
        regions: regions whose manager runs in this node.
    """

    prefix: str
    ingress_ids: tuple[str, ...] = ()
    worker_ids: tuple[str, ...] = ()
    aggregator_ids: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()

    def all(self) -> set[tuple[str, str]]:
        """``{(kind, id)}`` of every expected actor."""
        return ({("ingress", i) for i in self.ingress_ids} | {("worker", w) for w in self.worker_ids}
                | {("aggregator", a) for a in self.aggregator_ids} | {("region", r) for r in self.regions})

    def identify(self, stats: dict) -> tuple[str, str] | None:
        """``(kind, id)`` of a ``$SRV.STATS`` answer from one of these actors, else None (another node's, another
        prefix's, or not an inferbus service)."""
        s = Subjects(self.prefix)
        meta = stats.get("metadata") or {}
        subjects = {e.get("subject") for e in stats.get("endpoints") or () if isinstance(e, dict)}
        name = stats.get("name")
        if name == "inferbus-ingress":
            key = ("ingress", meta.get("ingress_id"))
            ok = s.infer_all in subjects
        elif name == "inferbus-worker":
            key = ("worker", meta.get("worker_id"))
            ok = s.worker(str(key[1])) in subjects
        elif name == "inferbus-aggregator":
            key = ("aggregator", meta.get("aggregator_id"))
            ok = s.cache_fill in subjects
        elif name == "inferbus-region":
            key = ("region", meta.get("region"))
            ok = s.region_control(str(key[1])) in subjects
        else:
            return None
        return key if ok and key in self.all() else None


def node_actors(node) -> Expected:
    """The actor processes of a running :class:`~inferbus.actors.Node` that a ``$SRV.STATS`` gathering waits for
    (none before :meth:`Node.start` made them): its ingresses, workers, aggregator and region manager."""
    c = node.config
    if not c.actors or node.supervisor is None:
        ingress, workers, aggs = (), (), ()
    else:
        ingress = tuple(f"{c.node_id}-i{j}" for j in range(node.n_ingress))
        workers, aggs = tuple(node.worker_ids), (f"{c.node_id}-agg",)
    regions = (c.region_manager.region,) if c.region_manager is not None and node.supervisor is not None else ()
    return Expected(c.prefix, ingress, workers, aggs, regions)


async def gather_stats(nc, expected: Expected, wait_s: float = SCRAPE_WAIT_S) -> dict[tuple[str, str], dict]:
    """Ask every inferbus micro service on ``nc``'s NATS for ``$SRV.STATS``; keep the answers of ``expected``.

    One publish per service name to one inbox; returns when every expected actor answered or after
    ``wait_s`` seconds, whichever is first. Runs on ``nc``'s event loop.

    Returns:
        ``{(kind, id): the decoded $SRV.STATS answer}`` of the expected actors that answered.

    Raises:
        nats.errors.Error: the connection is closed or cannot publish.
    """
    want = expected.all()
    got: dict[tuple[str, str], dict] = {}
    complete = asyncio.Event()

    async def on_msg(msg) -> None:
        try:
            stats = json.loads(msg.data)
        except ValueError:
            return
        key = expected.identify(stats) if isinstance(stats, dict) else None
        if key is not None:
            got[key] = stats
            if want <= got.keys():
                complete.set()

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=on_msg)
    try:
        for name in SERVICES:  # (no flush: it waits for the server's PONG, for 10 s when the server is stopped)
            await nc.publish(f"$SRV.STATS.{name}", b"", reply=inbox)
        if want:
            try:
                await asyncio.wait_for(complete.wait(), wait_s)
            except asyncio.TimeoutError:
                pass
    finally:
        await sub.unsubscribe()
    return got


class _Families:
    """Metric families by name, made on first use; samples added with a label dict."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[Metric, tuple[str, ...]]] = {}

    def _family(self, cls, name: str, doc: str, labels: dict[str, str]) -> tuple[Metric, list[str]]:
        got = self._families.get(name)
        if got is None:
            got = self._families[name] = (cls(name, doc, labels=list(labels)), tuple(labels))
        fam, names = got
        return fam, [str(labels[k]) for k in names]

    def add(self, kind: str, name: str, doc: str, labels: dict[str, str], value: float | None) -> None:
        """Add one sample; a None value is skipped. ``kind``: ``counter`` or ``gauge``; every sample of one
        name has the same label names (the first sample's)."""
        if value is None:
            return
        fam, values = self._family(CounterMetricFamily if kind == "counter" else GaugeMetricFamily, name, doc, labels)
        fam.add_metric(values, float(value))

    def summary(self, name: str, doc: str, labels: dict[str, str], count: int, sum_value: float) -> None:
        """Add one summary sample (``_count`` and ``_sum``, no quantiles)."""
        fam, values = self._family(SummaryMetricFamily, name, doc, labels)
        fam.add_metric(values, count, sum_value)

    def histogram(self, name: str, doc: str, labels: dict[str, str], les: tuple[str, ...], cumulative, count,
                  sum_value) -> None:
        """Add one histogram (``_bucket{le}`` for each of ``les`` with the ``cumulative`` counts, ``+Inf`` =
        ``count``, ``_count``, ``_sum``); skipped unless the counts are numbers, one per bound."""
        counts = [_num(v) for v in cumulative] if isinstance(cumulative, list) else []
        count, sum_value = _num(count), _num(sum_value)
        if len(counts) != len(les) or None in counts or count is None or sum_value is None:
            return
        fam, values = self._family(HistogramMetricFamily, name, doc, labels)
        fam.add_metric(values, [*zip(les, counts), ("+Inf", count)], sum_value)

    def __iter__(self) -> Iterator[Metric]:
        return (fam for fam, _ in self._families.values())


def _model_labels(key: str) -> dict[str, str]:
    name, _, version = key.rpartition(":")
    return {"model": name, "version": version} if name else {"model": key, "version": ""}


def _endpoint(stats: dict, name: str) -> dict:
    for e in stats.get("endpoints") or ():
        if isinstance(e, dict) and e.get("name") == name:
            return e
    return {}


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def families(stats: dict[tuple[str, str], dict], expected: Expected, children: list | None = None,
             scrape_s: float | None = None) -> list[Metric]:
    """The metric families of one scrape.

    Args:
        stats: :func:`gather_stats`'s answers.
        expected: the actors the scrape waited for (those missing from ``stats`` are ``inferbus_actor_up 0``).
        children: the node supervisors' ``ChildInfo`` snapshots (restarts per child), or None.
        scrape_s: how long gathering took, seconds.
    """
    f = _Families()
    for kind, aid in sorted(expected.all()):
        f.add("gauge", "inferbus_actor_up", "1 when the actor process answered this scrape's $SRV.STATS within "
              "the wait, else 0.", {"kind": kind, "actor": aid}, 1 if (kind, aid) in stats else 0)
    for info in children or ():
        labels = {"child": info.id}
        f.add("counter", "inferbus_child_restarts", "Restarts of the node's child process (actors, embedded "
              "nats-server and Valkey) by its supervisor.", labels, info.restarts)
        f.add("gauge", "inferbus_child_running", "1 when the node's child process is running (not restarting or "
              "stopped).", labels, 1 if str(getattr(info.status, "value", info.status)) == "running" else 0)
    if scrape_s is not None:
        f.add("gauge", "inferbus_scrape_duration_seconds", "Time this scrape waited for the actors' $SRV.STATS.",
              {}, scrape_s)
    for (kind, aid), st in sorted(stats.items()):
        if kind == "ingress":
            _ingress(f, aid, st)
        elif kind == "worker":
            _worker(f, aid, st)
        elif kind == "aggregator":
            _aggregator(f, aid, st)
        elif kind == "region":
            _region(f, aid, st)
    return list(f)


def _ingress(f: _Families, iid: str, st: dict) -> None:
    ep = _endpoint(st, "infer")
    data = ep.get("data") or {}
    me = {"ingress": iid}
    errors = _num(ep.get("num_errors"))
    at_errors = _num(_endpoint(st, "infer_at").get("num_errors"))
    if errors is not None and at_errors is not None:
        errors += at_errors
    f.add("counter", "inferbus_request_errors", "Inference requests answered with a typed error, by the ingress "
          "or (counted when its completion comes back) by a worker: the num_errors of the infer endpoint and of "
          "infer_at (the retries sent to this ingress alone).", me, errors)
    for e in st.get("endpoints") or ():
        if isinstance(e, dict) and _num(e.get("num_requests")) is not None and _num(e.get("processing_time")) is not None:
            f.summary("inferbus_ingress_handler_seconds", "Time in the ingress's NATS micro handler per message, "
                      "by endpoint (its decode, validation, cache lookup and forward; not the worker's compute).",
                      {**me, "endpoint": e.get("name", "")}, int(e["num_requests"]), e["processing_time"] / 1e9)
    for key, value in sorted((data.get("counts") or {}).items()):
        named = _INGRESS_COUNTS.get(key)
        if named is not None:
            name, doc, extra = named
            f.add("counter", name, doc, {**me, **extra}, _num(value))
        else:
            f.add("counter", "inferbus_ingress_events", "The ingress's other counts, by their name in the health "
                  "reply's counts (retries joined, hedge cancels, run-to-completion paths, ...).",
                  {**me, "event": key}, _num(value))
    gauges = (("pending", "inferbus_ingress_pending_requests", "Forwards waiting for their completion."),
              ("backlog", "inferbus_ingress_backlog_requests", "Requests received and not yet handled (the infer "
               "subscription's buffer)."),
              ("l1_entries", "inferbus_cache_l1_entries", "Entries in the ingress's L1 cache."),
              ("l1_bytes", "inferbus_cache_l1_bytes", "Bytes of answers in the ingress's L1 cache."),
              ("l2_inflight", "inferbus_cache_l2_lookups_in_flight", "L2 lookups waiting for Valkey."))
    for key, name, doc in gauges:
        f.add("gauge", name, doc, me, _num(data.get(key)))
    if data.get("l2_lookups") is not None:  # only an ingress that looks L2 up (--l2-lookup)
        for s in BREAKER_STATES:
            f.add("gauge", "inferbus_cache_l2_breaker_state", "The ingress's circuit breaker on its L2 lookups: 1 for "
                  "its current state (closed: lookups on; open: off, as --l2-breaker-failures lookups in a row failed or "
                  "timed out; half_open: the next miss's lookup probes), 0 for the others.", {**me, "state": s},
                  1 if data["l2_lookups"] == s else 0)
        f.add("counter", "inferbus_cache_l2_breaker_trips", "Times the ingress turned its L2 lookups off.", me,
              _num(data.get("l2_lookups_off_times")))
    ready = set(data.get("models_ready") or ())
    for key in data.get("models") or ():
        f.add("gauge", "inferbus_model_ready", "1 when the ingress has a live, healthy worker for the model version "
              "(breaker not open), else 0.", {**me, **_model_labels(key)}, 1 if key in ready else 0)
    for key, lat in sorted((data.get("latency_us") or {}).items()):
        labels = {**me, **_model_labels(key)}
        for q in ("0.5", "0.95", "0.99"):
            v = _num(lat.get(q))
            f.add("gauge", "inferbus_forward_latency_window_seconds", "Quantiles of the last 512 successful forwards "
                  "of the model version, from forward to completion (worker queue + compute + both hops), nearest "
                  "rank; not cumulative, absent below 20 samples.", {**labels, "quantile": q},
                  None if v is None else v / 1e6)
        f.add("gauge", "inferbus_forward_latency_window_samples", "Forwards in the latency window (at most 512).",
              labels, _num(lat.get("samples")))
    per_model = data.get("per_model") or {}
    for key in sorted(set(data.get("models") or ()) | set(per_model)):  # every served version, 0 until used
        _ingress_model(f, {**me, **_model_labels(key)}, per_model.get(key) or {})
    for wid, w in sorted((data.get("workers") or {}).items()):
        labels = {**me, "worker": wid}
        state = w.get("breaker")
        for s in BREAKER_STATES:
            f.add("gauge", "inferbus_breaker_state", "The ingress's circuit breaker for a worker: 1 for its current "
                  "state (closed, open, half_open), 0 for the others.", {**labels, "state": s}, 1 if state == s else 0)
        f.add("counter", "inferbus_breaker_trips", "Times the ingress's breaker for the worker opened.", labels,
              _num(w.get("breaker_trips")))
        f.add("gauge", "inferbus_worker_routable", "1 when the ingress routes to the worker (health verdict ok: "
              "alive, reporting within half the health timeout, not draining, error rate and breaker fine), else "
              "0 (a quiet worker gets requests only when no fresher one of its model is live).", labels,
              1 if w.get("health") == "ok" else 0)
        f.add("gauge", "inferbus_worker_in_flight_requests_seen", "Requests the ingress has sent the worker and not "
              "seen completed.", labels, _num(w.get("in_flight")))


def _ingress_model(f: _Families, labels: dict[str, str], pm: dict) -> None:
    """One model version's counts at one ingress (``per_model`` of its ``$SRV.STATS``, Triton's per-model
    request counts and request-duration histogram)."""
    fwd = pm.get("forward") or {"le": [0] * len(_LE_LATENCY), "count": 0, "sum_us": 0.0}
    hits = {"l1": _num(pm.get("l1_hits", 0)), "l2": _num(pm.get("l2_hits", 0))}
    fwd_ok = _num(fwd.get("count"))
    if fwd_ok is not None and None not in hits.values():
        f.add("counter", "inferbus_model_request_success", "Requests for the model version answered with a result: "
              "computed by a worker (the forward latency histogram's _count) or from a cache (model_cache_hits).",
              labels, fwd_ok + hits["l1"] + hits["l2"])
    for level, n in hits.items():
        f.add("counter", "inferbus_model_cache_hits", "Requests for the model version answered from a cache, by "
              "level.", {**labels, "level": level}, n)
    for code, n in sorted((pm.get("errors") or {}).items()):
        f.add("counter", "inferbus_model_request_failure", "Requests for the model version answered with a typed "
              "error, by the ingress or (counted when its completion comes back) a worker, by error code.",
              {**labels, "code": code}, _num(n))
    sum_us = _num(fwd.get("sum_us"))
    f.histogram("inferbus_forward_latency_seconds", "Latency of the model version's successful forwards, from the "
                "forward to the completion (worker queue, compute, both hops), cumulative since the ingress started.",
                labels, _LE_LATENCY, fwd.get("le"), fwd.get("count"), None if sum_us is None else sum_us / 1e6)


def _worker(f: _Families, wid: str, st: dict) -> None:
    data = _endpoint(st, "infer").get("data") or {}
    me = {"worker": wid}
    if data:
        f.add("gauge", "inferbus_worker_info", "The worker's device and backend (value 1).",
              {**me, "backend": data.get("backend", ""), "device_kind": data.get("device_kind", ""),
               "device": data.get("device_name", ""), "precision": data.get("precision", ""),
               "region": data.get("region", "")}, 1)
    for key, (name, doc, extra) in _WORKER_COUNTERS.items():
        f.add("counter", name, doc, {**me, **extra}, _num(data.get(key)))
    for key, value in sorted(data.items()):
        if key not in _WORKER_COUNTERS and key not in _WORKER_NOT_COUNTS and _num(value) is not None:
            f.add("counter", "inferbus_worker_events", "The worker's other counts since it started, by their name in "
                  "its $SRV.STATS (decoded: request bodies decoded for compute; input_failures: requests the model "
                  "failed on while its warm-up input ran, answered INVALID_ARGUMENT; stop_refused: requests answered "
                  "UNAVAILABLE because a stop's drain ended first; ...).", {**me, "event": key}, _num(value))
    f.add("gauge", "inferbus_worker_queued_requests", "Requests waiting in the worker's mailbox.", me,
          _num(data.get("queue_depth")))
    f.add("gauge", "inferbus_worker_in_flight_requests", "Requests received and not yet answered (queued + "
          "computing).", me, _num(data.get("in_flight")))
    f.add("gauge", "inferbus_worker_backlog_requests", "Requests received from the bus and not yet taken by the "
          "worker's handler (the infer subscription's buffer, before the mailbox).", me, _num(data.get("backlog_msgs")))
    f.add("gauge", "inferbus_worker_mailbox_capacity_requests", "The worker's mailbox bound.", me,
          _num(data.get("capacity")))
    ewma = _num(data.get("ewma_service_us"))
    f.add("gauge", "inferbus_worker_service_time_seconds", "EWMA of compute time per request (alpha 0.2), the "
          "router's price of this worker.", me, None if ewma is None else ewma / 1e6)
    f.add("gauge", "inferbus_worker_error_ratio", "Server-side failures / requests in the worker's health window.",
          me, _num(data.get("error_rate")))
    precisions = data.get("precisions") or {}
    for key in data.get("models") or ():
        f.add("gauge", "inferbus_model_loaded", "1 for each model version the worker serves, with its precision.",
              {**me, **_model_labels(key), "precision": precisions.get(key, "")}, 1)
    for key in sorted(data.get("load_errors") or {}):
        f.add("gauge", "inferbus_model_load_failed", "1 for each model version the worker could not load.",
              {**me, **_model_labels(key)}, 1)
    for key, us in sorted((data.get("compute_ewma_us") or {}).items()):
        v = _num(us)
        f.add("gauge", "inferbus_model_compute_seconds", "EWMA of the model version's compute per request on the "
              "worker, in thread CPU time (alpha 0.2).", {**me, **_model_labels(key)}, None if v is None else v / 1e6)
    runs = data.get("runs")
    if isinstance(runs, dict):  # (a worker of before 2026-12-07 has none)
        for key in sorted(set(data.get("models") or ()) | set(runs)):  # every loaded version, 0 until it runs
            _worker_model(f, {**me, **_model_labels(key)}, runs.get(key) or {})


def _worker_model(f: _Families, labels: dict[str, str], r: dict) -> None:
    """One model version's runs at one worker (``runs`` of its ``$SRV.STATS``; Triton's ``nv_inference_count``,
    ``nv_inference_exec_count`` and compute duration)."""
    n_runs, requests = _num(r.get("runs", 0)), _num(r.get("requests", 0))
    f.add("counter", "inferbus_model_computed", "Requests of the model version run through it (a deduplicated "
          "request once; the batch-size histogram's _sum).", labels, requests)
    f.add("counter", "inferbus_model_runs", "Runs of the model version (batches; the histograms' _count).", labels,
          n_runs)
    f.histogram("inferbus_model_batch_size", "Requests per run of the model version.", labels, _LE_BATCH,
                r.get("batch_le", [0] * len(_LE_BATCH)), n_runs, requests)
    sum_us = _num(r.get("compute_sum_us", 0))
    f.histogram("inferbus_model_compute_duration_seconds", "Wall-clock compute time of each run of the model version "
                "(a batch's whole run, not per request; parameters.timings_us.compute).", labels, _LE_LATENCY,
                r.get("compute_le", [0] * len(_LE_LATENCY)), n_runs, None if sum_us is None else sum_us / 1e6)


def _aggregator(f: _Families, aid: str, st: dict) -> None:
    data = _endpoint(st, "cache-fill").get("data") or {}
    me = {"aggregator": aid}
    f.add("counter", "inferbus_cache_l2_fills", "Answers written to the L2 cache (Valkey).", me, _num(data.get("fills")))
    why = ("Cache fills not written, by reason (error: Redis failed or did not confirm the write in 1 s; dropped: the "
           "aggregator's queue was full; expired: their expiry passed before they could be written).")
    for reason, count in (("error", "fill_errors"), ("dropped", "dropped"), ("expired", "expired")):
        f.add("counter", "inferbus_cache_l2_fill_failures", why, {**me, "reason": reason}, _num(data.get(count)))
    f.add("gauge", "inferbus_cache_l2_fills_queued", "Cache fills waiting in the aggregator.", me,
          _num(data.get("queued")))


def _region(f: _Families, region: str, st: dict) -> None:
    data = _endpoint(st, "control").get("data") or {}
    me = {"region": region}
    if not data:
        return
    f.add("gauge", "inferbus_region_primary", "1 when the region is primary (holds the lease), else 0.", me,
          1 if data.get("role") == "primary" else 0)
    f.add("gauge", "inferbus_region_term", "The fencing term the region knows (the lease revision).", me,
          _num(data.get("term")))
    for key, name, doc in (("renewals", "inferbus_region_lease_renewals", "Lease renewals."),
                           ("renewal_failures", "inferbus_region_lease_renewal_failures", "Lease renewals that failed."),
                           ("lost_races", "inferbus_region_lease_lost_races", "Lease writes that lost the race."),
                           ("lease_disconnects", "inferbus_region_lease_disconnects", "Disconnections from the "
                            "lease's NATS.")):
        f.add("counter", name, doc, me, _num(data.get(key)))
    # a state, not a count (it was listed as a counter, and a bool is no number: the series was never exported)
    f.add("gauge", "inferbus_region_model_writes", "1 when the region's ingresses take model-management writes (it "
          "is the primary and has announced it), else 0.", me, 1 if data.get("model_writes") is True else 0)


class ProcessFigures:
    """CPU, memory and file descriptors of several processes of this host, read from ``/proc/<pid>`` with
    prometheus-client's :class:`~prometheus_client.ProcessCollector` (its metric names, help and units:
    ``process_cpu_seconds_total``, user + system CPU seconds; ``process_resident_memory_bytes``;
    ``process_virtual_memory_bytes``; ``process_start_time_seconds``, Unix seconds; ``process_open_fds``;
    ``process_max_fds``), one series per process labelled ``child``.

    Concurrent scrapes (the HTTP server's threads) take turns: one collector reads one pid at a time, under a lock.
    Linux only: where ``/proc``
    cannot be read (macOS, Windows) :meth:`families` returns ``[]``; a process that exited between the pid list and
    the read is left out.
    """

    def __init__(self, proc: str = "/proc") -> None:
        import threading

        self._pid = 0
        self._lock = threading.Lock()
        self._collector = ProcessCollector(pid=lambda: self._pid, proc=proc, registry=None)

    def families(self, pids: dict[str, int]) -> list[Metric]:
        """The ``process_*`` families of ``pids`` (``{child id: pid}``), labelled ``child``."""
        f = _Families()
        with self._lock:
            for child, pid in sorted(pids.items()):
                self._pid = pid
                for fam in self._collector.collect():
                    for sample in fam.samples:
                        f.add(fam.type, fam.name, f"{fam.documentation} Per process of the node, by its child id "
                              "(node: the node process itself).", {"child": child}, sample.value)
        return list(f)


class NodeCollector:
    """A prometheus-client collector that reads a running :class:`~inferbus.actors.Node` at scrape time.

    :meth:`collect` is called on the HTTP server's thread, never on the node's event loop (it would block
    it). Nothing is kept between scrapes: every counter is the actors' own since their process started, so a
    restarted process's counters start again at 0 (Prometheus's ``rate()`` takes that as a counter reset).
    """

    def __init__(self, node, loop: asyncio.AbstractEventLoop, wait_s: float = SCRAPE_WAIT_S) -> None:
        self.node = node
        self.loop = loop
        self.wait_s = wait_s
        self.processes = ProcessFigures()

    def expected(self) -> Expected:
        """The actors of the node as started (none before :meth:`Node.start` made them): :func:`node_actors`."""
        return node_actors(self.node)

    async def scrape(self) -> list[Metric]:
        """The node's metrics now, gathered on the node's event loop (waits up to ``wait_s`` for the actors). Actors
        that did not answer (NATS stopped or unreachable included) are ``inferbus_actor_up 0``; the node's own series
        (its children, the scrape's duration, every process's ``process_*``) are there in every case."""
        got, pids = await self._gather()
        return got + self.processes.families(pids)

    async def _gather(self) -> tuple[list[Metric], dict[str, int]]:
        """What :meth:`scrape` reads on the node's loop: the families of the actors' answers and the node's
        children, and ``{child id: pid}`` of its processes (:meth:`Node.process_ids`) to read ``/proc`` of."""
        t0 = time.monotonic()
        expected = self.expected()
        nc = self.node.nc
        stats = {}
        if nc is not None and not nc.is_closed:
            try:  # the node's own series come whatever NATS does: a stopped nats-server made the scrape empty
                stats = await asyncio.wait_for(gather_stats(nc, expected, self.wait_s), self.wait_s + 0.25)
            except Exception as exc:  # a connection that cannot publish, a wait past the bound
                log.warning("metrics scrape: no actor stats: %r", exc)
        children = self.node.server_children()
        if self.node.supervisor is not None:
            children.extend(self.node.supervisor.which_children())
        return families(stats, expected, children, time.monotonic() - t0), self.node.process_ids()

    def describe(self) -> Iterator[Metric]:
        """prometheus-client's hook at :meth:`CollectorRegistry.register`: every metric family :meth:`collect` can
        yield, without samples. The registry keeps their names (with the ``_total``, ``_bucket``, ``_sum``, ``_count``,
        ``_created`` of their types) to find this collector for a ``/metrics?name[]=<series name>`` request, which
        then answers the named series alone (the registry filters the collected samples by name); without it such a
        request answered an empty body."""
        return iter([_FAMILY_CLASSES[kind](name, "") for name, kind in _DESCRIBED.items()])

    def collect(self) -> Iterator[Metric]:
        """prometheus-client's hook, on the HTTP server's thread: the bus gathering run on the node's loop, waited
        for ``wait_s`` + 1 s at most, then the processes' ``/proc`` figures read here (off the loop). Never raises:
        a scrape that fails (NATS down, the node stopping) is logged and yields nothing, so the HTTP answer is empty
        rather than an error page."""
        fut = None
        try:
            fut = asyncio.run_coroutine_threadsafe(self._gather(), self.loop)
            got, pids = fut.result(self.wait_s + 1.0)
        except Exception as exc:  # closed loop or connection, timeout
            if fut is not None:
                fut.cancel()
            log.warning("metrics scrape failed: %r", exc)
            return
        yield from got
        try:
            yield from self.processes.families(pids)
        except Exception as exc:  # (ProcessCollector skips what it cannot read; anything else must not fail a scrape)
            log.warning("metrics scrape: no process figures: %r", exc)


class MetricsServer:
    """The node's HTTP server (:class:`~inferbus.actors._http.HttpServer`: waitress, HTTP/1.1 with keep-alive, a
    bounded number of connections and threads): prometheus-client's WSGI app for one node's :class:`NodeCollector`
    (the Prometheus text format, OpenMetrics when the scraper asks for it, on every path, ``/metrics`` included)
    behind :func:`~inferbus.actors._probes.node_app`, which answers the OIP v2 paths under ``/v2/`` and ``HEAD``.
    Use :meth:`start`, then :meth:`stop`.
    """

    def __init__(self, http) -> None:
        self._http = http

    @property
    def port(self) -> int:
        """The TCP port it listens on (the one chosen when 0 was asked)."""
        return self._http.port

    @classmethod
    def start(cls, collector: NodeCollector, host: str, port: int, probes=None, gateway=None,
              socket_timeout_s: float | None = None, max_connections: int | None = None) -> "MetricsServer":
        """Listen on ``host:port`` (port 0 = a free one; ``host`` an address or a name, IPv6 too) and serve
        ``collector``'s metrics, and with ``probes`` (a :class:`~inferbus.actors._probes.NodeProbes`) the OIP v2
        health paths, with ``gateway`` too (a :class:`~inferbus.actors._gateway.NodeGateway`) its metadata and
        inference paths.

        Args:
            socket_timeout_s: how long a connection may stay idle, seconds (None:
                :data:`~inferbus.actors._http.DEFAULT_IDLE_TIMEOUT_S`, 30).
            max_connections: open connections at most, and threads running requests (None:
                :data:`~inferbus.actors._http.DEFAULT_MAX_CONNECTIONS`, 100).

        Raises:
            OSError: the address cannot be bound (port in use, no such address).
        """
        from prometheus_client import make_wsgi_app
        from prometheus_client.registry import CollectorRegistry

        from ._http import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS, HttpServer
        from ._probes import node_app

        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        app = make_wsgi_app(registry)
        return cls(HttpServer.start(node_app(app, probes, gateway) if probes is not None else app, host, port,
                                    idle_timeout_s=socket_timeout_s or DEFAULT_IDLE_TIMEOUT_S,
                                    max_connections=max_connections or DEFAULT_MAX_CONNECTIONS))

    def drain(self, timeout_s: float, message: str) -> bool:
        """Begin a graceful stop and wait for the requests received before it (:meth:`HttpServer.drain
        <inferbus.actors._http.HttpServer.drain>`: the listener closed, later requests 503 ``message``)."""
        return self._http.drain(timeout_s, message)

    def cut(self) -> None:
        """End a :meth:`drain`'s wait at once."""
        self._http.cut()

    def stop(self) -> None:
        """Stop listening, give the answers under way 1 s to be written, close every connection and join the server's
        thread (at most 5 s). Idempotent."""
        self._http.stop()
