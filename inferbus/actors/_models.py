"""Model management at run time: load, unload and default model versions without a restart.

Public subjects (queue group of the ingress actors; body :class:`ModelControlRequest`,
MessagePack or JSON; answer :class:`ModelControlReply` or a typed error reply):

* ``<p>.models.<model>.load``    load a version (all versions on disk not yet served when none is
  given) from the model repository folder; answered once every required worker loaded it;
* ``<p>.models.<model>.unload``  stop serving a version: the ingresses refuse it at once
  (NOT_FOUND), workers drain it (requests already forwarded finish), then drop its session;
  answered once every required worker has dropped it. The default version cannot be unloaded;
* ``<p>.models.<model>.default`` the version that serves requests naming none; accepted only
  when every required worker has it loaded.

"Required workers" are the workers live when the write arrives that serve some version of the
model (every live worker when none does). A load that no required worker could do (every worker
failed it) is undone: the model's serving state goes back to what it was, or to "not served" (a
state with no versions) for a model that was not served, and the answer is INTERNAL. A load of a
version that is announced but loaded by no live worker loads it again (it is not "nothing to do").
The serving state of a model (:class:`ModelState`:
versions, default version, revision) is set by the ingress that takes the write, applied there
first and then broadcast on ``<p>._models.state``; every ingress and worker applies the state
with the highest ``(revision, writer)`` it has seen. Ingresses re-broadcast their written states
every :data:`BROADCAST_PERIOD_S`, and an actor starting up (a restarted worker or ingress) asks for
them on ``<p>._models.get`` before it announces READY, so a restart does not undo a write.
Workers report per model the revision they have fully applied and its writer (``LoadReport.model_revisions``,
``model_writers``) and the versions they failed to load (``LoadReport.load_errors``); the ingress waits on those.

Each state pins its versions (``ModelState.digests``: the SHA-256 of each version's files when first loaded,
:mod:`._pinning`): a worker loads a version only from files with that digest, and a ``load`` of a served version
whose files changed re-pins it (loaded again from the new files everywhere; undone to the old pin if no worker can).

Writes are gated by region role: accepted only where this region's manager announces
``model_writes`` (the primary region), or always when no region manager is heard at all (a
single node; an ingress in no region forgets a manager silent for ``REGION_HB_FORGET_S``). Elsewhere the answer
is UNAVAILABLE naming the primary region.

Concurrency: one ingress serialises its own writes; two writes to one model taken by two
ingress replicas at the same moment can get the same revision, and then the writer id decides
which state wins everywhere (the other write is lost, and its reply says a revision that lost).
"""

from __future__ import annotations

import asyncio
import logging
import dataclasses
import math
import time

from ..accelerators import batch_buckets, load_checked, rows_problem
from ..bus import headers as H
from ..bus import version_problem
from ..bus._subjects import name_problem
from ..schemas import (
    MODEL_OPS, DeadlineExceeded, InferbusError, Internal, InvalidArgument, ModelControlReply, ModelControlRequest,
    NotFound, Unavailable, decode, encode, is_json,
)
from ..schemas._internal import InternalDecodeError, LoadReport, ModelState, ModelStates, decode_internal, encode_internal
from ..schemas._region import PRIMARY, RegionDecodeError, RegionHeartbeat, decode_region
from ._common import log
from ._pinning import PIN_ERROR_PREFIX, check_pin, version_files
from ._hedge import parse_policy
from ._repository import (CONFIG_FIELDS, Model, ModelArtifactError, ModelConfigError, ModelPinError, RepositoryError,
                          bf16_hint, config_fields)

BROADCAST_PERIOD_S = 2.0
"""Each ingress re-publishes the states it knows (revision > 0) this often, seconds."""
REGION_HB_FRESH_S = 2.0
"""A region manager heartbeat older than this (seconds) no longer counts for the write gate."""
REGION_HB_FORGET_S = 60.0
"""An ingress in no region (a plain ``inferbus up``) that heard a region manager once forgets it after this many
seconds without a heartbeat: it is a single node again and accepts model-management writes (it used to refuse them
until restarted, after a manager had run beside it once). An ingress in a region never forgets: its writes wait
for its region's manager."""
DEFAULT_BUDGET_MS = 60_000.0
"""Budget of a model-management request without ``Inferbus-Timeout-Ms``, ms."""
STATE_FETCH_TIMEOUT_S = 0.5
"""How long an actor starting up waits for a first answer with the current states, seconds."""
STATE_GATHER_S = 0.05
"""After the first answer, how long it keeps taking answers from the other actors, seconds (the newest state of
each model wins: a restarted ingress answers its own request with nothing, and a worker may hold a write that no
live ingress does)."""
CATCH_UP_MIN_INTERVAL_S = 1.0
"""An ingress whose workers report a model revision above its own asks for the states again at most this often,
seconds (:meth:`IngressModels.on_report`)."""
DRAIN_TIMEOUT_S = 60.0
"""A worker drops an unloaded version's session after at most this long even if requests remain, seconds."""


def _vkey(v: str) -> tuple[int, str]:
    return (len(v), v)  # numeric version folders: shorter is smaller


def _by_worker(outcomes: dict[str, str]) -> str:
    """Each worker's outcome of a write for a message: ``n1-w0: loaded; n1-w1: failed: ...`` (a Python dict's repr,
    ``{'n1-w0': 'loaded', ...}``, showed through in the errors' text)."""
    return "; ".join(f"{wid}: {what}" for wid, what in sorted(outcomes.items()))


def _states_in(msg) -> list[ModelState]:
    """The serving states a ``ModelStates`` message carries; [] for anything else (never raises)."""
    try:
        m = decode_internal(msg.data)
    except InternalDecodeError:
        return []
    return list(m.items) if isinstance(m, ModelStates) else []


_SETTLE_S = 0.3
"""How long a ``default`` write waits for the workers to report it applied before it answers (s)."""

def _newer(a: ModelState, b: ModelState | None) -> bool:
    return b is None or (a.revision, a.writer) > (b.revision, b.writer)


def _applied(r: LoadReport, model: str) -> tuple[int, str]:
    """``(revision, writer)`` of the state of ``model`` that worker report ``r`` says is applied (``(0, "")``: none;
    the writer ``"~"``, above every ingress id, for a worker too old to report writers: its revision decides)."""
    rev = r.model_revisions.get(model, 0)
    return (rev, r.model_writers.get(model, "~")) if rev else (0, "")


def _initial_state(model: Model, pins: dict[str, str] | None = None) -> ModelState:
    """Revision 0: every version in the repository folder, the configured default, the digests of ``pins``
    (``"name:version"`` → digest, as the node pinned them at start) for those versions, the model's config."""
    pins = pins or {}
    return ModelState(model.name, 0, "", sorted(model.versions, key=_vkey), model.default_version,
                      {v: pins[mv.key] for v, mv in model.versions.items() if mv.key in pins}, config_fields(model.config))


def _state_config(st: ModelState, base):
    """``base`` (a :class:`ModelConfig`) with the config keys ``st`` carries (:attr:`ModelState.config`; keys this
    version does not know are ignored), checked; ``base`` when it carries none.

    Raises:
        ValueError: a value the config check refuses (a state from a writer with other rules).
    """
    if not st.config:
        return base
    return dataclasses.replace(base, **{k: v for k, v in st.config.items() if k in CONFIG_FIELDS})


def _served_fields(config: dict) -> dict:
    """The keys of a state's config that a ``load`` compares: all but ``default_version`` (the serving default is the
    state's own, set by ``models default``; ``config.json``'s is the default at start)."""
    return {k: v for k, v in config.items() if k != "default_version"}


def _disk_digests(m: Model, versions) -> dict[str, str]:
    """Blocking: digest of each of ``versions`` of ``m`` as its files are now (left out: unreadable)."""
    out = {}
    for v in versions:
        try:
            out[v] = version_files(m.versions[v].path.parent).digest
        except (OSError, ModelPinError):
            continue
    return out


async def fetch_states(nc, subjects) -> list[ModelState]:
    """Ask the ingresses and workers for the current model states (``<p>._models.get``): the newest state of each
    model among the answers that come within :data:`STATE_GATHER_S` of the first (which is awaited up to
    :data:`STATE_FETCH_TIMEOUT_S`); [] when none answers (first start: the repository's state stands).

    Every answer counts, not the first: with one ingress, a restarted ingress's own (empty) answer came first and
    the write its workers still served was undone (a fresh-user trial, 2026-12-02). Workers answer with the states
    they hold (:meth:`WorkerModels._on_get`). Never raises (a garbled answer is skipped)."""
    newest: dict[str, ModelState] = {}
    first = asyncio.Event()

    async def on_answer(msg) -> None:
        for st in _states_in(msg):
            if _newer(st, newest.get(st.model)):
                newest[st.model] = st
        first.set()

    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox, cb=on_answer)
    except Exception:  # the connection is closing: nothing to learn
        return []
    try:
        await nc.publish(subjects.model_state_get, b"", reply=inbox)
        await asyncio.wait_for(first.wait(), STATE_FETCH_TIMEOUT_S)
        await asyncio.sleep(STATE_GATHER_S)
    except Exception:  # no answer in time (first start), or the connection went: what came stands
        pass
    finally:
        try:
            await sub.unsubscribe()
        except Exception:
            pass
    return list(newest.values())


async def answer_states(nc, msg, states: dict[str, ModelState], who: str, *, empty: bool) -> None:
    """Answer a ``<p>._models.get`` request with the written states (revision > 0) of ``states``; with nothing
    written, answer only when ``empty``. A failed publish is logged (``who``), never raised."""
    items = [s for s in states.values() if s.revision > 0]
    if msg.reply and (items or empty):
        try:
            await nc.publish(msg.reply, encode_internal(ModelStates(items)))
        except Exception as exc:
            log(f"{who}: model state answer failed: {exc!r}")


class StateKeeper:
    """A copy of the written serving states (revision > 0, the newest per model) outside the actors, kept by the
    node process (``inferbus up``, :class:`~inferbus.actors.Node`) for as long as it runs.

    It takes every state broadcast on ``<p>._models.state`` (a write, and the ingresses' re-broadcast every
    :data:`BROADCAST_PERIOD_S`) and answers ``<p>._models.get`` as a worker does (silent when it holds nothing), so
    an actor starting up learns the writes even when every ingress and worker died at once (an OOM kill of the
    whole process group, a bug that takes them all): before, they came back serving what the repository folder
    says, a ``default`` or ``unload`` undone. The node's process runs no request, so it outlives its actors. A
    restart of ``inferbus up`` itself still starts from the repository folder (the pins are those of its files
    then: docs/models.md, "Pinned versions").
    """

    def __init__(self, subjects, who: str) -> None:
        self.subjects = subjects
        self.who = who
        self.states: dict[str, ModelState] = {}
        self.nc = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self, nc) -> None:
        """Subscribe (states, state requests) and learn, in the background, the states the live actors hold (a node
        joining a deployment whose writes were made before it started)."""
        self.nc = nc
        await nc.subscribe(self.subjects.model_state, cb=self._on_states)
        await nc.subscribe(self.subjects.model_state_get, cb=self._on_get)
        t = asyncio.ensure_future(self._learn())
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def take(self, st: ModelState) -> bool:
        """Keep ``st`` if it is a written state newer than the one kept for its model; returns whether it was."""
        if st.revision > 0 and _newer(st, self.states.get(st.model)):
            self.states[st.model] = st
            return True
        return False

    async def _learn(self) -> None:
        for st in await fetch_states(self.nc, self.subjects):
            self.take(st)

    async def _on_states(self, msg) -> None:
        for st in _states_in(msg):
            self.take(st)

    async def _on_get(self, msg) -> None:
        await answer_states(self.nc, msg, self.states, self.who, empty=False)


STALE_WRITE_MS = 2000.0
"""A model-management write sent longer ago than this (ms, plus the clock-skew allowance) when an ingress takes it is
refused UNAVAILABLE, not applied: it waited in a frozen or overloaded ingress's buffer, and later writes may have
been answered done meanwhile (a fresh-user trial: a ``default 2`` held by a SIGSTOPped ingress was applied when it
thawed, 9 s later, over an operator's ``default 1`` already answered done). Its client's retry is taken afresh."""


def _waited_ms(hdrs: dict) -> float | None:
    """How long ago (ms) the client sent this attempt: now minus (``Inferbus-Deadline-Unix-Ms`` −
    ``Inferbus-Timeout-Ms``), both set per attempt by the SDK and the CLI; None when either is missing or not a
    number as :func:`~inferbus.bus._headers.header_number` reads it, or infinite (a raw client that sends
    neither is not judged)."""
    d, t = hdrs.get(H.DEADLINE_UNIX_MS), hdrs.get(H.TIMEOUT_MS)
    if d is None or t is None:
        return None
    waited = time.time() * 1000.0 - (H.header_number(str(d)) - H.header_number(str(t)))
    return waited if math.isfinite(waited) else None


class IngressModels:
    """The ingress side: serving states, the write gate, and the model-management requests.

    Runs on the ingress's event loop. It changes the ingress's view of the repository
    (``ingress.repo.models[name]`` holds only the served versions, with the current default), so
    the hot path resolves versions exactly as before.
    """

    def __init__(self, ingress) -> None:
        self.ing = ingress
        self.subjects = ingress.subjects
        self.writer = ingress.config.ingress_id
        self.region = ingress.config.region
        self.disk: dict[str, Model] = dict(ingress.repo.models)
        """Every model as last read from its folder (all versions on disk)."""
        self.states: dict[str, ModelState] = {m.name: _initial_state(m, ingress.config.pins) for m in ingress.repo}
        for st in self.states.values():
            self._cache_tags(st)
        self.reports: dict[str, LoadReport] = {}
        self.region_hb: dict[str, tuple[float, RegionHeartbeat]] = {}
        self.writes = {"accepted": 0, "refused": 0, "stale": 0}
        self._apply_lock = asyncio.Lock()
        self._write_lock = asyncio.Lock()
        self._report_seen = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._catching_up = False
        self._caught_up_at = float("-inf")
        self._overridden: dict[tuple[str, int, str], ModelState] = {}
        """``(model, revision, writer)`` of states replaced by a rival of the same revision (a concurrent write
        taken by another ingress that won), and the state that replaced each: :meth:`_check_kept`."""
        self._ignored_logged: set[tuple[str, int]] = set()
        """``(model, revision)`` of states ignored because the model's folder could not be read, already logged."""
        self.nc = None

    # ---- start-up -------------------------------------------------------------------------------
    async def start(self, nc) -> None:
        """Subscribe (states, state requests, region heartbeats) and adopt the peers' current states."""
        self.nc = nc
        await nc.subscribe(self.subjects.model_state, cb=self._on_states)
        await nc.subscribe(self.subjects.model_state_get, cb=self._on_get)
        await nc.subscribe(self.subjects.region_heartbeats, cb=self._on_region_hb)
        for st in await fetch_states(nc, self.subjects):
            await self.apply(st)
        self._spawn(self._broadcaster())

    def _spawn(self, coro) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # ---- state --------------------------------------------------------------------------------
    async def apply(self, st: ModelState) -> bool:
        """Serve ``st`` if it is newer than the state known for its model; returns whether it was applied.

        Re-reads the model's folder when the state names a version (or model) not read yet. A state that names
        versions this ingress cannot read (not on this host's disk: nodes with other model folders on one NATS) is
        applied all the same, so that the writes this ingress takes build on it: it serves the versions it can read,
        and requests for the others get UNAVAILABLE from it (:attr:`Ingress.versions_not_here`, in health); if it
        cannot read the default, it serves the model not at all. Such a state used to be ignored: the ingress kept
        serving its old default, and a write it took then undid writes already answered done (a fresh-user trial).
        A state with no versions withdraws the model: requests naming it are NOT_FOUND (unknown model), it is not
        listed, and readiness no longer waits for it.
        """
        async with self._apply_lock:
            if not _newer(st, self.states.get(st.model)) or not self._serves(st.model):
                return False
            if not st.versions:  # not served at all (a failed load of a new model, undone)
                self._withdraw(st.model)
                self.ing.versions_not_here.pop(st.model, None)
                self._set_state(st)
                log(f"ingress {self.writer}: model {st.model} r{st.revision}: not served")
                return True
            m = self.disk.get(st.model)
            # a version served now whose folder was deleted since keeps the metadata read when it was loaded (its
            # workers hold it in memory; a restarted one reports it not served): it does not block writes to the model
            old = self.ing.repo.models.get(st.model)
            held = dict(old.versions) if old is not None else {}
            prev = self.states.get(st.model)
            repinned = [v for v in st.versions if prev is not None and v in st.digests and v in prev.digests
                        and st.digests[v] != prev.digests[v]]  # re-pinned: its metadata is read again
            # a version the state serves again after it was not served (unloaded, its files perhaps replaced, then
            # loaded): read again too, not taken from the scan kept from before (a fresh-user trial: the ingresses
            # that had not taken the load kept the old files' metadata for good, refusing valid requests)
            returning = [v for v in st.versions if prev is not None and v not in prev.versions and v in m.versions] \
                if m is not None else []
            scan_error = None
            if m is None or repinned or returning or any(v not in m.versions and v not in held for v in st.versions):
                try:
                    m = await asyncio.to_thread(self.ing.repo.scan_model, st.model,
                                                [v for v in st.versions if v not in held or v in repinned],
                                                st.config or None)
                except RepositoryError as exc:
                    scan_error, m = exc, None
                else:
                    self.disk[st.model] = m
            on_disk = m.versions if m is not None else {}
            versions = {v: on_disk[v] if v in on_disk else held[v] for v in st.versions if v in on_disk or v in held}
            missing = [v for v in st.versions if v not in versions]
            not_here = self.ing.versions_not_here
            if missing:
                why = (f"its folder cannot be read here: {' '.join(str(scan_error).split())}" if scan_error is not None
                       else f"not in this host's model folder (versions there: "
                            f"{', '.join(sorted(on_disk, key=_vkey)) or 'none'})")
                # once per state: the peers send their states again every 2 s (it was a line every 2 s for as long
                # as the folder stayed unreadable; a fresh-user trial)
                if (st.model, st.revision) not in self._ignored_logged:
                    self._ignored_logged.add((st.model, st.revision))
                    log(f"ingress {self.writer}: model {st.model} r{st.revision}: versions {missing} cannot be served "
                        f"here: {why}; this ingress answers their requests UNAVAILABLE")
                if st.default_version not in versions:  # nothing it serves would be the model as the state says
                    self._withdraw(st.model)
                    not_here[st.model] = {v: why for v in st.versions}
                    self._set_state(st)
                    return True
            try:
                config = _state_config(st, (m or self.ing.repo.models[st.model]).config)
            except (TypeError, ValueError) as exc:
                log(f"ingress {self.writer}: model state {st.model} r{st.revision} ignored: its config: {exc}")
                return False
            served = Model(dataclasses.replace(config, default_version=st.default_version), versions)
            ing = self.ing
            hedge = None
            old = ing.repo.models.get(st.model)
            if old is not None:
                hedge = ing._model_hedge.get(old.version(None).key)
            if st.config:  # the config the state carries: its hedge policy for every version (ModelConfig checked it)
                hedge = parse_policy(config.hedge_after_ms)
                for mv in versions.values():
                    ing._model_hedge[mv.key] = hedge
            # the request layouts learned so far were validated against the metadata replaced here (a re-pinned
            # version's files can take another datatype or shape): bodies of their lengths are decoded and checked
            # against the new metadata again (a user trial: a stale layout let a FP32 body reach an INT32 model,
            # answered INTERNAL and counted a server error of the worker, until its breaker opened)
            ing._layouts.forget(st.model)
            for mv in versions.values():
                ing._inputs[mv.key] = {t.name: t for t in mv.inputs}
                ing._outputs[mv.key] = {t.name for t in mv.outputs}
                ing._model_hedge.setdefault(mv.key, hedge)
            ing.repo.models[st.model] = served
            from ._ingress import model_metadata

            ing._meta_cache[st.model] = encode(model_metadata(served))
            if missing:
                not_here[st.model] = {v: why for v in missing}
            else:
                not_here.pop(st.model, None)
            self._set_state(st)
            log(f"ingress {self.writer}: model {st.model} r{st.revision}: versions {st.versions}, "
                f"default {st.default_version}", logging.INFO)
            return True

    def _withdraw(self, model: str) -> None:
        """Serve ``model`` not at all at this ingress (its layouts, metadata and repository entry go)."""
        self.ing._layouts.forget(model)
        self.ing.repo.models.pop(model, None)
        self.ing._meta_cache.pop(model, None)

    def _cache_tags(self, st: ModelState) -> None:
        """Set the result cache's version tag of each version of ``st`` (``ingress._cache_version``, ``name:version``
        → ``version@digest``, or the bare version when it is not pinned): cache keys and raw-index keys carry the
        pin, so a version re-pinned to new files (``models load``) never gets an answer of its old files from the
        L1 cache, the raw index or the shared L2 (a user trial: the old answers came back as hits for the model's
        whole ``cache_ttl_ms``), nor does a fill computed by the old files that arrives after the re-pin. A version
        whose pin changed is noted in ``ingress._repinned`` with its new pin: a worker still answering from the old
        files gives no fill for a request keyed with it (``Inferbus-Pin``; answers of the old files computed during
        the workers' reload were cached under the new pin, a fresh-user trial)."""
        tags, repinned = self.ing._cache_version, self.ing._repinned
        for v in st.versions:
            d = st.digests.get(v)
            key = f"{st.model}:{v}"
            tag = f"{v}@{d}" if d else v
            if d and (key in repinned or tags.get(key, tag) != tag):  # re-pinned while this ingress serves it
                repinned[key] = d
            elif not d:
                repinned.pop(key, None)
            tags[key] = tag

    def _set_state(self, st: ModelState) -> None:
        """Make ``st`` the model's state, noting a state of the same revision it replaces (a rival write lost); the
        model's versions it does not serve are retired (``Ingress._retire_forward_stats``): their latency windows
        leave the health's ``latency`` block (it listed an unloaded version for good) and hedging, their counts stay
        (Prometheus counters must not go backwards without a restart; a fresh-user trial saw an unload take a
        version's ``inferbus_model_request_success_total`` from 7 to 2)."""
        self._cache_tags(st)
        windows = self.ing._latency
        for k in [k for k in windows if k.rpartition(":")[0] == st.model and k.rpartition(":")[2] not in st.versions]:
            self.ing._retire_forward_stats(k)
        prev = self.states.get(st.model)
        if prev is not None and prev.revision == st.revision and prev.writer != st.writer:
            if len(self._overridden) >= 1000:
                self._overridden.clear()
            self._overridden[(prev.model, prev.revision, prev.writer)] = st
        self.states[st.model] = st

    async def _on_states(self, msg) -> None:
        for st in _states_in(msg):
            if _newer(st, self.states.get(st.model)):
                self._spawn(self.apply(st))

    async def _on_get(self, msg) -> None:
        # always answered, empty too: an asker that hears this ingress waits STATE_GATHER_S, not the full timeout
        await answer_states(self.nc, msg, self.states, f"ingress {self.writer}", empty=True)

    async def _broadcaster(self) -> None:
        while True:
            await asyncio.sleep(BROADCAST_PERIOD_S)
            items = [s for s in self.states.values() if s.revision > 0]
            if items:
                try:
                    await self.nc.publish(self.subjects.model_state, encode_internal(ModelStates(items)))
                except Exception as exc:
                    log(f"ingress {self.writer}: model state broadcast failed: {exc!r}")

    def _serves(self, model: str) -> bool:
        """False for a model outside this ingress's configured ``models`` (when it has such a list)."""
        only = self.ing.config.models
        return not only or model in only

    def on_report(self, r: LoadReport) -> None:
        """A worker's load report (the ingress's ``_on_load`` calls this). A worker that has applied a revision of a
        model above this ingress's state of it holds a write this ingress missed (it restarted while no other
        ingress was left to tell it): the states are asked for again (:meth:`_catch_up`), at most once every
        :data:`CATCH_UP_MIN_INTERVAL_S`."""
        self.reports[r.worker_id] = r
        self._report_seen.set()
        if r.model_revisions and not self._catching_up:
            states = self.states
            for model, rev in r.model_revisions.items():
                st = states.get(model)
                if st is not None and rev > st.revision and self._serves(model):
                    now = time.monotonic()
                    if now - self._caught_up_at >= CATCH_UP_MIN_INTERVAL_S:
                        self._catching_up = True
                        self._caught_up_at = now
                        self._spawn(self._catch_up())
                    break

    async def _catch_up(self) -> None:
        try:
            for st in await fetch_states(self.nc, self.subjects):
                await self.apply(st)  # applies only a newer state
        finally:
            self._catching_up = False

    # ---- write gate ---------------------------------------------------------------------------
    async def _on_region_hb(self, msg) -> None:
        try:
            hb = decode_region(msg.data)
        except RegionDecodeError:
            return
        if isinstance(hb, RegionHeartbeat):
            self.region_hb[hb.region] = (time.monotonic(), hb)

    def write_refusal(self, now: float | None = None) -> InferbusError | None:
        """None when model-management writes are accepted here, else the error to answer with.

        Accepted when this region's manager announced ``model_writes`` within
        :data:`REGION_HB_FRESH_S`, or when no region manager was ever heard (a single node), or, for an ingress
        in no region, none within :data:`REGION_HB_FORGET_S`.
        """
        if not self.region_hb:
            return None
        now = time.monotonic() if now is None else now
        if not self.region:  # a single node beside which a manager ran once: forgotten when long gone
            for region in [r for r, (t, _) in self.region_hb.items() if now - t > REGION_HB_FORGET_S]:
                del self.region_hb[region]
            if not self.region_hb:
                return None
        own = self.region_hb.get(self.region)
        if own is not None and now - own[0] <= REGION_HB_FRESH_S and own[1].model_writes:
            return None
        primaries = sorted(r for r, (t, hb) in self.region_hb.items()
                           if hb.role == PRIMARY and now - t <= REGION_HB_FRESH_S)
        if own is None:
            why = "no region manager of this region heard"
        elif now - own[0] > REGION_HB_FRESH_S:
            why = f"its region manager silent for {now - own[0]:.1f} s"
        else:
            why = f"region {self.region} is {own[1].role}"
        return Unavailable(f"model-management writes are accepted only in the primary region "
                           f"({', '.join(primaries) or 'none known now'}); this ingress is in region "
                           f"{self.region or '(none)'} ({why}); send the request to the primary region",
                           field="region", retry_after_ms=1000)

    # ---- requests -------------------------------------------------------------------------------
    def submit(self, msg, model: str, op: str) -> None:
        """Answer ``msg`` (``<p>.models.<model>.<op>``) in a task of its own: a load can take seconds and
        must not hold up the subscription's callback (metadata requests share it)."""
        self._spawn(self.handle(msg, model, op))

    async def handle(self, msg, model: str, op: str) -> None:
        """Answer one model-management request (``<p>.models.<model>.<op>``); never raises."""
        t0 = time.monotonic()
        hdrs = msg.headers or {}
        ct = H.query_content_type(hdrs)
        if not msg.reply:
            return
        try:
            if (problem := name_problem(model)) is not None:  # no repository holds such a folder: as the SDK says it
                raise InvalidArgument(problem, field="model")
            if op not in MODEL_OPS:
                raise NotFound(f"unknown model operation {op!r} (nor is it a version: versions are numbers, e.g. "
                               f"'1'); operations: {', '.join(MODEL_OPS)} (writes); reads: <model>, "
                               f"<model>.<version>, and either with .ready", field="op")
            req = decode(msg.data, ModelControlRequest, ct) if msg.data else ModelControlRequest()
            refused = self.write_refusal()
            if op != "load" and refused is None:  # a model not served is the answer, whatever the version (a
                self._known(model)  # load may add one; a standby region sends the write to the primary instead)
            v = req.version
            if type(v) is int and v >= 0:  # as config.json's default_version takes it (a fresh-user trial: refused)
                v = req.version = str(v)
            if (problem := version_problem(v)) is not None:  # a folder's name, as the SDK and the ingress say;
                raise InvalidArgument(problem, field="version")  # over 2**63 - 1 too (it was NOT_FOUND)
            if refused is not None:
                self.writes["refused"] += 1
                raise refused
            waited_ms = _waited_ms(hdrs)
            if waited_ms is not None and waited_ms > STALE_WRITE_MS + H.DEADLINE_SKEW_MS:
                self.writes["stale"] += 1
                raise Unavailable(f"this {op} of model {model!r} was sent {waited_ms / 1000:.1f} s before ingress "
                                  f"{self.writer} took it (a frozen or overloaded ingress held it); it is not applied, "
                                  f"as later writes may have been made since: check inferbus models and send it "
                                  f"again", field="model", retry_after_ms=0)
            deadline = H.deadline_from_headers(hdrs, t0, DEFAULT_BUDGET_MS)
            async with self._write_lock:
                if op == "load":
                    reply = await self._load(model, req.version, deadline)
                elif op == "unload":
                    reply = await self._unload(model, req.version, deadline)
                else:
                    reply = await self._default(model, req.version)
            self.writes["accepted"] += 1
            reply.elapsed_ms = round((time.monotonic() - t0) * 1000, 1)
            body = encode(reply, ct)
            await self.nc.publish(msg.reply, body, headers={
                H.CONTENT_TYPE: "application/json" if is_json(ct) else "application/msgpack"})
        except InferbusError as err:
            await self.ing._error(msg.reply, err, ct, None, endpoint="model")
        except Exception as exc:  # never let a request kill the actor
            log(f"ingress {self.writer}: model {op} {model} failed: {exc!r}")
            await self.ing._error(msg.reply, Internal(f"model {op} failed: {type(exc).__name__}: {exc}"), ct, None,
                                  endpoint="model")

    def _served(self, model: str) -> ModelState | None:
        """The serving state of ``model``; None when it is not served (never was, or withdrawn: no versions)."""
        st = self.states.get(model)
        return st if st is not None and st.versions else None

    def _known(self, model: str) -> ModelState:
        st = self._served(model)
        if st is None:
            raise NotFound(f"unknown model {model!r}; models: "
                           f"{', '.join(sorted(m for m in self.states if self._served(m))) or 'none'}", field="model")
        return st

    def _missing_loads(self, model: str, versions, now: float) -> tuple[set[str], set[str]]:
        """``(nowhere, partly)``: those of ``versions`` that no live worker serving ``model`` reports loaded, and
        those that some do and some do not (both empty when no worker is live: then nothing can be told). A ``load``
        loads both again: a version on one node's model folder only, served by its workers from the start, was
        "nothing to do" for ever, while the other node's workers had never tried it (a fresh-user trial)."""
        router = self.ing.router
        required = self._required(model, now)
        nowhere, partly = set(), set()
        for v in versions:
            have = [f"{model}:{v}" in router.workers[w].models for w in required]
            if have and not any(have):
                nowhere.add(v)
            elif have and not all(have):
                partly.add(v)
        return nowhere, partly

    def _required(self, model: str, now: float) -> list[str]:
        """Live workers serving some version of ``model`` (every live worker when none does)."""
        router = self.ing.router
        live = [w for w in router.workers.values() if router.live(w, now)]
        holding = [w.worker_id for w in live if any(k.rpartition(":")[0] == model for k in w.models)]
        return sorted(holding or [w.worker_id for w in live])

    async def _publish(self, st: ModelState, *, check: bool = True) -> None:
        """Apply ``st`` (this ingress's write) here, then broadcast it.

        Raises:
            Unavailable: ``check`` and a rival state of the same revision was applied here first (a concurrent
                write taken by another ingress that wins): nothing is broadcast (:meth:`_check_kept`).
        """
        await self.apply(st)
        if check:
            self._check_kept(st)
        await self.nc.publish(self.subjects.model_state, encode_internal(ModelStates([st])))

    def _check_kept(self, st: ModelState) -> None:
        """Raise when a concurrent write won over ``st`` (this ingress's write, published and waited for).

        Two ingresses that take writes for one model at the same time each publish the next revision of the
        state they know; every actor keeps the higher ``(revision, writer)``, so one write is lost whole. Its
        client was told it succeeded (a fresh-user trial: ``default 1`` and ``unload --version 1`` at once, both
        answered OK, and either one had no effect). Now the loser answers UNAVAILABLE naming the state that won:
        nothing of its change applies, and a retry is computed from the state that won (where it may then be
        refused: ``unload`` of what became the default, ``default`` of what was unloaded). A write whose rival's
        state reaches this ingress only after the wait is not detected (the window is a load report, ~100 ms,
        for ``default``; the workers' apply time for ``load`` and ``unload``).

        Raises:
            Unavailable: a state of ``st``'s revision from another writer replaced ``st`` here, or was here first
                and outranks it.
        """
        cur = self.states.get(st.model)
        won = self._overridden.get((st.model, st.revision, st.writer))
        if cur is not None and cur.revision == st.revision and cur.writer != st.writer:
            won = cur  # applied here before this write's own state could be (apply refused it as older)
        if won is not None:
            cur = won
            raise Unavailable(f"a concurrent change of model {st.model!r} (revision {cur.revision} by "
                              f"{cur.writer or 'the repository'}: versions {', '.join(cur.versions) or 'none'}, "
                              f"default "
                              f"{cur.default_version or '-'}) won over this one (revision {st.revision}), so none of "
                              f"this change applies; check inferbus models and retry", field="model",
                              retry_after_ms=100)

    def _next(self, model: str, versions, default: str, digests: dict[str, str] | None = None,
              config: dict | None = None) -> ModelState:
        """The next state of ``model``; ``digests`` (version → digest) default to the current state's pins of those
        versions (a write other than a (re-)load keeps every version's pin), ``config`` to the current state's."""
        cur = self.states.get(model)
        if digests is None:
            digests = dict(cur.digests) if cur else {}
        if config is None:
            config = dict(cur.config) if cur else {}
        versions = sorted(versions, key=_vkey)
        # above any revision a worker reports applied, too: a write numbered at or below what the workers hold
        # would be ignored by them and still be answered as done
        held = max((r.model_revisions.get(model, 0) for r in self.reports.values()), default=0)
        return ModelState(model, max(cur.revision if cur else 0, held) + 1, self.writer, versions, default,
                          {v: digests[v] for v in versions if v in digests}, config)

    def pin_failures(self, key: str, now: float) -> dict[str, str]:
        """Live workers that do not serve model version ``key`` because its files are not the pinned ones, with each
        one's reason (from their load reports; empty when none)."""
        router = self.ing.router
        out = {}
        for wid, r in self.reports.items():
            why = r.load_errors.get(key)
            if why is None or not why.startswith(PIN_ERROR_PREFIX) or key in r.models:
                continue
            w = router.workers.get(wid)
            if w is not None and router.live(w, now):
                out[wid] = why[len(PIN_ERROR_PREFIX):]
        return out

    def version_problems(self, now: float) -> dict[str, dict]:
        """Served model versions that some live worker does not serve because of their files (pin failures):
        ``{key: {"ready": whether another live worker serves it, "workers": {worker id: reason}}}``."""
        ready = self.ing.router.ready_models(now)
        out = {}
        for m in self.ing.repo:
            for mv in m.versions.values():
                why = self.pin_failures(mv.key, now)
                if why:
                    out[mv.key] = {"ready": mv.key in ready, "workers": why}
        return out

    async def _wait_applied(self, workers: list[str], model: str, revision: int, deadline: float, writer: str = ""
                            ) -> dict[str, LoadReport | None]:
        """Wait until each worker reports the state ``(revision, writer)`` of ``model`` applied, or a later one (a
        state of the same revision by a higher writer id is later: :func:`_applied`); None: gone or out of time."""
        router = self.ing.router
        out: dict[str, LoadReport | None] = {}
        pending = set(workers)
        while pending:
            now = time.monotonic()
            for wid in list(pending):
                r = self.reports.get(wid)
                w = router.workers.get(wid)
                if r is not None and _applied(r, model) >= (revision, writer):
                    out[wid] = r
                    pending.discard(wid)
                elif w is None or not router.live(w, now):
                    out[wid] = None
                    pending.discard(wid)
            if not pending or now >= deadline:
                break
            self._report_seen.clear()
            try:
                await asyncio.wait_for(self._report_seen.wait(), min(0.2, max(deadline - now, 0.001)))
            except asyncio.TimeoutError:
                pass
        for wid in pending:
            out[wid] = None
        return out

    async def _load(self, model: str, version: str | None, deadline: float) -> ModelControlReply:
        if not self._serves(model):
            raise NotFound(f"model {model!r} is not among the models this deployment serves "
                           f"({', '.join(sorted(self.ing.config.models))})", field="model")
        try:
            m = await asyncio.to_thread(self.ing.repo.scan_model, model,
                                       None if version is None else (version,))
        except (ModelConfigError, ModelArtifactError) as exc:  # the folder is there, its config.json or a
            # model.onnx is not servable: nothing changes (it was NOT_FOUND for an unreadable model.onnx)
            raise InvalidArgument(f"model {model!r} cannot be loaded: {exc}", field="model") from None
        except RepositoryError as exc:
            raise NotFound(str(exc), field="model") from None
        self.disk[model] = m
        if version is not None and version not in m.versions:
            raise NotFound(f"model {model!r} has no version {version!r} in the repository; on disk: "
                           f"{', '.join(sorted(m.versions, key=_vkey)) or 'none'}", field="version")
        cur = self._served(model)
        served = set(cur.versions) if cur else set()
        asked = {version} if version is not None else set(m.versions)
        # the files as they are now: a new version is pinned to them; a served one whose files changed is re-pinned
        # (loaded again from them everywhere, as Triton's load of a loaded model reloads it). Off the loop: this
        # reads every asked version's files once
        disk = await asyncio.to_thread(_disk_digests, m, sorted(asked))
        pins = dict(cur.digests) if cur else {}
        repin = {v for v in asked & served if v in disk and pins.get(v) != disk[v]}
        # announced but loaded by no live worker (its load failed after the budget ran out, or at start-up, or its
        # files changed everywhere): it is loaded again, never "nothing to do"
        nowhere, partly = self._missing_loads(model, asked & served, time.monotonic())
        todo = sorted((asked - served) | nowhere | partly | repin, key=_vkey)
        # config.json as it is now: a change (cache_ttl_ms, hedge_after_ms, max_batch_size, ...) is carried to every
        # actor in the new state, as Triton's load of a loaded model reads its config again; it was never applied
        # (changed: false), and an actor restarted after the edit served it alone (a fresh-user trial)
        config = config_fields(m.config)
        now = self.ing.repo.models.get(model)
        was = cur.config if cur is not None and cur.config else (config_fields(now.config) if now else config)
        reconfigured = _served_fields(config) != _served_fields(was)
        if not todo and not reconfigured:
            return ModelControlReply(model, "load", list(cur.versions), cur.default_version, cur.revision,
                                     version=version, changed=False)
        default = cur.default_version if cur else (m.default_version if m.default_version in todo else todo[-1])
        required = self._required(model, time.monotonic())
        st = self._next(model, served | set(todo), default, {**pins, **{v: disk[v] for v in todo if v in disk}},
                        config)
        await self._publish(st)
        done = await self._wait_applied(required, model, st.revision, deadline, st.writer)
        self._check_kept(st)  # a rival write of this revision won: UNAVAILABLE, and nothing of it is undone here
        keys = [f"{model}:{v}" for v in todo]
        workers: dict[str, str] = {}
        loaded_somewhere = {k: False for k in keys}
        timed_out = []
        superseded = []
        for wid, r in done.items():
            if r is None:  # gone while it loaded, or (the budget spent) still loading
                now = time.monotonic()
                w = self.ing.router.workers.get(wid)
                live = w is not None and self.ing.router.live(w, now)
                if live and now >= deadline:
                    timed_out.append(wid)
                    workers[wid] = "still loading"
                else:  # a worker restarted meanwhile is live again, with the budget left: it was gone, not slow (a
                    # fresh-user trial: DEADLINE_EXCEEDED after 2.3 s of a 30 s budget, a worker killed mid-load)
                    workers[wid] = ("restarted during the load (it loads the serving state as it starts)" if live
                                    else "gone (not live)")
                continue
            failed = [f"{k}: {r.load_errors[k]}" for k in keys if k in r.load_errors and k not in r.models]
            absent = [k for k in keys if k not in r.models and k not in r.load_errors]
            for k in keys:
                if k in r.models:
                    loaded_somewhere[k] = True
            rev, who = _applied(r, model)
            if absent and (rev, who) > (st.revision, st.writer):
                # neither loaded nor failed under a later state than this write's: a concurrent write that won (its
                # state may not have reached this ingress yet), or a later one
                superseded.append(wid)
                workers[wid] = f"serves revision {rev} by {who} without {', '.join(absent)}"
            elif failed or absent:
                workers[wid] = "failed: " + "; ".join(failed + [f"{k}: not loaded" for k in absent])
            else:
                workers[wid] = "loaded" if keys else "config applied"
        if timed_out:
            raise DeadlineExceeded(f"load of {', '.join(keys)} not finished within the request's budget on "
                                   f"{', '.join(timed_out)}; "
                                   f"they keep loading (see inferbus models)")
        dead = [k for k, ok in loaded_somewhere.items() if not ok and required]
        latest = self.states.get(model)
        replaced = latest is not None and (latest.revision, latest.writer) != (st.revision, st.writer)
        if superseded or (dead and replaced):
            # another write's state is served now: undoing this one would write over it (a fresh-user trial, two
            # loads at once through two ingresses: the loser's undo withdrew the winner's version, whose client
            # had been told it was loaded, or both were undone, each answered "no worker could load")
            now_st = latest if replaced else None
            what = (f" (revision {now_st.revision} by {now_st.writer or 'the repository'}: versions "
                    f"{', '.join(now_st.versions) or 'none'}, default {now_st.default_version or '-'})"
                    if now_st is not None else "")
            raise Unavailable(f"a concurrent change of model {model!r}{what} replaced this load (revision "
                              f"{st.revision}) before the workers finished it ({_by_worker(workers)}), so it is not "
                              f"known to "
                              f"apply; check inferbus models and retry", field="model", retry_after_ms=100)
        if dead:
            # no required worker could load it: undo the write (requests would find no worker, readiness would wait
            # for it, and a retry would be "nothing to do"); the versions of this load that did load are dropped too
            # a re-pin of a version that was served somewhere: undone to its old pin, which those workers still hold
            back = self._undo(model, cur, [k for k in dead if k.rpartition(":")[2] not in repin - nowhere])
            await self._publish(back, check=False)
            after = (f"serving versions {', '.join(back.versions)}, default {back.default_version}" if back.versions
                     else f"model {model!r} not served")
            raise Internal(f"no worker could load {', '.join(dead)}: {_by_worker(workers)}; the load was undone: "
                           f"{after} "
                           f"(revision {back.revision})", field="version")
        self._check_kept(st)
        return ModelControlReply(model, "load", list(st.versions), st.default_version, st.revision,
                                 version=version, workers=workers)

    def _undo(self, model: str, before: ModelState | None, dead: list[str]) -> ModelState:
        """The state that undoes a failed load: ``before`` (None: not served) less the ``dead`` keys (announced,
        loaded by no worker: a retried load failed again). A dead default stays while other versions are served (the
        user chooses another default, then unloads it); alone, the model is not served at all."""
        if before is None:
            return self._next(model, [], "")
        keep = [v for v in before.versions if f"{model}:{v}" not in dead]
        if not keep:
            return self._next(model, [], "")
        if before.default_version not in keep:
            keep.append(before.default_version)
        return self._next(model, keep, before.default_version, dict(before.digests), dict(before.config))

    async def _unload(self, model: str, version: str | None, deadline: float) -> ModelControlReply:
        cur = self._known(model)
        if version is None:
            raise InvalidArgument("unload needs a version (the request's \"version\"; --version V in the CLI)",
                                  field="version")
        if version not in cur.versions:
            raise NotFound(f"model {model!r} does not serve version {version!r}; served: {', '.join(cur.versions)}",
                           field="version")
        rest = [v for v in cur.versions if v != version]
        if version == cur.default_version and rest:
            raise InvalidArgument(f"version {version} is the default of {model!r}; make another version the "
                                  f"default first (inferbus models default {model} V), or unload the others first "
                                  f"(unloading a model's last version stops serving the model)", field="version")
        required = self._required(model, time.monotonic())
        # the last version: the model is withdrawn (a state with no versions, as a failed load of a new model is
        # undone): NOT_FOUND, unlisted, readiness no longer waits for it; `load` serves it again
        st = self._next(model, rest, cur.default_version) if rest else self._next(model, [], "")
        await self._publish(st)
        done = await self._wait_applied(required, model, st.revision, deadline, st.writer)
        workers = {wid: ("drained" if r is not None else "gone or still draining") for wid, r in done.items()}
        self._check_kept(st)
        return ModelControlReply(model, "unload", list(st.versions), st.default_version, st.revision,
                                 version=version, workers=workers)

    async def _default(self, model: str, version: str | None) -> ModelControlReply:
        cur = self._known(model)
        if version is None:
            raise InvalidArgument("default needs a version", field="version")
        if version not in cur.versions:
            raise NotFound(f"model {model!r} does not serve version {version!r}; served: {', '.join(cur.versions)} "
                           f"(load it first)", field="version")
        if version == cur.default_version:
            return ModelControlReply(model, "default", list(cur.versions), cur.default_version, cur.revision,
                                     version=version, changed=False)
        now = time.monotonic()
        key = f"{model}:{version}"
        required = self._required(model, now)
        router = self.ing.router
        missing = [wid for wid in required if key not in router.workers[wid].models]
        failed = {wid: r.load_errors[key] for wid in missing if (r := self.reports.get(wid)) is not None
                  and key in r.load_errors}
        if missing and len(failed) == len(missing):  # not "yet": each of them tried and reported why it cannot
            raise Internal(f"{key} cannot be made the default: it is not loaded on {', '.join(sorted(failed))}, "
                           f"which could not "
                           f"load it: {'; '.join(f'{w}: {why}' for w, why in sorted(failed.items()))} (a retry "
                           f"cannot help: fix those workers' model folders, then load it again)", field="version")
        if not required or missing:
            raise Unavailable(f"{key} is not loaded on every live worker serving {model!r} yet (missing on "
                              f"{missing or 'every worker: none is live'}); retry once its load finished",
                              field="version", retry_after_ms=100)
        st = self._next(model, cur.versions, version)
        await self._publish(st)
        # the workers apply it within a load report or two (100 ms each); meanwhile a concurrent write taken by
        # another ingress, if any, has reached this one too
        await self._wait_applied(required, model, st.revision, time.monotonic() + _SETTLE_S, st.writer)
        self._check_kept(st)
        return ModelControlReply(model, "default", list(st.versions), st.default_version, st.revision,
                                 version=version, workers={wid: "loaded" for wid in required})


class WorkerModels:
    """The worker side: loads and drains model versions as the serving states say, off the serving loop.

    Loading (repository read, session creation, precision check, warm-up) runs in a thread; the
    session is published to the worker's tables only when ready. Draining marks the version so that
    new requests for it are answered NOT_FOUND, waits until none of its requests is queued or
    running, then drops the session.
    """

    def __init__(self, worker) -> None:
        self.w = worker
        self.subjects = worker.subjects
        self.states: dict[str, ModelState] = {}
        self.applied: dict[str, tuple[int, str]] = {}
        """Per model: ``(revision, writer)`` of the state whose loads and drains have all finished (reported to the
        ingresses)."""
        self.draining: set[str] = set()
        """``name:version`` keys being drained: new requests for them are refused (NOT_FOUND)."""
        self.parked: dict[str, tuple[object, str]] = {}
        """Key → ``(session, digest)`` of a version whose re-pin (a state naming another digest for it) failed here:
        not served (its files are not the pinned ones); served again if a later state pins it back (the write
        undone)."""
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task] = set()
        self.nc = None

    async def start(self, nc) -> None:
        """Subscribe to the states and apply the peers' current ones (before READY); then answer the peers' state
        requests too (an ingress restarted with no other ingress left learns the writes from the workers)."""
        await nc.subscribe(self.subjects.model_state, cb=self._on_states)
        for st in await fetch_states(nc, self.subjects):
            self._take(st)
        self.nc = nc
        await nc.subscribe(self.subjects.model_state_get, cb=self._on_get)

    async def _on_get(self, msg) -> None:
        # nothing to tell: silent (the asker waits for the ingresses' answers, not for this)
        await answer_states(self.nc, msg, self.states, f"worker {self.w.config.worker_id}", empty=False)

    def refusal(self, model_key: str) -> NotFound | None:
        """NOT_FOUND for a request naming a version this worker does not serve (or is draining)."""
        if model_key in self.w.sessions and model_key not in self.draining:
            return None
        return NotFound(f"model version {model_key} is not served by worker {self.w.config.worker_id} "
                        f"(unloaded or not loaded)", field="model_version")

    async def _on_states(self, msg) -> None:
        for st in _states_in(msg):
            self._take(st)

    def _take(self, st: ModelState) -> None:
        if self.w.config.models and st.model not in self.w.config.models:
            return  # this worker serves a configured subset of the models
        if _newer(st, self.states.get(st.model)):
            self.states[st.model] = st
            self._note_repins(st.model)  # at once: a version re-pinned away from this session's files fills no cache
            t = asyncio.ensure_future(self._apply(st.model))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _apply(self, model: str) -> None:
        lock = self._locks.setdefault(model, asyncio.Lock())
        async with lock:
            st = self.states[model]
            done = self.applied.get(model, (-1, ""))
            if done[0] >= st.revision and st.revision > 0 and self._in_line(st):
                # nothing to load or drain; a state of the same content by another writer is still reported as
                # applied (two identical writes at once: the winner's ingress waited for its own writer id for good)
                if (st.revision, st.writer) > done:
                    self.applied[model] = (st.revision, st.writer)
                return
            w = self.w
            pins = {f"{model}:{v}": d for v, d in st.digests.items()}
            want = {f"{model}:{v}" for v in st.versions}
            for k in [k for k in self.parked if k.rpartition(":")[0] == model]:
                if k in want and pins.get(k) == self.parked[k][1]:  # pinned back (a failed re-pin undone): serve it
                    w.sessions[k] = self.parked.pop(k)[0]
                    w.load_errors.pop(k, None)
                elif k not in want or (pins.get(k) and pins[k] != self.parked[k][1]):
                    self.parked.pop(k)  # unloaded, or pinned to yet other files: dropped
                    if k not in want:
                        self._forget(k)
            have = {k for k in w.sessions if k.rpartition(":")[0] == model}
            mb = st.config.get("max_batch_size") if w.config.max_batch_size is None else None
            if isinstance(mb, int) and not isinstance(mb, bool):  # a config change carried by `models load`: merging
                for k in have & want:  # follows at once (JAX's compiled sizes at the version's next load), unless
                    w.max_batch[k] = w.batch_limit(k, mb)  # its rows cannot be merged (then never)
            # served here from other files than the state pins (re-pinned by `models load`): loaded again
            repin = {k for k in want & have if pins.get(k) and w.digests.get(k) != pins[k]}
            await asyncio.gather(*[self._load(model, k, pins.get(k)) for k in sorted(want - have)],
                                 *[self._load(model, k, pins[k], replace=True) for k in sorted(repin)],
                                 *[self._drain(k) for k in sorted(have - want)])
            for k in [k for k in w.load_errors if k.rpartition(":")[0] == model and k not in want]:
                del w.load_errors[k]  # a version no longer served: its failure is no longer news
            self._note_repins(model)
            self.applied[model] = (st.revision, st.writer)

    def _note_repins(self, model: str) -> None:
        """Keep the worker's ``repinning`` for ``model``: the versions it serves from other files than the newest
        serving state pins (a re-pin received and loading; answers of their sessions fill no result cache, see
        :meth:`Worker._fill_current`). Called when a state arrives and when a session is swapped."""
        w = self.w
        st = self.states.get(model)
        w.repinning.difference_update([k for k in w.repinning if k.rpartition(":")[0] == model])
        if st is not None:
            w.repinning.update(k for v, d in st.digests.items()
                               if (k := f"{model}:{v}") in w.sessions and w.digests.get(k) != d)

    def _in_line(self, st: ModelState) -> bool:
        have = {k for k in self.w.sessions if k.rpartition(":")[0] == st.model}
        if have != {f"{st.model}:{v}" for v in st.versions}:
            return False
        return all(self.w.digests.get(f"{st.model}:{v}") == d for v, d in st.digests.items())

    def _forget(self, key: str) -> None:
        for table in (self.w.versions, self.w.max_batch, self.w.row_problems, self.w._bytes_inputs, self.w._specs,
                      self.w.digests):
            table.pop(key, None)
        self.w.forget_answer_rows(key)

    def _open(self, model: Model, version: str, max_batch: int):
        """Blocking (a thread): ``(model version, session, why its rows cannot be merged or None)`` for
        ``model``/``version``, precision-checked and warmed up at the batch sizes ``max_batch`` allows
        (:meth:`Worker.batch_limit`; 1 when its rows cannot be merged)."""
        w = self.w
        mv = model.versions[version]
        sess = load_checked(w.backend, mv.path, precision=w.config.precision, device_kind=w.config.device_kind,
                            device_index=w.config.device_index, reference_path=model.data_path(w.repo.root))
        problem = rows_problem(sess)
        sess.warmup(batch_buckets(max_batch) if max_batch > 1 and problem is None else (1,))
        return mv, sess, problem

    async def _load(self, model: str, key: str, pinned: str | None = None, replace: bool = False) -> None:
        """Load version ``key`` off the loop and publish it to the worker's tables; never raises.

        Its files are checked against ``pinned`` (the digest the serving state names; None: not pinned) before the
        session is created, and must not have changed by the time it is ready. A failure is reported in
        ``load_errors`` (a pin failure prefixed :data:`PIN_ERROR_PREFIX`). With ``replace`` (a re-pin: the version is
        served here from other files), the new session replaces the old one once ready; if it fails, the old one is
        parked (not served: it is not the pinned version) until a state pins it back.
        """
        w = self.w
        version = key.rpartition(":")[2]
        w.load_errors.pop(key, None)
        t0 = time.monotonic()
        read = None  # the version's metadata, once read
        try:
            files = await asyncio.to_thread(check_pin, model, version, w.repo.root / model / version, pinned)
            st = self.states.get(model)
            m = await asyncio.to_thread(w.repo.scan_model, model, (version,), st.config if st and st.config else None)
            if version not in m.versions:
                raise RepositoryError(f"no version {version} of {model} on disk here (versions there: "
                                      f"{', '.join(sorted(m.versions, key=_vkey)) or 'none'})")
            read = m.versions[version]
            mb = w.config.max_batch_size if w.config.max_batch_size is not None else m.config.max_batch_size
            mv, sess, problem = await asyncio.to_thread(self._open, m, version, mb)
            if not await asyncio.to_thread(files.unchanged):
                raise ModelPinError(f"model {model!r} version {version}: files changed while being loaded "
                                    f"({w.repo.root / model / version}); not served")
        except Exception as exc:  # ModelPinError, ModelLoadError, RepositoryError, a runtime error: reported, not fatal
            w.load_errors[key] = f"{type(exc).__name__}: {exc}{bf16_hint(read, exc)}"
            log(f"worker {w.config.worker_id}: load {key} failed: {exc}")
            if replace and key in w.sessions:
                self.parked[key] = (w.sessions.pop(key), w.digests.get(key, ""))
            return
        w.repo.models[model] = m
        w.digests[key] = files.digest
        w.versions[key] = mv
        w.max_batch[key] = w.batch_limit(key, mb, problem)
        w.note_answer_rows(key, sess)
        w._bytes_inputs[key] = {t.name for t in mv.inputs if t.datatype == "BYTES"}
        w._specs[key] = {t.name: t for t in mv.inputs}
        w.sessions[key] = sess  # last: from here on requests for it are accepted
        self._note_repins(model)  # in the same loop step: the new session's answers fill the cache again
        if w.device is None:
            w.device = sess.device
        log(f"worker {w.config.worker_id}: loaded {key} at {sess.precision} in {(time.monotonic() - t0) * 1000:.0f} ms", logging.INFO)

    def _busy(self, key: str) -> bool:
        """Some request for ``key`` is queued, joined or running (read on the loop)."""
        w = self.w
        if any(j.model_key == key for j in list(w.by_seq.values())):
            return True
        if any(j.model_key == key for j in list(w.in_progress.values())):
            return True
        if any(j.model_key == key for j in list(w._inline)):  # queued for inline execution on the loop
            return True
        with w.mailbox.mutex:
            return any(j.model_key == key for j in w.mailbox.queue)

    async def _drain(self, key: str) -> None:
        w = self.w
        self.draining.add(key)
        t0 = time.monotonic()
        while self._busy(key) and time.monotonic() - t0 < DRAIN_TIMEOUT_S:
            await asyncio.sleep(0.01)
        sess = w.sessions.pop(key, None)
        self._forget(key)
        self.draining.discard(key)
        if sess is not None:
            try:
                sess.close()
            except Exception:
                pass
        log(f"worker {w.config.worker_id}: unloaded {key} (drained in {(time.monotonic() - t0) * 1000:.0f} ms)", logging.INFO)
