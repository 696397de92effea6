"""The runtime: a Ray ``Cluster``, ``Worker`` groups placed on its devices, ``Channel``s between them,
and ``WeightSync`` from the actor to the rollout. See docs/runtime.md.

``Cluster``, groups and channels need Ray; ``ClusterConfig``, ``validate_placement``, the weight buckets and the
CUDA IPC transport do not. Names resolve on first use, so importing a Ray-free module of this package (as the GPU
check does, on a machine without Ray) does not import Ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_HOMES = {
    "Channel": "channel", "Cluster": "cluster", "ClusterError": "cluster", "ClusterConfig": "config",
    "NodeGroupConfig": "config", "MODES": "placement", "ComponentPlacement": "placement", "Placement": "placement",
    "RankPlacement": "placement", "Topology": "placement", "validate_placement": "placement",
    "PlacementError": "ranges", "WeightSync": "weight_sync", "BroadcastTransport": "weight_transports",
    "CudaIpcTransport": "weight_transports", "ObjectStoreTransport": "weight_transports",
    "WeightTransport": "weight_transports", "Worker": "worker", "GroupCall": "worker_group",
    "WorkerError": "worker_group", "WorkerGroup": "worker_group", "wait_all": "worker_group",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
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
