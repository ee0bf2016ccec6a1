"""Typed configuration of each actor process, validated once and passed explicitly.

Each record round-trips through JSON (``to_json`` / ``from_json``) because the
node supervisor hands it to a child process on its command line.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from ..bus import BusConfig


def _from_dict(cls, d: dict):
    d = dict(d)
    if "bus" in d and isinstance(d["bus"], dict):
        d["bus"] = BusConfig.from_dict(d["bus"])
    names = {f.name for f in fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)}; allowed: {sorted(names)}")
    for f in fields(cls):
        if f.name in d and isinstance(d[f.name], list) and f.type.startswith("tuple"):
            d[f.name] = tuple(d[f.name])
    return cls(**d)


class _JsonMixin:
    def to_json(self) -> str:
        d = asdict(self)  # type: ignore[call-overload]
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str):
        return _from_dict(cls, json.loads(text))


@dataclass(frozen=True)
class WorkerConfig(_JsonMixin):
    """One worker process: one device slot, its models, its mailbox."""

    worker_id: str
    bus: BusConfig
    models_dir: str
    models: tuple[str, ...] = ()
    """Model names to load (empty = every model in the repository)."""
    backend: str = "onnxruntime"
    device_kind: str = "cpu"
    device_index: int = 0
    precision: str = "fp32"
    mailbox_size: int = 1024
    """Bound of the request mailbox; beyond it requests are shed with RESOURCE_EXHAUSTED."""
    report_interval_ms: int = 100
    """Load/health report period in ms."""
    cpu_affinity: tuple[int, ...] = ()
    """CPU cores to pin this process to (empty = no pinning)."""
    max_batch_size: int | None = None
    """Override of the models' ``max_batch_size`` for zero-wait batching (None = per model config)."""
    region: str = ""
    audit: bool = False
    """Publish the request id of every execution on ``<p>._audit`` (chaos drills count duplicates with it)."""
    compute_delay_ms: float = 0.0
    """Fault injection only: extra sleep before each batch (chaos 'slow-worker')."""

    def __post_init__(self) -> None:
        if self.mailbox_size < 1:
            raise ValueError("WorkerConfig.mailbox_size must be >= 1")
        if self.report_interval_ms < 10:
            raise ValueError("WorkerConfig.report_interval_ms must be >= 10 ms")


@dataclass(frozen=True)
class IngressConfig(_JsonMixin):
    """One ingress process (request actor + its in-process router)."""

    ingress_id: str
    bus: BusConfig
    models_dir: str
    models: tuple[str, ...] = ()
    redis_url: str | None = None
    """L2 cache (Valkey/Redis URL); None disables L2 lookups."""
    l2_lookup: bool = False
    """Look up the L2 cache on an L1 miss (costs one Redis round trip per miss; fills happen either way)."""
    l1_entries: int = 10_000
    """L1 cache capacity in entries (LRU)."""
    l2_timeout_ms: float = 2.0
    """An L2 lookup slower than this counts as a miss."""
    default_timeout_ms: float = 1000.0
    """Budget when a request has no Inferbus-Timeout-Ms header."""
    health_timeout_s: float = 5.0
    """A worker with no load report for this long is taken out of routing."""
    max_pending: int = 100_000
    """Bound of requests forwarded and not yet completed; beyond it: RESOURCE_EXHAUSTED."""
    region: str = ""
    cpu_affinity: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.health_timeout_s <= 0:
            raise ValueError("IngressConfig.health_timeout_s must be > 0 seconds")


@dataclass(frozen=True)
class AggregatorConfig(_JsonMixin):
    """The aggregator process: L2 cache fills."""

    aggregator_id: str
    bus: BusConfig
    redis_url: str | None = None
    cpu_affinity: tuple[int, ...] = ()
