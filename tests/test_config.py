"""validate_cfg: the shipped configs validate; every broken rule fails with the key's path."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rlinf_search.config import ConfigError, validate_cfg
from tests.conftest import HOTPOT_DIR

TINY = "examples/searchr1/config/tiny-cpu.yaml"


@pytest.fixture()
def cfg():
    loaded = OmegaConf.load(TINY)
    loaded.data.train_data_paths = [str(HOTPOT_DIR / "test.jsonl")]
    loaded.data.val_data_paths = [str(HOTPOT_DIR / "test.jsonl")]
    return loaded


def test_tiny_config_validates(cfg):
    run = validate_cfg(cfg)
    assert run.placement.mode == "collocated" and run.group_size == 4
    assert run.agent_loop.max_response_tokens == cfg.runner.seq_length - cfg.data.max_prompt_length
    assert run.actor.loss.kl_beta == 0.001 and run.actor.optim.total_steps == cfg.runner.max_steps * 2
    assert run.search.server_addr == "127.0.0.1:8000"


def test_resolvers_and_deprecated_key(cfg, caplog):
    cfg.data.max_prompt_length = "${subtract:${runner.seq_length},900}"
    cfg.agentloop.maxturn = 3
    del cfg.agentloop.max_turns
    run = validate_cfg(cfg)
    assert run.agent_loop.max_response_tokens == 900 and run.agent_loop.max_turns == 3
    assert "agentloop.maxturn is deprecated" in caplog.text


@pytest.mark.parametrize("change, message", [
    (lambda c: c.runner.update({"typo_key": 1}), "runner.typo_key: unknown key"),
    (lambda c: c.algorithm.update({"recompute_logprobs": False}) or c.agentloop.update({"retokenize": True}),
     "agentloop.retokenize: true needs algorithm.recompute_logprobs: true"),
    (lambda c: c.algorithm.update({"group_size": 1}), "algorithm.group_size must be >= 2 for grpo"),
    (lambda c: c.algorithm.update({"adv_type": "nope"}), "algorithm.adv_type: unknown 'nope'"),
    (lambda c: c.algorithm.update({"loss_agg_func": "mean"}), "algorithm.loss_agg_func: unknown 'mean'"),
    (lambda c: c.algorithm.update({"n_minibatches": 5}), "must divide into algorithm.n_minibatches"),
    (lambda c: c.algorithm.update({"clip_ratio_c": 1.0}), "algorithm.clip_ratio_c must be > 1"),
    (lambda c: c.data.update({"max_prompt_length": 4096}), "data.max_prompt_length (4096) must be <"),
    (lambda c: c.data.update({"train_data_paths": ["/nowhere.jsonl"]}), "data.train_data_paths: file not found"),
    (lambda c: c.reward.update({"score": "bleu"}), "reward.score: unknown 'bleu'"),
    (lambda c: c.rollout.update({"rollout_backend": "sglang"}), "rollout.rollout_backend: sglang is not available"),
    (lambda c: c.rollout.update({"rollout_backend": "tgi"}), "rollout.rollout_backend: unknown engine 'tgi'"),
    (lambda c: c.rollout.update({"gpu_memory_utilization": 0.3}),
     "rollout.gpu_memory_utilization: read by rollout_backend vllm only"),
    (lambda c: c.rollout.update({"tensor_parallel_size": 2}), "rollout.tensor_parallel_size: only 1 is supported"),
    (lambda c: c.rollout.update({"rollout_backend": "vllm"}),
     "rollout backend 'vllm' cannot offload on cpu devices"),
    (lambda c: c.rollout.update({"rollout_backend": "vllm"}) or c.cluster.update({"num_gpus_per_node": 1})
     or c.algorithm.update({"recompute_logprobs": False}) or c.algorithm.sampling_params.update({"top_p": 0.9}),
     "algorithm.recompute_logprobs: false needs top_k 0 and top_p 1 with rollout_backend vllm"),
    (lambda c: c.cluster.update({"num_gpus_per_node": 0}), "cluster.num_gpus_per_node must be an integer >= 1"),
    (lambda c: c.tools.search.update({"topk": 0}), "tools.search.topk must be > 0"),
    (lambda c: c.cluster.update({"component_placement": {"actor": "0-7"}}),
     "cluster.component_placement.actor: device range 0-7 exceeds"),
    (lambda c: c.actor.lr_sched.update({"lr_decay_style": "linear"}), "lr_decay_style must be constant or cosine"),
    (lambda c: c.cluster.update({"component_placement": {"actor,rollout,reward": "0", "inference": "0-1"}}),
     "inference shares some of the actor's devices but not all"),
    (lambda c: c.cluster.update({"component_placement": {"actor,rollout,reward": "0", "inference": "1"}})
     or c.algorithm.update({"recompute_logprobs": False, "kl_beta": 0.0}), "inference has devices of its own but nothing"),
    (lambda c: c.cluster.update({"component_placement": {"actor,rollout,reward": "0", "inference": "1"}})
     or c.inference.update({"load_from_actor": False}), "inference.load_from_actor: false would score"),
    (lambda c: c.algorithm.update({"logprob_forward_micro_batch_size": 0}),
     "algorithm.logprob_forward_micro_batch_size must be >= 1"),
])
def test_broken_rules_name_the_key(cfg, change, message):
    change(cfg)
    with pytest.raises(ConfigError) as error:
        validate_cfg(cfg)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_inference_group_only_on_devices_of_its_own(cfg):
    assert not validate_cfg(cfg).inference.separate, "placed with the actor: the actor computes log-probs"
    cfg.cluster.component_placement = {"actor,rollout,reward": "0", "inference": "1"}
    cfg.algorithm.logprob_forward_micro_batch_size = 8
    run = validate_cfg(cfg)
    assert run.inference.separate and run.inference.forward_micro_batch_size == run.actor.forward_micro_batch_size == 8
