"""``Cluster``: the Ray cluster a run uses, its nodes and devices, and the resolved placement.

``Cluster(ClusterConfig())`` starts an embedded Ray on this machine; with ``cluster.address`` it joins
a running one, so a laptop and a multi-node GPU cluster run the same code.

Devices are scheduler bookkeeping, not Ray resources. Every rank asks Ray for no CPU and no GPU and is
pinned to its node with a node-affinity strategy; the placement (checked before anything starts)
decides its device, and the rank's environment makes that device the one it sees. Ray's counters
cannot say "actor and rollout time-share GPU 3" (an integer GPU request would refuse the second
group, and a request never names a GPU), and ``num_cpus=0`` lets 8 CPU slots live on a 2-core laptop.
"""

from __future__ import annotations

import logging
import os
import site
import socket
import sys
import sysconfig
from dataclasses import dataclass

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlinf_search.scheduler.config import ClusterConfig
from rlinf_search.scheduler.placement import ComponentPlacement, Placement, Topology, validate_placement

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


class ClusterError(RuntimeError):
    """The Ray cluster does not match the config (too few nodes, or Ray could not start)."""


@dataclass(frozen=True)
class NodeInfo:
    """One node of the cluster, in node-rank order."""

    node_id: str
    """Ray's node id (hex)."""
    ip: str
    """Address other nodes reach it at; ``MASTER_ADDR`` of groups whose rank 0 runs here."""
    num_cpus: int
    """CPU cores Ray sees on the node."""
    num_gpus: int
    """GPUs Ray sees on the node."""


class Cluster:
    """The nodes and devices of a run; usable as a context manager (``shutdown`` on exit)."""

    def __init__(self, config: ClusterConfig):
        self.config = config
        self._connected = False  # this Cluster called ray.init, so it calls ray.shutdown
        self._embedded = False  # ... and that started Ray here, rather than joining a cluster
        self._connect()
        try:
            self.nodes = _select_nodes(config.num_nodes, address=config.address)
            self.topology = self._topology()
            # Checked now, with the devices Ray found, so a bad placement fails before any worker.
            self.placement: Placement = validate_placement(config.component_placement, topology=self.topology)
        except BaseException:
            self.shutdown()
            raise
        log.info("cluster: %d node(s), %d %s device(s), placement mode %s", len(self.nodes),
                 self.topology.num_devices, self.topology.device_kind, self.placement.mode)

    @property
    def embedded(self) -> bool:
        """True when this process started Ray (one node, reachable on loopback)."""
        return self._embedded

    @property
    def device_kind(self) -> str:
        return self.topology.device_kind

    @property
    def num_devices(self) -> int:
        return self.topology.num_devices

    def resolve(self, devices: str, *, name: str) -> ComponentPlacement:
        """An ad-hoc placement (``"0-1"``) outside ``component_placement``, checked like one."""
        return validate_placement({name: devices}, topology=self.topology)[name]

    def node_strategy(self, node_rank: int) -> NodeAffinitySchedulingStrategy:
        """Pins an actor or task to a node (hard: a dead node is an error, not a silent move)."""
        return NodeAffinitySchedulingStrategy(self.nodes[node_rank].node_id, soft=False)

    def node_alive(self, node_rank: int) -> bool:
        """Whether Ray still counts the node among the living (a machine gone is not, after its heartbeats stop)."""
        node_id = self.nodes[node_rank].node_id
        return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())

    def node_address(self, node_rank: int) -> str:
        return LOOPBACK if self.embedded else self.nodes[node_rank].ip

    def free_port(self, node_rank: int) -> int:
        """A TCP port free right now on that node (for a process-group rendezvous)."""
        if self.nodes[node_rank].node_id == ray.get_runtime_context().get_node_id():
            return _free_port(LOOPBACK if self.embedded else "")
        probe = ray.remote(num_cpus=0)(_free_port)
        return ray.get(probe.options(scheduling_strategy=self.node_strategy(node_rank)).remote(""))

    def device_env(self, node_rank: int, device: int) -> dict[str, str]:
        """Environment that makes ``device`` the one a rank sees."""
        if self.device_kind == "cuda":
            # Ray would otherwise rewrite CUDA_VISIBLE_DEVICES for an actor that asked for no GPU.
            return {"CUDA_VISIBLE_DEVICES": str(device), "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}
        # Each slot gets its share of the node's cores; torch would otherwise start one thread per
        # core in every rank, and 8 ranks on 2 cores spend their time switching.
        threads = max(1, self.nodes[node_rank].num_cpus // self.topology.devices_per_node[node_rank])
        return {"RLINF_CPU_SLOT": str(device), "OMP_NUM_THREADS": str(threads)}

    def shutdown(self) -> None:
        """Disconnect from Ray: an embedded Ray stops; a joined cluster keeps running. Either way the
        workers and channels this process started end with it."""
        if self._connected and ray.is_initialized():
            ray.shutdown()
        self._connected = False

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def _connect(self) -> None:
        runtime_env = driver_runtime_env()
        if ray.is_initialized():
            # A Ray this process joined before (a notebook's ray.init, a test's fixture) is used only if its
            # workers can import what the driver can: without the path, they fail later, one group at a time,
            # on a module they cannot find.
            missing = _missing_paths(runtime_env, ray.get_runtime_context().runtime_env)
            if missing:
                raise ClusterError(
                    f"this process is already connected to a Ray whose runtime env lacks the driver's import "
                    f"path ({os.pathsep.join(missing)}), so its workers could not import this run's modules: "
                    f"call ray.shutdown() first and let Cluster connect, or pass "
                    f"runtime_env=rlinf_search.scheduler.cluster.driver_runtime_env() to ray.init")
            log.info("cluster: using the Ray this process is already connected to (it stays connected)")
            return
        if self.config.address is None:
            if os.environ.get("RAY_ADDRESS"):
                log.warning("cluster: RAY_ADDRESS=%s is set but cluster.address is null, so this run starts a Ray "
                            "of its own; set cluster.address to join that one", os.environ["RAY_ADDRESS"])
            # Leave RAY_AUTH_MODE alone: unset, ray.init writes ~/.ray/auth_token on a new machine and
            # turns token auth on (with one warning). Set here, after Ray read its config at import, the
            # driver skips writing the token, the GCS server it spawns finds none and dies, and ray.init
            # times out (tests/test_scheduler.py starts a cluster in a fresh HOME to hold this).
            # address "local": a Ray of its own, even where another runs on this machine (``ray start``, a test's
            # cluster); without it ray.init joins that one, and then refuses num_cpus or runs on its nodes.
            ray.init(address="local", num_cpus=self.config.num_cpus or os.cpu_count(), include_dashboard=False,
                     _node_ip_address=LOOPBACK, log_to_driver=True, runtime_env=runtime_env)
            self._embedded = True
        else:
            ray.init(address=self.config.address, log_to_driver=True, runtime_env=runtime_env)
        self._connected = True

    def _topology(self) -> Topology:
        gpus = [node.num_gpus for node in self.nodes]
        declared = self.config.num_gpus_per_node
        if declared is not None:
            short = [rank for rank, count in enumerate(gpus) if count < declared]
            if short:
                raise ClusterError(f"cluster.num_gpus_per_node is {declared} but node {short[0]} has "
                                   f"{gpus[short[0]]} GPU(s)")
            gpus = [declared] * len(gpus)  # a node with more GPUs lends the first `declared` of them
        kind = "cuda" if any(gpus) else "cpu"
        per_node = gpus if kind == "cuda" else [self.config.cpu_slots_per_node] * len(self.nodes)
        return Topology(device_kind=kind, devices_per_node=tuple(per_node),
                        node_groups={label: g.nodes for label, g in self.config.node_groups.items()})


def driver_runtime_env() -> dict:
    """The runtime env every worker of a run needs: the driver's import path and a quiet Hugging Face."""
    # Workers unpickle worker classes by module name, so they need the driver's import path (Ray adds only the
    # script's folder): pytest's rootdir, a notebook's sys.path.insert. On other nodes the same paths must hold the
    # code (a shared file system or the same image). Not JobConfig.code_search_path: it makes Ray import every
    # function from files, and classes defined in a script's __main__ then never load.
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    # A worker's output reaches the driver's log line by line, never a terminal: Hugging Face's
    # "Loading weights" / "Writing model shards" bars would be a wall of redraws per worker.
    quiet = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(paths), "HF_HUB_DISABLE_PROGRESS_BARS": quiet}}


def _missing_paths(needed: dict, joined: dict | None) -> list[str]:
    """The driver's own import paths (not the interpreter's: its standard library and site-packages, which every
    worker has) absent from the ``PYTHONPATH`` of the runtime env a Ray was joined with. None are missing when
    that env ships code itself (``working_dir``, ``py_modules``)."""
    joined = dict(joined or {})
    if joined.get("working_dir") or joined.get("py_modules"):
        return []
    have = set((joined.get("env_vars") or {}).get("PYTHONPATH", "").split(os.pathsep))
    libraries = [sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    interpreter = {os.path.realpath(p) for p in (*libraries, *site.getsitepackages(), site.getusersitepackages()) if p}
    return [path for path in needed["env_vars"]["PYTHONPATH"].split(os.pathsep)
            if path not in have and not _inside(os.path.realpath(path), interpreter)]


def _inside(path: str, roots: set[str]) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in roots)


def _select_nodes(num_nodes: int, *, address: str | None) -> list[NodeInfo]:
    """The first ``num_nodes`` alive nodes: the Ray head first, then by IP (stable across runs)."""
    alive = [n for n in ray.nodes() if n["Alive"]]
    alive.sort(key=lambda n: ("node:__internal_head__" not in n["Resources"], n["NodeManagerAddress"],
                              n["NodeID"]))
    if len(alive) < num_nodes:
        where = f"at {address}" if address else "started here"
        raise ClusterError(f"cluster.num_nodes is {num_nodes} but the Ray cluster {where} has "
                           f"{len(alive)} alive node(s); start the others with `ray start --address=...`")
    return [NodeInfo(node_id=n["NodeID"], ip=n["NodeManagerAddress"], num_cpus=int(n["Resources"].get("CPU", 0)),
                     num_gpus=int(n["Resources"].get("GPU", 0))) for n in alive[:num_nodes]]


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
