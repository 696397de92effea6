"""One cell of a sweep: an arm's RL run from the base's warm start on one seed (the recipe's GRPO unless the arm sets
another advantage estimator), then its held-out evaluation.

Both are the commands a user runs (``rlinf-search train`` and ``python -m rlinf_search.runners.eval_runner``), each
in its own process, so a cell is exactly a run of the recipe with the arm's overrides. The evaluation reads its
retrieval and protocol settings from the run's ``config.yaml`` (``runners/eval_settings.py``): a cell is scored as it
was trained. A cell writes ``cell.json`` last; one that has it under the same settings is not run again, and one
interrupted in training resumes from its newest checkpoint (``runner.resume_dir=auto``).
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rlinf_search.ablation.study import Study
from rlinf_search.plot import read_series
from rlinf_search.progress import progress

CURVES = ("reward/mean", "val/em", "rollout/searches_per_trajectory", "rollout/response_length", "actor/kl",
          "actor/entropy")
"""The per-step metrics a cell keeps (each where the run logged it)."""


@dataclass(frozen=True)
class SweepSettings:
    """What every cell of a sweep shares."""

    base: Path
    """A finished ``scripts/demo.sh`` output folder: ``model/sft`` (the warm start), ``data``, ``index``."""
    config: str
    """The recipe every arm overrides (a name of examples/searchr1/config or a YAML path)."""
    steps: int
    """RL steps a cell trains."""
    eval_n: int
    """Held-out test questions a cell is scored on (greedy)."""
    out: Path
    """The sweep's folder: ``cells/<arm>/seed<seed>/`` and the report."""
    overrides: tuple[str, ...] = ()
    """Hydra overrides every arm gets, after the base's and before its own (a smaller batch, another protocol)."""


class CellFailed(RuntimeError):
    """A cell's training or evaluation exited non-zero (the message names its log)."""


def cell_dir(settings: SweepSettings, arm: str, seed: int) -> Path:
    return settings.out / "cells" / arm / f"seed{seed}"


def base_overrides(settings: SweepSettings, seed: int, run_dir: Path) -> list[str]:
    """The demo's GRPO stage on the base's warm start, data and index (searched in-process: no server to keep
    alive between cells, and an arm can switch retrievers with ``tools.search.retriever``)."""
    base = settings.base
    return [f"runner.output_dir={run_dir}", f"runner.max_steps={settings.steps}", "runner.resume_dir=auto",
            f"rollout.model.model_path={base / 'model' / 'sft'}", f"data.seed={seed}",
            f"data.train_data_paths=[{base / 'data' / 'train.prepared.jsonl'}]",
            f"data.val_data_paths=[{base / 'data' / 'val.prepared.jsonl'}]",
            "tools.search.backend=inprocess", f"tools.search.index_dir={base / 'index'}",
            f"tools.search.corpus={base / 'data' / 'corpus.jsonl'}", "tools.search.retriever=bm25",
            *settings.overrides]


def cell_key(study: Study, arm: str, seed: int, settings: SweepSettings) -> dict:
    """Everything a cell's result depends on: a finished cell with the same key is reused."""
    return {"config": settings.config, "common": list(settings.overrides),
            "overrides": study.arm_overrides(arm, settings.base), "seed": seed,
            "steps": settings.steps, "eval_n": settings.eval_n, "base": str(settings.base)}


def finished_cell(folder: Path, key: dict) -> dict | None:
    path = folder / "cell.json"
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    return saved if saved.get("key") == key else None


def run_cell(study: Study, arm: str, seed: int, settings: SweepSettings, *, label: str = "") -> dict:
    """The cell's result (``cell.json``): reused when it finished under the same settings, else trained (resuming
    an interrupted run) and evaluated. Raises ``CellFailed`` naming the log of the step that failed."""
    folder = cell_dir(settings, arm, seed)
    key = cell_key(study, arm, seed, settings)
    done = finished_cell(folder, key)
    if done is not None:
        return {**done, "reused": True}
    if (folder / "cell.json").is_file():  # finished under other settings: start over, nothing of it is valid
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    run_dir = folder / "rl"
    overrides = [*base_overrides(settings, seed, run_dir), *key["overrides"]]
    (folder / "overrides.txt").write_text("\n".join(overrides) + "\n")
    started = time.perf_counter()
    _train(settings.config, overrides, run_dir, folder / "train.log", settings.steps, label or f"{arm} seed {seed}")
    trained = time.perf_counter()
    model = newest_checkpoint(run_dir)
    command = [sys.executable, "-m", "rlinf_search.runners.eval_runner", "--model", str(model),
               "--data", str(settings.base / "data" / "test.prepared.jsonl"), "--max-samples", str(settings.eval_n),
               "--out", str(folder / "eval")]
    with (folder / "eval.log").open("w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    if code:
        raise CellFailed(f"{arm} seed {seed}: the evaluation exited {code}: {_last_line(folder / 'eval.log')} "
                         f"(log: {folder / 'eval.log'})")
    result = summarise(folder, arm=arm, seed=seed, model=model)
    result.update(key=key, train_s=trained - started, eval_s=time.perf_counter() - trained,
                  wall_s=time.perf_counter() - started)
    (folder / "cell.json").write_text(json.dumps(result, indent=1))
    return result


def _train(config: str, overrides: list[str], run_dir: Path, log_path: Path, steps: int, label: str) -> None:
    """``rlinf-search train`` in a process of its own, its output to ``log_path``; progress from its metrics."""
    command = [sys.executable, "-m", "rlinf_search.cli", "train", config, *overrides]
    metrics = run_dir / "logs" / "metrics.jsonl"
    with log_path.open("a") as log, progress(total=steps, desc=f"  {label}: RL steps", unit="step") as bar:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        while process.poll() is None:
            time.sleep(2.0)
            done = _steps_logged(metrics)
            if done > bar.n:
                bar.update(done - bar.n)
        if process.returncode:
            raise CellFailed(f"{label}: training exited {process.returncode}: {_last_line(log_path)} "
                             f"(log: {log_path})")
        bar.update(max(0, _steps_logged(metrics) - bar.n))


def _steps_logged(metrics: Path) -> int:
    if not metrics.is_file():
        return 0
    return len(read_series(metrics).get("reward/mean", []))


def newest_checkpoint(run_dir: Path) -> Path:
    """``run_dir``'s newest ``checkpoints/global_step_N/hf_model``."""
    found = sorted((run_dir / "checkpoints").glob("global_step_*/hf_model"),
                   key=lambda p: int(p.parent.name.rsplit("_", 1)[1]))
    if not found:
        raise CellFailed(f"{run_dir}: training wrote no checkpoint (checkpoints/global_step_N/hf_model)")
    return found[-1]


def summarise(folder: Path, *, arm: str, seed: int, model: Path) -> dict:
    """The cell's held-out scores, final reward and per-step curves."""
    report = json.loads((folder / "eval" / "eval_results.json").read_text())
    series = read_series(folder / "rl" / "logs" / "metrics.jsonl")
    rewards = [value for _, value in series.get("reward/mean", [])]
    return {"arm": arm, "seed": seed, "model": str(model), "heldout_em": report["overall"]["em"],
            "heldout_f1": report["overall"]["f1"], "heldout_searches": report["overall"]["searches"],
            "final_reward": statistics.mean(rewards[-5:]) if rewards else None,
            "curves": {name: series[name] for name in CURVES if name in series}}


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()] if path.is_file() else []
    return lines[-1].strip()[:300] if lines else "(no output)"
