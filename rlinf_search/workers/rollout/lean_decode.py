"""The HF engine's decode step for Qwen2-architecture models on CPU, without transformers' per-call work.

A decode step feeds one token per row. On the embedded default's 3-layer model the arithmetic of a step of 32 rows
is a few hundred microseconds, and transformers' forward spends more than that around it: its decorators and output
classes, a 4D mask built from the 2D one, the rotary table recomputed, three projections where one matrix of each
kind would do. ``LeanDecoder.step`` computes the same function directly from the model's own modules (so loaded
weights are read as they are, no copies to keep in step): RMSNorm, the q/k/v projections with their biases, rotary
positions, the cache layer's ``update``, attention of each key/value head's query heads over the row's cached
positions under its padding mask, the output projection, the SiLU MLP and the tied or untied head.

It applies only where it was checked: ``model_type: qwen2`` (Qwen2 and Qwen2.5), SiLU, default rotary positions
(no scaling), no sliding window, float32 weights on CPU (``lean_decoder`` returns None otherwise and the engine
calls the model as before). Before it is used, a probe decodes one step both ways from the same cached prompt and
the logits must agree within float rounding: a transformers release that changes the architecture's arithmetic
turns the lean path off with a warning instead of sampling from a different model. The prefill keeps transformers'
forward: it computes many positions a call, so its overhead is a small share. Untested on GPU, and not used there.
"""

from __future__ import annotations

import copy
import logging

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from rlinf_search.workers.rollout.hf_cache import cache_kwargs

log = logging.getLogger(__name__)

PROBE_TOLERANCE = 1e-4
"""Largest difference from transformers' logits the probe accepts (float32 rounding is about 1e-5 here)."""


class LeanDecoder:
    """One decode step of a Qwen2-architecture causal LM (see the module's docstring)."""

    def __init__(self, model: torch.nn.Module):
        config = model.config
        self.model = model
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.scaling = self.head_dim ** -0.5

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
        """Logits ``[rows, vocab]`` for ``tokens`` ``[rows]`` at ``positions`` ``[rows]``, which ``cache`` stores
        (its layers' ``update``); ``mask`` ``[rows, cached positions + 1]``: 1 for real tokens, 0 for padding."""
        decoder = self.model.model
        rows, heads, kv_heads, dim = tokens.shape[0], self.heads, self.kv_heads, self.head_dim
        x = F.embedding(tokens, decoder.embed_tokens.weight)
        angles = positions[:, None].float() * decoder.rotary_emb.inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)[:, None, :]
        cos, sin = angles.cos(), angles.sin()
        # [rows, 1, 1, positions]: broadcast over each kv head's query heads
        padding = x.new_zeros(mask.shape).masked_fill_(mask == 0, float("-inf"))[:, None, None, :]
        for index, layer in enumerate(decoder.layers):
            attention, mlp = layer.self_attn, layer.mlp
            h = F.rms_norm(x, (x.shape[-1],), layer.input_layernorm.weight, self.eps)
            q = _rotated(F.linear(h, attention.q_proj.weight, attention.q_proj.bias).view(rows, heads, dim), cos, sin)
            k = _rotated(F.linear(h, attention.k_proj.weight, attention.k_proj.bias).view(rows, kv_heads, dim),
                         cos, sin)
            v = F.linear(h, attention.v_proj.weight, attention.v_proj.bias).view(rows, kv_heads, dim)
            keys, values = cache.layers[index].update(k[:, :, None, :], v[:, :, None, :])
            # Query head j*G+g reads kv head j (transformers' repeat_kv order): group them, no repeated keys.
            grouped = q.view(rows, kv_heads, heads // kv_heads, dim)
            scores = torch.matmul(grouped, keys.transpose(-1, -2)) * self.scaling + padding
            attended = torch.matmul(scores.softmax(dim=-1), values).reshape(rows, heads * dim)
            x = x + F.linear(attended, attention.o_proj.weight, attention.o_proj.bias)
            h = F.rms_norm(x, (x.shape[-1],), layer.post_attention_layernorm.weight, self.eps)
            x = x + F.linear(F.silu(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight),
                             mlp.down_proj.weight)
        x = F.rms_norm(x, (x.shape[-1],), decoder.norm.weight, self.eps)
        return F.linear(x, self.model.lm_head.weight)


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions on ``[rows, heads, dim]`` (the halves layout transformers' Qwen2 uses)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the lean step does not apply to ``model``; None where it does."""
    config = model.config
    parameter = next(model.parameters())
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    checks = (
        (getattr(config, "model_type", None) == "qwen2", f"model_type {getattr(config, 'model_type', None)!r}"),
        (parameter.device.type == "cpu", f"device {parameter.device.type}"),
        (parameter.dtype == torch.float32, f"dtype {parameter.dtype}"),
        (getattr(config, "hidden_act", None) == "silu", f"hidden_act {getattr(config, 'hidden_act', None)!r}"),
        (rotary is not None and getattr(rotary, "rope_type", None) == "default"
         and getattr(rotary, "attention_scaling", 1.0) == 1.0, "rotary scaling"),
        (not getattr(config, "use_sliding_window", False), "sliding window"),
        (all(kind == "full_attention" for kind in (getattr(config, "layer_types", None) or ())), "layer types"),
    )
    for supported, what in checks:
        if not supported:
            return what
    return None


def lean_decoder(model: torch.nn.Module) -> LeanDecoder | None:
    """The lean step for ``model``, checked against transformers' forward on a probe; None where it does not apply
    or the probe disagrees (then a warning says so)."""
    reason = unsupported_reason(model)
    if reason is not None:
        log.info("lean decode off: %s (transformers' forward decodes)", reason)
        return None
    decoder = LeanDecoder(model)
    difference = _probe_difference(model, decoder)
    if difference > PROBE_TOLERANCE:
        log.warning("lean decode off: its logits differ from transformers' by %.2g on a probe (more than %g); "
                    "transformers' forward decodes", difference, PROBE_TOLERANCE)
        return None
    return decoder


def _probe_difference(model: torch.nn.Module, decoder: LeanDecoder) -> float:
    """Largest logit difference of one decode step, lean against transformers', after a left-padded prompt."""
    vocab = model.config.vocab_size
    ids = torch.tensor([[0, 0, 5, 7, 11], [3, 8, 13, 2, 9]]) % vocab
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        cache = DynamicCache()
        model(input_ids=ids, attention_mask=mask, position_ids=positions, **cache_kwargs(model, cache), use_cache=True)
        twin = copy.deepcopy(cache)
        step_mask = torch.cat((mask, mask.new_ones((2, 1))), dim=1)
        token, position = torch.tensor([17, 4]) % vocab, positions[:, -1] + 1
        theirs = model(input_ids=token[:, None], attention_mask=step_mask, position_ids=position[:, None],
                       **cache_kwargs(model, cache), use_cache=True).logits[:, -1].float()
        mine = decoder.step(token, position, step_mask, twin).float()
    return float((theirs - mine).abs().max())
