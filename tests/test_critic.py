"""The critic: clipped value loss by hand, the value trainer on a real tiny Qwen2, checkpoints, config
rules, and a real PPO (GAE) run through Ray worker groups, then resumed from its checkpoint."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlinf_search.algorithms import aggregate_loss, clipped_value_loss, compute_advantages
from rlinf_search.config import ConfigError, validate_cfg
from rlinf_search.data.batch import collate_trajectories
from rlinf_search.data.io_struct import Trajectory
from rlinf_search.retrieval.build_index import main as build_index_main
from rlinf_search.retrieval.launch import RetrievalServerProcess
from rlinf_search.checkpoint import (
    CRITIC_SUBDIR,
    HF_SUBDIR,
    TRAINING_STATE,
    RunnerState,
    begin_checkpoint,
    latest_checkpoint,
    save_checkpoint,
)
from rlinf_search.workers.actor.config import OptimConfig
from rlinf_search.workers.actor.logprobs import place_rows
from rlinf_search.workers.critic.config import CriticConfig
from rlinf_search.workers.critic.value_model import ValueModel
from rlinf_search.workers.critic.value_trainer import ValueTrainer, explained_variance
from tests.conftest import HOTPOT_DIR, adam_steps
from toolkits.synth_task import SynthSpec, write_task

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples/searchr1/config/tiny-cpu.yaml"


# ---- the loss, by hand ----------------------------------------------------------------------------
# Row 0: four tokens, t=2 an observation whose junk value must not count. Row 1: one model token.
#   t0: V=1.5, old 0.5 -> clipped 1.0; R=2: (1.5-2)^2 = 0.25 < (1-2)^2 = 1 -> 0.5 * 1 = 0.5, clipped
#   t1: V=0.2, old 0.5 -> inside the band; R=0: 0.5 * 0.04 = 0.02
#   t3: V=-1,  old 0   -> clipped -0.5; R=-1: 0 < 0.25 -> 0.5 * 0.25 = 0.125, clipped
#   r1: V=2,   old 0   -> clipped 0.5; R=0: 4 > 0.25 -> 0.5 * 4 = 2 (a prediction that overshoots
#       the target is never rewarded for being clipped)
VALUES = torch.tensor([[1.5, 0.2, 9.0, -1.0], [2.0, 0.0, 0.0, 0.0]])
OLD = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
RETURNS = torch.tensor([[2.0, 0.0, 5.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0]])


def test_clipped_value_loss_by_hand():
    values = VALUES.clone().requires_grad_(True)
    out = clipped_value_loss(values, OLD, RETURNS, response_mask=MASK, cliprange_value=0.5)
    torch.testing.assert_close(out.token_losses.detach(), torch.tensor([[0.5, 0.02, 0.0, 0.125], [2.0, 0, 0, 0]]))
    assert float(out.clip_fraction) == pytest.approx(0.5)
    loss = aggregate_loss(out.token_losses, MASK, "token-mean")
    assert loss.item() == pytest.approx(2.645 / 4)
    assert aggregate_loss(out.token_losses, MASK, "seq-mean-token-mean").item() == pytest.approx((0.645 / 3 + 2) / 2)
    loss.backward()
    # Clipped tokens (and the observation) get no gradient; the others (V - R) / 4 tokens.
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 0.05, 0.0, 0.0], [0.5, 0, 0, 0]]))


def test_explained_variance_by_hand():
    returns = torch.tensor([[1.0, 2.0, 99.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    values = torch.tensor([[1.0, 2.0, 0.0], [2.0, 0.0, 0.0]])
    # returns 1, 2, 3: var 1; errors 0, 0, 1: mean 1/3, var ((1/3)^2 * 2 + (2/3)^2) / 2 = 1/3.
    assert explained_variance(values, returns, mask) == pytest.approx(1 - (1 / 3) / (1 + 1e-5))
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)


# ---- the value trainer on a real tiny model -------------------------------------------------------


def _batch(tokenizer):
    """Two prompts x two answers, an observation in the middle of each response, rewards 1, 0, 1, 0."""
    trajs = []
    for uid, question in (("q1", "Who wrote Demon Dice?"), ("q2", "Where was Haymo of Faversham from?")):
        for answer in ("<answer> Lester Smith </answer>", "<answer> nobody </answer>"):
            turn, final = tokenizer.encode("<search> q </search>"), tokenizer.encode(answer)
            obs = tokenizer.encode("\n\n<information>Doc 1(Title: x) y</information>\n\n")
            trajs.append(Trajectory(uid=uid, prompt_ids=tokenizer.encode(question), response_ids=turn + obs + final,
                                    response_mask=[1] * len(turn) + [0] * len(obs) + [1] * len(final),
                                    rollout_logprobs=[0.0] * (len(turn) + len(obs) + len(final))))
    return collate_trajectories(trajs, [1.0, 0.0, 1.0, 0.0], pad_id=tokenizer.pad_token_id)


def _critic_config(model_dir, **changes) -> CriticConfig:
    # ddp: one process here (FSDP2 runs in the 2-rank tests of tests/test_fsdp.py).
    settings = dict(model_path=str(model_dir), optim=OptimConfig(lr=1e-3, weight_decay=0.0, total_steps=100),
                    n_minibatches=2, max_tokens_per_mbs=40, training_backend="ddp")
    settings.update(changes)
    return CriticConfig(**settings)


def _values(trainer, batch) -> torch.Tensor:
    """``[B, T]`` values from a trainer's (rows, values) share (one process: every row)."""
    return place_rows(tuple(batch.response_mask.shape), [trainer.compute_values(batch)])


def test_fresh_critic_keeps_the_backbone_and_starts_near_zero(tiny_model_dir):
    critic = ValueModel.from_pretrained(tiny_model_dir)
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    for name, tensor in critic.backbone.state_dict().items():
        assert torch.equal(tensor, policy.model.state_dict()[name]), name
    batch = _batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    values = _values(ValueTrainer(_critic_config(tiny_model_dir)), batch)
    assert values.shape == batch.response_mask.shape and values.abs().max() < 1.0


def test_reported_loss_matches_hand_number_then_critic_learns(tiny_model_dir):
    batch = _batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    frozen = ValueTrainer(_critic_config(tiny_model_dir, optim=OptimConfig(lr=0.0, total_steps=10)))
    batch.values = _values(frozen, batch)
    # Targets 0.4 above the predictions, inside the 0.5 band: every token's loss is 0.5 * 0.16, over
    # two mini-batches cut into micro-batches by the 40-token budget.
    batch.returns = torch.where(batch.response_mask.bool(), batch.values + 0.4, 0.0)
    metrics = frozen.train_on_batch(batch)
    assert metrics["critic/value_loss"] == pytest.approx(0.08, rel=1e-4)
    assert metrics["critic/vf_clipfrac"] == 0.0
    assert math.isfinite(metrics["critic/grad_norm"]) and metrics["critic/grad_norm"] > 0

    # Rewards that the prompt decides (1 for q1, 0 for q2), so a critic can fit them exactly.
    batch.rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    trainer = ValueTrainer(_critic_config(tiny_model_dir, value_clip=10.0))
    losses = []
    for _ in range(3):
        batch.values = _values(trainer, batch)
        out = compute_advantages("gae", rewards=batch.rewards, response_mask=batch.response_mask,
                                 values=batch.values, gamma=1.0, lam=1.0)
        batch.returns = out.returns
        losses.append(trainer.train_on_batch(batch)["critic/value_loss"])
    assert losses[-1] < 0.25 * losses[0], losses


def test_save_and_resume_restore_weights_optimizer_and_order(tiny_model_dir, tmp_path):
    batch = _batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    trainer = ValueTrainer(_critic_config(tiny_model_dir))
    batch.values = _values(trainer, batch)
    batch.returns = compute_advantages("gae", rewards=batch.rewards, response_mask=batch.response_mask,
                                       values=batch.values).returns
    trainer.train_on_batch(batch)
    trainer.save(tmp_path / CRITIC_SUBDIR)
    resumed = ValueTrainer.from_checkpoint(_critic_config(tiny_model_dir), tmp_path / CRITIC_SUBDIR)
    assert resumed.global_step == trainer.global_step == 2
    for (name, a), b in zip(trainer.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    saved, loaded = trainer.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert saved.keys() == loaded.keys()
    for key in saved:
        assert all(torch.equal(saved[key][k], loaded[key][k]) for k in ("exp_avg", "exp_avg_sq", "step"))
    # The next update (same shuffling, same Adam moments, same lr) lands on the same weights.
    trainer.train_on_batch(batch)
    resumed.train_on_batch(batch)
    for (name, a), b in zip(trainer.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_resuming_a_checkpoint_without_a_critic_names_the_cause(tiny_model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved critic"):
        ValueTrainer.from_checkpoint(_critic_config(tiny_model_dir), tmp_path / CRITIC_SUBDIR)


def test_critic_goes_into_the_sealed_checkpoint_and_a_damaged_one_is_skipped(tiny_model_dir, tmp_path):
    trainer = ValueTrainer(_critic_config(tiny_model_dir))
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for step in (1, 2):
        staging = begin_checkpoint(tmp_path, step)
        trainer.save(staging / CRITIC_SUBDIR)
        save_checkpoint(tmp_path, RunnerState(global_step=step), model=policy, tokenizer=tokenizer,
                        training_state=trainer.training_state(staging), begun=True)
    assert latest_checkpoint(tmp_path).name == "global_step_2"
    assert (tmp_path / "global_step_2" / CRITIC_SUBDIR / HF_SUBDIR / "value_head.pt").is_file()
    (tmp_path / "global_step_2" / CRITIC_SUBDIR / TRAINING_STATE).write_bytes(b"truncated")
    assert latest_checkpoint(tmp_path).name == "global_step_1"
    with pytest.raises(FileNotFoundError, match="begin_checkpoint was not called"):
        save_checkpoint(tmp_path, RunnerState(global_step=3), model=policy, tokenizer=tokenizer,
                        training_state=trainer.training_state(staging), begun=True)


# ---- config rules ---------------------------------------------------------------------------------


@pytest.fixture()
def cfg():
    loaded = OmegaConf.load(TINY)
    loaded.data.train_data_paths = [str(HOTPOT_DIR / "test.jsonl")]
    loaded.data.val_data_paths = []
    loaded.algorithm.adv_type = "gae"
    loaded.critic.use_critic_model = True
    return loaded


def test_critic_config_defaults(cfg):
    del cfg.critic.optim, cfg.critic.model
    run = validate_cfg(cfg)
    assert run.critic.model_path == cfg.rollout.model.model_path and run.critic.optim.lr == 1e-5
    assert run.critic.value_clip == 0.5 and run.critic.n_minibatches == run.actor.n_minibatches
    assert run.critic.optim.total_steps == run.actor.optim.total_steps and run.critic.dtype == "float32"
    cfg.critic.use_critic_model, cfg.algorithm.adv_type = False, "grpo"
    assert validate_cfg(cfg).critic is None


@pytest.mark.parametrize("change, message", [
    (lambda c: c.critic.update({"use_critic_model": False}),
     "algorithm.adv_type: gae needs critic.use_critic_model: true"),
    (lambda c: c.algorithm.update({"adv_type": "grpo"}), "critic.use_critic_model: true needs algorithm.adv_type: gae"),
    (lambda c: c.algorithm.update({"value_clip": 0.0}), "algorithm.value_clip must be > 0"),
    (lambda c: c.critic.update({"warmup_steps": 30}), "critic.warmup_steps must be in [0, 30) (the run's steps)"),
    (lambda c: c.critic.update({"optim": {"lrr": 1.0}}), "critic.optim.lrr: unknown key"),
    (lambda c: c.critic.update({"lr_sched": {"lr_decay_style": "linear"}}),
     "critic.lr_sched.lr_decay_style: unknown 'linear'; choose one of constant, cosine"),
    (lambda c: c.critic.update({"model": {"precision": "fp8"}}), "critic.model.precision: unknown 'fp8'; choose one of fp32, bf16"),
])
def test_broken_critic_rules_name_the_key(cfg, change, message):
    change(cfg)
    with pytest.raises(ConfigError) as error:
        validate_cfg(cfg)
    assert message in str(error.value) and "\n" not in str(error.value)


# ---- a real PPO run through Ray worker groups -------------------------------------------------------


@pytest.fixture(scope="module")
def synth_server(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    paths = write_task(out, SynthSpec(people=40, seed=5))
    done = subprocess.run([sys.executable, "-m", "rlinf_search.data.prepare", "--input", str(paths["train"]),
                           "--format", "flashrag", "--data-source", "synth", "--out",
                           str(out / "train.prepared.jsonl")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert build_index_main(["--corpus", str(paths["corpus"]), "--out", str(out / "index"), "--retriever", "bm25"]) == 0
    args = ["--index-dir", str(out / "index"), "--corpus", str(out / "corpus.jsonl"), "--retriever", "bm25"]
    with RetrievalServerProcess(args) as server:
        yield out, server


_TRAIN = ("import sys; from omegaconf import OmegaConf; from rlinf_search.config import validate_cfg; "
          "from rlinf_search.runners.train_main import train; train(validate_cfg(OmegaConf.load(sys.argv[1])))")


def _train(cfg, path: Path) -> None:
    OmegaConf.save(cfg, path)
    done = subprocess.run([sys.executable, "-c", _TRAIN, str(path)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.heavy  # over a minute on 2 cores; CI runs it (scripts/test.sh --all)
def test_gae_run_trains_the_critic_and_resumes_it(tmp_path, synth_server, tiny_model_dir):
    synth, server = synth_server
    cfg = OmegaConf.load(TINY)
    del cfg["hydra"]
    changes = {"runner.output_dir": str(tmp_path / "run"), "runner.max_steps": 3, "runner.save_interval": 0,
               "runner.val_check_interval": 0, "runner.logger.logger_backends": ["jsonl"],
               "rollout.model.model_path": str(tiny_model_dir),
               "data.train_data_paths": [str(synth / "train.prepared.jsonl")],
               "data.val_data_paths": [], "data.rollout_batch_size": 4, "algorithm.group_size": 2,
               "algorithm.sampling_params.max_new_tokens": 24, "tools.search.server_addr": server.address,
               "algorithm.adv_type": "gae", "critic.use_critic_model": True, "critic.warmup_steps": 1,
               "critic.optim": {"lr": 1e-4}}
    for dotted, value in changes.items():
        OmegaConf.update(cfg, dotted, value)
    assert validate_cfg(cfg).actor.n_minibatches == 2  # two ranks (FSDP2 over gloo) in both groups, 2 mini-batches
    _train(cfg, tmp_path / "config.yaml")

    rows = [json.loads(line) for line in (tmp_path / "run/logs/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        for key in ("critic/value_loss", "critic/vf_clipfrac", "critic/values_mean", "critic/grad_norm",
                    "critic/explained_var", "critic/lr"):
            assert math.isfinite(row[key]), (row["step"], key, row.get(key))
        assert 0.0 <= row["critic/vf_clipfrac"] <= 1.0
    assert "actor/grad_norm" not in rows[0] and "actor/grad_norm" in rows[1], "step 1 only warms the critic up"

    step3 = latest_checkpoint(tmp_path / "run/checkpoints")
    assert step3.name == "global_step_3"
    trained = ValueModel.from_pretrained(step3 / CRITIC_SUBDIR / HF_SUBDIR)
    fresh = ValueModel.from_pretrained(tiny_model_dir)  # what the run started from (same seed)
    assert not torch.equal(trained.head.weight, fresh.head.weight)
    assert any(not torch.equal(a, b) for a, b in zip(trained.backbone.parameters(), fresh.backbone.parameters()))

    scratch = tmp_path / "optimizer.pt"
    # The actor skipped step 1.
    assert adam_steps(step3 / CRITIC_SUBDIR, scratch) == {6} and adam_steps(step3, scratch) == {4}

    OmegaConf.update(cfg, "runner.max_steps", 4)
    OmegaConf.update(cfg, "runner.resume_dir", "auto")
    _train(cfg, tmp_path / "config_resume.yaml")
    rows = [json.loads(line) for line in (tmp_path / "run/logs/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    step4 = latest_checkpoint(tmp_path / "run/checkpoints")
    # Adam's step counts go on from the checkpoint: the critic's optimizer state was restored, not restarted.
    assert step4.name == "global_step_4" and adam_steps(step4 / CRITIC_SUBDIR, scratch) == {8} \
        and adam_steps(step4, scratch) == {6}
