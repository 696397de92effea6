"""Megatron's core attention through ``scaled_dot_product_attention``: ``actor.megatron.core_attention: sdpa``.

megatron-core's local layer spec (the one that needs neither Transformer Engine nor Apex) computes attention as
``baddbmm`` into a ``[batch x heads, L, L]`` score buffer, an fp32 softmax over it and a ``bmm``: at two rows of
4,096 tokens and Qwen2.5-3B's 16 heads that is about 4-5 GB a layer, and three kernels that each read it. PyTorch's
SDPA computes the same attention with its fused kernels (on a GPU, the memory-efficient kernel takes the padding
mask; no score matrix is kept). The module takes the local module's
place in the spec (``megatron/model.py``) with its constructor and call signature.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig


class SdpaCoreAttention(MegatronModule):
    """Causal attention of one tensor-parallel rank's heads. Inputs ``[s, b, heads, head_dim]`` (keys and values
    with this rank's query groups); output ``[s, b, heads x head_dim]``, as megatron's ``DotProductAttention``."""

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection=None):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("actor.megatron.core_attention sdpa: context parallelism is not supported")
        head_dim = config.kv_channels
        # Layer-number scaling of the scores (apply_query_key_layer_scaling) is undone inside megatron's softmax, so
        # the scale applied is this one either way.
        self.scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
                attn_mask_type=None, attention_bias=None, packed_seq_params=None) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("actor.megatron.core_attention sdpa: packed sequences and attention bias are not "
                             "supported (this backend pads its rows)")
        length, batch = query.shape[0], query.shape[1]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        keep = None
        if attention_mask is not None:  # megatron's mask: True = hidden
            keep = ~attention_mask
            # A left-padding position may see no key at all; an empty softmax row is NaN in SDPA (megatron's masked
            # fill gives it uniform weights instead), and a NaN reaches the weight gradients through 0 x NaN. It
            # attends to itself here: its output is never read, the real positions' outputs are unchanged.
            keep = keep | torch.eye(length, key.shape[0], dtype=torch.bool, device=keep.device)
        groups = q.shape[1] // k.shape[1]
        # Repeated rather than enable_gqa: which fused kernels take GQA together with a mask varies across torch
        # versions, and a kernel that does not falls back to the math path (the score matrix again).
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=attention_mask is None,
                                             dropout_p=self.dropout if self.training else 0.0, scale=self.scale)
        return out.permute(2, 0, 1, 3).reshape(length, batch, -1)
