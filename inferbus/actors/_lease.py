"""The region lease: one key in a JetStream KV bucket, written only by compare-and-set (DESIGN §8).

The bucket's stream has 3 replicas placed on the witness cluster (``placement``),
so losing either region leaves it writable; the witness servers run JetStream
with ``sync_interval: always``. Every write names the revision it expects
(``Nats-Expected-Last-Subject-Sequence``); JetStream API errors 10071 (wrong
last sequence: N) and 10164 (wrong last sequence, no number: the stream leader
refuses a write on a subject that already has a conditional write in flight, so
concurrent candidates get it) both mean "lost the race". The revision
of the write that acquired the lease is the fencing term.

Errors::

    RegionError
     ├── LostRace           a CAS lost: another writer changed the lease first
     └── LeaseUnavailable   no answer / no quorum / no JetStream
"""

from __future__ import annotations

from ..schemas._region import LeaseValue, RegionDecodeError, decode_region, encode_region

LEASE_KEY = "leader"
"""The one key of the lease bucket."""

_CONFLICT_CODES = (10071, 10164)
"""JetStream API error codes that mean a CAS lost: wrong last sequence (10071: stale revision; 10164: another
conditional write on the key is in flight). nats-py's ``kv.update`` re-raises both as KeyWrongLastSequenceError."""


class RegionError(Exception):
    """Base of the region manager's errors."""


class LostRace(RegionError):
    """A compare-and-set on the lease lost: another writer changed it first (10071 / 10164)."""


class LeaseUnavailable(RegionError):
    """The lease bucket could not be reached or written in time (no quorum, timeout, no JetStream)."""


def bucket_name(prefix: str) -> str:
    """KV bucket of the lease for subject prefix ``prefix``: each ``_`` doubled, then each ``.`` an ``_`` (a bucket
    name is letters, digits, ``_`` and ``-``; ``-`` is kept), and ``_regions`` after it: ``desk.eu`` →
    ``desk_eu_regions``, ``desk_eu`` → ``desk__eu_regions``, ``desk-eu`` → ``desk-eu_regions``.

    One bucket per prefix: with a prefix's rules (:func:`inferbus.bus._config.prefix_problem`: no empty token, no
    token after the first starting with ``_``) a run of ``_`` and ``.`` is some ``_`` then at most one ``.``, which
    this maps to a run of its own length. Until 2026-12-06 both ``.`` and ``-`` became ``_``, so ``desk.eu``,
    ``desk-eu`` and ``desk_eu`` shared one lease and one fencing term (a fresh-user trial read it in the code)."""
    return prefix.replace("_", "__").replace(".", "_") + "_regions"


class LeaseStore:
    """The lease bucket (JetStream KV): every call is one read or one compare-and-set.

    Args:
        js: a JetStream context. bucket: bucket name.
        placement_cluster: cluster that must hold the replicas (witness); None = any.
        replicas: stream replicas.
    """

    def __init__(self, js, bucket: str, *, placement_cluster: str | None = None, replicas: int = 3) -> None:
        self.js = js
        self.bucket = bucket
        self.placement_cluster = placement_cluster
        self.replicas = replicas
        self.kv = None

    async def ensure(self) -> None:
        """Create the bucket (idempotent: the same config again is accepted) and open it.

        The stream is the one nats-py's ``create_key_value`` makes, plus a placement
        (which that call does not pass on) and file storage.

        Raises:
            LeaseUnavailable: JetStream did not answer or refused.
        """
        from nats.js import api
        from nats.js.errors import BadRequestError

        cfg = api.StreamConfig(
            name=f"KV_{self.bucket}", subjects=[f"$KV.{self.bucket}.>"], num_replicas=self.replicas,
            placement=api.Placement(cluster=self.placement_cluster) if self.placement_cluster else None,
            allow_rollup_hdrs=True, deny_delete=True, discard=api.DiscardPolicy.NEW, max_msgs_per_subject=64,
            max_msgs=-1, max_consumers=-1, max_bytes=1 << 20, allow_direct=False,
            storage=api.StorageType.FILE, duplicate_window=120.0,
        )
        try:
            try:
                await self.js.add_stream(cfg)
            except BadRequestError as exc:
                if getattr(exc, "err_code", None) != 10058:  # name in use with another config: keep that one
                    raise
            self.kv = await self.js.key_value(self.bucket)
        except Exception as exc:
            raise LeaseUnavailable(f"lease bucket {self.bucket!r}: {exc!r}") from exc

    async def read(self) -> tuple[int, LeaseValue | None]:
        """Latest ``(revision, value)``; ``(0, None)`` when the key was never written.

        A read can be stale by the time it returns; use it only to choose the revision of the next CAS.

        Raises:
            LeaseUnavailable: the bucket did not answer.
        """
        from nats.js.errors import KeyNotFoundError

        if self.kv is None:
            await self.ensure()
        try:
            entry = await self.kv.get(LEASE_KEY)
        except KeyNotFoundError:
            return 0, None
        except Exception as exc:
            raise LeaseUnavailable(f"lease read failed: {exc!r}") from exc
        try:
            value = decode_region(entry.value or b"")
        except RegionDecodeError:
            value = None
        return entry.revision, value if isinstance(value, LeaseValue) else None

    async def cas(self, value: LeaseValue, last: int) -> int:
        """Write ``value`` iff the key's latest revision is ``last`` (0 = the key must not exist).

        Returns:
            The revision of the write.

        Raises:
            LostRace: the revision was not ``last`` (JetStream 10071), or another conditional write on
                the key was in flight at the stream leader (10164).
            LeaseUnavailable: no answer / no quorum / any other error.

        Cancellation: the write may or may not have happened.
        """
        from nats.js.errors import APIError, KeyWrongLastSequenceError

        if self.kv is None:
            await self.ensure()
        body = encode_region(value)
        try:
            # last=0 sends "Nats-Expected-Last-Subject-Sequence: 0" (the key must not exist): a pure CAS.
            # kv.create would, on a conflict, read the key to check for a tombstone, and that read can
            # fail in a race and hide the lost race (we never delete the key, so there is no tombstone).
            return await self.kv.update(LEASE_KEY, body, last=last)
        except KeyWrongLastSequenceError as exc:
            raise LostRace(f"lease CAS on revision {last} lost: {exc}") from exc
        except APIError as exc:
            if getattr(exc, "err_code", None) in _CONFLICT_CODES:
                raise LostRace(f"lease CAS on revision {last} lost: {exc}") from exc
            raise LeaseUnavailable(f"lease write failed: {exc!r}") from exc
        except Exception as exc:
            raise LeaseUnavailable(f"lease write failed: {exc!r}") from exc
