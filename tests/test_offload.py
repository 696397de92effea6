"""Offload between phases on a real tiny Qwen2: the state round trip is bitwise, training is unchanged.

There is no second device here, so the round trip forces fresh storage (``copy=True``): every
parameter, gradient and optimizer entry is re-pointed and brought back exactly as on a GPU box,
and the data pointers prove the copies happened. Without ``copy``, an offload to the device the
model is on must copy nothing.
"""

from __future__ import annotations

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
from rlinf_search.workers.offload import OffloadConfig, Offloader
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


def _tensors(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    """The tensors themselves (not clones): holding them keeps their memory from being reused, so
    distinct data pointers really mean distinct storage."""
    out = {f"param {n}": p.data for n, p in trainer.model.named_parameters()}
    out.update({f"grad {n}": p.grad for n, p in trainer.model.named_parameters() if p.grad is not None})
    for param, state in trainer.optimizer.state.items():
        out.update({f"optim {id(param)} {k}": v for k, v in state.items() if torch.is_tensor(v)})
    return out


def _pointers(tensors: dict[str, torch.Tensor]) -> set[int]:
    return {t.data_ptr() for t in tensors.values()}


def _trainers(tiny_model_dir):
    config = ActorConfig(model_path=str(tiny_model_dir), optim=OptimConfig(lr=1e-3, weight_decay=0.01))
    return PolicyTrainer(config), PolicyTrainer(config)


def test_round_trip_is_bitwise_and_training_is_unchanged(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    offloaded, plain = _trainers(tiny_model_dir)
    batch = _batch(plain, tokenizer)
    offloaded.train_on_batch(batch)
    plain.train_on_batch(batch)  # now there are Adam moments and gradients to move
    before, originals = _state(offloaded), _tensors(offloaded)
    assert any(k.startswith("grad ") for k in before) and any(k.endswith("exp_avg_sq") for k in before)

    offloader = Offloader(EVERYTHING, modules=[offloaded.model], optimizer=offloaded.optimizer,
                          device=offloaded.device, offload_device="cpu")
    offloader.offload(copy=True)
    assert offloader.offloaded and all(p.grad is None for p in offloaded.model.parameters()), "gradients parked"
    away = _tensors(offloaded)
    assert not _pointers(away) & _pointers(originals), "every tensor moved to fresh storage"
    offloader.offload(copy=True)  # idempotent: a second call moves nothing
    assert _pointers(_tensors(offloaded)) == _pointers(away)
    offloader.onload(copy=True)

    after = _state(offloaded)
    assert after.keys() == before.keys()
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor) and after[name].dtype == tensor.dtype, f"{name} changed"
    assert not _pointers(_tensors(offloaded)) & (_pointers(originals) | _pointers(away)), "and back, fresh again"
    parameters = list(offloaded.model.parameters())
    assert all(a is b for a, b in zip(offloaded.optimizer.param_groups[0]["params"], parameters)), \
        "the optimizer still updates the model's own parameters"

    # The next update, with and without the round trip, gives bitwise the same model.
    offloaded.train_on_batch(batch)
    plain.train_on_batch(batch)
    for (name, a), b in zip(offloaded.model.named_parameters(), plain.model.parameters()):
        assert torch.equal(a, b), f"{name} differs after training on offloaded-and-reloaded state"


def test_offload_to_the_device_it_is_on_copies_nothing(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    trainer, _ = _trainers(tiny_model_dir)
    trainer.train_on_batch(_batch(trainer, tokenizer))
    tensors = _tensors(trainer)
    offloader = Offloader(EVERYTHING, modules=[trainer.model], optimizer=trainer.optimizer, device="cpu")
    offloader.offload()
    assert offloader.offloaded
    same = {k: t.data_ptr() for k, t in tensors.items()}
    assert {k: t.data_ptr() for k, t in _tensors(trainer).items()} == same, "a CPU model offloaded to the CPU is left alone"
    offloader.onload()
    assert not offloader.offloaded and {k: t.data_ptr() for k, t in _tensors(trainer).items()} == same


def test_weights_without_gradients_park_the_gradients_on_the_device(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    trainer, _ = _trainers(tiny_model_dir)
    trainer.train_on_batch(_batch(trainer, tokenizer))
    grads = {n: p.grad for n, p in trainer.model.named_parameters()}
    offloader = Offloader(OffloadConfig(weights=True), modules=[trainer.model], optimizer=trainer.optimizer,
                          device="cpu")
    offloader.offload(copy=True)
    offloader.onload(copy=True)
    for name, param in trainer.model.named_parameters():
        assert param.grad is grads[name], f"{name}: an unselected gradient is put back untouched"


def test_offload_keys_are_read():
    cfg = OmegaConf.load("examples/searchr1/config/tiny-cpu.yaml")
    cfg.data.train_data_paths = [str(HOTPOT_DIR / "test.jsonl")]
    cfg.data.val_data_paths = []
    assert validate_cfg(cfg).actor.offload == OffloadConfig()
    cfg.actor.offload_weight, cfg.actor.offload_optimizer = True, True
    assert validate_cfg(cfg).actor.offload == OffloadConfig(weights=True, grads=False, optimizer=True)
