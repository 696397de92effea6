"""Rewards by name: the built-ins and any registered by the user."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlinf_search.registry import Registry
from rlinf_search.rewards.scores import em_reward, f1_reward, format_em_reward, subem_reward

RewardFn = Callable[..., float]
"""``fn(solution_str, golden_answers, **kwargs) -> float``; kwargs are the reward's own settings."""



def _callable(name: str, fn) -> None:
    if not callable(fn):
        raise TypeError(f"reward {name!r} must be callable, got {type(fn).__name__}")


REWARDS: Registry[RewardFn] = Registry("reward", check=_callable)
"""Reward functions by the name ``reward.score`` uses (or a dotted path to one)."""
for _name, _fn in (("em", em_reward), ("subem", subem_reward), ("f1", f1_reward), ("format_em", format_em_reward)):
    REWARDS.register(_name, _fn)


def register_reward(name: str, fn: RewardFn, *, overwrite: bool = False) -> None:
    """Make ``fn`` available to :func:`compute_score` as ``name``."""
    REWARDS.register(name, fn, overwrite=overwrite)


def get_reward(name: str) -> RewardFn:
    """The reward registered as ``name``, or the function a dotted path names; ValueError naming the
    known ones otherwise."""
    return REWARDS.resolve(name)


def compute_score(name: str, solution_str: Any, golden_answers: Any, **kwargs: Any) -> float:
    """Score one response with the reward ``name``.

    Args:
        name: a key of :data:`REWARDS` (``em``, ``subem``, ``f1``, ``format_em`` or a registered one), or a
            dotted path to a function.
        solution_str: the model's response text only (not the prompt).
        golden_answers: one gold answer or a list of them.
        kwargs: the reward's settings; an unknown one raises TypeError (a misspelt config key).
    """
    return float(get_reward(name)(solution_str, golden_answers, **kwargs))
