"""Worker groups on a real local Ray: 8 CPU slots on this 2-core machine, every placement mode,
per-rank environment, a gloo process group, and failures that surface instead of hanging."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
import ray

from rlinf_search.scheduler import Cluster, ClusterConfig, Worker, WorkerError, validate_placement, wait_all

SLOTS = 8


class EnvWorker(Worker):
    """Reports what a rank sees; fails, sleeps or all-reduces on request."""

    def __init__(self, tag: str = ""):
        self.tag = tag

    def info(self) -> dict:
        env = {name: os.environ.get(name) for name in (
            "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "RLINF_CPU_SLOT", "RLINF_GROUP_NAME", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")}
        return {"env": env, "rank": self.rank, "world_size": self.world_size, "local_rank": self.local_rank,
                "group": self.group_name, "slot": self.device_slot, "device": self.device,
                "pid": os.getpid(), "tag": self.tag}

    def echo(self, value):
        return value

    async def echo_async(self, value):
        await asyncio.sleep(0.01)
        return (self.rank, value)

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    def allreduce_rank_plus_one(self) -> float:
        import torch
        import torch.distributed as dist

        value = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(value)
        return value.item()


class BrokenWorker(Worker):
    def __init__(self):
        raise RuntimeError("bad init argument")


@pytest.fixture(scope="module")
def cluster():
    config = ClusterConfig(cpu_slots_per_node=SLOTS, num_cpus=2,
                           component_placement={"actor,rollout": "all", "reward": "0-1"})
    with Cluster(config) as running:
        yield running


def launch(cluster, cfg, **groups):
    """Resolve ``cfg`` on the cluster's devices and launch one EnvWorker group per component."""
    placement = validate_placement(cfg, topology=cluster.topology)
    return placement, {name: EnvWorker.create_group(tag=name).launch(cluster, placement[name], **options)
                       for name, options in groups.items()}


def check_ranks(group, slots: list[int]) -> list[dict]:
    """Every rank has its RANK/WORLD_SIZE/LOCAL_RANK and the slot the placement gave it."""
    infos = group.call("info").wait(timeout=60)
    assert [i["slot"] for i in infos] == slots
    ports = {i["env"]["MASTER_PORT"] for i in infos}
    assert len(ports) == 1 and ports != {None}
    for rank, info in enumerate(infos):
        assert info["env"]["RANK"] == str(rank) and info["rank"] == rank
        assert info["env"]["WORLD_SIZE"] == str(len(slots)) and info["world_size"] == len(slots)
        assert info["env"]["LOCAL_RANK"] == str(rank) and info["local_rank"] == rank  # one node
        assert info["env"]["LOCAL_WORLD_SIZE"] == str(len(slots))
        assert info["env"]["RLINF_CPU_SLOT"] == str(slots[rank])
        assert info["env"]["MASTER_ADDR"] == "127.0.0.1"
        assert info["env"]["OMP_NUM_THREADS"] == "1"  # 2 cores / 8 slots, at least one thread
        assert info["env"]["CUDA_VISIBLE_DEVICES"] is None
        assert info["group"] == group.name and info["tag"] == group.name
        assert info["device"] == "cpu"
    return infos


def test_cluster_sees_cpu_slots_and_resolves_its_config(cluster):
    assert cluster.device_kind == "cpu" and cluster.num_devices == SLOTS
    assert cluster.placement.mode == "hybrid"
    assert cluster.placement["reward"].devices == (0, 1)
    assert len(cluster.nodes) == 1 and cluster.nodes[0].num_cpus == 2


def test_collocated_groups_share_every_slot(cluster):
    placement, groups = launch(cluster, {"actor,rollout": "0-3"}, actor={}, rollout={})
    try:
        assert placement.mode == "collocated"
        actor = check_ranks(groups["actor"], [0, 1, 2, 3])
        rollout = check_ranks(groups["rollout"], [0, 1, 2, 3])
        assert {i["pid"] for i in actor}.isdisjoint({i["pid"] for i in rollout})  # a process per rank
        assert actor[0]["env"]["MASTER_PORT"] != rollout[0]["env"]["MASTER_PORT"]
    finally:
        for group in groups.values():
            group.shutdown()


def test_disaggregated_groups_get_disjoint_slots_and_a_working_gloo_group(cluster):
    placement, groups = launch(cluster, {"rollout": "0-3", "actor": "4-7"},
                               rollout={}, actor={"init_process_group": True})
    try:
        assert placement.mode == "disaggregated"
        check_ranks(groups["rollout"], [0, 1, 2, 3])
        check_ranks(groups["actor"], [4, 5, 6, 7])
        assert groups["actor"].call("allreduce_rank_plus_one").wait(timeout=60) == [10.0] * 4
    finally:
        for group in groups.values():
            group.shutdown()


def test_hybrid_placement_keeps_the_written_device_order(cluster):
    placement, groups = launch(cluster, {"actor,rollout": "6,1", "reward": "1"}, actor={}, reward={})
    try:
        assert placement.mode == "hybrid"
        check_ranks(groups["actor"], [6, 1])
        check_ranks(groups["reward"], [1])
        assert groups["actor"].placement.devices == (6, 1)
    finally:
        for group in groups.values():
            group.shutdown()


def test_call_forms_and_await(cluster):
    group = EnvWorker.create_group().launch(cluster, "0-2", name="calls")
    try:
        assert group.call("echo", {"x": 1}).wait() == [{"x": 1}] * 3
        assert group.call_on(2, "echo", "two").wait() == "two"
        assert group.call_on([0, 2], "echo", value=5).wait() == [5, 5]
        big = b"x" * 300_000  # large args go to the object store once for all ranks
        assert group.call("echo", big).wait() == [big] * 3

        async def both():
            return await group.call("echo_async", "a"), await group.call_on(1, "echo_async", "b")

        assert asyncio.run(both()) == ([(0, "a"), (1, "a"), (2, "a")], (1, "b"))
        with pytest.raises(AttributeError, match="group 'calls': EnvWorker has no method 'nope'"):
            group.call("nope")
        # The method itself, as the runners call: its name goes to the ranks; another class's is refused.
        assert group.call(EnvWorker.echo, 7).wait() == [7] * 3
        assert group.call_on(1, EnvWorker.echo_async, "c").wait() == (1, "c")
        with pytest.raises(AttributeError, match="group 'calls' runs EnvWorker, which has no method BrokenWorker.__init__"):
            group.call(BrokenWorker.__init__)
        with pytest.raises(IndexError, match="group 'calls' has ranks 0-2, not 3"):
            group.call_on(3, "echo", 1)
    finally:
        group.shutdown()


@pytest.mark.timeout(120)
def test_a_raising_rank_names_group_rank_type_and_remote_traceback(cluster):
    group = EnvWorker.create_group().launch(cluster, "0-1", name="flaky")
    try:
        with pytest.raises(WorkerError) as caught:
            group.call_on([0, 1], "fail", "boom at step 7").wait(timeout=30)
        error = caught.value
        assert (error.group, error.method, error.cause_type) == ("flaky", "fail", "ValueError")
        assert str(error).startswith("fail() failed on rank ")
        assert f"rank {error.rank} of group 'flaky': ValueError: boom at step 7" in str(error)
        assert 'test_scheduler.py", line' in error.remote_traceback and "in fail" in error.remote_traceback
        assert "raise ValueError(message)" in str(error)

        async def awaited():
            await group.call_on(1, "fail", "async boom")

        with pytest.raises(WorkerError, match="fail\\(\\) failed on rank 1 of group 'flaky': ValueError: async boom"):
            asyncio.run(awaited())
        assert group.call("echo", "still alive").wait(timeout=30) == ["still alive"] * 2
    finally:
        group.shutdown()


@pytest.mark.timeout(120)
def test_a_killed_rank_fails_the_call_in_flight_and_the_next_one(cluster):
    group = EnvWorker.create_group().launch(cluster, "0-2", name="doomed")
    try:
        in_flight = group.call("sleep", 60)
        time.sleep(0.5)
        ray.kill(group.actors[1])
        started = time.monotonic()
        with pytest.raises(WorkerError) as caught:
            in_flight.wait(timeout=30)
        assert time.monotonic() - started < 10  # not the 60 s the other ranks still sleep
        assert (caught.value.rank, caught.value.cause_type) == (1, "ActorDiedError")
        assert str(caught.value).startswith("rank 1 of group 'doomed' died during sleep(): ActorDiedError")

        with pytest.raises(WorkerError, match="rank 1 of group 'doomed' died during echo\\(\\)"):
            group.call_on([0, 1], "echo", 1).wait(timeout=30)
    finally:
        group.shutdown()


def _call_once_restarted(method, *, timeout_s: float):
    """``method.remote()``'s value once its actor answers: while Ray is starting the actor again, a call fails
    at once with ``ActorUnavailableError`` (Ray's word for "retry later"), as callers of a restarting rank see."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(method.remote(), timeout=max(1.0, deadline - time.monotonic()))
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_rank_ray_restarts_answers_again_behind_the_same_handle(cluster):
    """``restarts_by_ray``: a rank whose process dies (SIGKILL, as the OOM killer would) fails the call in flight,
    then answers from a new process behind the handle callers already hold, its launch arguments and environment
    kept; once its restarts are spent, the next death is final."""
    group = EnvWorker.create_group(tag="tool").launch(cluster, "0", name="restartable", restarts_by_ray=1)
    try:
        handle = group.actors[0]
        first = group.call_on(0, "info").wait(timeout=30)
        in_flight = group.call_on(0, "sleep", 60)
        time.sleep(0.5)
        os.kill(first["pid"], signal.SIGKILL)
        with pytest.raises(WorkerError) as caught:
            in_flight.wait(timeout=30)
        assert caught.value.process_lost
        second = _call_once_restarted(handle.info, timeout_s=60)  # the handle held before the death
        assert second["pid"] != first["pid"]
        assert (second["tag"], second["env"]["RANK"], second["env"]["RLINF_GROUP_NAME"]) == ("tool", "0", "restartable")
        os.kill(second["pid"], signal.SIGKILL)
        with pytest.raises(WorkerError, match="died during echo"):
            group.call_on(0, "echo", 1).wait(timeout=30)
    finally:
        group.shutdown()


def test_a_timeout_names_the_unfinished_ranks(cluster):
    group = EnvWorker.create_group().launch(cluster, "0-1", name="slow")
    try:
        fast, slow = group.call_on(0, "sleep", 0), group.call_on(1, "sleep", 3)
        assert fast.wait(timeout=30) == 0
        with pytest.raises(TimeoutError, match=r"not finished within 0.5 s: sleep\(\) on group 'slow' rank 1$"):
            wait_all([fast, slow], timeout=0.5)
        assert wait_all([fast, slow], timeout=30) == [0, 1]  # a timed-out wait leaves the call running
    finally:
        group.shutdown()


def test_a_constructor_that_raises_fails_the_launch(cluster):
    with pytest.raises(WorkerError) as caught:
        BrokenWorker.create_group().launch(cluster, "0", name="broken", ready_timeout_s=60)
    assert str(caught.value).startswith("rank 0 of group 'broken' died during __init__()")
    assert "bad init argument" in str(caught.value)


def test_worker_outside_a_group_says_so():
    with pytest.raises(RuntimeError, match="RANK is not set: this Worker was not started by a WorkerGroup"):
        EnvWorker().rank


def test_an_embedded_cluster_starts_in_a_fresh_home(tmp_path):
    """CI and a user's first run have no ~/.ray/auth_token: the embedded cluster must start anyway."""
    script = ("from rlinf_search.scheduler import Cluster, ClusterConfig\n"
              "with Cluster(ClusterConfig(num_cpus=1)) as c:\n"
              "    print('nodes', len(c.nodes))\n")
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("RAY_AUTH_MODE", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "nodes 1" in done.stdout


def test_a_ray_joined_without_the_drivers_import_path_is_refused(tmp_path):
    """A Ray this process started itself, bare, would run workers that cannot import the driver's modules: the
    Cluster refuses it in one line. Started with ``driver_runtime_env()``, it is used, and a worker whose class
    lives only on the driver's path runs."""
    (tmp_path / "only_here.py").write_text(
        "from rlinf_search.scheduler import Worker\n"
        "class HereWorker(Worker):\n"
        "    def where(self):\n"
        "        return __file__\n")
    script = (
        "import sys, ray\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from rlinf_search.scheduler import Cluster, ClusterConfig\n"
        "from rlinf_search.scheduler.cluster import ClusterError, driver_runtime_env\n"
        "from only_here import HereWorker\n"
        "ray.init(num_cpus=1, include_dashboard=False)\n"
        "try:\n"
        "    Cluster(ClusterConfig(num_cpus=1))\n"
        "except ClusterError as exc:\n"
        "    print('refused:', exc)\n"
        "ray.shutdown()\n"
        "ray.init(num_cpus=1, include_dashboard=False, runtime_env=driver_runtime_env())\n"
        "with Cluster(ClusterConfig(num_cpus=1)) as cluster:\n"
        "    group = HereWorker.create_group().launch(cluster, '0', name='here')\n"
        "    print('worker imported', group.call_on(0, 'where').wait())\n"
        "    group.shutdown()\n"
        "ray.shutdown()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-3000:]
    refused = [line for line in done.stdout.splitlines() if line.startswith("refused:")]
    assert len(refused) == 1 and str(tmp_path) in refused[0] and "call ray.shutdown() first" in refused[0]
    assert f"worker imported {tmp_path / 'only_here.py'}" in done.stdout


def test_the_import_path_check_asks_only_for_the_drivers_own_folders(tmp_path):
    """The interpreter's folders (standard library, site-packages) are every worker's already; a runtime env that
    ships code itself (working_dir, py_modules) needs no path."""
    from rlinf_search.scheduler.cluster import _missing_paths

    needed = {"env_vars": {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.path.dirname(os.__file__)])}}
    assert _missing_paths(needed, {}) == [str(tmp_path)], "the standard library is never asked for"
    assert _missing_paths(needed, {"env_vars": {"PYTHONPATH": str(tmp_path)}}) == []
    assert _missing_paths(needed, {"working_dir": "/srv/job"}) == []
