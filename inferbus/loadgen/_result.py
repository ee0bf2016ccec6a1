"""Figures of one load step: an HDR latency histogram plus counters, mergeable across processes.

A :class:`Recorder` lives in one load-generator process. ``to_wire()`` turns it
into a JSON-safe dict (histograms as HDR's compressed base64 encoding) so that
the parent can add the recorders of several generator processes into one
:class:`BenchResult` with :func:`merge_wire`.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import msgspec
from hdrh.histogram import HdrHistogram

PERCENTILES = (50.0, 95.0, 99.0, 99.9)
TAIL_US = 2500
"""Answers at least this slow (µs, half of the 5 ms p99 limit the suite judges by) have their stage timings added
up on their own as well (:attr:`BenchResult.stages_tail_us`): where a slow answer's time went, against the mean."""
_LOWEST_US, _HIGHEST_US, _DIGITS = 1, 3_600_000_000, 3
"""1 µs to an hour (``inferbus bench --timeout-s`` goes up to 3,600 s): a value past the top is recorded as the
top. With 60 s, a timeout of a longer budget was silently not recorded: a run whose every request timed out after
70 s showed ``requests: 0``, a negative ``qps`` and exit 0 (a fresh-user trial)."""


def new_histogram() -> HdrHistogram:
    """An HDR histogram of µs values, 1 µs .. 1 hour, 3 significant digits."""
    return HdrHistogram(_LOWEST_US, _HIGHEST_US, _DIGITS)


@dataclass
class BenchResult:
    """Figures of one load step. Latencies in µs, rates in requests/s.

    ``qps`` counts every answered request (errors included, ``TIMEOUT`` not: no
    answer came within the budget) over the step's elapsed time; ``ok_qps`` is the goodput: the answers that were
    no error and right (``ok - wrong``) over the same time, so an error reply (e.g. ``NO_RESPONDERS`` when nothing
    serves the model) counts in ``qps`` but not here. ``errors`` counts each error code (``TIMEOUT``, the
    generator's ``NOT_SENT`` and ``DISCONNECTED``, and the codes of error replies); :func:`render_table` shows
    them most frequent first. ``offered_qps`` is the open-loop schedule's rate (None in a
    closed loop). ``send_lag_*`` say how late the generator sent against its
    schedule (open loop): a large lag means the generator, not the target, was
    the limit. ``gen_cpu_us_per_req`` is the generator processes' CPU time per
    answer. ``stages_us`` are the means of the answers' ``parameters.timings_us``
    (cache misses only) plus ``e2e`` (client-observed mean) and ``bus_other``
    (``e2e - ingress_total - worker_total``: hops, NATS server, client receive);
    when the worker stamps ``worker_done_unix_us`` (wall clock, µs) the generator
    adds ``reply_hop`` (that stamp to the answer's arrival, same host's clock) and ``inbound``
    (``bus_other - reply_hop - forward_hop - send_lag``: from the generator's publish to the ingress's callback:
    nats-server, the sockets, nats-py's parse and the wait in the ingress subscription's pending queue behind
    earlier requests); ``send_lag`` is how late the open loop sent its requests against the schedule their
    latency counts from (part of ``e2e``; 0 in a closed loop). ``stages_tail_us`` are the same means over the misses
    whose latency was at least ``tail_us`` (:data:`TAIL_US`), every one of them, not a sample;
    ``tail_answers`` says how many.
    ``mean_batch`` is the misses' mean ``parameters.batch_size`` (requests in the model run that computed
    each; 0 when no miss said).
    """

    model: str
    mode: str
    concurrency: int | None
    rate_qps: float | None
    duration_s: float
    requests: int = 0
    ok: int = 0
    errors: dict = field(default_factory=dict)
    wrong: int = 0
    qps: float = 0.0
    p50_us: float = 0.0
    p95_us: float = 0.0
    p99_us: float = 0.0
    p99_9_us: float = 0.0
    max_us: float = 0.0
    mean_us: float = 0.0
    cache_hits: int = 0
    stages_us: dict = field(default_factory=dict)
    target: str = "inferbus"
    label: str = ""
    gen_procs: int = 1
    offered_qps: float | None = None
    send_lag_p50_us: float = 0.0
    send_lag_p99_us: float = 0.0
    gen_cpu_us_per_req: float = 0.0
    timeouts: int = 0
    mean_batch: float = 0.0
    stages_tail_us: dict = field(default_factory=dict)
    tail_answers: int = 0
    tail_us: float = TAIL_US
    pacing: str = ""
    """How the generator processes paced an open loop (``timerfd``, ``spin``, ``sleep``; several comma-joined
    when they differed; empty in a closed loop or when not told)."""
    ok_qps: float = 0.0
    """Goodput, requests/s: answers that were no error and right (``ok - wrong``) over the step's elapsed time
    (``duration_s``, as ``qps``). ``qps`` alone read as throughput while every answer was an error reply."""
    model_version: str = ""
    """The model version the step's requests named (``inferbus bench``: ``--version``, else the deployment's
    default version then; empty when not told)."""
    nats_url: str = ""
    """The NATS server(s) the step ran against, without credentials (``inferbus bench``: ``--nats-url``, or the node
    it started); empty when not told. A saved JSON said neither (a fresh-user trial)."""

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


class ReplyParams(msgspec.Struct):
    """What the load generator reads of a response's ``parameters`` (the rest is skipped by the decoder):
    ``cache_hit``, ``batch_size`` and ``timings_us`` left encoded (``msgspec.Raw``; empty when absent), decoded
    only for the replies whose stage timings are sampled (:class:`~inferbus.loadgen._result.Recorder`)."""

    cache_hit: bool = False
    batch_size: int | None = None
    timings_us: msgspec.Raw = msgspec.Raw()


class Recorder:
    """Counts answers of one step in one process; not thread-safe (one event loop)."""

    def __init__(self, stage_every: int = 1, tail_us: float = TAIL_US) -> None:
        self.hist = new_histogram()
        self.lag = new_histogram()
        self._lat: list[int] = []
        self._lags: list[int] = []
        self.errors: Counter = Counter()
        self.ok = 0
        self.wrong = 0
        self.hits = 0
        self.stages: Counter = Counter()
        self.stage_n = 0
        self.e2e_miss_sum = 0.0
        self.batch_sum = 0
        self.batch_n = 0
        self.stage_every = stage_every
        """Stage timings are added up for one answer in this many (the rest are only counted)."""
        self._tick = stage_every - 1  # the first answer is sampled
        self.tail_us = tail_us
        """A miss at least this slow (µs) has its stage timings added up on their own too, sampled or not."""
        self.tail_stages: Counter = Counter()
        self.tail_n = 0
        self.tail_e2e_sum = 0.0

    def record(self, latency_us: float, err: str | None = None, correct: bool = True,
               params: dict | ReplyParams | None = None, send_lag_us: float = 0.0,
               recv_unix_us: float | None = None) -> None:
        """Record one answer: its latency, its error code (None = success), whether it was right, and what its
        response's ``parameters`` say (a dict, or the load generator's :class:`ReplyParams`): a cache hit is
        counted; a miss's ``batch_size`` is averaged and, for one answer in :attr:`stage_every`, its
        ``timings_us`` are added to the stage sums (their means are over those answers); a miss of at least
        :attr:`tail_us` has them added to the tail's sums as well, with ``send_lag``: ``send_lag_us``, how late
        the generator sent it against the time its latency counts from (open loop). ``recv_unix_us`` is when
        the answer arrived (wall clock, µs), the end of its ``reply_hop``; None = now.

        Latencies are appended to a list and put into the histogram by :meth:`to_wire`,
        after the step, so that the histogram's (pure Python) bookkeeping does not
        take CPU from the generator while it measures."""
        self._lat.append(int(latency_us))
        if err is not None:
            self.errors[err] += 1
            return
        self.ok += 1
        if not correct:
            self.wrong += 1
        if not params:
            return
        if type(params) is ReplyParams:
            hit, b, t = params.cache_hit, params.batch_size, params.timings_us
        else:
            hit, b, t = params.get("cache_hit"), params.get("batch_size"), params.get("timings_us")
        if hit:
            self.hits += 1
            return
        if not t:
            return
        if type(b) is int:
            self.batch_sum += b
            self.batch_n += 1
        self._tick += 1
        sampled = self._tick >= self.stage_every
        tail = latency_us >= self.tail_us
        if not (sampled or tail):
            return
        if sampled:
            self._tick = 0
        if type(t) is msgspec.Raw:
            try:
                t = msgspec.msgpack.decode(t)
            except msgspec.MsgspecError:
                return
        if not isinstance(t, dict):
            return
        if sampled:
            self.stage_n += 1
            self.e2e_miss_sum += latency_us
            _add_stages(self.stages, t, send_lag_us, recv_unix_us)
        if tail:
            self.tail_n += 1
            self.tail_e2e_sum += latency_us
            _add_stages(self.tail_stages, t, send_lag_us, recv_unix_us)

    def record_lag(self, lag_us: float) -> None:
        self._lags.append(int(lag_us))

    def _flush(self) -> None:
        for hist, values in ((self.hist, self._lat), (self.lag, self._lags)):
            rec = hist.record_value
            for v in values:
                rec(v if 1 < v <= _HIGHEST_US else 1 if v <= 1 else _HIGHEST_US)
            values.clear()

    def to_wire(self, elapsed_s: float, cpu_s: float) -> dict:
        """A JSON-safe dict; add several with :func:`merge_wire`."""
        self._flush()
        return {
            "hist": self.hist.encode().decode("ascii"), "lag": self.lag.encode().decode("ascii"),
            "errors": dict(self.errors), "ok": self.ok, "wrong": self.wrong, "hits": self.hits,
            "stages": dict(self.stages), "stage_n": self.stage_n, "e2e_miss_sum": self.e2e_miss_sum,
            "batch_sum": self.batch_sum, "batch_n": self.batch_n, "elapsed_s": elapsed_s, "cpu_s": cpu_s,
            "tail_stages": dict(self.tail_stages), "tail_n": self.tail_n, "tail_e2e_sum": self.tail_e2e_sum,
            "tail_us": self.tail_us,
        }


def _add_stages(sums: Counter, timings: dict, send_lag_us: float, recv_unix_us: float | None) -> None:
    """Add one answer's ``timings_us`` (numbers; the ``*_unix_us`` stamps left out) to ``sums``, its ``send_lag``
    (µs, the generator's) and its ``reply_hop``: from the worker's ``worker_done_unix_us`` stamp to the answer's
    arrival (``recv_unix_us``, None = now), one host's clock."""
    sums["send_lag"] += send_lag_us
    for k, v in timings.items():
        if isinstance(v, (int, float)) and not k.endswith("_unix_us"):
            sums[k] += v
    done = timings.get("worker_done_unix_us")
    if isinstance(done, (int, float)):
        # wall-clock stamp taken by the worker before its msgpack encode: the rest of the way back
        # (encode, thread->loop handoff, publish, hop, our receive) on one host's clock
        sums["reply_hop"] += (time.time() * 1e6 if recv_unix_us is None else recv_unix_us) - done


def _stage_means(sums: Counter, n: int, e2e_sum: float) -> dict:
    """Means of stage sums over ``n`` answers, with ``e2e`` (the client-observed mean), ``bus_other``
    (``e2e - ingress_total - worker_total``) and ``inbound`` (``bus_other - reply_hop - forward_hop - send_lag``)."""
    s = {k: round(v / n, 1) for k, v in sorted(sums.items())}
    s["e2e"] = round(e2e_sum / n, 1)
    if "ingress_total" in s and "worker_total" in s:
        s["bus_other"] = round(s["e2e"] - s["ingress_total"] - s["worker_total"], 1)
        if "reply_hop" in s:
            s["inbound"] = round(s["bus_other"] - s["reply_hop"] - s.get("forward_hop", 0.0) - s.get("send_lag", 0.0), 1)
    return s


def merge_wire(parts: list[dict], *, model: str, mode: str, concurrency: int | None, rate_qps: float | None,
               target: str, label: str = "") -> BenchResult:
    """Add the ``to_wire()`` dicts of several generator processes into one result.

    Elapsed time is the longest process's (they start together on a shared
    monotonic clock), so ``qps`` is the answers of all processes over that span.
    """
    hist, lag = new_histogram(), new_histogram()
    errors: Counter = Counter()
    stages: Counter = Counter()
    tail_stages: Counter = Counter()
    ok = wrong = hits = stage_n = batch_sum = batch_n = tail_n = 0
    e2e = elapsed = cpu = tail_e2e = 0.0
    tail_us = TAIL_US
    for p in parts:
        hist.add(HdrHistogram.decode(p["hist"].encode("ascii")))
        lag.add(HdrHistogram.decode(p["lag"].encode("ascii")))
        errors.update(p["errors"])
        stages.update(p["stages"])
        ok += p["ok"]
        wrong += p["wrong"]
        hits += p["hits"]
        stage_n += p["stage_n"]
        e2e += p["e2e_miss_sum"]
        batch_sum += p.get("batch_sum", 0)
        batch_n += p.get("batch_n", 0)
        tail_stages.update(p.get("tail_stages", {}))
        tail_n += p.get("tail_n", 0)
        tail_e2e += p.get("tail_e2e_sum", 0.0)
        tail_us = p.get("tail_us", tail_us)
        elapsed = max(elapsed, p["elapsed_s"])
        cpu += p["cpu_s"]
    n = hist.get_total_count()
    r = BenchResult(model, mode, concurrency, rate_qps, round(elapsed, 3), requests=n, ok=ok, errors=dict(errors),
                    wrong=wrong, qps=round((n - errors.get("TIMEOUT", 0)) / elapsed, 1) if elapsed else 0.0,
                    ok_qps=round((ok - wrong) / elapsed, 1) if elapsed else 0.0,
                    cache_hits=hits, target=target,
                    label=label, gen_procs=len(parts), offered_qps=rate_qps,
                    timeouts=errors.get("TIMEOUT", 0), tail_answers=tail_n, tail_us=tail_us,
                    pacing=",".join(sorted({p.get("pacing") or "" for p in parts} - {""})) if mode == "open" else "")
    if n:
        r.p50_us, r.p95_us, r.p99_us, r.p99_9_us = (float(hist.get_value_at_percentile(p)) for p in PERCENTILES)
        r.max_us, r.mean_us = float(hist.get_max_value()), round(hist.get_mean_value(), 1)
        r.gen_cpu_us_per_req = round(cpu * 1e6 / n, 1)
    if lag.get_total_count():
        r.send_lag_p50_us = float(lag.get_value_at_percentile(50))
        r.send_lag_p99_us = float(lag.get_value_at_percentile(99))
    if batch_n:
        r.mean_batch = round(batch_sum / batch_n, 2)
    if stage_n:
        r.stages_us = _stage_means(stages, stage_n, e2e)
    if tail_n:
        r.stages_tail_us = _stage_means(tail_stages, tail_n, tail_e2e)
    return r


def error_breakdown(errors: dict) -> str:
    """``errors`` (code -> count) as ``TIMEOUT 12, NO_RESPONDERS 3``: most frequent first, ties by code; ``0``
    when there is none."""
    kinds = sorted(((n, code) for code, n in errors.items() if n), key=lambda e: (-e[0], e[1]))
    return ", ".join(f"{code} {n}" for n, code in kinds) or "0"


def load_label(r: BenchResult) -> str:
    """A step's load as the table's ``load`` column shows it: ``c=8`` (closed loop), ``1260/s`` (open loop)."""
    return f"c={r.concurrency}" if r.concurrency is not None else f"{r.rate_qps:g}/s"


def render_table(results: list[BenchResult], title: str = "inferbus load run"):
    """The results as a rich renderable: a Table (latencies in ms) of one row per step, ``qps`` (answers, error replies
    included) next to ``ok qps`` (:attr:`BenchResult.ok_qps`, the goodput), and ``errors`` broken down by code
    (:func:`error_breakdown`), where the console is wide enough for it (about 130 columns); on a narrower one, the
    same figures as ``name=value`` items, one block per step, wrapped between items. rich fitted the table to a
    narrow console by cutting every cell short: on an 80-column terminal each latency read ``0.…`` (a fresh-user
    trial of ``up --demo``)."""
    return _results_view(results, title)


_COLUMNS = ("target", "mode", "load", "requests", "qps", "ok qps", "p50 ms", "p95 ms", "p99 ms", "p99.9 ms", "errors",
            "wrong", "cache hits")


def _cells(r: BenchResult) -> tuple[str, ...]:
    name = r.label or (r.model if r.target == "inferbus" else r.target)
    return (name, r.mode, load_label(r), str(r.requests), f"{r.qps:.0f}", f"{r.ok_qps:.0f}", f"{r.p50_us / 1000:.3f}",
            f"{r.p95_us / 1000:.3f}", f"{r.p99_us / 1000:.3f}", f"{r.p99_9_us / 1000:.3f}", error_breakdown(r.errors),
            str(r.wrong), str(r.cache_hits))


def _results_view(results: list[BenchResult], title: str):
    """:func:`render_table`'s renderable (:class:`~inferbus._wrap.FittedTable`): the table when its natural width fits
    the console, else one block of ``name=value`` items per step (its target, mode and load first), each wrapped
    between items to the width."""
    from rich.table import Table

    from .._wrap import FittedTable

    table = Table()
    for col in _COLUMNS:
        table.add_column(col, justify="right" if col not in ("target", "mode", "errors") else "left")
    fitted = FittedTable(table, title)
    for row in map(_cells, results):  # its block: "digits closed c=1: requests=705 ... p50=1.267ms ..."
        items = [f"{col.replace(' ms', '').replace(' ', '_')}={cell}" for col, cell in zip(_COLUMNS[3:], row[3:])]
        items[3:7] = [f"{item}ms" for item in items[3:7]]
        fitted.add_row(*row, items=items, head_cells=3)
    return fitted
