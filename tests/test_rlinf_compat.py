"""RLinf's own Search-R1 configs load as an RLinf user runs them (``--config-path/--config-name``): every
resolver they use is registered, every key is mapped onto ours or listed once as accepted with no
effect, values this trainer cannot honour are one-line errors, and our own configs stay strict.

The configs are copies of RLinf's key sets (tests/data/rlinf_configs, source and licence in each)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlinf_search.config import SCHEMA, ConfigError, validate_cfg
from rlinf_search.config.eval import EVAL_SCHEMA, validate_eval_cfg
from rlinf_search.config.rlinf import RLINF_KEYS
from tests.conftest import DATA_DIR

ROOT = Path(__file__).resolve().parents[1]
RLINF_DIR = DATA_DIR / "rlinf_configs"
TRAIN_CONFIGS = ("qwen2.5-3b-tool-fsdp-1node", "qwen2.5-3b-tool-1node")
EVAL_CONFIG = "qwen2.5-3b-tool-1node-eval"
# RLinf's current Search-R1 recipe (main branch): per-turn sequences, grpo_dynamic, loss scales.
MAIN_TRAIN, MAIN_EVAL = "train_qwen2.5", "eval_qwen2.5"
# RLinf's own end-to-end test configs of the recipe (main branch): FSDP and Megatron training, and the eval.
E2E_TRAIN, E2E_EVAL = ("e2e-qwen2.5-1.5b-fsdp", "e2e-qwen2.5-1.5b-megatron"), "e2e-qwen2.5-1.5b-eval"
ON_GPUS = "+cluster.num_gpus_per_node=8"  # RLinf places on the GPUs Ray finds; this machine has none


def compose_rlinf(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=str(RLINF_DIR), version_base=None):
        return compose(config_name=name, overrides=overrides)


@pytest.fixture()
def data_file(tmp_path) -> str:
    path = tmp_path / "train.prepared.jsonl"
    path.write_text("{}\n" * 1024)  # validation counts prompts (two batches of 512); it does not parse them
    return str(path)


@pytest.mark.parametrize("name", TRAIN_CONFIGS)
def test_training_configs_load_with_their_settings_mapped(name, data_file, caplog):
    with caplog.at_level(logging.WARNING):
        run = validate_cfg(compose_rlinf(name, [f"data.train_data_paths=[{data_file}]", ON_GPUS]))
    assert run.rollout.backend == "vllm" and run.rollout.dtype == "float16"  # sglang -> vllm; fp16 rollout kept
    assert run.group_size == 4 and run.rollout_batch_size == 512 and run.actor.n_minibatches == 2
    assert run.agent_loop.max_turns == 2 and run.agent_loop.max_obs_tokens == 500 and run.search.topk == 3
    assert run.agent_loop.sampling.max_new_tokens == 7096 - 4096 and not run.agent_loop.apply_chat_template
    assert run.prompt_limit.filter_overlong and run.prompt_limit.max_prompt_tokens == 4096
    assert run.total_steps == 2, "max_steps -1: one epoch of 1024 prompts in batches of 512"
    assert run.actor.optim.lr == 1e-6 and run.actor.optim.lr_warmup_fraction == 0.285
    assert run.actor.loss.kl_beta == 0.001 and run.actor.loss.clip_ratio_c is None
    assert not run.normalize_advantages and run.actor.max_tokens_per_mbs == 11008
    assert run.actor.offload.weights and run.actor.offload.optimizer and run.actor.offload.grads
    assert run.actor.sync_dtype == "float16", "weights leave in the fp16 the rollout loads"
    if name == "qwen2.5-3b-tool-1node":
        assert run.actor.training_backend == "megatron" and run.actor.dtype == "bfloat16"  # fp16 -> bf16
        assert run.actor.megatron.recompute_granularity == "full"
    else:
        assert run.actor.training_backend == "fsdp" and run.actor.dtype == "float32"
    listing = [r.getMessage() for r in caplog.records if "accepted with no effect" in r.getMessage()]
    assert len(listing) == 1, "the accepted keys are listed once, in one message"
    lines = listing[0].splitlines()[1:]
    for key in ("rollout.sglang.attention_backend", "algorithm.sampling_params.stop", "data.answer_key",
                "rollout.rollout_backend: sglang -> vllm", "data.filter_prompt_by_length -> data.filter_overlong_prompts"):
        assert sum(line.strip().startswith(key) for line in lines) == 1, key


def _leaves(node: dict, prefix: str = ""):
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else key
        yield from _leaves(value, path) if isinstance(value, dict) and value else [path]


def _read_by_us(schema, path: str) -> bool:
    node = schema
    for part in path.split("."):
        if node in ("*", None):
            return True
        if part not in node:
            return False
        node = node[part]
    return True


@pytest.mark.parametrize("name", (*TRAIN_CONFIGS, EVAL_CONFIG, MAIN_TRAIN, MAIN_EVAL, *E2E_TRAIN, E2E_EVAL))
def test_every_rlinf_key_is_read_mapped_or_listed(name, data_file, caplog):
    """Each leaf key of RLinf's config is one our reader takes, or appears in the start-up listing."""
    raw = OmegaConf.to_container(OmegaConf.load(RLINF_DIR / f"{name}.yaml"), resolve=False)
    raw.pop("defaults")
    is_eval = name in (EVAL_CONFIG, MAIN_EVAL, E2E_EVAL)
    with caplog.at_level(logging.WARNING):
        (validate_eval_cfg if is_eval else validate_cfg)(compose_rlinf(name, [
            f"{'data.val_data_paths' if is_eval else 'data.train_data_paths'}=[{data_file}]", ON_GPUS]))
    listed = {line.split()[0].rstrip(":") for r in caplog.records for line in r.getMessage().splitlines()[1:]}
    renamed = {"agentloop.maxturn", "agentloop.group_name"}  # the deprecation and removal lines name these
    schema = EVAL_SCHEMA if is_eval else SCHEMA
    unaccounted = [path for path in _leaves(raw)
                   if path not in listed and path not in renamed and not _read_by_us(schema, path)]
    assert unaccounted == []
    assert "runner.task_type" in listed and "rollout.sglang.attention_backend" in listed


@pytest.mark.parametrize("name", E2E_TRAIN)
def test_rlinf_end_to_end_test_configs_load_with_only_paths_changed(name, data_file, caplog):
    """RLinf's own CI configs of the recipe: a server-less search (dummy_mode) and no periodic checkpoint."""
    with caplog.at_level(logging.WARNING):
        run = validate_cfg(compose_rlinf(name, [f"data.train_data_paths=[{data_file}]", ON_GPUS]))
    assert run.search.backend == "empty", "dummy_mode: every search finds nothing, no server is called"
    assert run.runner.save_interval == 0 and run.runner.max_steps == 2 and run.rollout_batch_size == 32
    assert run.actor.training_backend == ("megatron" if "megatron" in name else "fsdp")
    listing = "\n".join(r.getMessage() for r in caplog.records)
    assert "reward.random_print_percent (runner.rollout_dump writes sample trajectories" in listing
    evaluation = validate_eval_cfg(compose_rlinf(E2E_EVAL, [f"data.val_data_paths=[{data_file}]", ON_GPUS]))
    assert evaluation.search.backend == "empty"


def test_eval_config_loads(data_file):
    config = validate_eval_cfg(compose_rlinf(EVAL_CONFIG, [f"data.val_data_paths=[{data_file}]", ON_GPUS]))
    assert set(config.placement.components) == {"rollout", "reward"} and config.samples_per_prompt == 1
    assert config.rollout.backend == "vllm" and config.agent_loop.max_turns == 2
    assert config.reward.score == "em"


def test_rlinf_main_recipe_loads_with_only_paths_changed_and_means_what_it_says(data_file, caplog):
    """RLinf's current train_qwen2.5.yaml: grpo_dynamic over trajectories is GRPO, the three loss scales make each
    trajectory's loss its token mean (seq-mean-token-mean), the searchr1-qwen parser is the searchr1 protocol."""
    with caplog.at_level(logging.WARNING):
        run = validate_cfg(compose_rlinf(MAIN_TRAIN, [f"data.train_data_paths=[{data_file}]", ON_GPUS]))
    assert run.adv_type == "grpo" and run.actor.loss.loss_agg_func == "seq-mean-token-mean"
    assert run.agent_loop.protocol == "searchr1" and run.agent_loop.max_turns == 2
    assert run.group_size == 4 and run.rollout_batch_size == 512 and run.actor.n_minibatches == 2
    assert run.actor.training_backend == "megatron" and not run.normalize_advantages
    (listing,) = [r.getMessage() for r in caplog.records if "accepted with no effect" in r.getMessage()]
    assert "algorithm.loss_scales: ['group_level', 'agent_level', 'turn_level'] -> algorithm.loss_agg_func: " \
           "seq-mean-token-mean" in listing
    assert "algorithm.adv_type: grpo_dynamic -> grpo" in listing and "actor.pack_traj" not in listing
    assert run.actor.pack_traj  # read as ours: the recipe packs each trajectory's turns into one sequence
    evaluation = validate_eval_cfg(compose_rlinf(MAIN_EVAL, [f"data.val_data_paths=[{data_file}]", ON_GPUS]))
    assert evaluation.agent_loop.protocol == "searchr1" and evaluation.samples_per_prompt == 1
    turns = validate_cfg(compose_rlinf(MAIN_TRAIN, [f"data.train_data_paths=[{data_file}]", ON_GPUS,
                                                    "actor.pack_traj=false"]))
    assert not turns.actor.pack_traj and turns.actor.loss.loss_agg_func == "seq-mean-token-mean"


@pytest.mark.parametrize("override, message", [
    ("algorithm.advantage_mode=turn", "algorithm.advantage_mode: 'turn' is not supported here"),
    ("algorithm.loss_scales=[group_level]", "algorithm.loss_scales: ['group_level'] is not supported here; "
                                            "supported: ['group_level', 'agent_level', 'turn_level']"),
    ("agentloop.toolcall_parser=rstar2-qwen", "agent.protocol: toolcall renders the tool schema through the chat "
                                               "template; it needs data.apply_chat_template: true"),
])
def test_rlinf_main_recipe_values_that_mean_something_else_are_one_line_errors(override, message, data_file):
    with pytest.raises(ConfigError) as caught:
        validate_cfg(compose_rlinf(MAIN_TRAIN, [f"data.train_data_paths=[{data_file}]", ON_GPUS, override]))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_rlinf_tool_call_parser_chooses_the_toolcall_protocol(data_file):
    run = validate_cfg(compose_rlinf(MAIN_TRAIN, [f"data.train_data_paths=[{data_file}]", ON_GPUS,
                                                  "agentloop.toolcall_parser=rstar2-qwen",
                                                  "data.apply_chat_template=true"]))
    assert run.agent_loop.protocol == "toolcall"


def test_without_gpus_the_placement_error_is_one_line(data_file):
    with pytest.raises(ConfigError, match="rollout backend 'vllm' cannot offload on cpu devices") as caught:
        validate_cfg(compose_rlinf(TRAIN_CONFIGS[0], [f"data.train_data_paths=[{data_file}]"]))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("override, message", [
    ("reward.use_reward_model=true", "reward.use_reward_model: True is not supported here (rewards are rule-based"),
    ("+actor.model.is_lora=true", "actor.model.is_lora: True is not supported here (LoRA is not built in"),
    ("algorithm.sampling_params.repetition_penalty=1.2", "repetition_penalty: 1.2 is not supported here"),
    ("actor.tokenizer.tokenizer_model=/other", "tokenizer.tokenizer_model ('/other') must equal "
                                               "rollout.model.model_path"),
    ("runner.logger.log_path='${runner.nowhere}'", "runner.logger.log_path: Interpolation key 'runner.nowhere' not found"),
    ("runner.seq_length='${oops:1}'", "runner.seq_length: Unsupported interpolation type oops"),
])
def test_values_that_cannot_be_honoured_are_one_line_errors(override, message, data_file):
    with pytest.raises(ConfigError) as caught:
        validate_cfg(compose_rlinf(TRAIN_CONFIGS[1], [f"data.train_data_paths=[{data_file}]", ON_GPUS, override]))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_our_own_configs_stay_strict(data_file):
    cfg = OmegaConf.load(ROOT / "examples/searchr1/config/tiny-cpu.yaml")
    cfg.data.train_data_paths = [data_file]
    cfg.data.val_data_paths = []
    cfg.rollout.detokenize = True  # an RLinf key; nothing of ours reads it
    with pytest.raises(ConfigError, match="rollout.detokenize: unknown key"):
        validate_cfg(cfg)
    assert all(not key.startswith(("runner.max_steps", "data.max_prompt_length")) for key in RLINF_KEYS)


def test_not_resolver_and_max_steps_minus_one(data_file):
    cfg = OmegaConf.load(ROOT / "examples/searchr1/config/tiny-cpu.yaml")
    cfg.data.train_data_paths = [data_file]
    cfg.data.val_data_paths = []
    cfg.runner.max_steps = -1
    cfg.runner.max_epochs = 2
    cfg.data.shuffle = "${not:${algorithm.recompute_logprobs}}"
    run = validate_cfg(cfg)
    assert run.total_steps == 2 * (1024 // 16) and run.shuffle is False


def test_training_entry_loads_an_rlinf_config_by_path(tmp_path, tiny_model_dir):
    """``main_searchr1.py --config-path DIR --config-name NAME``, as RLinf's launcher calls it: the config
    validates, the prompts are checked, and the run stops only where this CPU machine lacks the GPUs."""
    data = tmp_path / "train.prepared.jsonl"
    rows = [{"uid": f"q-{i}", "prompt": f"Question: q{i}?", "golden_answers": ["x"], "data_source": "t"}
            for i in range(512)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = subprocess.run(
        [sys.executable, "examples/searchr1/main_searchr1.py", "--config-path", str(RLINF_DIR), "--config-name",
         TRAIN_CONFIGS[0], f"data.train_data_paths=[{data}]", f"rollout.model.model_path={tiny_model_dir}",
         f"runner.output_dir={tmp_path / 'results'}", ON_GPUS],
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "accepted with no effect here, or mapped" in done.stdout + done.stderr
    assert "cannot start:" in done.stderr and "config error" not in done.stderr
