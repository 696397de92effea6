"""The sweep over arms x seeds, as a Hydra multirun: Hydra's sweeper expands ``arm=a,b seed=0,1,2`` into jobs and its
launcher runs them in turn; each job runs one cell (``ablation/cell.py``), and ``CellProgress`` (a Hydra callback)
prints a line per cell with the sweep's time left.

    python -m rlinf_search.ablation.sweep -m study=masking arm=masked,unmasked seed=0,1,2 base=outputs/demo \\
        out=outputs/ablate/masking hydra.sweep.dir=outputs/ablate/masking/hydra

``rlinf-search ablate`` builds that command (and writes the report after it); this module is its engine. A cell that
fails is recorded (``failed.txt`` in its folder) and the sweep goes on: one bad arm does not lose the others.
"""

from __future__ import annotations

import sys
import time
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from rlinf_search.ablation.cell import CellFailed, SweepSettings, cell_dir, cell_key, finished_cell, run_cell
from rlinf_search.ablation.study import load_study


@dataclass
class CellJob:
    """One Hydra job: which cell, and the sweep's shared settings (the same in every job)."""

    study: str = "???"
    """A shipped study's name or a study file."""
    arm: str = "???"
    """The arm this job runs."""
    seed: int = 0
    """``data.seed`` of its RL run."""
    base: str = "outputs/demo"
    """The finished demo folder the cells start from."""
    config: str = "tiny-cpu"
    """The recipe every arm overrides."""
    steps: int = 30
    """RL steps a cell trains."""
    eval_n: int = 300
    """Held-out questions a cell is scored on."""
    out: str = "???"
    """The sweep's folder."""
    arms: str = ""
    """Every arm of the sweep, comma-separated (for the progress line's count and time left)."""
    seeds: str = ""
    """Every seed of the sweep, comma-separated."""
    overrides: list = dataclasses.field(default_factory=list)
    """Overrides every arm gets (``SweepSettings.overrides``)."""


ConfigStore.instance().store(name="ablation_cell", node=CellJob)


def settings_of(job) -> SweepSettings:
    return SweepSettings(base=Path(job.base).resolve(), config=job.config, steps=int(job.steps),
                         eval_n=int(job.eval_n), out=Path(job.out).resolve(), overrides=tuple(job.overrides))


@hydra.main(version_base=None, config_name="ablation_cell")
def run_job(job: DictConfig) -> dict | None:
    """Run one cell; a failure is written beside it and printed, and the sweep goes on."""
    study = load_study(job.study)
    folder = cell_dir(settings_of(job), job.arm, int(job.seed))
    try:
        result = run_cell(study, job.arm, int(job.seed), settings_of(job))
    except CellFailed as exc:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "failed.txt").write_text(f"{exc}\n")
        print(f"cell failed: {exc}", file=sys.stderr, flush=True)
        return None
    (folder / "failed.txt").unlink(missing_ok=True)
    return result


class CellProgress(Callback):
    """A line when a cell starts and when it ends: its place in the sweep, its held-out EM, and the time left
    (cells still to run times the mean of those run so far: reused cells cost nothing)."""

    def __init__(self) -> None:
        self.index, self.durations, self.started = 0, [], 0.0

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        job = config
        self.index += 1
        self.started = time.perf_counter()
        print(f"[{self.index}/{self._total(job)}] {job.arm} seed {job.seed}: starting", flush=True)

    def on_job_end(self, config: DictConfig, job_return, **kwargs) -> None:
        job = config
        elapsed = time.perf_counter() - self.started
        try:
            result = job_return.return_value
        except Exception as exc:  # noqa: BLE001 - Hydra re-raises a job's exception here; report it as a failure
            result = None
            print(f"  {job.arm} seed {job.seed}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        if result is None:
            outcome = "FAILED (see failed.txt in its folder)"
        elif result.get("reused"):
            outcome = f"held-out EM {result['heldout_em']:.3f} (finished earlier, reused)"
        else:
            self.durations.append(elapsed)
            outcome = f"held-out EM {result['heldout_em']:.3f} in {elapsed / 60:.1f} min"
        left = self._left(job)
        cells = f"{left} cell{'s' if left > 1 else ''}"
        eta = (f", about {left * sum(self.durations) / len(self.durations) / 60:.0f} min left ({cells})"
               if self.durations and left else "")
        print(f"[{self.index}/{self._total(job)}] {job.arm} seed {job.seed}: {outcome}{eta}", flush=True)

    @staticmethod
    def _total(job) -> int:
        return len(_split(job.arms)) * len(_split(job.seeds)) or 1

    @staticmethod
    def _left(job) -> int:
        """Cells of the sweep with no result yet and no failure recorded in this sweep (those are not run again
        until the next call)."""
        study, settings = load_study(job.study), settings_of(job)
        folders = [(arm, int(seed), cell_dir(settings, arm, int(seed))) for arm in _split(job.arms)
                   for seed in _split(job.seeds)]
        return sum(finished_cell(folder, cell_key(study, arm, seed, settings)) is None
                   and not (folder / "failed.txt").is_file() for arm, seed, folder in folders)


def _split(text: str) -> list[str]:
    return [item for item in str(text).split(",") if item]


def sweep_command(study: str, arms: list[str], seeds: list[int], settings: SweepSettings) -> list[str]:
    """The Hydra multirun command line that runs every arm x seed of ``study`` into ``settings.out``."""
    hydra_dir = settings.out / "hydra"
    return [sys.executable, "-m", "rlinf_search.ablation.sweep", "--multirun",
            f"study={study}", f"arm={','.join(arms)}", f"seed={','.join(map(str, seeds))}",
            f"base={settings.base}", f"config={settings.config}", f"steps={settings.steps}",
            f"eval_n={settings.eval_n}", f"out={settings.out}", f"arms='{','.join(arms)}'",
            f"seeds='{','.join(map(str, seeds))}'", f"overrides={_hydra_list(settings.overrides)}",
            f"hydra.sweep.dir={hydra_dir}", "hydra.sweep.subdir=${arm}/seed${seed}",
            "+hydra.callbacks.progress._target_=rlinf_search.ablation.sweep.CellProgress",
            "hydra/job_logging=none", "hydra/hydra_logging=none"]


def _hydra_list(items) -> str:
    """A list of strings as one Hydra override value: each quoted, so ``=``, ``[`` and ``,`` inside stay text."""
    quoted = ["'" + item.replace("\\", "\\\\").replace("'", "\\'") + "'" for item in items]
    return "[" + ",".join(quoted) + "]"


def failed_cells(settings: SweepSettings, arms: list[str], seeds: list[int]) -> list[str]:
    """The failure line of every cell of the sweep that recorded one."""
    return [(cell_dir(settings, arm, seed) / "failed.txt").read_text().strip()
            for arm in arms for seed in seeds if (cell_dir(settings, arm, seed) / "failed.txt").is_file()]


if __name__ == "__main__":
    run_job()
