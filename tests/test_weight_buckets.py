"""The bucket protocol every weight transport speaks: the plan, packing and viewing back, tied tensors once."""

from __future__ import annotations

import pytest
import torch

from rlinf_search.scheduler.weight_buckets import ALIGN, collect, pack_bucket, plan_buckets, unpack_bucket


def state() -> dict[str, torch.Tensor]:
    embed = torch.randn(32, 16)
    return {
        "embed.weight": embed,
        "layer.weight": torch.randn(16, 16).to(torch.bfloat16),  # a dtype numpy lacks
        "layer.bias": torch.randn(3),  # 12 bytes: the next tensor starts aligned all the same
        "steps": torch.tensor(7),  # 0-d, int64
        "big": torch.randn(64, 64),  # larger than a bucket: a bucket of its own
        "head.weight": embed,  # tied: the embedding's memory under another name
        "empty": torch.zeros(0),
    }


def roundtrip(sd, bucket_bytes):
    plan = plan_buckets(sd, bucket_bytes, version=3)
    buckets = [unpack_bucket(pack_bucket(sd, slots, size), slots, plan.aliases)
               for slots, size in zip(plan.buckets, plan.sizes)]
    return plan, buckets


def test_plan_lays_out_aligned_buckets_in_order_with_tied_tensors_once():
    sd = state()
    plan, buckets = roundtrip(sd, bucket_bytes=4096)
    assert plan.version == 3 and plan.aliases == {"head.weight": "embed.weight"}
    names = [[slot.name for slot in slots] for slots in plan.buckets]
    assert names == [["embed.weight", "layer.weight", "layer.bias", "steps"], ["big"], ["empty"]]
    for slots, size in zip(plan.buckets, plan.sizes):
        assert all(slot.offset % ALIGN == 0 for slot in slots)
        assert size >= slots[-1].offset + slots[-1].nbytes
    assert plan.sizes[1] == 64 * 64 * 4  # a tensor over the bucket size is not split
    # Sent once: the tied embedding is not counted twice.
    unique = sum(t.numel() * t.element_size() for n, t in sd.items() if n != "head.weight")
    assert unique <= plan.nbytes < unique + ALIGN * len(sd)


def test_buckets_view_back_bit_exact_with_every_alias_named():
    sd = state()
    _, buckets = roundtrip(sd, bucket_bytes=4096)
    assert "head.weight" in buckets[0]  # the alias arrives with its source
    got = collect(iter(buckets))
    assert got.keys() == sd.keys()
    for name, tensor in sd.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name], tensor), name
    assert got["head.weight"].data_ptr() == got["embed.weight"].data_ptr()


def test_equal_values_in_separate_memory_are_not_aliases():
    sd = {"a": torch.ones(4), "b": torch.ones(4), "c": torch.ones(8)[:4]}
    plan = plan_buckets(sd, 1024, version=1)
    assert plan.aliases == {} and [slot.name for slot in plan.buckets[0]] == ["a", "b", "c"]


def test_a_bucket_size_must_be_positive():
    with pytest.raises(ValueError, match="bucket_bytes must be positive, got 0"):
        plan_buckets(state(), 0, version=1)
