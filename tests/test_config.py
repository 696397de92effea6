"""validate_cfg: the shipped configs validate; every broken rule fails with the key's path."""

from __future__ import annotations

import importlib.util

import pytest
import torch
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
    assert run.actor.sync_dtype is None, "an fp32 rollout gets fp32 weights"
    assert run.rollout.seeded, "exact resume by default"


@pytest.mark.parametrize("rollout, inference, expected", [
    ("bf16", None, "bfloat16"), ("fp16", None, "float16"), ("fp32", None, None),
    ("bf16", "bf16", "bfloat16"), ("fp16", "bf16", None),  # fp32 -> bf16 -> fp16 would round twice
])
def test_weights_leave_in_the_dtype_every_receiver_loads(cfg, rollout, inference, expected):
    cfg.rollout.model.precision = rollout
    if inference is not None:  # the InferenceGroup's policy copy, in the actor's compute dtype
        cfg.actor.model.precision = inference
        cfg.cluster.component_placement = {"actor,rollout,reward": "0", "inference": "1"}
        cfg.cluster.num_gpus_per_node = 2
    assert validate_cfg(cfg).actor.sync_dtype == expected


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
    (lambda c: c.cluster.update({"num_gpus_per_node": 0}), "cluster.num_gpus_per_node must be >= 1, got 0"),
    (lambda c: c.tools.search.update({"topk": 0}), "tools.search.topk must be >= 1, got 0"),
    (lambda c: c.cluster.update({"component_placement": {"actor": "0-7"}}),
     "cluster.component_placement.actor: device range 0-7 exceeds"),
    (lambda c: c.actor.lr_sched.update({"lr_decay_style": "linear"}),
     "actor.lr_sched.lr_decay_style: unknown 'linear'; choose one of constant, cosine"),
    (lambda c: c.cluster.update({"component_placement": {"actor,rollout,reward": "0", "inference": "0-1"}}),
     "inference shares some of the actor's devices but not all"),
    (lambda c: c.cluster.update({"component_placement": {"actor,rollout,reward": "0", "inference": "1"}})
     or c.algorithm.update({"recompute_logprobs": False, "kl_beta": 0.0}), "inference has devices of its own but nothing"),
    (lambda c: c.cluster.update({"component_placement": {"actor,rollout,reward": "0", "inference": "1"}})
     or c.inference.update({"load_from_actor": False}), "inference.load_from_actor: false would score"),
    (lambda c: c.algorithm.update({"logprob_forward_micro_batch_size": 0}),
     "algorithm.logprob_forward_micro_batch_size must be >= 1"),
    (lambda c: c.actor.optim.update({"lr": -1}), "actor.optim.lr must be in [0, 1], got -1"),
    (lambda c: c.actor.optim.update({"clip_grad": -1}), "actor.optim.clip_grad must be > 0, got -1"),
    (lambda c: c.actor.optim.update({"adam_beta1": 1.0}), "actor.optim.adam_beta1 must be in [0, 1), got 1.0"),
    (lambda c: c.actor.lr_sched.update({"min_lr": -1e-7}), "actor.lr_sched.min_lr must be in [0, 1]"),
    (lambda c: c.algorithm.update({"clip_ratio_high": -0.2}), "algorithm.clip_ratio_high must be > 0, got -0.2"),
    (lambda c: c.actor.model.update({"attn_implementation": "flash_attn"}),
     "actor.model.attn_implementation: unknown 'flash_attn'; use one of eager, sdpa, sdpa_varlen, flash_attention_2"),
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


@pytest.mark.parametrize("placement, recompute, kl_beta, old, reference, receivers", [
    ({"actor,rollout,reward,inference": "all"}, True, 0.001, "actor", "actor", ("rollout",)),
    ({"actor,rollout,reward": "all"}, False, 0.001, "engine", "actor", ("rollout",)),
    ({"actor,rollout,reward": "all"}, False, 0.0, "engine", None, ("rollout",)),
    ({"actor,rollout,reward": "0", "inference": "1"}, True, 0.001, "inference", "inference", ("rollout", "inference")),
    ({"actor,rollout,reward": "0", "inference": "1"}, True, 0.0, "inference", None, ("rollout", "inference")),
    ({"actor,rollout,reward": "0", "inference": "1"}, False, 0.001, "engine", "inference", ("rollout",)),
])
def test_one_plan_says_who_computes_log_probs_and_who_gets_weights(cfg, placement, recompute, kl_beta, old,
                                                                   reference, receivers):
    cfg.cluster.component_placement = placement
    cfg.algorithm.recompute_logprobs, cfg.algorithm.kl_beta = recompute, kl_beta
    plan = validate_cfg(cfg).logprobs
    assert (plan.old, plan.reference, plan.weight_receivers) == (old, reference, receivers)
    assert plan.launches_inference == ("inference" in (old, reference))
    assert plan.scorer == (None if old == "engine" and reference is None else old if old != "engine" else reference)


def test_a_plan_that_cannot_run_is_refused():
    from rlinf_search.workers.inference.plan import LogprobPlan

    with pytest.raises(ValueError, match="one call, on one group"):
        LogprobPlan(old="actor", reference="inference")
    with pytest.raises(ValueError, match="engine, actor or inference"):
        LogprobPlan(old="critic", reference=None)


# ---- every accepted key is read: group names, logger name, task and reward type, shuffling, templating ----
def test_group_names_and_logger_name_are_read(cfg):
    cfg.actor.group_name, cfg.rollout.group_name, cfg.reward.group_name = "Policy", "Engines", "Judges"
    cfg.runner.logger.experiment_name = "sweep-7"
    run = validate_cfg(cfg)
    assert (run.actor_group, run.rollout_group, run.reward_group) == ("Policy", "Engines", "Judges")
    assert run.runner.experiment_name == "sweep-7"
    del cfg.runner.logger.experiment_name
    assert validate_cfg(cfg).runner.experiment_name == cfg.runner.experiment_name == "tiny-cpu"


def test_train_main_launches_the_configured_group_names(cfg, monkeypatch):
    from types import SimpleNamespace

    from rlinf_search.runners import train_main

    launched = {}

    class FakeWorker:
        @staticmethod
        def create_group(*args):
            return SimpleNamespace(launch=lambda cluster, placement, name, **options: launched.setdefault(name, placement))

    for worker in ("ActorWorker", "RolloutWorker", "RewardWorker", "CriticWorker", "InferenceWorker"):
        monkeypatch.setattr(train_main, worker, FakeWorker)
    monkeypatch.setattr(train_main, "require_training_backend", lambda *args, **kwargs: None)
    cfg.actor.group_name, cfg.rollout.group_name, cfg.reward.group_name = "Policy", "Engines", "Judges"
    run = validate_cfg(cfg)
    train_main.launch_groups(run, SimpleNamespace(placement=run.placement, device_kind="cpu"), None)
    assert set(launched) == {"Policy", "Engines", "Judges"}


def test_removed_agentloop_group_name_warns_and_is_dropped(cfg, caplog):
    cfg.agentloop.group_name = "AgentLoopGroup"
    validate_cfg(cfg)
    assert "agentloop.group_name is ignored: the agent loop runs inside the rollout group" in caplog.text
    assert "remove this key" in caplog.text


@pytest.mark.parametrize("shuffle", [True, False])
def test_shuffle_rollout_decides_the_mini_batches(cfg, shuffle):
    """The actor's and the critic's update loops cut rollout order into mini-batches unless told to shuffle."""
    import random

    from rlinf_search.workers.actor.policy_trainer import PolicyTrainer
    from rlinf_search.workers.critic.value_trainer import ValueTrainer

    cfg.algorithm.shuffle_rollout = shuffle
    cfg.algorithm.adv_type, cfg.critic.use_critic_model = "gae", True
    cfg.actor.model.share_prompts = False  # rows, not a prompt's group, are the units here (test_shared_prompts.py)
    run = validate_cfg(cfg)
    assert run.actor.shuffle_rollout is run.critic.shuffle_rollout is shuffle

    class Rows:  # stands in for a RolloutBatch: just the rows a mini-batch selects
        advantages = old_logprobs = ref_logprobs = values = returns = "set"

        def __init__(self, rows):
            self.rows = rows

        def __len__(self):
            return len(self.rows)

        def select(self, indices):
            return Rows([self.rows[i] for i in indices])

    for trainer_cls, config in ((PolicyTrainer, run.actor), (ValueTrainer, run.critic)):
        seen = []
        trainer = object.__new__(trainer_cls)  # the update loop only; no model
        trainer.config, trainer._rng = config, random.Random(0)
        trainer.shares_prompts = False
        trainer._optimizer_step = lambda batch, rows: seen.append(batch.select(rows).rows) or {"loss": 0.0}
        trainer.train_on_batch(Rows(list(range(8))))
        assert (seen == [[0, 1, 2, 3], [4, 5, 6, 7]]) is not shuffle, (trainer_cls.__name__, seen)


@pytest.mark.parametrize("apply_template", [True, False])
def test_apply_chat_template_decides_how_prompts_are_tokenized(cfg, apply_template):
    from rlinf_search.agents.searchr1.loop import SearchR1AgentLoop
    from rlinf_search.data.io_struct import QARecord

    class Tokenizer:  # one id per character; the chat template wraps the text in markers
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            return self.encode("<user>" + messages[0]["content"] + "<assistant>")

    cfg.data.apply_chat_template = apply_template
    loop_config = validate_cfg(cfg).agent_loop
    assert loop_config.apply_chat_template is apply_template
    loop = SearchR1AgentLoop(None, None, Tokenizer(), loop_config)
    chat = QARecord(uid="q", prompt=[{"role": "user", "content": "Who?"}], golden_answers=["x"], data_source="t")
    text = QARecord(uid="t", prompt="<user>Who?<assistant>", golden_answers=["x"], data_source="t")
    expected = "<user>Who?<assistant>" if apply_template else "Who?"
    assert loop.prompt_ids(chat) == [ord(c) for c in expected]
    assert loop.prompt_ids(text) == [ord(c) for c in "<user>Who?<assistant>"], "text is tokenized as it is either way"


# ---- start-up checks that used to fail only after Ray started ---------------------------------------------
def test_wandb_without_its_package_fails_at_validation(cfg, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    cfg.runner.logger.logger_backends = ["console", "wandb"]
    with pytest.raises(ConfigError, match=r"runner.logger.logger_backends: wandb needs .*\(pip install wandb\)"):
        validate_cfg(cfg)


# ---- null means the default, everywhere ---------------------------------------------------------------
def test_null_means_the_default(cfg):
    for section, key in (("algorithm", "kl_beta"), ("algorithm", "group_size"), ("runner", "max_steps"),
                         ("algorithm", "n_minibatches"), ("algorithm", "shuffle_rollout"), ("data", "seed"),
                         ("rollout", "max_running_requests"), ("agentloop", "max_turns"), ("actor", "offload_weight")):
        cfg[section][key] = None
    cfg.algorithm.sampling_params.temperature = None
    cfg.actor.optim.lr = None
    cfg.tools.search.topk = None
    cfg.cluster.num_gpus_per_node = None
    cfg.algorithm.update({"ratio_clip_eps": 0.25, "clip_ratio_low": None, "clip_ratio_high": None})
    run = validate_cfg(cfg)
    assert run.actor.loss.kl_beta == 0.0 and run.group_size == 4 and run.runner.max_steps == 100
    assert run.actor.n_minibatches == 1 and run.actor.shuffle_rollout and run.seed == 0
    assert run.rollout.max_running_requests == 64 and run.agent_loop.max_turns == 2
    assert run.agent_loop.sampling.temperature == 1.0 and run.actor.optim.lr == 1e-6 and run.search.topk == 3
    assert run.actor.loss.clip_ratio_low == run.actor.loss.clip_ratio_high == 0.25
    cfg.algorithm.clip_ratio_c = None
    assert validate_cfg(cfg).actor.loss.clip_ratio_c is None, "clip_ratio_c: null turns dual clip off"


def test_default_group_size_works_with_the_default_estimator(cfg):
    del cfg.algorithm.group_size, cfg.algorithm.adv_type
    run = validate_cfg(cfg)
    assert run.group_size == 4 and run.adv_type == "grpo"


def test_max_tokens_per_mbs_is_an_integer(cfg):
    cfg.runner.max_tokens_per_mbs = "4096"
    run = validate_cfg(cfg)
    assert run.actor.max_tokens_per_mbs == 4096 and run.runner.max_tokens_per_mbs == 4096


# ---- the lr schedule spans the run's real steps ---------------------------------------------------------
def test_lr_schedule_spans_the_steps_the_run_really_takes(cfg):
    # 100 training prompts, 16 per step: 6 steps an epoch (the incomplete last batch is dropped).
    cfg.runner.max_epochs, cfg.runner.max_steps = 1, 40
    run = validate_cfg(cfg)
    assert run.total_steps == 6 and run.actor.optim.total_steps == 6 * cfg.algorithm.ppo_epochs * 2
    cfg.runner.max_epochs = 100  # now max_steps ends the run first
    run = validate_cfg(cfg)
    assert run.total_steps == 40 and run.actor.optim.total_steps == 40 * 2


@pytest.mark.parametrize("change, message", [
    (lambda c: c.runner.update({"task_type": "math"}),
     "runner.task_type: unknown 'math'; choose one of searchr1"),
    (lambda c: c.reward.update({"reward_type": "math"}), "reward.reward_type: unknown 'math'; choose one of searchr1"),
    (lambda c: c.reward.update({"group_name": "ActorGroup"}),
     "reward.group_name: 'ActorGroup' is actor.group_name too"),
    (lambda c: c.cluster.update({"component_placement": {"actor,rollout": "all"}}),
     "cluster.component_placement: a training run places actor, rollout, reward (e.g. 'actor,rollout,reward: all'); "
     "reward is missing"),
    (lambda c: c.cluster.update({"component_placement": {"actor,rollout,reward,agentloop": "all"}}),
     "unknown component 'agentloop'"),
    (lambda c: c.runner.logger.update({"logger_backends": ["console", "tensorbord"]}),
     "runner.logger.logger_backends: unknown ['tensorbord']"),
    (lambda c: c.runner.logger.update({"logger_backends": "console"}),
     "runner.logger.logger_backends: expected a list of strings, got 'console'"),
    (lambda c: c.tools.search.update({"top_k": 5}),
     "tools.search.top_k: unknown key; tools.search takes backend, backoff_base_s"),
    (lambda c: c.runner.update({"max_tokens_per_mbs": 0}), "runner.max_tokens_per_mbs must be >= 1, got 0"),
    (lambda c: c.runner.update({"max_tokens_per_mbs": "lots"}), "runner.max_tokens_per_mbs: expected an integer"),
    (lambda c: c.runner.update({"max_steps": 0}),
     "runner.max_steps must be >= 1, or -1 (no step limit: runner.max_epochs"),
    (lambda c: c.algorithm.update({"kl_beta": "small"}), "algorithm.kl_beta: expected a number, got 'small'"),
    (lambda c: c.algorithm.update({"n_minibatches": 0}), "algorithm.n_minibatches must be >= 1"),
    (lambda c: c.data.update({"shuffle": "no"}), "data.shuffle: expected true or false, got 'no'"),
    (lambda c: c.data.update({"rollout_batch_size": 128}),
     "data.rollout_batch_size (128) is larger than the training set (100 prompts in data.train_data_paths)"),
])
def test_new_start_up_checks_name_the_key(cfg, change, message):
    change(cfg)
    with pytest.raises(ConfigError) as error:
        validate_cfg(cfg)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("settings, kernel, said", [
    ({"use_remove_padding": True}, "sdpa_varlen", None),
    ({"use_remove_padding": True, "attn_implementation": "sdpa"}, "sdpa",
     "actor.model.use_remove_padding: no effect with attn_implementation sdpa"),
    pytest.param({"use_remove_padding": False, "attn_implementation": "flash_attention_2"}, "flash_attention_2",
                 "flash_attention_2 needs the flash_attn package, which this machine lacks",
                 marks=pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash_attn here")),
    pytest.param({"use_remove_padding": True, "attn_implementation": "flex_attention"}, "flex_attention",
                 "flex_attention has no backward pass on CPU",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU here")),
])
def test_packing_settings_that_cannot_take_effect_say_so_at_start_up(cfg, caplog, settings, kernel, said):
    """use_remove_padding packs through sdpa_varlen when no kernel is named; a kernel that cannot pack, or cannot
    load or train on this machine (no flash_attn, no GPU here), is named in one line before any worker starts."""
    cfg.actor.model.update({"share_prompts": False, **settings})
    with caplog.at_level("WARNING"):
        actor = validate_cfg(cfg).actor
    assert actor.model_attention == kernel and actor.pack_sequences == settings["use_remove_padding"]
    lines = [r.getMessage() for r in caplog.records if r.name == "rlinf_search.config.training"]
    if said is None:
        assert lines == []
    else:
        assert len(lines) == 1 and said in lines[0], lines


@pytest.mark.parametrize("key, value", [("algorithm.policy_loss", "no_such_loss"), ("reward.score", "no_such_score"),
                                        ("algorithm.loss_agg_func", "no_such_mean")])
def test_a_name_no_registry_resolves_is_refused_before_the_data_files_are_looked_at(cfg, key, value):
    section, name = key.split(".")
    cfg[section][name] = value
    cfg.data.train_data_paths = ["/nowhere.jsonl"]
    with pytest.raises(ConfigError, match=rf"^{key}: unknown '{value}'"):
        validate_cfg(cfg)
