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


def _training_run(tmp_path: Path, model_dir: Path, **changes) -> Path:
    """A training run's folder as ``train_main`` leaves it: ``config.yaml`` (the validated settings of tiny-cpu.yaml
    with ``changes``, dotted keys) and the model as ``checkpoints/global_step_3/hf_model``."""
    import shutil

    from omegaconf import OmegaConf

    from rlinf_search.config.raw import resolve_raw
    from rlinf_search.config.schema import SCHEMA

    cfg = OmegaConf.load(ROOT / "examples/searchr1/config/tiny-cpu.yaml")
    del cfg["hydra"]
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value)
    run = tmp_path / "run"
    shutil.copytree(model_dir, run / "checkpoints" / "global_step_3" / "hf_model")
    OmegaConf.save(OmegaConf.create(resolve_raw(cfg, schema=SCHEMA)), run / "config.yaml")
    return run


def test_eval_reads_the_settings_its_model_was_trained_with(tmp_path, tiny_model_dir):
    from rlinf_search.runners.eval_settings import EvalOverrides, check_model_dir, eval_settings

    run = _training_run(tmp_path, tiny_model_dir, **{"tools.search.topk": 2, "agentloop.max_turns": 3,
                                                     "agentloop.max_passage_tokens": 40})
    model = check_model_dir(str(run / "checkpoints" / "global_step_3" / "hf_model"))
    settings = eval_settings(model, "127.0.0.1:9", EvalOverrides())
    assert settings.source == (run / "config.yaml").resolve() and settings.notes == ()
    assert (settings.search.topk, settings.loop.topk, settings.loop.max_turns) == (2, 2, 3)
    assert settings.loop.max_passage_tokens == 40 and settings.loop.max_tokens_per_turn == 64  # tiny-cpu's own
    assert settings.loop.sampling.greedy and settings.search.server_addr == "127.0.0.1:9"
    same = eval_settings(model, "127.0.0.1:9", EvalOverrides(topk=2))
    assert same.notes == (), "a flag equal to the training value says nothing"
    other = eval_settings(model, "127.0.0.1:9", EvalOverrides(topk=3, max_turns=3))
    assert other.loop.topk == 3 and other.search.topk == 3 and len(other.notes) == 1
    assert other.notes[0].startswith("--topk 3 differs from the training run's tools.search.topk 2")
    # A model with no run around it (the demo's warm start) gets the defaults and no note.
    bare = eval_settings(tiny_model_dir, "127.0.0.1:9", EvalOverrides(topk=1))
    assert bare.source is None and bare.loop.topk == 1 and bare.notes == ()


def test_a_checkpoint_that_is_not_there_is_one_line_naming_the_ones_that_are(tmp_path, tiny_model_dir):
    run = _training_run(tmp_path, tiny_model_dir)
    missing = run / "checkpoints" / "global_step_40" / "hf_model"
    result = subprocess.run([sys.executable, "-m", "rlinf_search.runners.eval_runner", "--model", str(missing),
                             "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "eval")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == (f"eval: --model {missing}: no such folder; this run has global_step_3 "
                                     "(each with hf_model/)")


def test_cli_on_a_checkpoint_dir(tmp_path, tiny_model_dir, hotpot_index_dir, hotpot_corpus):
    """The eval a user runs after training: the checkpoint's own run settings (topk 1 here, as the demo trains)
    are used without a flag, and a flag that differs says so and wins."""
    data = tmp_path / "eval.jsonl"
    prepared = subprocess.run([sys.executable, "-m", "rlinf_search.data.prepare", "--input",
                               str(HOTPOT_DIR / "test.jsonl"), "--format", "hotpotqa", "--out", str(data)],
                              capture_output=True, text=True)
    assert prepared.returncode == 0, prepared.stderr
    run = _training_run(tmp_path, tiny_model_dir, **{"tools.search.topk": 1})
    model = run / "checkpoints" / "global_step_3" / "hf_model"
    server_args = ["--index-dir", str(hotpot_index_dir), "--corpus", str(hotpot_corpus), "--retriever", "bm25"]
    with RetrievalServerProcess(server_args) as server:
        def score(out: str, *flags: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "rlinf_search.runners.eval_runner", "--model", str(model),
                                   "--data", str(data), "--server-addr", server.address, "--out", str(tmp_path / out),
                                   "--max-samples", "12", *flags], capture_output=True, text=True, timeout=600)

        result = score("eval")
        overridden = score("eval3", "--topk", "3")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "overall" in result.stdout and "hotpotqa" in result.stdout
    assert f"eval settings ({(run / 'config.yaml').resolve()}): topk 1, protocol searchr1" in result.stdout
    assert "differs" not in result.stderr
    saved = json.loads((tmp_path / "eval" / "eval_results.json").read_text())
    assert saved["settings"]["topk"] == 1 and saved["settings"]["source"] == str((run / "config.yaml").resolve())
    assert saved["overall"]["n"] == 12 and len(saved["trajectories"]) == 12
    assert set(saved["trajectories"][0]) >= {"uid", "response", "em", "subem", "f1", "num_searches"}
    assert overridden.returncode == 0, overridden.stderr[-2000:]
    assert "eval: --topk 3 differs from the training run's tools.search.topk 1" in overridden.stderr
    assert json.loads((tmp_path / "eval3" / "eval_results.json").read_text())["settings"]["topk"] == 3


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
