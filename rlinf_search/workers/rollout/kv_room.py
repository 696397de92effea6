"""A KV cache layer with room to grow: each decode step writes its new positions in place instead of copying the
whole cache.

transformers' ``DynamicLayer`` appends by ``torch.cat``, so a step that adds one position to a cache of T copies all
T: over a turn of n tokens, n^2/2 positions per layer, for every row. ``RoomyLayer`` keeps each layer's keys and
values as the leading positions of a larger buffer and writes the step's positions after them; the buffer grows
(one copy) only when full, by half its length and at least ``MIN_ROOM`` positions. What the model reads is the same
tensor values either way: the view of the filled positions.

``RunningBatch`` replaces a layer's keys and values when rows leave, join or lose leading padding (a new tensor, or
a view that starts elsewhere); the layer then takes them into a new buffer at its next step, as the old layer copied
them at every step.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

MIN_ROOM = 64
"""Fewest spare positions a (re)allocated buffer gets: a turn of decoding copies the cache once per 64 tokens at
most, not once per token."""


class RoomyLayer(DynamicLayer):
    """``DynamicLayer`` whose ``keys``/``values`` are views of the leading positions of larger buffers."""

    _key_room: torch.Tensor | None = None
    _value_room: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.keys.shape[-2] if self.keys.numel() else 0
        end = length + key_states.shape[-2]
        if not self._holds_cache(key_states, end):
            self._key_room = _with_room(self.keys, key_states, length, end)
            self._value_room = _with_room(self.values, value_states, length, end)
        self._key_room[:, :, length:end] = key_states
        self._value_room[:, :, length:end] = value_states
        self.keys, self.values = self._key_room[:, :, :end], self._value_room[:, :, :end]
        return self.keys, self.values

    def _holds_cache(self, key_states: torch.Tensor, end: int) -> bool:
        """The buffers still start with this layer's cache (nothing replaced it) and have room up to ``end``."""
        room = self._key_room
        if room is None or room.shape[-2] < end or room.shape[:2] != key_states.shape[:2]:
            return False
        if not self.keys.numel():
            return True
        return (self.keys.data_ptr() == room.data_ptr() and self.keys.stride() == room.stride()
                and self.values.data_ptr() == self._value_room.data_ptr())


def _with_room(cached: torch.Tensor, new: torch.Tensor, length: int, end: int) -> torch.Tensor:
    """A buffer for ``end`` positions and room beyond, holding ``cached``'s ``length`` positions."""
    shape = (*new.shape[:2], end + max(MIN_ROOM, end // 2), new.shape[-1])
    room = new.new_empty(shape)
    if length:
        room[:, :, :length] = cached
    return room


def with_room(cache) -> object:
    """``cache`` (a fresh ``DynamicCache``) set to build its layers as ``RoomyLayer``; unchanged on a transformers
    release whose caches do not build their layers from ``layer_class_to_replicate``."""
    if getattr(cache, "layer_class_to_replicate", None) is DynamicLayer:
        cache.layer_class_to_replicate = RoomyLayer
    return cache
