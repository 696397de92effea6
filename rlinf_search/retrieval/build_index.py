"""Build retrieval indexes over a corpus.

    python -m rlinf_search.retrieval.build_index --corpus wiki-18.jsonl --out indexes/ --retriever e5

Each retriever's index goes to ``OUT/<retriever>/`` (``hybrid`` builds both ``bm25`` and the dense
one). Dense builds resume after a kill. ``--from-faiss e5_Flat.index`` adopts an index built by
Search-R1's own scripts instead of re-embedding 21 M passages.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rlinf_search.retrieval.bm25_index import BM25Options, build_bm25_index
from rlinf_search.retrieval.corpus import CorpusFormatError, CorpusStore
from rlinf_search.retrieval.dense_index import DenseBuildOptions, adopt_faiss_index, build_dense_index
from rlinf_search.retrieval.encoders import ENCODER_SPECS, DenseEncoder, encoder_spec


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rlinf_search.retrieval.build_index",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help="corpus jsonl (Search-R1 or BEIR records)")
    parser.add_argument("--out", required=True, help="index folder; each retriever gets a subfolder")
    parser.add_argument("--retriever", required=True,
                        help=f"bm25, hybrid, or a dense encoder: {', '.join(sorted(ENCODER_SPECS))}")
    parser.add_argument("--dense", default="minilm", help="with --retriever hybrid: the dense encoder")
    parser.add_argument("--model", default=None, help="local encoder model dir (default: the family's)")
    parser.add_argument("--index-type", default="Flat", help="faiss index_factory string: Flat, HNSW32, IVF4096,PQ64")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="passages per encoder forward pass (default: 16 on CPU, 256 on GPU)")
    parser.add_argument("--chunk-rows", type=int, default=4096, help="passages per resumable chunk")
    parser.add_argument("--max-length", type=int, default=None, help="encoder token limit (default: the family's)")
    parser.add_argument("--keep-embeddings", action="store_true", help="keep embeddings.f32 after the build")
    parser.add_argument("--from-faiss", default=None, help="adopt an existing faiss index file instead of embedding")
    return parser


def _build_dense(corpus: CorpusStore, name: str, out: Path, args: argparse.Namespace) -> None:
    encoder = DenseEncoder(name, args.model, max_length=args.max_length)
    options = DenseBuildOptions(index_type=args.index_type, chunk_rows=args.chunk_rows,
                                batch_size=args.batch_size, keep_embeddings=args.keep_embeddings)
    build_dense_index(corpus, encoder, out / name, options)


def build(args: argparse.Namespace) -> list[str]:
    """Run the build the arguments describe; return the names of the indexes written."""
    out = Path(args.out)
    corpus = CorpusStore(args.corpus)
    corpus.check_unique_ids()
    if args.from_faiss:
        encoder_spec(args.retriever)  # fails early on an unknown family
        adopt_faiss_index(Path(args.from_faiss), corpus, out / args.retriever,
                          retriever=args.retriever, model=args.model or "")
        return [args.retriever]
    if args.retriever in ("bm25", "hybrid"):
        build_bm25_index(corpus, out / "bm25", BM25Options())
    if args.retriever == "hybrid":
        _build_dense(corpus, args.dense, out, args)
        return ["bm25", args.dense]
    if args.retriever != "bm25":
        _build_dense(corpus, args.retriever, out, args)
    return [args.retriever]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    valid = {"bm25", "hybrid", *ENCODER_SPECS}
    if args.retriever not in valid or (args.retriever == "hybrid" and args.dense not in ENCODER_SPECS):
        print(f"build_index: unknown retriever {args.retriever!r} (or --dense {args.dense!r}); "
              f"choose from {sorted(valid)}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    try:
        built = build(args)
    except (FileNotFoundError, CorpusFormatError, OSError, ValueError, RuntimeError) as exc:
        print(f"build_index: {exc}", file=sys.stderr)
        return 1
    print(f"built {', '.join(built)} in {args.out} ({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
