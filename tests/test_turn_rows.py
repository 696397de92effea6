"""Turn-level training (``actor.pack_traj: false``): each model turn its own sequence, on the real tiny Qwen2.

One-turn trajectories train exactly as trajectory-level training does; multi-turn ones give the same gradient up
to the rounding of other sequence shapes, under every loss aggregation that weights turns back to trajectories,
with micro-batches, and on 2 ranks with uneven shares."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import AutoTokenizer

from rlinf_search.algorithms import compute_advantages
from rlinf_search.config.schema import ConfigError
from rlinf_search.data.batch import collate_trajectories
from rlinf_search.data.io_struct import Trajectory
from rlinf_search.data.turn_rows import model_turns, split_turns
from rlinf_search.workers.actor.config import ActorConfig, OptimConfig, PolicyLossConfig
from rlinf_search.workers.actor.logprobs import place_rows
from rlinf_search.workers.actor.policy_trainer import PolicyTrainer
from tests.test_fsdp import _uneven_batch, one_process_and_two_ranks


def _one_turn_batch(tokenizer, rows: int = 6):
    """Answers of several lengths without a search: one model turn each, under prompts of several lengths."""
    trajs = []
    for i in range(rows):
        prompt = tokenizer.encode(f"Question {i}: where was person {i} born?" + " please" * (i % 3))
        answer = tokenizer.encode("<answer> " + "city " * (1 + i % 4) + "</answer>")
        trajs.append(Trajectory(uid=f"q{i // 3}", prompt_ids=prompt, response_ids=answer,
                                response_mask=[1] * len(answer), rollout_logprobs=[0.0] * len(answer)))
    batch = collate_trajectories(trajs, [float(i % 2) for i in range(rows)], pad_id=tokenizer.pad_token_id)
    batch.advantages = compute_advantages("grpo", rewards=batch.rewards, response_mask=batch.response_mask,
                                          uids=batch.uids).advantages
    return batch


def _config(model_dir, **changes) -> ActorConfig:
    settings = dict(model_path=str(model_dir), n_minibatches=2, shuffle_rollout=False,
                    optim=OptimConfig(lr=1e-3, weight_decay=0.0, clip_grad=1e9, total_steps=10),
                    loss=PolicyLossConfig(kl_beta=0.01))
    settings.update(changes)
    return ActorConfig(**settings)


def _prepare(trainer: PolicyTrainer, batch):
    batch.old_logprobs = place_rows(tuple(batch.response_mask.shape), [trainer.compute_logprobs(batch)])
    # A reference a little off the policy, so the KL term has a gradient of its own.
    batch.ref_logprobs = batch.old_logprobs - 0.05 * batch.response_mask
    return batch


def _train(config: ActorConfig, batch) -> tuple[PolicyTrainer, dict[str, float]]:
    trainer = PolicyTrainer(config)
    return trainer, trainer.train_on_batch(batch)


def test_turn_rows_cut_each_model_turn_with_its_context(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = _uneven_batch(tokenizer, rows=3)
    batch.old_logprobs = torch.randn(batch.response_mask.shape)
    turns = split_turns(batch, "seq-mean-token-mean")
    assert turns.trajectory_of_row == [0, 0, 1, 1, 2, 2] and turns.trajectories == 3
    p, tp = batch.prompt_length, turns.batch.prompt_length
    for i, row in enumerate(turns.trajectory_of_row):
        (start, end) = model_turns(batch.response_mask[row])[i % 2]
        real = batch.input_ids[row][batch.attention_mask[row].bool()]
        prompt_len = int(batch.attention_mask[row, :p].sum())
        turn_real = turns.batch.input_ids[i][turns.batch.attention_mask[i].bool()]
        # The turn's sequence is the trajectory up to the end of that turn; its response is the turn alone.
        assert torch.equal(turn_real, real[: prompt_len + end])
        assert torch.equal(turns.batch.input_ids[i, tp: tp + end - start], batch.input_ids[row, p + start: p + end])
        assert turns.batch.response_mask[i].tolist() == [1] * (end - start) + [0] * (turns.batch.response_length
                                                                                      - end + start)
        assert torch.equal(turns.batch.old_logprobs[i, : end - start], batch.old_logprobs[row, start:end])
        assert torch.equal(turns.batch.advantages[i, : end - start], batch.advantages[row, start:end])
        assert turns.batch.uids[i] == batch.uids[row] and turns.batch.rewards[i] == batch.rewards[row]
    # seq-mean-token-mean: a trajectory's turns weigh by their share of its model tokens; token sums need no weight.
    shares = turns.batch.loss_scale.view(3, 2).sum(dim=1)
    torch.testing.assert_close(shares, torch.ones(3))
    assert torch.equal(split_turns(batch, "token-mean").batch.loss_scale, torch.ones(6))
    with pytest.raises(ValueError, match="actor.pack_traj false"):
        split_turns(batch, "my_package.module:agg")


def test_one_turn_trajectories_train_exactly_as_trajectory_rows(tiny_model_dir):
    """The issue's check: on one-turn trajectories turn-level training is trajectory-level training, bit for bit
    (same rows, a loss scale of exactly 1), over two mini-batches with micro-batching and a KL term."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = _config(tiny_model_dir, max_tokens_per_mbs=40, loss=PolicyLossConfig(kl_beta=0.01,
                                                                                   loss_agg_func="seq-mean-token-mean"))
    batch = _prepare(PolicyTrainer(config), _one_turn_batch(tokenizer))
    packed, packed_metrics = _train(config, batch)
    turned, turned_metrics = _train(replace(config, pack_traj=False), batch)
    assert packed_metrics == turned_metrics
    for (name, a), b in zip(packed.model.named_parameters(), turned.model.parameters()):
        assert torch.equal(a, b), f"{name} differs"


@pytest.mark.parametrize("loss_agg_func", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_multi_turn_trajectories_get_the_trajectory_level_gradient(loss_agg_func, tiny_model_dir):
    """Two model turns a trajectory, observations between: cut into turns (each its own forward pass over its
    context), the gradient is the packed one's, under micro-batching, for each aggregation over trajectories."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = _config(tiny_model_dir, n_minibatches=1, max_tokens_per_mbs=60,
                     loss=PolicyLossConfig(kl_beta=0.01, loss_agg_func=loss_agg_func))
    batch = _prepare(PolicyTrainer(config), _uneven_batch(tokenizer))
    packed, packed_metrics = _train(config, batch)
    turned, turned_metrics = _train(replace(config, pack_traj=False), batch)
    for (name, a), b in zip(packed.model.named_parameters(), turned.model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4, msg=f"{name} gradient differs")
    assert turned_metrics["actor/pg_loss"] == pytest.approx(packed_metrics["actor/pg_loss"], rel=1e-4, abs=1e-7)
    assert turned_metrics["actor/grad_norm"] == pytest.approx(packed_metrics["actor/grad_norm"], rel=1e-4)


@pytest.mark.heavy  # 2 spawned ranks and a checkpoint round trip: about a minute on 2 cores
def test_two_fsdp_ranks_of_turn_rows_match_one_packed_process(tiny_model_dir, tmp_path):
    """FSDP2 over 2 ranks with turn rows dealt unevenly (micro-batch budget 60) against one process training the
    packed trajectories: the same weights after the update."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = _config(tiny_model_dir, training_backend="fsdp", max_tokens_per_mbs=60, pack_traj=False,
                     optim=OptimConfig(lr=1.0, adam_eps=1.0, weight_decay=0.0, clip_grad=0.5, total_steps=10),
                     loss=PolicyLossConfig(kl_beta=0.0, loss_agg_func="seq-mean-token-mean"))
    expected, expected_weights, ranks = one_process_and_two_ranks(config, _uneven_batch(tokenizer), tmp_path,
                                                                  pack_traj=True)
    for name, tensor in ranks[0]["weights"].items():
        torch.testing.assert_close(tensor, expected_weights[name], atol=1e-5, rtol=0, msg=name)
    assert ranks[0]["metrics"]["actor/grad_norm"] == pytest.approx(expected["actor/grad_norm"], rel=1e-4)


def test_pack_traj_is_read_and_checked_at_start_up(tmp_path):
    from omegaconf import OmegaConf

    from rlinf_search.config import validate_cfg
    from tests.conftest import HOTPOT_DIR

    cfg = OmegaConf.load("examples/searchr1/config/tiny-cpu.yaml")
    cfg.data.train_data_paths, cfg.data.val_data_paths = [str(HOTPOT_DIR / "test.jsonl")], []
    assert validate_cfg(cfg).actor.pack_traj
    cfg.actor.pack_traj = False
    assert not validate_cfg(cfg).actor.pack_traj
    cfg.algorithm.loss_agg_func = "rlinf_search.algorithms.aggregation:token_mean"
    with pytest.raises(ConfigError, match="actor.pack_traj: false weights each turn"):
        validate_cfg(cfg)
