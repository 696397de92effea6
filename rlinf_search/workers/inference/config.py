"""Typed settings of the InferenceGroup (``inference`` and the log-prob forward keys of ``algorithm``)."""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_search.scheduler.placement import Placement


@dataclass(frozen=True)
class InferenceConfig:
    """Where the old-policy and reference log-probs are computed, and in what passes."""

    separate: bool = False
    """The placement gives ``inference`` devices of its own, apart from the actor's: an InferenceGroup
    runs there and the actor only trains. Placed on the actor's devices (or not placed), the actor
    computes the log-probs itself, as one more phase on the devices it already holds."""
    group_name: str = "InferenceGroup"
    """``inference.group_name``: the group's name in logs and errors."""
    load_from_actor: bool = True
    """``inference.load_from_actor``: the group's copy of the policy takes the actor's weights after
    every update (through the same weight sync as the rollout). Required for recomputed old
    log-probs; false leaves the group with the frozen reference only."""
    forward_micro_batch_size: int | None = None
    """``algorithm.logprob_forward_micro_batch_size``: rows per forward-only pass (actor and
    InferenceGroup alike); None packs rows by ``runner.max_tokens_per_mbs`` instead."""

    @classmethod
    def from_placement(cls, placement: Placement, *, recompute: bool, kl_beta: float, group_name: str,
                       load_from_actor: bool, forward_micro_batch_size: int | None) -> InferenceConfig:
        """The config for ``placement``; raises ``ValueError`` naming the key when the combination cannot run."""
        separate = False
        if "inference" in placement.components and "actor" in placement.components:
            mine, actor = set(placement["inference"].devices), set(placement["actor"].devices)
            if mine & actor and mine != actor:
                raise ValueError("cluster.component_placement: inference shares some of the actor's devices but "
                                 "not all; place it on the actor's devices (the actor then computes log-probs "
                                 "itself) or on devices of its own")
            separate = not mine & actor
        if separate and not (recompute or kl_beta > 0):
            raise ValueError("cluster.component_placement: inference has devices of its own but nothing to compute "
                             "(algorithm.recompute_logprobs is false and algorithm.kl_beta is 0); remove its entry")
        if separate and recompute and not load_from_actor:
            raise ValueError("inference.load_from_actor: false would score old log-probs with the starting policy "
                             "forever; algorithm.recompute_logprobs: true needs it true")
        return cls(separate=separate, group_name=group_name, load_from_actor=load_from_actor,
                   forward_micro_batch_size=forward_micro_batch_size)
