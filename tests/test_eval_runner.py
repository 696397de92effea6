"""The eval runner: scoring per data source, and a full greedy run of a real checkpoint dir over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys

from rlinf_search.data.io_struct import QARecord, Trajectory
from rlinf_search.retrieval.launch import RetrievalServerProcess
from rlinf_search.runners.eval_runner import format_table, score_trajectories
from tests.conftest import HOTPOT_DIR


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
