"""A run across two Ray nodes: two raylets on this machine (Ray's own multi-node test cluster), each with its own
CPU slot. The actor trains on node 0, the rollout and reward run on node 1, and the weights cross between them
through the broadcast transport on the nodes' address. The same seeds sample the same tokens as the one-node run of
the same placement; node 1 lost mid-run stops the run in one line, and it resumes from its checkpoint once a node
is back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import ray.cluster_utils

from rlinf_search.config import validate_cfg
from tests.test_train_runner import ROOT, _batches, _command, _config, _metrics, _run, server, synth  # noqa: F401

PLACEMENT = {"actor": "0", "rollout,reward": "1"}


@pytest.fixture(scope="module")
def two_nodes():
    """A head node and one more, one CPU each; the runs join it with ``cluster.address``."""
    cluster = ray.cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


def _two_node_config(where, synth, server, tiny_model_dir, cluster, **changes):  # noqa: F811
    cfg = _config(where, synth, server, tiny_model_dir, **changes)
    cfg.cluster.address = cluster.address
    cfg.cluster.num_nodes = 2
    cfg.cluster.cpu_slots_per_node = 1  # device 0 is node 0's slot, device 1 node 1's
    cfg.cluster.component_placement = PLACEMENT
    return cfg


# About five minutes on 2 cores (three runs of three steps, one cut short): the heavy lane.
@pytest.mark.heavy
def test_a_run_across_two_nodes_samples_what_one_node_samples_and_resumes_after_losing_one(
        tmp_path, synth, server, tiny_model_dir, two_nodes):  # noqa: F811
    # The reference: the same placement on one node of two slots, in an embedded Ray of its own (another Ray, the
    # two-node cluster, runs on this machine meanwhile).
    one = _config(tmp_path / "one", synth, server, tiny_model_dir)
    one.cluster.cpu_slots_per_node = 2
    one.cluster.component_placement = PLACEMENT
    result = _run(one, tmp_path / "one")
    assert result.returncode == 0, result.stderr[-3000:]

    two = _two_node_config(tmp_path / "two", synth, server, tiny_model_dir, two_nodes)
    run = validate_cfg(two)
    assert run.placement["actor"].node_ranks == (0,) and run.placement["rollout"].node_ranks == (1,)
    result = _run(two, tmp_path / "two")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Connecting to existing Ray cluster at address: {two_nodes.address}" in result.stderr
    assert [r["step"] for r in _metrics(tmp_path / "two" / "run")] == [1, 2, 3]
    reference, across = _batches(tmp_path / "one" / "run"), _batches(tmp_path / "two" / "run")
    for step in (1, 2, 3):
        assert across[step]["uids"] == reference[step]["uids"], f"step {step} trains on the same prompts"
        assert across[step]["responses"] == reference[step]["responses"], \
            f"step {step} samples the same tokens on two nodes as on one (the weights crossed intact)"

    # Node 1 lost after the step-1 checkpoint: the run stops, naming what was lost, in one line.
    cut = _two_node_config(tmp_path / "cut", synth, server, tiny_model_dir, two_nodes,
                           **{"runner.resume_dir": "auto"})
    process = subprocess.Popen(_command(cut, tmp_path / "cut"), cwd=ROOT, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    mark = tmp_path / "cut" / "run" / "checkpoints" / "global_step_1" / "COMPLETE"
    deadline = time.monotonic() + 600
    while not mark.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mark.exists(), "the run should reach its step-1 checkpoint"
    [lost] = list(two_nodes.worker_nodes)
    two_nodes.remove_node(lost)  # its raylet and every worker on it, as a machine going down
    try:
        _, stderr = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError("the run did not stop after losing a node") from None
    assert process.returncode != 0
    last = stderr.strip().splitlines()[-1]
    assert "RunStopped: " in last and "was lost during" in last and "runner.resume_dir=auto" in last, last
    kept = [r["step"] for r in _metrics(tmp_path / "cut" / "run")]
    assert kept[0] == 1 and kept == list(range(1, len(kept) + 1)) and len(kept) < 3

    two_nodes.add_node(num_cpus=1)  # a machine back in its place
    two_nodes.wait_for_nodes()
    result = _run(cut, tmp_path / "cut")  # the same command: resume_dir auto picks the newest checkpoint
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["step"] for r in _metrics(tmp_path / "cut" / "run")] == [1, 2, 3], "nothing repeated, nothing lost"
    resumed = _batches(tmp_path / "cut" / "run")
    for step in (2, 3):
        assert resumed[step]["responses"] == reference[step]["responses"], f"step {step} after the resume"


def test_an_embedded_cluster_is_its_own_while_another_ray_runs_here(two_nodes):
    """With the two-node Ray up on this machine, a config without ``cluster.address`` starts a Ray of its own
    (before, ray.init found the running one, joined it and refused ``num_cpus``)."""
    script = ("from rlinf_search.scheduler import Cluster, ClusterConfig\n"
              "with Cluster(ClusterConfig(num_cpus=1)) as c:\n"
              "    print('nodes', len(c.nodes), c.embedded)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "nodes 1 True" in done.stdout
