"""A policy loss of a user's own with a key of its own (``examples/plugins/cispo_loss.py``): its settings are
validated at start-up with one-line errors, and the actor's update hands them to the loss."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from rlinf_search.config import ConfigError, validate_cfg
from rlinf_search.workers.actor.config import ActorConfig, OptimConfig
from rlinf_search.workers.actor.policy_trainer import PolicyTrainer
from tests.conftest import HOTPOT_DIR
from tests.test_policy_trainer import _prepared_batch

LOSS = "examples.plugins.cispo_loss:cispo"


def _config(**changes):
    cfg = OmegaConf.load("examples/searchr1/config/tiny-cpu.yaml")
    cfg.data.train_data_paths, cfg.data.val_data_paths = [str(HOTPOT_DIR / "test.jsonl")], []
    cfg.algorithm.policy_loss = LOSS
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


@pytest.mark.parametrize("settings, message", [
    ({"truncation": 1.0}, "algorithm.policy_loss_settings.truncation must be > 1, got 1.0"),
    ({"truncation": "high"}, "algorithm.policy_loss_settings.truncation: expected a number, got 'high'"),
    ({"trunaction": 3.0}, "algorithm.policy_loss_settings.trunaction: unknown key; policy_loss "
                          f"{LOSS} takes truncation; did you mean truncation?")])
def test_the_losss_own_key_is_validated_at_start_up_in_one_line(settings, message):
    with pytest.raises(ConfigError) as caught:
        validate_cfg(_config(**{"algorithm.policy_loss_settings": settings}))
    assert str(caught.value) == message


def test_settings_for_a_loss_that_declares_none_are_refused_and_the_default_applies_when_unset():
    with pytest.raises(ConfigError, match="^algorithm.policy_loss_settings: policy_loss ppo takes no settings"):
        validate_cfg(_config(**{"algorithm.policy_loss": "ppo", "algorithm.policy_loss_settings": {"x": 1}}))
    assert validate_cfg(_config()).actor.loss.policy_loss_settings.truncation == 4.0
    assert validate_cfg(_config(**{"algorithm.policy_loss": "ppo"})).actor.loss.policy_loss_settings is None


def test_the_update_hands_the_loss_its_settings(tiny_model_dir):
    """Old log-probs that make every ratio e (2.72): with truncation 2 every token is cut, with 3 none is, and the
    two updates' gradients differ by exactly the weight (2 against e)."""
    grads, metrics = {}, {}
    for truncation in (2.0, 3.0):
        loss = validate_cfg(_config(**{"algorithm.policy_loss_settings": {"truncation": truncation}})).actor.loss
        assert loss.policy_loss_settings.truncation == truncation
        trainer = PolicyTrainer(ActorConfig(model_path=str(tiny_model_dir), loss=dataclasses.replace(loss, kl_beta=0.0),
                                            optim=OptimConfig(lr=1e-3, weight_decay=0.0, clip_grad=1e9)))
        batch = _prepared_batch(trainer, AutoTokenizer.from_pretrained(tiny_model_dir))
        batch.old_logprobs = batch.old_logprobs - 1.0
        metrics[truncation] = trainer.train_on_batch(batch)
        grads[truncation] = [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]
    assert metrics[2.0]["actor/clip_fraction"] == 1.0 and metrics[3.0]["actor/clip_fraction"] == 0.0
    for cut, full in zip(grads[2.0], grads[3.0]):
        torch.testing.assert_close(cut * torch.e / 2.0, full, atol=1e-6, rtol=1e-4)
