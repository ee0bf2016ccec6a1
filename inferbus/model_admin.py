"""Model management from a client: load, unload and set the default model version at run time.

Sends :class:`inferbus.schemas.ModelControlRequest` to ``<p>.models.<model>.<op>`` (any ingress
of the local queue group answers) and returns the :class:`inferbus.schemas.ModelControlReply`.
No retry of a refusal: a write refused by a standby region (UNAVAILABLE naming the primary) is raised, once the queue
group refused it too (below).

Which ingress: the queue group hands a request to any member whose connection is open, a hung one (SIGSTOPped, a
stalled VM) included, and a write that landed there waited half its budget (its first attempt's timeout) before the
retry went to a live ingress. So a write first asks ``<p>.ingresses`` (every serving ingress answers its id) and goes
to the ingress that answers first, on that ingress's own subject: answered as fast as a write with every ingress
alive. What is known is said at once: with no ingress subscribed, the roll call's "no responders" sends the write
through the queue group at once, whose own "no responders" is UNAVAILABLE at once ("no ingress is serving"); an
ingress that answered the roll call but is gone when the write reaches it ("no responders" there) gives its place to
the queue group at once. Without any answer to the roll call within ``ROLL_CALL_WAIT_S`` (every ingress
hung, or too loaded to answer), or with a budget under ``ROLL_CALL_MIN_BUDGET_S``, the write goes through the queue
group, as before. The failover stays: a write with no
answer after half its budget is sent once more (the SDK's attempt timeout, same request id) to the ingress that
answers the roll call then, so that an ingress that died holding it costs half the budget, not all of it. The roll
call reaches every region's ingresses across the gateways: a write refused by the one that answered first because its
region is not the primary (UNAVAILABLE, ``field`` ``region``) goes once more through the queue group, which serves it in
the client's own region first, as before the roll call; refused there too, the refusal is raised. A write
whose budget runs out names the ingress it was last sent to and each ingress that its node lists but that never
answered the roll call (``<p>.nodes``: ``ingress n1-i0 (pid 4711, node n1)``), hung.
Semantics: docs/models.md.
"""

from __future__ import annotations

import asyncio
import json
import time

from .schemas import (MODEL_OPS, DeadlineExceeded, InvalidArgument, ModelControlReply, ModelControlRequest, decode,
                      Unavailable, encode)

ROLL_CALL_WAIT_S = 0.25
"""How long a write waits for the first ingress to answer ``<p>.ingresses`` (a quarter of its budget at most) before
it goes through the queue group instead; a live ingress answers in about a bus round trip."""

ROLL_CALL_MIN_BUDGET_S = 0.05
"""A write with a smaller budget skips the roll call and goes through the queue group at once: a quarter of it would
not fit a round trip on a busy host, and what was left could be spent before the write is sent (nothing sent)."""


async def model_control(client, op: str, model: str, version: str | None = None, *,
                        timeout_s: float = 60.0) -> ModelControlReply:
    """Run one model-management operation and wait for its answer.

    Args:
        client: an :class:`inferbus.client.Client` (its connection and prefix are used; its UNAVAILABLE
            retries are not).
        op: ``load``, ``unload`` or ``default``.
        model: model name. version: the model version (``load`` without one: every version on disk
            not served yet; required for ``unload`` and ``default``).
        timeout_s: budget in seconds (a ``load`` waits for every required worker to load the version).

    Returns:
        The reply: served versions, default version, the state's revision, per-worker outcome.

    Raises:
        InvalidArgument: unknown ``op``, or a model name that cannot be one subject token (empty, or holding
            ``.``, ``*``, ``>`` or whitespace), both before sending; or a request the ingress refuses (unloading
            the default version, a version that is not a number).
        NotFound: unknown model, or a version that is not on disk / not served.
        Unavailable: writes are refused in this region (not the primary), or the version is not loaded
            on every worker yet (``default``), or no ingress is subscribed (at once, naming the ingresses a node
            lists that do not answer, if any).
        DeadlineExceeded: no answer within ``timeout_s``; the message says that the operation may still have
            been applied (a slow load keeps going on the workers), the ingress the last attempt went to, and each
            ingress a node lists that never answered the roll call (hung).
        Internal: no worker could load the version (its reason in the message).

    Cancellation: the roll call's subscriptions are ended; a write already sent may still be applied.
    """
    if op not in MODEL_OPS:
        raise InvalidArgument(f"unknown model operation {op!r}; operations: {', '.join(MODEL_OPS)}", field="op")
    from .client import Client, _check_timeout, _subject_token

    _subject_token(model, "model")  # '../etc' or 'dig.its' would address another subject, not this model
    _check_timeout(timeout_s)  # (before the roll call: nothing is sent for a budget that is none)
    strict = Client(client.nc, client.subjects.prefix, retry_unavailable=False)
    body = encode(ModelControlRequest(version=version))
    t0 = time.monotonic()
    roll = await _RollCall.start(client.nc, strict.subjects if timeout_s >= ROLL_CALL_MIN_BUDGET_S else None)
    try:
        first = await roll.first_ingress(min(ROLL_CALL_WAIT_S, timeout_s / 4))
        subject = strict.subjects.model_control(model, op)
        try:
            resp, ct = await strict.request(subject, body, timeout_s=timeout_s, started_at=t0, at_ingress=first)
        except Unavailable as exc:
            if first is None or exc.field != "region":
                raise
            # the first to answer the roll call was an ingress of another region, a standby (the probe reaches every
            # region's ingresses across the gateways; the other region's answered first in 7 of 40 probes in a
            # trial, docs/regions.md): refused, not applied. Through the queue group, which a server hands to the
            # members of its own cluster (region) first, as every write went before the roll call
            resp, ct = await strict.request(subject, body, timeout_s=timeout_s, started_at=t0)
    except DeadlineExceeded as exc:  # the write went; whether it was applied is not known here
        hung = roll.silent_ingresses()
        raise DeadlineExceeded(f"{exc.message}; " + (f"{hung}; " if hung else "")
                               + f"the {op} may still have been applied (or may still be under way): "
                               f"check with `inferbus models`") from exc
    except Unavailable as exc:
        if exc.field == "region" or roll.live:  # a refusal (a standby region), or an ingress that answered the roll
            raise  # call then went: as it is
        # no ingress answered the roll call ("no responders" to it, or silence: hung then, and dropped by the server
        # before the write's retry, the embedded one dropping a silent connection after 4-6 s; a fresh-user trial:
        # "no ingress is serving" after 31 s, naming no one), or one its node lists is restarting; the nodes answer
        # within a round trip
        await roll.trees_heard(min(ROLL_CALL_WAIT_S, max(t0 + timeout_s - time.monotonic(), 0.0)))
        hung = roll.silent_ingresses()
        if not hung:
            raise
        raise Unavailable(f"{exc.message}; {hung}", field=exc.field, retry_after_ms=exc.retry_after_ms) from exc
    finally:
        await roll.close()
    return decode(resp, ModelControlReply, ct)


class _RollCall:
    """Who is there, asked once and heard for as long as a write runs: every serving ingress's id (``<p>.ingresses``)
    and every node's supervision tree (``<p>.nodes``, whose children name their actors' ids and pids). Runs on the
    caller's loop; :meth:`close` ends it (the answers that come later are dropped)."""

    def __init__(self, nc, subject: str) -> None:
        self._nc = nc
        self.subject = subject  # <p>.ingresses
        self._subs: list = []
        self.live: list[str] = []  # ingress ids in the order they answered
        self.trees: list[dict] = []
        self.no_ingress = False  # "no responders" on <p>.ingresses: no ingress subscribed
        self._heard = asyncio.Event()  # the first ingress answered, or no responders
        self._tree = asyncio.Event()  # the first node answered

    @classmethod
    async def start(cls, nc, subjects) -> "_RollCall":
        """Subscribe two inboxes and publish both questions (nothing waits for an answer here); ``subjects`` None:
        ask nothing (a roll call that hears no one: :meth:`first_ingress` None at once, nobody named)."""
        self = cls(nc, subjects.ingresses if subjects is not None else "")
        if subjects is None:
            self._heard.set()
            return self

        async def on_ingress(msg) -> None:
            if (msg.headers or {}).get("Status") == "503":
                self.no_ingress = True
            elif msg.data:
                self.live.append(msg.data.decode(errors="replace"))
            self._heard.set()

        async def on_node(msg) -> None:
            try:
                tree = json.loads(msg.data)
            except ValueError:
                return
            if isinstance(tree, dict):
                self.trees.append(tree)
                self._tree.set()

        for subject, cb in ((subjects.ingresses, on_ingress), (subjects.nodes, on_node)):
            inbox = nc.new_inbox()
            self._subs.append(await nc.subscribe(inbox, cb=cb))
            await nc.publish(subject, b"", reply=inbox)
        return self

    async def first_ingress(self, wait_s: float) -> str | None:
        """The id of the first ingress that answered, waiting up to ``wait_s`` seconds for one; None without an
        answer by then, or at once on "no responders" (no ingress subscribed to the roll call, an older one included:
        the write's own "no responders" through the queue group then says whether any ingress serves writes)."""
        try:
            await asyncio.wait_for(self._heard.wait(), wait_s)
        except asyncio.TimeoutError:
            return None
        return self.live[0] if self.live else None

    async def trees_heard(self, wait_s: float) -> None:
        """Return once a node has answered, or after ``wait_s`` seconds."""
        try:
            await asyncio.wait_for(self._tree.wait(), wait_s)
        except asyncio.TimeoutError:
            pass

    def silent_ingresses(self) -> str:
        """``ingress n1-i0 (pid 4711, node n1): listed by its node but did not answer <p>.ingresses: hung (...)``, naming
        each ingress a node listed (its own ``ingress:<j>`` child, or the ingress of a ``colocated:`` one) that has
        not answered; "" when every one answered or no node answered."""
        silent = []
        for tree in self.trees:
            for sup in tree.get("supervisors") or ():
                for ch in sup.get("children") or ():
                    cid, actors = str(ch.get("id", "")), list(ch.get("actors") or ())
                    ingresses = actors if cid.startswith("ingress:") else actors[:1] if cid.startswith("colocated:") \
                        else []
                    for actor in ingresses:
                        if actor not in self.live:
                            status = "" if ch.get("status") == "running" else f", {ch.get('status')}"
                            silent.append(f"ingress {actor} (pid {ch.get('pid')}{status}, node {tree.get('node_id')})")
        if not silent:
            return ""
        return (f"{', '.join(silent)}: listed by {'its node' if len(self.trees) == 1 else 'the nodes'} but did not "
                f"answer {self.subject}: hung (stopped, or its event loop stalled)")

    async def close(self) -> None:
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001 - a closed connection: nothing left to end
                pass

