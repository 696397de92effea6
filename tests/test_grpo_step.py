"""``benchmarks/grpo_step.py``, the GPU check's one-process GRPO step, run whole on CPU with the tiny model: the HF
engine samples, the FSDP2 trainer scores and updates, and the engine ends up holding exactly the updated weights.
A process of its own, as a user runs it (FSDP2 opens a process group there)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_one_process_grpo_step_updates_the_engine_to_the_trained_weights(tiny_model_dir):
    done = subprocess.run([sys.executable, "benchmarks/grpo_step.py", "--model-dir", str(tiny_model_dir),
                           "--device", "cpu", "--prompts", "4", "--group", "3", "--max-new-tokens", "16",
                           "--mbs-tokens", "400", "--bucket-mib", "1"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    printed = done.stdout
    assert "4 prompts x 3 samples, 12 rows" in printed
    assert "engine holds the trainer's weights exactly: True" in printed and "changed by the step: True" in printed
    for stage in ("rollout", "old log-probs", "update", "sync"):
        assert f"\n{stage} " in printed
