"""Checkpoints a killed run can resume from with nothing lost or repeated.

``CKPT_DIR/global_step_N/`` holds the policy in Hugging Face format (``hf_model/``: loads with
``from_pretrained``, so eval and conversion read it directly), the optimizer and schedule
(``training_state.pt``) and the runner's state (``runner_state.json``: step, data position, RNG);
with a critic, ``critic/`` holds the value model (``hf_model/``) and its own ``training_state.pt``;
with the rollout ahead of the update, ``pending_rollout.pt`` holds later steps' rollouts, generated before it.
A checkpoint is written to a temporary folder and renamed into place, then marked ``COMPLETE``;
a folder without the mark (a crash mid-write, a truncated copy) is never resumed from.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)

COMPLETE_MARK = "COMPLETE"
HF_SUBDIR = "hf_model"
TRAINING_STATE = "training_state.pt"
RUNNER_STATE = "runner_state.json"
CRITIC_SUBDIR = "critic"
PENDING_ROLLOUT = "pending_rollout.pt"


@dataclass
class TrainingState:
    """What a trainer (the policy's or the critic's) needs beyond its weights to resume exactly; saved as
    ``training_state.pt`` (a plain dict of the fields that are set, so the file reads without this class)."""

    scheduler: dict
    """The lr scheduler's ``state_dict()``."""
    global_step: int
    """Optimizer steps taken (the schedule's position)."""
    rng: tuple
    """The trainer's ``random.Random`` state (its mini-batch shuffles)."""
    optimizer: dict | None = None
    """The whole optimizer ``state_dict()`` (``ddp``, ``megatron``); None when it is sharded on disk."""
    optimizer_shards: str | None = None
    """``fsdp``: the checkpoint's subfolder of per-rank optimizer shards (``torch.distributed.checkpoint``)."""

    def save(self, path: Path) -> None:
        torch.save({f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}, path)

    @classmethod
    def load(cls, path: Path) -> TrainingState:
        state = torch.load(path, map_location="cpu", weights_only=False)
        return cls(**{f.name: state[f.name] for f in fields(cls) if f.name in state})


@dataclass
class RunnerState:
    """Where the run is: enough to continue exactly, with the same data order."""

    global_step: int = 0
    """Training steps finished."""
    epoch: int = 0
    """Current pass over the training data."""
    batch_in_epoch: int = 0
    """Batches of the current epoch already consumed."""
    rng: dict = field(default_factory=dict)
    """Python, numpy and torch RNG states (serialised)."""
    rollout_rng: list = field(default_factory=list)
    """Per rollout rank, its sampling generator's state (bytes as ints), so the rollouts after a
    resume sample exactly what the uninterrupted run would have."""


def capture_rng() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state().tolist()}


def restore_rng(state: dict) -> None:
    if not state:
        return
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def _json_default(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def staging_folder(ckpt_dir: Path, step: int) -> Path:
    """Where checkpoint ``step`` is written before it is sealed."""
    return Path(ckpt_dir) / f"global_step_{step}.tmp"


def begin_checkpoint(ckpt_dir: Path, step: int) -> Path:
    """An empty staging folder for checkpoint ``step``. Parts written by other groups (the critic's
    ``critic/``) go in it before ``save_checkpoint(..., begun=True)`` seals it, so the checkpoint
    appears whole or not at all."""
    staging = staging_folder(ckpt_dir, step)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def save_checkpoint(ckpt_dir: Path, state: RunnerState, *, model, tokenizer, training_state: TrainingState,
                    begun: bool = False) -> Path:
    """Write checkpoint ``global_step_{state.global_step}`` atomically; return its folder.

    ``begun``: ``begin_checkpoint`` made the staging folder and other parts may be in it already.
    """
    final = Path(ckpt_dir) / f"global_step_{state.global_step}"
    staging = staging_folder(ckpt_dir, state.global_step)
    if not begun:
        begin_checkpoint(ckpt_dir, state.global_step)
    elif not staging.is_dir():
        raise FileNotFoundError(f"{staging}: begin_checkpoint was not called for step {state.global_step}")
    model.save_pretrained(staging / HF_SUBDIR)
    tokenizer.save_pretrained(staging / HF_SUBDIR)
    training_state.save(staging / TRAINING_STATE)
    (staging / RUNNER_STATE).write_text(json.dumps(asdict(state), default=_json_default))
    for path in staging.rglob("*"):  # data on disk before the rename makes it visible
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    (final / COMPLETE_MARK).write_text("ok\n")
    return final


def is_usable_checkpoint(folder: Path) -> bool:
    """Whether ``folder`` is a whole checkpoint: sealed, its runner and training states readable, weights present."""
    if not (folder / COMPLETE_MARK).is_file():
        return False
    try:
        json.loads((folder / RUNNER_STATE).read_text())
        TrainingState.load(folder / TRAINING_STATE)
    except Exception as exc:  # noqa: BLE001 - any unreadable part disqualifies the checkpoint
        log.warning("checkpoint %s is damaged (%s); using an earlier one", folder, exc)
        return False
    critic = folder / CRITIC_SUBDIR
    models = [folder / HF_SUBDIR] + ([critic / HF_SUBDIR] if critic.is_dir() else [])
    for model_dir in models:
        weights = list(model_dir.glob("*.safetensors")) + list(model_dir.glob("*.bin"))
        if not weights or any(w.stat().st_size == 0 for w in weights):
            return False
    if critic.is_dir():
        try:
            TrainingState.load(critic / TRAINING_STATE)
        except Exception as exc:  # noqa: BLE001 - same rule as the policy's state
            log.warning("checkpoint %s has a damaged critic (%s); using an earlier one", folder, exc)
            return False
    return True


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest usable checkpoint in ``ckpt_dir`` (damaged or unfinished ones are skipped)."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return None
    steps = []
    for folder in ckpt_dir.glob("global_step_*"):
        suffix = folder.name.removeprefix("global_step_")
        if suffix.isdigit():
            steps.append((int(suffix), folder))
    for _, folder in sorted(steps, reverse=True):
        if is_usable_checkpoint(folder):
            return folder
        log.warning("skipping unusable checkpoint %s", folder)
    return None


def stage_pending_rollout(staging: Path, batches: list[list]) -> None:
    """Runs whose rollout runs ahead of the update: the rollouts of later steps (one list of trajectories per
    step), already generated (partly by weights older than this step's update) when the checkpoint is taken. A
    resume trains on them instead of generating them again with the newer weights, which would change the run."""
    torch.save({"batches": batches}, Path(staging) / PENDING_ROLLOUT)


def load_pending_rollout(folder: Path) -> list[list] | None:
    """The batches ``stage_pending_rollout`` kept, or None. A checkpoint of an earlier release kept one batch as a
    flat list of trajectories: it is read as that one batch."""
    path = Path(folder) / PENDING_ROLLOUT
    if not path.is_file():
        return None
    kept = torch.load(path, weights_only=False)
    batches = kept["batches"] if isinstance(kept, dict) else [kept]
    for batch in batches:
        for traj in batch:
            if "token_versions" not in vars(traj):  # kept before trajectories recorded a version per token
                traj.token_versions = []
    return batches


def load_checkpoint(folder: Path) -> tuple[RunnerState, TrainingState]:
    """(runner state, the policy's training state) of a checkpoint folder; the weights load from
    ``folder/hf_model``."""
    state = RunnerState(**json.loads((Path(folder) / RUNNER_STATE).read_text()))
    return state, TrainingState.load(Path(folder) / TRAINING_STATE)
