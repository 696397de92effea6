"""Collapse monitors: the rules on step sequences, the health signals on real text, and a run driven to collapse
(a learning rate far too high) that the default thresholds stop, keeping the checkpoints before it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlinf_search.agents.searchr1.quality import format_broken, quality_metrics, repetition_share, retrieval_hits
from rlinf_search.data.io_struct import Trajectory
from rlinf_search.monitors import CollapseWatch, MonitorsConfig, check_stop_on, replay

ROOT = Path(__file__).resolve().parents[1]


def _steps(watch: CollapseWatch, rows: list[dict]) -> list[tuple[int, str, int]]:
    return [(f.step, f.monitor, f.since) for i, row in enumerate(rows, 1) for f in watch.observe(i, row)]


def test_a_relative_floor_fires_after_its_patience_once_and_not_on_one_noisy_step():
    healthy = [{"actor/entropy": 0.8}, {"actor/entropy": 0.82}, {"actor/entropy": 0.78}]
    dip = [{"actor/entropy": 0.1}, {"actor/entropy": 0.7}]  # one step below 0.25 x 0.8: noise
    collapse = [{"actor/entropy": 0.15}, {"actor/entropy": 0.1}, {"actor/entropy": 0.05}]
    assert _steps(CollapseWatch(MonitorsConfig()), healthy + dip + healthy) == []
    fired = _steps(CollapseWatch(MonitorsConfig()), healthy + dip + collapse)
    assert fired == [(7, "entropy", 6)], "fires once, at the second step in a row, naming where it began"
    assert _steps(CollapseWatch(MonitorsConfig(enabled=False)), healthy + collapse) == []


def test_searches_at_zero_fire_only_in_a_run_that_searched():
    searched = [{"rollout/searches_per_trajectory": v} for v in (0.3, 0.5, 0.4, 0.0, 0.0, 0.0)]
    assert _steps(CollapseWatch(MonitorsConfig()), searched) == [(6, "searches", 4)]
    never = [{"rollout/searches_per_trajectory": 0.0}] * 8
    assert _steps(CollapseWatch(MonitorsConfig()), never) == []


def test_absolute_ceilings_and_the_largest_importance_weight_of_any_lag():
    rows = [{"actor/kl": 0.1, "actor/lag_1/is_weight_max": 3.0, "actor/lag_4/is_weight_max": 2.0},
            {"actor/kl": 1.5, "actor/lag_1/is_weight_max": 3.0, "actor/lag_4/is_weight_max": 25.0},
            {"actor/kl": 2.0, "actor/lag_4/is_weight_max": 30.0}]
    assert sorted(_steps(CollapseWatch(MonitorsConfig()), rows)) == [(3, "is_weight", 2), (3, "kl", 2)]


def test_a_resumed_run_replays_its_metrics_to_the_same_state():
    rows = [{"step": s, "actor/entropy": e} for s, e in enumerate((0.8, 0.8, 0.8, 0.1, 0.1, 0.1), 1)]
    watch, firings = replay(MonitorsConfig(), rows)
    assert [(f.step, f.monitor) for f in firings] == [(5, "entropy")] and "entropy" in watch.fired
    half, _ = replay(MonitorsConfig(), rows[:4])  # resumed after step 4: the next step fires, as it did
    assert [f.step for f in half.observe(5, rows[4])] == [5]


def test_stop_on_names_are_checked():
    check_stop_on(("entropy", "all"))
    with pytest.raises(ValueError, match="monitors.stop_on: unknown monitor\\(s\\) entropie; choose from"):
        check_stop_on(("entropie",))


def _traj(text: str, golds: list[str]) -> Trajectory:
    return Trajectory(uid="u", prompt_ids=[1], response_ids=[2], response_mask=[1], rollout_logprobs=[0.0],
                      graded_text=text, golden_answers=golds)


def test_the_health_signals_read_what_the_policy_wrote_and_what_the_search_returned():
    good = _traj("<search> Sou Dul </search> <information> Sou Dul was born in Krustaia . </information> "
                 "<answer> Krustaia </answer>", ["Krustaia"])
    miss = _traj("<search> nobody </search> <information> Vail Mail works for Brindle . </information> "
                 "<answer> Brindle </answer>", ["Krustaia"])
    loop = _traj("the the the the the the the the the the <search> x", ["Krustaia"])
    assert retrieval_hits(good) == (1, 1) and retrieval_hits(miss) == (0, 1)
    assert not format_broken("<search> a </search> <answer> b </answer>") and format_broken(loop.graded_text)
    assert repetition_share("a b c d e f") == 0.0 and repetition_share(loop.graded_text) >= 0.7
    metrics = quality_metrics([good, miss, loop])
    assert metrics["rollout/retrieval_hit_rate"] == 0.5 and metrics["rollout/format_violation_rate"] == 1 / 3
    # a passage's words do not count as the policy's repetition
    echo = _traj("<information> x y z x y z x y z </information> <answer> q </answer>", ["q"])
    assert quality_metrics([echo])["rollout/repetition_share"] == 0.0


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Path:
    from rlinf_search.retrieval.build_index import main as build_index_main
    from toolkits.synth_task import SynthSpec, write_task

    out = tmp_path_factory.mktemp("collapse_task")
    paths = write_task(out, SynthSpec(people=80, seed=3))
    done = subprocess.run([sys.executable, "-m", "rlinf_search.data.prepare", "--input", str(paths["train"]),
                           "--format", "flashrag", "--data-source", "synth", "--template", "brief", "--out",
                           str(out / "train.prepared.jsonl")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert build_index_main(["--corpus", str(paths["corpus"]), "--out", str(out / "index"), "--retriever", "bm25"]) == 0
    return out


@pytest.mark.heavy
def test_a_run_driven_to_collapse_is_stopped_by_the_default_thresholds(task, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    command = [sys.executable, "-m", "rlinf_search.cli", "train", "tiny-cpu", f"runner.output_dir={run}",
               "runner.max_steps=12", "runner.save_interval=1", "runner.val_check_interval=0", "runner.rollout_dump=0",
               "runner.resume_dir=null", "runner.logger.logger_backends=[jsonl]", f"rollout.model.model_path={tiny_model_dir}",
               f"data.train_data_paths=[{task / 'train.prepared.jsonl'}]", "data.val_data_paths=[]",
               "data.rollout_batch_size=4", "algorithm.group_size=4", "algorithm.sampling_params.max_new_tokens=24",
               "tools.search.backend=inprocess", f"tools.search.index_dir={task / 'index'}",
               f"tools.search.corpus={task / 'corpus.jsonl'}",
               # a learning rate 3,000x the recipe's: every weight moves by about 0.3 an Adam step
               "actor.optim.lr=0.3", "actor.lr_sched.lr_warmup_fraction=0", "monitors.stop_on=[entropy,repetition,length,kl]"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-3000:]
    # The random model never answers, so `format` fires from the start (logged, not stopping: not in stop_on);
    # the collapse monitors are the ones that stop it.
    stop = [line for line in done.stderr.splitlines() if line.startswith("stopped: monitor ")]
    assert len(stop) == 1, done.stderr[-3000:]
    firings = [json.loads(line) for line in (run / "logs" / "monitors.jsonl").read_text().splitlines()]
    stopped = next(f for f in firings if f["stops"])
    step, since = stopped["step"], stopped["since"]
    assert step < 12 and f"fired at step {step}" in stop[0]
    # The step that fired was logged (with its monitor) but not checkpointed; the checkpoint named is the last
    # one before the collapse began, and it is there.
    rows = [json.loads(line) for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == step and rows[-1][f"monitor/{stopped['monitor']}"] == 1.0
    assert "rollout/repetition_share" in rows[0] and "rollout/format_violation_rate" in rows[0]
    # a collapse, not a threshold met by a healthy run: the policy ran far from its start and lost its entropy
    assert rows[-1]["actor/kl"] > 1.0 and rows[-1]["actor/entropy"] < 0.5 * rows[0]["actor/entropy"]
    assert not (run / "checkpoints" / f"global_step_{step}").exists()
    if since > 1:
        kept = run / "checkpoints" / f"global_step_{since - 1}"
        assert kept.is_dir() and stop[0].endswith(str(kept))
    else:
        assert "none (no checkpoint before step 1" in stop[0]
    # `rlinf-search monitors` reads the same firings off the finished run.
    replayed = subprocess.run([sys.executable, "-m", "rlinf_search.cli", "monitors", str(run)], capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
    assert replayed.returncode == 0 and f"| {stopped['monitor']} | {step} | {since} |" in replayed.stdout
