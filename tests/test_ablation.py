"""Ablations: study files, the report's verdict, observation masking as an arm, and a whole 2-arm x 2-seed sweep
through ``rlinf-search ablate`` (real GRPO runs on a local Ray cluster, real evals), resumed after a cell is deleted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlinf_search.ablation.report import finding
from rlinf_search.ablation.study import load_study, parse_study, study_names
from rlinf_search.config import validate_cfg
from rlinf_search.config.schema import ConfigError
from rlinf_search.data.batch import collate_trajectories
from rlinf_search.data.io_struct import Trajectory

ROOT = Path(__file__).resolve().parents[1]


def test_every_shipped_study_loads_and_names_its_arms():
    names = study_names()
    assert {"masking", "ppo_grpo", "kl", "topk", "max_turns", "retriever", "batch_size"} <= set(names)
    for name in names:
        study = load_study(name)
        assert len(study.arms) >= 2 and study.paper and "PAPER" not in study.paper, name
    assert load_study("masking").expect.better == "masked"


@pytest.mark.parametrize("name", study_names())
def test_every_shipped_arm_composes_over_the_cells_own_overrides(name, tmp_path):
    """Each arm's overrides after the ones every cell gets, checked as ``rlinf-search ablate`` checks them before
    any cell (without opening files): an arm that sets a key the cell already sets (the retriever) must compose."""
    from rlinf_search.ablation.cell import SweepSettings
    from rlinf_search.ablation.run import check_arms

    study = load_study(name)
    settings = SweepSettings(base=tmp_path / "demo", config="tiny-cpu", steps=2, eval_n=6, out=tmp_path / "out")
    assert check_arms(study, list(study.arms), settings, files=False) == [], name


@pytest.mark.parametrize("raw, message", [
    ({"arms": {"a": []}}, "at least two arm names"),
    ({"arms": {"a": [], "b c": []}}, "arm name 'b c'"),
    ({"arms": {"a": [], "b": ["kl_beta"]}}, "arms.b must be a list of key=value"),
    ({"arms": {"a": [], "b": []}, "expect": {"better": "a", "worse": "z"}}, "expect names arm(s) z not in arms"),
    ({"arms": {"a": [], "b": []}, "colour": 1}, "unknown key(s) colour"),
])
def test_a_malformed_study_is_one_line_naming_what_is_wrong(raw, message):
    with pytest.raises(ConfigError) as caught:
        parse_study(raw, name="mine")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_verdict_needs_a_difference_outside_the_spread():
    study = parse_study({"arms": {"on": [], "off": []}, "expect": {"better": "on", "worse": "off"}}, name="m")
    rows = {"on": {"heldout_em": 0.80, "heldout_em_sd": 0.01, "seeds": [0, 1, 2]},
            "off": {"heldout_em": 0.70, "heldout_em_sd": 0.01, "seeds": [0, 1, 2]}}
    assert "agrees" in finding(study, rows)
    rows["off"]["heldout_em"] = 0.90
    assert "disagrees" in finding(study, rows)
    rows["off"].update(heldout_em=0.79, heldout_em_sd=0.05)
    assert "within the spread" in finding(study, rows)
    assert "not comparable" in finding(parse_study({"arms": {"a": [], "b": []}}, name="n"), rows)


def test_unmasked_observations_are_trained_and_refused_where_they_have_no_behaviour_logprob():
    traj = Trajectory(uid="u", prompt_ids=[5, 6], response_ids=[1, 2, 3, 4], response_mask=[1, 0, 0, 1],
                      rollout_logprobs=[-1.0, 0.0, 0.0, -1.0])
    assert collate_trajectories([traj], [1.0], pad_id=0).response_mask.tolist() == [[1, 0, 0, 1]]
    trained = collate_trajectories([traj], [1.0], pad_id=0, train_observations=True)
    assert trained.response_mask.tolist() == [[1, 1, 1, 1]]
    cfg = OmegaConf.load(ROOT / "examples/searchr1/config/tiny-cpu.yaml")
    del cfg["hydra"]
    cfg.algorithm.mask_observations = False
    assert validate_cfg(cfg, files=_no_files()).mask_observations is False
    cfg.runner.pipeline = "async"
    with pytest.raises(ConfigError, match="algorithm.mask_observations: false needs engine-free old log-probs, but "
                                          "runner.pipeline is async"):
        validate_cfg(cfg, files=_no_files())


def _no_files():
    from rlinf_search.config.file_checks import FileChecks

    return FileChecks(enabled=False)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A demo-shaped base folder: a small synthetic task, its BM25 index and a tiny model as the warm start."""
    from rlinf_search.retrieval.build_index import main as build_index_main
    from toolkits.make_tiny_model import make_tiny_model
    from toolkits.synth_task import SynthSpec, write_task

    out = tmp_path_factory.mktemp("base")
    paths = write_task(out / "data", SynthSpec(people=80, seed=3))
    for split in ("train", "val", "test"):
        done = subprocess.run([sys.executable, "-m", "rlinf_search.data.prepare", "--input", str(paths[split]),
                               "--format", "flashrag", "--data-source", "synth", "--template", "brief", "--out",
                               str(out / "data" / f"{split}.prepared.jsonl")], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    assert build_index_main(["--corpus", str(paths["corpus"]), "--out", str(out / "index"), "--retriever", "bm25"]) == 0
    make_tiny_model(out / "model" / "sft", [paths["corpus"], paths["train"]])
    return out


SMALL = ["data.rollout_batch_size=4", "algorithm.group_size=2", "algorithm.sampling_params.max_new_tokens=16",
         "runner.val_check_interval=2", "runner.save_interval=2", "runner.rollout_dump=0",
         "runner.logger.logger_backends=[jsonl]"]


def _ablate(base: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlinf_search.cli", "ablate", "masking", *SMALL, "--base", str(base),
                           "--out", str(out), "--seeds", "0,1", "--steps", "2", "--eval-n", "6", *extra],
                          capture_output=True, text=True, timeout=1200, cwd=ROOT)


@pytest.mark.heavy
def test_a_two_arm_two_seed_sweep_reports_and_resumes_without_rerunning_finished_cells(base, tmp_path):
    out = tmp_path / "sweep"
    done = _ablate(base, out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert list(results["arms"]) == ["masked", "unmasked"]
    for arm in ("masked", "unmasked"):
        row = results["arms"][arm]
        assert row["seeds"] == [0, 1] and 0.0 <= row["heldout_em"] <= 1.0 and row["heldout_em_sd"] >= 0.0
        assert row["curves"]["reward/mean"]["step"] == [1, 2] and len(row["curves"]["reward/mean"]["sd"]) == 2
        assert row["curves"]["val/em"]["step"] == [2]
    # The unmasked arm's runs were trained with the observations in the loss, and scored as they were trained.
    unmasked = out / "cells" / "unmasked" / "seed1"
    assert OmegaConf.load(unmasked / "rl" / "config.yaml").algorithm.mask_observations is False
    assert OmegaConf.load(out / "cells" / "masked" / "seed1" / "rl" / "config.yaml").algorithm.get("mask_observations", True)
    evaluated = json.loads((unmasked / "eval" / "eval_results.json").read_text())
    assert evaluated["overall"]["n"] == 6 and evaluated["settings"]["source"].endswith("config.yaml")
    table = (out / "table.md").read_text()
    assert "| masked | 2 |" in table and "| unmasked | 2 |" in table and "Paper: " in table and "Ours: masked - " in table
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "[4/4] unmasked seed 1: held-out EM" in done.stdout

    # A deleted cell runs again; the three finished ones are reused untouched.
    kept = {p: p.stat().st_mtime_ns for p in out.glob("cells/*/seed*/cell.json") if "unmasked/seed0" not in str(p)}
    deleted = out / "cells" / "unmasked" / "seed0"
    import shutil

    shutil.rmtree(deleted)
    again = _ablate(base, out)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("(finished earlier, reused)") == 3
    assert "[3/4] unmasked seed 0: held-out EM" in again.stdout and (deleted / "cell.json").is_file()
    assert {p: p.stat().st_mtime_ns for p in kept} == kept
    assert json.loads((out / "results.json").read_text())["arms"]["unmasked"]["seeds"] == [0, 1]


def test_a_wrong_override_in_one_arm_stops_the_sweep_before_any_cell(base, tmp_path):
    study = tmp_path / "mine.yaml"
    study.write_text("title: t\narms:\n  a: []\n  b: [algorithm.kl_bta=0.01]\n")
    done = subprocess.run([sys.executable, "-m", "rlinf_search.cli", "ablate", str(study), "--base", str(base),
                           "--out", str(tmp_path / "sweep"), "--seeds", "0"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 2
    assert "arm b:" in done.stderr and "did you mean kl_beta?" in done.stderr
    assert not (tmp_path / "sweep" / "cells" / "a" / "seed0" / "cell.json").exists()
