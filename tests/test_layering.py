"""Workers are handed their own config sections: none imports a runner or the run-level config."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN_LEVEL = ("rlinf_search.runners", "rlinf_search.config")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _imports_of(package: str, banned: tuple[str, ...]) -> list[str]:
    """``path: module`` for every import of a ``banned`` module (or one below it) by a module of ``package``."""
    offenders = []
    for path in sorted((ROOT / "rlinf_search" / package).rglob("*.py")):
        for name in _imports(path):
            if any(name == b or name.startswith(b + ".") for b in banned):
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    return offenders


def test_no_worker_module_imports_a_runner_or_the_run_config():
    offenders = _imports_of("workers", RUN_LEVEL)
    assert not offenders, offenders


def test_the_reward_worker_loads_only_rewards_and_the_runtime():
    code = ("import sys, rlinf_search.workers.reward.worker\n"
            "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('rlinf_search'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=ROOT).stdout.split()
    # The reward functions, the worker runtime, the IO structs and the key declarations its view's fields carry
    # (a stdlib-only module): nothing of training, rollout or runs.
    packages = ("rlinf_search.rewards", "rlinf_search.scheduler", "rlinf_search.workers.reward")
    modules = ("rlinf_search", "rlinf_search.workers", "rlinf_search.data", "rlinf_search.data.io_struct",
               "rlinf_search.registry", "rlinf_search.plugins", "rlinf_search.section_model")
    stray = [m for m in loaded if m not in modules and not m.startswith(packages)]
    assert not stray, stray
    assert len(loaded) <= 25, loaded  # 70 when the worker took the whole RunConfig


def test_agents_are_a_floor_below_the_workers():
    """Agent loops import nothing from the workers (or runners, or the run config): the engine protocol, the
    routing session and the seeds live in ``agents/engine.py``, and the workers import them from there."""
    offenders = _imports_of("agents", ("rlinf_search.workers", *RUN_LEVEL))
    assert not offenders, offenders


def test_no_protocol_imports_another_protocols_private_names():
    """``searchr1`` and ``toolcall`` are siblings over ``agents/base.py``: neither reaches into the other's privates."""
    offenders = []
    for path in sorted((ROOT / "rlinf_search" / "agents").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlinf_search.agents"):
                offenders += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                              if a.name.startswith("_")]
    assert not offenders, offenders
