"""Messages of the region managers (DESIGN §8): a closed, version-tagged union.

* :class:`RegionHeartbeat` (``inferbus.v1.region_hb``): every region manager
  publishes one every ``heartbeat_ms`` on ``<p>._region.hb.<region>``; the
  primary's carries the fencing term that ingresses stamp on forwarded requests
  and workers stamp on replies.
* :class:`RegionCommand` / :class:`RegionReply` (``inferbus.v1.region_cmd`` /
  ``inferbus.v1.region_reply``): operator requests (status, promote, demote) on
  ``<p>._region.ctl.<region>``, answered with the steps taken and their timings.
* :class:`LeaseValue` (``inferbus.v1.lease``): the value of the lease key in the
  JetStream KV bucket.

:func:`decode_region` accepts only these tags and raises
:class:`RegionDecodeError` (naming the field) for anything else.
"""

from __future__ import annotations

import msgspec

PRIMARY = "primary"
STANDBY = "standby"


class RegionDecodeError(ValueError):
    """A region message could not be decoded: unknown tag or wrong field type."""


class _Base(msgspec.Struct, tag_field="type", omit_defaults=True, frozen=False):
    pass


class RegionHeartbeat(_Base, tag="inferbus.v1.region_hb"):
    """A region manager's liveness and view of the lease, every ``heartbeat_ms``."""

    region: str
    role: str
    """``primary`` or ``standby``."""
    term: int
    """The fencing term this manager holds when primary; else the highest term it knows (0 = none)."""
    lease_rev: int
    """Latest revision of the lease key this manager knows (0 = none)."""
    seq: int
    """Per-incarnation sequence number, +1 per heartbeat."""
    manager_id: str
    """Unique per manager incarnation (a restart gets a new one)."""
    lease_holder: str = ""
    """Region that holds the lease at ``lease_rev`` (``""`` = vacant)."""
    successor: str = ""
    """When the lease was released by a demotion: the region asked to take over."""
    valkey: str = ""
    """``host:port`` of this region's Valkey (standbys replicate from the primary's)."""
    model_writes: bool = False
    """Model-management writes enabled (only ever on the primary)."""


class LeaseValue(_Base, tag="inferbus.v1.lease"):
    """Value of the lease key. The term is the revision of the write that acquired the lease."""

    holder: str
    """Region holding the lease; ``""`` = released (vacant)."""
    manager_id: str = ""
    term: int = 0
    """0 on the acquiring write (its own revision is the term), the term on renewals."""
    valkey: str = ""
    successor: str = ""
    """Set by a release: the region asked to take over at once."""
    op: str = "acquire"
    """``acquire``, ``renew`` or ``release``."""


class RegionStep(msgspec.Struct, array_like=True):
    """One step of a promotion or demotion with its duration in ms."""

    name: str
    ms: float
    detail: str = ""


class Transition(msgspec.Struct, array_like=True):
    """A role change or detection event; ``t_mono`` is the manager's ``time.monotonic()`` (same host: comparable)."""

    t_mono: float
    event: str
    """``primary``, ``standby``, ``suspect``, ``lost_race``, ``renew_failed``..."""
    term: int
    detail: str = ""


class RegionStatus(msgspec.Struct, omit_defaults=True):
    """What ``inferbus region status`` shows for one region."""

    region: str
    role: str
    term: int
    lease_rev: int
    lease_holder: str
    lease_age_ms: float
    """Time since this manager first saw ``lease_rev`` (a renewal resets it)."""
    heartbeat_age_ms: dict[str, float]
    """Per peer region: time since its last heartbeat, ms."""
    peer_roles: dict[str, str]
    """Per peer region: the role its last heartbeat said (``primary``, ``standby``), or ``silent`` when that
    heartbeat is older than ``suspect_ms`` (a killed primary's last word was "primary": a script reading this saw
    two primaries, a fresh-user trial); ``heartbeat_age_ms`` has the age."""
    valkey: str
    cache_role: str
    """``master``, ``replica of host:port (link up|down)``, or ``unknown``."""
    model_writes: bool
    manager_id: str
    monotonic_now: float
    suspected_at: float | None = None
    """Monotonic time the current primary was last suspected dead (missed heartbeats)."""
    became_primary_at: float | None = None
    valid_until: float | None = None
    """Primary only: monotonic time its lease validity ends unless renewed."""
    lost_races: int = 0
    renewals: int = 0
    transitions: list[Transition] = []


class RegionCommand(_Base, tag="inferbus.v1.region_cmd"):
    """An operator request to one region manager."""

    action: str
    """``status``, ``promote`` or ``demote``."""
    force: bool = False
    """promote: take over even while another region holds a live lease. demote: release the lease even
    when no other region's manager is live, and reply without waiting for the successor's announcement
    (also used by a forced promotion)."""
    successor: str = ""
    """demote: region to hand over to (``""`` = any live standby)."""


class RegionReply(_Base, tag="inferbus.v1.region_reply"):
    """Answer to a :class:`RegionCommand`."""

    ok: bool
    region: str
    steps: list[RegionStep] = []
    error: str = ""
    status: RegionStatus | None = None


RegionMessage = RegionHeartbeat | LeaseValue | RegionCommand | RegionReply

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RegionMessage)


def encode_region(msg: RegionMessage) -> bytes:
    """MessagePack bytes of a region message (tag included)."""
    return _encoder.encode(msg)


def decode_region(body: bytes) -> RegionMessage:
    """Decode one region message.

    Raises:
        RegionDecodeError: unknown ``type`` tag, missing or mistyped field (the message names the field's path).
    """
    try:
        return _decoder.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise RegionDecodeError(str(exc)) from exc
