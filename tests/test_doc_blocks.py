"""The docs' shell blocks as tests (``tests/doc_blocks.py``): the ``run`` blocks run at small sizes, the others'
commands are checked (recipes by ``rlinf-search check --no-files``, flags against their parser's source, repository
paths on disk), and a block without a mark fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlinf_search.cli.check import check
from tests.doc_blocks import (
    CHECKED,
    MARKS,
    ROOT,
    RUN,
    commands,
    flags_missing,
    module_sources,
    recipe_run,
    repo_paths,
    shell_blocks,
)

BLOCKS = shell_blocks()
CHECKED_BLOCKS = [block for block in BLOCKS if block.mark in CHECKED]
RUN_BLOCKS = [block for block in BLOCKS if block.mark == RUN]
# The top-level entries a run block may use from the checkout (it runs in a scratch folder linked to them, so
# what it writes, outputs/ and the like, stays out of the checkout).
LINKED = ("examples", "scripts", "benchmarks", "toolkits", "tests", "rlinf_search", "docs", "requirements",
          "pyproject.toml")


def test_every_shell_block_of_the_docs_is_marked():
    unmarked = [f"{block.name} ({block.mark or 'no mark'})" for block in BLOCKS if block.mark not in MARKS]
    assert not unmarked, f"mark each ```bash block with one of {', '.join(MARKS)}: {', '.join(unmarked)}"
    assert RUN_BLOCKS and CHECKED_BLOCKS


@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_the_commands_of_a_block_name_flags_paths_and_recipes_that_exist(block):
    problems = []
    for argv in commands(block.text):
        for path in repo_paths(argv):
            if not (ROOT / path).exists():
                problems.append(f"{' '.join(argv[:3])}: {path} does not exist")
        python = module_sources(argv)
        if python is not None:
            what, sources, args = python
            if not any(path.is_file() for path in sources):
                problems.append(f"{what}: no such script or module")
            elif missing := flags_missing(sources, args):
                problems.append(f"{what}: takes no {', '.join(missing)}")
        recipe = recipe_run(argv)
        if recipe is not None:
            name, overrides = recipe
            report = check(name, overrides, files=False)
            problems += [f"{' '.join(argv[:3])}: {problem}" for problem in report.problems]
    assert not problems, f"{block.name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[block.name for block in RUN_BLOCKS])
def test_a_run_block_runs(block, tmp_path):
    """The block as a user pastes it (small-size replacements made), from a folder that holds the checkout's
    entries, with this interpreter as ``python`` and the install's ``rlinf-search`` on PATH."""
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parents[1])
    script = tmp_path / "block.sh"
    script.write_text("set -euo pipefail\n" + block.small_text() + "\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    run = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = run.communicate(timeout=900)
    finally:
        try:  # a server the block started in the background goes with it
            os.killpg(run.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    assert run.returncode == 0, f"{block.name} failed:\n{output[-4000:]}"


def test_a_renamed_flag_a_missing_path_a_bad_override_and_a_missing_mark_are_caught(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("\n".join([
        "```bash long", "python -m rlinf_search.retrieval.build_index --corpus c.jsonl --retriver bm25 \\",
        "    --out outputs/x", "bash examples/searchr1/build_indexes.sh c.jsonl out", "```", "",
        "```bash gpu", "rlinf-search train qwen2.5-3b-tool-fsdp-1node algorithm.kl_bta=0.1  # a typo", "```", "",
        "```bash", "echo unmarked", "```"]))
    first, second, third = shell_blocks([doc])
    assert (first.mark, second.mark, third.mark) == ("long", "gpu", "")
    build, script = commands(first.text)
    what, sources, args = module_sources(build)
    assert what == "rlinf_search.retrieval.build_index" and flags_missing(sources, args) == ["--retriver"]
    assert repo_paths(script) == ["examples/searchr1/build_indexes.sh"]
    assert not (ROOT / repo_paths(script)[0]).exists()
    recipe, overrides = recipe_run(commands(second.text)[0])
    assert check(recipe, overrides, files=False).problems[0].startswith("algorithm.kl_bta: unknown key")
