"""Placement: which devices, nodes and ranks each component gets, resolved from
``cluster.component_placement`` and checked before any worker starts.

Pure Python (no Ray), so the trainer's ``validate_cfg`` can call ``validate_placement`` on the config
alone, and the ``Cluster`` calls it again with the devices it actually found.

A device is a GPU on GPU nodes and a CPU slot elsewhere. Devices are numbered across the cluster
node by node (node 0's devices first); inside a node group they are numbered across that group's
nodes. Ranks follow the order the devices are written in, one rank per device.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from rlinf_search.scheduler.config import ClusterConfig
from rlinf_search.scheduler.ranges import PlacementError, expand, format_ids, parse_ranges

log = logging.getLogger(__name__)

MODES = ("collocated", "disaggregated", "hybrid")



@dataclass(frozen=True)
class Backend:
    """A component's backend as the placement sees it: its name (for messages) and where it can time-share."""

    name: str
    """``rollout.rollout_backend`` (or the component's backend key)."""
    offloads_on: frozenset[str]
    """Device kinds (``cpu``, ``cuda``) on which it releases its memory between phases; on another kind the
    component cannot share a device (the rollout engine's ``EngineTraits.offloads_on``)."""


_ENTRY_KEYS = ("node_group", "devices")


@dataclass(frozen=True)
class Topology:
    """The devices a placement can use."""

    device_kind: str
    """``cuda`` when the nodes have GPUs, else ``cpu`` (devices are then CPU slots)."""
    devices_per_node: tuple[int, ...]
    """Devices on each node, in node-rank order."""
    node_groups: Mapping[str, tuple[int, ...]]
    """Node-group label to its node ranks (``cluster.node_groups``)."""

    @classmethod
    def from_config(cls, config: ClusterConfig, *, gpus_per_node: int | None = None) -> Topology:
        """The topology ``config`` describes: GPUs when ``gpus_per_node`` (default: the config's
        ``num_gpus_per_node``) is > 0, else CPU slots. For ``validate_cfg`` before Ray starts."""
        if gpus_per_node is None:
            gpus_per_node = config.num_gpus_per_node or 0
        per_node = gpus_per_node if gpus_per_node > 0 else config.cpu_slots_per_node
        return cls(device_kind="cuda" if gpus_per_node > 0 else "cpu",
                   devices_per_node=(per_node,) * config.num_nodes,
                   node_groups={label: group.nodes for label, group in config.node_groups.items()})

    @property
    def num_devices(self) -> int:
        return sum(self.devices_per_node)

    def devices_of(self, node_group: str | None) -> list[tuple[int, int]]:
        """``(node rank, device on that node)`` for each device of the cluster or of a node group."""
        nodes = range(len(self.devices_per_node)) if node_group is None else self.node_groups[node_group]
        return [(node, local) for node in nodes for local in range(self.devices_per_node[node])]

    def global_id(self, node: int, local: int) -> int:
        return sum(self.devices_per_node[:node]) + local


@dataclass(frozen=True)
class RankPlacement:
    """Where one rank of a component runs."""

    rank: int
    """Rank in the component's group (``RANK``)."""
    node_rank: int
    """The node it runs on, in the cluster's node order."""
    device: int
    """Device on that node: the GPU index (``CUDA_VISIBLE_DEVICES``) or the CPU slot (``RLINF_CPU_SLOT``)."""
    local_rank: int
    """Rank among this component's ranks on the same node (``LOCAL_RANK``)."""
    local_world_size: int
    """This component's ranks on that node (``LOCAL_WORLD_SIZE``)."""


@dataclass(frozen=True)
class ComponentPlacement:
    """The resolved placement of one component: one rank per device."""

    name: str
    """Component name as written in ``component_placement`` (``rollout``)."""
    ranks: tuple[RankPlacement, ...]
    """Per rank, in rank order."""
    devices: tuple[int, ...]
    """Cluster-wide device ids, one per rank, in rank order."""

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def node_ranks(self) -> tuple[int, ...]:
        """Nodes this component uses, ascending."""
        return tuple(sorted({r.node_rank for r in self.ranks}))


@dataclass(frozen=True)
class Placement:
    """Every component's placement and the mode they form together."""

    mode: str
    """``collocated`` (all share the same devices), ``disaggregated`` (pairwise disjoint) or ``hybrid``."""
    components: Mapping[str, ComponentPlacement]
    topology: Topology

    def __getitem__(self, name: str) -> ComponentPlacement:
        if name not in self.components:
            raise PlacementError(f"cluster.component_placement: no entry places '{name}'; "
                                 f"placed: {', '.join(sorted(self.components)) or 'nothing'}")
        return self.components[name]


def host_placement(name: str, world_size: int) -> ComponentPlacement:
    """``world_size`` ranks on the first node's first slot: workers that use no device (the SearchTool and
    AgentLoop groups wait on the network or on other groups) and belong beside the driver."""
    ranks = tuple(RankPlacement(rank=r, node_rank=0, device=0, local_rank=r, local_world_size=world_size)
                  for r in range(world_size))
    return ComponentPlacement(name=name, ranks=ranks, devices=(0,) * world_size)


def validate_placement(placement_cfg: Mapping[str, Any], mode: str | None = None,
                       backends: Mapping[str, Backend] | None = None, *, topology: Topology,
                       known_components: Collection[str] | None = None) -> Placement:
    """Check ``cluster.component_placement`` and resolve it on ``topology``.

    ``mode`` (None: inferred) is checked against how components share devices; ``backends`` maps a
    component to its ``Backend``, and a backend that cannot offload on the topology's device kind may
    not share devices; ``known_components`` (None: any name) rejects typos. Raises
    ``PlacementError`` naming the offending key.
    """
    if mode is not None and mode not in MODES:
        raise PlacementError(f"placement mode must be one of {', '.join(MODES)}, got {mode!r}")
    components: dict[str, ComponentPlacement] = {}
    key_of: dict[str, str] = {}
    for key, entry in placement_cfg.items():
        key = str(key)
        path = f"cluster.component_placement.{key}"
        node_group, devices_spec, spec_path = _read_entry(entry, path, topology)
        slots = _resolve_devices(devices_spec, node_group, topology, path=spec_path)
        for name in (part.strip() for part in key.split(",")):
            _check_name(name, key_of, known_components, path=path)
            key_of[name] = key
            components[name] = _component(name, slots, topology)
    resolved_mode = _infer_mode(components)
    if mode is not None:
        _check_mode(mode, components, key_of)
    _check_backends(backends or {}, components, key_of, topology.device_kind)
    return Placement(mode=mode or resolved_mode, components=components, topology=topology)


def _read_entry(entry: Any, path: str, topology: Topology) -> tuple[str | None, Any, str]:
    """(node group, device spec, path of the device spec) of one ``component_placement`` value."""
    if not isinstance(entry, Mapping):
        return None, entry, path
    body = dict(entry)
    if "placement" in body and "devices" not in body:
        log.warning("%s.placement is RLinf's spelling of %s.devices; it is read as devices", path, path)
        body["devices"] = body.pop("placement")
    unknown = sorted(set(body) - set(_ENTRY_KEYS))
    if unknown:
        raise PlacementError(f"{path}: unknown key '{unknown[0]}' (an entry takes {', '.join(_ENTRY_KEYS)})")
    if "devices" not in body:
        raise PlacementError(f"{path}.devices: required (e.g. 'all' or '0-3')")
    node_group = body.get("node_group")
    if node_group is not None and node_group not in topology.node_groups:
        defined = ", ".join(sorted(topology.node_groups)) or "none (cluster.node_groups is empty)"
        raise PlacementError(f"{path}.node_group: unknown node group '{node_group}'; defined: {defined}")
    return node_group, body["devices"], f"{path}.devices"


def _resolve_devices(spec: Any, node_group: str | None, topology: Topology,
                     *, path: str) -> list[tuple[int, int]]:
    """``(node, device)`` per rank for one device spec, checked against the devices that exist."""
    available = topology.devices_of(node_group)
    ranges = parse_ranges(spec, path=path)
    if ranges is None:
        if not available:
            raise PlacementError(f"{path}: 'all' names no devices: {_where(node_group)} has none")
        return available
    for item in ranges:
        if item.end >= len(available):
            noun = "device range" if item.start != item.end else "device"
            raise PlacementError(f"{path}: {noun} {item} exceeds the {len(available)} devices of "
                                 f"{_where(node_group)}")
    return [available[i] for i in expand(ranges)]


def _where(node_group: str | None) -> str:
    return "this cluster" if node_group is None else f"node group '{node_group}'"


def _check_name(name: str, key_of: Mapping[str, str], known: Collection[str] | None, *, path: str) -> None:
    if not name:
        raise PlacementError(f"{path}: empty component name")
    if known is not None and name not in known:
        raise PlacementError(f"{path}: unknown component '{name}'; known: {', '.join(sorted(known))}")
    if name in key_of:
        raise PlacementError(f"{path}: component '{name}' is already placed by "
                             f"cluster.component_placement.{key_of[name]}")


def _component(name: str, slots: list[tuple[int, int]], topology: Topology) -> ComponentPlacement:
    per_node: dict[int, int] = {}
    for node, _ in slots:
        per_node[node] = per_node.get(node, 0) + 1
    seen: dict[int, int] = {}
    ranks = []
    for rank, (node, device) in enumerate(slots):
        ranks.append(RankPlacement(rank=rank, node_rank=node, device=device, local_rank=seen.get(node, 0),
                                   local_world_size=per_node[node]))
        seen[node] = seen.get(node, 0) + 1
    devices = tuple(topology.global_id(node, device) for node, device in slots)
    return ComponentPlacement(name=name, ranks=tuple(ranks), devices=devices)


def _infer_mode(components: Mapping[str, ComponentPlacement]) -> str:
    device_sets = [set(c.devices) for c in components.values()]
    if all(s == device_sets[0] for s in device_sets):
        return "collocated"
    if sum(len(s) for s in device_sets) == len(set().union(*device_sets)):
        return "disaggregated"
    return "hybrid"


def _check_mode(mode: str, components: Mapping[str, ComponentPlacement], key_of: Mapping[str, str]) -> None:
    names = list(components)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            da, db = set(components[a].devices), set(components[b].devices)
            path = f"cluster.component_placement.{key_of[b]}"
            if mode == "collocated" and da != db:
                raise PlacementError(f"{path}: placement mode collocated needs every component on the same "
                                     f"devices, but {a} has {format_ids(da)} and {b} has {format_ids(db)}")
            if mode == "disaggregated" and da & db:
                raise PlacementError(f"{path}: placement mode disaggregated needs disjoint devices, but {b} "
                                     f"shares devices {format_ids(da & db)} with {a}")


def _check_backends(backends: Mapping[str, Backend], components: Mapping[str, ComponentPlacement],
                    key_of: Mapping[str, str], device_kind: str) -> None:
    for name, backend in backends.items():
        if device_kind in backend.offloads_on or name not in components:
            continue
        mine = set(components[name].devices)
        for other, placed in components.items():
            shared = mine & set(placed.devices)
            if other != name and shared:
                raise PlacementError(
                    f"cluster.component_placement.{key_of[name]}: {name} backend '{backend.name}' cannot offload "
                    f"on {device_kind} devices, so {name} cannot share devices {format_ids(shared)} with "
                    f"{other}; give {name} devices of its own (on a GPU cluster, declare "
                    "cluster.num_gpus_per_node)")

