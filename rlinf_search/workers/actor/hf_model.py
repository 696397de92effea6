"""Loading a HF causal LM for the actor's backends and the InferenceGroup: one place that sets the dtype and
the attention kernel (``actor.model.attn_implementation``), and compiles its decoder layers
(``actor.model.compile_layers``)."""

from __future__ import annotations

import torch

from rlinf_search.workers.actor import packed_attention

ATTN_IMPLEMENTATIONS = ("eager", "sdpa", packed_attention.PACKED_ATTENTION, "flash_attention_2", "flash_attention_3",
                        "flex_attention")
"""The HF attention kernels ``actor.model.attn_implementation`` may name (transformers checks that the
installed packages provide the one named when the model loads; ``sdpa_varlen`` is this package's own)."""

PACKED_ROW_KERNELS = (packed_attention.PACKED_ATTENTION, "flash_attention_2", "flash_attention_3", "flex_attention")
"""The kernels that attend within each row of a packed sequence, reading the rows from the position ids."""


def load_causal_lm(model_path: str, *, dtype: torch.dtype, attn_implementation: str | None) -> torch.nn.Module:
    """The model at ``model_path`` in ``dtype`` on the CPU, with ``attn_implementation`` (None: transformers'
    default, sdpa where torch has it)."""
    from transformers import AutoModelForCausalLM

    packed_attention.register()
    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, **extra)


def compile_decoder_layers(model: torch.nn.Module) -> None:
    """Compile each decoder layer's ``forward`` with ``torch.compile`` in place.

    Per layer, not the whole model: every layer runs the same code, so one compiled graph serves them all, and
    what wraps a layer stays eager: FSDP2's gather and reshard hooks and gradient checkpointing (they run around
    ``forward``, not inside it). What it fuses is the per-op overhead of a layer's small ops (RMSNorm in fp32, RoPE,
    SiLU, the residual adds) around the matmuls. The attention kernel itself is left out of the graph
    (``packed_attention`` marks its packed-row function so): its row boundaries are Python integers that would
    recompile it for every new batch. Token counts change from pass to pass, so the graphs are compiled with
    dynamic shapes after the first."""
    from rlinf_search.workers.actor.parallel import decoder_layers

    for layer in decoder_layers(model):
        layer.forward = torch.compile(layer.forward)
