"""What a batch of trajectories says about the policy's health, beyond reward: is the reasoning repeating itself,
is the answer format breaking, and do the searches still find the answer.

The last tells a collapse's two causes apart: searches that stop returning a passage with the gold answer point at
the queries (the policy) when the retriever is the same, or at the retriever when the queries did not change.

All three read ``Trajectory.graded_text``: the model's spans as written, search results inside their
``<information>`` wrapper, every other protocol tag of an observation taken out, so both protocols read the same way.
"""

from __future__ import annotations

import re

from rlinf_search.data.io_struct import Trajectory
from rlinf_search.rewards.normalize import normalize_answer

INFORMATION = re.compile(r"<information>(.*?)</information>", re.DOTALL)
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
TAGS = ("think", "search", "answer")
REPEAT_N = 3
"""Word n-grams a repetition is counted in: a phrase of three words said again."""


def model_text(traj: Trajectory) -> str:
    """The graded text without the search results: what the policy wrote."""
    return INFORMATION.sub(" ", traj.graded_text)


def repetition_share(text: str, n: int = REPEAT_N) -> float:
    """Share of the text's word n-grams that already occurred earlier in it (0: none repeated; a model looping on
    one phrase tends to 1)."""
    words = text.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def format_broken(text: str) -> bool:
    """No ``<answer>...</answer>``, or a tag of the protocol opened and closed a different number of times."""
    if not ANSWER.search(text):
        return True
    return any(text.count(f"<{tag}>") != text.count(f"</{tag}>") for tag in TAGS)


def retrieval_hits(traj: Trajectory) -> tuple[int, int]:
    """(search results holding a gold answer, search results): an answer counts when its normalised words appear
    in the normalised passage text."""
    golds = [normalize_answer(g) for g in traj.golden_answers if normalize_answer(g)]
    blocks = INFORMATION.findall(traj.graded_text)
    hits = sum(any(f" {g} " in f" {normalize_answer(block)} " for g in golds) for block in blocks)
    return hits, len(blocks)


def quality_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """``rollout/repetition_share`` (mean over trajectories), ``rollout/format_violation_rate`` (share of
    trajectories), ``rollout/retrieval_hit_rate`` (share of search results holding a gold answer; absent when no
    search returned anything)."""
    if not trajectories:
        return {}
    texts = [model_text(t) for t in trajectories]
    metrics = {"rollout/repetition_share": sum(map(repetition_share, texts)) / len(texts),
               "rollout/format_violation_rate": sum(map(format_broken, texts)) / len(texts)}
    hits = [retrieval_hits(t) for t in trajectories]
    results = sum(total for _, total in hits)
    if results:
        metrics["rollout/retrieval_hit_rate"] = sum(found for found, _ in hits) / results
    return metrics
