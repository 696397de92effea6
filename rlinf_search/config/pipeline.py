"""``runner.pipeline``: how a training step overlaps rollout and training, checked once at start-up.

- ``sync``: each step rolls out, scores, computes log-probs and trains in turn (the collocated default);
- ``overlap``: the next step's rollout runs while this step trains, one update behind (the default of a
  disaggregated placement, where rollout and actor have devices of their own);
- ``stream``: within a step, each finished GRPO group goes into a channel; reward, teacher and the log-prob
  passes take groups as they arrive, and the actor runs an optimizer step as soon as a mini-batch of scored
  groups is there, while the slowest trajectories are still being generated.
"""

from __future__ import annotations

from rlinf_search.config.schema import ConfigError
from rlinf_search.scheduler.placement import Placement
from rlinf_search.workers.inference.plan import LogprobPlan

PIPELINES = ("sync", "overlap", "stream")

# Estimators whose advantage for a trajectory reads only the rewards of its own group: a streamed
# mini-batch of whole groups gets the advantages the whole batch would give it. The others whiten over
# the batch (reinforce_plus_plus*) or need a critic (gae).
GROUP_LOCAL_ADVANTAGES = ("grpo", "grpo_no_std", "rloo")


def resolve_pipeline(value: str | None, *, placement: Placement, plan: LogprobPlan, adv_type: str,
                     ppo_epochs: int, n_minibatches: int, batch: int, critic: bool) -> str:
    """The step's pipeline: ``value`` (``runner.pipeline``) checked against the run, or the placement's
    default when None (``overlap`` when disaggregated, else ``sync``). Raises ``ConfigError`` in one line."""
    if value is None:
        return "overlap" if placement.mode == "disaggregated" else "sync"
    if value not in PIPELINES:
        raise ConfigError(f"runner.pipeline: unknown {value!r}; choose one of {', '.join(PIPELINES)}")
    if value == "overlap" and placement.mode != "disaggregated":
        raise ConfigError(f"runner.pipeline: overlap rolls out the next step while the actor trains, which needs "
                          f"rollout and actor on devices of their own (placement mode disaggregated, this one is "
                          f"{placement.mode})")
    if value == "stream":
        _check_stream(placement=placement, plan=plan, adv_type=adv_type, ppo_epochs=ppo_epochs,
                      n_minibatches=n_minibatches, batch=batch, critic=critic)
    return value


def _check_stream(*, placement: Placement, plan: LogprobPlan, adv_type: str, ppo_epochs: int,
                  n_minibatches: int, batch: int, critic: bool) -> None:
    shared = set(placement["rollout"].devices) & set(placement["actor"].devices)
    if shared and placement.topology.device_kind != "cpu":
        raise ConfigError("runner.pipeline: stream trains while the engines still generate, so rollout and actor "
                          "need devices of their own (a collocated engine holds the actor's GPUs until it is done)")
    if plan.old == "actor":
        raise ConfigError("runner.pipeline: stream needs old log-probs that stay put while the actor updates: set "
                          "algorithm.recompute_logprobs: false (the engine's) or give inference devices of its own")
    if critic or adv_type not in GROUP_LOCAL_ADVANTAGES:
        raise ConfigError(f"runner.pipeline: stream computes advantages a mini-batch of groups at a time, which "
                          f"needs a group-local estimator ({', '.join(GROUP_LOCAL_ADVANTAGES)}), not {adv_type}")
    if ppo_epochs != 1:
        raise ConfigError(f"runner.pipeline: stream trains each mini-batch once as it arrives; "
                          f"algorithm.ppo_epochs must be 1, got {ppo_epochs}")
    if batch % n_minibatches:
        raise ConfigError(f"runner.pipeline: stream builds mini-batches of whole groups; data.rollout_batch_size "
                          f"({batch}) must divide into algorithm.n_minibatches ({n_minibatches})")
