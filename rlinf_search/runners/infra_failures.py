"""A step's GRPO groups that met an infrastructure failure: kept out of the update, counted, and the run stopped
when there are too many.

A tool call that failed because a service did (a retrieval server unreachable, timed out or failing after its
retries) is not the model's doing, so it must never become a reward of 0 that teaches the model not to search.
The rollout re-runs such a group (``agentloop.infra_reruns``); a group still marked after that reaches the step
here and is dropped. More than ``runner.max_infra_failed_share`` of the step's groups dropped stops the run in
one line: the last checkpoint stands, and no update has been made on the failure.
"""

from __future__ import annotations

from rlinf_search.data.io_struct import FinishedGroup, Trajectory


class RunStopped(RuntimeError):
    """The run cannot go on (a worker's process lost, a service down): it stops; its last checkpoint stands."""


class InfraFailureTally:
    """One step's groups as they arrive: the trainable ones handed on, the rest counted."""

    def __init__(self, step: int, total_groups: int, *, max_share: float):
        self.step, self.total_groups, self.max_share = step, total_groups, max_share
        self.dropped: list[FinishedGroup] = []
        """Groups dropped for an infrastructure failure, in arrival order."""
        self.rerun = 0
        """Groups (trained or dropped) the rollout ran again after an infrastructure failure."""

    def keep(self, groups: list[FinishedGroup]) -> list[FinishedGroup]:
        """The groups of ``groups`` that may train. Raises ``RunStopped`` as soon as the dropped ones are more
        than ``max_share`` of the step's groups (before the update of the batch that crossed it)."""
        kept = []
        for group in groups:
            self.rerun += int(any(t.infra_reruns for t in group.trajectories))
            if group.infra_error is None:
                kept.append(group)
            else:
                self.dropped.append(group)
        if self.dropped and (len(self.dropped) > self.max_share * self.total_groups
                             or len(self.dropped) == self.total_groups):
            self._stop()
        return kept

    def _stop(self) -> None:
        reruns = max(t.infra_reruns for t in self.dropped[0].trajectories)
        raise RunStopped(
            f"step {self.step}: {len(self.dropped)} of {self.total_groups} GRPO groups met an infrastructure failure "
            f"after {reruns} re-run{'s' if reruns != 1 else ''} each, more than runner.max_infra_failed_share "
            f"({self.max_share:g}); first: {self.dropped[0].infra_error}. No update was made on them; once the "
            "service is back, resume from the last checkpoint with runner.resume_dir=auto")

    def metrics(self) -> dict[str, float]:
        return {"rollout/groups_rerun_infra": float(self.rerun), "rollout/groups_dropped_infra": float(len(self.dropped))}

    @property
    def dropped_uids(self) -> list[str]:
        return [g.trajectories[0].uid for g in self.dropped if g.trajectories]


def refuse_infra_failures(trajectories: list[Trajectory], *, what: str) -> None:
    """An evaluation's score means nothing when a service failed some of its questions: raise ``RunStopped``
    naming how many and the first failure (``what``: the scored set, for the message)."""
    failed = [t for t in trajectories if t.infra_error is not None]
    if failed:
        raise RunStopped(f"{what}: {len(failed)} of {len(trajectories)} rollouts met an infrastructure failure after "
                         f"their re-runs (first: {failed[0].infra_error}); no score was written. Check the service "
                         "and run it again")
