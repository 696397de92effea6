"""Packed rows without flash-attn (``sdpa_varlen``): the same log-probs and gradients as padded rows, through the
trainer the actor runs; flex attention's packed forward on CPU; the kernel each setting loads."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from rlinf_search.data.batch import collate_trajectories
from rlinf_search.workers.actor.config import ActorConfig, OptimConfig
from rlinf_search.workers.actor.hf_model import load_causal_lm
from rlinf_search.workers.actor.packed_attention import PACKED_ATTENTION, row_boundaries
from rlinf_search.workers.actor.policy_trainer import PolicyTrainer
from rlinf_search.workers.actor.token_scoring import TokenScorer, layout_batch
from tests.test_policy_trainer import _logprobs, _prepared_batch, _trajectories


def test_row_boundaries_from_positions_that_restart():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    assert row_boundaries(positions).tolist() == [0, 3, 5, 9]
    assert row_boundaries(torch.arange(4)).tolist() == [0, 4]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_packed_rows_score_like_padded_rows(tiny_model_dir, dtype, tolerance, monkeypatch):
    """Log-probs and their gradients from one packed sequence equal the padded batch's, row by row (in bf16 within
    its rounding): each row attends to itself only, and no padding token is computed. The packed pass runs this
    package's per-row kernel in every layer; the padded one transformers' sdpa."""
    from rlinf_search.workers.actor import packed_attention

    calls = []
    per_row = packed_attention.packed_rows_attention
    monkeypatch.setattr(packed_attention, "packed_rows_attention",
                        lambda *args, **kwargs: calls.append(len(args[3].cuts) - 1) or per_row(*args, **kwargs))
    model = load_causal_lm(str(tiny_model_dir), dtype=dtype, attn_implementation=PACKED_ATTENTION)
    scorer = TokenScorer(model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    trajectories = _trajectories(tokenizer)
    trajectories[1].prompt_ids = trajectories[1].prompt_ids[:3]  # uneven rows: left padding in the padded layout
    batch = collate_trajectories(trajectories, [0.0] * 4, pad_id=tokenizer.pad_token_id)
    results = {}
    for packed in (False, True):
        layout = layout_batch(batch, packed=packed)
        assert (layout.attention_mask is None) == packed
        model.zero_grad(set_to_none=True)
        logprobs = scorer(layout).logprobs
        logprobs.float().sum().backward()
        assert calls == ([len(batch)] * model.config.num_hidden_layers if packed else []), calls
        results[packed] = (layout.to_rows(logprobs).detach().float(),
                           {name: p.grad.float().clone() for name, p in model.named_parameters()})
    torch.testing.assert_close(results[True][0], results[False][0], atol=tolerance, rtol=0)
    for name, grad in results[True][1].items():
        scale = float(results[False][1][name].abs().max()) + 1e-12
        torch.testing.assert_close(grad / scale, results[False][1][name] / scale, atol=tolerance, rtol=0,
                                   msg=f"{name} gradient differs")


def test_use_remove_padding_packs_without_flash_attention(tiny_model_dir):
    """The trainer with ``use_remove_padding`` (its default) loads ``sdpa_varlen`` and packs; its log-probs and
    update equal the padded trainer's."""
    optim = OptimConfig(lr=1e-3, weight_decay=0.0, clip_grad=1e9)
    packed = PolicyTrainer(ActorConfig(model_path=str(tiny_model_dir), optim=optim))
    padded = PolicyTrainer(ActorConfig(model_path=str(tiny_model_dir), optim=optim, pack_sequences=False))
    assert packed.packed and packed.model.config._attn_implementation == PACKED_ATTENTION
    assert not padded.packed and padded.model.config._attn_implementation == "sdpa"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = _prepared_batch(padded, tokenizer)
    torch.testing.assert_close(_logprobs(packed, batch), batch.old_logprobs, atol=1e-5, rtol=0)
    metrics = {name: trainer.train_on_batch(batch) for name, trainer in (("packed", packed), ("padded", padded))}
    for (name, a), b in zip(packed.model.named_parameters(), padded.model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4, msg=f"{name} gradient differs")
    assert abs(metrics["packed"]["actor/grad_norm"] - metrics["padded"]["actor/grad_norm"]) < 1e-4


def test_flex_attention_packed_forward_on_cpu(tiny_model_dir):
    """flex attention builds its block mask from the packed position ids; on CPU torch runs its forward only (no
    backward), which is what this checks; the GPU check trains through it."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = collate_trajectories(_trajectories(tokenizer), [0.0] * 4, pad_id=tokenizer.pad_token_id)
    flex = TokenScorer(load_causal_lm(str(tiny_model_dir), dtype=torch.float32, attn_implementation="flex_attention"))
    sdpa = TokenScorer(load_causal_lm(str(tiny_model_dir), dtype=torch.float32, attn_implementation="sdpa"))
    with torch.no_grad():
        layout = layout_batch(batch, packed=True)
        packed = layout.to_rows(flex(layout).logprobs)
        padded_layout = layout_batch(batch, packed=False)
        padded = padded_layout.to_rows(sdpa(padded_layout).logprobs)
    torch.testing.assert_close(packed, padded, atol=1e-4, rtol=0)
