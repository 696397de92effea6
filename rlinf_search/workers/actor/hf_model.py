"""Loading a HF causal LM for the actor's backends and the InferenceGroup: one place that sets the dtype and
the attention kernel (``actor.model.attn_implementation``)."""

from __future__ import annotations

import torch

ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
"""The HF attention kernels ``actor.model.attn_implementation`` may name (transformers checks that the
installed packages provide the one named when the model loads)."""


def load_causal_lm(model_path: str, *, dtype: torch.dtype, attn_implementation: str | None) -> torch.nn.Module:
    """The model at ``model_path`` in ``dtype`` on the CPU, with ``attn_implementation`` (None: transformers'
    default, sdpa where torch has it)."""
    from transformers import AutoModelForCausalLM

    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, **extra)
