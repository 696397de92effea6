"""The HF engine's prefix reuse: a multi-turn trajectory's next turn prefills only what is new.

An agent's turn N+1 sends its whole context again (prompt, the model's turns, the observations), and a plain
prefill computes every token of it once more: on the demo's task that re-prefill was 28x the tokens decoded
(``docs/benchmarks.md``, "The embedded default beside TRL"). So when a request ends at a stop string (a tool
call follows), the engine keeps the key/value states of everything it cached for that row, keyed by those token
ids; a later request whose prompt starts with them takes them as its cache and prefills the rest. An entry is
taken by the request that continues it, once per row that stored it: a group's samples often write the same turn
word for word, and each of them continues it (with one take per entry, the second and later copies prefilled their
whole context again, and padded every request prefilled beside them to that length). All entries go when the
weights change (their states belong to the old weights). The same prefill also computes each distinct prompt once: a GRPO group sends one prompt
``group_size`` times, and its rows share the result.

States are kept without their padding, per row: ``[kv heads, positions, head dim]`` per layer.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass
class CachedPrefix:
    """The key/value states of one finished request's cached tokens."""

    ids: tuple[int, ...]
    """The token ids the states cover (the request's prompt and its output but the last token)."""
    keys: list[torch.Tensor]
    """Per layer, ``[kv heads, len(ids), head dim]``."""
    values: list[torch.Tensor]
    """Per layer, like ``keys``."""
    copies: int = 1
    """Rows that stored these ids and whose continuations have not yet taken them."""


class PrefixCache:
    """Finished rows' states by token ids, least recently stored first out, at most ``max_tokens`` in all."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], CachedPrefix] = OrderedDict()
        self._tokens = 0
        self._lengths: dict[int, int] = {}  # cached length -> entries of that length, for the lookup
        self.hits = 0
        """Requests that took an entry."""
        self.reused_tokens = 0
        """Prompt tokens not prefilled because an entry held them."""

    def __len__(self) -> int:
        return len(self._entries)

    def store(self, ids: list[int], keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        if not ids or len(ids) > self.max_tokens:
            return
        key = tuple(ids)
        if key in self._entries:  # another row wrote the same tokens: one more continuation will come for it
            entry = self._entries.pop(key)
            entry.copies += 1
            self._entries[key] = entry  # now the newest
            return
        self._entries[key] = CachedPrefix(key, keys, values)
        self._tokens += len(key)
        self._lengths[len(key)] = self._lengths.get(len(key), 0) + 1
        while self._tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def take(self, prompt_ids: list[int]) -> CachedPrefix | None:
        """The longest entry that ``prompt_ids`` starts with and extends by at least one token; removed with its last
        copy. Equal requests that take one entry get the same object, and the prefill computes them once."""
        for length in sorted(self._lengths, reverse=True):
            if length >= len(prompt_ids):
                continue
            key = tuple(prompt_ids[:length])
            if key in self._entries:
                entry = self._entries[key]
                entry.copies -= 1
                if not entry.copies:
                    self._drop(key)
                self.hits += 1
                self.reused_tokens += length
                return entry
        return None

    def clear(self) -> None:
        self._entries.clear()
        self._lengths.clear()
        self._tokens = 0

    def _drop(self, key: tuple[int, ...]) -> None:
        del self._entries[key]
        self._tokens -= len(key)
        self._lengths[len(key)] -= 1
        if not self._lengths[len(key)]:
            del self._lengths[len(key)]


def row_states(cache, mask: torch.Tensor, row: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Row ``row``'s cached states without its padding (``mask`` 0), copied out of the running batch's cache."""
    columns = mask[row].nonzero().squeeze(-1)
    keys = [layer.keys[row].index_select(1, columns) for layer in cache.layers]
    values = [layer.values[row].index_select(1, columns) for layer in cache.layers]
    return keys, values


def shared_prefix_length(prompts: list[list[int]], *, min_tokens: int) -> int:
    """The tokens every one of ``prompts`` starts with, where computing them once saves at least ``min_tokens``
    positions; 0 otherwise. Each prompt keeps at least one token after it (its last position gives the logits)."""
    distinct = {tuple(p) for p in prompts}
    if len(distinct) < 2:
        return 0
    first, *others = distinct
    length = min(len(p) for p in distinct) - 1
    for other in others:
        length = next((i for i in range(length) if first[i] != other[i]), length)
    return length if length * (len(distinct) - 1) >= min_tokens else 0


@dataclass
class PrefillInputs:
    """One prefill pass over distinct prompts, each after the cached prefix it found (if any)."""

    input_ids: torch.Tensor
    """``[distinct, suffix width]``: each prompt's tokens after its prefix, left-padded."""
    attention_mask: torch.Tensor
    """``[distinct, prefix width + suffix width]``: the prefix columns (left-padded), then the suffix's."""
    position_ids: torch.Tensor
    """``[distinct, suffix width]``: each suffix token's position in its whole prompt."""
    prefix: list[tuple[torch.Tensor, torch.Tensor]] | None
    """Per layer, the prefixes' keys and values ``[distinct, kv heads, prefix width, head dim]``; None: no
    prompt had one."""
    rows: torch.Tensor
    """``[requests]``: which distinct prompt each request is, to expand the pass's result to every request."""


def prefill_inputs(prompts: list[list[int]], prefixes: list[CachedPrefix | None], pad_id: int) -> PrefillInputs:
    """The tensors of one prefill of ``prompts`` (one per request; equal prompts computed once)."""
    distinct: dict[tuple, int] = {}
    rows, order = [], []
    for prompt, prefix in zip(prompts, prefixes):
        key = (id(prefix) if prefix is not None else None, tuple(prompt))
        if key not in distinct:
            distinct[key] = len(order)
            order.append((prompt, prefix))
        rows.append(distinct[key])
    cached = [len(p.ids) if p is not None else 0 for _, p in order]
    suffixes = [prompt[n:] for (prompt, _), n in zip(order, cached)]
    prefix_width, width = max(cached), max(len(s) for s in suffixes)
    ids = torch.full((len(order), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(order), prefix_width + width), dtype=torch.long)
    positions = torch.zeros((len(order), width), dtype=torch.long)
    for row, (suffix, n) in enumerate(zip(suffixes, cached)):
        start = width - len(suffix)
        ids[row, start:] = torch.tensor(suffix)
        mask[row, prefix_width - n:prefix_width] = 1
        mask[row, prefix_width + start:] = 1
        positions[row, start:] = torch.arange(n, n + len(suffix))
    prefix = None
    if prefix_width:
        prefix = []
        template = next(p for _, p in order if p is not None)
        for layer in range(len(template.keys)):
            prefix.append(tuple(_left_padded([None if p is None else getattr(p, name)[layer] for _, p in order],
                                             template_state=getattr(template, name)[layer], width=prefix_width)
                                for name in ("keys", "values")))
    return PrefillInputs(ids, mask, positions, prefix, torch.tensor(rows))


def _left_padded(states: list[torch.Tensor | None], *, template_state: torch.Tensor, width: int) -> torch.Tensor:
    """``[rows, kv heads, width, head dim]``: each row's states at the right end, zeros before (None: all zeros)."""
    heads, _, dim = template_state.shape
    out = template_state.new_zeros((len(states), heads, width, dim))
    for row, state in enumerate(states):
        if state is not None and state.shape[1]:
            out[row, :, width - state.shape[1]:] = state
    return out
