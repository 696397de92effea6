"""The asynchronous pipeline (``runner.pipeline: async``) through real worker groups on CPU.

2 rollout ranks with uneven shares roll out up to ``max_staleness`` steps ahead of a 2-rank actor; the weights
reach the engines while they generate. Every token records the policy version that sampled it, the step's metrics give
the staleness histogram, no trained token is more than ``max_staleness`` versions behind, every prompt is
trained once in the prompt stream's order; a killed rollout rank stops the run in one line, and the run resumes
from its checkpoint with the version counter where it was.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlinf_search.checkpoint import latest_checkpoint, load_pending_rollout
from rlinf_search.config import ConfigError, validate_cfg
from tests.test_stream_step import _kill_after_checkpoint_1, _minibatches
from tests.test_train_runner import ROOT, _batches, _config, _metrics, _run, server, synth  # noqa: F401 (fixtures)

BATCH, GROUP, MINIBATCHES = 5, 2, 5  # rollout shares 3 and 2; a mini-batch is one group


def _async_config(where: Path, synth, server, tiny_model_dir, **changes):  # noqa: F811
    cfg = _config(where, synth, server, tiny_model_dir, **{
        "runner.pipeline": "async", "data.rollout_batch_size": BATCH, "algorithm.group_size": GROUP,
        "algorithm.n_minibatches": MINIBATCHES, "runner.max_steps": 3, "runner.val_check_interval": 0,
        "runner.rollout_dump": 4, "agentloop.max_turns": 2, **changes})
    cfg.cluster.cpu_slots_per_node = 2  # actor, rollout and reward: 2 ranks each
    return cfg


def _stream_uids(data_dir: Path, steps: int) -> list[list[str]]:
    """The prompt uids of each step as a sync run takes them (same shuffle seed)."""
    from rlinf_search.data.prepare import load_records
    from rlinf_search.data.prompt_stream import PromptStream

    stream = PromptStream(load_records(data_dir / "train.prepared.jsonl"), BATCH, shuffle=True, seed=0)
    return [[r.uid for r in stream.next_batch()] for _ in range(steps)]


def test_async_defaults_and_refusals(tmp_path, synth, server, tiny_model_dir):  # noqa: F811
    run = validate_cfg(_async_config(tmp_path, synth, server, tiny_model_dir))
    settings = run.runner.pipeline
    assert (settings.name, settings.max_staleness, settings.partial_rollout) == ("async", 1, True)
    assert run.actor.loss.mismatch_correction == "tis", "the lag is corrected by default"
    off = validate_cfg(_async_config(tmp_path, synth, server, tiny_model_dir,
                                     **{"algorithm.mismatch_correction": None, "runner.max_staleness": 2}))
    assert off.actor.loss.mismatch_correction is None and off.runner.pipeline.max_staleness == 2
    for changes, message in [
        ({"runner.max_staleness": 0}, "runner.max_staleness must be >= 1"),
        ({"runner.pipeline": "sync", "runner.max_staleness": 2}, "only runner.pipeline async reads it"),
        ({"runner.pipeline": "stream", "runner.partial_rollout": False}, "only runner.pipeline async reads it"),
        ({"algorithm.recompute_logprobs": False, "algorithm.mismatch_correction": "mask"}, "the same numbers"),
        ({"algorithm.adv_type": "reinforce_plus_plus"}, "async computes advantages a mini-batch"),
        ({"algorithm.ppo_epochs": 2}, "ppo_epochs must be 1"),
        ({"agentloop.retokenize": True}, "re-tokenized ids have no behaviour log-prob"),
        ({"algorithm.max_token_lag": -1}, "algorithm.max_token_lag must be >= 0"),
    ]:
        with pytest.raises(ConfigError, match=message) as caught:
            validate_cfg(_async_config(tmp_path, synth, server, tiny_model_dir, **changes))
        assert "\n" not in str(caught.value)
    engine_logprobs = validate_cfg(_async_config(tmp_path, synth, server, tiny_model_dir,
                                                 **{"algorithm.recompute_logprobs": False}))
    assert engine_logprobs.actor.loss.mismatch_correction is None, "nothing to compare without recomputed log-probs"
    overlap = _config(tmp_path, synth, server, tiny_model_dir)
    overlap.cluster.cpu_slots_per_node = 3
    overlap.cluster.component_placement = {"actor": "0", "rollout": "1", "reward": "2"}
    settings = validate_cfg(overlap).runner.pipeline
    assert (settings.name, settings.max_staleness, settings.partial_rollout, settings.per_minibatch) == (
        "overlap", 1, False, False), "overlap is async at step granularity"


def test_async_trains_every_prompt_once_within_its_staleness_bound(tmp_path, synth, server, tiny_model_dir):  # noqa: F811
    # A reward the random model earns about half the time, so groups disagree and every update moves it.
    cfg = _async_config(tmp_path, synth, server, tiny_model_dir, **{"reward.score": "tests.registry_plugins.word_parity"})
    result = _run(cfg, tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["staleness/lag_0"] == 1.0, "step 1 trains what the starting weights sampled"
    for row in rows:
        assert row["actor/grad_norm"] > 0 and row["stream/minibatches"] == MINIBATCHES
        assert row["staleness/max_lag"] <= 1, "no token more than max_staleness versions behind"
        assert sum(v for k, v in row.items() if k.startswith("staleness/lag_")) == pytest.approx(1.0)
        assert 0 <= row["rollout/engine_idle"] <= 1 and "actor/is_weight_mean" in row
    # Step 2's batch was admitted while step 1 trained: sampled (at least partly) by version 0, trained at 1.
    assert rows[1]["staleness/lag_1"] > 0 and rows[1]["async/batches_ahead"] == 1
    assert rows[2]["async/batches_ahead"] == 0, "nothing is admitted past the run's last step"
    batches, minibatches = _batches(tmp_path / "run"), _minibatches(tmp_path / "run")
    assert [batches[step]["uids"] for step in (1, 2, 3)] == _stream_uids(synth, 3), \
        "each step trains its own batch of the prompt stream, in order"
    for step in (1, 2, 3):
        assert sorted(g for mb in minibatches[step] for g in mb) == list(range(BATCH)), f"step {step}: each group once"
    # The rollout files show the version of every model turn; step 3's are version 1 or 2.
    for step, allowed in ((1, {0}), (3, {1, 2})):
        lines = (tmp_path / "run" / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
        for row in map(json.loads, lines):
            versions = [span["version"] for span in row["response"] if span["kind"] == "model"]
            assert versions and set(versions) <= allowed, (step, versions)
            assert all(span["version"] is None for span in row["response"] if span["kind"] != "model")


# About a minute on 2 cores: the heavy lane.
@pytest.mark.heavy
def test_async_through_engine_servers_records_the_servers_versions(tmp_path, synth, server, tiny_model_dir):  # noqa: F811
    """The agent loops in an AgentLoop group, the engines as servers: each server's gate takes the weights while
    the agent-loop ranks keep sending turns, and stamps the version of every turn it served."""
    cfg = _async_config(tmp_path, synth, server, tiny_model_dir, **{"agentloop.num_workers": 2})
    result = _run(cfg, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["staleness/lag_0"] == 1.0 and rows[1]["staleness/max_lag"] == 1 and rows[1]["staleness/lag_1"] > 0
    assert all(0 <= r["rollout/engine_idle"] <= 1 for r in rows)
    batches = _batches(tmp_path / "run")
    assert [batches[step]["uids"] for step in (1, 2, 3)] == _stream_uids(synth, 3)
    lines = (tmp_path / "run" / "rollouts" / "step_3.jsonl").read_text().splitlines()
    versions = {span["version"] for row in map(json.loads, lines) for span in row["response"] if span["kind"] == "model"}
    assert versions and versions <= {1, 2}


# About three minutes on 2 cores (the run twice): the heavy lane.
@pytest.mark.heavy
def test_a_killed_rollout_rank_stops_an_async_run_and_it_resumes_with_its_versions(tmp_path, synth, server,  # noqa: F811
                                                                                     tiny_model_dir):
    """A rollout rank killed in step 2 of an async run: the run stops in one line that counts the groups lost in
    flight; the step-1 checkpoint kept step 2's batch (already rolled out, by version 0); the same command resumes
    from it, trains that batch once as step 2 (its versions as sampled), re-admits step 3, and the engines
    continue from version 1."""
    # cluster.max_restarts 0: the lost rank stops the run (tests/test_rank_restarts.py has it started again).
    cfg = _async_config(tmp_path, synth, server, tiny_model_dir, **{"runner.resume_dir": "auto",
                                                                     "runner.save_interval": 1,
                                                                     "cluster.max_restarts": 0})
    process, stderr = _kill_after_checkpoint_1(cfg, tmp_path, "ray::RolloutWorker", timeout=300)
    assert process.returncode != 0
    last = stderr.strip().splitlines()[-1]
    assert "RunStopped: RolloutGroup rank" in last and "in step 2" in last and "in flight" in last, last
    assert [r["step"] for r in _metrics(tmp_path / "run")] == [1], "step 2 never logged half-trained"
    kept = load_pending_rollout(latest_checkpoint(tmp_path / "run" / "checkpoints"))
    assert len(kept) == 1 and len(kept[0]) == BATCH * GROUP, "the checkpoint kept step 2's batch"
    assert {v for traj in kept[0] for v in traj.turn_versions} == {0}, "sampled by the starting weights"

    result = _run(cfg, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[1]["staleness/lag_1"] == 1.0, "step 2 trained the kept batch, its versions as sampled"
    batches = _batches(tmp_path / "run")
    assert [batches[step]["uids"] for step in (1, 2, 3)] == _stream_uids(synth, 3), \
        "nothing trained twice, nothing skipped"
    step_3 = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step_3.jsonl").read_text().splitlines()]
    versions = {span["version"] for row in step_3 for span in row["response"] if span["kind"] == "model"}
    assert versions <= {1, 2} and 1 in versions, "the resumed engines started from the checkpoint's version 1"
