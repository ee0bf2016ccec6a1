"""Actors: ingress (request actor + in-process router), worker, aggregator, region manager, and the node that runs them."""

from ._config import AggregatorConfig, IngressConfig, WorkerConfig
from ._node import Node, NodeConfig
from ._region import RegionConfig, RegionManager
from ._repository import Model, ModelConfig, ModelRepository, ModelVersion, RepositoryError, default_models_dir
from ._router import Router, WorkerState

__all__ = [
    "AggregatorConfig", "IngressConfig", "Model", "ModelConfig", "ModelRepository", "ModelVersion", "Node",
    "NodeConfig", "RegionConfig", "RegionManager", "RepositoryError", "Router", "WorkerConfig", "WorkerState",
    "default_models_dir",
]
