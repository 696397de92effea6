"""The built-in rewards: ``em``, ``subem``, ``f1`` and the format-aware ``format_em``.

Every reward takes the model's RESPONSE text, never the prompt: a prompt's example
``<answer> Beijing </answer>`` must not be graded. The agent loop hands over ``Trajectory.graded_text``:
the model's own spans, with every protocol tag taken out of the observations between them, so only
what the model wrote can be an answer. The answer graded is the last complete ``<answer>...</answer>``
(as Search-R1's reference does); extra answer tags cost nothing unless ``answer_tags_penalty`` is set. Rewards never raise on odd input: a None or
non-text response, no answer, an empty answer, or no usable gold answer all score 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rlinf_search.rewards.normalize import exact_match, normalize_answer, substring_match, token_f1
from rlinf_search.rewards.tags import check_structure, count_answer_tags, last_answer

Metric = Callable[[str, list[str]], float]


def as_gold_list(golden_answers: Any) -> list[str]:
    """Gold answers as strings: one string, or any iterable of them (a list, a numpy array)."""
    if golden_answers is None:
        return []
    if isinstance(golden_answers, str):
        return [golden_answers]
    try:
        items: Iterable[Any] = list(golden_answers)
    except TypeError:
        return [str(golden_answers)]
    return [str(item) for item in items if item is not None]


def _answer_score(metric: Metric, solution_str: Any, golden_answers: Any, *,
                  max_answer_tags: int, answer_tags_penalty: float) -> float:
    """``metric`` on the last answer, less ``answer_tags_penalty`` if there are too many answer tags."""
    if not isinstance(solution_str, str):
        return 0.0
    answer, golds = last_answer(solution_str), as_gold_list(golden_answers)
    if not answer or not golds:
        return 0.0
    score = metric(answer, golds)
    if count_answer_tags(solution_str) > max_answer_tags:
        # Subtracted and floored at 0, so the reward stays in [0, 1] for any penalty.
        score = max(0.0, score - answer_tags_penalty)
    return float(score)


def em_reward(solution_str: Any, golden_answers: Any, *, max_answer_tags: int = 1,
              answer_tags_penalty: float = 0.0) -> float:
    """Exact match of the last answer with any gold answer, after normalisation.

    Args:
        max_answer_tags: how many ``<answer>`` tags a response may hold before the penalty applies.
            The agent loop stops at ``</answer>``, so a second tag means the model hedged inside one
            turn (``<answer>London</answer> wait <answer>Paris</answer>`` from an engine without stops).
        answer_tags_penalty: taken off the score (floored at 0) past ``max_answer_tags``. The default
            0.0 grades the last complete answer, like Search-R1; 1.0 zeroes hedged responses.
    """
    return _answer_score(exact_match, solution_str, golden_answers, max_answer_tags=max_answer_tags,
                         answer_tags_penalty=answer_tags_penalty)


def subem_reward(solution_str: Any, golden_answers: Any, *, max_answer_tags: int = 1,
                 answer_tags_penalty: float = 0.0) -> float:
    """1.0 if a normalised gold answer is a substring of the normalised last answer (see ``em``)."""
    return _answer_score(substring_match, solution_str, golden_answers, max_answer_tags=max_answer_tags,
                         answer_tags_penalty=answer_tags_penalty)


def f1_reward(solution_str: Any, golden_answers: Any, *, max_answer_tags: int = 1,
              answer_tags_penalty: float = 0.0) -> float:
    """Best SQuAD token F1 of the last answer against any gold answer (see ``em`` for the kwargs)."""
    return _answer_score(token_f1, solution_str, golden_answers, max_answer_tags=max_answer_tags,
                         answer_tags_penalty=answer_tags_penalty)


def _retrieved_gold(solution_str: str, golds: list[str]) -> bool:
    """Whether a gold answer appears (normalised) in any ``<information>`` block of the response."""
    blocks = [part.split("</information>", 1)[0] for part in solution_str.split("<information>")[1:]]
    texts = [normalize_answer(block) for block in blocks]
    return any(gold and gold in text for gold in map(normalize_answer, golds) for text in texts)


def format_em_reward(solution_str: Any, golden_answers: Any, *,
                     correct_format_correct_answer: float = 1.0,
                     wrong_format_correct_answer: float = 0.8,
                     correct_format_wrong_answer: float = 0.2,
                     wrong_format_wrong_answer: float = 0.1,
                     no_answer: float = 0.0,
                     retrieval_score: float = 0.0,
                     require_think: bool = False) -> float:
    """Exact match with partial credit for the protocol's tag structure (Search-R1's format reward).

    The structure is checked by :func:`rlinf_search.rewards.tags.check_structure`; "correct
    answer" is ``em`` of the last complete answer. The defaults are Search-R1's with its
    ``structure_format_score`` 0.2 and ``final_format_score`` 0.1. Correctness outweighs format
    in every case, so a policy never gains by trading a right answer for tidier tags.

    Args:
        correct_format_correct_answer: valid structure and a right answer (Search-R1's ``score``).
        wrong_format_correct_answer: a right last answer in a broken structure (stray text, a
            missing ``</think>``, several answers): Search-R1's ``score - structure_format_score``.
        correct_format_wrong_answer: valid structure, wrong answer: Search-R1's
            ``structure_format_score``, credit for following the protocol.
        wrong_format_wrong_answer: a broken structure that still holds a complete (wrong)
            answer: Search-R1's ``final_format_score``, credit for committing to an answer.
        no_answer: no complete ``<answer>...</answer>`` at all (or an empty one).
        retrieval_score: added to ``correct_format_wrong_answer`` when a gold answer appears in a
            retrieved ``<information>`` block (the search found it; the model failed to use it).
        require_think: also demand a ``<think>`` block before every search and before the answer.
    """
    if not isinstance(solution_str, str):
        return float(no_answer)
    answer, golds = last_answer(solution_str), as_gold_list(golden_answers)
    if not answer:
        return float(no_answer)
    correct = bool(golds) and exact_match(answer, golds) == 1.0
    valid = check_structure(solution_str, require_think=require_think).valid
    if correct:
        return float(correct_format_correct_answer if valid else wrong_format_correct_answer)
    if not valid:
        return float(wrong_format_wrong_answer)
    bonus = retrieval_score if retrieval_score and _retrieved_gold(solution_str, golds) else 0.0
    return float(correct_format_wrong_answer + bonus)
