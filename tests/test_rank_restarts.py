"""Rollout ranks that come back: a real Ray run (2 rollout ranks, 2 FSDP actor ranks, the ``sync`` pipeline) whose
rollout rank 1 kills its own process in the middle of a step. The rank is started again with the current weights,
its share of the step rolls out again, and the step trains its full batch; a rank that keeps dying stops the run in
one line once ``cluster.max_restarts`` is spent."""

from __future__ import annotations

import json
import os
import subprocess
import threading

import pytest

from tests.test_infra_run import SearchThenAnswer, _main, _watch_steps
from tests.test_train_runner import ROOT, _config, _metrics, server, synth  # noqa: F401 - fixtures

KILL_FILE_ENV = "RLINF_TEST_KILL_FILE"


class DiesOnSignal(SearchThenAnswer):
    """Rank 1's engine ends its own process (``os._exit``, as a crash would) once the kill file exists: at its next
    turn, or with ``RLINF_TEST_KILL_AT=load`` as its next weight load begins (before it takes a bucket, so the
    sender is left waiting on it). ``RLINF_TEST_KILL_ONCE`` removes the file first, so the restarted rank lives."""

    async def generate(self, prompt_ids, sampling):
        if os.environ.get("RLINF_TEST_KILL_AT", "turn") == "turn":
            _die_if_told()
        return await super().generate(prompt_ids, sampling)

    def update_weights(self, weights) -> None:
        if os.environ.get("RLINF_TEST_KILL_AT") == "load":
            _die_if_told()
        super().update_weights(weights)


def _die_if_told() -> None:
    kill = os.environ.get(KILL_FILE_ENV)
    if kill and os.environ.get("RANK") == "1" and os.path.exists(kill):
        if os.environ.get("RLINF_TEST_KILL_ONCE"):
            os.remove(kill)
        os._exit(1)


def dying_engine(config, *, device=None, seed=0):
    """``rollout.rollout_backend: tests.test_rank_restarts:dying_engine``."""
    from transformers import AutoTokenizer

    return DiesOnSignal(AutoTokenizer.from_pretrained(config.model_path),
                        ["<search> a person </search>", "<answer> a city </answer>"], delay_s=0.05)


PIPELINES = {
    "sync": {},
    # Groups streamed to the actor a mini-batch at a time: the lost rank's groups that never arrived roll out again.
    "stream": {"runner.pipeline": "stream", "algorithm.recompute_logprobs": False, "algorithm.n_minibatches": 2},
    # Batches roll out a step ahead while the update trains: what was in flight on the lost rank, of this step and
    # of the batch ahead, rolls out again, and the weight load the rank never finished goes out again.
    "async": {"runner.pipeline": "async", "algorithm.n_minibatches": 2, "runner.max_staleness": 1},
}


@pytest.mark.heavy  # 4-step runs with 2 FSDP ranks: about a minute each on 2 cores
@pytest.mark.parametrize("pipeline, once, kill_at", [
    ("sync", True, "turn"), ("sync", False, "turn"), ("stream", True, "turn"), ("async", True, "turn"),
    ("async", True, "load")],
    ids=["sync-killed-once", "sync-keeps-dying", "stream-killed-once", "async-killed-once", "async-killed-loading"])
def test_a_lost_rollout_rank_is_started_again_and_the_step_trains_its_full_batch(tmp_path, synth, server,  # noqa: F811
                                                                                   tiny_model_dir, pipeline, once,
                                                                                   kill_at):
    kill_file = tmp_path / "kill"
    cfg = _config(tmp_path, synth, server, tiny_model_dir, **{
        "runner.max_steps": 4, "runner.val_check_interval": 0, "runner.save_interval": 1,
        "rollout.rollout_backend": "tests.test_rank_restarts:dying_engine",
        "cluster.cpu_slots_per_node": 2, "cluster.max_restarts": 1, **PIPELINES[pipeline]})
    cfg.cluster.component_placement = {"actor,rollout,reward": "all"}
    env = {**os.environ, "PYTHONPATH": str(ROOT), KILL_FILE_ENV: str(kill_file), "RLINF_TEST_KILL_AT": kill_at,
           **({"RLINF_TEST_KILL_ONCE": "1"} if once else {})}
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_steps, args=(tmp_path / "run", {1: kill_file.touch}, stop))
    watcher.start()
    try:
        result = subprocess.run(_main(cfg, tmp_path), capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    finally:
        stop.set()
        watcher.join()
    rows = _metrics(tmp_path / "run")
    if not once:
        assert result.returncode == 1, result.stderr[-3000:]
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("stopped: RolloutGroup rank 1 was lost during rollout() (ActorDiedError) after 1 rank "
                               "restart, the most cluster.max_restarts allows"), last
        assert "Traceback" not in result.stderr
        assert 1 <= len(rows) < 4
        return
    assert result.returncode == 0, result.stderr[-3000:]
    assert not kill_file.exists(), "rank 1 died once"
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["runtime/restarts"] for r in rows][0] == 0 and rows[-1]["runtime/restarts"] == 1
    # What was in flight on the lost rank rolled out again: at most its share of the step (2 of 4 prompts), and of
    # the batch admitted ahead (async). A rank that died mid-turn had some; one that died loading weights may have
    # had none (it loads between turns).
    rolled_again = rows[-1]["runtime/groups_rolled_again"]
    assert (1 if kill_at == "turn" else 0) <= rolled_again <= (4 if pipeline == "async" else 2)
    if kill_at == "load":
        assert "lost during _weight_sync_receive()" in result.stdout + result.stderr
    # Every step trained its full batch (4 prompts x 2 samples), each prompt once.
    assert all(r["rollout/trajectories"] == 8 for r in rows)
    audit = [json.loads(line) for line in (tmp_path / "run" / "logs" / "batches.jsonl").read_text().splitlines()]
    assert all(len(row["uids"]) == 4 == len(set(row["uids"])) and len(row["responses"]) == 8 for row in audit)
    assert "starting it again (restart 1 of at most 1)" in result.stdout + result.stderr
    if pipeline != "sync":  # the groups handed to the actor, mini-batch by mini-batch: each once
        minibatches = [json.loads(line) for line in
                       (tmp_path / "run" / "logs" / "minibatches.jsonl").read_text().splitlines()]
        assert [row["step"] for row in minibatches] == [1, 2, 3, 4]
        assert all(sorted(g for mb in row["minibatches"] for g in mb) == [0, 1, 2, 3] for row in minibatches)
