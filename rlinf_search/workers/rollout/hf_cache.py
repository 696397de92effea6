"""The keyword a HF causal LM takes its KV cache under, and the field its output returns it in.

transformers 5.2x renamed ``past_key_values`` to ``cache`` (the old name still works but warns on every
forward call, which fills the rollout workers' logs); the versions we support before that only know
``past_key_values``. The name is read once per model class from its ``forward`` signature.
"""

from __future__ import annotations

import functools
import inspect

import torch


@functools.cache
def _cache_keyword(model_class: type) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_kwargs(model: torch.nn.Module, cache: object) -> dict[str, object]:
    """``{keyword: cache}`` for ``model(...)``."""
    return {_cache_keyword(type(model)): cache}


def returned_cache(output: object) -> object:
    """The KV cache a forward call with ``use_cache=True`` returned."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values
