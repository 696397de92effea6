"""The learning run: scripts/demo.sh, as a user's first command runs it, must raise held-out EM and the search rate.

Heavy lane (``bash scripts/test.sh --heavy``): it builds the model, data and index, warm-starts (every stage until
its probes pass), trains with GRPO through the worker groups on a local Ray cluster and evaluates before and after,
scoring fewer held-out questions (200 instead of 300). One case: seed 2 with ``ATEN_CPU_CAPABILITY=avx2`` (the
kernels of a CPU without AVX-512, which sum in another order), the case whose warm start once stopped at the skill
stage's cap with the last kinds of fact not yet copied (docs/history/results.md, "Every seed and kernel set"). A
second case (seed 1, the kernels PyTorch picks) doubled the heavy lane's longest test (445 s a case on an AMD EPYC,
2026-12-03) and pushed CI past an hour; the AVX-512 kernels are run by the demo runs docs/results.md records
(seeds 0, 1 and 2). Any seed and kernel set: ``DEMO_SEED=1 bash scripts/demo.sh``. It runs in ``.venv`` on
``requirements/cpu-lock.txt``: the releases ``bash scripts/demo.sh`` installs on a fresh machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _locked(name: str) -> str:
    """The version requirements/cpu-lock.txt pins ``name`` to."""
    for line in (ROOT / "requirements" / "cpu-lock.txt").read_text().splitlines():
        if line.lower().startswith(f"{name}=="):
            return line.split("==", 1)[1]
    raise AssertionError(f"{name} is not in requirements/cpu-lock.txt")


SEED, KERNELS = 2, "avx2"


@pytest.mark.heavy
def test_short_demo_run_learns_to_search(tmp_path):
    env = {**os.environ, "DEMO_OUT": str(tmp_path / "demo"), "DEMO_EVAL_N": "200", "DEMO_SEED": str(SEED),
           "ATEN_CPU_CAPABILITY": KERNELS}
    result = subprocess.run(["bash", "scripts/demo.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"held-out EM: warm-start (\d\.\d+) -> after RL (\d\.\d+)", last)
    assert match, last
    summary = json.loads((tmp_path / "demo" / "eval_results.json").read_text())
    before, after = summary["warm_start"], summary["after_rl"]
    assert (before["em"], after["em"]) == (float(match[1]), float(match[2]))
    # A regression that stops learning keeps held-out EM where the warm start left it and the training
    # reward flat. The full demo gains +0.20 or more on seeds 0, 1 and 2 (docs/history/results.md); 0.15 leaves
    # room for the 200-question sample (one standard error of a difference is about 0.04).
    assert after["em"] - before["em"] >= 0.15, summary
    rows = [json.loads(line) for line in (tmp_path / "demo" / "rl" / "logs" / "metrics.jsonl").read_text().splitlines()]
    rewards = [row["reward/mean"] for row in rows if "reward/mean" in row]
    assert len(rewards) >= 20, len(rewards)
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first, (first, last)
    machine = json.loads((tmp_path / "demo" / "machine.json").read_text())
    assert machine["torch_cpu_capability"] == KERNELS.upper(), machine
    assert machine["releases"]["transformers"] == _locked("transformers"), "the demo ran on the locked release"
    assert (tmp_path / "demo" / "curves.png").stat().st_size > 0
    assert (tmp_path / "demo" / "eval_comparison.png").stat().st_size > 0
