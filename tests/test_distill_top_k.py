"""``algorithm.distill.top_k``: the teacher's k most likely tokens as a dense target. The answer's parsing and
padding, the KL on a hand-made case, and the actor's update with it: one process, then FSDP2 over 2 gloo
ranks in bf16 with uneven micro-batches, as the GPU recipe trains."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from transformers import AutoTokenizer

from rlinf_search.algorithms import top_k_kl
from rlinf_search.distill.scorer import top_k_tensors
from rlinf_search.distill.teacher import _echoed
from rlinf_search.net.http import FinalBackendError
from rlinf_search.workers.actor.logprobs import place_rows
from rlinf_search.workers.actor.policy_trainer import PolicyTrainer
from rlinf_search.workers.actor.token_scoring import layout_batch, to_device
from tests.test_fsdp import _config, _uneven_batch, one_process_and_two_ranks

K = 4


def _answer(top: list | None, length: int) -> dict:
    return {"choices": [{"logprobs": {"token_logprobs": [None] + [-1.0] * (length - 1), "top_logprobs": top}}]}


def test_the_answer_gives_the_k_most_likely_ids():
    # vLLM also lists the given token when it is outside the top k: the k best are kept (in any order: the
    # loss sums over them).
    top = [None, {"token_id:7": -0.5, "token_id:3": -0.2, "token_id:9": -3.0}, {"token_id:4": -0.1}]
    tokens = _echoed(_answer(top, 3), [1, 2, 3], top_k=2)
    assert bool(torch.isinf(tokens.top.logprobs[0]).all())
    assert dict(zip(tokens.top.ids[1].tolist(), tokens.top.logprobs[1].tolist())) == {3: pytest.approx(-0.2),
                                                                                      7: -0.5}
    assert tokens.top.ids[2].tolist() == [4, 0] and tokens.top.logprobs[2, 1] == -math.inf
    with pytest.raises(FinalBackendError, match="keyed by text, not token_id"):
        _echoed(_answer([None, {"Paris": -0.1}], 2), [1, 2], top_k=2)
    with pytest.raises(FinalBackendError, match="sent no top_logprobs for every prompt token"):
        _echoed(_answer(None, 2), [1, 2], top_k=2)


def test_short_and_missing_positions_are_padded_to_weigh_nothing():
    top = _echoed(_answer([{"token_id:5": -0.1, "token_id:6": -2.0}, {}], 2), [1, 2], top_k=3).top
    ids, logprobs = top_k_tensors([top, None], (2, 3), 3)
    assert ids.shape == logprobs.shape == (2, 3, 3)
    assert ids[0, 0].tolist() == [5, 6, 0] and logprobs[0, 0, :2].tolist() == pytest.approx([-0.1, -2.0])
    assert math.isinf(logprobs[0, 0, 2]) and bool(torch.isinf(logprobs[0, 1:]).all()) and bool(torch.isinf(logprobs[1]).all())


def test_top_k_kl_on_a_hand_made_case():
    teacher = torch.log(torch.tensor([[[0.6, 0.2, 0.0], [0.5, 0.5, 0.0]]]))  # -inf where the server gave fewer
    student = torch.log(torch.tensor([[[0.3, 0.1, 0.2], [0.5, 0.5, 0.0]]]))
    scored = torch.tensor([[True, False]])
    # Over (top 1, top 2, the rest): teacher (0.6, 0.2, 0.2), student (0.3, 0.1, 0.6); the padded slot's
    # student value weighs nothing, and the unscored token adds nothing.
    forward = 0.6 * math.log(0.6 / 0.3) + 0.2 * math.log(0.2 / 0.1) + 0.2 * math.log(0.2 / 0.6)
    reverse = 0.3 * math.log(0.3 / 0.6) + 0.1 * math.log(0.1 / 0.2) + 0.6 * math.log(0.6 / 0.2)
    for divergence, expected in (("forward", forward), ("reverse", reverse)):
        kl = top_k_kl(teacher, student, scored, divergence)
        assert kl[0, 0].item() == pytest.approx(expected, abs=1e-6) and kl[0, 1].item() == 0.0
    assert torch.isfinite(top_k_kl(torch.full((1, 1, 2), float("-inf")), student[..., :2], scored[:, :1] & False)).all()
    with pytest.raises(ValueError, match="forward, reverse"):
        top_k_kl(teacher, student, scored, "symmetric")


def _top_k_of(teacher_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    logprobs = torch.log_softmax(teacher_logits, -1)
    top, ids = logprobs.topk(k, dim=-1)
    return ids, top


@pytest.mark.parametrize("divergence", ["forward", "reverse"])
def test_top_k_kl_and_its_gradient_are_zero_when_the_student_is_the_teacher(divergence):
    """8 of 50 random logits (the top 8 hold about 60 % of the mass): the old objective, renormalised on the
    teacher's side only, gave 0.5 here and a gradient that raised the top 8."""
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 50) * 1.5
    ids, teacher = _top_k_of(logits, 8)
    assert 0.3 < float(teacher.exp().sum(-1).mean()) < 0.9
    student_logits = logits.clone().requires_grad_(True)
    student = torch.log_softmax(student_logits, -1).gather(-1, ids)
    kl = top_k_kl(teacher, student, torch.ones(3, 5, dtype=torch.bool), divergence)
    kl.sum().backward()
    assert float(kl.detach().abs().max()) < 1e-6
    assert float(student_logits.grad.abs().max()) < 1e-6


@pytest.mark.parametrize("divergence", ["forward", "reverse"])
def test_minimising_top_k_kl_brings_the_student_to_the_teacher_not_past_it(divergence):
    """From a uniform student over 50 tokens, Adam on the top-8 KL alone: the student's probabilities of the
    teacher's 8 tokens, and so its leftover mass, converge to the teacher's (the old objective drove the top-8
    mass towards 1)."""
    torch.manual_seed(1)
    logits = torch.randn(4, 50) * 2.0
    ids, teacher = _top_k_of(logits, 8)
    student_logits = torch.zeros(4, 50, requires_grad=True)
    optimizer = torch.optim.Adam([student_logits], lr=0.05)
    for _ in range(1500):
        optimizer.zero_grad()
        student = torch.log_softmax(student_logits, -1).gather(-1, ids)
        top_k_kl(teacher[None], student[None], torch.ones(1, 4, dtype=torch.bool), divergence).sum().backward()
        optimizer.step()
    student = torch.log_softmax(student_logits.detach(), -1).gather(-1, ids)
    torch.testing.assert_close(student.exp(), teacher.exp(), atol=2e-3, rtol=0)
    torch.testing.assert_close(student.exp().sum(-1), teacher.exp().sum(-1), atol=2e-3, rtol=0)
    assert float(teacher.exp().sum(-1).max()) < 0.99  # the teacher leaves mass outside its top 8


def _with_teacher(batch, tokenizer, *, seed: int = 0):
    """A made-up teacher: k distinct ids per position, one slot left empty on some, one row it failed on."""
    generator = torch.Generator().manual_seed(seed)
    rows, width = batch.response_mask.shape
    base = torch.randint(0, len(tokenizer) - 100, (rows, width, 1), generator=generator)
    batch.teacher_top_ids = base + torch.arange(K) * 7
    batch.teacher_top_logprobs = torch.log_softmax(torch.randn(rows, width, K, generator=generator), -1) - 0.3
    batch.teacher_top_logprobs[:, ::3, -1] = float("-inf")
    batch.teacher_top_weight = batch.response_mask.float() * 0.5
    batch.teacher_top_weight[2] = 0.0  # the teacher failed on this trajectory: no target
    return batch


def test_the_actor_moves_toward_the_teachers_top_k(tiny_model_dir):
    """Advantages 0: the update is the top-k KL alone. The reported KL is the hand computation at the start
    weights, and after a few steps the KL is lower."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = _with_teacher(_uneven_batch(tokenizer), tokenizer)
    batch.advantages = torch.zeros_like(batch.advantages)
    config = _config(tiny_model_dir, training_backend="ddp", n_minibatches=1, max_tokens_per_mbs=None,
                     optim=_config(tiny_model_dir).optim.replace(lr=1e-2, adam_eps=1e-8, clip_grad=1.0))
    trainer = PolicyTrainer(config)
    batch.old_logprobs = place_rows(tuple(batch.response_mask.shape), [trainer.compute_logprobs(batch)])

    def kl_now() -> float:
        layout = to_device(layout_batch(batch, packed=trainer.packed), trainer.device)
        with torch.no_grad():
            scored = trainer.module(layout)
        weight = batch.teacher_top_weight * batch.response_mask
        kl = top_k_kl(batch.teacher_top_logprobs, layout.to_rows(scored.candidate_logprobs), weight > 0)
        return float(kl[weight > 0].mean())

    start = kl_now()
    first = trainer.train_on_batch(batch)
    assert first["actor/teacher_top_k_kl"] == pytest.approx(start, rel=1e-4)
    for _ in range(4):
        trainer.train_on_batch(batch)
    assert kl_now() < 0.8 * start


def test_two_fsdp_ranks_in_bf16_match_one_process_with_the_top_k_term(tiny_model_dir, tmp_path):
    """The GPU recipe's shape: FSDP2 over 2 ranks, bf16 compute, mini-batches cut into different numbers of
    micro-batches per rank; the teacher's targets travel with the rows each rank trains on."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = _with_teacher(_uneven_batch(tokenizer), tokenizer)
    config = _config(tiny_model_dir, training_backend="fsdp", dtype="bfloat16")
    expected, expected_weights, ranks = one_process_and_two_ranks(config, batch, tmp_path)
    assert expected["actor/teacher_top_k_kl"] > 0
    kl = sum(r["metrics"]["actor/teacher_top_k_kl"] for r in ranks) / 2
    assert kl == pytest.approx(expected["actor/teacher_top_k_kl"], rel=0.05)
    # bf16 compute on both sides, reduced in another order: close, not equal.
    for name, tensor in ranks[0]["weights"].items():
        torch.testing.assert_close(tensor, expected_weights[name], atol=2e-2, rtol=0, msg=name)
    grad_norms = [r["metrics"]["actor/grad_norm"] for r in ranks]
    assert grad_norms[0] == pytest.approx(grad_norms[1]) == pytest.approx(expected["actor/grad_norm"], rel=0.05)
