"""CPU per request of the serving path in one process, against the direct floor: a deterministic measure.

    python -m bench.pathcost [--model digits] [--requests 3000] [--reps 5] [--yields 3] [--batch 1] [--json F]
    python -m bench.pathcost --instructions 300 [--other-workers 7] [--json F]   # instructions (needs valgrind)
    python -m bench.pathcost --bytecodes 300 [--other-workers 7] [--top 25] [--json F]   # bytecodes, by function

The load runs of ``bench.suite`` time whole processes under a load generator; on a shared host their CPU per
request moves by 10 % from run to run, more than most changes to the hot path are worth. This measures the
same code with the noise taken out: one process holds a colocated ingress and worker
(:class:`inferbus.actors._colocated.Colocated`, as ``inferbus up --colocate`` runs them, on a real
nats-server) and the direct responder's handler (``inferbus.loadgen._procs._direct_handler``: decode, model
at batch 1, encode; the Python floor of the suite's ``--direct``), and feeds each of them ``--requests``
request messages (distinct inputs from the model's dataset, the load generator's bodies and headers), one at
a time, as nats-py would hand them to the subscription callback. It reports the least over ``--reps`` of
this thread's CPU time per request (``time.thread_time``: other processes on the host do not count). What
both share is left out of both: nats-py's receive (reading the socket, parsing the message), which the load
runs measure. Each request's reply is written to the socket (a subject nobody listens to) before the next.

Variants, each with the same bodies:

* ``direct``: the floor's handler;
* ``inferbus``: the colocated ingress's handler, run to completion (the default: the worker computes and
  answers in the same call);
* ``inferbus_queued``: the same with ``run_to_completion`` off: the worker's inline queue and its pump task
  (``--yields`` event-loop turns after each request let the pump run; every variant gets the same turns).

Each pass sends its own distinct inputs (no pass is answered from the caches an earlier one filled). The
command exits 1 when any request was an error or a cache hit, or did not run as labelled (a model that runs
on the inference thread, not inline, cannot be measured this way: its compute is on another thread). Both
colocated workers keep an ONNX Runtime CPU model inline whatever its measured compute
(``inline_max_compute_us`` lifted), so that a slow moment of the host cannot send requests to the thread.
``--yields`` changes the ratios (each turn costs every variant an event-loop iteration); 3 is the default.
``--batch K`` hands the requests over K at a time before the turns, as nats-py hands a subscription's waiting
messages under load, and the colocated ingresses see the rest of the group waiting in their subscription
(``pending_msgs``, :class:`_Backlog`): the queued variant computes each group as one batch (the per-batch costs
shared by K requests), the run-to-completion variant holds the group back as a burst and computes it as one
batch at its end (``Ingress._defer``), and the floor computes one at a time.

``--instructions N`` counts instead of timing: user-space instructions per request of ``direct`` and
``inferbus`` (run to completion), under valgrind's callgrind (:func:`count_instructions`). The count is the
same from run to run to within 1 % whatever else the host runs, so it can judge a change of a few % to the
hot path that the CPU times cannot; it leaves out system calls and memory stalls, which the times include.

``--bytecodes N`` counts the Python bytecodes executed per request (``sys.settrace`` with opcode events), by
function, for all three variants, ``inferbus_queued`` included: each request's count takes in its handler call
and the ``--yields`` turns after it, so the worker's pump task, which computes and answers a queued request in
those turns, counts too (:func:`count_bytecodes`); counting starts once the router has a measured service time
for its worker (before it, every pick prices all workers). It needs nothing installed and repeats to ~1 % on
one host for a given N (the router's choices follow the load reports, which come on a timer), but it is a guide,
not a cost: a bytecode can be a C call of any length (the model's run is one call), and tracing slows the code
~50 x (the model is kept inline regardless, and the inline slice is lifted so that a ``--batch`` group is not
cut). ``--batch K`` applies as in the CPU-time measure: groups of K, the turns after each group. Python 3.11 and
3.12 count differently (the JSON names the version).
A measure is valid only when every request ran as labelled and was answered within its own ``--yields``
turns; the JSON's ``valid`` says so, and the exit status is 1 when not.

Output: µs (or instructions, or bytecodes) per request for each, and ``inferbus ÷ direct``. docs/performance.md, "Run to completion, measured
in one process", has figures.

Exit status: 0; 1 for a measure that is not valid (above) or a JSON that could not be written after all; 2 for bad
arguments. A ``--json`` that cannot be written (its folder missing, not a folder or not writable; the path a folder)
and a ``--model`` not in ``--models-dir`` are refused before anything starts, with one line ``error: ...`` on stderr
(:func:`problem`), not found after the measure, its results lost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import itertools
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

from inferbus._limits import MAX_INLINE_COMPUTE_US, MAX_NODE_PROCESSES as MAX_OTHER_WORKERS
from inferbus._paths import output_file_problem
from inferbus.actors._colocated import Colocated
from inferbus.actors._config import ColocatedConfig, IngressConfig, WorkerConfig
from inferbus.actors._repository import ModelRepository
from inferbus.bus import BusConfig, EmbeddedNats, send_pending
from inferbus.loadgen._procs import _direct_handler
from inferbus.loadgen._workload import Workload

from . import _args as args

ROOT = Path(__file__).resolve().parents[1]
SINK = "_PATHCOST.sink"  # reply subject: nobody subscribes, nats-server drops the replies


class _Msg:
    """What a subscription callback reads of a nats-py message (subject, reply, data, headers)."""

    __slots__ = ("subject", "reply", "data", "headers")

    def __init__(self, subject: str, reply: str, data: bytes, headers: dict) -> None:
        self.subject, self.reply, self.data, self.headers = subject, reply, data, headers


async def _start(url: str, models_dir: str, model: str, run_to_completion: bool, name: str,
                 **worker: object) -> tuple[Colocated, asyncio.Task]:
    bus = BusConfig(servers=(url,), prefix=f"pc{name}")
    # a flight record, as `inferbus up` gives each colocated process (its model runs write what they hold; the
    # caller gives a path in its run folder)
    col = Colocated(ColocatedConfig(
        IngressConfig(ingress_id=f"pc-i-{name}", bus=bus, models_dir=models_dir, models=(model,),
                      run_to_completion=run_to_completion),
        WorkerConfig(worker_id=f"pc-w-{name}", bus=bus, models_dir=models_dir, models=(model,), **worker)))
    task = asyncio.create_task(col.run())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # ready: the ingress has seen its worker's load report and subscribed
        if task.done():
            task.result()
        ing = col.ingress
        # (its infer subscription set too: a measure that replaced it before the ingress's run() got there had it
        # replaced back by the real one, whose pending_msgs nats-py 2.16 does not let be set: a CI run, 2026-12-05)
        if ing.nc is not None and ing._infer_sub is not None and \
                ing.router.pick(next(iter(ing.repo.get(model).versions.values())).key) is not None:
            return col, task
        await asyncio.sleep(0.05)
    raise TimeoutError("the colocated actors did not become ready in 60 s")


def _announce_others(col: Colocated, model_key: str, n: int) -> None:
    """Make the colocated ingress's router see ``n`` more workers of ``model_key``, as in a deployment of
    ``n + 1`` colocated processes (the throughput profile runs 8): load reports of idle, healthy workers on the
    same server, never silent (no reports follow), priced slower than the local worker (so it is picked, as
    the local worker is at c=1 among equal workers). They report a device class of their own (backend
    ``pathcost``), so the router prices them by their own service time (1 s), not by the local worker's: under
    ``--bytecodes`` tracing makes the local worker's service time ~50 x longer, and priced as its class's
    fastest a phantom would win whenever a load report caught a request queued. They receive nothing; a
    request routed to one would not run to completion and the measure says so.

    With ``--batch`` above 1 this overstates the router: as the model's workers are then of two classes, the
    local fast path prices the local worker by its own (traced) EWMA and gives up from the second request of a
    group on, so nearly every request of a group pays the full scan (``Router._pick_scan``, ~450 bytecodes with
    8 workers). Under a real open load on one class of workers the full scan ran for about 1 % of misses at the
    p99 < 5 ms crossing (``counts.route_scans``, docs/performance.md, twenty-ninth session)."""
    from inferbus.schemas._internal import LoadReport

    router = col.ingress.router
    router.health_timeout_s = 1e9
    server = router.workers[col.worker.config.worker_id].server
    for i in range(n):
        router.on_report(LoadReport(
            worker_id=f"pathcost-other-{i}", pid=10_000 + i, device_kind="cpu", device_name="cpu",
            backend="pathcost", precision="fp32", models=[model_key], queue_depth=0, in_flight=0, capacity=1000,
            ewma_service_us=1e6, completed=0, errors=0, server=server))


class _Backlog:
    """Stands in for a colocated ingress's subscription while requests are handed over: ``pending_msgs`` is how
    many of the group handed over with the current message still wait behind it, as nats-py's subscription
    reports for messages that arrived together; ``pending_bytes`` 0 (under every bound)."""

    pending_msgs = 0
    pending_bytes = 0


@contextlib.contextmanager
def _backlogs(*cols: Colocated):
    """Each colocated ingress's subscription replaced by a :class:`_Backlog` for the measure, restored after (the
    ingress drains the real one when it stops)."""
    real = [c.ingress._infer_sub for c in cols]
    for c in cols:
        c.ingress._infer_sub = _Backlog()
    try:
        yield
    finally:
        for c, sub in zip(cols, real):
            c.ingress._infer_sub = sub


@contextlib.asynccontextmanager
async def _unsliced():
    """The inline slice (``INLINE_SLICE_US`` of estimated compute, in the worker's queue and the ingress's
    bursts) lifted while bytecodes are counted: tracing makes the model's compute estimate ~50 x too high, and
    a group of ``--batch`` would be cut into slices that it is not in an untraced run."""
    from inferbus.actors import _ingress, _worker

    saved = _ingress.INLINE_SLICE_US, _worker.INLINE_SLICE_US
    _ingress.INLINE_SLICE_US = _worker.INLINE_SLICE_US = 1e12
    try:
        yield
    finally:
        _ingress.INLINE_SLICE_US, _worker.INLINE_SLICE_US = saved


@contextlib.asynccontextmanager
async def _backlogs_async(*cols: Colocated):
    """:func:`_backlogs` in an ``async with``."""
    with _backlogs(*cols):
        yield


async def _per_request_us(handle, passes: list[list[_Msg]], yields: int, answered=None,
                          batch: int = 1, backlog: _Backlog | None = None) -> tuple[float, int]:
    """Least thread-CPU µs per request over the passes; each pass its own messages (distinct bodies, so no
    pass is answered from the caches the ones before it filled), handed over ``batch`` at a time back to back
    (as nats-py hands a subscription's waiting messages; ``backlog``, when given, says how many of the group wait
    behind each), ``yields`` event-loop turns after each group.
    Returns ``(µs, requests not answered in their pass)``: ``answered()`` (the worker's completed count) must
    grow by the pass's requests within the timed window, else the work measured is not the requests' (a
    queued request whose pump never ran in it)."""
    best = float("inf")
    late = 0
    for msgs in passes:
        await asyncio.sleep(0.05)
        before = answered() if answered is not None else 0
        t0 = time.thread_time()
        for i, m in enumerate(msgs, 1):
            if backlog is not None:  # the rest of this message's group waits behind it
                backlog.pending_msgs = min(-(-i // batch) * batch, len(msgs)) - i
            await handle(_Msg(m.subject, m.reply, m.data, dict(m.headers)))
            if i % batch and i != len(msgs):
                continue
            for _ in range(yields):
                await asyncio.sleep(0)
        best = min(best, (time.thread_time() - t0) * 1e6 / len(msgs))
        if answered is not None:
            late += max(0, len(msgs) - (answered() - before))
    return round(best, 1), late


async def _await_routed(col: Colocated, timeout_s: float = 5.0) -> None:
    """Wait until the colocated router holds a measured service time for its own worker (a load report after
    the warm-up's requests, every ``report_interval_ms``): before it, the router's fast path is off and every
    pick prices all workers, so a count would depend on how many requests a host gets through before the
    first report. Raises RuntimeError after ``timeout_s``."""
    router = col.ingress.router
    wid = col.worker.config.worker_id
    end = time.monotonic() + timeout_s
    while (w := router.workers.get(wid)) is None or w.ewma_service_us <= 0:
        if time.monotonic() > end:
            raise RuntimeError(f"the router saw no measured service time for {wid} within {timeout_s} s")
        await asyncio.sleep(0.01)


VERBOSE = False
"""``--verbose``: the actors' own lines (``READY``, connection and shutdown logs) go to the terminal as they come."""


@contextlib.contextmanager
def _actor_lines():
    """Hold the colocated actors' stdout and stderr lines (``READY``, connections, shutdown) for the block: they
    are written to stderr only if the block raises (or with ``--verbose``, as they come)."""
    if VERBOSE:
        yield
        return
    held = io.StringIO()
    try:
        with contextlib.redirect_stdout(held), contextlib.redirect_stderr(held):
            yield
    except BaseException:
        sys.stderr.write(held.getvalue())
        raise


@contextlib.asynccontextmanager
async def _harness(model: str, models_dir: str, others: int, starts: dict[str, dict]):
    """A nats-server of its own and the colocated actors for one measure, stopped on exit; the actors' lines
    are held back (:func:`_actor_lines`).

    Yields ``(model version, {name: Colocated}, direct floor's handler)``: one colocated process per entry of
    ``starts`` (name → its run-to-completion flag and worker config overrides), each router seeing ``others``
    more workers (:func:`_announce_others`), and the floor's handler answering on the first one's connection,
    its reply written at once (``send_pending``, as the colocated path writes its own)."""
    with _actor_lines():
        async with _serving(model, models_dir, others, starts) as held:
            yield held


@contextlib.asynccontextmanager
async def _serving(model: str, models_dir: str, others: int, starts: dict[str, dict]):
    """The body of :func:`_harness`, without holding the actors' lines."""
    tmp = tempfile.TemporaryDirectory(prefix="pathcost-")
    srv = EmbeddedNats(run_dir=Path(tmp.name) / "nats", server_name="pathcost")
    srv.spawn()
    tasks = []
    try:
        await asyncio.to_thread(srv.wait_ready)
        mv = next(iter(ModelRepository(models_dir, [model]).get(model).versions.values()))
        cols = {}
        for name, (run_to_completion, worker) in starts.items():
            # the flight record in this run's folder: in the system's temp folder, every run left two files there
            worker = {"flight_record_path": str(Path(tmp.name) / f"{name}.running"), **worker}
            cols[name], task = await _start(srv.url, models_dir, model, run_to_completion, name, **worker)
            tasks.append(task)
            _announce_others(cols[name], mv.key, others)
        nc = next(iter(cols.values())).ingress.nc
        handler = _direct_handler({"model_path": str(mv.path), "model_name": model, "model_version": mv.version},
                                  nc.publish, {"Content-Type": "application/msgpack"}, [])

        async def direct(m) -> None:
            await handler(m)
            await send_pending(nc)

        yield mv, cols, direct
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except BaseException:
                pass
        await asyncio.to_thread(srv.stop)
        tmp.cleanup()


def _bodies(model: str, models_dir: str, mv, n: int) -> list[bytes]:
    """``n`` request bodies with distinct inputs (no request is answered from a cache an earlier one filled)."""
    return Workload(ModelRepository(models_dir, [model]), model, mv.version, pool=n, distinct=True).bodies


async def run(model: str, models_dir: str, n: int, reps: int, yields: int, others: int = 0, batch: int = 1) -> dict:
    """Measure the three variants (see the module doc), requests handed over ``batch`` at a time; returns the
    result document."""
    # both workers keep the model on the loop whatever its measured compute: a slow moment of the host can lift the
    # estimate over inline_max_compute_us (default 250 µs), and a request computed in the inference thread is
    # answered after its pass and its compute is not in this thread's CPU time (seen in a clean-clone CI run on a
    # 2-core box: 20 of 80 late)
    inline = {"inline_max_compute_us": MAX_INLINE_COMPUTE_US}
    async with _harness(model, models_dir, others, {"now": (True, inline), "queued": (False, inline)}) as \
            (mv, cols, direct):
        now_col, queued_col = cols["now"], cols["queued"]
        warm_n = max(_WARM_UP, _WARM_UP_GROUPS * batch)
        bodies = _bodies(model, models_dir, mv, n * reps * 2 + 2 * warm_n)  # distinct for every pass
        hdrs = {"Inferbus-Timeout-Ms": "1000.000"}
        with _backlogs(now_col, queued_col):  # the handlers see the rest of a group waiting (each on its own)
            for i, col in enumerate((now_col, queued_col)):  # until the router prices its worker by measured times
                subject = col.ingress.subjects.infer(model, mv.version)
                warm = [_Msg(subject, SINK, b, hdrs) for b in bodies[-(i + 1) * warm_n:][:warm_n]]
                await _per_request_us(col.ingress._on_infer, [warm], yields, batch=batch, backlog=col.ingress._infer_sub)
                await _await_routed(col)
            before = _counts(now_col, queued_col, 0)

            def passes(col: Colocated, rnd: int) -> list[list[_Msg]]:
                subject = col.ingress.subjects.infer(model, mv.version)
                return [[_Msg(subject, SINK, b, hdrs) for b in bodies[(rnd * reps + k) * n:(rnd * reps + k + 1) * n]]
                        for k in range(reps)]

            out: dict[str, list[float]] = {"direct": [], "inferbus": [], "inferbus_queued": []}
            late = 0
            for rnd in range(2):  # interleaved, so that a drift of the host shows in both
                us, _ = await _per_request_us(direct, passes(now_col, rnd), yields, batch=batch)
                out["direct"].append(us)
                for key, col in (("inferbus", now_col), ("inferbus_queued", queued_col)):
                    us, n_late = await _per_request_us(col.ingress._on_infer, passes(col, rnd), yields,
                                                       answered=lambda c=col: c.worker.stats.completed, batch=batch,
                                                       backlog=col.ingress._infer_sub)
                    out[key].append(us)
                    late += n_late
            best = {k: min(v) for k, v in out.items()}
            counts = _counts(now_col, queued_col, late, since=before)
            return {"model": model, "requests": n, "reps": reps, "yields": yields, "batch": batch, "other_workers": others,
                    "cpu_us_per_request": best,
                    "runs": out, "ratio_to_direct": {k: round(v / best["direct"], 2) for k, v in best.items()},
                    "counts": counts}


MAX_BATCH = 64
"""The largest ``--batch``: above it the worker's inline slices (``INLINE_SLICE_US``) split a group over more
loop turns than ``--yields`` gives, and requests were answered after their pass (seen at 65 on the box)."""
_WARM_UP = 20
"""Requests each colocated process serves before the timed passes: then its router prices its worker by a
measured service time (:func:`_await_routed`), so a batch does not send requests to the phantom workers
(``--other-workers``), priced as fast as the local worker until it is measured."""
_WARM_UP_GROUPS = 6
"""With ``--batch K``, the warm-up is at least this many groups of K, handed over as the timed passes hand
them. After a warm-up of single requests, the first timed batches of 8 on the H200 measured slow enough to
lift the worker's compute estimate over ``inline_max_compute_us``: 288 of 30,000 timed requests went to the
inference thread, answered late (cause not established; docs/performance.md, twelfth session). With this
warm-up, none did in four runs."""


def _counts(now_col: Colocated, queued_col: Colocated, late: int, since: dict | None = None) -> dict:
    """What the validity check reads: requests run to completion (the run-to-completion process, and the queued
    one, which must have none), local forwards of the queued process, L1 hits, errors, late answers; and the
    queued worker's mean batch (requests computed per model run). ``since``: an earlier result of this
    function, whose counts are taken off (a warm-up's)."""
    c_now, c_q = now_col.ingress.counts, queued_col.ingress.counts
    ws = queued_col.worker.stats
    out = {"run_now": c_now["run_now"], "queued_run_now": c_q["run_now"], "queued_local_forwards": c_q["local_forwards"],
           "l1_hits": c_now["l1_hits"] + c_q["l1_hits"], "errors": c_now["errors"] + c_q["errors"],
           "answered_late": late, "queued_computed": ws.computed, "queued_batches": getattr(ws, "batches", 0),
           "bursts": c_now.get("burst_runs", 0), "burst_requests": c_now.get("burst_deferred", 0)}
    if since is not None:
        out = {k: v - since[k] for k, v in out.items()}
    out["queued_mean_batch"] = round(out["queued_computed"] / max(out["queued_batches"], 1), 2)
    out["mean_burst"] = round(out["burst_requests"] / max(out["bursts"], 1), 2)
    return out


COUNTED_VARIANTS = ("direct", "inferbus")


def _where(code) -> str:
    """``path:function`` of a code object, the path relative to the longest ``sys.path`` entry holding it (the
    repository, site-packages, a ``--target`` folder, the standard library), so that keys match across installs."""
    f = code.co_filename
    roots = [r for r in (str(Path(e or ".").resolve()) for e in sys.path) if f.startswith(r + "/")]
    if roots:
        f = f[len(max(roots, key=len)) + 1:]
    return f"{f}:{code.co_name}"


async def count_bytecodes(model: str, models_dir: str, n: int, yields: int, others: int = 0,
                          top: int = 25, batch: int = 1) -> dict:
    """Python bytecodes executed per request of ``direct``, ``inferbus`` (run to completion; bursts of
    ``batch``) and ``inferbus_queued`` (the worker's inline queue and pump), each over ``n`` distinct requests
    after ``n`` of warm-up, handed over ``batch`` at a time as in :func:`run` (the colocated ingresses see the
    rest of a group waiting), with ``yields`` event-loop turns after each group (counted: the pump runs in them).

    Counted with ``sys.settrace`` opcode events on this thread (the loop's), in two tasks only: this one (the
    handler) and the worker's pump (``<actor>:inline``; a resumed coroutine is traced from its resumption),
    with the Python parts of the libraries they call (nats-py's publish, ONNX Runtime's wrapper, asyncio). The
    periodic loops (load reports, sweeper, stall watch) and nats-py's reader are left out: how often they run in
    the traced turns depends on the host's speed. C code (msgspec, numpy, the model, uvloop) is one bytecode
    per call. Returns per variant the bytecodes per request and the ``top``
    functions (``path:function`` → bytecodes per request), and the actors' counts.
    """
    worker = {"inline_max_compute_us": MAX_INLINE_COMPUTE_US}  # tracing makes the model look ~50 x slower: keep it inline
    async with _harness(model, models_dir, others, {"now": (True, worker), "queued": (False, worker)}) as \
            (mv, cols, direct), _backlogs_async(cols["now"], cols["queued"]), _unsliced():
        variants = {"direct": (direct, cols["now"]), "inferbus": (cols["now"].ingress._on_infer, cols["now"]),
                    "inferbus_queued": (cols["queued"].ingress._on_infer, cols["queued"])}
        bodies = _bodies(model, models_dir, mv, 2 * n * len(variants))
        hdrs = {"Inferbus-Timeout-Ms": "100000.000"}
        driver = count_bytecodes.__code__
        me = asyncio.current_task()
        tasks: dict = {}  # task -> counted (its name is the supervisor's "<actor>:<loop>", the pump's ":inline")
        out: dict[str, dict] = {}
        late = 0
        for vi, (name, (handle, col)) in enumerate(variants.items()):
            subject = col.ingress.subjects.infer(model, mv.version)
            counts: dict = {}

            def tracer(frame, event, arg):
                if event == "call":
                    task = asyncio.current_task()
                    ok = tasks.get(task)
                    if ok is None:  # this driver's task (the handler) or the worker's pump; not periodic loops
                        ok = tasks[task] = task is me or (task is not None and task.get_name().endswith(":inline"))
                    if not ok:
                        return None
                frame.f_trace_opcodes = True
                if event == "opcode":
                    code = frame.f_code
                    if code is not driver:  # this loop's own turns are not the variant's
                        counts[code] = counts.get(code, 0) + 1
                return tracer

            for i, body in enumerate(bodies[vi * 2 * n:(vi + 1) * 2 * n]):
                m = _Msg(subject, SINK, body, dict(hdrs))
                if i == n and name != "direct":
                    await _await_routed(col)
                    before = col.worker.stats.completed
                k = i % n  # the position in this phase (warm-up, then counted)
                behind = min((k // batch + 1) * batch, n) - k - 1  # the rest of this request's group
                if name != "direct":
                    col.ingress._infer_sub.pending_msgs = behind
                if i >= n:
                    sys.settrace(tracer)
                try:
                    await handle(m)
                    if not behind:
                        for _ in range(yields):
                            await asyncio.sleep(0)
                finally:
                    sys.settrace(None)
            if name != "direct":  # every counted request computed and answered within its own turns
                late += max(0, n - (col.worker.stats.completed - before))
            by_fn: dict[str, int] = {}
            for code, c in counts.items():
                k = _where(code)
                by_fn[k] = by_fn.get(k, 0) + c
            ranked = sorted(by_fn.items(), key=lambda kv: -kv[1])[:top]
            out[name] = {"bytecodes_per_request": round(sum(by_fn.values()) / n, 1),
                         "top": {k: round(v / n, 1) for k, v in ranked}}
        counts_doc = _counts(cols["now"], cols["queued"], late)
    per = {k: v["bytecodes_per_request"] for k, v in out.items()}
    return {"model": model, "python": platform.python_version(), "counted_requests": n, "yields": yields,
            "batch": batch, "other_workers": others,
            "bytecodes_per_request": per, "ratio_to_direct": {k: round(v / per["direct"], 3) for k, v in per.items()},
            "top": {k: v["top"] for k, v in out.items()}, "counts": counts_doc}


def _drive(handle, msg) -> int:
    """Run ``handle(msg)`` to its end without the event loop: 0, or 1 when it suspended (it waited for
    something; it is closed then and the measure is not valid)."""
    coro = handle(msg)
    try:
        coro.send(None)
    except StopIteration:
        return 0
    coro.close()
    return 1


async def _count_child(model: str, models_dir: str, n: int, variant: str, others: int = 0) -> dict:
    """The process ``--instructions`` runs under callgrind: ``n`` warm-up requests, then ``n`` counted ones,
    each handled inside one call of ``itertools.starmap`` (the C function ``starmap_next`` toggles
    callgrind's collection, so only the handlers' own instructions count). Returns the counts."""
    # under callgrind the model's batch-1 time looks ~50 x longer: keep it inline, as it runs natively
    inline = {"inline_max_compute_us": MAX_INLINE_COMPUTE_US}  # (the most it takes: a second)
    async with _harness(model, models_dir, others, {"count": (True, inline)}) as \
            (mv, cols, direct):
        col = cols["count"]
        handle = direct if variant == "direct" else col.ingress._on_infer
        subject = col.ingress.subjects.infer(model, mv.version)
        hdrs = {"Inferbus-Timeout-Ms": "100000.000"}  # callgrind runs the code ~50 x slower
        suspended = 0
        for i, body in enumerate(_bodies(model, models_dir, mv, 2 * n)):
            m = _Msg(subject, SINK, body, dict(hdrs))
            if i == n and variant != "direct":
                await _await_routed(col, timeout_s=60.0)  # callgrind runs the actors ~50 x slower
            if i < n:
                await handle(m)
            else:
                suspended += sum(itertools.starmap(_drive, ((handle, m),)))
            for _ in range(3):
                await asyncio.sleep(0)
        c = col.ingress.counts
        return {"variant": variant, "counted": n, "suspended": suspended, "run_now": c["run_now"],
                "l1_hits": c["l1_hits"], "errors": c["errors"]}


def count_instructions(model: str, models_dir: str, n: int, others: int = 0) -> dict:
    """Instructions per request (user space, counted by valgrind's callgrind) of the floor's handler and of
    the colocated ingress's, run to completion: a measure that does not move with the host's load (the same
    code counts the same to within 1 %). System calls (the socket write) and cache misses are not in it.
    The queued variant cannot be counted this way: its compute runs in the worker's pump task, outside the
    handler's call.

    Raises:
        RuntimeError: valgrind failed, collected nothing (a Python without symbols: ``starmap_next`` not
            found), or a request did not run as labelled.
    """
    import re
    import shutil
    import subprocess

    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise RuntimeError("--instructions needs valgrind on PATH (e.g. apt-get install valgrind)")
    per_request: dict[str, float] = {}
    children: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="pathcost-cg-") as tmp:
        for variant in COUNTED_VARIANTS:
            cmd = [valgrind, "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=starmap_next",
                   f"--callgrind-out-file={tmp}/callgrind.{variant}", sys.executable, "-m", "bench.pathcost",
                   "--count-child", variant, "--model", model, "--models-dir", models_dir, "--instructions", str(n),
                   "--other-workers", str(others)]
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            found = re.findall(r"Collected\s*:\s*([\d,]+)", r.stderr)
            if r.returncode != 0 or not found:
                raise RuntimeError(f"callgrind run of {variant} failed (exit {r.returncode}): {r.stderr[-2000:]}")
            collected = int(found[-1].replace(",", ""))
            child = json.loads(r.stdout.strip().splitlines()[-1])
            bad = child["suspended"] or child["errors"] or child["l1_hits"] or (
                variant == "inferbus" and child["run_now"] != 2 * n)
            if collected == 0 or bad:
                raise RuntimeError(f"{variant}: not a valid count: {collected} instructions collected, {child} "
                                   f"(every request must run to completion in the call, as a miss, without error)")
            per_request[variant] = round(collected / n)
            children[variant] = child
    return {"model": model, "counted_requests": n, "other_workers": others, "instructions_per_request": per_request,
            "ratio_to_direct": {k: round(v / per_request["direct"], 3) for k, v in per_request.items()},
            "children": children}


def _report(a: argparse.Namespace, doc: dict, key: str, value_fmt: str, ratio_fmt: str) -> bool:
    """Print the result lines of ``doc[key]`` (with ratios to direct) and write ``--json``; False when the JSON
    could not be written after all (one line on stderr)."""
    print(f"the colocated router sees {a.other_workers + 1} worker(s) of {a.model}")
    for k, v in doc[key].items():
        print(f"{k:16s} {value_fmt.format(v)}  ({ratio_fmt.format(doc['ratio_to_direct'][k])} × direct)")
    if a.json:
        try:
            a.json.write_text(json.dumps(doc, indent=1))
        except OSError as exc:  # checked before the measure; changed since (removed, full): one line, not a traceback
            print(f"error: --json {a.json}: cannot write it: {exc.strerror or exc}", file=sys.stderr)
            return False
    return True


def problem(a: argparse.Namespace) -> str | None:
    """Why the run cannot go ahead, as ``--OPTION VALUE: <reason>``, or None: checked before anything starts (no
    nats-server, no actors, no inference session; only the model's folder is read, as before), so that a bad path
    or name is not found after the measure.

    * ``--json``: a file that cannot be written (:func:`inferbus._paths.output_file_problem`; a missing folder is
      not made, as ``bench.suite`` does not make one: a typo would leave a tree behind);
    * ``--models-dir``: not a folder, or the model's config unreadable;
    * ``--model``: no such model in ``--models-dir`` (found by its folder's ``config.json``, as
      :class:`ModelRepository` finds models; the reason lists the models there);
    * ``--other-workers``: more than a node's processes less one.
    """
    if a.other_workers >= MAX_OTHER_WORKERS:  # (100,000 ran for minutes before the measure began: a trial)
        return (f"--other-workers {a.other_workers}: at most {MAX_OTHER_WORKERS - 1}, the processes of one node less "
                f"the measured one")
    if a.json is not None:
        reason = output_file_problem(a.json, "pathcost.json")
        if reason:
            return f"--json {a.json}: {reason}"
    models_dir = Path(a.models_dir)
    if not models_dir.is_dir():
        return f"--models-dir {a.models_dir}: model repository {a.models_dir} is not a folder"
    have = sorted(c.parent.name for c in models_dir.glob("*/config.json"))
    if a.model not in have:
        return (f"--model {a.model!r} is not in {a.models_dir} (it has "
                f"{', '.join(have) if have else 'no models: no <model>/config.json there'})")
    try:
        repo = ModelRepository(a.models_dir, [a.model])
    except Exception as exc:  # an unreadable repository or model: one line, not a traceback
        return f"--models-dir {a.models_dir}: {' '.join(str(exc).split())}"
    if repo.get(a.model) is None:  # a config whose name is not its folder's is refused above; kept as a guard
        return f"--model {a.model!r} is not in {a.models_dir}"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pathcost", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="digits", help="model in the repository (default digits; it must run inline)")
    p.add_argument("--models-dir", default=str(ROOT / "models"), help="model repository (default ./models)")
    p.add_argument("--requests", type=args.count, help="requests per timed pass (default 3000)")
    p.add_argument("--reps", type=args.count, help="timed passes per variant per round (default 5); the least counts")
    p.add_argument("--batch", type=args.count, metavar="K",
                   help="hand the requests over K at a time, back to back, before the --yields turns, as nats-py "
                        "hands a subscription's waiting messages under load (default 1; at most 64): the queued "
                        "variant then computes them as one batch while they fit in the worker's inline slice (about "
                        "1 ms of estimated compute; the JSON's queued_mean_batch says what ran); the "
                        "run-to-completion variant holds each group back as a burst, seeing the rest waiting, and "
                        "computes it as one batch at its end (mean_burst)")
    p.add_argument("--yields", type=args.count,
                   help="event-loop turns after each request (each group of --batch), every variant (default 3; at "
                        "least 1: the worker's pump answers a queued request in them)")
    p.add_argument("--json", type=Path,
                   help="write the result document here (its folder must exist; checked before the measure starts)")
    p.add_argument("--instructions", type=args.count, metavar="N",
                   help="instead of CPU time: instructions per request, counted by valgrind (callgrind) over N "
                        "requests after N of warm-up, for direct and inferbus (run to completion); needs valgrind "
                        "(--requests, --reps, --batch and --yields are refused)")
    p.add_argument("--bytecodes", type=args.count, metavar="N",
                   help="instead of CPU time: Python bytecodes per request (sys.settrace), by function, for all "
                        "three variants, over N requests after N of warm-up (--yields and --batch apply; --requests "
                        "and --reps are refused)")
    p.add_argument("--top", type=args.count, metavar="K",
                   help="with --bytecodes: the K functions that execute the most, per variant (default 25)")
    p.add_argument("--other-workers", type=args.count_or_zero, default=0, metavar="N",
                   help="N more workers of the model the colocated router sees (load reports; they get no "
                        "requests), as in a deployment of N+1 processes: the throughput profile's 8 is 7 (default 0; "
                        f"at most {MAX_OTHER_WORKERS - 1}, a node's processes less the measured one)")
    p.add_argument("--verbose", action="store_true",
                   help="print the actors' own lines (READY, connections, shutdown) as they come; else they are "
                        "shown only when the measure raises (not for an invalid count: rerun with --verbose)")
    p.add_argument("--count-child", choices=COUNTED_VARIANTS, help=argparse.SUPPRESS)  # the process callgrind runs
    a = p.parse_args(argv)
    timing_only = [f for f, v in (("--requests", a.requests), ("--reps", a.reps)) if v is not None]
    if a.instructions and a.batch is not None:
        timing_only.append("--batch")
    if a.instructions and a.bytecodes:
        p.error("--instructions and --bytecodes are two measures: give one")
    if (a.instructions or a.bytecodes) and timing_only:
        p.error(f"{', '.join(timing_only)} {'applies' if len(timing_only) == 1 else 'apply'} to the CPU-time measure only, not to "
                f"{'--instructions' if a.instructions else '--bytecodes'}")
    if a.instructions and a.yields is not None:
        p.error("--yields does not apply to --instructions (each request runs to completion in its call)")
    if a.top is not None and not a.bytecodes:
        p.error("--top applies to --bytecodes only")
    a.requests, a.reps, a.batch, a.top, a.yields = a.requests or 3000, a.reps or 5, a.batch or 1, a.top or 25, a.yields or 3
    per_pass = a.bytecodes or a.requests
    if a.batch > min(per_pass, MAX_BATCH):
        p.error(f"--batch {a.batch}: at most {'--bytecodes' if a.bytecodes else '--requests'} ({per_pass}) and "
                f"{MAX_BATCH} (the worker splits a larger group over several loop turns, and the last ones would be "
                f"answered after their pass)")
    global VERBOSE
    VERBOSE = a.verbose
    reason = problem(a)
    if reason:  # one line, exit 2, before any nats-server or model load
        print(f"error: {reason}", file=sys.stderr)
        return 2
    import uvloop

    if a.count_child:
        print(json.dumps(uvloop.run(_count_child(a.model, a.models_dir, a.instructions or 300, a.count_child,
                                                       a.other_workers))))
        return 0
    if a.instructions:
        try:
            doc = count_instructions(a.model, a.models_dir, a.instructions, a.other_workers)
        except RuntimeError as exc:
            print(f"pathcost: {exc}", file=sys.stderr)
            return 1
        return 0 if _report(a, doc, "instructions_per_request", "{:9,d} instructions/request", "{:.3f}") else 1
    if a.bytecodes:
        doc = uvloop.run(count_bytecodes(a.model, a.models_dir, a.bytecodes, a.yields, a.other_workers, a.top,
                                         a.batch))
        for name, fns in doc["top"].items():
            print(f"-- {name}: {doc['bytecodes_per_request'][name]:,.0f} bytecodes/request, the most executed:")
            for fn, v in fns.items():
                print(f"   {v:8.1f}  {fn}")
        key, fmts, expected_run_now = "bytecodes_per_request", ("{:9,.0f} bytecodes/request", "{:.3f}"), 2 * a.bytecodes
    else:
        doc = uvloop.run(run(a.model, a.models_dir, a.requests, a.reps, a.yields, a.other_workers, a.batch))
        key, fmts, expected_run_now = "cpu_us_per_request", ("{:7.1f} µs/request", "{:.2f}"), 2 * a.reps * a.requests
    # every request must have been a miss computed as labelled and answered within its own turns: else the
    # figures measure something else
    c = doc["counts"]
    bad = bool(c["errors"] or c["l1_hits"] or c["run_now"] != expected_run_now or c["queued_run_now"]
               or c["queued_local_forwards"] != expected_run_now or c["answered_late"])
    doc["valid"] = not bad
    written = _report(a, doc, key, *fmts)
    print(f"counts: {c}")
    if bad:
        print(f"not a valid measure (the JSON says valid: false): expected {expected_run_now} requests run to "
              f"completion (and as many through the queue, to the local worker), each answered within its own "
              f"event-loop turns, 0 cache hits and 0 errors; got {c} (e.g. a model that does not run inline: see "
              f"inferbus up --inline-max-compute-us; --verbose shows the actors' lines)", file=sys.stderr)
    return 1 if bad or not written else 0


if __name__ == "__main__":
    sys.exit(main())
