"""``LogprobPlan``: who computes each log-prob pass of a training step, and which groups follow the actor's
weights. Decided once in ``validate_cfg``; the launcher, the runner and the weight-sync dtype all read it,
so the three can never disagree."""

from __future__ import annotations

from dataclasses import dataclass

SCORERS = ("actor", "inference")
"""Groups that run forward-only log-prob passes: the actor on its own devices, or an InferenceGroup."""


@dataclass(frozen=True)
class LogprobPlan:
    """The log-prob passes of a step and where they run."""

    old: str
    """Old-policy log-probs: ``engine`` (the rollout engine's own, ``algorithm.recompute_logprobs: false``),
    ``actor`` or ``inference`` (recomputed by that group with the policy that sampled)."""
    reference: str | None
    """Reference-policy log-probs (``algorithm.kl_beta`` > 0): ``actor`` or ``inference``; None: no KL term."""

    @classmethod
    def decide(cls, *, recompute: bool, kl: bool, separate: bool) -> LogprobPlan:
        """Both passes on the InferenceGroup when it has devices of its own (``InferenceConfig.separate``), else
        on the actor; the old pass only when ``recompute``, the reference pass only with ``kl``."""
        scorer = "inference" if separate else "actor"
        return cls(old=scorer if recompute else "engine", reference=scorer if kl else None)

    def __post_init__(self) -> None:
        if self.old not in ("engine", *SCORERS):
            raise ValueError(f"LogprobPlan.old must be engine, actor or inference, got {self.old!r}")
        if self.reference is not None and self.reference not in SCORERS:
            raise ValueError(f"LogprobPlan.reference must be actor, inference or None, got {self.reference!r}")
        if self.old in SCORERS and self.reference is not None and self.reference != self.old:
            raise ValueError("LogprobPlan: the old and reference passes run in one call, on one group")

    @property
    def recompute(self) -> bool:
        """Old log-probs are recomputed (else the engine's are used)."""
        return self.old != "engine"

    @property
    def kl(self) -> bool:
        """Reference log-probs are computed (the KL term is on)."""
        return self.reference is not None

    @property
    def scorer(self) -> str | None:
        """The group the step's forward-only call goes to; None when neither pass is needed."""
        return self.old if self.recompute else self.reference

    @property
    def launches_inference(self) -> bool:
        """An InferenceGroup is started (it computes at least one pass)."""
        return self.scorer == "inference"

    @property
    def weight_receivers(self) -> tuple[str, ...]:
        """Groups that load the actor's weights after every update: the rollout engines, and the InferenceGroup's
        policy copy when it recomputes old log-probs (its reference copy stays frozen)."""
        return ("rollout", "inference") if self.old == "inference" else ("rollout",)
