"""Checkpoints (atomic, resumable, damage detected), metric sinks and the curve plot, on real files."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlinf_search.checkpoint import (
    COMPLETE_MARK,
    HF_SUBDIR,
    RunnerState,
    begin_checkpoint,
    capture_rng,
    latest_checkpoint,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from rlinf_search.plot import main as plot_main
from rlinf_search.plot import moving_average
from rlinf_search.runners.metric_logger import METRICS_FILE, MetricLogger
from rlinf_search.workers.actor.config import ActorConfig
from rlinf_search.workers.actor.policy_trainer import PolicyTrainer


def test_save_resume_and_skip_damaged(tmp_path, tiny_model_dir):
    trainer = PolicyTrainer(ActorConfig(model_path=str(tiny_model_dir)))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for step in (1, 2, 3):
        trainer.global_step = step
        state = RunnerState(global_step=step, epoch=0, batch_in_epoch=step, rng=capture_rng())
        staging = begin_checkpoint(tmp_path, step)
        save_checkpoint(tmp_path, state, model=trainer.model, tokenizer=tokenizer,
                        training_state=trainer.training_state(staging), begun=True)
    assert latest_checkpoint(tmp_path).name == "global_step_3"
    # A truncated weights file and a checkpoint that never got its completion mark are both skipped.
    weights = next((tmp_path / "global_step_3" / HF_SUBDIR).glob("*.safetensors"))
    weights.write_bytes(b"")
    (tmp_path / "global_step_2" / COMPLETE_MARK).unlink()
    (tmp_path / "global_step_4.tmp").mkdir()  # a crash mid-write leaves only the staging folder
    chosen = latest_checkpoint(tmp_path)
    assert chosen.name == "global_step_1"
    state, training = load_checkpoint(chosen)
    assert state.global_step == 1 and state.batch_in_epoch == 1 and training.global_step == 1
    reloaded = AutoModelForCausalLM.from_pretrained(chosen / HF_SUBDIR)
    for (name, a), b in zip(trainer.model.state_dict().items(), reloaded.state_dict().values()):
        assert torch.equal(a, b), name
    assert latest_checkpoint(tmp_path / "none") is None


def test_rng_round_trip():
    saved = json.loads(json.dumps(capture_rng(), default=lambda v: v.tolist()))
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    restore_rng(saved)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_metric_sinks_and_plot(tmp_path, capsys):
    settings = {"algorithm": {"kl_beta": 0.001, "adv_type": "grpo"}, "data": {"train_data_paths": ["a.jsonl"]}}
    logger = MetricLogger(tmp_path, ["console", "jsonl", "tensorboard"], settings=settings)
    for step in range(1, 6):
        logger.log({"reward/mean": 0.1 * step, "actor/kl": 0.01, "rollout/searches_per_trajectory": step / 5},
                   step)
    logger.close()
    rows = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and rows[-1]["reward/mean"] == pytest.approx(0.5)
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1, "hparams go into the run's own event file"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulated = EventAccumulator(str(events[0]), size_guidance={"tensors": 0}).Reload()
    assert accumulated.PluginTagToContent("hparams"), "the settings are recorded as hparams"
    hparams = accumulated.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    assert b"algorithm.kl_beta" in hparams and b"data.train_data_paths" in hparams
    assert "config/text_summary" in accumulated.Tags()["tensors"]
    assert "step 5: reward=0.5" in capsys.readouterr().out
    assert plot_main([str(tmp_path), "--out", str(tmp_path / "curves.png")]) == 0
    png = (tmp_path / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert plot_main([str(tmp_path / "missing")]) == 1
    with pytest.raises(ValueError, match="unknown \\['nope'\\]"):
        MetricLogger(tmp_path, ["nope"])


def test_long_series_are_drawn_with_a_moving_average(tmp_path):
    assert moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    with open(tmp_path / "metrics.jsonl", "w") as handle:
        for step in range(1, 41):  # a noisy rising reward, as the demo logs it
            handle.write(json.dumps({"step": step, "reward/mean": step / 40 + (0.2 if step % 2 else -0.2)}) + "\n")
    assert plot_main([str(tmp_path), "--keys", "reward/mean"]) == 0
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
