"""Rollout ranks that come back: a real Ray run (2 rollout ranks, 2 FSDP actor ranks, the ``sync`` pipeline) whose
rollout rank 1 kills its own process in the middle of a step. The rank is started again with the current weights,
its share of the step rolls out again, and the step trains its full batch; a rank that keeps dying stops the run in
one line once ``cluster.max_restarts`` is spent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.test_infra_run import SearchThenAnswer, _main, _watch_steps
from tests.test_train_runner import ROOT, _config, _metrics, server, synth  # noqa: F401 - fixtures

KILL_FILE_ENV = "RLINF_TEST_KILL_FILE"


class DiesOnSignal(SearchThenAnswer):
    """Rank 1's engine ends its own process (``os._exit``, as a crash would) at its next turn once the kill file
    exists; ``RLINF_TEST_KILL_ONCE`` removes the file first, so the restarted rank lives."""

    async def generate(self, prompt_ids, sampling):
        kill = os.environ.get(KILL_FILE_ENV)
        if kill and os.environ.get("RANK") == "1" and os.path.exists(kill):
            if os.environ.get("RLINF_TEST_KILL_ONCE"):
                os.remove(kill)
            os._exit(1)
        return await super().generate(prompt_ids, sampling)


def dying_engine(config, *, device=None, seed=0):
    """``rollout.rollout_backend: tests.test_rank_restarts:dying_engine``."""
    from transformers import AutoTokenizer

    return DiesOnSignal(AutoTokenizer.from_pretrained(config.model_path),
                        ["<search> a person </search>", "<answer> a city </answer>"], delay_s=0.05)


@pytest.mark.heavy  # two 4-step runs with 2 FSDP ranks: about two minutes on 2 cores
@pytest.mark.parametrize("once", [True, False], ids=["killed-once", "keeps-dying"])
def test_a_lost_rollout_rank_is_started_again_and_the_step_trains_its_full_batch(tmp_path, synth, server,  # noqa: F811
                                                                                   tiny_model_dir, once):
    kill_file = tmp_path / "kill"
    cfg = _config(tmp_path, synth, server, tiny_model_dir, **{
        "runner.max_steps": 4, "runner.val_check_interval": 0, "runner.save_interval": 1,
        "rollout.rollout_backend": "tests.test_rank_restarts:dying_engine",
        "cluster.cpu_slots_per_node": 2, "cluster.max_restarts": 1})
    cfg.cluster.component_placement = {"actor,rollout,reward": "all"}
    env = {**os.environ, "PYTHONPATH": str(ROOT), KILL_FILE_ENV: str(kill_file),
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
    # Every step trained its full batch (4 prompts x 2 samples), each prompt once.
    assert all(r["rollout/trajectories"] == 8 for r in rows)
    audit = [json.loads(line) for line in (tmp_path / "run" / "logs" / "batches.jsonl").read_text().splitlines()]
    assert all(len(row["uids"]) == 4 == len(set(row["uids"])) and len(row["responses"]) == 8 for row in audit)
    assert "starting it again (restart 1 of at most 1)" in result.stdout + result.stderr
