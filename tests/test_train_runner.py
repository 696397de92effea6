"""A real training run through Ray worker groups on CPU: a tiny Qwen2, a real retrieval server, GRPO.

Collocated and disaggregated placements, an InferenceGroup on a CPU slot of its own; a killed run
resumes with the same data order, optimizer state and sampled tokens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rlinf_search.checkpoint import latest_checkpoint, load_checkpoint
from rlinf_search.config import validate_cfg
from rlinf_search.data.batch import collate_trajectories
from rlinf_search.data.prepare import load_records
from rlinf_search.retrieval.build_index import main as build_index_main
from rlinf_search.retrieval.launch import RetrievalServerProcess
from rlinf_search.runners.train_main import launch_groups
from rlinf_search.runners.train_runner import SearchR1Runner
from rlinf_search.scheduler import Cluster
from tests.conftest import adam_steps
from toolkits.synth_task import SynthSpec, write_task

ROOT = Path(__file__).resolve().parents[1]
# Four CPU slots on a 2-core machine: a slot is a scheduling unit, not a core (docs/runtime.md).
PIPELINED = {"actor": "0", "rollout": "1", "reward": "2", "inference": "3"}


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    paths = write_task(out, SynthSpec(people=80, seed=3))
    for split in ("train", "val"):
        done = subprocess.run([sys.executable, "-m", "rlinf_search.data.prepare", "--input", str(paths[split]),
                               "--format", "flashrag", "--data-source", "synth", "--out",
                               str(out / f"{split}.prepared.jsonl")], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    assert build_index_main(["--corpus", str(paths["corpus"]), "--out", str(out / "index"), "--retriever", "bm25"]) == 0
    return out


@pytest.fixture(scope="module")
def server(synth):
    args = ["--index-dir", str(synth / "index"), "--corpus", str(synth / "corpus.jsonl"), "--retriever", "bm25"]
    with RetrievalServerProcess(args) as running:
        yield running


def _config(tmp_path, synth, server, tiny_model_dir, **changes):
    cfg = OmegaConf.load(ROOT / "examples/searchr1/config/tiny-cpu.yaml")
    del cfg["hydra"]
    cfg.runner.output_dir = str(tmp_path / "run")
    cfg.runner.max_steps = 3
    cfg.runner.save_interval = 1
    cfg.runner.val_check_interval = 3
    cfg.runner.logger.logger_backends = ["jsonl"]
    cfg.rollout.model.model_path = str(tiny_model_dir)
    cfg.data.train_data_paths = [str(synth / "train.prepared.jsonl")]
    cfg.data.val_data_paths = [str(synth / "val.prepared.jsonl")]
    cfg.data.rollout_batch_size = 4
    cfg.algorithm.group_size = 2
    cfg.algorithm.sampling_params.max_new_tokens = 24
    cfg.tools.search.server_addr = server.address
    for dotted, value in changes.items():
        OmegaConf.update(cfg, dotted, value)
    return cfg


_TRAIN = ("import sys; from omegaconf import OmegaConf; from rlinf_search.config import validate_cfg; "
          "from rlinf_search.runners.train_main import train; train(validate_cfg(OmegaConf.load(sys.argv[1])))")


def _command(cfg, tmp_path) -> list[str]:
    """Train in a child process, as a user would, so that a kill is a real kill."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "config.yaml"
    OmegaConf.save(cfg, path)
    return [sys.executable, "-c", _TRAIN, str(path)]


def _run(cfg, tmp_path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(_command(cfg, tmp_path), capture_output=True, text=True, timeout=900, cwd=ROOT,
                          env=None if env is None else {**os.environ, **env})


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("placement", [{"actor,rollout,reward": "all"}, {"actor": "0", "rollout": "1", "reward": "2"}],
                         ids=["collocated", "disaggregated"])
def test_three_steps_through_worker_groups(tmp_path, synth, server, tiny_model_dir, placement):
    # The GPU recipe's precision, and a token budget that cuts the ranks' shares into different numbers
    # of micro-batches (the case that hung before every rank ran the same number of passes).
    cfg = _config(tmp_path, synth, server, tiny_model_dir, **{"actor.model.precision": "bf16",
                                                               "runner.max_tokens_per_mbs": 200})
    grouped_search = len(placement) > 1  # the disaggregated run searches through a SearchTool group
    cfg.tools.search.num_workers = 1 if grouped_search else 0
    cfg.cluster.cpu_slots_per_node = 3
    cfg.cluster.component_placement = placement
    assert validate_cfg(cfg).placement.mode == ("collocated" if len(placement) == 1 else "disaggregated")
    result = _run(cfg, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("reward/mean", "reward/em", "rollout/searches_per_trajectory", "actor/grad_norm", "actor/kl",
                "actor/clip_fraction", "rollout/drift_rate", "time/rollout_s", "time/inference_s", "time/training_s",
                "time/weight_sync_s", "throughput/tokens_per_s"):
        assert key in rows[-1], key
    assert "val/em" in rows[-1] and "val/em/synth" in rows[-1] and "val/searches/synth" in rows[-1]
    if len(placement) > 1:  # overlap: from step 2 on, every token was sampled one version behind, and corrected
        assert [r["staleness/mean_lag"] for r in rows] == [0.0, 1.0, 1.0] and "actor/is_weight_mean" in rows[-1]
    else:
        assert all(r["staleness/lag_0"] == 1.0 for r in rows)
    if grouped_search:  # every training search went through the group (validation comes after the step's line)
        searches = sum(round(r["rollout/searches_per_trajectory"] * r["rollout/trajectories"]) for r in rows)
        assert rows[-1]["search/calls"] == searches
        assert rows[-1]["search/requests"] <= searches
    else:
        assert "search/calls" not in rows[-1]
    assert latest_checkpoint(tmp_path / "run" / "checkpoints").name == "global_step_3"
    # The run's records: its settings, and sample trajectories of every step and validation.
    saved = OmegaConf.load(tmp_path / "run" / "config.yaml")
    assert saved.runner.max_steps == 3 and saved.runner.logger.log_path == str(tmp_path / "run" / "logs")
    assert validate_cfg(saved).runner == validate_cfg(cfg).runner, "config.yaml re-validates to the same run"
    dumps = sorted(p.name for p in (tmp_path / "run" / "rollouts").iterdir())
    assert dumps == ["step_1.jsonl", "step_2.jsonl", "step_3.jsonl", "val_step_3.jsonl"]
    step = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step_2.jsonl").read_text().splitlines()]
    assert len(step) == 4 and len({row["uid"] for row in step}) == 4, "spread over the step's prompts"
    for row in step:
        assert row["response"][0]["kind"] == "model" and {"reward", "em", "finish_reason", "queries"} <= row.keys()
        assert all(span["kind"] in ("model", "information", "correction") for span in row["response"])
    val_rows = (tmp_path / "run" / "rollouts" / "val_step_3.jsonl").read_text().splitlines()
    assert len(val_rows) == len(load_records(synth / "val.prepared.jsonl"))


# Heavy: 45 s on 2 cores; the default lane must stay under 15 minutes (CI runs every lane).
@pytest.mark.heavy
def test_inference_group_on_its_own_slot_scores_like_the_actor(tmp_path, synth, server, tiny_model_dir):
    """Three pipelined steps with old and reference log-probs on the InferenceGroup's slot; then its
    policy copy (synced after every update) must score a fresh rollout as the actor itself does."""
    cfg = _config(tmp_path, synth, server, tiny_model_dir, **{"algorithm.logprob_forward_micro_batch_size": 3})
    cfg.cluster.cpu_slots_per_node = 4
    cfg.cluster.component_placement = PIPELINED
    config = validate_cfg(cfg)
    assert config.placement.mode == "disaggregated" and config.inference.separate
    with Cluster(config.cluster) as cluster:
        groups = launch_groups(config, cluster, None)
        assert groups.inference is not None and groups.inference.placement.devices == (3,)
        runner = SearchR1Runner(config, groups)
        runner.fit()  # ends with the last update synced to the engine and the InferenceGroup
        rows = _metrics(tmp_path / "run")
        assert [r["step"] for r in rows] == [1, 2, 3] and all(r["time/inference_s"] > 0 for r in rows)

        records = load_records(config.val_data_paths[0])[:4]
        trajectories = groups.rollout.call_on(0, "rollout", records, 2).wait()
        batch = collate_trajectories(trajectories, [0.0] * len(trajectories), pad_id=0)
        ours = groups.inference.call_on(0, "compute_logprobs", batch, old=True, ref=True).wait()
        actors = groups.actor.call_on(0, "compute_logprobs", batch, old=True, ref=True).wait()
        runner.weight_sync.close()
    mask = batch.response_mask.bool()
    torch.testing.assert_close(ours.old[mask], actors.old[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.ref[mask], actors.ref[mask], atol=1e-5, rtol=0)
    assert (ours.old[mask] - ours.ref[mask]).abs().max() > 1e-3, "three updates moved the policy off the reference"


# Heavy: 45 s on 2 cores; the default lane must stay under 15 minutes (CI runs every lane).
@pytest.mark.heavy
def test_user_code_named_by_dotted_path_trains(tmp_path, synth, server, tiny_model_dir):
    """An advantage estimator, a reward and a KL estimator from a user's module, named in the config."""
    from tests.registry_plugins import KL_CONSTANT, REWARD_BONUS

    cfg = _config(tmp_path, synth, server, tiny_model_dir, **{
        "runner.max_steps": 2, "runner.val_check_interval": 0,
        "algorithm.adv_type": "tests.registry_plugins.always_plus_one",
        "algorithm.kl_penalty_type": "tests.registry_plugins.constant_kl",
        "reward.score": "tests.registry_plugins.em_plus_quarter"})
    # Ray workers import the plugin module as the driver does: from the repository root.
    result = _run(cfg, tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["reward/mean"] >= REWARD_BONUS - 1e-6, "every reward carries the plugin's bonus"
        assert row["reward/mean"] == pytest.approx(row["reward/em"] + REWARD_BONUS, abs=1e-6)
        assert row["actor/kl"] == pytest.approx(KL_CONSTANT), "the plugin's KL estimate, on every token"
    # GRPO's advantages average to zero; the plugin's are +1 on every token, so the loss is -ratio:
    # -1 on the first update, held within the clip range after it.
    assert -1.3 < rows[0]["actor/pg_loss"] < -0.7, rows[0]["actor/pg_loss"]


def _batches(run_dir: Path) -> dict[int, dict]:
    """Each step's row of batches.jsonl (prompt uids and response digests); a resumed step's row
    replaces the one its killed run wrote."""
    rows = [json.loads(line) for line in (run_dir / "logs" / "batches.jsonl").read_text().splitlines()]
    return {row["step"]: row for row in rows}


# Two to three minutes each on 2 cores: CI runs them in the heavy lane (scripts/test.sh --all).
@pytest.mark.heavy
@pytest.mark.parametrize("placement, killed_after", [(None, 2), (PIPELINED, 1)], ids=["collocated", "pipelined"])
def test_killed_run_resumes_exactly(tmp_path, synth, server, tiny_model_dir, placement, killed_after):
    """Killed after a checkpoint, the resumed run repeats nothing, loses nothing, and samples the very
    tokens the uninterrupted run sampled. Pipelined, the kill comes after step 1, so step 2 trains on
    the rollout the checkpoint kept and step 3's is generated after the resume."""
    def config(where, **changes):
        cfg = _config(where, synth, server, tiny_model_dir, **changes)
        if placement:
            cfg.cluster.cpu_slots_per_node = 4
            cfg.cluster.component_placement = placement  # replaced, not merged into the default
        return cfg

    full = config(tmp_path / "full")
    assert _run(full, tmp_path / "full").returncode == 0

    cut = config(tmp_path / "cut", **{"runner.resume_dir": "auto"})
    process = subprocess.Popen(_command(cut, tmp_path / "cut"), cwd=ROOT, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    mark = tmp_path / "cut" / "run" / "checkpoints" / f"global_step_{killed_after}" / "COMPLETE"
    deadline = time.monotonic() + 600
    while not mark.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)  # the driver and everything it started, mid next step
    process.wait()
    assert mark.exists(), f"the run should have been killed after its step-{killed_after} checkpoint"
    assert [r["step"] for r in _metrics(tmp_path / "cut" / "run")] == list(range(1, killed_after + 1))

    result = _run(cut, tmp_path / "cut")  # same command: resume_dir auto picks the newest checkpoint
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["step"] for r in _metrics(tmp_path / "cut" / "run")] == [1, 2, 3], "nothing repeated, nothing lost"
    full_batches, cut_batches = _batches(tmp_path / "full" / "run"), _batches(tmp_path / "cut" / "run")
    for step in range(killed_after + 1, 4):
        assert cut_batches[step]["uids"] == full_batches[step]["uids"], f"step {step} trains on the same prompts"
        assert cut_batches[step]["responses"] == full_batches[step]["responses"], \
            f"step {step} samples the same response ids as the uninterrupted run"
    state, training = load_checkpoint(latest_checkpoint(tmp_path / "cut" / "run" / "checkpoints"))
    reference_state, reference_training = load_checkpoint(latest_checkpoint(tmp_path / "full" / "run" / "checkpoints"))
    assert (state.global_step, state.epoch, state.batch_in_epoch) == (
        reference_state.global_step, reference_state.epoch, reference_state.batch_in_epoch)
    assert state.rollout_rng == reference_state.rollout_rng
    assert training.global_step == reference_training.global_step
    assert adam_steps(latest_checkpoint(tmp_path / "cut" / "run" / "checkpoints"), tmp_path / "cut.pt") == \
        adam_steps(latest_checkpoint(tmp_path / "full" / "run" / "checkpoints"), tmp_path / "full.pt")


# Heavy: about 45 s on 2 cores; the default lane must stay under 15 minutes (CI runs every lane).
@pytest.mark.heavy
def test_an_engine_named_by_dotted_path_is_placed_synced_and_trained(tmp_path, synth, server, tiny_model_dir):
    """``examples/plugins/gpu_offload_engine.py`` (an engine that cannot offload on CPU) on a CPU slot of its own:
    the placement takes it by its traits, and the weight sync reaches it, so the last step's batch was sampled by
    the policy of an earlier update."""
    cfg = _config(tmp_path, synth, server, tiny_model_dir, **{
        "runner.val_check_interval": 0, "rollout.rollout_backend": "examples.plugins.gpu_offload_engine:build"})
    cfg.cluster.cpu_slots_per_node = 3
    cfg.cluster.component_placement = {"actor": "0", "rollout": "1", "reward": "2"}
    result = _run(cfg, tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["staleness/mean_lag"] for r in rows] == [0.0, 1.0, 1.0], "overlap: one version behind from step 2"
    last = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step_3.jsonl").read_text().splitlines()]
    versions = {span["version"] for row in last for span in row["response"] if span["kind"] == "model"}
    assert versions == {1}, "step 3 was sampled on the weights step 1's update synced into the engine"
