"""Rewards on hard cases: Unicode, punctuation, articles, odd tags, penalties and format payoffs."""

from __future__ import annotations

import numpy as np
import pytest

from rlinf_search.data.prompts import SEARCHR1_TEMPLATE
from rlinf_search.rewards import REWARDS, check_structure, compute_score, last_answer, normalize_answer, register_reward

TURN = ("<think>I should look it up.</think>\n<search> first nobel prize physics </search>\n\n"
        "<information>Doc 1(Title: \"Nobel Prize in Physics\") The first prize went to Wilhelm Röntgen."
        "</information>\n\n")
VALID_RIGHT = TURN + "<think>It was Röntgen.</think>\n<answer> Wilhelm Conrad Röntgen </answer>"
VALID_WRONG = TURN + "<think>Probably Einstein.</think>\n<answer> Albert Einstein </answer>"
GOLD = ["Wilhelm Conrad Röntgen"]


def em(response, gold, **kw) -> float:
    return compute_score("em", response, gold, **kw)


@pytest.mark.parametrize("text,expected", [
    ("The  Eiffel Tower!", "eiffel tower"),
    ("“The Godfather”", "godfather"),               # curly quotes are punctuation
    ("U.S.A.", "usa"),
    ("Rock ’n’ roll — live", "rock n roll live"),   # curly apostrophes and an em dash
    ("北京。", "北京"),                              # CJK full stop
    ("ＮＡＳＡ", "nasa"),                            # full-width letters
    ("Ro\u0308ntgen", "röntgen"),                   # decomposed accent composes
    ("$100", "100"),                                # SQuAD's ASCII set includes $
    ("theory of an anathema", "theory of anathema"),  # articles only as whole words
    ("A an THE", ""),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


@pytest.mark.parametrize("answer,gold,expected", [
    ("Wilhelm Conrad Ro\u0308ntgen", "Wilhelm Conrad Röntgen", 1.0),
    ("Wilhelm Conrad Rontgen", "Wilhelm Conrad Röntgen", 0.0),  # accents are not folded
    ("北京。", "北京", 1.0),
    ("北京市", "北京", 0.0),
    ("“The Godfather”", "Godfather", 1.0),
    ("An apple, a day!", "apple day", 1.0),
    ("the", "the", 0.0),  # nothing is left of either side to compare
])
def test_em_unicode_punctuation_articles(answer, gold, expected):
    assert em(f"<answer>{answer}</answer>", gold) == expected


def test_em_several_golds_and_gold_types():
    response = "<think>ok</think><answer>December 1972</answer>"
    assert em(response, ["14 December 1972 UTC", "December 1972"]) == 1.0
    assert em(response, np.array(["14 December 1972 UTC", "december 1972."])) == 1.0  # verl hands numpy arrays
    assert em(response, "December 1972") == 1.0
    assert em("<answer>1999</answer>", 1999) == 1.0
    assert em(response, ["14 December 1972 UTC"]) == 0.0


def test_subem_direction_gold_inside_answer():
    assert compute_score("subem", "<answer>in December 1972, UTC</answer>", ["December 1972"]) == 1.0
    # A short answer inside a long gold is not a match: subem is gold-in-answer, as in Search-R1.
    assert compute_score("subem", "<answer>1972</answer>", ["December 1972"]) == 0.0
    assert compute_score("subem", "<answer>北京市</answer>", ["北京"]) == 1.0
    # A gold that normalises to "" is skipped, or every answer would contain it.
    assert compute_score("subem", "<answer>anything</answer>", ["The", "..."]) == 0.0


@pytest.mark.parametrize("answer,golds,expected", [
    # 4 answer tokens, 2 gold tokens, 2 shared: P 2/4, R 2/2, F1 = 2*(1/2)(1)/(3/2) = 2/3
    ("the Eiffel Tower in Paris", ["Eiffel Tower"], 2 / 3),
    # against "obama": P 1/2, R 1 -> 2/3; against "michelle obama": P 1/2, R 1/2 -> 1/2; the best is kept
    ("Barack Obama", ["Michelle Obama", "Obama"], 2 / 3),
    # tokens counted with multiplicity: shared min(2,1)+min(2,1) = 2, P 2/4, R 2/3, F1 = 4/7
    ("New York New York", ["New York City"], 4 / 7),
    ("Paris", ["London"], 0.0),
    ("Wilhelm Conrad Röntgen", GOLD, 1.0),
])
def test_f1_partial_credit(answer, golds, expected):
    assert compute_score("f1", f"<answer>{answer}</answer>", golds) == pytest.approx(expected)


@pytest.mark.parametrize("name", ["em", "subem", "f1", "format_em"])
@pytest.mark.parametrize("response", [
    None, 42, b"<answer>Paris</answer>", "", "Paris", "I think it is Paris.",
    "<answer></answer>", "<answer>   </answer>", "<answer> Paris", "Paris </answer>",
])
def test_no_usable_answer_scores_zero(name, response):
    assert compute_score(name, response, ["Paris"]) == 0.0


@pytest.mark.parametrize("golds", [None, [], [None], ""])
def test_no_usable_gold_scores_zero(golds):
    for name in ("em", "subem", "f1"):
        assert compute_score(name, "<answer>Paris</answer>", golds) == 0.0


def test_answer_in_prompt_is_not_graded():
    prompt = SEARCHR1_TEMPLATE.replace("{question}", "What is the capital of China?")
    assert "<answer> Beijing </answer>" in prompt
    response = "<think>The capital is Beijing, I believe... no, I will say Shanghai.</think><answer>Shanghai</answer>"
    assert em(response, ["Beijing"]) == 0.0
    assert last_answer(response) == "Shanghai"


def test_only_the_last_answer_in_the_response_counts():
    """The reference grades the last complete answer; by default several answers cost nothing."""
    response = "<answer>London</answer> wait <answer>Paris</answer>"
    assert em(response, ["Paris"]) == 1.0
    assert em(response, ["London"]) == 0.0
    assert compute_score("subem", response, ["Paris"]) == compute_score("f1", response, ["Paris"]) == 1.0


def test_nested_and_unclosed_answer_tags():
    nested = "<answer><answer>Paris</answer></answer>"
    assert last_answer(nested) == "Paris"
    assert em(nested, ["Paris"]) == 1.0
    assert em(nested, ["Paris"], answer_tags_penalty=1.0) == 0.0  # two answer tags: the optional penalty
    assert not check_structure(nested).valid
    assert last_answer("<answer> Paris") is None
    assert em("<think>x</think><answer> Paris", ["Paris"]) == 0.0


def test_many_answer_tags_penalty_is_an_option():
    response = "<answer>Lyon</answer><answer>Paris</answer>"
    assert em(response, ["Paris"]) == 1.0
    assert em(response, ["Paris"], answer_tags_penalty=1.0) == 0.0
    assert em(response, ["Paris"], answer_tags_penalty=0.25) == 0.75
    assert em(response, ["Paris"], max_answer_tags=2) == 1.0
    assert em(response, ["Lyon"], answer_tags_penalty=0.25) == 0.0  # floored at 0
    # An unclosed extra tag counts too: the model went on writing after its answer.
    assert em("<answer>Paris</answer> <answer>", ["Paris"], answer_tags_penalty=1.0) == 0.0
    f1 = compute_score("f1", "<answer>x</answer><answer>the Eiffel Tower in Paris</answer>", ["Eiffel Tower"],
                       answer_tags_penalty=0.5)
    assert f1 == pytest.approx(2 / 3 - 0.5)


def test_format_em_four_payoffs_and_no_answer():
    broken_right = "Let me answer. <answer> Wilhelm Conrad Röntgen </answer>"   # text outside the tags
    broken_wrong = "<think>hmm<answer> Albert Einstein </answer>"               # <think> never closed
    assert compute_score("format_em", VALID_RIGHT, GOLD) == 1.0
    assert compute_score("format_em", broken_right, GOLD) == 0.8
    assert compute_score("format_em", VALID_WRONG, GOLD) == 0.2
    assert compute_score("format_em", broken_wrong, GOLD) == 0.1
    assert compute_score("format_em", TURN + "<think>done</think>", GOLD) == 0.0
    payoffs = dict(correct_format_correct_answer=2.0, wrong_format_correct_answer=1.5,
                   correct_format_wrong_answer=0.5, wrong_format_wrong_answer=0.25, no_answer=-1.0)
    scores = [compute_score("format_em", r, GOLD, **payoffs)
              for r in (VALID_RIGHT, broken_right, VALID_WRONG, broken_wrong, "no tags")]
    assert scores == [2.0, 1.5, 0.5, 0.25, -1.0]


def test_format_em_retrieval_bonus_and_require_think():
    # The gold is in the retrieved passage ("Röntgen" alone is not the gold, so use a gold that is).
    assert compute_score("format_em", VALID_WRONG, ["Wilhelm Röntgen"], retrieval_score=0.1) == pytest.approx(0.3)
    assert compute_score("format_em", VALID_WRONG, ["Marie Curie"], retrieval_score=0.1) == pytest.approx(0.2)
    no_think = "<answer> Wilhelm Conrad Röntgen </answer>"
    assert compute_score("format_em", no_think, GOLD) == 1.0
    assert compute_score("format_em", no_think, GOLD, require_think=True) == 0.8


@pytest.mark.parametrize("response,valid", [
    (VALID_RIGHT, True),
    (VALID_RIGHT + "<|im_end|>", True),  # an end marker left by the decoder is not content
    (TURN + TURN + "<answer>x</answer>\n", True),
    ("<answer>x</answer>", True),
    ("<think>a</think><think>b</think><answer>x</answer>", False),
    ("<search>q</search><answer>x</answer>", False),                      # search without its information
    ("<information>doc</information><answer>x</answer>", False),          # information without a search
    ("<answer>x</answer><think>after</think>", False),                    # answer not last
    ("<answer>x</answer><answer>y</answer>", False),                      # two answers
    ("<think>a <search>q</search></think><answer>x</answer>", False),     # nested
    ("<answer>x</answer> and that is all", False),                        # text after the answer
    ("</think><answer>x</answer>", False),                                # closing tag first
    ("<think>a</think>", False),                                          # no answer
])
def test_check_structure(response, valid):
    assert check_structure(response).valid is valid


def test_unknown_reward_and_unknown_setting():
    with pytest.raises(ValueError, match="unknown reward 'bleu'; known rewards: em, f1, format_em, subem"):
        compute_score("bleu", "<answer>x</answer>", ["x"])
    with pytest.raises(TypeError):
        compute_score("em", "<answer>x</answer>", ["x"], max_answer_tag=3)  # misspelt setting


def test_user_registered_reward():
    def shortest_answer_bonus(solution_str, golden_answers, *, bonus: float = 0.5) -> float:
        base = compute_score("em", solution_str, golden_answers)
        answer = last_answer(solution_str) or ""
        return base + (bonus if base and len(answer.split()) <= 2 else 0.0)

    register_reward("em_short", shortest_answer_bonus)
    try:
        assert compute_score("em_short", "<answer>Paris</answer>", ["Paris"]) == 1.5
        assert compute_score("em_short", "<answer>Paris</answer>", ["Paris"], bonus=0.1) == 1.1
        with pytest.raises(ValueError, match="already registered"):
            register_reward("em_short", shortest_answer_bonus)
    finally:
        REWARDS.unregister("em_short")
    assert "em_short" not in REWARDS
