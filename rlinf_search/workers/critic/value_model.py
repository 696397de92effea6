"""The value model: a causal LM's backbone (no LM head) with a scalar linear head on the last hidden state.

A saved value model is a Hugging Face folder of the backbone (``AutoModel.from_pretrained`` reads it)
plus ``value_head.pt``. Loading a plain causal-LM folder (the policy's) keeps its backbone weights and
starts a new head; loading a saved value model restores both.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from rlinf_search.data.batch import RolloutBatch
from rlinf_search.workers.actor.token_scoring import ScoringLayout, layout_batch, to_device

VALUE_HEAD = "value_head.pt"
"""The head's state dict, beside the backbone's files."""


class ValueModel(torch.nn.Module):
    """``forward(layout) -> [K]``: the value at each position of a ``ScoringLayout`` that predicts a
    response token (the state before that token)."""

    def __init__(self, backbone: torch.nn.Module, head: torch.nn.Linear):
        super().__init__()
        self.backbone = backbone
        self.head = head

    @classmethod
    def from_pretrained(cls, path: str | Path, *, dtype: torch.dtype = torch.float32, seed: int = 0) -> ValueModel:
        from transformers import AutoModel

        # AutoModel on a causal-LM folder loads the decoder alone: the LM head (hidden x vocab) would be
        # dead weight in memory and in the optimizer.
        backbone = AutoModel.from_pretrained(path, dtype=dtype)
        hidden = backbone.config.hidden_size
        head = torch.nn.Linear(hidden, 1, dtype=dtype)
        saved = Path(path) / VALUE_HEAD
        if saved.is_file():
            head.load_state_dict(torch.load(saved, map_location="cpu", weights_only=True))
        else:
            # Small weights (OpenRLHF's std 1 / (hidden + 1)) and a zero bias: the first values are near 0,
            # so the first advantages are close to the raw returns instead of the noise of a random head.
            generator = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                weight = torch.randn(head.weight.shape, generator=generator) / (hidden + 1)
                head.weight.copy_(weight.to(dtype))
                head.bias.zero_()
        return cls(backbone, head)

    def forward(self, layout: ScoringLayout) -> torch.Tensor:
        hidden = self.backbone(input_ids=layout.input_ids, attention_mask=layout.attention_mask,
                               position_ids=layout.position_ids, use_cache=False).last_hidden_state
        picked = hidden.reshape(-1, hidden.shape[-1])[layout.predictors]
        return self.head(picked).squeeze(-1).float()

    def save_pretrained(self, path: str | Path) -> None:
        self.backbone.save_pretrained(path)
        torch.save(self.head.state_dict(), Path(path) / VALUE_HEAD)


def response_values(model: torch.nn.Module, batch: RolloutBatch, *, packed: bool = True, autocast=None) -> torch.Tensor:
    """``[B, T]`` float32: the value of the state before each response token (0 on padding).

    Aligned like the log-probs: the position before response token ``j`` has seen the prompt and the
    response tokens before ``j`` (observations included), and is where token ``j`` is chosen, so its value
    is ``V_j`` in GAE. ``model`` is a ``ValueModel``, maybe wrapped for data parallelism."""
    device = next(model.parameters()).device
    layout = to_device(layout_batch(batch, packed=packed), device)
    with autocast if autocast is not None else contextlib.nullcontext():
        values = model(layout)
    return layout.to_rows(values.float())
