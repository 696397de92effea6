"""The policy update on a real tiny Qwen2: batching layout, micro-batch equivalence, learning signal."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoTokenizer

from rlinf_search.algorithms import compute_advantages
from rlinf_search.data.batch import collate_trajectories, split_by_token_budget
from rlinf_search.data.io_struct import Trajectory
from rlinf_search.workers.actor.config import ActorConfig, OptimConfig, PolicyLossConfig
from rlinf_search.workers.actor.logprobs import place_rows
from rlinf_search.workers.actor.policy_trainer import PolicyTrainer, lr_lambda


def _trajectories(tokenizer) -> list[Trajectory]:
    """Two prompts x two answers; observation tokens in the middle of each response."""
    out = []
    for uid, question in (("q1", "Who wrote Demon Dice?"), ("q2", "Where was Haymo of Faversham from?")):
        prompt = tokenizer.encode(question)
        for answer in ("<answer> Lester Smith </answer>", "<answer> nobody at all </answer>"):
            turn = tokenizer.encode("<search> q </search>")
            obs = tokenizer.encode("\n\n<information>Doc 1(Title: x) y</information>\n\n")
            final = tokenizer.encode(answer)
            ids = turn + obs + final
            mask = [1] * len(turn) + [0] * len(obs) + [1] * len(final)
            out.append(Trajectory(uid=uid, prompt_ids=prompt, response_ids=ids, response_mask=mask,
                                  rollout_logprobs=[0.0] * len(ids)))
    return out


def _logprobs(trainer, batch) -> torch.Tensor:
    """``[B, T]`` log-probs of the whole batch from a trainer's (rows, values) share (one process: every row)."""
    return place_rows(tuple(batch.response_mask.shape), [trainer.compute_logprobs(batch)])


def _prepared_batch(trainer, tokenizer):
    trajs = _trajectories(tokenizer)
    rewards = [1.0, 0.0, 1.0, 0.0]
    batch = collate_trajectories(trajs, rewards, pad_id=tokenizer.pad_token_id)
    batch.old_logprobs = _logprobs(trainer, batch)
    batch.advantages = compute_advantages("grpo", rewards=batch.rewards, response_mask=batch.response_mask,
                                          uids=batch.uids).advantages
    return batch


def test_collate_layout_and_select(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    trajs = _trajectories(tokenizer)
    batch = collate_trajectories(trajs, [1, 0, 1, 0], pad_id=tokenizer.pad_token_id)
    p = batch.prompt_length
    for row, traj in enumerate(trajs):
        ids = batch.input_ids[row][batch.attention_mask[row].bool()].tolist()
        assert ids == traj.prompt_ids + traj.response_ids
        assert batch.input_ids[row, p: p + len(traj.response_ids)].tolist() == traj.response_ids
        assert batch.response_mask[row, : len(traj.response_mask)].tolist() == traj.response_mask
    part = batch.select([2, 3])  # the longer prompt's rows: no left padding left to trim
    assert part.prompt_length == max(len(t.prompt_ids) for t in trajs[2:])
    assert part.input_ids.shape[1] == part.prompt_length + part.response_length
    groups = split_by_token_budget(batch, max_tokens=int(batch.token_counts()[:2].sum()))
    assert sorted(r for g in groups for r in g) == [0, 1, 2, 3] and len(groups) >= 2


def test_logprobs_match_unpadded_forward(tiny_model_dir):
    trainer = PolicyTrainer(ActorConfig(model_path=str(tiny_model_dir)))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    trajs = _trajectories(tokenizer)
    batch = collate_trajectories(trajs, [0] * 4, pad_id=tokenizer.pad_token_id)
    batched = _logprobs(trainer, batch)
    for row, traj in enumerate(trajs):
        with torch.no_grad():
            logits = trainer.model(torch.tensor([traj.prompt_ids + traj.response_ids])).logits[0].float()
        p = len(traj.prompt_ids)
        expected = torch.log_softmax(logits[p - 1: -1], -1).gather(-1, torch.tensor(traj.response_ids)[:, None])[:, 0]
        # Model tokens are scored; observation tokens, which no loss reads, are left out of the LM head (0).
        model = torch.tensor(traj.response_mask, dtype=torch.bool)
        assert bool(model.any()) and not bool(model.all()), "the test needs both kinds of token"
        expected = torch.where(model, expected, torch.zeros_like(expected))
        torch.testing.assert_close(batched[row, : len(traj.response_ids)], expected, atol=1e-4, rtol=0)


def test_log_prob_passes_skip_the_entropy_and_training_passes_keep_it(tiny_model_dir, monkeypatch):
    """Old and reference log-probs never read the entropy: their passes skip its softmax over the vocabulary
    (counted on the real head's logits), while an update's passes compute it."""
    trainer = PolicyTrainer(ActorConfig(model_path=str(tiny_model_dir)))
    batch = _prepared_batch(trainer, AutoTokenizer.from_pretrained(tiny_model_dir))
    vocab, real_softmax, over_vocabulary = trainer.model.config.vocab_size, torch.softmax, []

    def watched(tensor, *args, **kwargs):
        if tensor.shape[-1] == vocab:
            over_vocabulary.append(tensor.shape[0])
        return real_softmax(tensor, *args, **kwargs)

    monkeypatch.setattr(torch, "softmax", watched)
    trainer.compute_logprobs(batch)
    scoring = len(over_vocabulary)
    trainer.train_on_batch(batch)
    assert scoring == 0 and len(over_vocabulary) > scoring, (scoring, len(over_vocabulary))


def test_attn_implementation_loads_the_policy_and_reference_with_that_kernel(tiny_model_dir):
    """``actor.model.attn_implementation`` from the config file to the models the actor trains and scores with;
    eager and the default (sdpa) score the same tokens alike."""
    from omegaconf import OmegaConf

    from rlinf_search.config import validate_cfg
    from tests.conftest import HOTPOT_DIR

    cfg = OmegaConf.load("examples/searchr1/config/tiny-cpu.yaml")
    cfg.data.train_data_paths, cfg.data.val_data_paths = [str(HOTPOT_DIR / "test.jsonl")], []
    cfg.actor.model.attn_implementation, cfg.actor.model.share_prompts = "eager", False
    actor = validate_cfg(cfg).actor
    assert actor.attn_implementation == "eager"
    eager = PolicyTrainer(ActorConfig(model_path=str(tiny_model_dir), attn_implementation=actor.attn_implementation))
    default = PolicyTrainer(ActorConfig(model_path=str(tiny_model_dir), pack_sequences=False))
    reference = eager.build_reference(str(tiny_model_dir))
    assert eager.model.config._attn_implementation == reference.lm.config._attn_implementation == "eager"
    assert default.model.config._attn_implementation == "sdpa"
    batch = collate_trajectories(_trajectories(AutoTokenizer.from_pretrained(tiny_model_dir)), [0] * 4, pad_id=0)
    torch.testing.assert_close(_logprobs(eager, batch), _logprobs(default, batch), atol=1e-5, rtol=0)


def test_micro_batching_gives_the_same_update(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    optim = OptimConfig(lr=1e-3, weight_decay=0.0, clip_grad=1e9)
    whole = PolicyTrainer(ActorConfig(model_path=str(tiny_model_dir), optim=optim))
    split = PolicyTrainer(ActorConfig(model_path=str(tiny_model_dir), optim=optim, max_tokens_per_mbs=40))
    batch = _prepared_batch(whole, tokenizer)
    assert len(split_by_token_budget(batch, 40)) > 1
    metrics_whole = whole.train_on_batch(batch)
    metrics_split = split.train_on_batch(batch)
    # Gradients, not weights: Adam's first step divides by |g| and amplifies float-order noise.
    for (name, a), b in zip(whole.model.named_parameters(), split.model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4, msg=f"{name} gradient differs")
    assert abs(metrics_whole["actor/grad_norm"] - metrics_split["actor/grad_norm"]) < 1e-4


def test_updates_move_probability_towards_rewarded_answers(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    loss = PolicyLossConfig(kl_beta=0.001, entropy_bonus=0.001)
    trainer = PolicyTrainer(ActorConfig(model_path=str(tiny_model_dir), optim=OptimConfig(lr=3e-3), loss=loss,
                                        n_minibatches=2, ppo_epochs=2))
    batch = _prepared_batch(trainer, tokenizer)
    batch.ref_logprobs = batch.old_logprobs.clone()
    before = batch.old_logprobs
    for _ in range(3):
        metrics = trainer.train_on_batch(batch)
    after = _logprobs(trainer, batch)
    # Only the answers differ within a group (the search turn is shared, its advantages cancel):
    # measure the answer tokens, those after the observation.
    after_observation = (batch.response_mask == 0).long().cumsum(dim=1) > 0
    answer_tokens = batch.response_mask.bool() & after_observation
    gain = ((after - before) * answer_tokens).sum(dim=1)
    assert gain[0] > 0 and gain[2] > 0, "rewarded answers became more likely"
    assert gain[1] < 0 and gain[3] < 0, "unrewarded answers became less likely"
    assert {"actor/clip_fraction", "actor/kl", "actor/entropy", "actor/grad_norm", "actor/lr"} <= set(metrics)
    assert trainer.global_step == 3 * 2 * 2


def test_warmup_then_constant_or_cosine():
    warm = lr_lambda(OptimConfig(lr=1.0, lr_warmup_fraction=0.25, total_steps=8))
    assert [round(warm(s), 3) for s in range(4)] == [0.5, 1.0, 1.0, 1.0]
    cosine = lr_lambda(OptimConfig(lr=1.0, lr_decay_style="cosine", min_lr=0.1, total_steps=10))
    assert cosine(0) == 1.0 and abs(cosine(10) - 0.1) < 1e-9 and abs(cosine(5) - 0.55) < 1e-9


def test_rows_are_packed_only_where_attention_has_a_packed_row_kernel(caplog):
    """use_remove_padding packs rows for sdpa_varlen, flash and flex attention; sdpa and eager would attend over the
    whole packed micro-batch (its length squared), so their rows stay padded, with one warning that says so."""
    from types import SimpleNamespace

    from rlinf_search.workers.actor.token_scoring import packs_rows

    def model(implementation):
        return SimpleNamespace(config=SimpleNamespace(_attn_implementation=implementation))

    assert packs_rows(model("flash_attention_2"), True) and not packs_rows(model("flash_attention_2"), False)
    assert packs_rows(model("sdpa_varlen"), True) and packs_rows(model("flex_attention"), True)
    with caplog.at_level("WARNING"):
        assert not packs_rows(model("sdpa"), True)
    assert "sdpa attention has no kernel for packed rows" in caplog.text
    assert not packs_rows(model("eager"), False)


def test_a_policy_loss_by_dotted_path_trains_the_actor(tiny_model_dir):
    """``algorithm.policy_loss`` from the config to the update: a user's REINFORCE loss, named by dotted path. On the
    first update the policy is the one that scored the old log-probs (ratio 1, nothing clipped), where PPO's gradient
    is REINFORCE's: the two trainers' gradients agree."""
    from omegaconf import OmegaConf

    from rlinf_search.config import ConfigError, validate_cfg
    from tests.conftest import HOTPOT_DIR

    cfg = OmegaConf.load("examples/searchr1/config/tiny-cpu.yaml")
    cfg.data.train_data_paths, cfg.data.val_data_paths = [str(HOTPOT_DIR / "test.jsonl")], []
    cfg.algorithm.policy_loss = "tests.registry_plugins.reinforce_loss"
    loss = validate_cfg(cfg).actor.loss
    assert loss.policy_loss == "tests.registry_plugins.reinforce_loss"
    cfg.algorithm.policy_loss = "tests.registry_plugins.no_such_loss"
    with pytest.raises(ConfigError, match="^algorithm.policy_loss: cannot import policy loss"):
        validate_cfg(cfg)
    optim = OptimConfig(lr=1e-3, weight_decay=0.0, clip_grad=1e9)
    loss = dataclasses.replace(loss, kl_beta=0.0)  # no reference model in this test
    reinforce = PolicyTrainer(ActorConfig(model_path=str(tiny_model_dir), optim=optim, loss=loss))
    ppo = PolicyTrainer(ActorConfig(model_path=str(tiny_model_dir), optim=optim,
                                    loss=dataclasses.replace(loss, policy_loss="ppo")))
    batch = _prepared_batch(ppo, AutoTokenizer.from_pretrained(tiny_model_dir))
    metrics = reinforce.train_on_batch(batch)
    ppo.train_on_batch(batch)
    assert metrics["actor/clip_fraction"] == 0 and metrics["actor/ratio_mean"] == 1
    for (name, a), b in zip(reinforce.model.named_parameters(), ppo.model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4, msg=f"{name} gradient differs")
