"""The drill registry: every runnable failover drill by name (``inferbus chaos run NAME``).

A drill is ``async def drill(opts) -> chaos.load.DrillFigures``; each entry says
where it lives and which options record it takes, and is imported only when run
(so listing drills never starts anything). :func:`get_drill` raises
:class:`UnknownDrill` for a name that is not registered.

| name            | module               | what it does                                                    |
|-----------------|----------------------|-----------------------------------------------------------------|
| worker-crash    | chaos.node_drills    | SIGKILL a worker under load                                     |
| worker-hang     | chaos.node_drills    | SIGSTOP a worker under load                                     |
| cache-loss      | chaos.node_drills    | SIGKILL Valkey under load                                       |
| soak            | chaos.node_drills    | long run with a fault every ``fault_every_s`` (``topology=True``: |
|                 |                      | on the two-region topology, cluster faults in the cycle)        |
| model-swap      | chaos.node_drills    | swap a model's default version 1 -> 2 -> 1 under checked load   |
| region-failover | chaos.region_drills  | SIGKILL every process of the primary region under load          |
| region-partition| chaos.region_drills  | cut the gateways between the regions; never two primaries       |
| nats-node-loss  | chaos.topology_drills| SIGKILL the primary region's nats-server under load; reconnects |
| gateway-degrade | chaos.topology_drills| 50 ms latency + 5 % loss on the A<->B gateways under load       |

The region drills take a degraded WAN for their whole run as options
(``gateway_latency_ms``, ``gateway_drop_pct``, ``gateway_links``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields


class UnknownDrill(KeyError):
    """No drill is registered under that name."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else "unknown drill"


@dataclass(frozen=True)
class DrillEntry:
    """Where a drill lives: ``module:function`` and ``module:OptionsClass`` (imported lazily); ``unused``: the
    fields of that class the drill does not read (the class is shared by several drills), which
    :func:`option_names` leaves out so that ``chaos run`` refuses them."""

    name: str
    target: str
    options: str
    summary: str
    unused: frozenset[str] = frozenset()

    def load(self):
        """``(drill coroutine function, options class)``."""
        mod, _, fn = self.target.partition(":")
        omod, _, ocls = self.options.partition(":")
        return getattr(importlib.import_module(mod), fn), getattr(importlib.import_module(omod), ocls)


_NODE_OPTS = "chaos.node_drills:DrillOptions"
_REGION_OPTS = "chaos.region_drills:RegionDrillOptions"
_GATEWAY_OPTS = "chaos.topology_drills:GatewayDrillOptions"
_SOAK_ONLY = frozenset({"fault_every_s", "faults", "topology"})
"""Fields of the node drills' options that only the soak reads."""
_NODE_LOSS_ONLY = frozenset({"node_down_s", "nats_server"})
"""Fields of the region drills' options that only nats-node-loss reads (``--down-s``, ``--server``); ``partition_s``
is region-partition's and ``fault_s`` gateway-degrade's (a fresh-user trial: ``region-failover --down-s 1`` ran
without a word, the option read by nothing)."""

DRILLS: dict[str, DrillEntry] = {e.name: e for e in [
    DrillEntry("worker-crash", "chaos.node_drills:worker_crash", _NODE_OPTS, "SIGKILL one worker under load",
               _SOAK_ONLY | {"hang_s"}),
    DrillEntry("worker-hang", "chaos.node_drills:worker_hang", _NODE_OPTS, "SIGSTOP one worker under load",
               _SOAK_ONLY),
    DrillEntry("cache-loss", "chaos.node_drills:cache_loss", _NODE_OPTS, "SIGKILL Valkey under load",
               _SOAK_ONLY | {"hang_s"}),
    DrillEntry("soak", "chaos.node_drills:soak", _NODE_OPTS,
               "steady load with a fault every fault_every_s, cycling through every fault kind "
               "(--topology: on the two-region topology)"),
    DrillEntry("model-swap", "chaos.node_drills:model_swap", _NODE_OPTS,
               "swap a model's default version under load and back; every answer checked for its version",
               _SOAK_ONLY | {"hang_s"}),
    DrillEntry("region-failover", "chaos.region_drills:region_failover", _REGION_OPTS,
               "SIGKILL every process of the primary region under load; the standby takes over",
               _NODE_LOSS_ONLY | {"partition_s", "fault_s"}),
    DrillEntry("region-partition", "chaos.region_drills:region_partition", _REGION_OPTS,
               "cut the gateways between the regions under load; never two primaries", _NODE_LOSS_ONLY | {"fault_s"}),
    DrillEntry("nats-node-loss", "chaos.topology_drills:nats_node_loss", _REGION_OPTS,
               "SIGKILL the primary region's nats-server under load; clients and actors reconnect",
               frozenset({"partition_s", "fault_s"})),
    DrillEntry("gateway-degrade", "chaos.topology_drills:gateway_degrade", _GATEWAY_OPTS,
               "latency + packet loss on the gateways between the regions under load",
               _NODE_LOSS_ONLY | {"partition_s"}),
]}
"""Every registered drill by name. Other drill modules add their entries here."""


def get_drill(name: str) -> DrillEntry:
    """The registry entry of ``name``.

    Raises:
        UnknownDrill: ``name`` is not registered (the message lists the known names).
    """
    try:
        return DRILLS[name]
    except KeyError:
        raise UnknownDrill(f"unknown drill {name!r}; known drills: {', '.join(sorted(DRILLS))}") from None


def option_names(name: str) -> set[str]:
    """The option fields the drill ``name`` takes (imports its options class): its fields less the entry's
    ``unused``."""
    entry = get_drill(name)
    _, opts_cls = entry.load()
    return {f.name for f in fields(opts_cls)} - entry.unused


def make_options(options_cls, **values):
    """Build ``options_cls`` from the values it has fields for (others are ignored; None = default)."""
    names = {f.name for f in fields(options_cls)}
    return options_cls(**{k: v for k, v in values.items() if k in names and v is not None})


async def run_drill(name: str, **values):
    """Run the drill ``name`` with options built from ``values``; returns its ``DrillFigures``.

    Raises:
        UnknownDrill: no such drill.
    """
    fn, opts_cls = get_drill(name).load()
    return await fn(make_options(opts_cls, **values))
