"""Offload between phases on a real tiny Qwen2: every storage is freed while away, the round trip is
bitwise, training is unchanged.

There is no second device here, so the tests force the swap (``force=True``) that a GPU run makes: each
storage is copied to a host buffer and resized to zero bytes, and the bytes each tensor still holds prove
the memory went back. Without ``force``, an offload to the device the model is on moves nothing.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from rlinf_search.algorithms import compute_advantages
from rlinf_search.config import validate_cfg
from rlinf_search.data.batch import collate_trajectories
from rlinf_search.data.io_struct import Trajectory
from rlinf_search.workers.actor.config import ActorConfig, OptimConfig
from rlinf_search.workers.actor.logprobs import place_rows
from rlinf_search.workers.actor.policy_trainer import PolicyTrainer
from rlinf_search.workers.offload import CATEGORIES, OffloadConfig, Offloader
from tests.conftest import HOTPOT_DIR

EVERYTHING = OffloadConfig(weights=True, grads=True, optimizer=True)


def _batch(trainer: PolicyTrainer, tokenizer):
    trajectories = []
    for uid, question in (("q1", "Who wrote Demon Dice?"), ("q2", "Where was Haymo of Faversham from?")):
        for answer in ("<search> q </search><answer> Lester Smith </answer>", "<answer> nobody </answer>"):
            ids = tokenizer.encode(answer)
            trajectories.append(Trajectory(uid=uid, prompt_ids=tokenizer.encode(question), response_ids=ids,
                                           response_mask=[1] * len(ids), rollout_logprobs=[0.0] * len(ids)))
    batch = collate_trajectories(trajectories, [1.0, 0.0, 0.0, 1.0], pad_id=tokenizer.pad_token_id)
    batch.old_logprobs = place_rows(tuple(batch.response_mask.shape), [trainer.compute_logprobs(batch)])
    batch.advantages = compute_advantages("grpo", rewards=batch.rewards, response_mask=batch.response_mask,
                                          uids=batch.uids).advantages
    return batch


def _state(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    """Every tensor an offload touches, by a stable name, cloned."""
    out = {}
    for name, param in trainer.model.named_parameters():
        out[f"param {name}"] = param.detach().clone()
        if param.grad is not None:
            out[f"grad {name}"] = param.grad.clone()
    for name, buffer in trainer.model.named_buffers():
        out[f"buffer {name}"] = buffer.clone()
    for index, state in trainer.optimizer.state_dict()["state"].items():
        for key, value in state.items():
            out[f"optim {index} {key}"] = value.clone()
    return out


def _bytes_held(tensors: list[torch.Tensor]) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


def _owning_trainer(tiny_model_dir) -> PolicyTrainer:
    """A trainer whose weights the allocator owns, as after ``.to("cuda")``: on the CPU the loader leaves them
    memory-mapped from the checkpoint file, which no offload can free."""
    trainer = PolicyTrainer(ActorConfig(model_path=str(tiny_model_dir), optim=OptimConfig(lr=1e-3, weight_decay=0.01)))
    with torch.no_grad():
        for param in trainer.model.parameters():
            param.data = param.data.clone()
    return trainer


def _trained(tiny_model_dir) -> tuple[PolicyTrainer, PolicyTrainer, object]:
    """Two trainers after one update on the same batch (so there are gradients and Adam moments to move)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    offloaded, plain = _owning_trainer(tiny_model_dir), _owning_trainer(tiny_model_dir)
    batch = _batch(plain, tokenizer)
    offloaded.train_on_batch(batch)
    plain.train_on_batch(batch)
    return offloaded, plain, batch


def test_offload_frees_every_storage_and_the_round_trip_changes_nothing(tiny_model_dir):
    offloaded, plain, batch = _trained(tiny_model_dir)
    before = _state(offloaded)
    parameters = list(offloaded.model.parameters())
    assert any(k.startswith("grad ") for k in before) and any(k.endswith("exp_avg_sq") for k in before)
    listed = offloaded.offload_tensors()
    held = {name: _bytes_held(getattr(listed, name)) for name in CATEGORIES}
    assert min(held.values()) > 0, held

    offloader = Offloader(EVERYTHING, offloaded.offload_tensors, device=offloaded.device)
    offloader.offload(force=True)  # the host is the device here: force the swap a GPU run makes
    assert offloader.offloaded
    assert {name: _bytes_held(getattr(listed, name)) for name in CATEGORIES} == dict.fromkeys(CATEGORIES, 0), \
        "every parameter, gradient and Adam moment gave its memory back"
    hosts = [host for pairs in offloader._away.values() for _, host in pairs]
    assert sum(h.numel() for h in hosts) == sum(held.values())
    offloader.offload(force=True)  # idempotent: a second call moves nothing
    assert [host for pairs in offloader._away.values() for _, host in pairs] == hosts
    offloader.onload()

    after = _state(offloaded)
    assert after.keys() == before.keys()
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor) and after[name].dtype == tensor.dtype, f"{name} changed"
    assert list(offloaded.model.parameters()) == parameters and all(
        a is b for a, b in zip(offloaded.optimizer.param_groups[0]["params"], parameters)), \
        "the same Parameter objects, still the optimizer's"
    # The next offload reuses the host buffers of the first (pinning them again on a GPU would be slow).
    offloader.offload(force=True)
    assert {id(h) for pairs in offloader._away.values() for _, h in pairs} == {id(h) for h in hosts}
    offloader.onload()

    # The next update, with and without the round trips, gives bitwise the same model.
    offloaded.train_on_batch(batch)
    plain.train_on_batch(batch)
    for (name, a), b in zip(offloaded.model.named_parameters(), plain.model.parameters()):
        assert torch.equal(a, b), f"{name} differs after training on offloaded-and-reloaded state"


def test_on_device_brings_back_only_what_it_names_and_sends_it_away_again(tiny_model_dir):
    trainer, _, _ = _trained(tiny_model_dir)
    weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    offloader = Offloader(EVERYTHING, trainer.offload_tensors, device=trainer.device)
    offloader.offload(force=True)
    listed = trainer.offload_tensors()
    with offloader.on_device("weights"):  # a weight sync reads the weights, not the optimizer
        assert all(torch.equal(p, weights[n]) for n, p in trainer.model.named_parameters())
        assert _bytes_held(listed.optimizer) == 0 and _bytes_held(listed.grads) == 0
    assert _bytes_held(listed.weights) == 0 and offloader.offloaded
    offloader.onload(["weights"])
    with offloader.on_device("weights"):  # already there: nothing else comes back with them
        assert _bytes_held(listed.optimizer) == 0
    offloader.onload()
    assert not offloader.offloaded and _bytes_held(listed.optimizer) > 0


def test_offload_to_the_device_it_is_on_copies_nothing(tiny_model_dir):
    trainer, _, _ = _trained(tiny_model_dir)
    pointers = [t.data_ptr() for t in trainer.offload_tensors().weights]
    offloader = Offloader(EVERYTHING, trainer.offload_tensors, device="cpu")
    offloader.offload()
    assert offloader.offloaded and _bytes_held(trainer.offload_tensors().weights) > 0, "left alone"
    with offloader.on_device("weights"):
        pass
    offloader.onload()
    assert not offloader.offloaded and [t.data_ptr() for t in trainer.offload_tensors().weights] == pointers


def test_memory_the_allocator_does_not_own_is_refused_before_anything_moves(tiny_model_dir):
    """Weights memory-mapped from the checkpoint (the CPU loader's) cannot be freed: a one-line error, raised
    before any storage is touched."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    trainer = PolicyTrainer(ActorConfig(model_path=str(tiny_model_dir), optim=OptimConfig(lr=1e-3)))
    trainer.train_on_batch(_batch(trainer, tokenizer))
    before = _state(trainer)
    offloader = Offloader(EVERYTHING, trainer.offload_tensors, device=trainer.device)
    with pytest.raises(RuntimeError, match="offload of weights: a storage of .* is not owned by torch's allocator"):
        offloader.offload(force=True)
    assert not offloader.offloaded
    assert all(torch.equal(_state(trainer)[name], tensor) for name, tensor in before.items())


def test_offload_keys_are_read():
    cfg = OmegaConf.load("examples/searchr1/config/tiny-cpu.yaml")
    cfg.data.train_data_paths = [str(HOTPOT_DIR / "test.jsonl")]
    cfg.data.val_data_paths = []
    assert validate_cfg(cfg).actor.offload == OffloadConfig()
    cfg.actor.offload_weight, cfg.actor.offload_optimizer = True, True
    assert validate_cfg(cfg).actor.offload == OffloadConfig(weights=True, grads=False, optimizer=True)
