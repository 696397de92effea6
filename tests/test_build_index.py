"""The index builder: manifests, a real kill-and-resume of a dense build, adoption, and bad input."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import faiss
import numpy as np
import pytest

from rlinf_search.retrieval.build_index import main as build_index_main
from rlinf_search.retrieval.corpus import CorpusStore
from rlinf_search.retrieval.dense_index import INDEX_FILE, PROGRESS_FILE
from rlinf_search.retrieval.encoders import DenseEncoder
from rlinf_search.retrieval.manifest import IndexManifest, IndexMismatchError
from rlinf_search.retrieval.retrievers import RetrieverOptions, available_indexes, open_retriever
from tests.conftest import EXAMPLE_CORPUS, HOTPOT_DIR


@pytest.fixture()
def example_corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.jsonl"
    shutil.copyfile(EXAMPLE_CORPUS, path)
    return path


def test_bm25_and_dense_builds_write_manifests(tmp_path, example_corpus):
    out = tmp_path / "idx"
    assert build_index_main(["--corpus", str(example_corpus), "--out", str(out), "--retriever", "hybrid"]) == 0
    assert available_indexes(out) == ["bm25", "minilm"]
    store = CorpusStore(example_corpus)
    dense = IndexManifest.load(out / "minilm")
    assert (dense.kind, dense.dim, dense.count, dense.index_type) == ("dense", 384, 10, "Flat")
    assert dense.corpus_checksum == store.fingerprint.checksum
    assert not (out / "minilm" / "embeddings.f32").exists(), "embeddings are dropped after the index is written"
    assert IndexManifest.load(out / "bm25").count == 10
    # Every passage finds itself first by its own title and text.
    retriever = open_retriever(out, "minilm", store, RetrieverOptions())
    rows, scores = retriever.search([p.contents for p in store.iter_passages()], 1)
    assert rows[:, 0].tolist() == list(range(10))
    assert np.all(np.diff(retriever.search(["Lincoln"], 5)[1][0]) <= 0), "scores come best first"


def test_hnsw_index_type(tmp_path, example_corpus):
    out = tmp_path / "idx"
    assert build_index_main(["--corpus", str(example_corpus), "--out", str(out), "--retriever", "minilm",
                             "--index-type", "HNSW32"]) == 0
    index = faiss.read_index(str(out / "minilm" / INDEX_FILE))
    assert index.ntotal == 10 and index.metric_type == faiss.METRIC_INNER_PRODUCT


@pytest.mark.heavy  # over a minute on 2 cores; CI runs it (scripts/test.sh --all)
def test_killed_dense_build_resumes_where_it_stopped(tmp_path):
    corpus_path = tmp_path / "corpus.jsonl"
    with open(HOTPOT_DIR / "corpus.jsonl") as src:
        corpus_path.write_text("".join(line for line, _ in zip(src, range(192))))
    out = tmp_path / "idx"
    command = [sys.executable, "-m", "rlinf_search.retrieval.build_index", "--corpus", str(corpus_path),
               "--out", str(out), "--retriever", "minilm", "--chunk-rows", "16"]
    progress = out / "minilm" / PROGRESS_FILE
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    rows_done = 0
    while time.monotonic() < deadline and first.poll() is None:
        if progress.is_file():
            rows_done = json.loads(progress.read_text())["rows_done"]
            if rows_done >= 48:
                break
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    rows_done = json.loads(progress.read_text())["rows_done"]  # it may have finished a chunk more
    assert 48 <= rows_done < 192, f"the build should have been caught mid-way, got {rows_done} rows"
    assert not (out / "minilm" / "manifest.json").exists()

    resumed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    # The progress output shows the resumed starting point: the second run did not embed from row 0.
    assert f"| {rows_done}/192" in resumed.stderr or f" {rows_done}/192 " in resumed.stderr
    index = faiss.read_index(str(out / "minilm" / INDEX_FILE))
    assert index.ntotal == 192
    store = CorpusStore(corpus_path)
    expected = DenseEncoder("minilm").encode_passages([p.contents for p in store.iter_passages()])
    np.testing.assert_allclose(index.reconstruct_n(0, 192), expected, atol=2e-4)


def test_adopt_existing_faiss_index(tmp_path, example_corpus):
    vectors = np.random.default_rng(0).standard_normal((10, 16)).astype(np.float32)
    flat = faiss.IndexFlatIP(16)
    flat.add(vectors)
    faiss.write_index(flat, str(tmp_path / "e5_Flat.index"))
    out = tmp_path / "idx"
    assert build_index_main(["--corpus", str(example_corpus), "--out", str(out), "--retriever", "e5",
                             "--from-faiss", str(tmp_path / "e5_Flat.index")]) == 0
    manifest = IndexManifest.load(out / "e5")
    assert (manifest.count, manifest.dim, manifest.index_type) == (10, 16, "adopted")
    short = tmp_path / "short.jsonl"
    short.write_text("".join(example_corpus.read_text().splitlines(keepends=True)[:5]))
    assert build_index_main(["--corpus", str(short), "--out", str(tmp_path / "idx2"), "--retriever", "e5",
                             "--from-faiss", str(tmp_path / "e5_Flat.index")]) == 1


def test_index_refuses_another_corpus(tmp_path, example_corpus, hotpot_index_dir):
    with pytest.raises(IndexMismatchError, match="was built on .* pass the corpus it was built on"):
        open_retriever(hotpot_index_dir, "bm25", CorpusStore(example_corpus), RetrieverOptions())


def test_bad_arguments_fail_with_one_line(tmp_path, example_corpus, capsys):
    assert build_index_main(["--corpus", str(example_corpus), "--out", str(tmp_path), "--retriever", "nope"]) == 2
    assert "unknown retriever 'nope'" in capsys.readouterr().err
    assert build_index_main(["--corpus", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path),
                             "--retriever", "bm25"]) == 1
    assert "corpus file not found" in capsys.readouterr().err
    assert build_index_main(["--corpus", str(example_corpus), "--out", str(tmp_path), "--retriever", "minilm",
                             "--index-type", "NotAnIndex"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("build_index:") and len(err.splitlines()) == 1


def test_duplicate_passage_ids_are_refused_in_one_line(tmp_path, example_corpus, capsys):
    """Two different passages that would both answer as one id: the build stops before writing any index."""
    rows = example_corpus.read_text().splitlines()
    clash = json.loads(rows[4])
    clash["id"] = json.loads(rows[1]).get("id", json.loads(rows[1]).get("_id"))
    clash.pop("_id", None)
    corpus = tmp_path / "dup.jsonl"
    corpus.write_text("\n".join(rows[:7] + [json.dumps(clash)] + rows[7:]) + "\n")
    out = tmp_path / "index"
    assert build_index_main(["--corpus", str(corpus), "--out", str(out), "--retriever", "bm25"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("build_index: ")
    assert f"rows 1 and 7 share the id {clash['id']!r}" in err, err
    assert not (out / "bm25").exists()
    # The corpus as shipped has none.
    assert build_index_main(["--corpus", str(example_corpus), "--out", str(out), "--retriever", "bm25"]) == 0
