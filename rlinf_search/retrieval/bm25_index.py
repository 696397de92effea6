"""BM25 over the corpus with bm25s: a sparse matrix index that saves to disk and loads memory-mapped."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import bm25s
import numpy as np
from bm25s.tokenization import Tokenized, Tokenizer

from rlinf_search.progress import progress
from rlinf_search.retrieval.corpus import CorpusStore
from rlinf_search.retrieval.manifest import IndexManifest

BM25_SUBDIR = "bm25s"
VOCAB_SUBDIR = "tokenizer"


@dataclass(frozen=True)
class BM25Options:
    """Settings for one BM25 build."""

    k1: float = 0.9
    """Term-frequency saturation; 0.9 with b 0.4 are Pyserini's defaults, which Search-R1's BM25 uses."""
    b: float = 0.4
    """Length normalisation strength."""
    chunk_rows: int = 100_000
    """Passages tokenised per chunk while streaming the corpus."""


def _new_tokenizer() -> Tokenizer:
    return Tokenizer(lower=True, stopwords="en")


def build_bm25_index(corpus: CorpusStore, out_dir: Path, options: BM25Options) -> IndexManifest:
    """Tokenise the corpus in streamed chunks (the vocabulary grows as it goes) and write the index."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _new_tokenizer()
    token_ids: list[list[int]] = []
    with progress(total=len(corpus), desc="bm25 tokenize", unit="passage") as bar:
        for begin in range(0, len(corpus), options.chunk_rows):
            texts = [p.contents for p in corpus.iter_passages(begin, begin + options.chunk_rows)]
            token_ids.extend(tokenizer.tokenize(texts, update_vocab=True, return_as="ids",
                                                show_progress=False))
            bar.update(len(texts))
    retriever = bm25s.BM25(k1=options.k1, b=options.b)
    retriever.index(Tokenized(ids=token_ids, vocab=tokenizer.get_vocab_dict()), show_progress=False)
    retriever.save(str(out_dir / BM25_SUBDIR), show_progress=False)
    tokenizer.save_vocab(str(out_dir / VOCAB_SUBDIR))
    tokenizer.save_stopwords(str(out_dir / VOCAB_SUBDIR))
    manifest = IndexManifest(
        retriever="bm25", kind="sparse", model="", dim=0, count=len(corpus), index_type="bm25",
        corpus_path=str(corpus.path.resolve()), corpus_size=corpus.fingerprint.size_bytes,
        corpus_checksum=corpus.fingerprint.checksum, extra={"k1": options.k1, "b": options.b},
    )
    manifest.save(out_dir)
    return manifest


class BM25Searcher:
    """Loads a built BM25 index (memory-mapped) and scores tokenised queries."""

    def __init__(self, index_dir: Path):
        self._retriever = bm25s.BM25.load(str(index_dir / BM25_SUBDIR), mmap=True, show_progress=False)
        self._tokenizer = _new_tokenizer()
        # The build indexed this tokenizer's word -> id map (no stemmer), so bm25s saved that same map
        # as its vocabulary: share the one dict instead of loading a second copy from VOCAB_SUBDIR
        # (171 MB of server memory per million distinct terms).
        self._tokenizer.word_to_id = self._retriever.vocab_dict
        self._tokenizer.load_stopwords(str(index_dir / VOCAB_SUBDIR))
        self.count = int(self._retriever.scores["num_docs"])

    def search(self, queries: list[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
        """Return (rows [n, k], scores [n, k]); rows are -1 where fewer than k passages match."""
        k = min(topk, self.count)
        ids = self._tokenizer.tokenize(queries, update_vocab=False, return_as="ids", show_progress=False)
        # Plain id lists, not a Tokenized: bm25s turns a Tokenized back into strings by inverting the
        # whole vocabulary on every call (78 ms of an 85 ms query at 1 M passages, 1.1 M terms). The
        # ids are the index's own: the index was built from this tokenizer's vocabulary.
        rows, scores = self._retriever.retrieve(ids, k=k, show_progress=False, n_threads=1)
        rows, scores = np.asarray(rows, dtype=np.int64), np.asarray(scores, dtype=np.float32)
        # bm25s fills queries with no matching term with arbitrary rows at score 0: drop them.
        rows[scores <= 0] = -1
        if k < topk:
            pad = topk - k
            rows = np.pad(rows, ((0, 0), (0, pad)), constant_values=-1)
            scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=0)
        return rows, scores
