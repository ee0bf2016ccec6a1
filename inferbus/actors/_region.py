"""The region manager actor: one per region; decides which region is primary (DESIGN §8).

What needs one owner across regions — the Valkey master, model-management
writes, the fencing term stamped on replies — follows a lease in a JetStream KV
bucket whose replicas live on the witness cluster (the third site), so losing
either region leaves the lease writable.

Protocol (every write is a compare-and-set; reads only tell *when* to try one):

* **Campaign** with ``create`` (no lease yet) or ``update(last=rev)`` on the last
  revision seen. The revision of the winning write is the **fencing term**:
  unique (one write per stream sequence) and increasing, so two regions can never
  hold the same term. Conflicts — JetStream API errors 10071 (wrong last
  sequence) and 10164 (another conditional write in flight) — both mean "lost the race".
* **Renew** every ``heartbeat_ms`` with ``update(last=own last revision)``. The
  lease is valid for ``validity = 0.75 * lease_ms`` after the *start* of the last
  successful renewal; a renewal that fails in any way (conflict, timeout, no
  quorum, no responders, lease connection lost or down) makes the leader step
  down at once, and a leader whose validity runs out steps down even while a
  renewal hangs. A leader that stepped down CASes on its own last revision; if
  nobody wrote in between it is primary again under the same term.
* **Heartbeats** on core NATS (``<p>._region.hb.<region>``, every ``heartbeat_ms``)
  carry role, term and the lease revision. A standby *suspects* the primary after
  ``suspect_ms`` without a primary heartbeat (fast detection; the KV's own TTL
  cannot go below 1 s and a KV stream-leader change takes seconds) and takes over
  by CAS on the last revision it saw, but only once that revision has not changed
  for ``lease_ms`` on its own clock. Since it saw the revision after the leader
  started the write that produced it, the old leader's validity (0.75 × lease_ms
  from that start) has ended by then: the two never overlap, partition or not.
* **Promotion** (the CAS won): ``REPLICAOF NO ONE`` on this region's Valkey,
  model-management writes on, the new term published at once. **Standby**: writes
  off, Valkey replicates from the primary's (learnt from its heartbeats).
* **Demotion** (operator): the primary steps down, *then* releases the lease by CAS
  (holder ``""``, naming a successor), and does not campaign for ``hold_ms``; the
  successor campaigns as soon as it sees the release. Stepping down first matters:
  the successor can win the moment the release commits, before the old primary has
  read the acknowledgement.

The manager is its own OS process under the region's node supervisor
(``python -m inferbus.actors region CONFIG_JSON``); it prints READY once it has
joined the heartbeat subjects and made one attempt to read the lease.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlparse

from ..bus import BusConfig, Subjects, close_connection, connect, fail_pending_requests
from ..schemas._region import (
    PRIMARY, STANDBY, LeaseValue, RegionCommand, RegionDecodeError, RegionHeartbeat, RegionReply, RegionStatus,
    RegionStep, Transition, decode_region, encode_region,
)
from .._limits import MAX_REGION_HEARTBEAT_MS, MAX_REGION_MS, interval
from .._version import __version__
from ._common import announce_ready, log, run_actor
from ._config import _JsonMixin
from ._lease import LEASE_KEY, LeaseStore, LeaseUnavailable, LostRace, RegionError, bucket_name

__all__ = [
    "LEASE_KEY", "CacheRole", "LeaseStore", "LeaseUnavailable", "LostRace", "RegionConfig", "RegionError",
    "RegionManager", "ask_region", "bucket_name",
]


def _hostport(url: str | None) -> str:
    if not url:
        return ""
    u = urlparse(url)
    return f"{u.hostname or '127.0.0.1'}:{u.port or 6379}"


@dataclass(frozen=True)
class RegionConfig(_JsonMixin):
    """One region manager."""

    region: str
    """This region's name (a subject token)."""
    bus: BusConfig
    """NATS of this region (its servers first): heartbeats, operator commands."""
    lease_bus: BusConfig | None = None
    """NATS for the lease traffic (reads, CAS writes, the KV watch): the **witness cluster's** servers,
    so lease requests and their replies never cross a gateway. Losing one server of this region then
    cannot blind the lease (a remote site's gateway to a dead server is re-established only after a
    fixed 1 s by nats-server). None = use ``bus`` (lease replies cross the witness's gateway)."""
    valkey_url: str | None = None
    """This region's Valkey (``redis://host:port/0``); None = no cache to promote."""
    bucket: str = ""
    """Lease bucket; ``""`` = :func:`~inferbus.actors._lease.bucket_name` of the prefix (``<prefix>_regions``)."""
    placement_cluster: str | None = None
    """JetStream cluster that must hold the lease's replicas (the witness); None = the server's choice."""
    replicas: int = 3
    """Replicas of the lease stream (1..5)."""
    heartbeat_ms: int = 100
    """Heartbeat and renewal period, ms, in [10, 60,000] (:data:`~inferbus._limits.MAX_REGION_HEARTBEAT_MS`)."""
    lease_ms: int = 400
    """A standby takes over once the lease revision it saw has not changed for this long, ms.
    The leader's own validity is 0.75 × this after the start of its last successful renewal. In [20, 3,600,000]
    (:data:`~inferbus._limits.MAX_REGION_MS`) and at least 2 × ``heartbeat_ms``."""
    suspect_ms: int = 400
    """No primary heartbeat for this long = the primary is suspected dead (the detection event), ms."""
    hold_ms: int = 3000
    """After a demotion, this region does not campaign for this long (unless promoted), ms."""
    kv_timeout_ms: int = 1000
    """Timeout of a lease read or a campaign write, ms (renewals use the remaining validity)."""
    initial_primary: bool = False
    """Campaign at once when no lease exists yet (the others wait ``initial_wait_ms`` first)."""
    initial_wait_ms: int = 5000
    """When no lease exists yet, a region that is not ``initial_primary`` campaigns only after running this
    long (at least ``lease_ms``), ms: on a loaded machine the initial primary's first write can take longer
    than one lease period, and a cluster that starts with the standby in charge is a surprise. In [0, 3,600,000]
    (:data:`~inferbus._limits.MAX_REGION_MS`; ``region manager --initial-wait-ms -1`` was taken)."""
    auto_failover: bool = True
    """Take over automatically when the primary is gone; False = only ``promote`` does."""
    manager_id: str = ""
    """Unique id of this incarnation; ``""`` = generated at start."""

    def __post_init__(self) -> None:
        if not self.region or any(c in self.region for c in ". *>"):
            raise ValueError(f"RegionConfig.region must be a non-empty subject token (no '.', '*', '>', space), got "
                             f"{self.region!r}")
        if not 10 <= self.heartbeat_ms <= MAX_REGION_HEARTBEAT_MS:
            raise ValueError(f"RegionConfig.heartbeat_ms must be in {interval(10, MAX_REGION_HEARTBEAT_MS)} ms, got "
                             f"{self.heartbeat_ms}")
        if self.lease_ms < 2 * self.heartbeat_ms:
            raise ValueError(f"RegionConfig.lease_ms must be >= 2 × heartbeat_ms ({2 * self.heartbeat_ms} ms: the "
                             f"leader renews every heartbeat), got {self.lease_ms}")
        if not 20 <= self.lease_ms <= MAX_REGION_MS:
            raise ValueError(f"RegionConfig.lease_ms must be in {interval(20, MAX_REGION_MS)} ms (and at least 2 × "
                             f"heartbeat_ms), got {self.lease_ms}")
        if not 0 < self.suspect_ms <= self.lease_ms:
            raise ValueError(f"RegionConfig.suspect_ms must be in {interval(0, self.lease_ms, lo_open=True)} ms (at "
                             f"most lease_ms), got {self.suspect_ms}")
        if not 0 <= self.initial_wait_ms <= MAX_REGION_MS:
            raise ValueError(f"RegionConfig.initial_wait_ms must be in {interval(0, MAX_REGION_MS)} ms, got "
                             f"{self.initial_wait_ms}")
        if not 1 <= self.replicas <= 5:
            raise ValueError(f"RegionConfig.replicas must be in {interval(1, 5)}, got {self.replicas}")


class CacheRole:
    """Switches this region's Valkey between master and replica (``REPLICAOF``)."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.addr = _hostport(url)
        self._r = None

    def _client(self):
        if self._r is None and self.url:
            import redis.asyncio as aioredis

            self._r = aioredis.from_url(self.url, socket_timeout=0.3, socket_connect_timeout=0.3)
        return self._r

    async def role(self) -> tuple[str, str, bool]:
        """``(role, master "host:port", link up)``; role is ``master``, ``replica`` or ``unknown``."""
        r = self._client()
        if r is None:
            return "unknown", "", False
        try:
            info = await r.info("replication")
        except Exception:
            return "unknown", "", False
        if info.get("role") == "master":
            return "master", "", True
        return "replica", f"{info.get('master_host')}:{info.get('master_port')}", info.get("master_link_status") == "up"

    async def make_master(self) -> None:
        r = self._client()
        if r is not None:
            await r.execute_command("REPLICAOF", "NO", "ONE")

    async def make_replica(self, master: str) -> None:
        r = self._client()
        if r is not None:
            host, _, port = master.rpartition(":")
            await r.execute_command("REPLICAOF", host, port)

    async def close(self) -> None:
        if self._r is not None:
            try:
                await self._r.aclose()
            except Exception:
                pass


class RegionManager:
    """The region manager actor; ``run()`` serves until cancelled (see the module docstring)."""

    def __init__(self, config: RegionConfig) -> None:
        self.config = config
        self.region = config.region
        self.manager_id = config.manager_id or f"{config.region}-{os.getpid()}-{secrets.token_hex(3)}"
        self.subjects = Subjects(config.bus.prefix)
        self.bucket = config.bucket or bucket_name(config.bus.prefix)
        self.cache = CacheRole(config.valkey_url)
        self.nc = None
        self.lease_nc = None
        self.store: LeaseStore | None = None
        self.lease_disconnects = 0
        self.renewal_failures = 0
        """Renewals that failed with an error or no answer (each one a step-down)."""
        self.renewal_retries = 0
        """Renewal CAS tries sent again after one went unanswered (:meth:`_renew_cas`)."""
        self._cas_rtt_s: float | None = None
        """Smoothed round trip of the lease CAS (answered campaign and first renewal tries), s, None before the first:
        :meth:`_renew_cas`'s try timeout."""
        self._lock = asyncio.Lock()
        # own role
        self.role = STANDBY
        self.term = 0
        self.rev = 0
        self.valid_until: float | None = None
        self.next_renew = 0.0
        self.model_writes = False
        self.hold_until = 0.0
        self.became_primary_at: float | None = None
        # what we know of the lease (reads and heartbeats; only used to time a CAS)
        self.seen_rev: int | None = None
        self.seen_holder = ""
        self.seen_manager = ""
        self.seen_successor = ""
        self.seen_valkey = ""
        self.seen_valkey_of = ""
        """The region whose Valkey :attr:`seen_valkey` is (the holder of the lease write that named it)."""
        self.seen_at = 0.0
        self.seen_term = 0
        """The term of the reign the latest lease write seen belongs to (its value's term, or its revision for an
        ``acquire``); 0 when not known (a peer's heartbeat told us the revision). The resume rule takes this one,
        never :attr:`term`, which is left from this manager's last reign."""
        self.known_term = 0
        # peers
        self.peers: dict[str, tuple[float, RegionHeartbeat]] = {}
        self.primary_hb_at: float | None = None
        self.primary_region = ""
        self.primary_valkey = ""
        self.primary_valkey_of = ""
        """The region whose primary heartbeat named :attr:`primary_valkey`."""
        self.suspected_at: float | None = None
        # bookkeeping
        self.transitions: deque[Transition] = deque(maxlen=200)
        self.lost_races = 0
        self.renewals = 0
        self._seq = 0
        self._next_hb = 0.0
        self._next_read = 0.0
        self._started = time.monotonic()
        self._quiet_until = 0.0
        self._next_campaign = 0.0
        """A campaign whose CAS failed (no lease store) is not tried again before this (monotonic s)."""
        self._campaign_quiet_until = 0.0
        self._campaign_failures_unsaid = 0
        self._cache_kick = asyncio.Event()
        self._renew_task: asyncio.Task | None = None

    # ---- timing knobs ----------------------------------------------------------------------------
    @property
    def _hb_s(self) -> float:
        return self.config.heartbeat_ms / 1000.0

    @property
    def _validity_s(self) -> float:
        return 0.75 * self.config.lease_ms / 1000.0

    def _lease_connected(self) -> bool:
        """The lease connection is up (a request sent while it reconnects would wait out its timeout)."""
        return self.lease_nc is not None and self.lease_nc.is_connected

    def is_primary(self, now: float | None = None) -> bool:
        """Primary and within lease validity (the role flag alone can be stale during a stall)."""
        now = time.monotonic() if now is None else now
        return self.role == PRIMARY and self.valid_until is not None and now < self.valid_until

    def _note(self, event: str, detail: str = "", term: int | None = None, at: float | None = None) -> None:
        """Record an event; ``at`` (monotonic) when it took effect earlier than now."""
        self.transitions.append(Transition(time.monotonic() if at is None else at, event,
                                           self.term if term is None else term, detail))
        log(f"region {self.region}: {event} term={self.term if term is None else term} {detail}", logging.INFO)

    # ---- lease knowledge -------------------------------------------------------------------------
    def _observe(self, rev: int, holder: str, successor: str = "", manager: str = "", valkey: str = "",
                 term: int = 0) -> None:
        if self.seen_rev is None or rev > self.seen_rev:
            self.seen_rev = rev
            self.seen_holder = holder
            self.seen_successor = successor
            self.seen_manager = manager
            self.seen_term = term
            if valkey:
                self.seen_valkey, self.seen_valkey_of = valkey, holder
            self.seen_at = time.monotonic()
        elif rev == self.seen_rev and manager and not self.seen_manager:
            # a peer's heartbeat told us the revision first (heartbeats carry no writer id); the KV watch
            # or our own write now says who wrote it: the resume rule needs that
            self.seen_manager = manager
            self.seen_term = term
        if term > self.known_term:
            self.known_term = term

    async def _refresh(self) -> None:
        """Read the lease (to learn the revision for the next CAS); opens the bucket first if needed."""
        assert self.store is not None
        try:
            if self.store.kv is None:
                await asyncio.wait_for(self.store.ensure(), self.config.kv_timeout_ms / 1000.0)
            rev, value = await asyncio.wait_for(self.store.read(), self.config.kv_timeout_ms / 1000.0)
        except (LeaseUnavailable, asyncio.TimeoutError) as exc:
            now = time.monotonic()
            self._next_read = now + 0.25
            if now >= self._quiet_until:
                self._quiet_until = now + 5.0
                log(f"region {self.region}: lease read failed (retrying): {exc!r}")
            return
        if value is None:
            self._observe(rev, "")
        else:
            self._observe(rev, value.holder, value.successor, value.manager_id, value.valkey,
                          value.term or (rev if value.op == "acquire" else 0))

    # ---- heartbeats -----------------------------------------------------------------------------
    def _heartbeat(self) -> RegionHeartbeat:
        self._seq += 1
        return RegionHeartbeat(
            region=self.region, role=self.role, term=self.term if self.role == PRIMARY else self.known_term,
            lease_rev=self.seen_rev or 0, seq=self._seq, manager_id=self.manager_id,
            lease_holder=self.seen_holder, successor=self.seen_successor, valkey=self.cache.addr,
            model_writes=self.model_writes,
        )

    async def _publish_hb(self) -> None:
        self._next_hb = time.monotonic() + self._hb_s
        try:
            await self.nc.publish(self.subjects.region_heartbeat(self.region), encode_region(self._heartbeat()))
        except Exception:
            pass

    async def _on_hb(self, msg) -> None:
        try:
            hb = decode_region(msg.data)
        except RegionDecodeError:
            return
        if not isinstance(hb, RegionHeartbeat) or hb.manager_id == self.manager_id:
            return
        now = time.monotonic()
        self.peers[hb.region] = (now, hb)
        if hb.lease_rev:
            self._observe(hb.lease_rev, hb.lease_holder, hb.successor,
                          valkey=hb.valkey if hb.role == PRIMARY else "")
        if hb.role == PRIMARY and hb.region != self.region:
            self._primary_life(hb.region, now)
            if hb.valkey and (hb.valkey, hb.region) != (self.primary_valkey, self.primary_valkey_of):
                self.primary_valkey, self.primary_valkey_of = hb.valkey, hb.region
                self._cache_kick.set()
            if hb.term > self.known_term:
                self.known_term = hb.term
            if self.role == PRIMARY and hb.term > self.term:
                # a later CAS won: our lease is gone for sure (our next renewal would fail anyway)
                self._step_down(f"region {hb.region} holds a later term {hb.term}")

    def _primary_life(self, region: str, now: float) -> None:
        """The primary ``region`` showed a sign of life (heartbeat or lease write) at ``now``."""
        if self.primary_hb_at is None or now > self.primary_hb_at:
            self.primary_hb_at = now
        self.primary_region = region

    # ---- becoming primary / standby ---------------------------------------------------------------
    async def _campaign(self, reason: str, steps: list[RegionStep] | None = None) -> bool:
        """One CAS attempt on the last revision seen. Returns True when it won (and promotes)."""
        assert self.store is not None
        last = self.seen_rev or 0
        t0 = time.monotonic()
        # CAS on a revision we wrote ourselves proves nobody acquired in between: the reign is
        # continuous and keeps its term (e.g. after a stall made our validity run out)
        resume = self._resumable()
        value = LeaseValue(holder=self.region, manager_id=self.manager_id, valkey=self.cache.addr,
                           term=self.seen_term if resume else 0, op="renew" if resume else "acquire")
        try:
            if not self._lease_connected():  # fail at once: a buffered CAS would block the loop until its timeout
                raise LeaseUnavailable("lease connection down")
            rev = await asyncio.wait_for(self.store.cas(value, last), self.config.kv_timeout_ms / 1000.0)
            self._note_cas_rtt(time.monotonic() - t0)
        except LostRace as exc:
            self.lost_races += 1
            self._note("lost_race", f"CAS on rev {last}: {exc}")
            if steps is not None:
                steps.append(RegionStep("lease CAS lost", (time.monotonic() - t0) * 1000, f"on revision {last}"))
            await self._refresh()
            return False
        except (LeaseUnavailable, asyncio.TimeoutError) as exc:
            now = time.monotonic()
            # said once per 5 s (a witness outage failed one every tick: 230 log lines in 5 s, and the transitions
            # kept, 200 at most, lost the reigns' own); tried again after half a heartbeat, not every tick
            if now >= self._campaign_quiet_until:
                more = self._campaign_failures_unsaid
                self._note("campaign_failed", repr(exc) + (f" ({more} more failed since the last one said)"
                                                           if more else ""))
                self._campaign_quiet_until, self._campaign_failures_unsaid = now + 5.0, 0
            else:
                self._campaign_failures_unsaid += 1
            if steps is not None:
                steps.append(RegionStep("lease CAS failed", (now - t0) * 1000, repr(exc)))
            self._next_read = now + self._hb_s
            self._next_campaign = now + self._hb_s / 2
            return False
        term = value.term if resume else rev
        if steps is not None:
            steps.append(RegionStep("lease acquired", (time.monotonic() - t0) * 1000,
                                    f"CAS on revision {last} won; term {term}" + (" (resumed)" if resume else "")))
        await self._become_primary(rev, t0, reason, steps, term=term)
        return True

    async def _become_primary(self, rev: int, t0: float, reason: str, steps: list[RegionStep] | None,
                              term: int | None = None) -> None:
        self.role = PRIMARY
        self.rev = rev
        self.term = rev if term is None else term
        self.known_term = max(self.known_term, self.term)
        self.valid_until = t0 + self._validity_s
        self.next_renew = t0 + self._hb_s
        self.became_primary_at = time.monotonic()
        self.hold_until = 0.0
        self.seen_rev, self.seen_holder, self.seen_successor = rev, self.region, ""
        self.seen_manager, self.seen_valkey, self.seen_at = self.manager_id, self.cache.addr, time.monotonic()
        self.seen_valkey_of = self.region
        self.seen_term = self.term
        self._note(PRIMARY, reason, self.term, at=t0)  # t0: the CAS was sent (the reign's earliest start)
        t = time.monotonic()
        try:
            await asyncio.wait_for(self.cache.make_master(), 0.5)
            detail = f"REPLICAOF NO ONE on {self.cache.addr}" if self.cache.url else "no Valkey configured"
        except Exception as exc:
            detail = f"failed: {exc!r} (retried in the background)"
            self._cache_kick.set()
        if steps is not None:
            steps.append(RegionStep("valkey master", (time.monotonic() - t) * 1000, detail))
        t = time.monotonic()
        self.model_writes = True
        if steps is not None:
            steps.append(RegionStep("model-management writes on", (time.monotonic() - t) * 1000))
        t = time.monotonic()
        await self._publish_hb()
        if steps is not None:
            steps.append(RegionStep("term published", (time.monotonic() - t) * 1000,
                                    f"term {self.term} on {self.subjects.region_heartbeat(self.region)}"))

    def _step_down(self, reason: str) -> None:
        """Become standby at once (synchronous: nothing can run as primary after this returns).

        The transition is recorded at ``min(now, valid_until)``: the reign ended when its validity
        did, even if a stall delayed this call.
        """
        if self.role != PRIMARY:
            return
        end = time.monotonic() if self.valid_until is None else min(time.monotonic(), self.valid_until)
        self.role = STANDBY
        self.model_writes = False
        self.valid_until = None
        self._note(STANDBY, reason, at=end)
        self._cache_kick.set()
        asyncio.ensure_future(self._publish_hb())

    async def _renew(self) -> None:
        """Renew the lease by CAS on our own last revision; **any** failure steps down at once.

        * A conflict (:class:`LostRace`: someone else wrote), an error (:class:`LeaseUnavailable`:
          no responders, no quorum, the lease connection lost with the renewal in flight — failed
          at once by the connection's ``disconnected_cb``), a lease connection that is down when
          the renewal is due (nothing is sent), or no answer within the remaining validity: the
          leader becomes standby before this returns.
        * It then tries to win the lease back by the resume rule of :meth:`_campaign` (a CAS on its
          own last revision, every tick): if nobody wrote in between, it is primary again under
          the **same term** (nothing is fenced), typically one reconnect later (~50 ms). If the
          failed renewal had in fact committed, the resume CAS loses against that write, the
          manager reads it, sees its own write and resumes on it.
        * Validity counts from the start of the renewal; a reign never outlasts it.
        """
        assert self.store is not None and self.valid_until is not None
        t0 = time.monotonic()
        value = LeaseValue(holder=self.region, manager_id=self.manager_id, term=self.term, valkey=self.cache.addr,
                           op="renew")
        left_s = self.valid_until - t0
        if self.role != PRIMARY:
            return  # stepped down meanwhile (a later term was heard)
        if left_s <= 0:
            self._step_down("renewal failed: validity ran out")
            return
        if not self._lease_connected():
            self._step_down("renewal failed: lease connection down")
            self._next_read = 0.0
            return
        try:
            rev = await self._renew_cas(value)
        except LostRace as exc:
            self._step_down(f"renewal lost the lease: {exc}")
            self._next_read = 0.0
            return
        except (LeaseUnavailable, asyncio.TimeoutError) as exc:
            self.renewal_failures += 1
            self._step_down(f"renewal failed: {exc!r}")
            self._next_read = 0.0
            return
        if self.role != PRIMARY:
            return  # stepped down while the write was in flight (a later term was seen)
        self.rev = rev
        self.renewals += 1
        self.valid_until = t0 + self._validity_s
        self.next_renew = t0 + self._hb_s
        self._observe(rev, self.region, "", self.manager_id, self.cache.addr, self.term)
        await self._publish_hb()

    def _note_cas_rtt(self, sample_s: float) -> None:
        """One answered CAS's round trip into :attr:`_cas_rtt_s` (EWMA, α = 1/4; the first sample as it is)."""
        rtt = self._cas_rtt_s
        self._cas_rtt_s = sample_s if rtt is None else rtt + 0.25 * (sample_s - rtt)

    async def _renew_cas(self, value: LeaseValue) -> int:
        """The renewal's CAS on :attr:`rev`, sent again while it goes unanswered and the validity lasts.

        A core-NATS request to JetStream can be lost (a route or a server of the cluster restarting: a CI run of the
        nats-node-loss drill lost one as the killed server rejoined, and the primary waited out its whole validity,
        stepped down, and the standby took over). Each try waits three times the renewals' round trip (an EWMA of
        the answered campaign CAS and first renewal tries, α = 1/4, as TCP's SRTT; before any, the validity left), a
        heartbeat at least, the validity left at most; then the same CAS is sent again, and it waits the validity
        left (backed off, RFC 6298 5.5: a slow answer is waited for, only a lost one is sent again). If an earlier
        try had in fact committed, the later one loses (wrong last sequence, or another write in flight); the key
        is then read, and a write of this manager's own reign (its manager id and term, at a later revision) is
        that renewal, taken as done. The caller counts validity from the first try's start, so a reign never
        outlasts the write that renewed it.

        Returns:
            The revision of the renewal.

        Raises:
            LostRace: another writer holds the lease (a first try that lost, or a later one with no write of ours
                since ``rev``).
            LeaseUnavailable: the store answered with an error, or the lease connection is down.
            asyncio.TimeoutError: no try answered within the validity.
        """
        assert self.store is not None and self.valid_until is not None
        retried = False
        while True:
            left_s = self.valid_until - time.monotonic()
            if left_s <= 0:
                raise asyncio.TimeoutError()
            if retried and not self._lease_connected():
                raise LeaseUnavailable("lease connection down")
            # a try waits 3 x the CAS round trip seen lately, a heartbeat at least: over a slow link (150 ms each
            # way to the witness) each try would otherwise time out before its answer could come back
            rtt = self._cas_rtt_s
            try_s = left_s if rtt is None else min(left_s, max(self._hb_s, 3 * rtt))
            t_try = time.monotonic()
            try:
                rev = await asyncio.wait_for(self.store.cas(value, self.rev), try_s)
                if not retried:
                    self._note_cas_rtt(time.monotonic() - t_try)
                return rev
            except asyncio.TimeoutError:
                if try_s >= left_s:
                    raise
                retried = True
                self.renewal_retries += 1
                # backed off (RFC 6298 5.5): the next try waits the validity left (a slow answer, not a lost one), and
                # so do the next renewals' first tries until an answered first try brings the smoothed round trip down
                # again (the link may have become slow: its round trips are not sampled from tries sent again)
                self._cas_rtt_s = max(rtt or 0.0, left_s)
            except LostRace:
                if not retried:
                    raise
                rev, seen = await asyncio.wait_for(self.store.read(), max(self.valid_until - time.monotonic(),
                                                                           0.001))
                if seen is not None and rev > self.rev and seen.manager_id == self.manager_id \
                        and seen.term == self.term:
                    return rev  # an earlier try committed; its answer was lost
                raise

    async def _renew_locked(self) -> None:
        try:
            async with self._lock:
                if self.role == PRIMARY:
                    await self._renew()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug must not leave a leader that no longer renews
            log(f"region {self.region}: renewal failed: {exc!r}")
            self._step_down(f"internal error in renewal: {exc!r}")

    # ---- the loop -------------------------------------------------------------------------------
    def _primary_alive(self, now: float) -> bool:
        return self.primary_hb_at is not None and now - self.primary_hb_at < self.config.suspect_ms / 1000.0

    def _holder_live(self, now: float) -> bool:
        """Another region holds the lease and it is not known to be expired."""
        if self.seen_holder in ("", self.region):
            return False
        return self._primary_alive(now) or now - self.seen_at < self.config.lease_ms / 1000.0

    def _resumable(self) -> bool:
        """Whether the latest lease write seen is this manager's own, as holder, with its reign's term known and
        not below any term heard since: a CAS on it continues that reign under that term (the resume rule).

        The term is the write's (:attr:`seen_term`), not :attr:`term`: an ``acquire`` whose CAS timed out (a
        stalled witness) and committed later is a reign of its own, whose term is that write's revision; resumed
        under the term left from this manager's previous reign, it went back to an old term, at times below the
        reign before it (a fresh-user trial: 7 of 7 handovers after a 3 s witness SIGSTOP), and fencing stalled."""
        return (self.seen_holder == self.region and self.seen_manager == self.manager_id
                and self.seen_term > 0 and self.seen_term >= self.known_term)

    def _campaign_reason(self, now: float) -> str | None:
        c = self.config
        if self.seen_rev is None:
            return None
        # the hold keeps a demoted region from campaigning again at once, except when the lease was released *to*
        # it by another region's manager: a second demote within hold_ms (A to B, then B back to A) named the
        # region still in its hold as successor, and there was no primary until that hold ended (~2 s in a
        # fresh-user trial, model-management writes refused meanwhile)
        if now < self.hold_until and not (self.seen_holder == "" and self.seen_successor == self.region
                                          and self.seen_rev and self.seen_manager != self.manager_id):
            return None
        if self._resumable():
            # not a failover: the same reign continues (a failed renewal stepped down; nobody wrote since)
            return f"resume: the latest lease write (rev {self.seen_rev}) is our own, term {self.seen_term}"
        if not c.auto_failover:
            return None
        lease_s = c.lease_ms / 1000.0
        if self.seen_holder == "":
            if self.seen_rev == 0:
                if c.initial_primary or now - self._started >= max(lease_s, c.initial_wait_ms / 1000.0):
                    return "no lease yet"
                return None
            if self.seen_successor in ("", self.region):
                return "lease released" + (" to us" if self.seen_successor else "")
            return "lease released, successor silent" if now - self.seen_at >= lease_s else None
        if self.seen_holder == self.region:
            if self.seen_manager and self.seen_manager != self.manager_id:
                return "lease held by a previous incarnation of this region"
        if self._primary_alive(now):
            return None
        if now - self.seen_at >= lease_s:
            return f"lease of {self.seen_holder} unchanged for {c.lease_ms} ms (rev {self.seen_rev})"
        return None

    async def _tick(self) -> None:
        now = time.monotonic()
        if self.role == PRIMARY:
            if self.valid_until is None or now >= self.valid_until:
                self._step_down("lease validity ran out")
            elif now >= self.next_renew and (self._renew_task is None or self._renew_task.done()):
                # in a task of its own: heartbeats keep flowing while a renewal is retried
                self._renew_task = asyncio.ensure_future(self._renew_locked())
        else:
            if (self.seen_rev is None or self._next_read) and now >= self._next_read:
                self._next_read = 0.0
                await self._refresh()
            # one instant for the suspicion and the campaign: with the suspicion judged before the refresh's await,
            # a starved loop could campaign on a primary found dead after it with no suspicion recorded (a CI run:
            # B took over, suspected_at None, so no detection time)
            now = time.monotonic()
            if (self.primary_hb_at is not None and not self._primary_alive(now)
                    and (self.suspected_at is None or self.suspected_at < self.primary_hb_at)):
                self.suspected_at = now
                self._note("suspect", f"no heartbeat or lease write from primary {self.primary_region} for "
                                      f"{(now - self.primary_hb_at) * 1000:.0f} ms", self.known_term)
            reason = self._campaign_reason(now) if now >= self._next_campaign else None
            if reason is not None and not self._lock.locked() and self._lease_connected():
                async with self._lock:
                    if self.role != PRIMARY:
                        await self._campaign(reason)
        if time.monotonic() >= self._next_hb:
            await self._publish_hb()

    async def _loop(self) -> None:
        tick = max(self._hb_s / 5, 0.005)
        while True:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug must not end leadership handling silently
                log(f"region {self.region}: tick failed: {exc!r}")
                self._step_down(f"internal error: {exc!r}")
            await asyncio.sleep(tick)

    async def _watch_loop(self) -> None:
        """Follow the lease key with a KV watch: learn each revision the moment it commits.

        Heartbeats carry revisions too, but a write the leader started just before dying commits
        after its last heartbeat; without the watch a standby would learn it only from a lost CAS
        and then wait another ``lease_ms``. Only *when* to try a CAS depends on this.
        """
        while True:
            watcher = None
            try:
                if self.store is None or self.store.kv is None:
                    await asyncio.sleep(0.25)
                    continue
                watcher = await self.store.kv.watch(LEASE_KEY)
                async for entry in watcher:
                    if entry is None or entry.value is None:
                        continue
                    try:
                        value = decode_region(entry.value)
                    except RegionDecodeError:
                        continue
                    if isinstance(value, LeaseValue):
                        self._observe(entry.revision, value.holder, value.successor, value.manager_id,
                                      value.valkey, value.term or (entry.revision if value.op == "acquire" else 0))
                        if value.holder and value.holder != self.region and value.op != "release":
                            # a lease write by the primary is a sign of life as good as a heartbeat
                            # (it was alive when it sent it); counting it keeps a renewal that commits
                            # after the leader's last heartbeat from opening a gap between detection
                            # and takeover
                            self._primary_life(value.holder, time.monotonic())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log(f"region {self.region}: lease watch failed (restarting): {exc!r}")
                await asyncio.sleep(0.25)
            finally:
                if watcher is not None:
                    try:
                        await watcher.stop()
                    except Exception:
                        pass

    def _master_valkey(self) -> str:
        """``host:port`` of the Valkey a standby replicates: the lease holder's, when the holder is another region
        and its Valkey is known (from its lease write or its primary heartbeats); else "" (no change).

        Only the current holder's: a region that stepped down with the witness out of reach followed the last
        primary heartbeat it had heard, from a reign of the other region long over, while that region, a standby
        too, replicated this one (a fresh-user trial: the two Valkeys replicas of each other, no master, every cache
        fill refused until the witness was back)."""
        holder = self.seen_holder
        if holder in ("", self.region):
            return ""
        if self.seen_valkey_of == holder and self.seen_valkey:
            return self.seen_valkey
        return self.primary_valkey if self.primary_valkey_of == holder else ""

    async def _cache_loop(self) -> None:
        """Keep the Valkey role in line with ours: master when primary, else replica of the lease holder's
        (:meth:`_master_valkey`; unchanged while no other region holds the lease)."""
        if not self.cache.url:
            return
        while True:
            try:
                await asyncio.wait_for(self._cache_kick.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
            self._cache_kick.clear()
            try:
                role, master, _ = await self.cache.role()
                if self.role == PRIMARY:
                    if role == "replica":
                        await self.cache.make_master()
                        self._note("valkey_master", self.cache.addr)
                else:
                    want = self._master_valkey()
                    if want and want != self.cache.addr and (role != "replica" or master != want):
                        await self.cache.make_replica(want)
                        self._note("valkey_replica", f"{self.cache.addr} replicates {want}")
            except Exception as exc:
                log(f"region {self.region}: valkey role change failed: {exc!r}")

    # ---- operator commands ----------------------------------------------------------------------
    async def status(self) -> RegionStatus:
        role, master, up = await self.cache.role()
        now = time.monotonic()
        cache_role = role if role != "replica" else f"replica of {master} (link {'up' if up else 'down'})"
        return RegionStatus(
            region=self.region, role=self.role if self.role != PRIMARY or self.is_primary(now) else STANDBY,
            term=self.term if self.role == PRIMARY else self.known_term, lease_rev=self.seen_rev or 0,
            lease_holder=self.seen_holder, lease_age_ms=round((now - self.seen_at) * 1000, 1) if self.seen_at else -1,
            heartbeat_age_ms={r: round((now - t) * 1000, 1) for r, (t, _) in self.peers.items()},
            peer_roles={r: hb.role if now - t < self.config.suspect_ms / 1000.0 else "silent"
                        for r, (t, hb) in self.peers.items()}, valkey=self.cache.addr,
            cache_role=cache_role, model_writes=self.model_writes, manager_id=self.manager_id, monotonic_now=now,
            suspected_at=self.suspected_at, became_primary_at=self.became_primary_at, valid_until=self.valid_until,
            lost_races=self.lost_races, renewals=self.renewals, transitions=list(self.transitions),
        )

    def _stats_data(self, endpoint_stats) -> dict:
        """``data`` of the control endpoint in ``$SRV.STATS``: role, term and lease counters."""
        now = time.monotonic()
        return {"region": self.region, "role": PRIMARY if self.is_primary(now) else STANDBY,
                "term": self.term if self.role == PRIMARY else self.known_term, "lease_rev": self.seen_rev or 0,
                "lease_holder": self.seen_holder, "renewals": self.renewals,
                "renewal_failures": self.renewal_failures, "renewal_retries": self.renewal_retries,
                "lost_races": self.lost_races,
                "lease_disconnects": self.lease_disconnects, "model_writes": self.model_writes}

    async def promote(self, force: bool) -> RegionReply:
        """Make this region primary now. Refused while another region holds a live lease unless ``force``."""
        steps: list[RegionStep] = []
        t0 = time.monotonic()
        if self.is_primary():
            return RegionReply(ok=True, region=self.region, steps=[RegionStep("already primary", 0.0,
                                                                               f"term {self.term}")])
        # the lock from before the step-down request: the holder's release names us, and the tick loop's own
        # campaign on it (it skips while the lock is held) would take the lease outside these steps
        async with self._lock:
            holder = self.seen_holder
            if not self.is_primary() and self._holder_live(t0):
                if not force:
                    age = (t0 - (self.primary_hb_at or self.seen_at)) * 1000
                    return RegionReply(ok=False, region=self.region, error=(
                        f"region {holder} holds a live lease (revision {self.seen_rev}, last heard {age:.0f} ms ago); "
                        f"demote it first or use --force"))
                t = time.monotonic()
                try:
                    await self.nc.request(self.subjects.region_control(holder),
                                          encode_region(RegionCommand(action="demote", successor=self.region,
                                                                      force=True)),
                                          timeout=0.5)
                    steps.append(RegionStep(f"asked {holder} to step down", (time.monotonic() - t) * 1000))
                except Exception as exc:
                    steps.append(RegionStep(f"asked {holder} to step down", (time.monotonic() - t) * 1000,
                                            f"no answer ({type(exc).__name__}); taking over by CAS anyway"))
            self.hold_until = 0.0
            for attempt in range(3):
                if self.is_primary():  # the tick loop's campaign won while we waited for the lock
                    if attempt == 0:
                        steps.append(RegionStep("lease acquired", 0.0, f"by the election meanwhile; term {self.term}"))
                    break
                t = time.monotonic()
                await self._refresh()
                steps.append(RegionStep("read lease", (time.monotonic() - t) * 1000,
                                        f"revision {self.seen_rev}, holder {self.seen_holder or '(none)'}"))
                if self.seen_holder not in ("", self.region) and not force and attempt == 0 \
                        and self._primary_alive(time.monotonic()):
                    return RegionReply(ok=False, region=self.region, steps=steps,
                                       error=f"region {self.seen_holder} holds a live lease; use --force")
                if await self._campaign("promoted by operator" + (" (forced)" if force else ""), steps):
                    break
        ok = self.is_primary()
        steps.append(RegionStep("total", (time.monotonic() - t0) * 1000))
        return RegionReply(ok=ok, region=self.region, steps=steps,
                           error="" if ok else "lost the lease race; see the steps")

    async def demote(self, successor: str, wait: bool = True, force: bool = False) -> RegionReply:
        """Step down, release the lease (naming a successor), and hold off campaigning for ``hold_ms``.

        Args:
            successor: region asked to take over at once (``""`` = the live standby heard last).
            wait: wait (up to max(2 s, 4 × lease_ms)) for the new primary's heartbeat to report it.
            force: release even when no other region's manager is live (none would take over).

        Returns a refusal (``ok=False``, nothing changed, the lease kept) when this region is not primary, when
        ``successor`` is this region itself, or, unless ``force``, when no other region's manager is live (its last
        heartbeat older than
        ``suspect_ms``, the liveness ``status`` reports as heartbeat ages) or ``successor`` is not live; and
        ``ok=False`` with the steps taken when, with ``wait``, no new primary announced itself within the wait
        (this region is standby then, the lease released or, if the release failed, left on its revision).
        """
        steps: list[RegionStep] = []
        t0 = time.monotonic()
        if self.role != PRIMARY:
            return RegionReply(ok=False, region=self.region, error=f"region {self.region} is not primary")
        if successor == self.region:  # (it was "region X's manager is not live" of the live primary itself)
            return RegionReply(ok=False, region=self.region, error=(
                f"the successor named is region {self.region} itself, the primary being demoted: name another "
                f"region, or none for the live standby heard last"))
        live = {r: t for r, (t, hb) in self.peers.items()
                if r != self.region and t0 - t < self.config.suspect_ms / 1000.0}
        if not force and (not live or (successor and successor not in live)):
            ages = ", ".join(f"{r} {(t0 - t) * 1000:.0f} ms" for r, (t, _) in sorted(self.peers.items())
                             if r != self.region) or "none heard"
            who = f"region {successor}'s manager is not live" if successor else "no other region's manager is live"
            return RegionReply(ok=False, region=self.region, error=(
                f"{who} (heartbeat ages: {ages}; live means under {self.config.suspect_ms} ms): nobody would "
                f"take over, so the lease is kept; use --force to release it anyway"))
        if not successor:
            successor = max((t, r) for r, t in live.items())[1] if live else ""
        old_term = self.term
        error = ""  # set when the wait below ends with no new primary
        async with self._lock:
            if self.role != PRIMARY:
                return RegionReply(ok=False, region=self.region, error="lost the lease meanwhile")
            self.hold_until = time.monotonic() + self.config.hold_ms / 1000.0
            # step down *before* the release is sent: once it commits the successor may win its CAS at
            # once, possibly before this manager has even read the acknowledgement, so stepping down
            # after the ack would leave both acting as primary for that moment (seen under load)
            rel_rev = self.rev
            self._step_down("demoted by operator")
            steps.append(RegionStep("stepped down", 0.0, "model-management writes off"))
            t = time.monotonic()
            value = LeaseValue(holder="", manager_id=self.manager_id, term=self.term, successor=successor,
                               op="release")
            try:
                rev = await asyncio.wait_for(self.store.cas(value, rel_rev), self.config.kv_timeout_ms / 1000.0)
                steps.append(RegionStep("lease released", (time.monotonic() - t) * 1000,
                                        f"revision {rev}, successor {successor or '(any)'}"))
                self._observe(rev, "", successor, self.manager_id)
            except (LostRace, LeaseUnavailable, asyncio.TimeoutError) as exc:
                # still standby; the lease stays on our revision, so the standby takes over after lease_ms,
                # or this manager resumes its term by CAS once hold_ms has passed (the resume rule)
                steps.append(RegionStep("lease release failed", (time.monotonic() - t) * 1000, repr(exc)))
                self._note("release_failed", repr(exc))
        await self._publish_hb()
        # wait for the new primary to announce itself (for the operator's report)
        t = time.monotonic()
        deadline = t + (max(2.0, 4 * self.config.lease_ms / 1000.0) if wait else 0.0)
        while time.monotonic() < deadline:
            if self.primary_region and self.primary_region != self.region and self.known_term > old_term \
                    and self._primary_alive(time.monotonic()):
                steps.append(RegionStep(f"{self.primary_region} promoted", (time.monotonic() - t) * 1000,
                                        f"term {self.known_term}"))
                self._cache_kick.set()
                break
            await asyncio.sleep(0.005)
        else:
            waited_ms = (time.monotonic() - t) * 1000
            steps.append(RegionStep("no new primary yet", waited_ms, "the standby takes over once it sees the release"))
            if wait:  # the hand-over the operator asked for did not happen within the wait: not a success
                error = (f"no new primary announced itself within {waited_ms:.0f} ms of the release; region "
                         f"{self.region} is standby and the lease is released (successor {successor or '(any)'}): a "
                         f"standby takes over once it sees the release, or after lease_ms; check `inferbus region "
                         f"status`")
        steps.append(RegionStep("total", (time.monotonic() - t0) * 1000))
        return RegionReply(ok=not error, region=self.region, steps=steps, error=error)

    async def _on_ctl(self, msg) -> None:
        try:
            cmd = decode_region(msg.data)
            if not isinstance(cmd, RegionCommand):
                raise RegionDecodeError(f"expected inferbus.v1.region_cmd, got {type(cmd).__name__}")
            if cmd.action == "status":
                reply = RegionReply(ok=True, region=self.region, status=await self.status())
            elif cmd.action == "promote":
                reply = await self.promote(cmd.force)
            elif cmd.action == "demote":
                reply = await self.demote(cmd.successor, wait=not cmd.force, force=cmd.force)
            else:
                reply = RegionReply(ok=False, region=self.region,
                                    error=f"unknown action {cmd.action!r}; actions: status, promote, demote")
        except RegionDecodeError as exc:
            reply = RegionReply(ok=False, region=self.region, error=f"bad command: {exc}")
        except Exception as exc:
            reply = RegionReply(ok=False, region=self.region, error=f"{type(exc).__name__}: {exc}")
        if msg.reply:
            await self.nc.publish(msg.reply, encode_region(reply))

    # ---- actor entry ------------------------------------------------------------------------------
    async def run(self) -> None:
        """Connect, subscribe, read the lease once, announce readiness, then run until cancelled.

        On cancellation (SIGTERM) a primary releases nothing: it simply stops renewing, so the
        standby takes over after ``lease_ms`` (use ``demote`` for a planned handover).
        """
        lease_holder: list = []

        async def on_lease_disconnect() -> None:
            # fail lease requests in flight at once (nats-py would let them wait out their timeout): a
            # renewal in flight steps down at once and resumes its term on the new connection (see _renew)
            self.lease_disconnects += 1
            if lease_holder:
                fail_pending_requests(lease_holder[0], "lease connection lost")

        own = self.config.lease_bus is not None
        self.nc = await connect(self.config.bus, name=f"region-{self.region}",
                                **({} if own else {"disconnected_cb": on_lease_disconnect}))
        if own:
            self.lease_nc = await connect(self.config.lease_bus, name=f"region-{self.region}-lease",
                                          disconnected_cb=on_lease_disconnect)
        else:
            self.lease_nc = self.nc
        lease_holder.append(self.lease_nc)
        self.store = LeaseStore(self.lease_nc.jetstream(timeout=self.config.kv_timeout_ms / 1000.0), self.bucket,
                                placement_cluster=self.config.placement_cluster, replicas=self.config.replicas)
        await self.nc.subscribe(self.subjects.region_heartbeats, cb=self._on_hb)
        from nats.micro import add_service

        # a NATS micro service like every actor kind: $SRV.PING/INFO/STATS find it; the operator commands
        # are its one endpoint
        svc = await add_service(self.nc, name="inferbus-region", version=__version__,
                                description="inferbus region manager (lease, promotion, fencing term)",
                                metadata={"region": self.region, "manager_id": self.manager_id},
                                stats_handler=self._stats_data)
        await svc.add_endpoint(name="control", subject=self.subjects.region_control(self.region),
                               handler=lambda r: self._on_ctl(r._msg))
        await self.nc.flush()
        # one attempt; JetStream may still be electing its meta leader (the loop keeps reading)
        await self._refresh()
        self._started = time.monotonic()
        await self._publish_hb()
        tasks = [asyncio.create_task(self._loop()), asyncio.create_task(self._cache_loop()),
                 asyncio.create_task(self._watch_loop())]
        announce_ready()
        try:
            await asyncio.gather(*tasks)
        finally:
            t0 = time.monotonic()
            log(f"region {self.region}: stopping (role {self.role}, term {self.term}): its loops stop, its "
                f"connections are drained", logging.INFO)
            for t in tasks + ([self._renew_task] if self._renew_task is not None else []):
                t.cancel()
            # every step bounded: a lease path that is cut (blackholed, not reset) must not hang the stop
            try:
                await asyncio.wait_for(svc.stop(), 2.0)
            except BaseException:
                pass
            try:
                await asyncio.wait_for(self.cache.close(), 2.0)
            except BaseException:
                pass
            # each connection drained (2 s) then closed (1 s); cut short (a second cancellation) the drain leaves
            # nothing unretrieved (close_connection), and the connections left are closed without draining
            hurry = False
            for nc in {id(c): c for c in (self.lease_nc, self.nc) if c is not None}.values():
                try:
                    await close_connection(nc, drain=not hurry, drain_timeout_s=2.0, close_timeout_s=1.0)
                except BaseException:  # a second cancellation: the run's own cancellation propagates all the same
                    hurry = True
            log(f"region {self.region}: stopped in {time.monotonic() - t0:.2f} s", logging.INFO)


async def ask_region(nc, prefix: str, region: str, action: str, *, force: bool = False, successor: str = "",
                     timeout_s: float = 5.0) -> RegionReply:
    """Send a :class:`RegionCommand` to ``region``'s manager and return its reply.

    Raises:
        nats.errors.NoRespondersError: no manager of that region is reachable.
        nats.errors.TimeoutError: no answer within ``timeout_s``.
        RegionDecodeError: the answer is not a ``RegionReply``.
    """
    msg = await nc.request(Subjects(prefix).region_control(region),
                           encode_region(RegionCommand(action=action, force=force, successor=successor)),
                           timeout=timeout_s)
    reply = decode_region(msg.data)
    if not isinstance(reply, RegionReply):
        raise RegionDecodeError(f"expected inferbus.v1.region_reply, got {type(reply).__name__}")
    return reply


def main(config_json: str) -> None:
    """Process entry: ``python -m inferbus.actors region '<RegionConfig JSON>'``."""
    cfg = RegionConfig.from_json(config_json)
    run_actor(RegionManager(cfg).run)
