"""The ``rlinf-search`` command as a user runs it: the console script the install puts on PATH, every subcommand's
``--help``, ``check`` on the GPU recipes (on this CPU machine, without their files) and on the CPU recipe with real
files, and the one-line refusals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI = Path(sys.executable).parent / "rlinf-search"
GPU_RECIPES = ("qwen2.5-3b-tool-1node", "qwen2.5-3b-tool-fsdp-1node", "qwen2.5-3b-tool-fsdp-2node", "qwen3-4b-distill")


def console(*args: str, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess:
    """The console script in its own process, as a shell runs it."""
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The same app in this process (typer's runner: what the console script calls, without the interpreter's
    start-up for each of these tests), its stdout, stderr and exit code."""
    from typer.testing import CliRunner

    from rlinf_search.cli import app

    previous = Path.cwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    finally:
        os.chdir(previous)
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def test_the_install_puts_the_command_on_path_and_it_lists_its_subcommands():
    assert CLI.is_file(), "pip install -e . creates the console script (pyproject [project.scripts])"
    done = console("--help")
    assert done.returncode == 0, done.stderr
    for command in ("check", "train", "eval", "prepare", "index", "serve", "plot", "demo"):
        assert f"  {command} " in done.stdout, command


@pytest.mark.parametrize("command, says", [
    (["check"], "--no-files"), (["train"], "runner.resume_dir=auto"), (["eval"], "--server-addr"),
    (["prepare"], "--format"), (["index", "build"], "--retriever"), (["index", "serve"], "--save-address-to"),
    (["serve"], "--api-key"), (["plot"], "--out"), (["demo"], "DEMO_RL_STEPS")])
def test_every_subcommand_answers_help(command, says):
    done = cli(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert says in done.stdout


@pytest.mark.parametrize("recipe", [*GPU_RECIPES, "qwen2.5-3b-tool-1node-eval"])
def test_check_passes_the_gpu_recipes_on_a_laptop_and_lists_what_it_did_not_open(recipe):
    done = cli("check", recipe, "--no-files")
    assert done.returncode == 0, done.stderr
    first, *skipped = done.stdout.splitlines()
    assert first.startswith(f"{recipe}: ok (") and "cuda" in first
    assert "eval of" in first if recipe.endswith("-eval") else "training, collocated on" in first
    assert any("rollout.model.model_path" in line for line in skipped)
    assert all(line.startswith("  not checked (--no-files): ") for line in skipped)


def test_check_refuses_a_misspelt_key_in_one_line_with_the_name_it_meant():
    done = console("check", "qwen2.5-3b-tool-fsdp-1node", "--no-files", "algorithm.kl_bta=0.01")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("algorithm.kl_bta: unknown key; algorithm takes ")
    assert done.stderr.rstrip().endswith("did you mean kl_beta?")


def test_a_key_the_recipe_lacks_takes_the_last_of_two_overrides():
    """The ablation sweep sets ``tools.search.retriever`` for every cell and an arm sets it again: a key tiny-cpu
    does not name must take repeated overrides as a key it names does (the later wins), not refuse the second."""
    from rlinf_search.cli.configs import compose

    cfg = compose("tiny-cpu", ["tools.search.retriever=bm25", "runner.max_steps=3", "tools.search.retriever=minilm",
                               "runner.max_steps=5"])
    assert cfg.tools.search.retriever == "minilm" and cfg.runner.max_steps == 5
    done = cli("check", "tiny-cpu", "--no-files", "tools.search.retriever=bm25", "tools.search.retriever=hybrid")
    assert done.returncode == 0, done.stderr


def test_check_lists_every_misspelt_key_not_only_the_first():
    done = cli("check", "tiny-cpu", "--no-files", "+runner.max_step=3", "+algorithm.group_sise=4")
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert [line.split(":")[0] for line in lines] == ["runner.max_step", "algorithm.group_sise"]


@pytest.mark.parametrize("overrides, problem", [
    (["~cluster.component_placement", "+cluster.component_placement={actor: 0-15, rollout: 0-7, reward: 0-7}"],
     "cluster.component_placement.actor: device range 0-15 exceeds the 8 devices of this cluster"),
    (["data.rollout_batch_size=511"], "data.rollout_batch_size * algorithm.group_size"),
    (["runner.pipeline=asynch"], "runner.pipeline"),
])
def test_check_catches_the_cross_key_rules_and_the_placement_without_a_cluster(overrides, problem):
    done = cli("check", "qwen2.5-3b-tool-fsdp-1node", "--no-files", *overrides)
    assert done.returncode == 1 and done.stderr.startswith(problem), done.stderr
    assert done.stderr.count("\n") == 1


def test_check_opens_the_files_a_cpu_recipe_names(tmp_path, tiny_model_dir):
    data = tmp_path / "train.prepared.jsonl"
    data.write_text("{}\n" * 20)  # counted (a batch of 16 at least); the rows are parsed when the run reads them
    files = [f"data.train_data_paths=[{data}]", f"data.val_data_paths=[{data}]"]
    done = cli("check", "tiny-cpu", *files, f"rollout.model.model_path={tiny_model_dir}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("tiny-cpu: ok (training, collocated on 1 node x 2 cpu: actor 2, rollout 2, "
                                   "reward 2, inference 2, pipeline sync, 30 steps of 16 prompts x 4, actor fsdp, "
                                   "rollout hf)")
    small = tmp_path / "ten.prepared.jsonl"
    small.write_text("{}\n" * 10)
    too_few = cli("check", "tiny-cpu", f"data.train_data_paths=[{small}]", f"data.val_data_paths=[{data}]",
                  f"rollout.model.model_path={tiny_model_dir}")
    assert too_few.returncode == 1
    assert too_few.stderr.startswith("data.rollout_batch_size (16) is larger than the training set (10 prompts")
    missing = cli("check", "tiny-cpu", *files, f"rollout.model.model_path={tmp_path / 'nowhere'}")
    assert missing.returncode == 1
    assert missing.stderr.startswith(f"rollout.model.model_path: {tmp_path / 'nowhere'} is not a Hugging Face model")
    no_data = cli("check", "tiny-cpu", f"rollout.model.model_path={tiny_model_dir}")
    assert no_data.returncode == 1
    assert no_data.stderr.strip() == "data.train_data_paths: file not found: outputs/tiny-cpu/data/train.prepared.jsonl"


def test_a_recipe_that_is_not_there_and_an_override_hydra_cannot_parse_are_one_line(tmp_path):
    missing = cli("check", "qwen9-tool")
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1
    assert missing.stderr.startswith("config qwen9-tool: not a YAML file and not a recipe of examples/searchr1/config")
    broken = console("train", "tiny-cpu", "runner.max_steps", cwd=tmp_path)
    assert broken.returncode == 2 and broken.stderr.startswith("config error: config tiny-cpu: ")
    assert list(tmp_path.iterdir()) == [], "a refused run writes nothing"


def test_check_takes_a_yaml_path_with_its_own_defaults(tmp_path):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text((ROOT / "examples/searchr1/config/tiny-cpu.yaml").read_text())
    done = cli("check", str(recipe), "--no-files", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{recipe}: ok (training")


@pytest.mark.parametrize("launcher, says", [
    ("run_main_searchr1_single.sh", "rlinf-search train"), ("run_main_searchr1_single_eval.sh", "rlinf-search eval"),
    ("build_index.sh", "rlinf-search index build --help"), ("launch_local_server.sh", "rlinf-search index serve --help")])
def test_the_launchers_answer_help_and_leave_nothing_behind(launcher, says, tmp_path):
    done = subprocess.run(["bash", str(ROOT / "examples/searchr1" / launcher), "--help"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0 and says in done.stdout, done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_index_launchers_build_and_serve_through_the_command(tmp_path):
    import json

    import httpx

    env = {**os.environ, "PYTHON": sys.executable, "PORT": "0"}
    corpus = ROOT / "tests/data/hotpotqa_100/corpus.jsonl"
    built = subprocess.run(["bash", str(ROOT / "examples/searchr1/build_index.sh"), str(corpus), str(tmp_path / "idx"),
                            "bm25"], capture_output=True, text=True, env=env, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    address_file = tmp_path / "server.addr"
    server = subprocess.Popen(["bash", str(ROOT / "examples/searchr1/launch_local_server.sh"), str(tmp_path / "idx"),
                               str(corpus), "bm25", "--save-address-to", str(address_file)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        from rlinf_search.retrieval.launch import wait_for_address_file

        address = wait_for_address_file(address_file, timeout_s=120)
        answer = httpx.post(f"http://{address}/retrieve", json={"queries": ["Demon Dice dice game"], "topk": 1},
                            timeout=30).json()
        assert json.dumps(answer["result"][0][0]).count("Demon Dice") >= 1
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
