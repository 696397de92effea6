"""Precision spellings: RLinf's (``bf16``) and torch's (``bfloat16``), and the torch dtype each names."""

from __future__ import annotations

from typing import Literal

Precision = Literal["fp32", "bf16", "fp16", "float32", "bfloat16", "float16"]
"""A precision spelling: RLinf's (``bf16``) or torch's (``bfloat16``)."""
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "float32": "float32",
              "bfloat16": "bfloat16", "float16": "float16"}
"""Precision spellings to torch dtype names."""


def dtype_name(precision: str) -> str:
    """A precision spelling (``bf16``) as its torch dtype name (``bfloat16``)."""
    return PRECISIONS[precision]


def training_dtype_name(precision: str) -> str:
    """``dtype_name`` of a model that trains, where fp16 is refused: fp16 gradients need loss scaling, which this
    trainer does not do (bf16 has fp32's range and needs none)."""
    if PRECISIONS[precision] == "float16":
        raise ValueError("fp16 training needs loss scaling, which this trainer does not do; use bf16 (bf16 compute "
                         "over fp32 master weights) or fp32")
    return PRECISIONS[precision]
