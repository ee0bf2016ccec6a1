"""Local multi-region topologies: plan (sites, ports, nats-server configs) and a supervised runner.

``inferbus cluster up --regions 2`` runs :class:`Topology`; tests and chaos drills
use it in-process (see docs/regions.md).
"""

from ._plan import ClusterSpec, Plan, ServerPlan
from ._topology import ClusterCommand, ClusterReply, NodeProcessConfig, Topology, TopologyError

__all__ = [
    "ClusterCommand", "ClusterReply", "ClusterSpec", "NodeProcessConfig", "Plan", "ServerPlan", "Topology",
    "TopologyError",
]
