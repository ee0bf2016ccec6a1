"""Load generators and echo responders in their own OS processes.

A load generator sharing the served pipeline's event loop (or one Python
process doing both sending and judging at high rates) measures itself. So the
parent here only orchestrates: it starts ``n`` generator processes
(``python -m inferbus.loadgen gen <config JSON>``), each with its own uvloop,
NATS connection and reply inbox, optionally pinned to cores, and drives them
with one JSON line per step on stdin; each answers one JSON line (its
:class:`~inferbus.loadgen._result.Recorder` in wire form) on stdout, and the
parent adds them up (:func:`~inferbus.loadgen._result.merge_wire`). All
processes start a step at the same ``time.monotonic()`` instant (CLOCK_MONOTONIC
is system-wide on Linux).

Echo responders (``python -m inferbus.loadgen echo <config JSON>``) are the
bus floor: nats-py + uvloop, a queue group, each request's body published back
to its reply subject with a ``Content-Type`` header, as a worker answers.

*Direct* responders (the same process kind, given a model) are the Python
floor of a whole inference: per request, what any Python server on nats-py must
do and nothing else. Each decodes the body (``inferbus.schemas``, msgspec),
runs the model at batch 1 (ONNX Runtime with the worker's session options) and
publishes the encoded v2 response; no routing, cache, deadline, admission,
stage timings or accounting. With ``batch_max`` > 1 they also batch: requests
that wait together in the subscription run as one merged model call. They
answer the generators' ``direct`` target, which judges every answer against
the reference as it does inferbus's.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ._result import BenchResult, merge_wire

READY = "READY"


def _set_affinity(cpus) -> None:
    if cpus and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, set(cpus))
        except OSError:
            pass


def _uvloop_run(coro) -> None:
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:  # pragma: no cover
        asyncio.run(coro)


FLUSH_TIMEOUT_S = 1.0
"""The longest a generator's or responder's publish waits in nats-py's *forced* flush (``flush_timeout``), the wait
a publish makes once more than ``pending_size`` bytes (64 MiB) wait to be written, as under a flood the server does
not read fast enough. nats-py waits for ever by default, and that flush's future waits in the queue of nats-py's
flusher task, which a lost connection ends (nats-py 2.16: ``_attempt_reconnect`` cancels it) without resolving the
futures queued behind the one it holds: only the flusher of a later reconnect would. So when the node a bench
flooded stopped, the generator's publish waited for a reconnect that never came, its step never ended, and
``inferbus bench`` failed the generator 66 s later (a fresh-user trial). Past this bound the publish goes on (its
bytes stay buffered; the server, if alive, reads them later), and the requests no answer reaches are counted out
by the step's ``timeout_s`` as usual."""


async def _connect(url: str, name: str, **bus):
    """The NATS connection of a generator or responder process: ``url``'s servers tried in the given order, a
    forced flush bounded by :data:`FLUSH_TIMEOUT_S`, the credentials and TLS files of the environment as every
    client command takes them (``INFERBUS_NATS_TOKEN``, ...: :data:`~inferbus._client_env.CLIENT_ENV`; the
    process inherits ``inferbus bench``'s environment); ``bus``: further :class:`~inferbus.bus.BusConfig` fields
    (e.g. ``pending_size_bytes``)."""
    from ..bus import BusConfig, connect, split_servers
    from .._client_env import client_env_options

    return await connect(BusConfig(servers=split_servers(url), name=name, no_randomize=True,
                                   extra={"flush_timeout": FLUSH_TIMEOUT_S}, **{**client_env_options(), **bus}))


# ------------------------------------------------------------------ child: generator


@dataclass
class GenConfig:
    """One generator process. ``pool``: distinct inputs per process (its index × pool is its offset)."""

    index: int
    nats_url: str
    models_dir: str
    cpus: list[int] = field(default_factory=list)
    pool: int = 8192


class _Gen:
    def __init__(self, cfg: GenConfig) -> None:
        self.cfg = cfg
        self.works: dict = {}
        self.targets: dict = {}
        self._next_index: dict[int, int] = {}
        """Target (its id) → the index of the next request's input: where its next step goes on through the pool."""
        self.nc = None
        self.lean = None
        self.http = None

    def _work(self, model: str, version: str | None, distinct: bool):
        from ..actors._repository import ModelRepository
        from ._workload import Workload

        key = (model, version, distinct)
        w = self.works.get(key)
        if w is None:
            c = self.cfg
            repo = ModelRepository(c.models_dir, [model])
            repo.get_version(model, version)  # (a version its version_policy leaves out, loaded by name)
            w = Workload(repo, model, version, pool=c.pool, distinct=distinct, seed=c.index, offset=c.index * c.pool)
            w.bodies  # encode now, not during a step
            self.works[key] = w
        return w

    def _target(self, spec: dict):
        from ._lean import Target, echo_target, infer_target

        key = json.dumps(spec, sort_keys=True)
        t = self.targets.get(key)
        if t is not None:
            return t
        work = self._work(spec["model"], spec.get("version"), spec.get("distinct", True))
        timeout_ms = spec.get("timeout_ms", 1000.0)
        kind = spec["kind"]
        if kind == "inferbus":
            t = infer_target(work, spec.get("prefix", "inferbus"), timeout_ms)
        elif kind == "echo":
            t = echo_target(work, spec["subject"], timeout_ms)
        elif kind == "direct":  # the direct responders: inferbus's bodies and headers, judged as inferbus's answers
            t = Target("direct", spec["subject"], work.bodies, {"Inferbus-Timeout-Ms": f"{timeout_ms:.3f}"},
                       work.check_reply, timeout_ms / 1000.0)
        elif kind == "http":
            t = Target(spec.get("name", "http"), spec["url"], work.bodies, None, work.check_reply)
        else:
            raise ValueError(f"unknown target kind {kind!r}")
        self.targets[key] = t
        return t

    async def _driver(self, spec: dict):
        if spec["kind"] == "http":
            if self.http is None:
                from ._http import HttpDriver

                self.http = HttpDriver()
            return self.http
        return self.lean

    async def step(self, cmd: dict) -> dict:
        target = self._target(cmd["target"])
        drv = await self._driver(cmd["target"])
        gc.collect()
        # each step goes on through the pool where the last one stopped: from its start again, a step repeated the
        # warm-up's and the last step's inputs, cache hits in a row of misses for a model whose cache_ttl_ms outlasts
        # a step (a fresh-user trial: 354 of 1,027)
        base = self._next_index.get(id(target), 0)
        if cmd["mode"] == "closed":
            rec, elapsed, cpu = await drv.closed(target, concurrency=cmd["concurrency"], duration_s=cmd["duration_s"],
                                                 timeout_s=cmd["timeout_s"], start_at=cmd.get("start_at"),
                                                 index_base=base)
        else:
            rec, elapsed, cpu = await drv.open(target, rate_qps=cmd["rate"], duration_s=cmd["duration_s"],
                                               timeout_s=cmd["timeout_s"], start_at=cmd.get("start_at"),
                                               phase=cmd.get("phase", 0.0), precise=cmd.get("precise", True),
                                               timer=cmd.get("timer", True), index_base=base)
        w = rec.to_wire(elapsed, cpu)
        # (every request sent was answered or counted as an error by the step's end; NOT_SENT ones skip indices)
        self._next_index[id(target)] = base + w["ok"] + w["wrong"] + sum(w["errors"].values())
        w["pacing"] = getattr(drv, "pacing", "")
        return w

    async def run(self) -> None:
        from ._lean import LeanDriver

        _set_affinity(self.cfg.cpus)
        self.nc = await _connect(self.cfg.nats_url, f"loadgen-{self.cfg.index}")
        self.lean = LeanDriver(self.nc)
        await self.lean.start()
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 50, 100)
        print(READY, flush=True)
        loop = asyncio.get_running_loop()
        try:
            while True:
                line = await loop.run_in_executor(None, sys.stdin.readline)
                if not line:
                    return
                cmd = json.loads(line)
                op = cmd.get("op")
                try:
                    if op == "quit":
                        return
                    if op == "prepare":
                        for spec in cmd["targets"]:
                            self._target(spec)
                        out = {"ok": True}
                    elif op == "step":
                        out = {"ok": True, "wire": await self.step(cmd)}
                    else:
                        out = {"ok": False, "error": f"unknown op {op!r}"}
                except Exception as exc:
                    out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                print(json.dumps(out), flush=True)
        finally:
            if self.http is not None:
                await self.http.close()
            from ..bus import close_connection

            await close_connection(self.nc)


def gen_main(config_json: str) -> None:
    """Process entry: ``python -m inferbus.loadgen gen '<GenConfig JSON>'``.

    SIGTERM ends it at once (the default action, set here in case the parent ignored it): it is how
    :meth:`GeneratorPool.close` stops a generator busy in a step, which reads no command until the step ends.
    """
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _uvloop_run(_Gen(GenConfig(**json.loads(config_json))).run())


# ------------------------------------------------------------------ child: echo responder


async def _echo(cfg: dict) -> None:
    _set_affinity(cfg.get("cpus"))
    nc = await _connect(cfg["nats_url"], f"echo-{cfg.get('index', 0)}")
    hdrs = {"Content-Type": "application/msgpack"}
    publish = nc.publish
    from ..bus import BusyPoll

    # busy polling as the actors do it with busy_poll_us (a matched floor for `--busy-poll-us`)
    bp = BusyPoll(cfg["busy_poll_us"]) if cfg.get("busy_poll_us") else None
    poller = asyncio.create_task(bp.run()) if bp is not None else None  # noqa: F841 (held until the process ends)
    monotonic = time.monotonic

    subs: list = []
    if cfg.get("model_path"):
        on_msg = _direct_handler(cfg, publish, hdrs, subs)
    else:
        async def on_msg(msg) -> None:
            if bp is not None:
                bp.poke(monotonic())
            if msg.reply:
                await publish(msg.reply, msg.data, headers=hdrs)

    subs.append(await nc.subscribe(cfg["subject"], queue=cfg.get("queue", "echo"), cb=on_msg))
    await nc.flush()
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    print(READY, flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    await nc.drain()


def _direct_handler(cfg: dict, publish, hdrs: dict, subs: list):
    """The direct responder's message callback (see the module doc): decode, model, encode, publish.

    ``cfg["batch_max"]`` (default 1): with more than 1, a message is held while more wait in the
    subscription (``subs[0].pending_msgs``, nats-py's public count), and the held ones, up to ``batch_max``,
    are decoded together, run as one merged batch when their inputs stack along the first dimension (the
    worker's own merge; else one by one) and answered in order; the replies share nats-py's next write. A request that fails to decode or
    to run is answered with the typed error reply a worker would send.
    """
    from pathlib import Path

    from ..accelerators import OnnxRuntimeBackend
    from ..actors._worker import _run_merged
    from ..schemas import (
        InferResponse, decode_request, encode_error, encode_response, input_to_numpy, output_from_numpy,
    )

    sess = OnnxRuntimeBackend().load(Path(cfg["model_path"]))
    name, version = cfg.get("model_name", "model"), cfg.get("model_version", "1")
    batch_max = max(1, int(cfg.get("batch_max", 1)))
    held: list = []

    def run(feeds_list: list[dict]) -> list[dict]:
        """Outputs per request: one merged run, split by rows, as a worker merges a batch
        (:func:`inferbus.actors._worker._run_merged`); one run each when they do not merge."""
        merged = _run_merged(sess, None, feeds_list) if len(feeds_list) > 1 else None
        return merged if merged is not None else [sess.infer(f) for f in feeds_list]

    async def on_msg(msg) -> None:
        if msg.reply:
            held.append(msg)
        if not held or (len(held) < batch_max and subs and subs[0].pending_msgs > 0):
            return  # more requests wait in the subscription: they join this batch
        msgs = held[:]
        held.clear()
        answers: list = [None] * len(msgs)
        todo = []
        for k, m in enumerate(msgs):
            try:
                req = decode_request(m.data)
                todo.append((k, req, {t.name: input_to_numpy(t, field="inputs") for t in req.inputs}))
            except Exception as exc:  # typed (bad input), as a worker answers it
                answers[k] = encode_error(exc)
        if todo:
            try:
                outs = run([f for _, _, f in todo])
                for (k, req, _), out in zip(todo, outs):
                    answers[k] = (hdrs, encode_response(InferResponse(
                        model_name=name, model_version=version, id=req.id,
                        outputs=[output_from_numpy(n, v, raw=True) for n, v in out.items()])))
            except Exception as exc:  # the model failed: INTERNAL, as a worker answers it
                for k, _, _ in todo:
                    answers[k] = encode_error(exc)
        for m, (h, body) in zip(msgs, answers):
            await publish(m.reply, body, headers=h)

    return on_msg


def echo_main(config_json: str) -> None:
    """Process entry: ``python -m inferbus.loadgen echo '<config JSON>'``."""
    _uvloop_run(_echo(json.loads(config_json)))


# ------------------------------------------------------------------ parent side


class GeneratorFailed(RuntimeError):
    """A load-generator or responder process died, refused a command, or gave no answer in time (its log named)."""


class _Child:
    def __init__(self, proc: asyncio.subprocess.Process, name: str, log: Path | None) -> None:
        self.proc = proc
        self.name = name
        self.log = log
        self.busy = True
        """Not reading its stdin: starting (until READY), or a command sent and its answer not read yet (a step,
        a prepare). Such a child does not see a quit or the end of its stdin until it is done (a whole step)."""

    async def readline(self, timeout_s: float) -> str:
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        if not line:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log and self.log.exists() else ""
            raise GeneratorFailed(f"{self.name} exited (code {self.proc.returncode}): {tail}")
        return line.decode()

    async def send(self, obj: dict) -> None:
        self.busy = True
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        await self.proc.stdin.drain()

    async def answer(self, timeout_s: float) -> str:
        """The answer to the last command sent (:meth:`readline`); the child is then idle.

        Raises:
            RuntimeError: the child exited. asyncio.TimeoutError: no answer within ``timeout_s`` seconds.
        """
        line = await self.readline(timeout_s)
        self.busy = False
        return line

    async def stop(self, timeout_s: float = 10.0, *, terminate: bool = False) -> None:
        """Close its stdin (the cue to exit for an idle child) and wait up to ``timeout_s`` seconds for it to exit,
        then kill it. ``terminate``: send SIGTERM first (a child busy in a step reads no stdin until the step ends:
        waiting for it made a SIGTERM'd ``inferbus bench`` take the whole 10 s)."""
        if self.proc.returncode is not None:
            return
        try:
            self.proc.stdin.close()
        except Exception:
            pass
        if terminate:
            try:
                self.proc.terminate()
            except ProcessLookupError:  # exited since
                pass
        try:
            await asyncio.wait_for(self.proc.wait(), timeout_s)
        except asyncio.TimeoutError:
            self.proc.kill()
            await self.proc.wait()


async def _spawn(kind: str, cfg: dict, name: str, log_dir: Path | None) -> _Child:
    log = (log_dir / f"{name}.log") if log_dir else None
    err = open(log, "wb") if log else asyncio.subprocess.DEVNULL
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "inferbus.loadgen", kind, json.dumps(cfg),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err)
    finally:
        if log:
            err.close()
    return _Child(proc, name, log)


async def _start_all(children: list[_Child], timeout_s: float) -> None:
    async def ready(c: _Child) -> None:
        while True:
            line = await c.readline(timeout_s)
            if line.strip() == READY:
                c.busy = False
                return

    await asyncio.gather(*(ready(c) for c in children))


def split(total: int, parts: int) -> list[int]:
    """``total`` spread over ``parts`` as evenly as possible, larger shares first."""
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


def _url_for(nats_url: str, k: int, spread: bool) -> str:
    """Process ``k``'s server list: ``nats_url`` rotated to start at server ``k mod n`` when ``spread``."""
    from ..bus import rotate_servers

    return ",".join(rotate_servers(nats_url, k)) if spread else nats_url


class GeneratorPool:
    """``n`` load-generator processes, driven together step by step.

    Args:
        n: processes. nats_url: the NATS server(s) to load (comma-separated; tried in order).
        models_dir: model repository (inputs and reference answers).
        spread: process ``k`` connects to server ``k mod n`` of ``nats_url`` first (placement on a
            :func:`~inferbus.bus.gateway_mesh`, next to the node's ``spread_servers``).
        cpus: per process, the cores to pin it to (None = no pinning).
        pool: distinct inputs prepared per process.
        log_dir: where each process's stderr goes (None = discarded).

    Use ``async with GeneratorPool(...) as pool:``; :meth:`step` returns the
    merged :class:`BenchResult` of all processes.
    """

    def __init__(self, n: int, nats_url: str, models_dir: str, *, cpus: list[list[int]] | None = None,
                 pool: int = 8192, log_dir: Path | None = None, spread: bool = False) -> None:
        if n < 1:
            raise ValueError("GeneratorPool: n >= 1 processes")
        self.n = n
        self.nats_url = nats_url
        self.spread = spread
        self.models_dir = models_dir
        self.cpus = cpus
        self.pool = pool
        self.log_dir = log_dir
        self.children: list[_Child] = []

    async def start(self, timeout_s: float = 60.0) -> None:
        """Start every process and return when each has connected and subscribed its inbox."""
        for k in range(self.n):
            cfg = GenConfig(k, _url_for(self.nats_url, k, self.spread), self.models_dir, list(self.cpus[k]) if self.cpus else [], self.pool)
            self.children.append(await _spawn("gen", cfg.__dict__, f"loadgen-{k}", self.log_dir))
        await _start_all(self.children, timeout_s)

    async def _ask(self, items: list[tuple[_Child, dict]], timeout_s: float) -> list[dict]:
        for c, cmd in items:
            await c.send(cmd)
        answers = [asyncio.ensure_future(c.answer(timeout_s)) for c, _ in items]
        try:
            outs = await asyncio.gather(*answers)
        except asyncio.TimeoutError:
            late = [c.name for (c, _), a in zip(items, answers) if not a.done() or a.cancelled() or a.exception()]
            raise GeneratorFailed(f"{', '.join(late)} gave no answer within {timeout_s:.0f} s"
                                  + (f" (logs in {self.log_dir})" if self.log_dir else "")) from None
        finally:
            for a in answers:
                a.cancel()
            await asyncio.gather(*answers, return_exceptions=True)
        res = [json.loads(o) for o in outs]
        for (c, _), r in zip(items, res):
            if not r.get("ok"):
                raise GeneratorFailed(f"{c.name}: {r.get('error')}")
        return res

    async def prepare(self, targets: list[dict], timeout_s: float = 300.0) -> None:
        """Build every target's inputs, references and bodies in every process (before timing anything)."""
        await self._ask([(c, {"op": "prepare", "targets": targets}) for c in self.children], timeout_s)

    async def step(self, target: dict, *, mode: str, concurrency: int | None = None, rate: float | None = None,
                   duration_s: float = 5.0, timeout_s: float = 1.0, label: str = "",
                   procs: int | None = None, precise: bool | None = None, timer: bool = True) -> BenchResult:
        """One closed-loop (``concurrency`` callers in all) or open-loop (``rate`` requests/s in all) step.

        Concurrency is split over the processes (a process with no share sits
        out); the rate is split evenly, each process's ticks shifted by a
        fraction of a tick. ``procs`` caps how many processes take part.
        ``precise``: open-loop tick pacing (see :meth:`LeanDriver.open`); None = precise on Linux with
        ``timer`` (a timerfd, no spin) and on other hosts with 8 cores or more; ``timer``: precise pacing
        through a timerfd where there is one.
        The result's ``pacing`` says what the processes did (``timerfd``, ``spin`` or ``sleep``).

        Raises:
            GeneratorFailed: a generator process failed or died, or gave no answer within the step's duration, its
                timeout and 60 s.
        """
        use = self.children[: max(1, min(procs or self.n, self.n))]
        if precise is None:  # a timerfd wakes on time without spinning; a spin only where cores are to spare
            precise = (timer and sys.platform.startswith("linux")) or (os.cpu_count() or 1) >= 8
        start_at = time.monotonic() + 0.2
        items = []
        if mode == "closed":
            if not concurrency or concurrency < 1:
                raise ValueError("closed loop: concurrency >= 1")
            for c, share in zip(use, split(concurrency, len(use))):
                if share:
                    items.append((c, {"op": "step", "target": target, "mode": "closed", "concurrency": share,
                                      "duration_s": duration_s, "timeout_s": timeout_s, "start_at": start_at}))
        elif mode == "open":
            if not rate or rate <= 0:
                raise ValueError("open loop: rate > 0 requests/s")
            for k, c in enumerate(use):
                items.append((c, {"op": "step", "target": target, "mode": "open", "rate": rate / len(use),
                                  "duration_s": duration_s, "timeout_s": timeout_s, "start_at": start_at,
                                  "phase": k / len(use), "precise": precise, "timer": timer}))
        else:
            raise ValueError(f"mode is 'closed' or 'open', not {mode!r}")
        res = await self._ask(items, duration_s + timeout_s + 60.0)
        return merge_wire([r["wire"] for r in res], model=target.get("model", ""), mode=mode,
                          concurrency=concurrency if mode == "closed" else None,
                          rate_qps=rate if mode == "open" else None, target=target.get("name", target["kind"]),
                          label=label)

    async def close(self, busy_timeout_s: float = 1.0) -> None:
        """Stop every process: an idle one is sent ``quit`` (it closes its NATS connection and exits); one still
        starting or busy in a step or a prepare (the run cancelled, e.g. ``inferbus bench``'s SIGTERM, or a step
        that failed in another process) reads no command until it is done, so it is sent SIGTERM and killed if
        it has not exited within ``busy_timeout_s`` seconds. Stopping mid-step takes well under a second, not the
        rest of the step plus a 10 s wait."""
        busy = [c for c in self.children if c.busy]
        for c in self.children:
            if not c.busy:
                try:
                    await c.send({"op": "quit"})
                except Exception:
                    pass
        await asyncio.gather(*(c.stop() for c in self.children if c not in busy),
                             *(c.stop(busy_timeout_s, terminate=True) for c in busy), return_exceptions=True)
        self.children = []

    async def __aenter__(self) -> "GeneratorPool":
        try:
            await self.start()
        except BaseException:  # cancelled (bench's SIGTERM) or failed while starting: no process left behind
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class EchoPool:
    """``n`` echo responder processes in one queue group on ``subject`` (the bus floor); ``spread`` as for
    :class:`GeneratorPool`; ``busy_poll_us`` > 0: each responder busy-polls that long after each request
    (:class:`inferbus.bus.BusyPoll`, as the actors with ``busy_poll_us``).

    ``model``: ``(path to model.onnx, model name, version)`` makes them *direct* responders (the Python
    floor of a whole inference, see the module doc) instead of echoes; ``batch_max`` > 1: they merge up to
    that many requests that wait together into one model run."""

    def __init__(self, n: int, nats_url: str, subject: str = "bench.echo", *, cpus: list[list[int]] | None = None,
                 log_dir: Path | None = None, spread: bool = False, busy_poll_us: float = 0.0,
                 model: tuple[str, str, str] | None = None, batch_max: int = 1) -> None:
        self.n, self.nats_url, self.subject, self.cpus, self.log_dir = n, nats_url, subject, cpus, log_dir
        self.spread = spread
        self.busy_poll_us = busy_poll_us
        self.model = model
        self.batch_max = batch_max
        self.children: list[_Child] = []

    async def start(self, timeout_s: float = 30.0) -> None:
        kind = "direct" if self.model else "echo"
        for k in range(self.n):
            cfg = {"index": k, "nats_url": _url_for(self.nats_url, k, self.spread), "subject": self.subject,
                   "cpus": list(self.cpus[k]) if self.cpus else [], "busy_poll_us": self.busy_poll_us}
            if self.model:
                cfg.update(model_path=str(self.model[0]), model_name=self.model[1], model_version=self.model[2],
                           queue="direct", batch_max=self.batch_max)
            self.children.append(await _spawn("echo", cfg, f"{kind}-{k}", self.log_dir))
        await _start_all(self.children, timeout_s)

    async def close(self) -> None:
        await asyncio.gather(*(c.stop() for c in self.children), return_exceptions=True)
        self.children = []

    async def __aenter__(self) -> "EchoPool":
        try:
            await self.start()
        except BaseException:  # cancelled or failed while starting: no process left behind
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
