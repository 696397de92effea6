"""``runner.pipeline``: how a training step overlaps rollout and training, checked once at start-up.

- ``sync``: each step rolls out, scores, computes log-probs and trains in turn (the collocated default);
- ``stream``: within a step, each finished GRPO group goes into a channel; reward, teacher and the log-prob
  passes take groups as they arrive, and the actor runs an optimizer step as soon as a mini-batch of scored
  groups is there, while the slowest trajectories are still being generated; on-policy;
- ``async``: the rollout runs up to ``runner.max_staleness`` steps ahead of the update and never waits for it;
  the engines take new weights at a token boundary (``runner.partial_rollout``); every token records the policy
  version that generated it, and the loss corrects for the lag (``algorithm.mismatch_correction``, on by default);
- ``overlap``: ``async`` at step granularity: one step ahead, new weights only once no rollout is in flight,
  and the update takes the whole step at once (the default of a disaggregated placement).
"""

from __future__ import annotations

from rlinf_search.algorithms import ADVANTAGE_ESTIMATORS, estimators_with, traits_of
from rlinf_search.config.runner import PipelineSettings
from rlinf_search.config.schema import ConfigError
from rlinf_search.scheduler.placement import Placement
from rlinf_search.workers.inference.plan import LogprobPlan

ASYNC_CORRECTION = "tis"
"""``algorithm.mismatch_correction`` when an asynchronous pipeline leaves it unset (docs/runtime.md says why)."""




def resolve_pipeline(value: str | None, *, max_staleness: int, partial_rollout: bool, written: set[str],
                     placement: Placement, plan: LogprobPlan, adv_type: str, ppo_epochs: int, n_minibatches: int,
                     batch: int, critic: bool) -> PipelineSettings:
    """The step's pipeline: ``value`` (``runner.pipeline``) checked against the run, or the placement's default
    when None (``overlap`` when disaggregated, else ``sync``); ``max_staleness`` and ``partial_rollout``:
    ``runner.max_staleness`` and ``runner.partial_rollout``; ``written``: which
    of the two the config sets. Raises ``ConfigError`` in one line."""
    if value is None:
        value = "overlap" if placement.mode == "disaggregated" else "sync"
    if value != "async":
        for key in ("max_staleness", "partial_rollout"):
            if key in written:
                detail = (" (overlap is async with max_staleness 1 and partial_rollout false; set runner.pipeline: "
                          "async to choose them)" if value == "overlap" else "")
                raise ConfigError(f"runner.{key}: only runner.pipeline async reads it, this run is {value}{detail}")
    if value == "overlap":
        if placement.mode != "disaggregated":
            raise ConfigError(f"runner.pipeline: overlap rolls out the next step while the actor trains, which needs "
                              f"rollout and actor on devices of their own (placement mode disaggregated, this one is "
                              f"{placement.mode})")
        return PipelineSettings("overlap", max_staleness=1, partial_rollout=False)
    if value == "stream":
        _check_minibatch_stream(value, placement=placement, adv_type=adv_type, ppo_epochs=ppo_epochs,
                                n_minibatches=n_minibatches, batch=batch, critic=critic)
        if plan.old == "actor":
            raise ConfigError("runner.pipeline: stream needs old log-probs that stay put while the actor updates: set "
                              "algorithm.recompute_logprobs: false (the engine's) or give inference devices of its own")
        return PipelineSettings("stream")
    if value == "async":
        _check_minibatch_stream(value, placement=placement, adv_type=adv_type, ppo_epochs=ppo_epochs,
                                n_minibatches=n_minibatches, batch=batch, critic=critic)
        return PipelineSettings("async", max_staleness=max_staleness, partial_rollout=partial_rollout)
    return PipelineSettings("sync")


def _check_minibatch_stream(value: str, *, placement: Placement, adv_type: str, ppo_epochs: int, n_minibatches: int,
                            batch: int, critic: bool) -> None:
    """What training each mini-batch of groups as it is ready needs (``stream`` and ``async``)."""
    shared = set(placement["rollout"].devices) & set(placement["actor"].devices)
    if shared and placement.topology.device_kind != "cpu":
        raise ConfigError(f"runner.pipeline: {value} trains while the engines still generate, so rollout and actor "
                          "need devices of their own (a collocated engine holds the actor's GPUs until it is done)")
    # A group-local estimator gives a streamed mini-batch of whole groups the advantages the whole batch would; the
    # others whiten over the batch (reinforce_plus_plus*) or need a critic (gae). Each declares it (AdvantageTraits).
    if critic or not traits_of(ADVANTAGE_ESTIMATORS.resolve(adv_type)).group_local:
        raise ConfigError(f"runner.pipeline: {value} computes advantages a mini-batch of groups at a time, which "
                          f"needs a group-local estimator ({', '.join(estimators_with(group_local=True))}, or "
                          f"yours declared with @advantage_traits(group_local=True)), not {adv_type}")
    if ppo_epochs != 1:
        raise ConfigError(f"runner.pipeline: {value} trains each mini-batch once as it arrives; "
                          f"algorithm.ppo_epochs must be 1, got {ppo_epochs}")
    if batch % n_minibatches:
        raise ConfigError(f"runner.pipeline: {value} builds mini-batches of whole groups; data.rollout_batch_size "
                          f"({batch}) must divide into algorithm.n_minibatches ({n_minibatches})")


def async_correction(settings: PipelineSettings, *, written: str | None, present: bool, recompute: bool) -> str | None:
    """``algorithm.mismatch_correction`` for the run: as written (``present``: the key is in the config, null
    turning it off), else ``tis`` when the rollout runs ahead and old log-probs are recomputed. Ahead of the update
    the engine's log-probs are the behaviour policy's and the recomputed ones the proximal policy's; the
    correction weighs each token by their ratio. Without recompute the two are the same numbers, so a correction
    written there would do nothing: refused in one line."""
    if not settings.ahead:
        return written
    if not recompute:
        if written is not None:
            raise ConfigError(f"algorithm.mismatch_correction: {written} compares recomputed old log-probs with the "
                              f"engine's, but algorithm.recompute_logprobs is false, so they are the same numbers; "
                              f"set recompute_logprobs: true (the {settings.name} default) or drop the key")
        return None
    return written if present else ASYNC_CORRECTION
