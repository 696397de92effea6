"""Building and loading faiss indexes over dense passage embeddings.

The build is resumable: embeddings go to a memory-mapped file in chunks, and a small progress
file records how many rows are done, so a killed build continues where it stopped.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlinf_search.progress import progress
from rlinf_search.retrieval.corpus import CorpusStore
from rlinf_search.retrieval.encoders import DenseEncoder
from rlinf_search.retrieval.manifest import IndexManifest

try:
    import faiss
except ImportError as exc:  # the package takes faiss from an extra: one build, never both
    raise ImportError("faiss is not installed: pip install 'rlinf-search[cpu]' (faiss-cpu) or "
                      "'rlinf-search[gpu]' (faiss-gpu-cu12), not both (docs/install.md)") from exc

INDEX_FILE = "index.faiss"
EMBEDDINGS_FILE = "embeddings.f32"
PROGRESS_FILE = "progress.json"
# Training an IVF/PQ quantiser on more than this many vectors adds time, not quality.
_MAX_TRAIN_VECTORS = 256 * 1024


@dataclass(frozen=True)
class DenseBuildOptions:
    """Settings for one dense index build."""

    index_type: str = "Flat"
    """faiss ``index_factory`` string, always with inner-product metric."""
    chunk_rows: int = 4096
    """Passages embedded (and checkpointed) per chunk."""
    batch_size: int | None = None
    """Passages per encoder forward pass (default: the encoder's choice for its device)."""
    keep_embeddings: bool = False
    """Keep ``embeddings.f32`` after the index is written (it is as large as a Flat index)."""


def _read_progress(path: Path, signature: dict) -> int:
    if not path.is_file():
        return 0
    progress = json.loads(path.read_text())
    # A progress file from another corpus or model is stale: start again rather than mix vectors.
    return int(progress["rows_done"]) if progress.get("signature") == signature else 0


def _write_progress(path: Path, signature: dict, rows_done: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"signature": signature, "rows_done": rows_done}))
    os.replace(tmp, path)


def embed_corpus(corpus: CorpusStore, encoder: DenseEncoder, out_dir: Path,
                 options: DenseBuildOptions) -> np.memmap:
    """Embed every passage into ``out_dir/embeddings.f32``, resuming from the last finished chunk."""
    n, dim = len(corpus), encoder.dim
    signature = {"model": encoder.model_path, "dim": dim, "rows": n,
                 "checksum": corpus.fingerprint.checksum, "retriever": encoder.name}
    progress_path = out_dir / PROGRESS_FILE
    emb_path = out_dir / EMBEDDINGS_FILE
    done = _read_progress(progress_path, signature) if emb_path.is_file() else 0
    mode = "r+" if done else "w+"
    embeddings = np.memmap(emb_path, dtype=np.float32, mode=mode, shape=(max(n, 1), dim))
    with progress(total=n, initial=done, desc=f"embed {encoder.name}", unit="passage") as bar:
        for begin in range(done, n, options.chunk_rows):
            stop = min(begin + options.chunk_rows, n)
            texts = [p.contents for p in corpus.iter_passages(begin, stop)]
            embeddings[begin:stop] = encoder.encode_passages(texts, batch_size=options.batch_size)
            embeddings.flush()
            _write_progress(progress_path, signature, stop)
            bar.update(stop - begin)
    return embeddings


def check_index_type(index_type: str, dim: int) -> None:
    """Fail before hours of embedding, not after, when faiss cannot build ``index_type``."""
    try:
        faiss.index_factory(dim, index_type, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError:
        raise ValueError(f"invalid --index-type {index_type!r}: faiss index_factory cannot parse it "
                         "(examples: Flat, HNSW32, IVF4096,PQ64)") from None


def build_faiss_index(embeddings: np.ndarray, count: int, index_type: str) -> faiss.Index:
    """Train (when the index type needs it) and fill an inner-product faiss index."""
    dim = embeddings.shape[1]
    index = faiss.index_factory(dim, index_type, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        rng = np.random.default_rng(0)
        sample = np.sort(rng.choice(count, size=min(count, _MAX_TRAIN_VECTORS), replace=False))
        index.train(np.ascontiguousarray(embeddings[sample]))
    step = 65536
    for begin in progress(range(0, count, step), desc="faiss add", unit="chunk"):
        index.add(np.ascontiguousarray(embeddings[begin : begin + step]))
    return index


def build_dense_index(corpus: CorpusStore, encoder: DenseEncoder, out_dir: Path,
                      options: DenseBuildOptions) -> IndexManifest:
    """Embed the corpus and write ``index.faiss`` plus the manifest into ``out_dir``."""
    check_index_type(options.index_type, encoder.dim)
    out_dir.mkdir(parents=True, exist_ok=True)
    embeddings = embed_corpus(corpus, encoder, out_dir, options)
    index = build_faiss_index(embeddings, len(corpus), options.index_type)
    tmp = out_dir / (INDEX_FILE + ".tmp")
    faiss.write_index(index, str(tmp))
    os.replace(tmp, out_dir / INDEX_FILE)
    manifest = IndexManifest(
        # The family default is recorded as "" so the index still loads where the package lives elsewhere.
        retriever=encoder.name, kind="dense", model="" if encoder.uses_default_model else encoder.model_path,
        dim=encoder.dim,
        count=len(corpus), index_type=options.index_type, corpus_path=str(corpus.path.resolve()),
        corpus_size=corpus.fingerprint.size_bytes, corpus_checksum=corpus.fingerprint.checksum,
        extra={"max_length": encoder.max_length, "pooling": encoder.spec.pooling,
               "resolved_model": encoder.model_path},
    )
    manifest.save(out_dir)
    del embeddings
    if not options.keep_embeddings:
        (out_dir / EMBEDDINGS_FILE).unlink(missing_ok=True)
        (out_dir / PROGRESS_FILE).unlink(missing_ok=True)
    return manifest


def adopt_faiss_index(index_file: Path, corpus: CorpusStore, out_dir: Path, *,
                      retriever: str, model: str) -> IndexManifest:
    """Register an index built elsewhere (Search-R1's ``e5_Flat.index``) by linking it and writing a manifest."""
    index = faiss.read_index(str(index_file), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    if index.ntotal != len(corpus):
        raise ValueError(f"{index_file} holds {index.ntotal} vectors but the corpus has {len(corpus)} "
                         "rows; an index must have one vector per corpus row, in order")
    out_dir.mkdir(parents=True, exist_ok=True)
    link = out_dir / INDEX_FILE
    link.unlink(missing_ok=True)
    link.symlink_to(index_file.resolve())
    manifest = IndexManifest(
        retriever=retriever, kind="dense", model=model, dim=index.d, count=index.ntotal,
        index_type="adopted", corpus_path=str(corpus.path.resolve()),
        corpus_size=corpus.fingerprint.size_bytes, corpus_checksum=corpus.fingerprint.checksum,
        extra={"adopted_from": str(index_file.resolve())},
    )
    manifest.save(out_dir)
    return manifest


def load_faiss_index(index_dir: Path, *, use_gpu: bool = False, mmap: bool = False) -> faiss.Index:
    """Read ``index.faiss``; memory-map it when asked (Flat indexes of wiki-18 size are 60 GB)."""
    flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
    index = faiss.read_index(str(index_dir / INDEX_FILE), flags)
    if use_gpu:
        if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
            raise RuntimeError("--faiss-gpu needs faiss-gpu and a visible GPU (pip install 'rlinf-search[gpu]')")
        options = faiss.GpuMultipleClonerOptions()
        options.shard = True
        options.useFloat16 = True
        index = faiss.index_cpu_to_all_gpus(index, co=options)
    return index
