"""The staleness correction on real parts: a weight swap inside a turn of the real agent loop gives the trained batch
per-token lags; the per-token bound drops exactly the old tokens; the decoupled objective is PPO's when the
behaviour and proximal policies agree, and differs from it when they do not."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from rlinf_search.agents import build_agent_loop
from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.algorithms import compute_advantages
from rlinf_search.algorithms.importance import M2_THRESHOLD
from rlinf_search.algorithms.staleness import LagStats, token_lags, too_stale
from rlinf_search.data.batch import collate_trajectories
from rlinf_search.data.io_struct import QARecord, SamplingParams, Trajectory
from rlinf_search.runners.rollout_dump import dump_row
from rlinf_search.data.io_struct import RewardScore
from rlinf_search.runners.step_metrics import staleness_metrics
from rlinf_search.tools.search.base import SearchHit, SearchOutcome
from rlinf_search.workers.actor.config import ActorConfig, OptimConfig, PolicyLossConfig
from rlinf_search.workers.actor.logprobs import place_rows
from rlinf_search.workers.actor.policy_trainer import PolicyTrainer
from rlinf_search.workers.rollout.hf_engine import HFEngineConfig, HFGenerationEngine
from rlinf_search.workers.rollout.weight_gate import GatedEngine, WeightGate

OPTIM = OptimConfig(lr=1e-3, weight_decay=0.0, clip_grad=1e9)


class FixedPassages:
    """A search tool that finds one passage (the engine and the loss are under test, not search)."""

    async def search(self, query: str, topk: int | None = None) -> SearchOutcome:
        return SearchOutcome(query=query, hits=[SearchHit(title="Doc", text=f"{query} is in Paris.")])

    async def aclose(self) -> None:
        pass


def _swapped_rollout(tiny_model_dir) -> list[Trajectory]:
    """Two samples of one question through the Search-R1 agent loop on the HF engine behind a weight gate at
    version 4; version 5 (other weights) is swapped in while the first turns are being decoded."""
    engine = HFGenerationEngine(HFEngineConfig(str(tiny_model_dir), device="cpu", seed=0))
    gate = WeightGate(version=4)
    gated = GatedEngine(engine, gate)
    generator = torch.Generator().manual_seed(3)
    new = {name: value + 0.3 * torch.randn(value.shape, generator=generator)
           for name, value in engine.model.state_dict().items()}
    config = AgentLoopConfig(max_turns=1, max_tokens_per_turn=160, max_response_tokens=400,
                             sampling=SamplingParams(temperature=1.0))
    record = QARecord(uid="q", prompt=[{"role": "user", "content": "Where is the Louvre?"}], golden_answers=["Paris"],
                      data_source="test")

    def swap_after_some_tokens():
        while engine.stats.generated_tokens < 30:
            time.sleep(0.0005)
        gated.load_weights(new, 5)

    async def run():
        loop = build_agent_loop(gated, FixedPassages(), engine.tokenizer, config)
        swapper = threading.Thread(target=swap_after_some_tokens)
        swapper.start()
        try:
            return await loop.run_batch([record], 2, seed=7)
        finally:
            await loop.aclose()
            await asyncio.to_thread(swapper.join)

    trajectories = asyncio.run(run())
    assert gate.activity().aborted >= 1, "the swap landed inside a turn"
    return trajectories


@pytest.fixture(scope="module")
def swapped(tiny_model_dir):
    return _swapped_rollout(tiny_model_dir)


def _trainer(tiny_model_dir, **loss) -> PolicyTrainer:
    return PolicyTrainer(ActorConfig(model_path=str(tiny_model_dir), optim=OPTIM, loss=PolicyLossConfig(**loss)))


def _prepared(trainer: PolicyTrainer, trajectories: list[Trajectory], *, trained_version: int | None):
    batch = collate_trajectories(trajectories, [1.0, 0.0], pad_id=0)
    batch.trained_version = trained_version
    batch.old_logprobs = place_rows(tuple(batch.response_mask.shape), [trainer.compute_logprobs(batch)])
    batch.advantages = compute_advantages("grpo", rewards=batch.rewards, response_mask=batch.response_mask,
                                          uids=batch.uids).advantages
    return batch


def _grads(trainer: PolicyTrainer) -> list[torch.Tensor]:
    return [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]


def test_a_swap_inside_a_turn_reaches_the_batch_the_metrics_and_the_dump_token_by_token(swapped):
    mixed = [t for t in swapped if {4, 5} <= set(t.token_versions)]
    assert mixed, "a turn holds tokens of both versions"
    for traj in swapped:
        assert len(traj.token_versions) == len(traj.response_ids)
        model = [v for v, m in zip(traj.token_versions, traj.response_mask) if m]
        assert model == sorted(model), "the old version's tokens come first"
        assert all(v == -1 for v, m in zip(traj.token_versions, traj.response_mask) if not m)
    batch = collate_trajectories(swapped, [1.0, 0.0], pad_id=0)
    row = swapped.index(mixed[0])
    assert batch.token_versions[row, : len(mixed[0].response_ids)].tolist() == mixed[0].token_versions
    lags = token_lags(batch.token_versions, 5)
    old_tokens = sum(1 for t in swapped for v, m in zip(t.token_versions, t.response_mask) if m and v == 4)
    assert int(((lags == 1) & batch.response_mask.bool()).sum()) == old_tokens
    metrics = staleness_metrics(swapped, trained_version=5)
    model_tokens = sum(sum(t.response_mask) for t in swapped)
    assert metrics["staleness/lag_1"] == pytest.approx(old_tokens / model_tokens)
    assert metrics["staleness/max_lag"] == 1.0
    dumped = dump_row(QARecord(uid="q", prompt="p", golden_answers=["Paris"], data_source="test"), mixed[0],
                      RewardScore(reward=0.0, em=0.0))
    first = next(span for span in dumped.response if span["kind"] == "model")
    assert first["version"] == 4 and [v for v, _ in first["versions"]] == [4, 5]


def test_the_per_token_bound_drops_exactly_the_tokens_older_than_it(tiny_model_dir, swapped):
    bounded = _trainer(tiny_model_dir, max_token_lag=0)
    batch = _prepared(bounded, swapped, trained_version=5)
    metrics = bounded.train_on_batch(batch)
    old = (token_lags(batch.token_versions, 5) == 1) & batch.response_mask.bool()
    assert metrics["actor/stale_fraction"] == pytest.approx(float(old.sum() / batch.response_mask.sum()), abs=1e-6)
    known = float((batch.response_mask.bool() & (token_lags(batch.token_versions, 5) >= 0)).sum())
    assert metrics["actor/lag_1/token_share"] == pytest.approx(float(old.sum()) / known)
    assert metrics["actor/lag_0/token_share"] > 0
    # The same update without a bound, the old tokens' advantages zeroed: the same gradient.
    plain = _trainer(tiny_model_dir)
    zeroed = _prepared(plain, swapped, trained_version=5)
    zeroed.advantages = zeroed.advantages * (~old)
    plain.train_on_batch(zeroed)
    for a, b in zip(_grads(bounded), _grads(plain)):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-5)
    assert too_stale(token_lags(batch.token_versions, 5), batch.response_mask, 1).sum() == 0


def test_the_decoupled_loss_is_ppos_when_behaviour_and_proximal_agree_and_not_otherwise(tiny_model_dir, swapped):
    ppo, decoupled = _trainer(tiny_model_dir), _trainer(tiny_model_dir, mismatch_correction="decoupled")
    batch = _prepared(ppo, swapped, trained_version=5)
    batch.rollout_logprobs = torch.where(batch.response_mask.bool(), batch.old_logprobs, batch.rollout_logprobs)
    ppo_metrics = ppo.train_on_batch(batch)
    decoupled_metrics = decoupled.train_on_batch(batch)
    for a, b in zip(_grads(ppo), _grads(decoupled)):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-5)
    assert ppo_metrics["actor/pg_loss"] == pytest.approx(decoupled_metrics["actor/pg_loss"], abs=1e-6)
    assert decoupled_metrics["actor/is_weight_mean"] == pytest.approx(1.0)
    # A behaviour policy that gave the old version's tokens half the probability: they weigh 2, untruncated.
    old = (token_lags(batch.token_versions, 5) == 1) & batch.response_mask.bool()
    batch.rollout_logprobs = batch.rollout_logprobs - torch.log(torch.tensor(2.0)) * old
    again = _trainer(tiny_model_dir, mismatch_correction="decoupled")
    metrics = again.train_on_batch(batch)
    assert metrics["actor/lag_1/is_weight_mean"] == pytest.approx(2.0, rel=1e-4)
    assert metrics["actor/lag_0/is_weight_mean"] == pytest.approx(1.0, rel=1e-4)
    assert metrics["actor/lag_1/kl_behaviour_proximal"] == pytest.approx(1.0 - torch.log(torch.tensor(2.0)).item(),
                                                                         rel=1e-4)
    assert any(not torch.allclose(a, b) for a, b in zip(_grads(again), _grads(ppo)))


def test_m2po_keeps_every_token_when_the_policies_agree_and_drops_the_most_moved_ones_when_they_do_not(
        tiny_model_dir, swapped):
    ppo, m2po = _trainer(tiny_model_dir), _trainer(tiny_model_dir, mismatch_correction="m2po")
    batch = _prepared(ppo, swapped, trained_version=5)
    batch.rollout_logprobs = torch.where(batch.response_mask.bool(), batch.old_logprobs, batch.rollout_logprobs)
    ppo.train_on_batch(batch)
    metrics = m2po.train_on_batch(batch)
    for a, b in zip(_grads(ppo), _grads(m2po)):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-5)
    assert metrics["actor/is_masked_fraction"] == 0.0
    # The old version's tokens sampled at a quarter of the probability ((log 4)^2 = 1.9 each): enough of them are
    # dropped that the rest's second moment is within the threshold, and the same update is PPO's with exactly
    # those tokens' advantages zeroed and the kept old ones weighted 4.
    old = (token_lags(batch.token_versions, 5) == 1) & batch.response_mask.bool()
    batch.rollout_logprobs = batch.rollout_logprobs - torch.log(torch.tensor(4.0)) * old
    moved = _trainer(tiny_model_dir, mismatch_correction="m2po")
    metrics = moved.train_on_batch(batch)
    model_tokens = int(batch.response_mask.sum())
    dropped = round(metrics["actor/is_masked_fraction"] * model_tokens)
    kept_old = int(old.sum()) - dropped
    assert 0 < dropped <= int(old.sum())
    assert kept_old * torch.log(torch.tensor(4.0)).item() ** 2 / (model_tokens - dropped) <= M2_THRESHOLD
    assert (kept_old + 1) * torch.log(torch.tensor(4.0)).item() ** 2 / (model_tokens - dropped + 1) > M2_THRESHOLD
    assert any(not torch.allclose(a, b) for a, b in zip(_grads(moved), _grads(ppo)))


def test_lag_stats_add_up_over_micro_batches():
    stats = LagStats()
    lags = torch.tensor([[0, 0, 1, -1], [2, 2, 2, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 1]])
    rho = torch.tensor([[1.0, 3.0, 2.0, 9.0], [0.5, 0.5, 7.0, 1.0]])
    clipped = torch.tensor([[False, True, False, False], [True, False, True, False]])
    stats.add(lags[:1], mask[:1], rho=rho[:1], clipped=clipped[:1])
    stats.add(lags[1:], mask[1:], rho=rho[1:], clipped=clipped[1:])
    out = stats.metrics()
    assert out["actor/lag_0/token_share"] == 0.5 and out["actor/lag_0/is_weight_mean"] == pytest.approx(5 / 3)
    assert out["actor/lag_0/is_weight_max"] == 3.0 and out["actor/lag_0/clip_fraction"] == pytest.approx(1 / 3)
    assert out["actor/lag_2/token_share"] == pytest.approx(1 / 3) and out["actor/lag_2/clip_fraction"] == 0.5
    assert "actor/lag_-1/token_share" not in out
