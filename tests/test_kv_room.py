"""``RoomyLayer``: the HF engine's KV cache layer that writes each step in place. It holds what transformers'
``DynamicLayer`` holds after any sequence of steps and of the running batch's replacements (rows leaving, joining,
leading padding trimmed), and copies the cache once per ``MIN_ROOM`` steps, not once per step. The engine tests
(``test_hf_engine.py``) check the tokens and log-probs it decodes against clean forward passes."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rlinf_search.workers.rollout.kv_room import MIN_ROOM, RoomyLayer, with_room


def _states(rows: int, positions: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, 2, positions, 4, generator=generator),
            torch.randn(rows, 2, positions, 4, generator=generator))


def test_steps_and_replacements_hold_what_the_concatenating_layer_holds():
    roomy, plain = RoomyLayer(), DynamicLayer()
    buffers, rows = set(), 3
    for step in range(200):
        keys, values = _states(rows, 7 if step == 0 else 1, step)  # a prefill, then one position a step
        got = roomy.update(keys, values)
        expected = plain.update(keys, values)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        buffers.add(roomy._key_room.data_ptr())
        if step == 120:  # a row leaves (batch_select_indices), then leading columns are trimmed
            for layer in (roomy, plain):
                layer.batch_select_indices(torch.tensor([0, 2]))
                layer.keys, layer.values = layer.keys[:, :, 5:], layer.values[:, :, 5:]
            rows = 2
        if step == 150:  # a row joins (RunningBatch.absorb concatenates along the rows)
            extra = _states(1, plain.keys.shape[-2], 999)
            for layer in (roomy, plain):
                layer.keys = torch.cat([layer.keys, extra[0]], dim=0)
                layer.values = torch.cat([layer.values, extra[1]], dim=0)
            rows = 3
    torch.testing.assert_close(roomy.keys, plain.keys, rtol=0, atol=0)
    torch.testing.assert_close(roomy.values, plain.values, rtol=0, atol=0)
    # 200 steps: a handful of buffers (growth, and one per replacement), not one per step.
    assert len(buffers) <= 200 // MIN_ROOM + 4, len(buffers)


def test_a_fresh_cache_builds_roomy_layers():
    cache = with_room(DynamicCache())
    keys, values = _states(2, 5, 0)
    cache.update(keys, values, 0)
    assert type(cache.layers[0]) is RoomyLayer
