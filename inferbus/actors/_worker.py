"""The accelerator worker actor: one per device slot, in its own OS process.

Receives requests forwarded by an ingress on its worker-direct subject
(``<p>._w.<worker_id>``), keeps them in a bounded mailbox, runs the model on a
dedicated inference thread (off the event loop), and replies straight to the
client's reply subject. After replying it tells the forwarding ingress which
requests completed (``<p>._done.<ingress>``), off the hot path.

Inline execution: a model version whose EWMA compute time per request is at most
``inline_max_compute_us`` (CPU ONNX Runtime sessions only) runs on the event loop
instead, which saves both directions of the thread hand-off. Those requests wait
in a loop-side queue that counts toward the same mailbox bound; the loop runs
them in slices of about ``INLINE_SLICE_US`` of estimated compute and yields
between slices, so receiving, load reports, cancellations and the stall tick are
never starved. Everything below (deadline checks, dedupe, cancellation, audit,
zero-wait batching, accounting) is the same code on either path; each answer's
``parameters.exec`` says which one ran it (``inline`` or ``thread``).

Mailbox and backpressure: ``mailbox_size`` requests at most; one more is shed at
once with RESOURCE_EXHAUSTED. Deadlines: a request whose budget
(``Inferbus-Timeout-Ms``, rewritten by the ingress) is spent on arrival, or when
compute takes it from the mailbox, is answered DEADLINE_EXCEEDED
before anything else is done with it (not even decoding): the model never
starts for an expired request. A request whose deadline passes *during* compute
is still answered (the client may have gone; the reply is then dropped by NATS).

Deduplication (:mod:`inferbus.actors._dedupe`): a request id seen again (an SDK
retry, a hedge, a caller's own retry) with the same body is computed once per
worker: a duplicate joins the queued or running computation, or is answered
from the recent results. The model runs once, every copy gets the same answer.

Cancellation: an ingress that got a hedge's first answer withdraws the other
copy (``Cancel`` on ``<p>._ctl.<worker_id>``); a copy not yet started is
dropped without running the model and without a reply.

Health: the load report (every ``report_interval_ms``) carries queue depth,
in-flight count, EWMA service time, loaded models and the error rate over a
sliding window of ``health_window_s`` seconds. Only the worker's own failures
(INTERNAL) count; client errors, expired and shed requests do not.

Zero-wait batching (DESIGN §4): when several requests for the same model version
and outputs are already queued, they run as one batch (up to the model's
``max_batch_size`` rows in all) without waiting for more. Requests are merged only when
every input of each request has the same leading (batch) dimension, and the
result is split back only when every output has the summed batch size;
otherwise they run one by one, so rows can never cross between requests.
"""

from __future__ import annotations

import asyncio
import logging
import collections
import math
import os
import queue
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import msgspec

from ..accelerators import (BackendUnavailable, InferenceError, ModelLoadError, batch_buckets, get_backend, load_checked,
                            rows_problem)
from ..bus import (BusyPoll, Subjects, close_connection, connected_server, header_block, publish_raw, reply_block,
                   send_pending)
from ..bus import headers as H
from ..bus._subjects import MAX_NAME_BYTES
from ..schemas import (
    DeadlineExceeded, InferbusError, InferResponse, Internal, InvalidArgument, PayloadTooLarge, ResourceExhausted, Unavailable,
    answers_raw, decode_request, encode_response, input_to_numpy, is_json, output_from_numpy,
)
from ..schemas._tensors import datatype_mismatch, numpy_dtype
from ..schemas._internal import (
    FORWARD_TAG, Cancel, DoneItem, DoneNotice, FaultSet, InternalDecodeError, LoadReport, decode_internal,
    encode_internal,
)
from .._version import __version__
from ._common import (announce_ready, connect_logged, drain_endpoint, endpoint_subscription, error_message, log,
                      run_actor, serving_gc, set_affinity, supervise_loops)
from ._fencing import Fencing
from ._flight import LOOP_SLOT, THREAD_SLOT, FlightRecorder
from ._layout import RequestLayouts
from ._config import WorkerConfig
from ._dedupe import RecentResults, dedupe_key
from ._models import WorkerModels
from ._modelstats import RunStats, fold_runs
from ._pinning import PIN_ERROR_PREFIX, check_pin, version_files
from ._repository import ModelPinError, ModelRepository, ModelStartError, bf16_hint

_EWMA_ALPHA = 0.2
STOP_CLOSE_DRAIN_S = 1.0
"""Graceful stop, last step: the drain of the worker's own connection (its control and model subscriptions, the
last replies and completion notices flushed to the server) gets at most this long (s) before the close
(:func:`inferbus.bus.close_connection`); nats-py's ``Client.drain()`` had 30 s and its flush 10 s more."""
DEDUP_HEADER = "Inferbus-Dedup"
"""Set on a reply that was not computed for this copy of the request: ``join`` or ``hit``."""
CANCELLED = "CANCELLED"
_HEADER_ALLOWANCE = 2048
"""Bytes reserved for NATS protocol and headers when checking a reply against max_payload: the reply's headers are
``Content-Type``, the request id (at most :data:`~inferbus.schemas.MAX_REQUEST_ID_CHARS` characters, 1 KiB in UTF-8)
and a few short ones of ours."""
_DONE_ITEM_BYTES = 64
"""Upper bound of a :class:`DoneItem`'s encoding without its response body (msgpack array of 7 fields)."""
_DONE_NOTICE_BYTES = 256
"""Upper bound of a :class:`DoneNotice`'s encoding without its items (tag, worker id)."""
_STOP_THREAD_JOIN_S = 0.5
"""How long a stopping worker waits for its inference thread to end its model run (s): within the node's 5 s
shutdown timeout, after a drain of ``drain_timeout_s`` (3 s by default)."""
INLINE_SLICE_US = 1000.0
"""Estimated compute (Σ EWMA µs per request) the loop runs inline before it yields; at least one request. The
colocated ingress bounds a burst it holds back by the same slice (``Ingress._defer``)."""
INLINE_MAX_JOBS = 256
"""Requests taken into one inline slice at most (the thread's zero-wait batch takes as many); also the most
requests a colocated ingress holds back in one burst."""
INLINE_BODY_FLOOR_BYTES = 4096
INLINE_BODY_CEIL_BYTES = 65536
"""A request body larger than ``min(CEIL, max(FLOOR, 16 rows' raw bytes + 1 KiB))`` of its model never runs inline
(:func:`inline_max_body_bytes`): the inline decision prices a request by its model's EWMA per request, which small
requests set, so a request of 30,000 rows (7.7 MB) of a model priced at 100 µs ran on the event loop for 1.9-4.7 s on
the 2-core box, the worker sent no load report meanwhile, its ingress counted it gone and the SDK retried the request
elsewhere (a user trial). On the inference thread it blocks nothing."""
_INLINE_SEED_RUNS = 3
"""Batch-1 runs timed after warm-up to seed a model's compute EWMA (the least of them)."""
PRICE_CLIP_X = 4.0
"""One run's CPU time per request enters a model's compute EWMA (the inline price) at most this many times the
EWMA's value (a clipped, "winsorized" sample), so that one slow run (a first run of a new shape, page faults, a
hyperthread sibling busy on a loaded host: 1-2 ms for a model priced at 30-60 µs on the 2-core CI box) does not
send the model's small requests to the thread for the next runs. A model that really became slower still crosses
:attr:`WorkerConfig.inline_max_compute_us`: the EWMA grows by up to ``1 + α(X - 1)`` = 1.6 × a run (α = 0.2)."""


_BLOCK_ENDS = ("NATS/1.0\r\n", "\r\n")


_HELD_CODES = frozenset({"RESOURCE_EXHAUSTED", "UNAVAILABLE"})
"""Refusals before compute that a hedge-marked copy leaves to its ingress (see ``Worker._finish_now``)."""
_HEDGE_MARKS = frozenset({"primary", "copy"})


def control_subject(prefix: str, worker_id: str) -> str:
    """``<p>._ctl.<worker_id>``: cancellations from ingresses, fault injection from drills."""
    return f"{prefix}._ctl.{worker_id}"


class _Abandoned(Exception):
    """A chunked request given up between two chunks (:meth:`Worker._infer_chunked`): ``outcome`` answers it."""

    def __init__(self, outcome: "Outcome") -> None:
        super().__init__(outcome.code)
        self.outcome = outcome


class _Stopping(Exception):
    """Raised on the inference thread between two chunks of a large request once the worker stops
    (:meth:`Worker._infer_chunked`): the batch is dropped (its requests were answered UNAVAILABLE when the drain
    ended), and the thread ends instead of starting another model run while the process exits."""


class Job(msgspec.Struct):
    """One request at this worker, from the bus (:meth:`Worker._on_request`) or handed over in-process by the
    colocated ingress (:meth:`Worker.submit_local`). The forward's fields are parsed once, on receipt.

    A ``msgspec.Struct`` (never encoded) rather than a dataclass: its ``__init__`` is C, half the cost of a
    slotted dataclass's generated one for these 27 fields, on every request."""

    reply: str
    body: bytes
    """The client's original request body (the dedupe key hashes it; decoded at compute unless ``decoded``)."""
    deadline: float
    """Monotonic deadline (s); extended to a joined duplicate's when later."""
    t_recv: float
    model_key: str
    seq: int
    ingress: str | None
    want_body: bool
    cache_key: str | None = None
    ct: str | None = None
    """The client's ``Content-Type`` (JSON or msgpack answers)."""
    rid: str | None = None
    """``Inferbus-Request-Id`` as forwarded (the body's id when the client sent no header); dedupe, replies, audit."""
    hedge: str | None = None
    """``Inferbus-Hedge`` mark of the forward (``primary`` / ``copy``), None when not hedge-eligible."""
    term: int | None = None
    """Fencing term stamped by the ingress; None when absent (or malformed: served, as without regions)."""
    wall_deadline_ms: float | None = None
    """Absolute deadline (wall clock, ms since the epoch) set by the ingress; None when absent."""
    timings: str | dict | None = None
    """The ingress's stages in µs: the ``name=µs,...`` string of a bus forward, or a dict (in-process forward,
    owned by this job: the answer's ``timings_us`` is built in it)."""
    decoded: tuple | None = None
    """``(InferRequest, [numpy array per input])`` the colocated ingress decoded and validated already: the
    worker does not decode the body again (``worker_decode`` is 0). None for requests from the bus."""
    dkey: tuple | None = None
    """Deduplication key (None: the request has no id)."""
    joined: list["Job"] | None = None
    """Duplicates that wait for this job's result."""
    cancelled: bool = False
    decode_us: int = 0
    """Time the compute thread spent decoding the request body (the ``decode`` stage)."""
    fwd_unix: float = 0.0
    """Wall-clock time (s) the ingress forwarded it (deadline - budget), 0 when unknown."""
    forward_hop_us: int = -1
    """Ingress forward → this worker's receive (wall clocks, µs; the ``forward_hop`` stage), -1 when unknown."""
    inline: bool = False
    """Computed on the event loop (True) or the inference thread (``parameters.exec``)."""
    local: bool = False
    """Handed over in-process by a colocated ingress (``parameters.forward`` = ``local``), not from the bus."""
    alone: bool = False
    """Run in a model run of its own (``Inferbus-Alone: 1``: a worker that crashed was running it)."""
    pin: str | None = None
    """``Inferbus-Pin`` of a bus forward: the pin (digest) the ingress keyed the request's cache entry with, sent for
    a version re-pinned since that ingress started; the answer fills the cache only when this worker's session was
    loaded from those files (:meth:`Worker._fill_current`). None when absent (and for in-process jobs, whose
    ingress's pins the worker reads itself)."""
    trace: object = None
    """Tracing on and the forward sampled: the parent of its worker span, made when its outcome is published (the
    forward's ``(traceparent, tracestate)`` strings, parsed only then, or the colocated ingress's
    :class:`~inferbus.actors._tracing.Traced`); else None."""
    answered: bool = False
    """Its outcome was published, or it was refused UNAVAILABLE because the worker stopped before finishing it
    (:meth:`Worker._refuse_held`): a later outcome (the inference thread's late result) is dropped, so no copy
    is answered twice (loop thread only)."""

    def targets(self) -> list["Job"]:
        """This job and its joined duplicates."""
        return [self] + self.joined if self.joined else [self]

    def live(self) -> bool:
        """Some copy of the request still wants the answer."""
        return not self.cancelled or bool(self.joined and any(not j.cancelled for j in self.joined))


class Outcome(msgspec.Struct):
    """A job's answer, built on the compute side and published by :meth:`Worker._publish_outcomes` (a
    ``msgspec.Struct`` for its C ``__init__``, like :class:`Job`)."""

    job: Job
    hdrs: dict
    body: bytes
    ok: bool
    server_error: bool = False
    service_us: int = 0
    response_msgpack: bytes | None = None
    executed: bool = False
    """The model ran for this request (audit)."""
    code: str = ""
    """Error code when not ok; CANCELLED: dropped before compute, nobody is answered."""
    retry: bool = False
    """The job expired or was cancelled before compute: joined duplicates still in budget are queued again."""
    held: bool = False
    """Not replied to the client: the ingress answers (a hedge-marked copy shed or refused, see ``_finish_now``)."""
    block: bytes | None = None
    """``hdrs`` as a header block, built with the result (:func:`inferbus.bus.reply_block`); None for errors."""


@dataclass
class _Stats:
    received: int = 0
    completed: int = 0
    errors: int = 0
    input_failures: int = 0
    """Requests the model failed on while it ran its warm-up input: answered INVALID_ARGUMENT, no worker fault."""
    shed: int = 0
    expired: int = 0
    in_flight: int = 0
    ewma_service_us: float = 0.0
    computed: int = 0
    batches: int = 0
    """Model runs (``computed`` / ``batches`` is the mean batch size)."""
    dedup_hits: int = 0
    dedup_joins: int = 0
    cancelled: int = 0
    stalls: int = 0
    """Times this process was found frozen for longer than ``stall_fence_s``."""
    stall_fenced: int = 0
    """Requests refused because the process was frozen after they were forwarded."""
    decoded: int = 0
    """Request bodies decoded for compute (requests handed over decoded by a colocated ingress are not)."""
    stop_refused: int = 0
    """Requests (joined copies included) answered UNAVAILABLE because the drain of a graceful stop ended
    before they were computed (:meth:`Worker._refuse_held`)."""
    chunked: int = 0
    """Large requests run in chunks of ``chunk_rows`` rows (:meth:`Worker._infer_chunked`)."""
    served_between_chunks: int = 0
    """Small requests computed between two chunks of a large one (:meth:`Worker._serve_waiting`)."""
    too_large_before_compute: int = 0
    """Requests refused PAYLOAD_TOO_LARGE before their model ran: the fixed-size outputs of their rows alone were
    over ``max_payload`` (:meth:`Worker._answer_too_large`)."""


class _ErrorWindow:
    """Requests and server-side failures per one-second bucket over the last ``window_s`` seconds.

    One writer thread per window, no lock: the worker keeps one for the inference thread and one for the loop
    (inline execution), and the loop reads both (:meth:`totals`; a bucket being reset by the other thread at
    that moment can be read half-reset, an error of one second's counts in a health statistic).
    """

    def __init__(self, window_s: float) -> None:
        self.n = max(int(window_s), 1)
        self.reqs = [0] * self.n
        self.errs = [0] * self.n
        self.secs = [-1] * self.n

    def add(self, now: float, requests: int, errors: int) -> None:
        sec = int(now)
        i = sec % self.n
        if self.secs[i] != sec:
            self.secs[i], self.reqs[i], self.errs[i] = sec, 0, 0
        self.reqs[i] += requests
        self.errs[i] += errors

    def totals(self, now: float) -> tuple[int, int]:
        sec = int(now)
        r = e = 0
        for i in range(self.n):
            if sec - self.secs[i] < self.n:
                r += self.reqs[i]
                e += self.errs[i]
        return r, e


class Worker:
    """The worker actor. ``run()`` serves until cancelled or SIGTERM (drain)."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self._tracing = None
        """The process's :class:`~inferbus.actors._tracing.Tracing` with ``trace_otlp_endpoint``, else None (and
        OpenTelemetry is not imported)."""
        if config.trace_otlp_endpoint:
            from ._tracing import tracing_for

            self._tracing = tracing_for(config.trace_otlp_endpoint, config.trace_ratio, config.worker_id)
        self.subjects = Subjects(config.bus.prefix)
        self._audit_headers = header_block({H.WORKER_ID: config.worker_id})  # on each <p>._audit batch
        self.load_errors: dict[str, str] = {}
        self.digests: dict[str, str] = {}
        """Model key → digest of the files its session was loaded from (:mod:`._pinning`; read on the loop)."""
        self.repinning: set[str] = set()
        """Model keys this worker serves from other files than its serving state pins (a re-pin loading, or failed):
        their answers fill no cache (:meth:`_fill_current`; kept by :class:`~inferbus.actors._models.WorkerModels`)."""
        self.local_pins: dict[str, str] = {}
        """The colocated ingress's pins of re-pinned versions (its ``_repinned``, shared): what it keys their cache
        entries with (:meth:`_fill_current`); empty without a colocated ingress."""
        files, need = self._check_pins(config)
        self.repo = ModelRepository(config.models_dir, list(config.models) or None, need, config.configs)
        for name, why in self.repo.unreadable.items():  # (pinned only) a model folder that cannot be read any more
            for key in config.pins:
                if key.rpartition(":")[0] == name:
                    self.load_errors.setdefault(key, why)
        self.backend = get_backend(config.backend)
        self.sessions = {}
        self.versions = {}
        self.max_batch: dict[str, int] = {}
        self.row_problems: dict[str, str] = {}
        """Model key → why its requests are never merged or cut by rows (:func:`~inferbus.accelerators.rows_problem`),
        whatever its ``max_batch_size`` says: set when its session is loaded."""
        for model in self.repo:
            for mv in model.versions.values():
                if need is not None and mv.key not in files:
                    continue  # not pinned (on disk, not served: `models load` loads it) or its files changed
                if mv.key not in files:
                    try:
                        files[mv.key] = version_files(mv.path.parent)
                    except (OSError, ModelPinError) as exc:
                        self.load_errors[mv.key] = f"{PIN_ERROR_PREFIX}model {mv.name!r} version {mv.version}: {exc}"
                        continue
                # precision checked against FP32 on the model's reference rows; FP32 fallback (accelerators)
                try:
                    sess = load_checked(self.backend, mv.path, precision=config.precision,
                                        device_kind=config.device_kind, device_index=config.device_index,
                                        reference_path=model.data_path(self.repo.root))
                except ModelLoadError as exc:  # not served here; the router routes only to workers that loaded it
                    self.load_errors[mv.key] = str(exc)
                    log(f"worker {config.worker_id}: not serving {mv.key}: {exc}")
                    continue
                except BackendUnavailable:
                    raise
                except Exception as exc:  # e.g. reference rows the repository's check cannot see into (a bad CRC)
                    raise ModelStartError(_start_failure(mv, exc)) from exc
                mb = config.max_batch_size if config.max_batch_size is not None else model.config.max_batch_size
                mb = self.batch_limit(mv.key, mb, rows_problem(sess))
                try:
                    sess.warmup(batch_buckets(mb) if mb > 1 else (1,))
                except Exception as exc:  # e.g. a model that cannot take the batch sizes of its max_batch_size
                    sizes = f" at batch sizes up to {mb}" if mb > 1 else " at batch size 1"
                    raise ModelStartError(_start_failure(mv, exc, sizes)) from exc
                if not files[mv.key].unchanged():  # replaced while it was loaded: what was loaded is not known
                    self.load_errors[mv.key] = (f"{PIN_ERROR_PREFIX}model {mv.name!r} version {mv.version}: files "
                                                f"changed while being loaded ({mv.path.parent}); not served")
                    log(f"worker {config.worker_id}: not serving {mv.key}: {self.load_errors[mv.key]}")
                    continue
                self.sessions[mv.key] = sess
                self.versions[mv.key] = mv
                self.max_batch[mv.key] = mb
                self.digests[mv.key] = files[mv.key].digest
        self.device = next(iter(self.sessions.values())).device if self.sessions else None
        self._layouts = RequestLayouts()
        """(model key, body length) → the layout of a MessagePack request from the bus this worker decoded and
        checked: a later body that differs only in its tensors' raw bytes is taken apart by slicing. Each is
        tagged with the spec dict it was checked against; a load replaces that dict, and the layout is relearned."""
        self._bytes_inputs = {k: {t.name for t in mv.inputs if t.datatype == "BYTES"} for k, mv in self.versions.items()}
        self._specs = {k: {t.name: t for t in mv.inputs} for k, mv in self.versions.items()}
        self._answer_row_bytes: dict[str, int] = {}
        """Model key → :func:`answer_row_bytes` of its session, for a model version whose answers it bounds (> 0)."""
        self._answer_limit = 0
        """The bus's ``max_payload`` less the header allowance (bytes) as last read (:meth:`_note_answer_limit`: at
        the connect and at each load report, since a reconnect can reach a server with another one); 0: none known."""
        self._answer_max_rows: dict[str, int] = {}
        """Model key → the most rows whose answer's known outputs fit :attr:`_answer_limit` (``limit //
        answer_row_bytes``): a request of more rows has :meth:`_answer_too_large` look closer before compute. The one
        compare per request (its rows against this; a version without an entry is never refused early); rebuilt
        when a version is loaded or the limit read changes."""
        for k, sess in self.sessions.items():
            self.note_answer_rows(k, sess)
        self.compute_ewma_us: dict[str, float] = {}
        """Model key → EWMA of compute µs per request, in thread CPU time (the runtime runs on the calling thread
        with one intra-op thread), so that being preempted on a busy host does not look like a slow model.
        The inline decision reads it; written by the loop and the inference thread."""
        self._inline_capable = frozenset(
            k for k, sess in self.sessions.items()
            if config.inline_max_compute_us > 0 and config.backend == "onnxruntime" and sess.device.kind == "cpu")
        self._inline_max_bytes = {k: inline_max_body_bytes(self.versions[k]) for k in self._inline_capable}
        """Model key → the largest request body (bytes) that may run inline (:data:`INLINE_BODY_CEIL_BYTES`)."""
        for k in self._inline_capable:  # seed the EWMA so the first request already takes the right path
            self.compute_ewma_us[k] = _time_batch1_us(self.sessions[k])
        self.mailbox: queue.Queue[Job] = queue.Queue()
        """The inference thread's queue; unbounded as a queue, the mailbox bound is checked in ``_enqueue``
        over it and ``_inline`` together."""
        self._inline: collections.deque[Job] = collections.deque()
        """Requests for models that run on the loop, oldest first (loop thread only)."""
        self._inline_waiter: asyncio.Future | None = None
        """The future the inline pump waits on while ``_inline`` is empty; ``_enqueue`` resolves it (one wake-up
        per batch, not an Event's set and clear per request)."""
        self.stats = _Stats()
        self._runs: list[tuple[str, int, int]] = []
        """Model runs not yet folded into :attr:`run_stats`: ``(model key, requests, compute µs)``, appended by
        :meth:`_account` (loop or inference thread), folded at every ``$SRV.STATS`` answer and load report
        (:func:`fold_runs`)."""
        self.run_stats: dict[str, RunStats] = {}
        """Model version → its runs' batch-size and compute-duration histograms (``--metrics-port``)."""
        self._last_tick = time.monotonic()
        self._stall_end_unix = 0.0
        self._stats_lock = threading.Lock()
        self._stop = threading.Event()
        self.nc = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._outbox: asyncio.Queue | None = None
        self.window = _ErrorWindow(config.health_window_s)  # written by the inference thread
        self.window_inline = _ErrorWindow(config.health_window_s)  # written by the loop (inline execution)
        self.recent = RecentResults(config.dedupe_ttl_s, config.dedupe_max_entries, config.dedupe_max_bytes)
        self.in_progress: dict[tuple, Job] = {}
        """Dedupe key → the queued or running job (loop thread only)."""
        self.by_seq: dict[tuple[str, int], Job] = {}
        """(ingress, seq) → job, for cancellation (loop thread only)."""
        self.fault = FaultSet(error_rate=config.inject_error_rate, compute_delay_ms=config.compute_delay_ms)
        self.flight = FlightRecorder(config.flight_record_path) if config.flight_record_path else None
        """What each model run holds, for the node to read after a crash (:mod:`inferbus.actors._flight`)."""
        self._rng = random.Random()
        self.fencing = Fencing(self.subjects)
        """Current fencing term; requests stamped with an older one are refused (UNAVAILABLE)."""
        self.model_ctl = WorkerModels(self)
        """Model management: loads and drains model versions as the serving states say."""
        self._local_ingress_id: str | None = None
        self._local_done = None
        """Colocated ingress: its id and the coroutine function that takes its completion notices in-process."""
        self.local_done_notices = 0
        """Completion batches settled at the colocated ingress in-process (no notice, no NATS message)."""
        self._thread_busy = False
        self._batch_t0 = 0.0
        """``time.monotonic()`` when the inference thread took its current batch (0: never)."""
        self._batch_deadline = 0.0
        """Latest monotonic deadline among the current batch's requests."""
        """The inference thread is computing a batch (written by that thread, read by the loop)."""
        self._batch_jobs: list[Job] = []
        """The inference thread's current (or last) batch (written by that thread, read by the loop when a
        drain ends: :meth:`_refuse_held`); it takes in the requests taken from the mailbox between two chunks of a
        large request (:meth:`_serve_waiting`)."""
        self._held_back: list[Job] = []
        """Requests the inference thread took from the mailbox between two chunks of a large request and did not
        compute then (not small): the thread's next batch, before the mailbox (thread only; its length is read by
        the load report)."""
        self._draining = False
        """A graceful stop began (SIGUSR1 from the node, or SIGTERM): the infer subscription is drained and the
        load reports say ``draining`` (routers send this worker nothing more)."""
        self._infer_sub = None
        """The bus ``infer`` endpoint's subscription, once subscribed: its backlog (``pending_msgs``) goes in the
        load reports (``LoadReport.backlog_msgs``)."""
        self._drain_task: asyncio.Future | None = None
        self._drain_began = 0.0
        """``time.monotonic()`` when the graceful stop's drain began (:meth:`_start_drain`)."""
        self.busy_poll = (BusyPoll(config.busy_poll_us, pause=self.thread_has_work) if config.busy_poll_us > 0
                          else None)
        """Keeps the loop polling after each request (``busy_poll_us``), except while the inference thread has
        work (a spinning loop would keep the GIL from it); a colocated ingress pokes it too."""

    def _check_pins(self, config: WorkerConfig) -> tuple[dict, dict[str, set[str]] | None]:
        """Check each pinned version's files (``config.pins``) before anything is loaded; blocking (reads them).

        Returns:
            ``(files, need)``: the :class:`VersionFiles` of each pinned version whose files are unchanged, and the
            versions to read per model (None when nothing is pinned: every version on disk is read, as before).
            A version whose files changed or are missing is not in either; its reason is in :attr:`load_errors`
            (prefixed :data:`PIN_ERROR_PREFIX`) and it is not served here.
        """
        if not config.pins:
            return {}, None
        files, need = {}, {}
        for key, pinned in config.pins.items():
            name, _, version = key.rpartition(":")
            if config.models and name not in config.models:
                continue
            try:
                files[key] = check_pin(name, version, Path(config.models_dir) / name / version, pinned)
            except ModelPinError as exc:
                self.load_errors[key] = f"{PIN_ERROR_PREFIX}{exc}"
                log(f"worker {config.worker_id}: not serving {key}: {exc}")
                continue
            need.setdefault(name, set()).add(version)
        return files, need

    def thread_has_work(self) -> bool:
        """Whether the inference thread is computing or has requests queued (the busy poller then lets it run)."""
        return self._thread_busy or not self.mailbox.empty()

    def attach_local_ingress(self, ingress_id: str, on_done) -> None:
        """Settle completions for ``ingress_id`` by awaiting ``on_done(items)`` instead of publishing notices.

        For a colocated ingress in the same process and event loop (:mod:`inferbus.actors._colocated`).
        ``on_done`` takes the list of :class:`DoneItem` of one publishing pass (what a ``DoneNotice`` would
        carry, without the notice); an exception it raises is logged and does not reach the worker's pumps.
        """
        self._local_ingress_id = ingress_id
        self._local_done = on_done

    # ---- loop side -------------------------------------------------------------------------
    async def _on_request(self, msg) -> None:
        """A request forwarded over the bus (``<p>._w.<worker_id>``): its routing fields are parsed once into a
        :class:`Job` (``Inferbus-Fwd``, or the older ten-header form), then admitted by :meth:`_admit`.

        A message with neither form is answered INVALID_ARGUMENT (naming ``headers.Inferbus-Fwd``).
        """
        t_recv = time.monotonic()
        if self.busy_poll is not None:
            self.busy_poll.poke(t_recv)
        reply = msg.reply
        if not reply:
            return
        hdrs = msg.headers or {}
        self.stats.received += 1
        fwd = hdrs.get(H.FWD)
        if fwd is not None:  # the one-header form the ingress sends
            parts = H.fwd_fields(fwd, hdrs)
            if parts is None:
                await self._publish_error(reply, InvalidArgument(
                    f"header {H.FWD} must be '{H.FWD_VERSION};' followed by 9 ';'-separated fields",
                    field=f"headers.{H.FWD}"), hdrs.get(H.CONTENT_TYPE))
                return
            seq_s, ingress, model, version, timeout_s, dl_s, term_s, key, timings = parts
        elif hdrs.get(H.MSG_TYPE) == FORWARD_TAG:  # the ten-header form (older ingresses) keeps its tag
            seq_s, ingress, model, version, timeout_s, dl_s, term_s, key, timings = [
                hdrs.get(name) for name in H.FWD_FIELDS]
        else:
            await self._publish_error(reply, InvalidArgument(
                f"worker subjects take messages with a {H.FWD}: {H.FWD_VERSION};... header "
                f"(or tagged {H.MSG_TYPE}: {FORWARD_TAG})", field=f"headers.{H.FWD}"), hdrs.get(H.CONTENT_TYPE))
            return
        if ingress is not None and len(ingress) > MAX_NAME_BYTES:
            # no ingress has such an id (a message not from one): its completion notice (<p>._done.<ingress>) could be
            # a line over the server's max_control_line, which closes this worker's connection; it gets none
            ingress = None
        try:
            seq = int(seq_s) if seq_s is not None else -1
        except ValueError:
            seq = -1
        term = None
        if term_s is not None:
            try:
                term = int(term_s)
            except ValueError:
                pass  # malformed: served, as a request without a term
            if term is not None and not 0 <= term < 1 << 63:  # no election reaches it; the answer could not carry it
                term = None
        wall_ms = None
        fwd_unix = 0.0
        if dl_s is not None:
            try:
                wall_ms = float(dl_s)
                if not math.isfinite(wall_ms):  # "inf", "nan", "1e309": malformed, as a forward without one
                    wall_ms = None
                elif timeout_s is not None:  # when the ingress forwarded it: deadline minus the budget it sent
                    fwd_unix = (wall_ms - float(timeout_s)) / 1000.0
                    if not math.isfinite(fwd_unix):
                        fwd_unix = 0.0
            except ValueError:
                pass
        job = Job(reply, msg.data, t_recv + H.budget_ms(timeout_s) / 1000.0, t_recv, f"{model or ''}:{version or ''}",
                  seq, ingress, key is not None, key, hdrs.get(H.CONTENT_TYPE), hdrs.get(H.REQUEST_ID),
                  hdrs.get(H.HEDGE), term, wall_ms, timings)
        if fwd_unix > 0:
            job.fwd_unix = fwd_unix
            job.forward_hop_us = int((time.time() - fwd_unix) * 1e6)
        if H.ALONE in hdrs:
            job.alone = True
        if H.PIN in hdrs:
            job.pin = hdrs[H.PIN]
        if self._tracing is not None:
            job.trace = self._tracing.worker_parent(hdrs)
        await self._admit(job)

    async def submit_local(self, reply: str, body: bytes, decoded: tuple, model_key: str, seq: int, ingress: str,
                           deadline: float, wall_deadline_ms: float, t_fwd: float, term: int | None,
                           cache_key: str | None, ct: str | None, rid: str | None, hedge: str | None,
                           timings: dict, trace=None) -> None:
        """Take a request forwarded in-process by the colocated ingress, as the ingress already holds it.

        Nothing is encoded or parsed back: ``decoded`` is ``(InferRequest, [numpy array per input, in the
        request's order])`` as the ingress decoded and validated it against the same model metadata (the body
        is not decoded again), and the forward's fields come as values. Admitted by the same
        :meth:`_admit` as a request from the bus (stall fence, deadline, fencing term, model refusal, dedupe
        by request id, mailbox bound), answered on ``reply`` over NATS with ``parameters.forward`` = ``local``.

        Args:
            reply: the client's reply subject.
            body: the original request body (the dedupe key hashes it, as for a bus forward).
            decoded: see above; the tuple and its arrays are not modified.
            model_key: ``name:version``.
            seq, ingress: the forward's sequence number and the forwarding ingress's id (cancellation, notices).
            deadline: the ingress's deadline, ``time.monotonic()`` seconds (same process, same clock).
            wall_deadline_ms: the same deadline on the wall clock, ms since the epoch (the ``Inferbus-Fwd`` field).
            t_fwd: ``time.monotonic()`` when the ingress forwarded it (the ``forward_hop`` stage, the stall fence).
            term: the fencing term stamped, None when none is known.
            cache_key: the result's cache key when the ingress wants the encoded answer for its caches, else None.
            ct, rid, hedge: the client's Content-Type, the request id as forwarded, the hedge mark (or None).
            timings: the ingress's stages in µs (``decode``, ``validate``, ``cache``, ``route``,
                ``ingress_total``); the job owns the dict: the answer's ``timings_us`` is built in it.
            trace: the ingress's span to be (:class:`~inferbus.actors._tracing.Traced`) when tracing is on and the
                request sampled: the parent of this job's worker span; else None.

        Returns once the request is queued or answered (it does not wait for compute).
        """
        t_recv = time.monotonic()
        self.stats.received += 1
        job = Job(reply, body, deadline, t_recv, model_key, seq, ingress, cache_key is not None, cache_key, ct, rid,
                  hedge, term, wall_deadline_ms, timings, decoded)
        job.local = True
        job.fwd_unix = wall_deadline_ms / 1000.0 - (deadline - t_fwd)
        job.forward_hop_us = int((t_recv - t_fwd) * 1e6)
        if trace is not None:
            job.trace = trace
        await self._admit(job)

    def dedupe_key(self, model_key: str, request_id: str, body: bytes) -> tuple:
        """The dedupe key of a request for ``model_key`` here (:func:`~inferbus.actors._dedupe.dedupe_key`), with the
        digest of the files this worker serves that version from: an id sent again after a re-pin is another
        request."""
        return dedupe_key(model_key, request_id, body, self.digests.get(model_key))

    def can_run_now(self, model_key: str, term: int | None, dkey: tuple | None = None, nbytes: int = 0) -> bool:
        """Whether a request for ``model_key`` handed over in-process may run to completion at once
        (:meth:`run_now`): nothing waits here to be batched with it or to go before it (the inline queue and
        the inference thread's mailbox empty, the thread idle), the model runs inline, no fault is injected,
        no audit record is kept, this loop was not just frozen (stall fence), neither the fencing term nor
        model management refuses it, and no copy of the request (dedupe key ``dkey``, None without a request
        id) is in progress or answered here (those go through :meth:`submit_local`'s dedupe), and its body of
        ``nbytes`` bytes is small enough to run inline (:func:`inline_max_body_bytes`). Cheap: attribute reads and
        a few table lookups.
        """
        return self._idle_now() and self._may_run_now(model_key, term, dkey, nbytes)

    def _idle_now(self) -> bool:
        """:meth:`can_run_now`'s checks that do not depend on the request: nothing queued here or running on
        the inference thread, no fault injected, no audit record kept, the stall fence down."""
        fault = self.fault
        fence = self.config.stall_fence_s
        return (not self._inline and not self._thread_busy and not self.mailbox.queue  # len read: no lock needed
                and fault.error_rate <= 0 and not fault.shed and not self.config.audit
                and (fence <= 0 or time.monotonic() - self._last_tick <= fence))

    def _may_run_now(self, model_key: str, term: int | None, dkey: tuple | None, nbytes: int) -> bool:
        """:meth:`can_run_now`'s checks of one request: its model runs inline and is served here, its body of
        ``nbytes`` is small enough to, its fencing term is not refused, and no copy of it is in progress or
        answered here."""
        if not (self._runs_inline(model_key, nbytes) and self.fencing.refusal_term(term) is None
                and self.model_ctl.refusal(model_key) is None):
            return False
        return dkey is None or (dkey not in self.in_progress and self.recent.get(dkey) is None)

    async def run_now(self, reply: str, body: bytes, decoded: tuple, model_key: str, deadline: float,
                      wall_deadline_ms: float, t_fwd: float, term: int | None, cache_key: str | None,
                      ct: str | None, rid: str | None, dkey: tuple | None, timings: dict) -> Outcome:
        """Compute one request the colocated ingress hands over when :meth:`can_run_now` says so, on the loop,
        now: the same compute, accounting and answer as a batch of one from the inline queue
        (:meth:`_run_group`; ``parameters.exec`` ``inline``, ``batch_size`` 1), published and written at
        once, without the queue, in-flight tracking or a completion item; the caller settles it. A result
        with a request id is kept for retries (dedupe, under ``dkey``) before anything is awaited. Arguments as
        for :meth:`submit_local`.

        Returns:
            The :class:`Outcome`, answered (``ok`` False: a typed error reply went, e.g. the model failed).

        Raises:
            DeadlineExceeded: the budget ran out before compute; nothing was answered.
            PayloadTooLarge: its answer's fixed-size outputs alone would be over ``max_payload``
                (:meth:`_answer_too_large`); the model did not run, nothing was answered.
            InferbusError: the request does not fit this worker's view of the model (a safety net, see
                :meth:`_prepare_local`); nothing was answered.
        """
        t_recv = time.monotonic()
        self.stats.received += 1
        job = Job(reply, body, deadline, t_recv, model_key, -1, None, cache_key is not None, cache_key, ct, rid,
                  None, term, wall_deadline_ms, timings, decoded, forward_hop_us=int((t_recv - t_fwd) * 1e6),
                  inline=True, local=True)
        if deadline <= t_recv:  # the rest of the budget went between the ingress's check and here
            self.stats.expired += 1
            raise DeadlineExceeded("budget spent before the worker received the request")
        req, arrays = self._prepare_local(job)
        if (m := self._answer_max_rows.get(model_key)) is not None and req.inputs[0].shape[0] > m and \
                (err := self._answer_too_large(model_key, req)) is not None:
            raise err  # refused before compute, as a request that does not fit (the ingress answers it)
        sess = self.sessions[model_key]
        flight = self.flight
        if flight is not None:  # the ingress dies with this process: the request itself, for the node to pass on
            flight.note(model_key, rid or "", body)
        t0 = time.monotonic()
        cpu0 = time.thread_time()
        try:  # a batch of one: what _run_group does for one item, without its lists (the common miss, unloaded)
            res = sess.infer(arrays, [o.name for o in req.outputs] if req.outputs else None)
        except InferenceError as exc:
            res = exc
        finally:
            if flight is not None:
                flight.clear_loop()
        t1 = time.monotonic()
        compute_us = int((t1 - t0) * 1e6)
        self._account(model_key, 1, compute_us, (time.thread_time() - cpu0) * 1e6)
        if not isinstance(res, Exception):
            try:
                o = self._encode(job, req, self.versions[model_key], res, t0, compute_us, 1)
                self.stats.completed += 1
            except InferbusError as err:  # an output the wire cannot carry
                o = self._error_outcome(job, err)
            self.window_inline.add(t1, 1, 0)
        else:
            o = self._model_failure(job, req, sess, res)
            self.window_inline.add(t1, 1, int(o.server_error))
        # the answer's tail, as _answer_in_call + _write_answers give it to a burst, written out here: this is the
        # lone miss's path, and the calls cost it bytecodes (+1.2 % per miss; docs/performance.md, fourteenth session)
        limit = (self.nc.max_payload or 0) - _HEADER_ALLOWANCE
        if o.ok and limit > 0 and len(o.body) > limit:
            self._too_large(o)
        if o.ok and dkey is not None:
            self.recent.put(dkey, o.hdrs, o.body)
        if o.ok and o.block is not None:  # what _reply does for a good answer, without its call
            try:
                await publish_raw(self.nc, reply, o.body, headers=o.block, flush=False)
            except Exception as exc:  # e.g. a connection problem: the client's timeout covers it
                log(f"worker {self.config.worker_id}: reply failed: {exc!r}")
        else:
            await self._reply(o, reply, o.hdrs)
        try:
            await send_pending(self.nc)
        except Exception as exc:  # the client's timeout covers a reply that could not be sent
            log(f"worker {self.config.worker_id}: reply write failed: {exc!r}")
        return o

    async def run_burst(self, entries: list) -> list[Outcome | None]:
        """Compute requests the colocated ingress deferred while more requests waited in its subscription (a
        burst), on the loop, now, as batches: the same checks, compute and answers as :meth:`run_now` gives one
        request, with requests of one model (and the same requested outputs) merged into model runs of up to
        ``max_batch_size`` rows (``parameters.exec`` ``inline``, ``batch_size`` the run's size). Every answer is
        published, then all leave in one write. No queue, in-flight tracking or completion item; the caller
        settles each.

        Args:
            entries: objects with ``reply``, ``body``, ``decoded``, ``model_key``, ``deadline`` (monotonic s),
                ``dl_ms`` (wall-clock deadline, ms), ``t_fwd`` (when the ingress handed it over, monotonic s),
                ``term``, ``cache_key``, ``ct``, ``worker_rid``, ``dkey`` and ``stages`` (the ingress's µs by
                stage; owned by the answer), as the ingress's ``_Deferred``.

        Returns:
            One item per entry, in order: its :class:`Outcome` (answered; ``ok`` False: a typed error reply went,
            e.g. DEADLINE_EXCEEDED when the budget ran out during the burst), or None when this worker may not
            run it now (:meth:`can_run_now` changed during the burst: queued work here, a fault set, a fencing
            term or model refusal); nothing was answered for those, and the caller queues them.
        """
        t_recv = time.monotonic()
        out: list[Outcome | None] = [None] * len(entries)
        max_rows = self._answer_max_rows
        groups: dict[tuple, list] = {}
        where: dict[int, int] = {}  # id(job) -> index in entries
        errors = []
        if not self._idle_now():  # e.g. the loop ran other work during the burst and something is queued
            return out
        for i, e in enumerate(entries):
            if not self._may_run_now(e.model_key, e.term or None, e.dkey, len(e.body)):
                continue
            self.stats.received += 1
            job = Job(e.reply, e.body, e.deadline, t_recv, e.model_key, -1, None, e.cache_key is not None,
                      e.cache_key, e.ct, e.worker_rid, None, e.term or None, e.dl_ms, e.stages, e.decoded)
            job.local = job.inline = True
            job.forward_hop_us = int((t_recv - e.t_fwd) * 1e6)
            if e.deadline <= t_recv:
                self.stats.expired += 1
                errors.append((i, self._error_outcome(job, DeadlineExceeded(
                    "budget spent before the worker received the request"))))
                continue
            try:
                req, arrays = self._prepare_local(job)
            except InferbusError as err:
                errors.append((i, self._error_outcome(job, err)))
                continue
            if (m := max_rows.get(e.model_key)) is not None and req.inputs[0].shape[0] > m and \
                    (err := self._answer_too_large(e.model_key, req)) is not None:
                errors.append((i, self._error_outcome(job, err)))
                continue
            where[id(job)] = i
            outs = tuple(o.name for o in req.outputs) if req.outputs else ()
            groups.setdefault((e.model_key, outs), []).append((job, req, arrays))
        for i, o in errors:
            out[i] = o
        for (model_key, outs), items in groups.items():
            for group in _by_rows(items, max(self.max_batch.get(model_key, 0), 1)):
                for o in self._run_group(model_key, list(outs) or None, group):
                    out[where[id(o.job)]] = o
        limit = (self.nc.max_payload or 0) - _HEADER_ALLOWANCE
        try:
            for i, o in enumerate(out):
                if o is not None:
                    await self._answer_in_call(o, entries[i].dkey, limit)
        finally:
            await self._write_answers()
        return out

    async def _answer_in_call(self, o: Outcome, dkey: tuple | None, limit: int) -> None:
        """Publish the answer of a request computed within the ingress's call (:meth:`run_burst`;
        :meth:`run_now` has the same steps written out), to its job's reply subject: an answer over ``limit``
        bytes (the bus's max_payload less the header allowance; 0: none) becomes a typed PAYLOAD_TOO_LARGE error (:meth:`_too_large`), and
        a good one is kept for retries under ``dkey`` (None: the request has no id). Not yet written
        (:meth:`_write_answers`)."""
        if o.ok and limit > 0 and len(o.body) > limit:
            self._too_large(o)
        if o.ok and dkey is not None:
            self.recent.put(dkey, o.hdrs, o.body)
        await self._reply(o, o.job.reply, o.hdrs)

    async def _write_answers(self) -> None:
        """Write what was published to the socket now (one write). Never raises: the client's timeout covers
        a reply that could not be sent (logged)."""
        try:
            await send_pending(self.nc)
        except Exception as exc:
            log(f"worker {self.config.worker_id}: reply write failed: {exc!r}")

    async def _admit(self, job: Job) -> None:
        """The checks every received request passes, whichever way it came (bus or in-process), in order:
        stall fence, deadline (monotonic, then, for a request from the bus, the ingress's wall-clock deadline: an
        in-process one's is the same instant), fencing term, model
        refusal, dedupe by request id (a recent result is a *hit*, a queued or running copy is *joined*),
        then the mailbox bound (:meth:`_enqueue`). A refusal is answered at once (:meth:`_finish_now`)."""
        if self._stalled(job):
            self.stats.stall_fenced += 1
            await self._finish_now(job, Unavailable(
                f"worker {self.config.worker_id} was frozen longer than its stall fence "
                f"({self.config.stall_fence_s:g} s); the request may have been "
                f"retried elsewhere, so it is not computed here"))
            return
        # a local job's wall-clock deadline is its monotonic one, converted by the ingress in this process: the
        # monotonic check alone is the same (stricter by the skew allowance)
        if job.deadline <= job.t_recv or (not job.local and H.wall_deadline_passed(job.wall_deadline_ms)):
            self.stats.expired += 1
            await self._finish_now(job, DeadlineExceeded("budget spent before the worker received the request"))
            return
        fenced = self.fencing.refusal_term(job.term)
        if fenced is not None:
            await self._finish_now(job, fenced)
            return
        unserved = self.model_ctl.refusal(job.model_key)
        if unserved is not None:  # unloaded, draining or never loaded here: a client error, not the worker's
            await self._finish_now(job, unserved)
            return
        rid = job.rid
        if rid:
            job.dkey = self.dedupe_key(job.model_key, rid, job.body)
            hit = self.recent.get(job.dkey, job.t_recv)
            if hit is not None:
                self.stats.dedup_hits += 1
                o = Outcome(job, {**hit[0], DEDUP_HEADER: "hit"}, hit[1], ok=True)
                await self._publish_outcomes([o], count=False)
                return
            primary = self.in_progress.get(job.dkey)
            if primary is not None:
                self.stats.dedup_joins += 1
                if primary.joined is None:
                    primary.joined = []
                primary.joined.append(job)
                if job.deadline > primary.deadline:
                    primary.deadline = job.deadline  # the thread reads it; a float store is atomic
                self._track(job)
                return
        await self._enqueue(job)

    async def _enqueue(self, job: Job) -> None:
        """Queue ``job`` for compute and track it in flight; shed it (RESOURCE_EXHAUSTED) when the mailbox is full.

        The mailbox bound (``mailbox_size``) covers the inference thread's queue and the loop's inline
        queue together. Loop thread only; it awaits only to publish the shed reply.
        """
        # the queue's length without its lock (qsize() takes it): only this thread adds, so it can only be lower
        if len(self.mailbox.queue) + len(self._inline) >= self.config.mailbox_size or self.fault.shed:
            self.stats.shed += 1
            await self._finish_now(job, ResourceExhausted(
                f"worker {self.config.worker_id} mailbox full ({self.config.mailbox_size})", retry_after_ms=10))
            return
        if self._runs_inline(job.model_key, len(job.body)):
            self._inline.append(job)
            waiter = self._inline_waiter
            if waiter is not None:
                self._inline_waiter = None
                if not waiter.done():
                    waiter.set_result(None)
        else:
            self.mailbox.put_nowait(job)
        if job.dkey is not None:
            self.in_progress[job.dkey] = job
        self._track(job)

    def _runs_inline(self, model_key: str, nbytes: int) -> bool:
        """Whether a request for ``model_key`` with a body of ``nbytes`` runs on the loop: a CPU ONNX Runtime
        session whose EWMA compute per request is within ``inline_max_compute_us``, a body within the model's
        inline bound (:func:`inline_max_body_bytes`: a request much larger than those that set the EWMA would
        hold the loop for longer), and no injected compute delay (it sleeps)."""
        return (model_key in self._inline_capable and self.fault.compute_delay_ms <= 0
                and nbytes <= self._inline_max_bytes[model_key]
                and self.compute_ewma_us.get(model_key, 0.0) <= self.config.inline_max_compute_us)

    def _track(self, job: Job) -> None:
        self.stats.in_flight += 1
        if job.ingress is not None and job.seq >= 0:
            self.by_seq[(job.ingress, job.seq)] = job

    async def _on_control(self, msg) -> None:
        try:
            m = decode_internal(msg.data)
        except InternalDecodeError:
            return
        if isinstance(m, Cancel):
            self.cancel(m.ingress, m.seqs)
        elif isinstance(m, FaultSet) and self.config.fault_control:
            self.fault = msgspec.structs.replace(m, loop_busy_ms=0.0)
            log(f"worker {self.config.worker_id}: fault set to {m}", logging.INFO)
            if msg.reply:
                await self.nc.publish(msg.reply, b"ok")
                await self.nc.flush()
            if m.loop_busy_ms > 0:
                until = time.monotonic() + m.loop_busy_ms / 1000.0
                while time.monotonic() < until:  # the drill: this loop busy on the CPU, nothing else runs on it
                    pass

    def cancel(self, ingress: str, seqs) -> None:
        """Withdraw the copies ``seqs`` forwarded by ``ingress`` (a hedge's loser): a copy not yet started is
        dropped without running the model and without a reply; unknown or finished ones are ignored."""
        for seq in seqs:
            job = self.by_seq.get((ingress, seq))
            if job is not None:
                job.cancelled = True

    async def _publish_error(self, reply: str, err: InferbusError, ct: str | None, request_id: str | None = None) -> None:
        hdrs, body = error_message(err, ct, request_id)
        await self.nc.publish(reply, body, headers=hdrs)

    async def _finish_now(self, job: Job, err: InferbusError, server_error: bool = False) -> None:
        """Answer ``job`` with ``err`` before compute (shed, expired, refused); it was not tracked in flight.

        A copy the ingress marked ``Inferbus-Hedge: primary`` or ``copy`` that is shed (RESOURCE_EXHAUSTED)
        or refused UNAVAILABLE is *held*: no reply to the client, only the completion notice (``held``), so
        the ingress can send the request to another worker at once or answer the client itself; a refusal
        racing the other copy's answer never reaches the client.
        """
        hdrs, body = error_message(err, job.ct, job.rid)
        code = err.code.value
        held = (code in _HELD_CODES and job.ingress is not None and job.seq >= 0 and job.hedge in _HEDGE_MARKS)
        await self._publish_outcomes([Outcome(job, hdrs, body, ok=False, server_error=server_error,
                                              code=code, held=held)], count=False)

    async def _publish_outcomes(self, outcomes: list[Outcome], count: bool = True) -> None:
        """Reply to every copy of each job (joined duplicates too), then send completion notices.

        ``count``: the jobs were tracked in flight (queued or joined) and are released here.
        """
        nc = self.nc
        limit = (nc.max_payload or 0) - _HEADER_ALLOWANCE
        done: dict[str, list[DoneItem]] = {}
        local_id = self._local_ingress_id
        local_done: list[DoneItem] = []  # for the colocated ingress: settled by a call, no DoneNotice
        requeue: list[Job] = []
        in_progress, by_seq = self.in_progress, self.by_seq
        try:
            for o in outcomes:
                job = o.job
                if count:
                    if job.answered:  # refused UNAVAILABLE by a stop's drain (_refuse_held): its late result is dropped
                        continue
                    job.answered = True
                targets = job.targets() if job.joined else (job,)  # most jobs have no joined duplicate
                given = None  # the ingresses sent this answer for their caches: a joined copy's is one fill too many
                dkey = job.dkey
                if count:
                    # settle the dedupe tables first (no await in between), so a duplicate arriving
                    # while we publish finds the stored result instead of a finished job
                    if dkey is not None and in_progress.get(dkey) is job:
                        del in_progress[dkey]
                    self.stats.in_flight -= len(targets)
                    for t in targets:
                        if t.ingress is not None:
                            by_seq.pop((t.ingress, t.seq), None)
                if o.ok:
                    if limit > 0 and len(o.body) > limit:
                        self._too_large(o)
                    elif count and dkey is not None:
                        self.recent.put(dkey, o.hdrs, o.body)
                for i, t in enumerate(targets):
                    code = o.code
                    if o.retry and t is not job and not t.cancelled and t.deadline > time.monotonic():
                        requeue.append(t)  # the primary expired/was cancelled; this duplicate still has budget
                        continue
                    if t.cancelled or code == CANCELLED:
                        code = CANCELLED
                    elif o.held:
                        pass  # the ingress answers (DoneItem.held)
                    else:
                        await self._reply(o, t.reply, o.hdrs if i == 0 or o.hdrs.get(DEDUP_HEADER)
                                          else {**o.hdrs, DEDUP_HEADER: "join"})
                    if t.ingress is not None and t.seq >= 0:
                        if code == CANCELLED:
                            item = DoneItem(t.seq, False, False, o.service_us, None, code)
                        else:
                            body = o.response_msgpack if (t.want_body and o.ok and t.pin == job.pin) else None
                            if body is not None and job.joined:  # (a trial: 3 copies, 3 equal L2 writes)
                                if given is None:
                                    given = set()
                                if t.ingress in given:
                                    body = None
                                else:
                                    given.add(t.ingress)
                            item = DoneItem(t.seq, o.ok, o.server_error, o.service_us, body, code, o.held)
                        if t.ingress == local_id:
                            local_done.append(item)
                        else:
                            done.setdefault(t.ingress, []).append(item)
            # completion notices for ingresses over the bus and the audit record join the replies' buffer, and all
            # of it leaves in one write now: before the colocated ingress's bookkeeping below and before the
            # handlers already queued on this loop (nats-py's flusher task would send it only after those)
            for ingress, items in done.items():
                try:
                    for notice in done_notices(self.config.worker_id, items, limit):
                        await publish_raw(nc, self.subjects.done(ingress), notice, flush=False)
                except Exception as exc:
                    log(f"worker {self.config.worker_id}: done notice failed: {exc!r}")
            if self.config.audit:
                ids = [o.job.rid or "" for o in outcomes if o.executed]
                if ids:
                    await publish_raw(nc, self.subjects.audit, msgspec.msgpack.encode(ids), flush=False,
                                      headers=self._audit_headers)
        finally:  # even if a bug ended the loop above, what it published leaves now
            try:
                await send_pending(nc)
            except Exception as exc:  # the client's timeout covers a reply that could not be sent
                log(f"worker {self.config.worker_id}: reply write failed: {exc!r}")
        if self._tracing is not None:
            self._trace_outcomes(outcomes)
        if local_done:  # colocated ingress: settled in-process, no notice, no NATS message
            self.local_done_notices += 1
            try:
                await self._local_done(local_done)
            except Exception as exc:
                log(f"worker {self.config.worker_id}: settling at the local ingress failed: {exc!r}")
        for t in requeue:
            await self._requeue(t)

    def _trace_outcomes(self, outcomes: list[Outcome]) -> None:
        """Make the worker span of each traced job among ``outcomes`` (:attr:`Job.trace`), ended now: their replies
        were written (a span that cannot be made is logged, never raised: :meth:`Tracing.worker_span
        <inferbus.actors._tracing.Tracing.worker_span>`)."""
        now = time.monotonic()
        for o in outcomes:
            if o.job.trace is not None:
                self._tracing.worker_span(o.job.trace, o.job, o, self.config.worker_id, now)

    def note_answer_rows(self, key: str, sess) -> None:
        """Keep :func:`answer_row_bytes` of model version ``key``'s session ``sess`` for the check before compute
        (:meth:`_answer_too_large`), once per load: its rows must come first in every output
        (:func:`~inferbus.accelerators.rows_problem` found no problem, :attr:`row_problems`), else none is kept."""
        # every input batch-first (rank >= 1): a request's first input then has a first dimension to compare (the
        # ingress and _prepare_local hold it to the model's rank), also for a model with a scalar input
        batched = all(len(t.shape) > 0 and t.shape[0] == -1 for t in sess.inputs)
        rb = answer_row_bytes(sess.outputs) if batched and key not in self.row_problems else 0
        if rb > 0:
            self._answer_row_bytes[key] = rb
            if self._answer_limit > 0:
                self._answer_max_rows[key] = self._answer_limit // rb
        else:
            self._answer_row_bytes.pop(key, None)
            self._answer_max_rows.pop(key, None)

    def forget_answer_rows(self, key: str) -> None:
        """Drop model version ``key`` from the check before compute (it is no longer served here)."""
        self._answer_row_bytes.pop(key, None)
        self._answer_max_rows.pop(key, None)

    def _note_answer_limit(self) -> None:
        """Read the bus's ``max_payload`` into :attr:`_answer_limit`, less the header allowance, and when it changed
        rebuild :attr:`_answer_max_rows` (a new dict: the inference thread reads the old or the new one whole)."""
        limit = max((self.nc.max_payload or 0) - _HEADER_ALLOWANCE, 0) if self.nc is not None else 0
        if limit != self._answer_limit:
            self._answer_limit = limit
            self._answer_max_rows = {k: limit // rb for k, rb in self._answer_row_bytes.items()} if limit else {}

    def _answer_too_large(self, model_key: str, req) -> PayloadTooLarge | None:
        """PAYLOAD_TOO_LARGE for request ``req`` of ``model_key`` when the tensors of its answer alone would be over
        the bus's ``max_payload`` less the header allowance (the limit :meth:`_too_large` applies to the encoded
        answer after compute), known before the model runs; None when that is not known (the late check stays).
        Called only for a request of more rows than :attr:`_answer_max_rows` (the callers' one compare per
        request), so it may take its time: it reads the connection's ``max_payload`` again and counts
        the outputs the request asks for (all by default), each fixed-size output with a fixed shape after its first
        (batch) dimension as ``rows × its row's elements × the datatype's bytes`` in the ``raw`` form, or 1 byte an
        element in the ``data`` form (at least one in MessagePack or JSON); every input must have ``rows`` rows.
        That is a lower bound of the encoded answer (the envelope, names, shapes and parameters, is not counted), so
        nothing refused here would have fitted; an answer within its envelope of the limit is still refused after
        compute. Counted in ``stats.too_large_before_compute``."""
        limit = (self.nc.max_payload or 0) - _HEADER_ALLOWANCE
        rows = req.inputs[0].shape[0]
        if limit <= 0 or any(not t.shape or t.shape[0] != rows for t in req.inputs):
            return None  # inputs of unlike rows: what the model answers is not known
        sess = self.sessions.get(model_key)
        if sess is None:
            return None
        wanted = [o.name for o in req.outputs] if req.outputs else None
        per_row = {name: n for name, n in output_row_bytes(sess.outputs, raw=answers_raw(req)).items()
                   if wanted is None or name in wanted}
        if wanted is not None and not set(wanted) <= {t.name for t in sess.outputs}:
            return None  # an output the model does not have: its own error comes from the run
        total = rows * sum(per_row.values())
        if total <= limit:
            return None
        self.stats.too_large_before_compute += 1
        form = "raw" if answers_raw(req) else "data (1 byte an element at least)"
        parts = ", ".join(f"{name!r} {rows} rows x {n} bytes" for name, n in per_row.items())
        return PayloadTooLarge(
            f"the answer's outputs would be at least {total} bytes ({parts}, in the {form} form), over the bus's "
            f"max_payload ({self.nc.max_payload} bytes, {_HEADER_ALLOWANCE} kept for headers); refused before the "
            f"model ran: send fewer rows or ask for fewer outputs", field="outputs")

    def _too_large(self, o: Outcome) -> None:
        """Turn ``o``, an answer over the bus's ``max_payload`` (less the header allowance), into PAYLOAD_TOO_LARGE."""
        err = PayloadTooLarge(f"the response is {len(o.body)} bytes, over the bus's max_payload "
                              f"({self.nc.max_payload} bytes, {_HEADER_ALLOWANCE} kept for headers)", field="outputs")
        o.hdrs, o.body = error_message(err, o.job.ct, o.job.rid)
        o.ok, o.response_msgpack, o.code = False, None, err.code.value

    async def _reply(self, o: Outcome, reply: str, hdrs: dict) -> None:
        """Publish ``o``'s answer (``hdrs``) to ``reply`` into nats-py's buffer (no write yet); logs a failure."""
        try:
            if o.ok:  # our own header values (content type, a received request id): no CR/LF
                block = o.block if hdrs is o.hdrs and o.block is not None else "".join(
                    [f"{k}: {v}\r\n" for k, v in hdrs.items()]).join(_BLOCK_ENDS).encode()
                await publish_raw(self.nc, reply, o.body, headers=block, flush=False)
            else:
                await self.nc.publish(reply, o.body, headers=hdrs)
        except Exception as exc:  # e.g. a connection problem: the client's timeout covers it
            log(f"worker {self.config.worker_id}: reply failed: {exc!r}")

    async def _requeue(self, job: Job) -> None:
        """Queue a joined duplicate whose primary was dropped (expired or cancelled) as a job of its own."""
        primary = self.in_progress.get(job.dkey) if job.dkey is not None else None
        if primary is not None:
            if primary.joined is None:
                primary.joined = []
            primary.joined.append(job)
            primary.deadline = max(primary.deadline, job.deadline)
            self._track(job)
            return
        await self._enqueue(job)

    async def _inline_pump(self) -> None:
        """Run the inline queue on the loop: one slice (about ``INLINE_SLICE_US`` of estimated compute) at a
        time, its outcomes published before the next, and a yield to the loop between slices.

        Requests that arrived while a slice ran are merged into the next one (zero-wait batching). With
        nothing left after a slice, the pump waits for the next request at once: no extra turn of the loop
        (an ``epoll`` call) per batch.
        """
        loop = asyncio.get_running_loop()
        while True:
            if not self._inline:
                waiter = self._inline_waiter = loop.create_future()
                await waiter
            while self._inline:
                jobs = self._take_inline()
                if jobs:
                    outcomes = self._run_jobs(jobs)
                    if outcomes:
                        try:
                            await self._publish_outcomes(outcomes)
                        except Exception as exc:  # never let one bad batch stop the pump
                            log(f"worker {self.config.worker_id}: publishing outcomes failed: {exc!r}")
                if self._inline:
                    await asyncio.sleep(0)  # receive, report, cancel, tick between slices

    def _take_inline(self) -> list[Job]:
        """The next inline slice, oldest first. Requests of a model that no longer runs inline (slower now, or
        a compute delay injected) move to the inference thread's queue, in order."""
        dq = self._inline
        jobs: list[Job] = []
        cost_us = 0.0
        while dq and len(jobs) < INLINE_MAX_JOBS:
            job = dq[0]
            if not self._runs_inline(job.model_key, len(job.body)):
                dq.popleft()
                self.mailbox.put_nowait(job)  # same bound: it only moves between the two queues
                continue
            est_us = self.compute_ewma_us.get(job.model_key, 0.0)
            if jobs and cost_us + est_us > INLINE_SLICE_US:
                break
            cost_us += est_us
            job.inline = True
            jobs.append(dq.popleft())
        return jobs

    async def _outbox_pump(self) -> None:
        assert self._outbox is not None
        outbox = self._outbox
        while True:
            outcomes = await outbox.get()
                # coalesce: every pass the inference thread finished since the last wake-up is published in
            # one go, so each ingress gets one DoneNotice per loop iteration instead of one per pass
            while not outbox.empty():
                outcomes = outcomes + outbox.get_nowait()
            try:
                await self._publish_outcomes(outcomes)
            except Exception as exc:  # never let one bad batch stop the pump
                log(f"worker {self.config.worker_id}: publishing outcomes failed: {exc!r}")

    def _precision_summary(self) -> str:
        """The precision every loaded model is served at, or ``mixed`` (per model in ``LoadReport.precisions``)."""
        ps = {s.precision for s in self.sessions.values()}
        return ps.pop() if len(ps) == 1 else ("mixed" if ps else self.config.precision)

    def _report(self, cpu_ratio: float = -1.0) -> LoadReport:
        """The load report as of now; ``cpu_ratio`` is :attr:`LoadReport.cpu_ratio` (the reporter measures it
        between its own reports; a scrape leaves it unmeasured)."""
        s = self.stats
        d = self.device
        now = time.monotonic()
        reqs, errs = self.window.totals(now)
        reqs_inline, errs_inline = self.window_inline.totals(now)
        reqs, errs = reqs + reqs_inline, errs + errs_inline
        computing_ms = (now - self._batch_t0) * 1000.0 if self._thread_busy else 0.0
        applied = self.model_ctl.applied
        return LoadReport(
            worker_id=self.config.worker_id, pid=os.getpid(), device_kind=d.kind if d else "cpu",
            device_name=d.name if d else "", backend=self.config.backend, precision=self._precision_summary(),
            device_index=d.index if d else 0, device_model=str(d.facts.get("model") or d.facts.get("device_kind") or "")
            if d else "", precisions={k: sess.precision for k, sess in self.sessions.items()},
            models=sorted(self.sessions), queue_depth=self.mailbox.qsize() + len(self._inline) + len(self._held_back),
            in_flight=s.in_flight,
            capacity=self.config.mailbox_size, ewma_service_us=s.ewma_service_us, completed=s.completed,
            errors=s.errors, region=self.config.region, server=connected_server(self.nc),
            interval_ms=self.config.report_interval_ms,
            window_s=float(self.window.n), window_requests=reqs, window_errors=errs,
            error_rate=(errs / reqs) if reqs else 0.0, computed=s.computed, expired=s.expired, shed=s.shed,
            dedup_hits=s.dedup_hits, dedup_joins=s.dedup_joins, cancelled=s.cancelled, decoded=s.decoded,
            load_errors=dict(self.load_errors),
            model_revisions={m: rw[0] for m, rw in applied.items()},
            model_writers={m: rw[1] for m, rw in applied.items()},
            computing_ms=computing_ms, computing_overdue=computing_ms > 0 and now > self._batch_deadline,
            draining=self._draining, backlog_msgs=self._infer_sub.pending_msgs if self._infer_sub is not None else 0,
            cpu_ratio=cpu_ratio,
        )

    def _stats_data(self, endpoint_stats) -> dict:
        """``data`` of the ``infer`` endpoint in ``$SRV.STATS`` (the others' is empty), read at scrape time by
        ``inferbus up --metrics-port``: the load report's fields (:class:`LoadReport`), plus ``received``
        (requests taken, over NATS or from a colocated ingress), ``batches`` (model runs), ``stalls``,
        ``stall_fenced``, ``stop_refused`` (requests answered UNAVAILABLE when a stop's drain ended before their
        answer, :meth:`_refuse_held`), ``input_failures`` (requests the model failed on while it ran its warm-up
        input: INVALID_ARGUMENT, :meth:`_model_failure`), ``chunked`` (large requests run in chunks),
        ``served_between_chunks`` (small requests computed between two of their chunks, :meth:`_infer_chunked`),
        ``too_large_before_compute`` (requests refused PAYLOAD_TOO_LARGE before their model ran,
        :meth:`_answer_too_large`), ``compute_ewma_us`` (model version → EWMA of compute CPU time per request, µs),
        ``layouts`` (the request layouts of bodies from the bus: :meth:`RequestLayouts.stats`) and ``runs`` (model
        version → its runs since the process started, :meth:`RunStats.as_dict`: ``runs``, ``requests``, cumulative
        ``batch_le`` per bound of ``BATCH_BOUNDS``, ``compute_le`` per bound of ``LATENCY_BOUNDS_US`` and
        ``compute_sum_us``; every run so far folded in first)."""
        if getattr(endpoint_stats, "name", "") != "infer":
            return {}
        fold_runs(self._runs, self.run_stats)
        s = self.stats
        return {**msgspec.structs.asdict(self._report()), "received": s.received, "batches": s.batches,
                "stalls": s.stalls, "stall_fenced": s.stall_fenced, "stop_refused": s.stop_refused,
                "input_failures": s.input_failures, "chunked": s.chunked,
                "served_between_chunks": s.served_between_chunks,
                "too_large_before_compute": s.too_large_before_compute, "compute_ewma_us": dict(self.compute_ewma_us),
                "layouts": self._layouts.stats(), "runs": {k: r.as_dict() for k, r in self.run_stats.items()}}

    async def _reporter(self) -> None:
        period = self.config.report_interval_ms / 1000.0
        wall_s, cpu_s = time.monotonic(), time.process_time()
        cpu_ratio = -1.0
        while True:
            if not self.fault.silent:
                await self.nc.publish(self.subjects.load, encode_internal(self._report(cpu_ratio)))
            self._note_answer_limit()  # (a reconnect may have reached a server of another max_payload)
            fold_runs(self._runs, self.run_stats)  # (bounds what waits in the list to one report's runs)
            await asyncio.sleep(period)
            # the process's CPU over the wall time since the last report: a report late because the loop was busy
            # (ratio near 1) is told from one late because the process was stopped (near 0) by the ingresses
            now_s, now_cpu_s = time.monotonic(), time.process_time()
            cpu_ratio = (now_cpu_s - cpu_s) / (now_s - wall_s) if now_s > wall_s else -1.0
            wall_s, cpu_s = now_s, now_cpu_s

    async def run(self, *, nc=None, ready=None) -> None:
        """Connect, subscribe, announce readiness, serve until cancelled.

        Args:
            nc: a connection to use instead of opening one (shared with a colocated ingress); the
                caller owns it: this actor does not drain it when it stops.
            ready: called once subscribed and flushed, instead of the GC freeze and the ``READY`` line
                (the colocated process announces readiness once both of its actors are up).
        """
        set_affinity(self.config.cpu_affinity)
        self.loop = asyncio.get_running_loop()
        self._outbox = asyncio.Queue()
        own_nc = nc is None
        self.nc = await connect_logged(self.config.bus, f"worker-{self.config.worker_id}") if own_nc else nc
        self._note_answer_limit()
        await self.fencing.start(self.nc)
        await self.model_ctl.start(self.nc)
        from nats.micro import add_service

        svc = await add_service(self.nc, name="inferbus-worker", version=__version__,
                                description="inferbus accelerator worker",
                                metadata={"worker_id": self.config.worker_id, "backend": self.config.backend,
                                          "device": self.device.name if self.device else ""},
                                stats_handler=self._stats_data)
        await self.nc.subscribe(control_subject(self.config.bus.prefix, self.config.worker_id), cb=self._on_control)
        await svc.add_endpoint(name="infer", subject=self.subjects.worker(self.config.worker_id),
                               handler=lambda req: self._on_request(req._msg),
                               queue_group=f"{self.config.bus.prefix}.w.{self.config.worker_id}")
        self._infer_sub = endpoint_subscription(svc, "infer")
        thread_died: asyncio.Future = self.loop.create_future()
        thread = threading.Thread(target=self._compute_thread, args=(thread_died,), name="inference", daemon=True)
        thread.start()
        named = {"outbox": self._outbox_pump, "reporter": self._reporter, "stall-watch": self._stall_watch,
                 "inline": self._inline_pump}
        if self.busy_poll is not None:
            named["busy-poll"] = self.busy_poll.run
        loops = await supervise_loops(f"worker-{self.config.worker_id}", named)
        serving = asyncio.ensure_future(loops.run())
        await self.nc.flush()
        quiesce = ready is None and _quiesce_on_sigusr1(self.loop, lambda: self._start_drain(svc))
        if ready is None:
            serving_gc()
            announce_ready()
        else:
            ready()
        try:
            # returns only by escalation (IntensityExceeded) or the inference thread's death: either ends the
            # process abnormally, the node supervisor restarts it, and the ingresses fail what it held at once
            done, _ = await asyncio.wait({serving, thread_died}, return_when=asyncio.FIRST_COMPLETED)
            for f in done:
                f.result()
        finally:
            if not serving.done() and not thread_died.done():  # stopped (SIGTERM), not failed: drain
                await self._start_drain(svc)  # or join the one the node's quiesce (SIGUSR1) began
            self._stop.set()
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)  # a cancelled run() stops the loops first
            self.mailbox.put_nowait(None)  # wakes the thread if it waits for work: it sees the stop at once
            # the inference thread ends its model run (a chunk at most, for a chunked request) before the process
            # exits: a run left going while the interpreter tore ONNX Runtime down aborted the process (SIGABRT,
            # "terminate called without an active exception"; a fresh-user trial, SIGTERM during 30,000-row batches)
            await asyncio.to_thread(thread.join, _STOP_THREAD_JOIN_S)
            if thread.is_alive():
                log(f"worker {self.config.worker_id}: the inference thread is still in a model run after "
                    f"{_STOP_THREAD_JOIN_S:g} s; exiting with it")
            await loops.stop()
            if quiesce:
                _ignore_sigusr1(self.loop)
            await self._flush_outbox()  # results the thread handed over after the pump stopped
            try:
                await svc.stop()
            except Exception:
                pass
            if own_nc:  # flushes the last replies; a second SIGTERM cuts the drain short, the close still follows
                await close_connection(self.nc, drain=True, drain_timeout_s=STOP_CLOSE_DRAIN_S)
            if self._drain_task is not None:
                log(f"worker {self.config.worker_id}: stopped {time.monotonic() - self._drain_began:.2f} s after its "
                    f"drain began; {self.stats.stop_refused} requests refused UNAVAILABLE", logging.INFO)

    def _start_drain(self, svc) -> asyncio.Future:
        """Begin the graceful stop's drain (:meth:`_drain_requests`) unless it began already; returns its task.

        Called on SIGTERM (from ``run()``'s ``finally``) and on SIGUSR1, the node's *quiesce* notice: a node that
        stops sends it to all its workers at once when its ingresses have exited, so each worker stops taking
        requests and drains while the supervisor stops the workers one after another (docs/supervision.md). The
        drain's ``drain_timeout_s`` counts from whichever came first; the SIGTERM then waits for the same drain.
        """
        if self._drain_task is None:
            self._draining = True  # the next load report says so: routers stop sending requests here
            self._drain_began = time.monotonic()
            log(f"worker {self.config.worker_id}: draining: {self.stats.in_flight} requests in flight (at most "
                f"{self.config.drain_timeout_s:g} s)", logging.INFO)
            self._drain_task = asyncio.ensure_future(self._drain_requests(svc))
        return self._drain_task

    async def _drain_requests(self, svc) -> None:
        """Graceful stop: take no new requests, answer the ones received, within ``drain_timeout_s``.

        The infer subscription is drained (what it buffered is enqueued as usual), then the loop waits
        until nothing is in flight (queued, computing or waiting for its reply to be published); the
        loops and the inference thread keep running meanwhile. A forward sent after the unsubscribe gets
        NATS's no-responders status at its client (the SDK retries it elsewhere). Requests still held at the
        timeout are answered UNAVAILABLE at once (:meth:`_refuse_held`): the SDK sends them again, same request
        id, to another worker, instead of waiting for its attempt timeout.
        """
        t0 = time.monotonic()
        t_end = t0 + self.config.drain_timeout_s
        await drain_endpoint(endpoint_subscription(svc, "infer"), self.config.drain_timeout_s)
        while self.stats.in_flight > 0 and time.monotonic() < t_end:
            await asyncio.sleep(0.005)
        if self.stats.in_flight > 0:
            held = self.stats.in_flight
            n = await self._refuse_held(time.monotonic() - t0)
            log(f"worker {self.config.worker_id}: stopping with {held} requests unanswered after "
                f"{self.config.drain_timeout_s} s of draining; answered {n} of them UNAVAILABLE (retry elsewhere)")

    async def _flush_outbox(self) -> None:
        """Publish the outcomes waiting in the outbox now (the pump may be stopped). Never raises."""
        outbox = self._outbox
        if outbox is None or outbox.empty():
            return
        outcomes: list[Outcome] = []
        while not outbox.empty():
            outcomes += outbox.get_nowait()
        try:
            await self._publish_outcomes(outcomes)
        except Exception as exc:
            log(f"worker {self.config.worker_id}: publishing outcomes failed: {exc!r}")

    def _held_jobs(self) -> list[Job]:
        """Every request this worker holds and has not answered, as primary jobs (a joined duplicate is answered
        with its primary): queued for the inference thread (taken out of its mailbox, so the thread never
        computes them) or the loop, in the thread's current batch, joined, or tracked for cancellation. Loop only."""
        mb = self.mailbox
        with mb.mutex:  # the inference thread takes from it concurrently
            queued = list(mb.queue)
            mb.queue.clear()
        inline = list(self._inline)
        self._inline.clear()
        seen: dict[int, Job] = {}
        for j in (*queued, *inline, *self._batch_jobs, *self.in_progress.values(), *self.by_seq.values()):
            if not j.answered:
                seen[id(j)] = j
        joined = {id(t) for j in seen.values() if j.joined for t in j.joined}
        return [j for k, j in seen.items() if k not in joined]

    async def _refuse_held(self, drained_s: float) -> int:
        """Answer every request still held when the drain ends with UNAVAILABLE (``retry_after_ms: 0``), at once.

        Each copy's client gets the error on its reply subject and its ingress a completion notice (code
        UNAVAILABLE, not a server error: the ingress settles it as neutral, without charging the worker's breaker
        or health). Hedge-marked copies too: unlike a refusal before compute (:meth:`_finish_now`) none is *held*
        for its ingress to answer, because that ingress may have exited already (a node stops its ingresses
        before its workers) and the client would wait for its attempt timeout. A request the inference thread is
        computing is refused too: the job is marked answered, so its late result is dropped
        (:meth:`_publish_outcomes`), never a second answer. Outcomes already handed to the outbox are published
        as results first. Returns how many copies were refused (joined ones included)."""
        await self._flush_outbox()
        jobs = self._held_jobs()
        if not jobs:
            return 0
        err = Unavailable(f"worker {self.config.worker_id} is stopping and did not finish this request within "
                          f"its drain ({drained_s:.1f} s); safe to retry on another worker", retry_after_ms=0)
        outcomes = []
        n = 0
        for job in jobs:
            hdrs, body = error_message(err, job.ct, job.rid)
            outcomes.append(Outcome(job, hdrs, body, ok=False, code=err.code.value))
            n += len(job.joined) + 1 if job.joined else 1
        self.stats.stop_refused += n
        await self._publish_outcomes(outcomes)  # marks each answered first, releases it from in-flight tracking
        return n

    # ---- stall fence ---------------------------------------------------------------------------
    _STALL_TICK_S = 0.01

    async def _stall_watch(self) -> None:
        """Tick every 10 ms; a gap longer than ``stall_fence_s`` means this process was frozen.

        On such a gap, every request forwarded (ingress wall clock) before now is fenced: the ingress
        has failed it and the SDK may have retried it on another worker (the duplicate found by the
        worker-hang drill).
        """
        fence = self.config.stall_fence_s
        while True:
            now = time.monotonic()
            if fence > 0 and now - self._last_tick > fence:
                self._stall_end_unix = time.time()
                self.stats.stalls += 1
                log(f"worker {self.config.worker_id}: frozen for {now - self._last_tick:.2f}s; fencing older requests")
            self._last_tick = now
            await asyncio.sleep(self._STALL_TICK_S)

    def _stalled(self, job: "Job") -> bool:
        """True when ``job`` must not be computed because this process was frozen after it was forwarded.

        Runs on the loop and on the inference thread (reads two floats; stores are atomic).
        """
        fence = self.config.stall_fence_s
        if fence <= 0:
            return False
        if time.monotonic() - self._last_tick > fence:
            return True  # frozen just now and the watch has not run yet
        return 0.0 < job.fwd_unix < self._stall_end_unix

    # ---- inference thread --------------------------------------------------------------------
    def _compute_thread(self, died: asyncio.Future) -> None:
        """The inference thread's body: :meth:`_compute_loop`; if it raises, ``died`` gets the error and
        ``run()`` raises it (escalation: the thread is not restarted inside the process)."""
        try:
            self._compute_loop()
        except BaseException as exc:  # noqa: BLE001 - reported to run(), which raises it on the loop
            log(f"worker {self.config.worker_id}: inference thread died", logging.ERROR, exc_info=True)
            err = RuntimeError(f"worker {self.config.worker_id}: inference thread died: {exc!r}")
            self.loop.call_soon_threadsafe(lambda: died.done() or died.set_exception(err))

    def _compute_loop(self) -> None:
        mailbox = self.mailbox
        while not self._stop.is_set():
            jobs, self._held_back = self._held_back, []  # taken while a large request ran in chunks: first
            if not jobs:
                try:
                    first = mailbox.get(timeout=0.2)
                except queue.Empty:
                    continue
                if first is None:  # the stop's wake-up (run()): the loop's condition ends it
                    continue
                jobs = [first]
            # zero-wait: take what is already queued, never wait for more
            while len(jobs) < 256:
                try:
                    job = mailbox.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    break
                jobs.append(job)
            # what the load report says while this batch computes (read on the loop; two plain stores)
            self._batch_deadline = max(j.deadline for j in jobs)
            self._batch_jobs = jobs
            self._batch_t0 = time.monotonic()
            self._thread_busy = True
            try:
                delay_ms = self.fault.compute_delay_ms
                if delay_ms > 0:  # fault injection; only ever on this thread (never inline, see _runs_inline)
                    time.sleep(delay_ms / 1000.0)
                outcomes = self._run_jobs(jobs)
                if outcomes:
                    self.loop.call_soon_threadsafe(self._outbox.put_nowait, outcomes)
            except _Stopping:
                return
            finally:
                self._thread_busy = False

    def _run_jobs(self, jobs: list[Job]) -> list[Outcome]:
        """Compute one zero-wait batch of jobs; runs on the inference thread or (inline) on the loop.

        Never raises: a bug fails these requests with INTERNAL and the caller lives on.
        """
        try:
            return self._compute_batch(jobs)
        except _Stopping:
            raise
        except Exception as exc:  # a bug: fail these requests, keep the thread / loop alive
            log(f"worker {self.config.worker_id}: batch failed: {exc!r}")
            return [self._error_outcome(j, Internal(f"worker failed: {type(exc).__name__}: {exc}"),
                                        server_error=True) for j in jobs]

    def _compute_batch(self, jobs: list[Job]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        groups: dict[tuple, list[tuple[Job, object, dict]]] = {}
        max_rows = self._answer_max_rows
        for job in jobs:
            # checks that cost nothing come before any work on the request (not even decoding)
            if not job.live():
                self.stats.cancelled += 1
                outcomes.append(Outcome(job, {}, b"", ok=False, code=CANCELLED, retry=True))
                continue
            if not job.joined and self._stalled(job):
                self.stats.stall_fenced += 1
                o = self._error_outcome(job, Unavailable(
                    f"worker {self.config.worker_id} was frozen longer than its stall fence "
                    f"({self.config.stall_fence_s:g} s); not computed"))
                outcomes.append(o)
                continue
            if job.deadline <= time.monotonic() or (not job.joined and not job.local
                                                    and H.wall_deadline_passed(job.wall_deadline_ms)):
                self.stats.expired += 1
                o = self._error_outcome(job, DeadlineExceeded("budget spent while queued at the worker"))
                o.retry = True
                outcomes.append(o)
                continue
            try:
                if job.decoded is not None:  # handed over decoded by the colocated ingress: no second decode
                    req, arrays = self._prepare_local(job)
                else:
                    t_dec = time.monotonic()
                    req, arrays = self._prepare(job)
                    t_prep = time.monotonic()
                    job.decode_us = int((t_prep - t_dec) * 1e6)
                    if job.deadline <= t_prep:  # a large body can spend the rest of the budget in decoding
                        self.stats.expired += 1
                        o = self._error_outcome(job, DeadlineExceeded(
                            f"budget spent while the worker decoded the request ({job.decode_us / 1000:.0f} ms)"))
                        o.retry = True
                        outcomes.append(o)
                        continue
            except InferbusError as err:
                outcomes.append(self._error_outcome(job, err))
                continue
            # its answer's fixed-size outputs alone over max_payload: refused now, not after the model ran
            if (m := max_rows.get(job.model_key)) is not None and req.inputs[0].shape[0] > m and \
                    (err := self._answer_too_large(job.model_key, req)) is not None:
                outcomes.append(self._error_outcome(job, err))
                continue
            outs = tuple(o.name for o in req.outputs) if req.outputs else ()
            # a suspected query of death runs alone: a group of its own (the third field keeps it apart)
            groups.setdefault((job.model_key, outs, id(job) if job.alone else 0), []).append((job, req, arrays))
        large = []  # requests the inference thread runs in chunks: after the rest of the batch, which is answered first
        for (model_key, outs, _), items in groups.items():
            for group in _by_rows(items, max(self.max_batch.get(model_key, 0), 1)):
                if len(group) == 1 and not group[0][0].inline and self._chunk_rows(model_key, group[0][2]):
                    large.append((model_key, outs, group))
                    continue
                outcomes.extend(self._run_group(model_key, list(outs) or None, group))
        for model_key, outs, group in large:
            if outcomes:
                self.loop.call_soon_threadsafe(self._outbox.put_nowait, outcomes)
                outcomes = []
            outcomes.extend(self._run_group(model_key, list(outs) or None, group))
        return outcomes

    def _infer_chunked(self, model_key: str, sess, outs: list[str] | None, item: tuple, slot: int,
                       paused: list[float]) -> dict[str, np.ndarray]:
        """The outputs of request ``item`` (``(job, request, {input name: array})``), on the inference thread: at
        once, or, for more rows than :attr:`WorkerConfig.chunk_rows` (and than ``max_batch_size``) of a model that
        batches (``max_batch_size`` > 0: rows are independent, as for merging), in chunks of that many rows whose
        outputs are joined row by row; between two chunks the small requests waiting meanwhile are computed and
        answered (:meth:`_serve_waiting`; their wall and CPU seconds are added to ``paused``). Head-of-line
        blocking: a fresh-user trial saw four 30,000-row ``digits_cnn`` batches delay 1-row probes by up to 4.3 s.
        The flight record (``slot``) names the request again before each chunk. Outputs that do not come back
        by row (a leading dimension other than the chunk's rows) are computed again in one run.

        Between two chunks it also gives up a request whose every copy was cancelled (CANCELLED) or whose budget is
        spent (DEADLINE_EXCEEDED: its client was told so already; it was computed to its end for nobody).

        Raises:
            InferenceError: the model failed (a chunk, or the whole).
            _Abandoned: given up between two chunks (its ``outcome`` answers it).
            _Stopping: the worker stops (between two chunks).
        """
        feeds = item[2]
        chunk = self._chunk_rows(model_key, feeds)
        if not chunk:
            return sess.infer(feeds, outs)
        n = next(iter(feeds.values())).shape[0]
        parts = []
        flight = self.flight
        job = item[0]
        for start in range(0, n, chunk):
            if parts:
                if self._stop.is_set():  # the drain ended (its requests answered UNAVAILABLE): no more model runs
                    raise _Stopping
                if not job.live():  # every copy cancelled (a hedge won elsewhere): the rest is computed for nobody
                    self.stats.cancelled += 1
                    raise _Abandoned(Outcome(job, {}, b"", ok=False, code=CANCELLED, retry=True))
                if job.deadline <= time.monotonic():  # its client has its DEADLINE_EXCEEDED already
                    self.stats.expired += 1
                    o = self._error_outcome(job, DeadlineExceeded(
                        f"budget spent while the worker computed it in chunks ({start} of {n} rows done)"))
                    o.retry = True
                    raise _Abandoned(o)
                wall_s, cpu_s = self._serve_waiting()
                paused[0] += wall_s
                paused[1] += cpu_s
                if flight is not None and wall_s:  # the small ones' runs wrote their own record in this slot
                    flight.record(slot, _flight_pairs((item,)))
            rows = min(chunk, n - start)
            part = sess.infer({k: a[start:start + rows] for k, a in feeds.items()}, outs)
            if any(a.ndim == 0 or a.shape[0] != rows for a in part.values()):
                return sess.infer(feeds, outs)
            parts.append(part)
        self.stats.chunked += 1
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    def batch_limit(self, key: str, max_batch: int, problem: str | None = ...) -> int:
        """The ``max_batch_size`` this worker serves model version ``key`` with: ``max_batch`` (its config's, or
        ``--max-batch-size``'s), or 0 when its rows cannot be merged or cut (``problem``, from
        :func:`~inferbus.accelerators.rows_problem` as its session is loaded; left out: the one found then), said
        in one log line. Its requests then run one at a time, each whole, as with ``max_batch_size`` 0."""
        if problem is ...:
            problem = self.row_problems.get(key)
        elif problem is None:
            self.row_problems.pop(key, None)
        else:
            self.row_problems[key] = problem
        if problem is None or max_batch <= 0:
            return max_batch
        log(f"worker {self.config.worker_id}: {key}: max_batch_size {max_batch} not applied, its requests are never "
            f"merged or cut by rows: {problem}")
        return 0

    def _chunk_rows(self, model_key: str, feeds: dict[str, np.ndarray]) -> int:
        """The rows per chunk :meth:`_infer_chunked` runs request ``feeds`` (input name → array) in: ``chunk_rows``
        or the model's ``max_batch_size`` if larger, when the model batches and every input has the same leading
        dimension, larger than that; else 0 (one run)."""
        mb = self.max_batch.get(model_key, 0)
        chunk = max(self.config.chunk_rows, mb)
        first = next(iter(feeds.values()), None)
        n = first.shape[0] if first is not None and first.ndim else 0
        if self.config.chunk_rows and mb > 0 and n > chunk and all(a.ndim and a.shape[0] == n for a in feeds.values()):
            return chunk
        return 0

    def _serve_waiting(self) -> tuple[float, float]:
        """On the inference thread, between two chunks of a large request: take every request waiting in the
        mailbox, compute the small ones (a body within the inline bound of its model version,
        :func:`inline_max_body_bytes`, whatever its backend) now and hand their outcomes to the loop, and hold the
        others back for the thread's next batch, in order (:attr:`_held_back`). Returns the wall and thread CPU
        seconds it took (0.0, 0.0 with nothing waiting)."""
        waiting = []
        while True:
            try:
                job = self.mailbox.get_nowait()
            except queue.Empty:
                break
            if job is not None:  # (None: the stop's wake-up)
                waiting.append(job)
        if not waiting:
            return 0.0, 0.0
        t0, cpu0 = time.monotonic(), time.thread_time()
        small = []
        for job in waiting:
            mv = self.versions.get(job.model_key)
            (small if mv is not None and len(job.body) <= inline_max_body_bytes(mv) else self._held_back).append(job)
        self._batch_jobs.extend(waiting)  # held by this thread now: a drain's refusal finds them there
        if small:
            self._batch_deadline = max(self._batch_deadline, max(j.deadline for j in small))
            self.stats.served_between_chunks += len(small)
            outcomes = self._run_jobs(small)
            if outcomes:
                self.loop.call_soon_threadsafe(self._outbox.put_nowait, outcomes)
        return time.monotonic() - t0, time.thread_time() - cpu0

    def _prepare(self, job: Job):
        """Decode and check a request from the bus: ``(InferRequest, {input name: numpy array})``.

        Raises:
            InferbusError: a client error naming the field (decode, unexpected/missing input, datatype, shape).
        """
        self.stats.decoded += 1
        body = job.body
        json_ct = job.ct is not None and is_json(job.ct)
        if not json_ct:  # a body of a layout this worker learned: taken apart by slicing (inferbus.actors._layout)
            layout = self._layouts.get(job.model_key, body)
            # (learned against the metadata the version has now: a load replaces the spec dict)
            if layout is not None and layout.tag is self._specs.get(job.model_key):
                taken = layout.take(body)
                if taken is not None:
                    return taken[0], dict(zip(layout.names, taken[1]))
        req = decode_request(body, job.ct)
        mv = self.versions[job.model_key]
        text_inputs = self._bytes_inputs.get(job.model_key)
        spec = self._specs[job.model_key]
        arrays = {}
        for i, t in enumerate(req.inputs):
            # the ingress validated this already; checked again (cheap) so that whatever reaches a worker
            # subject some other way is a client error, never a runtime failure counted against the worker
            if (misfit := _input_misfit(spec, t, i, arrays)) is not None:
                raise misfit
            arr = input_to_numpy(t, field=f"inputs[{i}]")
            if text_inputs and t.name in text_inputs:
                arr = _bytes_to_text(arr, t, i)
            arrays[t.name] = arr
        for info in mv.inputs:
            if info.name not in arrays:
                raise InvalidArgument(f"missing input {info.name!r}", field="inputs")
        if not json_ct:
            self._layouts.learn(job.model_key, body, req, list(arrays.values()), None, mv.name, None, spec)
        return req, arrays

    def _prepare_local(self, job: Job):
        """The compute's view of a request the colocated ingress decoded and validated against the same model
        metadata: ``(InferRequest, {input name: numpy array})`` with no decoding; BYTES inputs become text
        as in :meth:`_prepare`. Falls back to :meth:`_prepare` (a full decode and check, timed as
        ``worker_decode``) if the input names are not exactly this worker's for the version (a safety net:
        both actors read the same repository).
        """
        req, tensors = job.decoded
        text_inputs = self._bytes_inputs.get(job.model_key)
        arrays = {}
        for i, t in enumerate(req.inputs):
            arr = tensors[i]
            if text_inputs and t.name in text_inputs:
                arr = _bytes_to_text(arr, t, i)
            arrays[t.name] = arr
        if arrays.keys() != self._specs[job.model_key].keys():
            t_dec = time.monotonic()
            out = self._prepare(job)
            job.decode_us = int((time.monotonic() - t_dec) * 1e6)
            return out
        return req, arrays

    def _local_misfit(self, job: Job, req) -> InferbusError | None:
        """Why request ``req``, handed over in-process by the colocated ingress and failed by the model, does not fit
        this worker's metadata of its version (an unexpected input, another datatype or shape), as the client error
        :meth:`_prepare` gives; None when it fits (the failure is the model's) or it came over the bus (checked by
        :meth:`_prepare` already). Read only after a model run failed: a version re-pinned to files that take
        another datatype or shape reaches this worker before its ingress, which checked the request against the
        old metadata (a fresh-user trial: such requests were answered INTERNAL and opened the worker's breaker)."""
        spec = self._specs.get(job.model_key) if job.local else None
        if spec is None:
            return None
        seen: dict = {}
        for i, t in enumerate(req.inputs):
            if (misfit := _input_misfit(spec, t, i, seen)) is not None:
                return misfit
            seen[t.name] = None
        return None

    def _model_failure(self, job: Job, req, sess, res: Exception) -> Outcome:
        """The answer to a request whose model run raised ``res`` (an :class:`InferenceError`).

        * The request does not fit this worker's metadata of the version (:meth:`_local_misfit`): that client error.
        * The failure is the input's: the session runs its zero-filled warm-up input again, now, on this thread,
          and it succeeds (a worker does not serve a model that cannot run it: see :meth:`__init__`). The model
          refused this input past what its metadata says (an index out of a Gather's table, a Reshape or a
          broadcast the dimensions do not allow, a zero Range step): INVALID_ARGUMENT, naming the runtime's words,
          no failure of the worker. Every replica would fail it alike, so holding it against this one opened the
          breakers of every worker, and ten such requests to one model made a node refuse every model for 30 s (a
          fresh-user trial). ``stats.input_failures`` counts them.
        * Otherwise (the warm-up input fails too, or the failure was injected): INTERNAL, a server error that
          counts against this worker's breaker and health window.

        The check costs one batch-1 run of the model per failed request, only on this failure path.
        """
        if (misfit := self._local_misfit(job, req)) is not None:  # the ingress checked older metadata
            return self._error_outcome(job, misfit)
        mv = self.versions[job.model_key]
        if not getattr(res, "injected", False) and _runs_warmup_input(sess):
            self.stats.input_failures += 1
            o = self._error_outcome(job, InvalidArgument(
                f"model {mv.name!r} version {mv.version} failed on this input (it runs others: the failure is the "
                f"input's, every replica would fail it alike): {res}"))
        else:
            o = self._error_outcome(job, Internal(f"inference failed: {res}"), server_error=True)
        o.executed = True
        return o

    def _error_outcome(self, job: Job, err: InferbusError, server_error: bool = False) -> Outcome:
        if server_error:
            self.stats.errors += 1
        hdrs, body = error_message(err, job.ct, job.rid)
        return Outcome(job, hdrs, body, ok=False, server_error=server_error, code=err.code.value)

    def _run_group(self, model_key: str, outs: list[str] | None, items) -> list[Outcome]:
        """Run ``items`` (``(job, request, {input name: array})``) of one model version, merged into one model run
        where they can be (:func:`_run_merged`), else one by one; the flight recorder holds, during each run, the
        requests it holds (:mod:`inferbus.actors._flight`). Returns their outcomes, in order."""
        sess = self.sessions[model_key]
        digest = self.digests.get(model_key)  # of the files sess was loaded from (a re-pin may swap it meanwhile)
        paused = [0.0, 0.0]  # wall and CPU s spent on small requests between chunks of a large one: not this run's
        t0 = time.monotonic()
        cpu0 = time.thread_time()
        results: list[dict[str, np.ndarray]] | None = None
        flight = self.flight
        slot = LOOP_SLOT if items[0][0].inline else THREAD_SLOT
        try:
            if flight is not None:
                flight.record(slot, _flight_pairs(items))
            if len(items) > 1:
                results = _run_merged(sess, outs, [a for _, _, a in items])
            if results is None:
                results = []
                for item in items:
                    if flight is not None and len(items) > 1:
                        flight.clear(slot)
                        flight.record(slot, _flight_pairs((item,)))
                    try:
                        results.append(self._infer_chunked(model_key, sess, outs, item, slot, paused)
                                       if slot == THREAD_SLOT and len(items) == 1 else sess.infer(item[2], outs))
                    except (InferenceError, _Abandoned) as exc:
                        results.append(exc)
        finally:
            if flight is not None:
                flight.clear(slot)
        outcomes = []
        t1 = time.monotonic()
        compute_us = int((t1 - t0 - paused[0]) * 1e6)
        between_us = int(paused[0] * 1e6) if paused[0] else 0  # (only a chunked request's run has any)
        mb = self._inline_max_bytes.get(model_key)  # a run with a request over the inline bound does not price it
        self._account(model_key, len(items), compute_us, (time.thread_time() - cpu0 - paused[1]) * 1e6,
                      mb is None or (len(items[0][0].body) <= mb if len(items) == 1
                                     else all(len(job.body) <= mb for job, _, _ in items)))
        s = self.stats
        mv = self.versions[model_key]
        fault_rate = self.fault.error_rate
        errors = 0
        for (job, req, arrays), res in zip(items, results):
            if fault_rate > 0 and not isinstance(res, Exception) and self._rng.random() < fault_rate:
                res = InferenceError("injected fault (FaultSet.error_rate)")
                res.injected = True  # a worker failure by definition: not judged by the warm-up input
            if isinstance(res, _Abandoned):
                outcomes.append(res.outcome)
                continue
            if isinstance(res, Exception):
                failed = self._model_failure(job, req, sess, res)
                errors += failed.server_error
                outcomes.append(failed)
                continue
            try:
                outcomes.append(self._encode(job, req, mv, res, t0, compute_us, len(items), digest, between_us))
            except InferbusError as err:  # an output the wire cannot carry (e.g. a BYTES element over 4 GiB)
                outcomes.append(self._error_outcome(job, err))
                continue
            s.completed += 1
        (self.window_inline if items[0][0].inline else self.window).add(time.monotonic(), len(items), errors)
        return outcomes

    def _fill_current(self, job: Job, digest: str | None = None) -> bool:
        """Whether the answer to ``job`` may fill the result cache: its version is not being re-pinned here
        (:attr:`repinning`), and the pin its ingress keyed the entry with (``job.pin`` from the bus; the colocated
        ingress's :attr:`local_pins` for an in-process job; none: nothing to compare) is ``digest``, the files the
        session that computed it was loaded from (None: the current session's). Answers of the old files computed
        while a re-pin loads were cached under the new pin (a fresh-user trial); refusing a fill only costs a miss."""
        key = job.model_key
        if key in self.repinning:
            return False
        pin = self.local_pins.get(key) if job.local else job.pin
        return pin is None or pin == (digest if digest is not None else self.digests.get(key))

    def _account(self, model_key: str, n: int, compute_us: int, cpu_us: float, prices_inline: bool = True) -> None:
        """Count one model run of ``n`` requests that took ``compute_us`` (wall clock) and ``cpu_us`` (this
        thread's CPU time): the service-time EWMA (per request, the load reports' price), the per-model
        compute EWMA (CPU per request, what decides inline execution: :func:`price_ewma`) unless ``prices_inline``
        is False (a run with a request over the model's inline body bound, which would send its small requests to
        the thread for a while), ``computed`` and ``batches``, and records the run for the per-model histograms
        (:attr:`_runs`: one append of a tuple; the bucketing is done off the request path, :func:`fold_runs`)."""
        self._runs.append((model_key, n, compute_us))
        per_us = compute_us / n
        s = self.stats
        s.ewma_service_us = per_us if s.ewma_service_us == 0 else (1 - _EWMA_ALPHA) * s.ewma_service_us + _EWMA_ALPHA * per_us
        if prices_inline:
            self.compute_ewma_us[model_key] = price_ewma(self.compute_ewma_us.get(model_key), cpu_us / n)
        s.computed += n
        s.batches += 1

    def _encode(self, job: Job, req, mv, res: dict[str, np.ndarray], t0: float, compute_us: int, batch: int,
                digest: str | None = None, between_chunks_us: int = 0) -> Outcome:
        """The answer to ``job`` from the model's outputs ``res`` (name → array), computed at ``t0`` (monotonic s) in
        ``compute_us`` in a run of ``batch`` requests, with its timings; for a job that wants a cache fill, the
        answer in msgpack too, unless :meth:`_fill_current` says the session's files (``digest``; None: the
        current session's) are not those the entry is keyed with. ``between_chunks_us``: the time a chunked
        request's run spent on other requests between its chunks (:meth:`_infer_chunked`), its ``between_chunks``
        stage when not 0 (``compute`` leaves it out), so that the stages still add up to ``worker_total``.

        Raises:
            InferbusError: an output the wire cannot carry.
        """
        ct = job.ct
        json_ct = is_json(ct)
        raw = answers_raw(req)
        t_enc = time.monotonic()
        outputs = [output_from_numpy(name, arr, raw=raw) for name, arr in res.items()]
        timings = job.timings
        if type(timings) is not dict:
            timings = job.timings = _parse_timings(timings)  # (kept: the worker span reads the stages)
        timings["queue"] = int((t0 - job.t_recv) * 1e6) - job.decode_us
        timings["worker_decode"] = job.decode_us
        timings["compute"] = compute_us
        if between_chunks_us:
            timings["between_chunks"] = between_chunks_us
        if job.forward_hop_us >= 0:
            timings["forward_hop"] = job.forward_hop_us
        params = {
            "worker_id": self.config.worker_id, "device": self.device.name if self.device else "",
            "backend": self.config.backend, "precision": self.sessions[mv.key].precision, "cache_hit": False,
            "region": self.config.region, "term": job.term or 0,
            "batch_size": batch, "exec": "inline" if job.inline else "thread",
            "forward": "local" if job.local else "bus", "timings_us": timings,
        }
        resp = InferResponse(model_name=mv.name, model_version=mv.version, outputs=outputs, id=req.id, parameters=params)
        t_end = time.monotonic()  # one reading ends both stages
        timings["encode"] = int((t_end - t_enc) * 1e6)
        timings["worker_total"] = int((t_end - job.t_recv) * 1e6)
        timings["worker_done_unix_us"] = int(time.time() * 1e6)  # the bench's reply_hop starts here
        body = encode_response(resp, ct)
        hdrs = {H.CONTENT_TYPE: "application/json" if json_ct else "application/msgpack"}
        rid = job.rid
        if rid:
            hdrs[H.REQUEST_ID] = rid
        cached = None
        if job.want_body and (not (self.repinning or self.local_pins or job.pin) or self._fill_current(job, digest)):
            cached = body if not json_ct else encode_response(resp, None)
        return Outcome(job, hdrs, body, ok=True, service_us=compute_us, response_msgpack=cached, executed=True,
                       block=reply_block(json_ct, rid))


def price_ewma(prev_us: float | None, sample_us: float) -> float:
    """A model's compute EWMA (µs of CPU per request) after one run's ``sample_us``: the sample itself for the first
    (``prev_us`` None), else ``(1 - α) prev + α min(sample, PRICE_CLIP_X × prev)`` with α = 0.2 (a clipped sample:
    :data:`PRICE_CLIP_X`); a ``prev_us`` of 0 (a model that could not be timed on zero inputs at load) takes the
    sample unclipped."""
    if prev_us is None:
        return sample_us
    if prev_us > 0:
        sample_us = min(sample_us, PRICE_CLIP_X * prev_us)
    return (1 - _EWMA_ALPHA) * prev_us + _EWMA_ALPHA * sample_us


def output_row_bytes(outputs, raw: bool = True) -> dict[str, int]:
    """Bytes one row takes in the answer, per output of ``outputs`` (:class:`~inferbus.accelerators.TensorInfo`) whose
    size per row is known from the metadata alone: a fixed-size datatype (not BYTES) and a shape of a variable first
    dimension (the batch) and fixed others. ``raw``: the ``raw`` form, the row's elements × the datatype's bytes
    (base64 in JSON is larger); else the ``data`` form, 1 byte an element (the least a number takes in MessagePack
    or JSON). Outputs whose size per row is not known are left out."""
    out = {}
    for t in outputs:
        if t.datatype == "BYTES" or not t.shape or t.shape[0] != -1 or any(d < 0 for d in t.shape[1:]):
            continue
        n = math.prod(t.shape[1:])
        out[t.name] = n * numpy_dtype(t.datatype).itemsize if raw else n
    return out


def answer_row_bytes(outputs) -> int:
    """Σ :func:`output_row_bytes` (``raw`` form) of ``outputs``: the most an answer's known outputs take per row in any
    form, so that a request of at most ``limit // this`` rows cannot be refused early (one compare per request;
    :meth:`Worker._answer_too_large` looks closer only past it); 0 when no output's size per row is known. Computed
    once per model version load (:meth:`Worker.note_answer_rows`)."""
    return sum(output_row_bytes(outputs).values())


def inline_max_body_bytes(mv) -> int:
    """The largest request body (bytes) of model version ``mv`` that may run inline on a worker's event loop:
    16 rows in the raw form (Σ over inputs of the row's elements × itemsize, a variable dimension counted as 1, a
    BYTES element as 64 bytes) plus 1 KiB for the envelope, within [:data:`INLINE_BODY_FLOOR_BYTES`,
    :data:`INLINE_BODY_CEIL_BYTES`]. JSON bodies are 2-3 × the raw form, so a few rows of JSON still fit."""
    row = 0
    for t in mv.inputs:
        n = 1
        for d in t.shape:
            n *= d if d > 0 else 1
        row += n * (64 if t.datatype == "BYTES" else numpy_dtype(t.datatype).itemsize)
    return min(INLINE_BODY_CEIL_BYTES, max(INLINE_BODY_FLOOR_BYTES, 16 * row + 1024))


def _runs_warmup_input(sess) -> bool:
    """Whether ``sess`` runs its zero-filled batch-1 warm-up input now (:meth:`Worker._model_failure`'s check)."""
    try:
        sess.warmup((1,))
    except Exception:
        return False
    return True


def _time_batch1_us(sess) -> float:
    """Least thread CPU time (µs) of ``_INLINE_SEED_RUNS`` batch-1 runs of ``sess`` on zero inputs (after warm-up)."""
    best = float("inf")
    for _ in range(_INLINE_SEED_RUNS):
        t0 = time.thread_time()
        try:
            sess.warmup((1,))
        except Exception:  # a model that cannot run zero inputs: measured on its first real batches instead
            return 0.0
        best = min(best, (time.thread_time() - t0) * 1e6)
    return best


def _flight_pairs(items) -> list[tuple]:
    """The flight record's entries (:mod:`inferbus.actors._flight`) of ``items`` and of the retries joined to each:
    ``(ingress id, forward seq)`` of a request forwarded over the bus, ``(model version key, request id or "",
    body)`` of one the colocated ingress handed over in-process (that ingress dies with this process)."""
    return [(t.model_key, t.rid or "", t.body) if t.local else (t.ingress, t.seq)
            for job, _, _ in items for t in (job.targets() if job.joined else (job,))
            if t.local or (t.ingress is not None and t.seq >= 0)]


def _by_rows(items: list, max_rows: int):
    """``items`` (``(job, request, {input name: array})``) in groups to merge into one model run each, whose rows
    (a request's leading dimension; 1 for inputs without one) add up to at most ``max_rows`` (the model's
    ``max_batch_size``, docs/wire.md). A request of ``max_rows`` rows or more is a group of its own, at once,
    and does not end the group of smaller ones around it; the others are grouped in order.
    """
    group: list = []
    rows = 0
    for item in items:
        first = next(iter(item[2].values()), None)
        n = first.shape[0] if first is not None and first.ndim else 1
        if n >= max_rows:
            yield [item]
            continue
        if group and rows + n > max_rows:
            yield group
            group, rows = [], 0
        group.append(item)
        rows += n
    if group:
        yield group


def _run_merged(sess, outs: list[str] | None, feeds_list: list[dict[str, np.ndarray]]):
    """Run several requests as one batch; None when they cannot be merged safely.

    Merged only when each request's inputs share one leading dimension (its row
    count) and every output comes back with the summed row count, so splitting
    by row counts gives each request exactly its own rows.
    """
    sizes = []
    for feeds in feeds_list:
        lead = {a.shape[0] if a.ndim else -1 for a in feeds.values()}
        if len(lead) != 1 or -1 in lead:
            return None
        sizes.append(lead.pop())
    try:
        merged_feeds = {name: np.concatenate([f[name] for f in feeds_list], axis=0) for name in feeds_list[0]}
        merged = sess.infer(merged_feeds, outs)
    except (InferenceError, ValueError, KeyError):
        return None  # fall back to one by one (e.g. shapes that do not stack)
    total = sum(sizes)
    if any(arr.ndim == 0 or arr.shape[0] != total for arr in merged.values()):
        return None
    results: list[dict[str, np.ndarray]] = [dict() for _ in feeds_list]
    for name, arr in merged.items():
        start = 0
        for r, n in zip(results, sizes):  # row views, as np.split gives (it costs ~6x more for small parts)
            r[name] = arr[start:start + n]
            start += n
    return results


def _bytes_to_text(arr: np.ndarray, t, i: int) -> np.ndarray:
    """BYTES elements as ``str`` for the runtime (ONNX Runtime's Python API takes text, not bytes).

    Raises:
        InvalidArgument: an element is not valid UTF-8 (naming the tensor's field): such
            bytes cannot reach the model unchanged, so they are refused rather than altered.
    """
    out = np.empty(arr.shape, dtype=object)
    flat_in = arr.ravel()
    flat_out = out.ravel()
    for k, b in enumerate(flat_in):
        try:
            flat_out[k] = b.decode("utf-8") if isinstance(b, (bytes, bytearray)) else str(b)
        except UnicodeDecodeError:
            where = "raw" if t.raw is not None else "data"
            raise InvalidArgument(f"input {t.name!r} element {k} is not valid UTF-8; this model's runtime takes "
                                  f"BYTES tensors as text", field=f"inputs[{i}].{where}") from None
    return out


def _parse_timings(value: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    if value:
        for part in value.split(","):
            k, _, v = part.partition("=")
            try:
                out[k] = int(v)
            except ValueError:
                pass
    return out



def done_notices(worker_id: str, items: list[DoneItem], max_bytes: int) -> list[bytes]:
    """``items`` (completions for one ingress) encoded as ``DoneNotice`` messages of at most ``max_bytes`` each
    (the bus's ``max_payload`` less the header allowance; 0: no bound, one notice).

    One notice unless the answers sent back for cache fills (``DoneItem.response``) make it larger: then
    the items are split over several notices, and an item whose answer alone cannot fit is sent without it
    (its answer is not cached; everything else about it is settled). A notice the server refused
    (``MaxPayloadError``) left every completion in it unsettled: the ingress then counted the requests as lost
    and opened the breakers of healthy workers (a fresh-user trial: large batches, answers of ~8 MB).
    """
    if max_bytes <= 0 or not any(it.response is not None for it in items):
        return [encode_internal(DoneNotice(worker_id, items))]
    sizes = [_DONE_ITEM_BYTES + (len(it.response) if it.response is not None else 0) for it in items]
    if _DONE_NOTICE_BYTES + sum(sizes) <= max_bytes:
        return [encode_internal(DoneNotice(worker_id, items))]
    out: list[bytes] = []
    chunk: list[DoneItem] = []
    size = _DONE_NOTICE_BYTES
    for it, n in zip(items, sizes):
        if _DONE_NOTICE_BYTES + n > max_bytes:  # its answer alone is too large to travel back: settle it without
            it = msgspec.structs.replace(it, response=None)
            n = _DONE_ITEM_BYTES
        if chunk and size + n > max_bytes:
            out.append(encode_internal(DoneNotice(worker_id, chunk)))
            chunk, size = [], _DONE_NOTICE_BYTES
        chunk.append(it)
        size += n
    out.append(encode_internal(DoneNotice(worker_id, chunk)))
    return out

def _start_failure(mv, exc: BaseException, where: str = "") -> str:
    """One line: the model version a worker could not load at start, and the runtime's reason."""
    return (f"model {mv.name!r} version {mv.version} ({mv.path}) could not be loaded{where}: "
            f"{type(exc).__name__}: {' '.join(str(exc).split())}{bf16_hint(mv, exc)}")


def _input_misfit(spec: dict, t, i: int, seen) -> InferbusError | None:
    """The client error input ``t`` (``inputs[i]``) is against a version's input ``spec`` (name → tensor metadata):
    an unexpected name or one already in ``seen``, another datatype, a shape that does not fit (a dimension of -1
    takes any size); None when it fits."""
    info = spec.get(t.name)
    if info is None or t.name in seen:
        return InvalidArgument(f"unexpected or repeated input {t.name!r}", field=f"inputs[{i}].name")
    if t.datatype != info.datatype:
        return datatype_mismatch(t.name, info.datatype, t.datatype, f"inputs[{i}].datatype")
    if len(t.shape) != len(info.shape) or any(d >= 0 and d != n for d, n in zip(info.shape, t.shape)):
        return InvalidArgument(f"input {t.name!r} shape {list(t.shape)} does not fit {list(info.shape)}",
                               field=f"inputs[{i}].shape")
    return None


def _quiesce_on_sigusr1(loop: asyncio.AbstractEventLoop, start_drain) -> bool:
    """Make SIGUSR1 (the node's quiesce notice) begin this worker's drain; False where signals cannot be
    handled here (not the main thread, no such signal)."""
    import signal

    try:
        loop.add_signal_handler(signal.SIGUSR1, start_drain)
    except (AttributeError, NotImplementedError, RuntimeError, ValueError):
        return False
    return True


def _ignore_sigusr1(loop: asyncio.AbstractEventLoop) -> None:
    """Stop handling SIGUSR1 and ignore it from now on (the default action would end the process)."""
    import signal

    try:
        loop.remove_signal_handler(signal.SIGUSR1)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    except (AttributeError, NotImplementedError, RuntimeError, ValueError):
        pass


def main(config_json: str) -> None:
    """Process entry: ``python -m inferbus.actors worker '<WorkerConfig JSON>'``."""
    import signal

    if hasattr(signal, "SIGUSR1"):  # until run() handles it: a quiesce notice never kills a worker still starting
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    cfg = WorkerConfig.from_json(config_json)
    run_actor(Worker(cfg).run)
