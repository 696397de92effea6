"""Attention over packed rows without flash-attn: ``actor.model.attn_implementation: sdpa_varlen``.

``actor.model.use_remove_padding`` lays a micro-batch's rows end to end in one sequence whose position ids
restart at 0 for every row (``token_scoring.layout_batch``). Attention must then stay inside each row. flash-attn
does that from the row boundaries; sdpa and eager would get a dense block-diagonal mask over the whole packed
sequence, whose cost is the square of the micro-batch's tokens. This kernel needs neither flash-attn nor a mask:

- on CUDA, where torch has it, torch's own variable-length attention (``torch.nn.attention.varlen``), one kernel
  call over every row (untested on GPU until ``scripts/gpu_check.sh``'s packing stage has run there);
- elsewhere (the CPU), ``scaled_dot_product_attention`` once per row, causal, so each row costs its own square.

A padded micro-batch (a 2-D attention mask) goes to transformers' sdpa path unchanged, so one loaded model serves
both layouts. :func:`register` makes :data:`PACKED_ATTENTION` a name transformers loads models with
(``hf_model.load_causal_lm`` calls it before loading).
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import NamedTuple

import torch
import torch.nn.functional as F

PACKED_ATTENTION = "sdpa_varlen"
"""The ``attn_implementation`` name this module registers with transformers."""


def row_boundaries(position_ids: torch.Tensor) -> torch.Tensor:
    """[R + 1] cumulative row starts (int32) of one packed sequence whose ``position_ids`` ([1, N] or [N]) restart
    at 0 for every row."""
    positions = position_ids.reshape(-1)
    starts = (positions == 0).nonzero().flatten()
    if len(starts) == 0 or int(starts[0]) != 0:
        starts = torch.cat([starts.new_zeros(1), starts])
    end = torch.tensor([positions.numel()], device=starts.device, dtype=starts.dtype)
    return torch.cat([starts, end]).to(torch.int32)


class PackedRows(NamedTuple):
    """Where the rows of one packed sequence start and end, read once per forward pass."""

    bounds: torch.Tensor
    """:func:`row_boundaries` (int32, on the position ids' device)."""
    cuts: list[int]
    """The same boundaries as Python ints (the per-row loop slices with them)."""
    longest: int
    """The longest row's length (varlen's ``max_q`` / ``max_k``)."""


_last_rows: tuple[torch.Tensor, PackedRows] | None = None
"""The position ids of the last forward pass and their rows. Every layer (and a checkpointed layer's recompute) gets
the same position-ids tensor, so the rows, and the device-to-host copy they need, are made once a pass, not once a
layer. Holding the tensor keeps its identity from being reused while it is cached."""


def packed_rows(position_ids: torch.Tensor) -> PackedRows:
    """The rows of the packed sequence ``position_ids`` describes, computed on the first layer that asks."""
    global _last_rows
    if _last_rows is None or _last_rows[0] is not position_ids:
        bounds = row_boundaries(position_ids)
        cuts = bounds.tolist()
        _last_rows = (position_ids, PackedRows(bounds, cuts, max(b - a for a, b in zip(cuts[:-1], cuts[1:]))))
    return _last_rows[1]


@lru_cache(maxsize=1)
def _varlen_call():
    """torch's varlen attention and how to ask it for a causal mask (its signature changed between 2.9 and 2.12:
    ``is_causal`` then ``window_size=(-1, 0)``), or None where torch lacks it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "is_causal" in params:
        causal = {"is_causal": True}
    elif "window_size" in params:
        causal = {"window_size": (-1, 0)}
    else:
        return None
    return varlen_attn, causal, "enable_gqa" in params, "scale" in params


def _repeat_kv(states: torch.Tensor, groups: int, dim: int) -> torch.Tensor:
    return states if groups == 1 else states.repeat_interleave(groups, dim=dim)


def packed_rows_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, rows: PackedRows, *,
                          scaling: float | None) -> torch.Tensor:
    """Causal attention within each row of one packed sequence. ``query`` [1, H, N, D], ``key``/``value``
    [1, H_kv, N, D]; ``rows``: :func:`packed_rows`. Returns [1, N, H, D], as transformers' kernels do."""
    groups = query.shape[1] // key.shape[1]
    varlen = _varlen_call() if query.is_cuda else None
    if varlen is not None:
        varlen_attn, causal, has_gqa, has_scale = varlen
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [N, heads, D]
        extra = dict(causal)
        if has_gqa:
            extra["enable_gqa"] = groups > 1
        else:
            k, v = _repeat_kv(k, groups, 1), _repeat_kv(v, groups, 1)
        if has_scale:
            extra["scale"] = scaling
        elif scaling is not None and scaling != q.shape[-1] ** -0.5:
            q = q * (scaling * q.shape[-1] ** 0.5)
        cu = rows.bounds.to(q.device)
        return varlen_attn(q, k, v, cu, cu, rows.longest, rows.longest, **extra).unsqueeze(0)
    key, value = _repeat_kv(key, groups, 1), _repeat_kv(value, groups, 1)
    outputs = [F.scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True,
                                              scale=scaling)
               for a, b in zip(rows.cuts[:-1], rows.cuts[1:])]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous()


@torch.compiler.disable  # row boundaries as Python ints: compiled, every new batch would recompile it
def sdpa_varlen_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature. Without a mask (the packed layout, or rows without padding) the
    rows come from ``position_ids``; with one, transformers' sdpa kernel runs as it would have."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    position_ids = kwargs.get("position_ids")
    if attention_mask is not None or position_ids is None or query.shape[0] != 1 or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    return packed_rows_attention(query, key, value, packed_rows(position_ids), scaling=scaling), None


def _sdpa_varlen_mask(*args, attention_mask: torch.Tensor | None = None, **kwargs):
    """No mask for an unpadded input (the kernel reads the rows from the position ids, so no [N, N] mask is built);
    sdpa's mask otherwise."""
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register() -> None:
    """Make :data:`PACKED_ATTENTION` a name transformers loads models with (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(PACKED_ATTENTION, sdpa_varlen_forward)
    AttentionMaskInterface.register(PACKED_ATTENTION, _sdpa_varlen_mask)
