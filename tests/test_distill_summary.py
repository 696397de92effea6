"""examples/searchr1/distill_summary.py: the benchmark's table, PNG and closing line, from run files laid out
as scripts/distill_demo.sh leaves them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _write_run(out, name, kls, ems):
    (out / name / "logs").mkdir(parents=True)
    rows = [{"step": step, "reward/mean": 0.1, "distill/reverse_kl": kl} for step, kl in enumerate(kls, start=1)]
    for step, em in ems.items():
        rows[step - 1]["val/em"] = em
    (out / name / "logs" / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_the_summary_compares_both_runs_kl_and_held_out_em(tmp_path):
    _write_run(tmp_path, "grpo", [2.0] * 10, {5: 0.05, 10: 0.02})
    _write_run(tmp_path, "distill", [2.0] * 5 + [1.0] * 5, {5: 0.06, 10: 0.09})
    for name, em in (("student", 0.06), ("teacher", 0.4), ("grpo", 0.02), ("distill", 0.09)):
        (tmp_path / "eval" / name).mkdir(parents=True)
        overall = {"n": 300, "em": em, "subem": em, "f1": em, "searches": 1.0}
        (tmp_path / "eval" / name / "eval_results.json").write_text(json.dumps({"overall": overall}))
    done = subprocess.run([sys.executable, "examples/searchr1/distill_summary.py", "--out", str(tmp_path),
                           "--steps", "10"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "held-out EM after 10 steps: GRPO 0.020, GRPO + distillation 0.090"
    assert "GRPO + distillation: reverse KL to the teacher, first 5 -> last 5 steps: 2.000 -> 1.000" in lines
    summary = json.loads((tmp_path / "distill_summary.json").read_text())
    assert summary["reverse_kl_first5_last5"]["grpo"] == pytest.approx([2.0, 2.0])
    assert (tmp_path / "distill.png").stat().st_size > 0


def test_a_missing_run_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "examples/searchr1/distill_summary.py", "--out", str(tmp_path),
                           "--steps", "10"], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "no metrics at" in done.stderr


def _compare_run(out, name, val_em_at_20, test_ems):
    folder = out / "runs" / name
    (folder / "logs").mkdir(parents=True)
    rows = [{"step": 10, "val/em": 0.0}, {"step": 20, "val/em": val_em_at_20}]
    (folder / "logs" / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    for step, em in test_ems.items():
        (folder / "eval" / f"step_{step}").mkdir(parents=True)
        (folder / "eval" / f"step_{step}" / "eval_results.json").write_text(json.dumps({"overall": {"em": em}}))
    (folder / "done").touch()


def test_the_comparison_chooses_each_arms_lr_by_validation_and_averages_seeds(tmp_path):
    """scripts/distill_compare.sh's summary: the lr with the best validation EM at the last step on the first
    seed (held-out EM plays no part: the 1e-4 run has the better test EM and is not chosen), then the table
    over seeds at that lr; an unfinished run (no ``done``) is not read."""
    _compare_run(tmp_path, "grpo_lr1e-4_s0", 0.30, {10: 0.5, 20: 0.9})
    _compare_run(tmp_path, "grpo_lr3e-4_s0", 0.40, {10: 0.2, 20: 0.4})
    _compare_run(tmp_path, "grpo_lr3e-4_s1", 0.10, {10: 0.4, 20: 0.6})
    _compare_run(tmp_path, "grpo_topk_lr1e-4_s0", 0.50, {10: 0.6, 20: 0.7})
    (tmp_path / "runs" / "grpo_topk_lr3e-4_s0").mkdir()  # still running: no done file
    script = "examples/searchr1/distill_compare_summary.py"
    chosen = subprocess.run([sys.executable, script, "--out", str(tmp_path), "--steps", "20", "--best-lr", "grpo"],
                            capture_output=True, text=True)
    assert chosen.returncode == 0 and chosen.stdout.strip() == "3e-4", chosen.stderr
    done = subprocess.run([sys.executable, script, "--out", str(tmp_path), "--steps", "20", "--every", "10",
                           "--seeds", "0", "1"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    grpo = next(line for line in done.stdout.splitlines() if line.startswith("GRPO  "))
    assert "3e-4" in grpo and "0.300 ± 0.141" in grpo and "0.500 ± 0.141" in grpo
    summary = json.loads((tmp_path / "distill_compare.json").read_text())
    assert summary["grpo_topk"] == {"lr": "1e-4", "test_em": {"10": [0.6], "20": [0.7]}}
    assert (tmp_path / "distill_compare.png").stat().st_size > 0
