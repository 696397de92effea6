"""The GPU recipes: they validate on any machine (paths overridden the way a user overrides them, with
hydra), carry the Search-R1 reference hyper-parameters, their launchers are valid bash, and the eval
launcher really scores the tiny model on this CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlinf_search.config import ConfigError, validate_cfg
from rlinf_search.config.eval import validate_eval_cfg
from rlinf_search.recipe_loader import compose_recipe as compose_recipe_file
from tests.conftest import HOTPOT_DIR

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "searchr1"
TRAIN_RECIPE, EVAL_RECIPE = "qwen2.5-3b-tool-fsdp-1node", "qwen2.5-3b-tool-1node-eval"
LAUNCHERS = ("run_main_searchr1_single.sh", "run_main_searchr1_single_eval.sh")


def compose_recipe(name: str, overrides: list[str]):
    """The config as ``main_searchr1.py --config-name NAME key=value ...`` would see it."""
    with initialize_config_dir(config_dir=str(EXAMPLES / "config"), version_base=None):
        return compose(config_name=name, overrides=overrides)


@pytest.fixture()
def data_file(tmp_path) -> str:
    path = tmp_path / "questions.prepared.jsonl"
    # Validation checks that the file is there and counts its prompts (one batch of 512 at least, to size
    # the run's lr schedule); it does not parse them.
    path.write_text("{}\n" * 512)
    return str(path)


def test_fsdp_recipe_validates_with_the_reference_hyper_parameters(data_file):
    cfg = compose_recipe(TRAIN_RECIPE, [f"data.train_data_paths=[{data_file}]", f"data.val_data_paths=[{data_file}]"])
    run = validate_cfg(cfg)
    assert run.placement.mode == "collocated" and run.placement.topology.device_kind == "cuda"
    assert run.placement["rollout"].world_size == run.placement["actor"].world_size == 8
    assert (run.rollout.backend, run.rollout.dtype, run.rollout.tensor_parallel_size) == ("vllm", "bfloat16", 1)
    assert run.actor.training_backend == "fsdp" and run.actor.dtype == "bfloat16"
    assert run.actor.optim.lr == 1e-6 and run.actor.optim.lr_warmup_fraction == 0.285
    assert (run.actor.loss.kl_beta, run.actor.loss.kl_penalty_type) == (0.001, "low_var_kl")
    assert run.actor.loss.clip_ratio_low == run.actor.loss.clip_ratio_high == 0.2
    assert run.agent_loop.sampling.temperature == 1.0 and not run.agent_loop.sampling.greedy
    assert run.group_size == 5 and run.rollout_batch_size == 512 and run.agent_loop.max_turns == 4
    assert run.agent_loop.max_tokens_per_turn == run.agent_loop.max_obs_tokens == 500
    assert run.runner.seq_length == 4096 and run.search.topk == 3 and run.search.server_addr == "127.0.0.1:8000"


def test_two_node_recipe_spreads_every_group_over_both_nodes_with_a_retrieval_replica_on_each(data_file):
    cfg = compose_recipe("qwen2.5-3b-tool-fsdp-2node", [f"data.train_data_paths=[{data_file}]",
                                                        f"data.val_data_paths=[{data_file}]"])
    run = validate_cfg(cfg)
    assert run.placement.mode == "collocated" and run.placement.topology.devices_per_node == (8, 8)
    for group in ("actor", "rollout", "reward"):
        assert run.placement[group].world_size == 16 and run.placement[group].node_ranks == (0, 1)
    assert len(run.search.server_addrs) == 2 and run.search.num_workers == 4
    assert cfg.cluster.address == "auto", "it joins the cluster `ray start` made; it does not start its own"
    assert run.actor.training_backend == "fsdp" and run.rollout_batch_size == 512 and run.group_size == 5


def test_fsdp_recipe_refuses_vllm_sharing_cpu_slots(data_file):
    """Without the GPUs the recipe declares, vLLM (no sleep mode on CPU) cannot time-share with the actor."""
    cfg = compose_recipe(TRAIN_RECIPE, [f"data.train_data_paths=[{data_file}]", "cluster.num_gpus_per_node=null"])
    with pytest.raises(ConfigError, match="rollout backend 'vllm' cannot offload on cpu devices"):
        validate_cfg(cfg)


def test_eval_recipe_validates(data_file):
    config = validate_eval_cfg(compose_recipe(EVAL_RECIPE, [f"data.val_data_paths=[{data_file}]"]))
    assert config.samples_per_prompt == 1 and config.agent_loop.sampling.greedy
    assert set(config.placement.components) == {"rollout", "reward"} and config.placement.mode == "collocated"
    assert config.rollout.model_path.endswith("hf_model") and config.rollout.backend == "vllm"
    assert config.agent_loop.max_turns == 4 and config.search.topk == 3


@pytest.mark.parametrize("overrides, message", [
    (["+actor.training_backend=fsdp"], "actor: unknown key"),
    (["algorithm.group_size=0"], "algorithm.group_size must be >= 1"),
    (["~cluster.component_placement", "+cluster.component_placement={rollout: all}"], "reward is missing"),
    (["data.val_data_paths=[/nowhere.jsonl]"], "data.val_data_paths: file not found"),
])
def test_eval_config_errors_name_the_key(data_file, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_eval_cfg(compose_recipe(EVAL_RECIPE, [f"data.val_data_paths=[{data_file}]", *overrides]))


@pytest.mark.parametrize("script", LAUNCHERS)
def test_launchers_are_valid_bash(script):
    done = subprocess.run(["bash", "-n", str(EXAMPLES / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_eval_launcher_scores_the_tiny_model_on_cpu(tmp_path, tiny_model_dir, hotpot_index_dir, hotpot_corpus):
    prepared = tmp_path / "hotpot.prepared.jsonl"
    done = subprocess.run([sys.executable, "-m", "rlinf_search.data.prepare", "--input", str(HOTPOT_DIR / "test.jsonl"),
                           "--format", "hotpotqa", "--out", str(prepared)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    questions = tmp_path / "six.prepared.jsonl"
    questions.write_text("".join(prepared.read_text().splitlines(keepends=True)[:6]))
    out = tmp_path / "eval"
    overrides = [  # the GPU recipe, moved onto this CPU: hf engine, CPU slots, the in-process BM25 index
        "cluster.num_gpus_per_node=null", "rollout.rollout_backend=hf",
        "~rollout.gpu_memory_utilization", "rollout.model.precision=fp32", f"rollout.model.model_path={tiny_model_dir}",
        f"data.val_data_paths=[{questions}]", f"runner.output_dir={out}", "runner.seq_length=512",
        "data.max_prompt_length=256", "algorithm.sampling_params.max_new_tokens=16", "agentloop.max_turns=1",
        "tools.search.backend=inprocess", f"+tools.search.index_dir={hotpot_index_dir}",
        f"+tools.search.corpus={hotpot_corpus}", "+tools.search.retriever=bm25"]
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(EXAMPLES / LAUNCHERS[1]), EVAL_RECIPE, *overrides], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "overall" in done.stdout and "hotpotqa" in done.stdout
    saved = json.loads((out / "eval_results.json").read_text())
    assert saved["overall"]["n"] == 6 and "reward" in saved["overall"]
    assert saved["model"] == str(tiny_model_dir)
    # The run's log is under its output_dir, and the folder it ran in holds only what the test put there.
    assert "overall" in (out / "driver.log").read_text()
    assert {p.name for p in tmp_path.iterdir()} == {"hotpot.prepared.jsonl", "six.prepared.jsonl", "eval"}


def test_the_training_recipes_share_everything_but_their_actor():
    """The FSDP and Megatron recipes compose the same shared groups (searchr1/, placement/, model/,
    logging/): they differ in the actor's backend and layout and in what names and sizes the run."""
    fsdp = OmegaConf.to_container(compose_recipe(TRAIN_RECIPE, []), resolve=False)
    megatron = OmegaConf.to_container(compose_recipe("qwen2.5-3b-tool-1node", []), resolve=False)
    for cfg in (fsdp, megatron):
        cfg.pop("actor"), cfg.pop("inference", None)
        cfg["runner"].pop("experiment_name"), cfg["runner"].pop("max_tokens_per_mbs")
    assert fsdp == megatron


def test_a_recipe_path_composes_its_shared_groups():
    """Tools handed a recipe file (the Megatron converter's --config) see the keys its groups hold."""
    cfg = compose_recipe_file(EXAMPLES / "config" / "qwen2.5-3b-tool-1node.yaml", ["runner.output_dir=/tmp/x"])
    assert cfg.rollout.model.model_path == "/models/Qwen2.5-3B-Instruct" and cfg.cluster.num_gpus_per_node == 8
    assert cfg.actor.megatron.ckpt_convertor.save_path == "/tmp/x/converted_hf"


@pytest.mark.parametrize(("name", "teacher_model"), [("qwen3-4b-distill", "Qwen3-30B-A3B"),
                                                      ("tiny-cpu-distill", "teacher")])
def test_distill_recipes_validate_with_their_teacher(data_file, name, teacher_model):
    overrides = [f"data.train_data_paths=[{data_file}]", f"data.val_data_paths=[{data_file}]"]
    if name.startswith("tiny"):
        overrides += ["rollout.model.model_path=/models/tiny", "data.rollout_batch_size=4"]
    run = validate_cfg(compose_recipe(name, overrides))
    assert run.distill is not None and run.distill.mode == "add" and run.distill.teacher.model == teacher_model
    assert run.distill.teacher.tokenizer is None and run.distill.temperature == run.agent_loop.sampling.temperature
    with pytest.raises(ConfigError, match="algorithm.distill: needs algorithm.sampling_params.temperature 1.0"):
        validate_cfg(compose_recipe(name, overrides + ["algorithm.sampling_params.temperature=0.7"]))
    with pytest.raises(ConfigError, match="algorithm.distill.mode: unknown 'both'"):
        validate_cfg(compose_recipe(name, overrides + ["algorithm.distill.mode=both"]))
    with pytest.raises(ConfigError, match="algorithm.distill.center: read only with algorithm.distill.enable: true"):
        validate_cfg(compose_recipe(name, overrides + ["algorithm.distill.enable=false"]))
