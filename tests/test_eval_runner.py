"""The eval runner: scoring per data source, and a full greedy run of a real checkpoint dir over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlinf_search.data.io_struct import QARecord, Trajectory
from rlinf_search.retrieval.launch import RetrievalServerProcess
from rlinf_search.runners.eval_runner import format_table, score_trajectories
from tests.conftest import HOTPOT_DIR

ROOT = Path(__file__).resolve().parents[1]


def _traj(uid: str, text: str, searches: int) -> Trajectory:
    return Trajectory(uid=uid, prompt_ids=[1], response_ids=[2], response_mask=[1], rollout_logprobs=[0.0],
                      num_searches=searches, response_text=text, graded_text=text)


def test_scores_per_source_and_overall():
    records = [QARecord("a-1", "q", ["Paris"], "nq"), QARecord("a-2", "q", ["Lester Smith"], "nq"),
               QARecord("b-1", "q", ["a spirit"], "hotpotqa")]
    trajs = [_traj("a-1", "<answer> paris </answer>", 1), _traj("a-2", "<answer> Smith </answer>", 2),
             _traj("b-1", "<answer> it is a spirit of the dead </answer>", 0)]
    report = score_trajectories(records, trajs)
    assert report.per_source["nq"]["em"] == 0.5 and report.per_source["nq"]["n"] == 2
    assert report.per_source["hotpotqa"]["subem"] == 1.0 and report.per_source["hotpotqa"]["em"] == 0.0
    assert report.overall["searches"] == 1.0
    assert abs(report.per_source["nq"]["f1"] - (1.0 + 2 / 3) / 2) < 1e-9  # "smith" vs "lester smith"
    assert "overall" in format_table(report) and report.trajectories[1]["answer"] == "Smith"


def test_cli_on_a_checkpoint_dir(tmp_path, tiny_model_dir, hotpot_index_dir, hotpot_corpus):
    data = tmp_path / "eval.jsonl"
    prepared = subprocess.run([sys.executable, "-m", "rlinf_search.data.prepare", "--input",
                               str(HOTPOT_DIR / "test.jsonl"), "--format", "hotpotqa", "--out", str(data)],
                              capture_output=True, text=True)
    assert prepared.returncode == 0, prepared.stderr
    server_args = ["--index-dir", str(hotpot_index_dir), "--corpus", str(hotpot_corpus), "--retriever", "bm25"]
    with RetrievalServerProcess(server_args) as server:
        result = subprocess.run([sys.executable, "-m", "rlinf_search.runners.eval_runner", "--model",
                                 str(tiny_model_dir), "--data", str(data), "--server-addr", server.address,
                                 "--out", str(tmp_path / "eval"), "--max-samples", "12"],
                                capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "overall" in result.stdout and "hotpotqa" in result.stdout
    saved = json.loads((tmp_path / "eval" / "eval_results.json").read_text())
    assert saved["overall"]["n"] == 12 and len(saved["trajectories"]) == 12
    assert set(saved["trajectories"][0]) >= {"uid", "response", "em", "subem", "f1", "num_searches"}


@pytest.mark.heavy  # about a minute: a Ray cluster, two engines and an index in the tool ranks
def test_the_eval_entry_on_a_cpu_cluster(tmp_path, tiny_model_dir, hotpot_index_dir, hotpot_corpus):
    """``main_searchr1_eval.py`` with the GPU eval recipe moved onto 2 CPU slots: two rollout ranks search through
    the recipe's SearchTool group (2 ranks, in-process BM25), and each reward rank scores its own half (the
    reward here is the scoring rank's number)."""
    data = tmp_path / "eval.jsonl"
    lines = (HOTPOT_DIR / "test.jsonl").read_text().splitlines()[:12]
    (tmp_path / "raw.jsonl").write_text("\n".join(lines) + "\n")
    prepared = subprocess.run([sys.executable, "-m", "rlinf_search.data.prepare", "--input", str(tmp_path / "raw.jsonl"),
                               "--format", "hotpotqa", "--out", str(data)], check=False, capture_output=True, text=True)
    assert prepared.returncode == 0, prepared.stderr
    result = subprocess.run(
        [sys.executable, "examples/searchr1/main_searchr1_eval.py", "--config-name", "qwen2.5-3b-tool-1node-eval",
         "rollout.rollout_backend=hf", "~rollout.gpu_memory_utilization", "~rollout.tensor_parallel_size",
         "~rollout.max_running_requests", f"rollout.model.model_path={tiny_model_dir}", "rollout.model.precision=fp32",
         "~cluster.num_gpus_per_node", "+cluster.cpu_slots_per_node=2", f"data.val_data_paths=[{data}]",
         f"runner.output_dir={tmp_path / 'out'}", "tools.search.backend=inprocess",
         f"+tools.search.index_dir={hotpot_index_dir}", f"+tools.search.corpus={hotpot_corpus}",
         "algorithm.sampling_params.max_new_tokens=8", "reward.score=tests.test_group_calls:rank_reward"],
        check=False, capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})  # the reward is named from this checkout's tests package
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert saved["overall"]["n"] == 12
    assert [int(row["reward"]) for row in saved["trajectories"]] == [0] * 6 + [1] * 6
