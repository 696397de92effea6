"""Placement and cluster-config parsing: pure Python, no Ray. Every config error names its key."""

from __future__ import annotations

import logging

import pytest

from rlinf_search.scheduler.config import ClusterConfig
from rlinf_search.scheduler.placement import Backend, Topology, validate_placement
from rlinf_search.scheduler.ranges import PlacementError, format_ids, parse_ranges
from rlinf_search.workers.rollout.base import traits_of

COMPONENTS = {"actor", "rollout", "inference", "reward", "agent"}


def cpu(slots: int = 8, nodes: int = 1, **groups: tuple[int, ...]) -> Topology:
    return Topology(device_kind="cpu", devices_per_node=(slots,) * nodes, node_groups=groups)


def resolve(cfg, mode=None, backends=None, topology=None):
    return validate_placement(cfg, mode, backends, topology=topology or cpu(), known_components=COMPONENTS)


def test_collocated_all_gives_every_component_every_device():
    placement = resolve({"actor,rollout,reward": "all"})
    assert placement.mode == "collocated"
    for name in ("actor", "rollout", "reward"):
        assert placement[name].devices == tuple(range(8))
        assert [r.rank for r in placement[name].ranks] == list(range(8))
        assert [r.device for r in placement[name].ranks] == list(range(8))


def test_disaggregated_ranges_map_ranks_to_declared_devices():
    placement = resolve({"rollout": "0-3", "actor": "4-7"}, mode="disaggregated")
    assert placement.mode == "disaggregated"
    assert placement["actor"].devices == (4, 5, 6, 7)
    assert [(r.rank, r.device, r.local_rank) for r in placement["actor"].ranks] == [
        (0, 4, 0), (1, 5, 1), (2, 6, 2), (3, 7, 3)]


def test_lists_keep_the_written_order_and_hybrid_is_inferred():
    placement = resolve({"actor,rollout": "0,2,4-5", "reward": 7, "inference": [3, "0"]})
    assert placement["actor"].devices == (0, 2, 4, 5)
    assert placement["inference"].devices == (3, 0)  # rank 0 on device 3, as written
    assert placement["reward"].world_size == 1
    assert placement.mode == "hybrid"  # inference shares device 0 with actor; reward is alone


def test_multi_node_numbering_and_local_ranks():
    placement = resolve({"actor": "2-5"}, topology=cpu(slots=4, nodes=2))
    ranks = placement["actor"].ranks
    assert [(r.node_rank, r.device, r.local_rank, r.local_world_size) for r in ranks] == [
        (0, 2, 0, 2), (0, 3, 1, 2), (1, 0, 0, 2), (1, 1, 1, 2)]
    assert placement["actor"].node_ranks == (0, 1)


def test_node_groups_number_devices_within_the_group():
    topology = Topology(device_kind="cuda", devices_per_node=(8, 4, 4), node_groups={"a100": (0,), "a10": (1, 2)})
    placement = validate_placement({"actor": {"node_group": "a100", "devices": "all"},
                                    "rollout": {"node_group": "a10", "devices": "3-5"}}, topology=topology)
    assert [(r.node_rank, r.device) for r in placement["rollout"].ranks] == [(1, 3), (2, 0), (2, 1)]
    assert placement["rollout"].devices == (11, 12, 13)  # cluster-wide ids: node 0 has 8 devices
    assert placement["actor"].devices == tuple(range(8))
    assert placement.mode == "disaggregated"


def test_rlinf_spelling_of_an_entry_is_read_with_one_warning(caplog):
    topology = cpu(nodes=2, a10=(1,))
    with caplog.at_level(logging.WARNING):
        placement = validate_placement({"rollout": {"node_group": "a10", "placement": "0-1"}}, topology=topology)
    assert placement["rollout"].devices == (8, 9)
    assert "cluster.component_placement.rollout.placement is RLinf's spelling" in caplog.text


@pytest.mark.parametrize("cfg,mode,message", [
    ({"rollout": "0-9"}, None,
     "cluster.component_placement.rollout: device range 0-9 exceeds the 8 devices of this cluster"),
    ({"rollout": "0,8"}, None,
     "cluster.component_placement.rollout: device 8 exceeds the 8 devices of this cluster"),
    ({"rollout": "3-1"}, None,
     "cluster.component_placement.rollout: malformed device range '3-1': the start is after the end"),
    ({"rollout": "a-b"}, None,
     "cluster.component_placement.rollout: malformed device list 'a-b': expected 'all', an id like 3, "
     "a range like 0-3, or a comma list of these like 0,2,4-5"),
    ({"rollout": "0-3,2"}, None, "cluster.component_placement.rollout: device 2 is listed twice in '0-3,2'"),
    ({"rollout": " "}, None, "cluster.component_placement.rollout: empty device list"),
    ({"rollout": "0-3:0-7"}, None,
     "cluster.component_placement.rollout: '0-3:0-7' maps processes to devices (RLinf's 'devices:processes' "
     "form); here each rank takes one device, so list the devices only"),
    ({"actor,rollut": "all"}, None,
     "cluster.component_placement.actor,rollut: unknown component 'rollut'; "
     "known: actor, agent, inference, reward, rollout"),
    ({"actor,rollout": "all", "actor": "0"}, None,
     "cluster.component_placement.actor: component 'actor' is already placed by "
     "cluster.component_placement.actor,rollout"),
    ({"rollout": "0-3", "actor": "2-5"}, "disaggregated",
     "cluster.component_placement.actor: placement mode disaggregated needs disjoint devices, "
     "but actor shares devices 2-3 with rollout"),
    ({"rollout": "0-3", "actor": "4-7"}, "collocated",
     "cluster.component_placement.actor: placement mode collocated needs every component on the same "
     "devices, but rollout has 0-3 and actor has 4-7"),
    ({"rollout": {"node_group": "a100", "devices": "0"}}, None,
     "cluster.component_placement.rollout.node_group: unknown node group 'a100'; "
     "defined: none (cluster.node_groups is empty)"),
    ({"rollout": {"device": "0"}}, None,
     "cluster.component_placement.rollout: unknown key 'device' (an entry takes node_group, devices)"),
    ({"rollout": {"node_group": None}}, None,
     "cluster.component_placement.rollout.devices: required (e.g. 'all' or '0-3')"),
    ({"rollout": True}, None, "cluster.component_placement.rollout: expected a device list, got True"),
    ({"rollout": "all"}, "pipelined", "placement mode must be one of collocated, disaggregated, hybrid, "
                                      "got 'pipelined'"),
])
def test_config_errors_name_the_key(cfg, mode, message):
    with pytest.raises(PlacementError) as caught:
        resolve(cfg, mode)
    assert str(caught.value) == message
    assert isinstance(caught.value, ValueError)


def test_range_past_a_node_group_names_the_group():
    topology = cpu(slots=2, nodes=2, a10=(1,))
    with pytest.raises(PlacementError, match=r"^cluster.component_placement.rollout.devices: device range 1-2 "
                                             r"exceeds the 2 devices of node group 'a10'$"):
        validate_placement({"rollout": {"node_group": "a10", "devices": "1-2"}}, topology=topology)


def test_a_backend_that_cannot_offload_may_not_share_devices():
    cfg = {"actor,rollout": "all"}
    with pytest.raises(PlacementError) as caught:
        resolve(cfg, "collocated", {"rollout": engine("vllm")})
    assert str(caught.value) == (
        "cluster.component_placement.actor,rollout: rollout backend 'vllm' cannot offload on cpu devices, "
        "so rollout cannot share devices 0-7 with actor; give rollout devices of its own (on a GPU cluster, "
        "declare cluster.num_gpus_per_node)")
    # The same pair is fine disaggregated, and on GPUs (vLLM's sleep mode offloads there).
    resolve({"rollout": "0-3", "actor": "4-7"}, "disaggregated", {"rollout": engine("vllm")})
    gpu = Topology(device_kind="cuda", devices_per_node=(8,), node_groups={})
    assert resolve(cfg, "collocated", {"rollout": engine("vllm")}, topology=gpu).mode == "collocated"
    assert resolve(cfg, "collocated", {"rollout": engine("hf")}).mode == "collocated"


def engine(name: str) -> Backend:
    """The placement's view of a registered rollout engine: its offload trait."""
    return Backend(name, traits_of(name).offloads_on)


def test_missing_component_is_a_placement_error():
    placement = resolve({"actor": "all"})
    with pytest.raises(PlacementError, match="no entry places 'rollout'; placed: actor"):
        placement["rollout"]


def test_topology_from_config_uses_cpu_slots_or_gpus():
    config = ClusterConfig.from_dict({"num_nodes": 2, "cpu_slots_per_node": 4, "node_groups": {"a10": {"nodes": 1}}})
    assert Topology.from_config(config).devices_per_node == (4, 4)
    gpu = Topology.from_config(config, gpus_per_node=8)
    assert (gpu.device_kind, gpu.num_devices, gpu.node_groups) == ("cuda", 16, {"a10": (1,)})
    declared = Topology.from_config(ClusterConfig(num_nodes=2, num_gpus_per_node=8))  # a GPU recipe, checked anywhere
    assert (declared.device_kind, declared.devices_per_node) == ("cuda", (8, 8))


@pytest.mark.parametrize("section,message", [
    ({"num_nodes": 0}, "cluster.num_nodes must be >= 1, got 0"),
    ({"cpu_slots_per_node": 0}, "cluster.cpu_slots_per_node must be >= 1, got 0"),
    ({"num_cpus": 0}, "cluster.num_cpus must be >= 1, got 0"),
    ({"address": "auto", "num_cpus": 2},
     "cluster.num_cpus only sizes the embedded Ray; a cluster joined at cluster.address (auto) has its own CPU count"),
    ({"component_placment": {}}, "cluster.component_placment: unknown key; cluster takes address, "
                                 "component_placement, cpu_slots_per_node, max_restarts, node_groups, num_cpus, "
                                 "num_gpus_per_node, num_nodes; did you mean component_placement?"),
    ({"num_gpus_per_node": 0}, "cluster.num_gpus_per_node must be >= 1, got 0"),
    ({"num_nodes": 2, "node_groups": {"a10": {"nodes": "1-2"}}},
     "cluster.node_groups.a10.nodes: node 2 exceeds the 2 nodes of this cluster"),
    ({"node_groups": {"a10": {"node_ranks": "0"}}},
     "cluster.node_groups.a10: expected {nodes: <node ranks>}, got {'node_ranks': '0'}"),
    ({"node_groups": {"a10": {"nodes": "1-0"}}},
     "cluster.node_groups.a10.nodes: malformed node range '1-0': the start is after the end"),
])
def test_cluster_config_errors_name_the_key(section, message):
    with pytest.raises(PlacementError) as caught:
        ClusterConfig.from_dict(section)
    assert str(caught.value) == message


def test_cluster_config_from_omegaconf():
    from omegaconf import OmegaConf

    section = OmegaConf.create({"num_nodes": 1, "component_placement": {"actor,rollout,reward": "all"},
                                "cpu_slots_per_node": 4, "node_groups": {"cpu": {"nodes": "all"}}})
    config = ClusterConfig.from_dict(section)
    assert config.component_placement == {"actor,rollout,reward": "all"}
    assert config.node_groups["cpu"].nodes == (0,)
    assert config.address is None


def test_range_helpers():
    assert parse_ranges("all", path="x") is None
    assert [str(r) for r in parse_ranges("0, 2,4-5", path="x")] == ["0", "2", "4-5"]
    assert format_ids([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
