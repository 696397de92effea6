"""``actor.model.share_prompts``: a GRPO group's rows in one sequence, the prompt computed once. The log-probs, entropy
and gradients are the padded rows' (to float rounding); passes and mini-batches keep a prompt's rows together; two
FSDP ranks on uneven groups train as one process on padded rows does; the settings it cannot run with are refused."""

from __future__ import annotations

import random

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from rlinf_search.algorithms import compute_advantages
from rlinf_search.config import ConfigError, validate_cfg
from rlinf_search.data.batch import collate_trajectories, prompt_units
from rlinf_search.data.io_struct import Trajectory
from rlinf_search.data.rank_plan import padding_row, plan_passes, run_minibatches
from rlinf_search.workers.actor.hf_model import load_causal_lm
from rlinf_search.workers.actor.token_scoring import TokenScorer, layout_batch
from tests.conftest import HOTPOT_DIR
from tests.test_fsdp import _config, one_process_and_two_ranks

GROUP_SIZES = (3, 2, 1, 4)
"""Uneven groups: a lone row, and groups whose rows the two ranks cannot split evenly."""


def _grouped_batch(tokenizer, sizes=GROUP_SIZES, *, seed: int = 0):
    """Rows of ``sizes`` prompts, each prompt's rows with responses of different lengths (a search, its passage, an
    answer), GRPO advantages from mixed rewards; rows of a group adjacent, as the rollout returns them."""
    rng = random.Random(seed)
    trajs, rewards = [], []
    for group, size in enumerate(sizes):
        prompt = tokenizer.encode(f"Question {group}: who wrote book number {group}?" + " really" * group)
        for member in range(size):
            turn = tokenizer.encode("<search> " + "word " * rng.randint(1, 6) + "</search>")
            obs = tokenizer.encode("<information>Doc 1(Title: x) " + "text " * rng.randint(1, 9) + "</information>")
            final = tokenizer.encode("<answer> " + "name " * rng.randint(1, 4) + "</answer>")
            ids = turn + obs + final
            trajs.append(Trajectory(uid=f"q{group}", prompt_ids=prompt, response_ids=ids,
                                    response_mask=[1] * len(turn) + [0] * len(obs) + [1] * len(final),
                                    rollout_logprobs=[0.0] * len(ids)))
            rewards.append(float((group + member) % 2))
    batch = collate_trajectories(trajs, rewards, pad_id=tokenizer.pad_token_id)
    batch.advantages = compute_advantages("grpo", rewards=batch.rewards, response_mask=batch.response_mask,
                                          uids=batch.uids).advantages
    return batch


@pytest.mark.parametrize("model_tokens_only", [False, True])
def test_shared_prompts_score_like_padded_rows(tiny_model_dir, model_tokens_only):
    """Log-probs, entropy and every parameter's gradient equal the padded layout's; the prompt is laid out once a
    group, so the pass holds fewer tokens."""
    model = load_causal_lm(str(tiny_model_dir), dtype=torch.float32, attn_implementation="sdpa")
    scorer = TokenScorer(model)
    batch = _grouped_batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    results = {}
    for shared in (False, True):
        layout = layout_batch(batch, packed=False, model_tokens_only=model_tokens_only, share_prompts=shared)
        model.zero_grad(set_to_none=True)
        scored = scorer(layout, entropy_grad=True)
        (scored.logprobs.sum() + 0.1 * scored.entropy.sum()).backward()
        results[shared] = (layout, layout.to_rows(scored.logprobs).detach(), layout.to_rows(scored.entropy).detach(),
                           {name: p.grad.clone() for name, p in model.named_parameters()})
    (padded, *_), (shared, *_) = results[False], results[True]
    assert shared.input_ids.shape[0] == len(GROUP_SIZES) and shared.attention_mask.dim() == 4
    prompt_tokens = batch.attention_mask[:, : batch.prompt_length].sum(dim=1)
    real = int(batch.attention_mask.sum())
    assert shared.targets.tolist() == padded.targets.tolist()
    groups = prompt_units(batch, list(range(len(batch))))
    saved = sum(int(prompt_tokens[g[0]]) * (len(g) - 1) for g in groups)
    # Every real token attends to its prompt's first one; padding only to itself.
    assert saved > 0 and int(shared.attention_mask[:, 0, :, 0].sum()) == real - saved
    torch.testing.assert_close(results[True][1], results[False][1], atol=1e-5, rtol=0)
    torch.testing.assert_close(results[True][2], results[False][2], atol=1e-5, rtol=0)
    for name, grad in results[True][3].items():
        scale = float(results[False][3][name].abs().max()) + 1e-12
        torch.testing.assert_close(grad / scale, results[False][3][name] / scale, atol=1e-5, rtol=0,
                                   msg=f"{name} gradient differs")


def test_a_padding_pass_and_distinct_prompts_lay_out(tiny_model_dir):
    """A rank's padding pass (one row, no model token) and a pass whose rows all differ in prompt still score."""
    model = load_causal_lm(str(tiny_model_dir), dtype=torch.float32, attn_implementation="sdpa")
    scorer = TokenScorer(model)
    batch = _grouped_batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    for part in (padding_row(batch), batch.select([0, 3, 5, 6])):
        with torch.no_grad():
            expected = layout_batch(part, packed=False, model_tokens_only=True)
            got = layout_batch(part, packed=False, model_tokens_only=True, share_prompts=True)
            torch.testing.assert_close(got.to_rows(scorer(got).logprobs), expected.to_rows(scorer(expected).logprobs),
                                       atol=1e-5, rtol=0)


def test_passes_and_minibatches_keep_a_prompts_rows_together(tiny_model_dir):
    batch = _grouped_batch(AutoTokenizer.from_pretrained(tiny_model_dir), sizes=(3, 2, 1, 4, 2, 3, 1))
    units = prompt_units(batch, list(range(len(batch))))
    assert [len(u) for u in units] == [3, 2, 1, 4, 2, 3, 1]
    unit_of = {row: i for i, unit in enumerate(units) for row in unit}
    for budget in (None, 60, 150):
        plans = [plan_passes(batch, list(range(len(batch))), rank=r, world_size=2, max_tokens=budget, padded=True,
                             by_prompt=True) for r in range(2)]
        assert len(plans[0].passes) == len(plans[1].passes)
        assert sorted(plans[0].rows + plans[1].rows) == list(range(len(batch)))
        for plan in plans:
            for rows in filter(None, plan.passes):
                for row in rows:  # a prompt's rows all in this pass
                    assert set(units[unit_of[row]]) <= set(rows)
    seen = []
    run_minibatches(len(batch), lambda rows: seen.append(rows) or {}, epochs=2, n_minibatches=3,
                    rng=random.Random(0), units=units)
    assert len(seen) == 6 and all(sorted(r for rows in seen[e * 3: e * 3 + 3] for r in rows) == list(range(len(batch)))
                                  for e in range(2))
    for rows in seen:
        assert all(set(units[unit_of[row]]) <= set(rows) for row in rows)
    # Rows as units of one: the same mini-batches as before units existed (a resumed run draws the same).
    alone, plain = [], []
    run_minibatches(9, lambda rows: alone.append(rows) or {}, epochs=2, n_minibatches=2, rng=random.Random(3),
                    units=[[r] for r in range(9)])
    run_minibatches(9, lambda rows: plain.append(rows) or {}, epochs=2, n_minibatches=2, rng=random.Random(3))
    assert alone == plain


def test_two_fsdp_ranks_with_shared_prompts_match_one_padded_process(tiny_model_dir, tmp_path):
    """One PPO update of uneven groups on 2 FSDP ranks with shared prompts (passes cut by a token budget, a rank with
    fewer passes padding) gives the weights, loss and gradient norm of one process on padded rows. The groups' sizes
    cut the two mini-batches at the same rows as a split by rows would, so both sides train the same mini-batches."""
    batch = _grouped_batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    config = _config(tiny_model_dir, training_backend="fsdp", pack_sequences=False, share_prompts=True)
    expected, expected_weights, ranks = one_process_and_two_ranks(config, batch, tmp_path, share_prompts=False)
    assert sorted(ranks[0]["rows"] + ranks[1]["rows"]) == list(range(len(batch))), "each row scored once"
    for name, tensor in ranks[0]["weights"].items():
        torch.testing.assert_close(tensor, expected_weights[name], atol=1e-5, rtol=0, msg=name)
    grad_norms = [r["metrics"]["actor/grad_norm"] for r in ranks]
    assert grad_norms[0] == pytest.approx(grad_norms[1]) == pytest.approx(expected["actor/grad_norm"], rel=1e-4)
    losses = sum(r["metrics"]["actor/pg_loss"] for r in ranks) / 2
    assert losses == pytest.approx(expected["actor/pg_loss"], rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("change, message", [
    ({"use_remove_padding": True}, "actor.model.share_prompts: true needs padded rows"),
    ({"use_remove_padding": False, "attn_implementation": "eager"},
     "actor.model.share_prompts: true needs attention that reads a dense mask (sdpa or null)"),
])
def test_settings_it_cannot_run_with_are_refused(change, message):
    cfg = OmegaConf.load("examples/searchr1/config/tiny-cpu.yaml")
    cfg.data.train_data_paths = cfg.data.val_data_paths = [str(HOTPOT_DIR / "test.jsonl")]
    assert validate_cfg(cfg).actor.share_prompts, "the embedded default shares prompts"
    cfg.actor.model.update(change)
    with pytest.raises(ConfigError) as error:
        validate_cfg(cfg)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_actor_and_the_critic_cut_the_same_whole_group_mini_batches(tiny_model_dir):
    """With a critic (PPO), the critic's update loop cuts the same mini-batches as the actor's: whole groups."""
    from rlinf_search.workers.actor.policy_trainer import PolicyTrainer
    from rlinf_search.workers.critic.value_trainer import ValueTrainer

    cfg = OmegaConf.load("examples/searchr1/config/tiny-cpu.yaml")
    cfg.data.train_data_paths = cfg.data.val_data_paths = [str(HOTPOT_DIR / "test.jsonl")]
    cfg.algorithm.adv_type, cfg.critic.use_critic_model = "gae", True
    run = validate_cfg(cfg)
    assert run.critic.whole_groups and run.actor.share_prompts
    batch = _grouped_batch(AutoTokenizer.from_pretrained(tiny_model_dir), sizes=(4, 4, 4, 4, 4, 4))
    batch.old_logprobs = batch.ref_logprobs = batch.values = batch.returns = batch.response_mask.float()
    units = prompt_units(batch, list(range(len(batch))))
    seen = {}
    for trainer_cls, config in ((PolicyTrainer, run.actor), (ValueTrainer, run.critic)):
        trainer = object.__new__(trainer_cls)  # the update loop only; no model
        trainer.config, trainer._rng, trainer.shares_prompts = config, random.Random(0), config is run.actor
        seen[trainer_cls] = []
        trainer._optimizer_step = lambda batch, rows, out=seen[trainer_cls]: out.append(rows) or {}
        trainer.train_on_batch(batch)
    assert seen[PolicyTrainer] == seen[ValueTrainer] and len(seen[PolicyTrainer]) == 2
    for rows in seen[PolicyTrainer]:
        assert sorted(rows) == sorted(row for unit in units if unit[0] in rows for row in unit)
