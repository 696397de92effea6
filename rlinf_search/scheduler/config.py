"""``ClusterConfig``: the typed view of the ``cluster`` config section.

Pure Python (no Ray): the trainer's ``validate_cfg`` builds it before anything starts, and every
error names the key's path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from pydantic import Field, field_validator, model_validator

from rlinf_search.scheduler.ranges import PlacementError, expand, parse_ranges
from rlinf_search.section_model import ConfigSection, parse_section


@dataclass(frozen=True)
class NodeGroupConfig:
    """One entry of ``cluster.node_groups``: a named set of nodes, for clusters whose nodes differ."""

    nodes: tuple[int, ...]
    """Node ranks in the group, in the order their devices are numbered (written ``0-1`` or
    ``[0, 1]``). Node ranks follow the cluster's node order: the Ray head first, then by IP."""


class ClusterConfig(ConfigSection):
    """Typed view of ``cluster``; RLinf's keys (``num_nodes``, ``component_placement``) read the same."""

    config_path = "cluster"

    num_nodes: int = Field(1, ge=1)
    """Nodes the run uses. Joining a Ray cluster with fewer alive nodes is an error at start-up."""
    component_placement: dict[str, Any] = {}
    """Component names (comma-joined when they share an entry) to devices: ``all``, ``0-3``,
    ``0,2,4-5``, or ``{node_group: a10, devices: 0-3}``. See docs/runtime.md."""
    cpu_slots_per_node: int = Field(1, ge=1)
    """Devices of a node without GPUs. A slot is a scheduling unit, not a core: 8 slots on a 2-core
    laptop are fine, and one rank per component on one slot is the cheapest laptop default."""
    num_gpus_per_node: int | None = Field(None, ge=1)
    """GPUs each node must have, for a recipe written for GPUs: the placement is then checked on
    these GPUs before Ray starts (on any machine), and at start-up a node with fewer is an error.
    ``None``: whatever Ray finds, checked at start-up only."""
    address: str | None = None
    """``None`` starts an embedded Ray in this process; ``auto`` (the local ``ray start`` head) or
    ``ray://host:port`` / ``host:port`` joins an existing cluster, which is how multi-node runs."""
    num_cpus: int | None = Field(None, ge=1)
    """CPUs the embedded Ray may use (``None``: every core). Workers take none of them (see
    docs/runtime.md); this bounds plain Ray tasks. Only for the embedded Ray."""
    max_restarts: int = Field(3, ge=0)
    """Rollout ranks the runtime may start again after their process was lost mid-step (a new process on the same
    device, given the current weights; the lost ranks' rollouts run again), over the whole run. One more loss stops
    the run in one line. 0: any lost rank stops the run."""
    node_groups: dict[str, NodeGroupConfig] = {}
    """Named node sets for heterogeneous clusters, e.g. ``{a10: {nodes: [0]}, h100: {nodes: 1-2}}``;
    a component's ``node_group`` picks one, and its device ids then count within that group."""

    @model_validator(mode="after")
    def _check(self) -> ClusterConfig:
        if self.address is not None and self.num_cpus is not None:
            raise PlacementError("cluster.num_cpus only sizes the embedded Ray; a cluster joined at "
                                 f"cluster.address ({self.address}) has its own CPU count")
        for label, group in self.node_groups.items():
            for node in group.nodes:
                if node >= self.num_nodes:
                    raise PlacementError(f"cluster.node_groups.{label}.nodes: node {node} exceeds the "
                                         f"{self.num_nodes} nodes of this cluster")
        return self

    @field_validator("component_placement", mode="before")
    @classmethod
    def _placement_is_a_mapping(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise ValueError("must be a mapping of component names to devices")
        return dict(value)

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> ClusterConfig:
        """Build from the ``cluster`` section (a dict or an OmegaConf ``DictConfig``)."""
        if isinstance(section, DictConfig):
            section = OmegaConf.to_container(section, resolve=True)
        values = {key: value for key, value in section.items() if value is not None}  # null: the default
        groups = values.get("node_groups") or {}
        if not isinstance(groups, Mapping):
            raise PlacementError("cluster.node_groups must map a label to {nodes: ...}, "
                                 f"got {type(groups).__name__}")
        num_nodes = values.get("num_nodes", 1)
        values["node_groups"] = {str(label): _node_group(str(label), body, num_nodes)
                                 for label, body in groups.items()}
        try:
            return parse_section(cls, values, path="cluster")
        except ValueError as exc:
            raise PlacementError(str(exc)) from None


def _node_group(label: str, body: Any, num_nodes: int) -> NodeGroupConfig:
    path = f"cluster.node_groups.{label}"
    if not isinstance(body, Mapping) or set(body) != {"nodes"}:
        raise PlacementError(f"{path}: expected {{nodes: <node ranks>}}, got {body!r}")
    ranges = parse_ranges(body["nodes"], path=f"{path}.nodes", what="node")
    nodes = range(num_nodes if isinstance(num_nodes, int) else 0) if ranges is None else expand(ranges)
    return NodeGroupConfig(nodes=tuple(nodes))
