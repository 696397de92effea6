"""Teacher log-probs placed on student tokens (shared tokenizer; different tokenizers are in
test_distill_tokenizers.py), character extents on real text, and the advantage term, on hand-made cases
with exact expected values."""

from __future__ import annotations

import math

import pytest
import torch

from rlinf_search.section_model import parse_section
from rlinf_search.distill.alignment import char_extents, from_shared_ids
from rlinf_search.distill.config import DistillConfig, TeacherConfig
from rlinf_search.distill.signal import combine, distill_term, reverse_kl, turn_ids
from rlinf_search.distill.teacher import TopK


def test_shared_tokenizer_takes_the_value_at_the_same_position():
    # prompt of 2 tokens, response of 4: model, model, observation, model
    teacher = [None, -0.5, -1.0, -2.0, -3.0, -4.0]
    aligned = from_shared_ids(teacher, prompt_length=2, response_mask=[1, 1, 0, 1])
    assert aligned.values == [-1.0, -2.0, 0.0, -4.0]
    assert aligned.scored == [True, True, False, True] and aligned.unaligned == 0


def test_shared_tokenizer_counts_a_missing_value_as_unaligned():
    aligned = from_shared_ids([None, None, -1.0], prompt_length=1, response_mask=[1, 1])
    assert aligned.scored == [False, True] and aligned.unaligned == 1


def test_char_extents_follow_growing_prefixes():
    pieces = {1: "he", 2: "llo", 3: " w", 4: "\ufffd"}

    def decode(ids):
        text = "".join(pieces[i] for i in ids)
        return text if not text.endswith("\ufffd") else text

    assert char_extents(decode, [1, 2, 3]) == [(0, 2), (2, 5), (5, 7)]
    assert char_extents(decode, [1, 4]) == [(0, 2), None]


def _prefix_extents(decode, ids):
    """The definition: each token's growth of the decoded prefix (quadratic; ``char_extents`` is linear)."""
    extents, previous = [], 0
    for end in range(1, len(ids) + 1):
        text = decode(ids[:end])
        if text.endswith("\ufffd"):
            extents.append(None)
            continue
        extents.append((previous, len(text)))
        previous = len(text)
    return extents


MIXED_TEXT = " Zoë Saldaña, Ærø and Łódź; 東京は日本の首都 🇯🇵 👩‍👩‍👧 — <answer>São Paulo</answer>"


def test_char_extents_are_the_prefix_growth_on_accents_cjk_and_emoji(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer(MIXED_TEXT, add_special_tokens=False)["input_ids"]
    extents = char_extents(tokenizer.decode, ids)
    assert extents == _prefix_extents(tokenizer.decode, ids)
    assert None in extents  # some characters take several byte tokens here
    assert max(e[1] for e in extents if e) == len(tokenizer.decode(ids))


def _config(**overrides) -> DistillConfig:
    return DistillConfig(teacher=TeacherConfig(model="teacher"), **overrides)


def test_the_term_is_minus_coef_times_kl_on_model_tokens():
    student = torch.tensor([[-1.0, -2.0, -0.5, -1.0]])
    teacher = torch.tensor([[-1.5, -1.0, -9.0, -1.0]])
    scored = torch.tensor([[True, True, False, False]])
    mask = torch.tensor([[1, 1, 0, 1]])
    kl = reverse_kl(student, teacher, scored)
    assert kl.tolist() == [[0.5, -1.0, 0.0, 0.0]]
    term = distill_term(kl, scored, mask, _config(coef=2.0, center=False))
    assert term.tolist() == [[-1.0, 2.0, 0.0, 0.0]]
    clipped = distill_term(kl, scored, mask, _config(coef=2.0, clip=1.5, center=False))
    assert clipped.tolist() == [[-1.0, 1.5, 0.0, 0.0]]
    # Centred: the scored tokens' mean KL (-0.25) is the baseline; unscored tokens stay at 0.
    centred = distill_term(kl, scored, mask, _config(coef=2.0))
    assert centred.tolist() == [[-1.5, 1.5, 0.0, 0.0]]


def test_discount_sums_the_rest_of_the_turn_only():
    # turn 1: tokens 0-1, observation: token 2, turn 2: token 3
    mask = torch.tensor([[1, 1, 0, 1]])
    assert turn_ids(mask).tolist() == [[1, 1, 1, 2]]
    kl = torch.tensor([[1.0, 2.0, 0.0, 4.0]])
    scored = mask.bool()
    term = distill_term(kl, scored, mask, _config(discount=0.5, center=False))
    # token 0: 1 + 0.5 * 2 = 2; token 1: 2 (the observation adds nothing, turn 2 is not summed); token 3: 4
    assert term.tolist() == [[-2.0, -2.0, 0.0, -4.0]]


def test_centring_comes_after_the_discounted_sum_so_length_adds_no_bias():
    """Two trajectories with the same total KL (3) reach their first token with the same term, whatever their
    length: the baseline is the mean of what each token answers for, taken after the sum. (Centred first, the
    3-token row's first token got -1.5 x coef and the 1-token row's +1.5 x coef.)"""
    kl = torch.tensor([[1.0, 1.0, 1.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    term = distill_term(kl, mask.bool(), mask, _config(discount=1.0))
    # sums: row 0 (3, 2, 1), row 1 (3); their mean 2.25 is the baseline
    assert term.tolist() == [[-0.75, 0.25, 1.25], [-0.75, 0.0, 0.0]]


def test_add_and_only_modes():
    advantages = torch.tensor([[1.0, 1.0, 0.0]])
    term = torch.tensor([[-0.5, 0.25, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    assert combine(advantages, term, mask, _config(mode="add")).tolist() == [[0.5, 1.25, 0.0]]
    assert combine(advantages, term, mask, _config(mode="only")).tolist() == [[-0.5, 0.25, 0.0]]


def test_coef_zero_measures_and_leaves_grpo_as_it_is():
    advantages = torch.tensor([[0.7, -0.3, 0.0, 1.1]])
    kl = torch.tensor([[2.0, -1.0, 0.0, 0.5]])
    mask = torch.tensor([[1, 1, 0, 1]])
    config = _config(coef=0.0, clip=5.0)
    term = distill_term(kl, mask.bool(), mask, config)
    assert torch.equal(combine(advantages, term, mask, config), advantages)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"mode": "sum"}, "algorithm.distill.mode: unknown 'sum'"),
    ({"coef": -0.5}, "algorithm.distill.coef must be >= 0"),
    ({"coef": 0.0, "mode": "only"}, "would train on nothing"),
    ({"discount": 1.5}, "algorithm.distill.discount must be in"),
    ({"clip": -1.0}, "algorithm.distill.clip must be > 0"),
    ({"top_k": 21}, r"algorithm.distill.top_k must be in \[0, 20\]"),
    ({"top_k": 4, "top_k_coef": 0.0}, "algorithm.distill.top_k_coef must be > 0"),
])
def test_bad_settings_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        parse_section(DistillConfig, {"teacher": {"model": "teacher"}, **overrides}, path="algorithm.distill")


def test_top_k_needs_a_shared_tokenizer_and_may_train_alone():
    with pytest.raises(ValueError, match="top_k needs a teacher that shares the student's tokenizer"):
        DistillConfig(teacher=TeacherConfig(model="t", tokenizer="Qwen/Qwen3-30B-A3B"), top_k=4)
    assert _config(coef=0.0, mode="only", top_k=4).top_k == 4  # the top-k KL is then the whole signal


def test_shared_tokenizer_carries_the_teachers_top_k_on_scored_tokens():
    teacher = [None, -0.1, -0.2, -0.3, -0.4]
    inf = math.inf  # the server gave no top for the first and the last position
    top = TopK(ids=torch.tensor([[0, 0], [5, 0], [6, 9], [7, 0], [0, 0]]),
               logprobs=torch.tensor([[-inf, -inf], [-0.1, -inf], [-0.2, -2.0], [-0.3, -inf], [-inf, -inf]]))
    aligned = from_shared_ids(teacher, prompt_length=2, response_mask=[1, 0, 1], top=top)
    assert aligned.scored == [True, False, False] and aligned.unaligned == 1
    assert aligned.top.ids.tolist() == [[6, 9], [0, 0], [0, 0]]
    assert aligned.top.logprobs.tolist() == [[pytest.approx(-0.2), -2.0], [-inf, -inf], [-inf, -inf]]


def test_teacher_settings_name_the_key():
    with pytest.raises(ValueError, match="algorithm.distill.teacher.model is required"):
        TeacherConfig()
    with pytest.raises(ValueError, match="algorithm.distill.teacher.base_url"):
        TeacherConfig(model="t", base_url="localhost:8001")
    with pytest.raises(ValueError, match="algorithm.distill.teacher.api_key: unknown key"):
        TeacherConfig.from_dict({"model": "t", "api_key": "sk-secret"})
    assert math.isfinite(TeacherConfig(model="t").deadline_s)
