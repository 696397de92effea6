"""The runtime: a Ray ``Cluster``, ``Worker`` groups placed on its devices, ``Channel``s between them,
and ``WeightSync`` from the actor to the rollout. See docs/runtime.md.

``Cluster``, groups and channels need Ray; ``ClusterConfig`` and ``validate_placement`` are pure
Python, for config validation before anything starts.
"""

from rlinf_search.scheduler.channel import Channel
from rlinf_search.scheduler.cluster import Cluster, ClusterError
from rlinf_search.scheduler.config import ClusterConfig, NodeGroupConfig
from rlinf_search.scheduler.placement import (
    MODES,
    ComponentPlacement,
    Placement,
    RankPlacement,
    Topology,
    validate_placement,
)
from rlinf_search.scheduler.ranges import PlacementError
from rlinf_search.scheduler.weight_sync import WeightSync
from rlinf_search.scheduler.weight_transports import (
    BroadcastTransport,
    CudaIpcTransport,
    ObjectStoreTransport,
    WeightTransport,
)
from rlinf_search.scheduler.worker import Worker
from rlinf_search.scheduler.worker_group import GroupCall, WorkerError, WorkerGroup, wait_all

__all__ = [
    "MODES", "BroadcastTransport", "Channel", "CudaIpcTransport", "Cluster", "ClusterConfig", "ClusterError", "ComponentPlacement",
    "GroupCall", "NodeGroupConfig", "ObjectStoreTransport", "Placement", "PlacementError", "RankPlacement",
    "Topology", "WeightSync", "WeightTransport", "Worker", "WorkerError", "WorkerGroup", "validate_placement",
    "wait_all",
]
