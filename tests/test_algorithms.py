"""Advantage estimators and the registries, against numbers worked out by hand in the comments."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch

from rlinf_search.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageOutput,
    compute_advantages,
    register_advantage,
)
from rlinf_search.algorithms.advantages import grpo

EPS = 1e-6


def close(actual: torch.Tensor, expected) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=1e-5, atol=1e-6)


# Two groups of three with interleaved string uids, plus a group of one. Row 1 has an observation
# gap (t=1) and row 3 is padded, so masking is exercised too.
UIDS = ["q1", "q2", "q1", "q2", "q1", "q2", "lonely"]
REWARDS = torch.tensor([1.0, 2.0, 0.0, 0.0, 0.0, 1.0, 1.0])
#                        q1   q2   q1   q2   q1   q2  lonely
MASK = torch.tensor([
    [1, 1, 1],
    [1, 0, 1],
    [1, 1, 1],
    [1, 1, 0],
    [1, 1, 1],
    [1, 1, 1],
    [1, 1, 1],
])


def per_row(values: list[float]) -> torch.Tensor:
    """Each row's advantage broadcast to its model tokens, 0 elsewhere."""
    return torch.tensor(values).unsqueeze(-1) * MASK


def test_grpo_unbiased_std_eps_interleaved_groups_and_singleton():
    # q1 = [1, 0, 0]: mean 1/3, deviations 2/3, -1/3, -1/3; squares sum 4/9 + 1/9 + 1/9 = 2/3;
    #   unbiased var = (2/3) / (3 - 1) = 1/3, std = sqrt(1/3) = 0.57735 (population std would be 0.4714).
    # q2 = [2, 0, 1]: mean 1, deviations 1, -1, 0; var = 2 / 2 = 1, std = 1.
    # lonely: a group of one -> 0.
    s1, s2 = math.sqrt(1 / 3) + EPS, 1.0 + EPS
    expected = per_row([(2 / 3) / s1, 1 / s2, (-1 / 3) / s1, -1 / s2, (-1 / 3) / s1, 0.0, 0.0])
    out = compute_advantages("grpo", response_mask=MASK, rewards=REWARDS, uids=UIDS)
    close(out.advantages, expected)
    close(out.returns, expected)
    assert out.advantages[1, 1] == 0 and out.advantages[3, 2] == 0  # observation and padding tokens
    assert out.advantages[0, 0] == pytest.approx(1.1547, abs=1e-4)  # 2/sqrt(3), not sqrt(2) = 1.414


def test_grpo_uids_as_tensor_group_by_value():
    by_string = compute_advantages("grpo", response_mask=MASK, rewards=REWARDS, uids=UIDS).advantages
    by_tensor = compute_advantages("grpo", response_mask=MASK, rewards=REWARDS,
                                   uids=torch.tensor([1, 2, 1, 2, 1, 2, 3])).advantages
    close(by_tensor, by_string)


def test_grpo_equal_rewards_give_zero_not_nan():
    # std = 0: (r - mean) / (0 + eps) = 0 / eps = 0.
    out = compute_advantages("grpo", response_mask=torch.ones(3, 2), rewards=torch.ones(3), uids=[7, 7, 7])
    close(out.advantages, torch.zeros(3, 2))


def test_grpo_sums_token_rewards_over_model_tokens_only():
    # Row 0's sequence reward = 0.25 + 0.75 (the 100 sits on an observation token) = 1; row 1's = 0.
    # Group [1, 0]: mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = 0.7071 -> +-0.5 / (0.7071 + eps).
    token_rewards = torch.tensor([[0.25, 100.0, 0.75], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 1], [1, 1, 1]])
    out = compute_advantages("grpo", response_mask=mask, token_rewards=token_rewards, uids=["a", "a"])
    a = 0.5 / (math.sqrt(0.5) + EPS)
    close(out.advantages, [[a, 0.0, a], [-a, -a, -a]])


def test_grpo_no_std():
    # q1: r - 1/3 = 2/3, -1/3, -1/3; q2: r - 1 = 1, -1, 0; lonely: 1 - 1 = 0.
    out = compute_advantages("grpo_no_std", response_mask=MASK, rewards=REWARDS, uids=UIDS)
    close(out.advantages, per_row([2 / 3, 1.0, -1 / 3, -1.0, -1 / 3, 0.0, 0.0]))


def test_rloo_leave_one_out_identity():
    # q1 = [1, 0, 0]: 1 - (0+0)/2 = 1, 0 - (1+0)/2 = -0.5, -0.5; check: 3/2 * (1 - 1/3) = 1.
    # q2 = [2, 0, 1]: 2 - (0+1)/2 = 1.5, 0 - (2+1)/2 = -1.5, 1 - (2+0)/2 = 0; check: 3/2 * (2 - 1) = 1.5.
    out = compute_advantages("rloo", response_mask=MASK, rewards=REWARDS, uids=UIDS)
    close(out.advantages, per_row([1.0, 1.5, -0.5, -1.5, -0.5, 0.0, 0.0]))
    no_std = compute_advantages("grpo_no_std", response_mask=MASK, rewards=REWARDS, uids=UIDS).advantages
    close(out.advantages[:6], 1.5 * no_std[:6])  # G/(G-1) (r - mean) with G = 3


RF_MASK = torch.tensor([[1, 0, 1, 1], [1, 1, 0, 0]])  # row 0: observation at t=1; row 1: padded


def test_reinforce_plus_plus_whitens_over_model_tokens():
    # gamma = 1, rewards [1, 0] on each last model token: returns row 0 = [1, _, 1, 1], row 1 = [0, 0].
    # Model-token returns {1, 1, 1, 0, 0}: mean 0.6; deviations 0.4 (x3), -0.6 (x2);
    # squares 3 * 0.16 + 2 * 0.36 = 1.2; unbiased var = 1.2 / 4 = 0.3.
    out = compute_advantages("reinforce_plus_plus", response_mask=RF_MASK, rewards=torch.tensor([1.0, 0.0]))
    hi, lo = 0.4 / math.sqrt(0.3 + 1e-8), -0.6 / math.sqrt(0.3 + 1e-8)  # 0.7303, -1.0954
    close(out.advantages, [[hi, 0.0, hi, hi], [lo, lo, 0.0, 0.0]])
    close(out.returns, [[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])


def test_reinforce_plus_plus_discount_skips_observation_tokens():
    # gamma = 0.5, reward 1 at t=3: t=3 -> 1, t=2 -> 0.5, t=0 -> 0.25 (t=1 is an observation, not a step).
    # (Resetting the running return on the observation, as verl does, would give t=0 -> 0.)
    out = compute_advantages("reinforce_plus_plus", response_mask=RF_MASK, rewards=torch.tensor([1.0, 0.0]),
                             gamma=0.5)
    close(out.returns, [[0.25, 0.0, 0.5, 1.0], [0.0, 0.0, 0.0, 0.0]])


def test_reinforce_plus_plus_baseline_subtracts_group_mean_then_whitens():
    # Group a = rows 0, 1 with rewards [1, 0] -> mean 0.5 -> centred +0.5, -0.5; group b = row 2 alone -> 0.
    # gamma = 1 returns: row 0 = [.5, .5, .5], row 1 = [-.5, _, -.5] (obs at t=1), row 2 = [0, 0, _] (pad).
    # 7 model tokens, sum 1.5 - 1 = 0.5, mean 1/14; deviations 3/7 (x3), -4/7 (x2), -1/14 (x2);
    # squares 27/49 + 32/49 + 2/196 = 119/98; unbiased var = 119/98 / 6 = 119/588.
    mask = torch.tensor([[1, 1, 1], [1, 0, 1], [1, 1, 0]])
    out = compute_advantages("reinforce_plus_plus_baseline", response_mask=mask,
                             rewards=torch.tensor([1.0, 0.0, 1.0]), uids=["a", "a", "b"])
    std = math.sqrt(119 / 588 + 1e-8)
    p, n, z = (3 / 7) / std, (-4 / 7) / std, (-1 / 14) / std  # 0.9527, -1.2702, -0.1588
    close(out.advantages, [[p, p, p], [n, 0.0, n], [z, z, 0.0]])
    close(out.returns, [[0.5, 0.5, 0.5], [-0.5, 0.0, -0.5], [0.0, 0.0, 0.0]])


# GAE row 0: model tokens t=0, 1, 4 with an observation gap at t=2, 3 whose "values" are junk (9.0);
# reward 1 on t=4. Row 1: padded after t=1, reward 0.
GAE_MASK = torch.tensor([[1, 1, 0, 0, 1], [1, 1, 0, 0, 0]])
GAE_VALUES = torch.tensor([[0.5, 0.2, 9.0, 9.0, 0.4], [0.3, 0.1, 9.0, 9.0, 9.0]])
GAE_REWARDS = torch.tensor([1.0, 0.0])


def test_gae_gamma_lambda_one_skips_observation_gap():
    # gamma = lam = 1: A_t = (sum of later rewards) - V_t.
    # Row 0: t=4: 1 + 0 - 0.4 = 0.6; t=1 (successor t=4): delta 0 + 0.4 - 0.2 = 0.2, A = 0.2 + 0.6 = 0.8;
    #        t=0: delta 0 + 0.2 - 0.5 = -0.3, A = -0.3 + 0.8 = 0.5. Returns A + V = 1, 1, 1.
    # Row 1: t=1: 0 - 0.1 = -0.1; t=0: 0 + 0.1 - 0.3 = -0.2, A = -0.3. Returns 0, 0.
    out = compute_advantages("gae", response_mask=GAE_MASK, rewards=GAE_REWARDS, values=GAE_VALUES,
                             gamma=1.0, lam=1.0, normalize_advantages=False)
    close(out.advantages, [[0.5, 0.8, 0.0, 0.0, 0.6], [-0.3, -0.1, 0.0, 0.0, 0.0]])
    close(out.returns, [[1.0, 1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0]])


def test_gae_discounted_skips_observation_gap():
    # gamma = 0.9, lam = 0.8, gamma * lam = 0.72. Row 0:
    #   t=4: delta = 1 + 0.9 * 0 - 0.4 = 0.6;              A4 = 0.6
    #   t=1: delta = 0 + 0.9 * 0.4 - 0.2 = 0.16;           A1 = 0.16 + 0.72 * 0.6 = 0.592
    #   t=0: delta = 0 + 0.9 * 0.2 - 0.5 = -0.32;          A0 = -0.32 + 0.72 * 0.592 = 0.10624
    #   returns: 0.60624, 0.792, 1.0
    # Row 1: t=1: delta = 0 - 0.1 = -0.1, A = -0.1; t=0: delta = 0.9 * 0.1 - 0.3 = -0.21,
    #   A = -0.21 + 0.72 * -0.1 = -0.282; returns 0.018, 0.0.
    # (Running through the gap with V = 9 would give t=1: 0.9 * 9 - 0.2 = 7.9, far off.)
    out = compute_advantages("gae", response_mask=GAE_MASK, rewards=GAE_REWARDS, values=GAE_VALUES,
                             gamma=0.9, lam=0.8, normalize_advantages=False)
    close(out.advantages, [[0.10624, 0.592, 0.0, 0.0, 0.6], [-0.282, -0.1, 0.0, 0.0, 0.0]])
    close(out.returns, [[0.60624, 0.792, 0.0, 0.0, 1.0], [0.018, 0.0, 0.0, 0.0, 0.0]])


def test_gae_whitening_over_model_tokens_keeps_returns_raw():
    # gamma = lam = 1 advantages on model tokens: 0.5, 0.8, 0.6, -0.3, -0.1; sum 1.5, mean 0.3;
    # deviations 0.2, 0.5, 0.3, -0.6, -0.4; squares 0.04 + 0.25 + 0.09 + 0.36 + 0.16 = 0.9; var = 0.9 / 4.
    out = compute_advantages("gae", response_mask=GAE_MASK, rewards=GAE_REWARDS, values=GAE_VALUES)
    s = math.sqrt(0.225 + 1e-8)
    close(out.advantages, [[0.2 / s, 0.5 / s, 0.0, 0.0, 0.3 / s], [-0.6 / s, -0.4 / s, 0.0, 0.0, 0.0]])
    close(out.returns, [[1.0, 1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0]])


def test_inputs_are_checked():
    with pytest.raises(ValueError, match="exactly one"):
        compute_advantages("grpo", response_mask=MASK, uids=UIDS)
    with pytest.raises(ValueError, match="uids"):
        compute_advantages("grpo", response_mask=MASK, rewards=REWARDS)
    with pytest.raises(ValueError, match="values"):
        compute_advantages("gae", response_mask=MASK, rewards=REWARDS)
    with pytest.raises(ValueError, match="uids has 2"):
        compute_advantages("grpo", response_mask=MASK, rewards=REWARDS, uids=["a", "b"])
    with pytest.raises(TypeError):
        compute_advantages("grpo", response_mask=MASK, rewards=REWARDS, uids=UIDS, lamda=0.9)  # misspelt


# ---- registry -----------------------------------------------------------------------------------


def test_unknown_estimator_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        compute_advantages("gpro", response_mask=MASK, rewards=REWARDS, uids=UIDS)
    for name in ("gae", "grpo", "grpo_no_std", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo"):
        assert name in str(err.value)


def test_user_registered_estimator_is_used_by_compute_advantages():
    @register_advantage("test_constant_two")
    def constant_two(inputs):
        advantages = 2.0 * inputs.response_mask.float()
        return AdvantageOutput(advantages=advantages, returns=advantages)

    try:
        out = compute_advantages("test_constant_two", response_mask=RF_MASK, rewards=torch.tensor([1.0, 0.0]))
        close(out.advantages, 2.0 * RF_MASK.float())
        with pytest.raises(ValueError, match="already registered"):
            register_advantage("test_constant_two")(grpo)
    finally:
        ADVANTAGE_ESTIMATORS.unregister("test_constant_two")


def test_dotted_path_estimator(tmp_path, monkeypatch):
    (tmp_path / "my_advantages.py").write_text(textwrap.dedent("""
        from rlinf_search.algorithms import AdvantageOutput

        def minus_one(inputs):
            advantages = -inputs.response_mask.float()
            return AdvantageOutput(advantages=advantages, returns=advantages)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    out = compute_advantages("my_advantages.minus_one", response_mask=RF_MASK, rewards=torch.tensor([1.0, 0.0]))
    close(out.advantages, -RF_MASK.float())
    assert ADVANTAGE_ESTIMATORS.resolve("rlinf_search.algorithms.advantages.grpo") is grpo
    with pytest.raises(ValueError, match="cannot import"):
        ADVANTAGE_ESTIMATORS.resolve("my_advantages.nope")
