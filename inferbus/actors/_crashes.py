"""The query-of-death memory: requests held by workers that died, kept by each ingress and by each node.

An ingress counts a worker's crash against the requests its model run held (:meth:`Ingress._note_deaths`), refuses
a request taken for a query of death (a request that kills its worker) on sight, and shares what a crash changed with
the other ingresses (``<p>._deaths``; docs/failure-semantics.md, "A request that kills its worker"). The node keeps
the same memory (:class:`CrashKeeper`): it outlives its actor processes, so an ingress that starts after every peer
died with a killer (``--colocate``, one process, or all of them in one batch of retries) still learns it, and the
node counts the in-process requests of a colocated process's crash itself, whose own ingress died with it.

The memory is a dict ``key -> (deaths, forgotten after (monotonic s), the last death's reason, the refusal when the
request is taken for a query of death else None)``, in the order of that time (an entry updated is inserted again).
Keys: ``("body", model version key, request digest)`` (:func:`request_digest`) and ``("key", cache key)``.
"""

from __future__ import annotations

import hashlib
import time

import msgspec

from ..bus import Subjects
from ..schemas import decode_request, input_to_numpy
from ..schemas._codec import JSON, looks_like_json
from ..schemas._internal import DeathMemory, InternalDecodeError, decode_internal, encode_internal
from ._common import log

QUERY_OF_DEATH_DEATHS = 2
"""Worker deaths (a crash, not a stop) while holding one request after which the ingress takes that request to be
what kills them: answered INTERNAL, not retryable, and refused on sight for :data:`QUERY_OF_DEATH_TTL_S`. One death
is retried elsewhere (UNAVAILABLE): a worker can die of something else (the OOM killer, a kill -9)."""
QUERY_OF_DEATH_TTL_S = 60.0
"""How long after the last death holding it a request stays refused (s)."""
MEMORY_ENTRIES = 4096
"""Most keys remembered (the oldest is forgotten first)."""


_encode_extras = msgspec.msgpack.Encoder().encode


def request_digest(body: bytes, req=None) -> bytes:
    """What identifies a request's inputs across its copies after a crash: BLAKE2b, 16 bytes (RFC 7693), over each
    input's name, datatype, shape and values (as the numpy array it carries) and the requested outputs and request
    ``parameters``; not the request's ``id`` nor the inputs' ``parameters``. So the same inputs are the same request
    whether sent as JSON or MessagePack, as ``data`` lists or ``raw`` bytes, under a new body ``id`` for each copy (as
    a KServe client does) or with map keys in another order. ``req``: the request already decoded from ``body`` (the
    ingress has it), else ``body`` is decoded here; the body's bytes as they are when it does not decode. Computed only
    after a crash, for the requests it held, and for each request while a crash is remembered (a few µs for a small
    request, decoded)."""
    try:
        if req is None:
            req = decode_request(body, JSON if looks_like_json(body) else None)
        h = hashlib.blake2b(digest_size=16)
        for i, t in enumerate(req.inputs):
            arr = input_to_numpy(t, field=f"inputs[{i}]")
            h.update(f"{t.name}\0{t.datatype}\0{arr.shape}\0".encode())
            h.update(_encode_extras(arr.tolist()) if arr.dtype == object else arr.tobytes())
        h.update(_encode_extras((req.outputs, req.parameters)))
        return h.digest()
    except Exception:  # not a request (a test's bytes, a body the ingress refuses): its bytes as they are
        return hashlib.blake2b(bytes(body), digest_size=16).digest()


def death_keys(model_key: str, cache_key: str | None, body: bytes, req=None) -> tuple:
    """The memory's keys of one request: its inputs (:func:`request_digest`) with the model version, and its cache key
    (only where the model's answers are cached). Not its request id: the SDK's retries carry the same body, and an id
    is only unique per client (two clients numbering theirs 1, 2, ... would refuse each other's innocent requests).
    ``req``: ``body`` decoded, when the caller has it."""
    keys = [("body", model_key, request_digest(body, req))] if body else []
    if cache_key:
        keys.append(("key", cache_key))
    return tuple(keys)


def poison_message(model_key: str, deaths: int, reason: str, alone: bool = False) -> str:
    """The INTERNAL answer's message for a request taken for a query of death."""
    who = (f"a worker died ({reason}) running this request to {model_key} alone" if alone and deaths == 1 else
           f"{deaths} workers died while holding this request to {model_key} (the last: {reason})")
    return (f"{who}: it is taken to be what kills them, is not retried, and is refused for "
            f"{QUERY_OF_DEATH_TTL_S:g} s after the last such death (docs/failure-semantics.md, a request that kills "
            f"its worker)")


def count_crash(memory: dict, now_deaths: dict, model_key: str, keys: tuple, reason: str, caught: bool,
                now: float) -> str | None:
    """Count one crash against one request with ``keys``: its deaths are one more than the most any of its keys has
    in ``memory`` (within their time), noted in ``now_deaths`` (key -> (deaths, refusal)) for :func:`commit_crash`, so
    that copies of one request in one crash count once. Returns the refusal's message when the request is now taken
    for a query of death (:data:`QUERY_OF_DEATH_DEATHS` deaths, or ``caught``: a fault signal in a run that held it
    alone), else None."""
    deaths = 1 + max((e[0] for k in keys if (e := memory.get(k)) is not None and e[1] > now), default=0)
    refusal = poison_message(model_key, deaths, reason, alone=caught) if deaths >= QUERY_OF_DEATH_DEATHS or caught \
        else None
    for k in keys:
        d, r = now_deaths.get(k, (0, None))
        now_deaths[k] = (max(d, deaths), r or refusal)
    return refusal


def commit_crash(memory: dict, now_deaths: dict, reason: str, now: float) -> None:
    """Write what :func:`count_crash` counted into ``memory`` (each key re-inserted last), oldest keys forgotten past
    :data:`MEMORY_ENTRIES`."""
    for k, (deaths, refusal) in now_deaths.items():
        memory.pop(k, None)
        memory[k] = (deaths, now + QUERY_OF_DEATH_TTL_S, reason, refusal)
    while len(memory) > MEMORY_ENTRIES:
        memory.pop(next(iter(memory)))


def memory_entries(memory: dict, keys, now: float) -> list:
    """:class:`DeathMemory` entries of ``keys`` still remembered (all of ``memory`` for None)."""
    out = []
    for k in (memory if keys is None else keys):
        e = memory.get(k)
        if e is not None and e[1] > now:
            out.append((list(k), e[0], e[1] - now, e[2], e[3]))
    return out


def merge_memory(memory: dict, m: DeathMemory, now: float) -> int:
    """Take a peer's entries (shared, or its answer to a starting ingress's ask): per key the most deaths, the later
    expiry (at most :data:`QUERY_OF_DEATH_TTL_S` from now), a refusal if either has one. Returns how many keys changed
    here."""
    changed = 0
    for key, n, ttl_s, reason, refusal in m.entries:
        if not key or not isinstance(key[0], str) or n < 1 or not ttl_s > 0:
            continue
        k = tuple(key)
        e = memory.get(k)
        until = now + min(ttl_s, QUERY_OF_DEATH_TTL_S)
        if e is not None and e[1] > now:
            if e[0] >= n and (e[3] is not None or refusal is None):
                continue  # nothing new here
            n, until, refusal = max(n, e[0]), max(e[1], until), refusal or e[3]
        memory.pop(k, None)
        memory[k] = (n, until, reason, refusal)
        changed += 1
    while len(memory) > MEMORY_ENTRIES:
        memory.pop(next(iter(memory)))
    return changed


async def share_memory(nc, subjects: Subjects, memory: dict, keys, who: str) -> None:
    """Publish the entries of ``keys`` in ``memory`` on ``<p>._deaths`` under the name ``who`` (best effort: a message
    lost only costs a retry one more death)."""
    entries = memory_entries(memory, keys, time.monotonic())
    if not entries or nc is None:
        return
    try:
        await nc.publish(subjects.deaths, encode_internal(DeathMemory(who, entries)))
    except Exception as exc:
        log(f"{who}: could not share the query-of-death memory: {exc!r}")


async def answer_ask(nc, msg, memory: dict, who: str, always: bool = False) -> None:
    """Answer a starting ingress's ask on ``<p>._deaths.get`` with ``memory``: when it holds something, or ``always``
    (a node, whose memory has every ingress's shares: its answer, empty or not, is enough, so the asker need not wait
    for a better one; an ingress with nothing to tell stays silent, so as not to answer first with nothing)."""
    if not msg.reply:
        return
    entries = memory_entries(memory, None, time.monotonic()) if memory else []
    if not entries and not always:
        return
    try:
        await nc.publish(msg.reply, encode_internal(DeathMemory(who, entries)))
    except Exception:
        pass


class CrashKeeper:
    """The node's query-of-death memory: merges what its ingresses share (``<p>._deaths``), answers an ingress that
    starts (``<p>._deaths.get``), and counts a colocated process's in-process requests itself (:meth:`on_crash`).

    Args:
        subjects: the deployment's subjects.
        who: the name it shares under (``node <id>``).
    """

    def __init__(self, subjects: Subjects, who: str) -> None:
        self.subjects = subjects
        self.who = who
        self.memory: dict = {}
        self.nc = None

    async def start(self, nc) -> None:
        self.nc = nc
        await nc.subscribe(self.subjects.deaths, cb=self._on_share)
        await nc.subscribe(self.subjects.deaths_get, cb=self._on_ask)

    async def _on_share(self, msg) -> None:
        try:
            m = decode_internal(msg.data)
        except InternalDecodeError:
            return
        if isinstance(m, DeathMemory) and m.ingress != self.who:
            merge_memory(self.memory, m, time.monotonic())

    async def _on_ask(self, msg) -> None:
        await answer_ask(self.nc, msg, self.memory, self.who, always=True)

    def on_crash(self, running_local: list[tuple[str, str, bytes]], others: int, fault: bool, reason: str) -> list:
        """Count a colocated process's crash against the requests its own ingress had handed to its worker in-process
        (``(model version key, request id, request digest)``; ``others``: the other requests its runs held), as an
        ingress does (:meth:`Ingress._note_deaths`). Returns the keys it changed, for :meth:`share`."""
        now = time.monotonic()
        caught = fault and others + len(running_local) == 1
        now_deaths: dict = {}
        for model_key, _rid, digest in running_local:
            count_crash(self.memory, now_deaths, model_key, (("body", model_key, digest),), reason, caught, now)
        commit_crash(self.memory, now_deaths, reason, now)
        return list(now_deaths)

    async def share(self, keys: list) -> None:
        """Publish the entries of ``keys`` on ``<p>._deaths`` (:func:`share_memory`)."""
        await share_memory(self.nc, self.subjects, self.memory, keys, self.who)
