"""A rollout engine of a user's own, named by dotted path (``examples/plugins/gpu_offload_engine.py``): start-up
checks the run against the traits it declares, as it does the built-ins', and a real disaggregated run places it,
syncs weights into it and trains (``tests/test_train_runner.py`` holds that run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlinf_search.config import ConfigError, validate_cfg
from rlinf_search.config.file_checks import FileChecks
from rlinf_search.workers.rollout.base import EngineTraits, traits_of

ROOT = Path(__file__).resolve().parents[1]
ENGINE = "examples.plugins.gpu_offload_engine:build"


def _config(**changes):
    cfg = OmegaConf.load(ROOT / "examples/searchr1/config/tiny-cpu.yaml")
    del cfg["hydra"]
    cfg.rollout.rollout_backend = ENGINE
    for dotted, value in changes.items():
        OmegaConf.update(cfg, dotted, value, merge=False)
    return cfg


def _check(cfg):
    return validate_cfg(cfg, files=FileChecks(enabled=False))


def test_the_engine_declares_its_traits_beside_its_factory():
    assert traits_of(ENGINE) == EngineTraits(offloads_on=frozenset({"cuda"}), filtered_logprobs=True)
    assert traits_of("hf") == EngineTraits()


def test_the_placement_takes_the_engine_by_its_offload_trait():
    # Collocated on CPU slots: it cannot release its memory there, so it may not share a slot with the actor.
    with pytest.raises(ConfigError, match=f"rollout backend '{ENGINE}' cannot offload on cpu devices, so rollout "
                                          "cannot share devices 0-1 with actor"):
        _check(_config())
    # Devices of its own on CPU, or collocated on GPUs, where it offloads: both accepted.
    apart = _check(_config(**{"cluster.cpu_slots_per_node": 3,
                              "cluster.component_placement": {"actor": "0", "rollout": "1", "reward": "2"}}))
    assert apart.placement.mode == "disaggregated" and apart.rollout.backend == ENGINE
    on_gpus = _check(_config(**{"cluster.num_gpus_per_node": 1}))
    assert on_gpus.placement.mode == "collocated"


def test_the_sampling_checks_follow_the_filtered_logprobs_trait():
    apart = {"cluster.cpu_slots_per_node": 3, "cluster.component_placement": {"actor": "0", "rollout": "1",
                                                                              "reward": "2"},
             "algorithm.recompute_logprobs": False, "algorithm.sampling_params.top_p": 0.9}
    with pytest.raises(ConfigError, match=f"top_k 0 and top_p 1 with rollout_backend {ENGINE}: its log-probs are "
                                          "of the top-k/top-p filtered distribution"):
        _check(_config(**apart))
    # The HF engine's log-probs are the model's: the same run is fine on it.
    _check(_config(**{**apart, "rollout.rollout_backend": "hf"}))
    # A key only vLLM reads is refused with this engine, naming the engine that reads it.
    with pytest.raises(ConfigError, match=f"rollout.gpu_memory_utilization: read by rollout_backend vllm only, and "
                                          f"this run uses {ENGINE}"):
        _check(_config(**{"cluster.num_gpus_per_node": 1, "rollout.gpu_memory_utilization": 0.4}))
