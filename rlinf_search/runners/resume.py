"""Where a run resumes from, and the run-level parts of a checkpoint: data position, RNGs, each
rollout rank's sampling state and (rollout ahead of the update) the rollouts already generated for later steps."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from rlinf_search.checkpoint import (
    CRITIC_SUBDIR,
    RunnerState,
    begin_checkpoint,
    capture_rng,
    latest_checkpoint,
    load_checkpoint,
    load_pending_rollout,
    restore_rng,
    stage_pending_rollout,
)
from rlinf_search.config import RunnerConfig
from rlinf_search.data.io_struct import Trajectory
from rlinf_search.runners.group_calls import Groups, call_each
from rlinf_search.workers.actor.worker import ActorWorker
from rlinf_search.workers.critic.worker import CriticWorker
from rlinf_search.workers.rollout.worker import RolloutWorker

log = logging.getLogger(__name__)


def find_resume_point(runner: RunnerConfig) -> Path | None:
    """``runner.resume_dir``: a checkpoint folder, ``auto`` (the newest usable one), or None."""
    resume = runner.resume_dir
    if not resume:
        return None
    if resume == "auto":
        return latest_checkpoint(Path(runner.output_dir) / "checkpoints")
    folder = Path(resume)
    if not folder.is_dir():
        raise FileNotFoundError(f"runner.resume_dir: no checkpoint folder at {folder}")
    return folder


def restore_run(folder: Path, groups: Groups, *,
                pipelined: bool) -> tuple[RunnerState, list[list[Trajectory]] | None]:
    """The runner's state from ``folder`` (the process RNGs and the rollout ranks' sampling states
    restored as a side effect), and the rollouts it kept for later steps (one list per step) when this run's
    rollout runs ahead too (``pipelined``)."""
    state, _ = load_checkpoint(folder)
    restore_rng(state.rng)
    ranks = groups.rollout.world_size
    if len(state.rollout_rng) == ranks:
        call_each(groups.rollout, RolloutWorker.set_rng_state, [(rng,) for rng in state.rollout_rng])
    else:
        log.warning("the checkpoint holds sampling states for %d rollout ranks and this run has %d: rollouts "
                    "will differ from an uninterrupted run", len(state.rollout_rng), ranks)
    pending = load_pending_rollout(folder)
    if pending is not None and not pipelined:
        log.warning("%s holds rollouts of later steps; this run's rollout does not run ahead, so they are "
                    "generated again", folder)
        pending = None
    log.info("resumed from %s at step %d", folder, state.global_step)
    return state, pending


def save_run(ckpt_dir: Path, state: RunnerState, groups: Groups,
             pending: Callable[[], list[list[Trajectory]]] | None) -> Path:
    """Checkpoint ``state`` (its data position already set by the caller) with every group's part.

    Every part goes into one staging folder that the actor seals last: a crash at any point leaves no
    checkpoint that has the policy but not the critic. ``pending``: waits for the rollouts of later steps
    already in flight (one list per step), which are kept because a resume could not generate them again
    (weights before this step's update sampled them).
    """
    state.rng = capture_rng()
    trajectories = pending() if pending is not None else None
    # Read after any rollout in flight (calls queue per rank), so it is the state after that rollout.
    state.rollout_rng = groups.rollout.call(RolloutWorker.rng_state).wait()
    staging = begin_checkpoint(ckpt_dir, state.global_step)
    if trajectories is not None:
        stage_pending_rollout(staging, trajectories)
    if groups.critic is not None:
        groups.critic.call(CriticWorker.save, str(staging / CRITIC_SUBDIR)).wait()
    paths = groups.actor.call(ActorWorker.save, str(ckpt_dir), state, begun=True).wait()
    return Path(paths[0])
