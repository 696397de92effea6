"""Shared fixtures: the bundled data, indexes built once per session, a live retrieval server and a Ray cluster."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rlinf_search.retrieval.build_index import main as build_index_main

DATA_DIR = Path(__file__).parent / "data"
HOTPOT_DIR = DATA_DIR / "hotpotqa_100"
EXAMPLE_CORPUS = DATA_DIR / "format_examples" / "searchr1_example_corpus.jsonl"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def hotpot_corpus(tmp_path_factory) -> Path:
    """A private copy of the HotpotQA corpus, so offset tables are written to a temp dir."""
    target = tmp_path_factory.mktemp("hotpot") / "corpus.jsonl"
    shutil.copyfile(HOTPOT_DIR / "corpus.jsonl", target)
    return target


@pytest.fixture(scope="session")
def hotpot_index_dir(tmp_path_factory, hotpot_corpus) -> Path:
    """BM25 and MiniLM Flat indexes over the HotpotQA corpus (built once, about 20 s)."""
    out = tmp_path_factory.mktemp("hotpot_index")
    assert build_index_main(["--corpus", str(hotpot_corpus), "--out", str(out), "--retriever", "hybrid"]) == 0
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A randomly initialised tiny Qwen2 model with a BPE tokenizer trained on the HotpotQA text (~5 s)."""
    from toolkits.make_tiny_model import make_tiny_model

    out = tmp_path_factory.mktemp("tiny_model")
    return make_tiny_model(out, [HOTPOT_DIR / "corpus.jsonl", HOTPOT_DIR / "test.jsonl"])


def adam_steps(folder: Path, scratch: Path) -> set[int]:
    """Adam's step counts in the optimizer shards of a checkpoint folder (``fsdp`` keeps the optimizer as
    rank shards, not in ``training_state.pt``), read back as one state dict via ``scratch``."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from rlinf_search.checkpoint import TRAINING_STATE

    state = torch.load(folder / TRAINING_STATE, weights_only=False)
    assert "optimizer" not in state, "fsdp keeps the optimizer as rank shards, not in training_state.pt"
    dcp_to_torch_save(folder / state["optimizer_shards"], scratch)
    return {int(s["step"]) for s in torch.load(scratch, weights_only=False)["optimizer"]["state"].values()}


@pytest.fixture(scope="module")
def hotpot_server(hotpot_index_dir, hotpot_corpus):
    """A BM25 retrieval server over the HotpotQA corpus, on loopback, for one test module."""
    from rlinf_search.retrieval.launch import RetrievalServerProcess

    args = ["--index-dir", str(hotpot_index_dir), "--corpus", str(hotpot_corpus), "--retriever", "bm25"]
    with RetrievalServerProcess(args) as running:
        yield running


@pytest.fixture(scope="module")
def two_slot_cluster():
    """An embedded Ray cluster of 2 CPU slots with the rollout on both, for one test module."""
    from rlinf_search.scheduler import Cluster, ClusterConfig

    with Cluster(ClusterConfig(cpu_slots_per_node=2, num_cpus=2, component_placement={"rollout": "0-1"})) as running:
        yield running


def pytest_terminal_summary(terminalreporter) -> None:
    """The docs lane's count in the summary: shell blocks of README.md and docs/*.md run, and checked unrun."""
    calls = [report for outcome in ("passed", "failed") for report in terminalreporter.stats.get(outcome, [])
             if getattr(report, "when", "") == "call" and "test_doc_blocks.py::" in report.nodeid]
    if not calls:
        return
    ran = [r for r in calls if "test_a_run_block_runs[" in r.nodeid]
    checked = [r for r in calls if "test_the_commands_of_a_block" in r.nodeid]
    failed = sum(r.failed for r in ran + checked)
    terminalreporter.write_line(f"docs as tests: {len(ran)} shell blocks run, {len(checked)} blocks' commands checked "
                                f"(flags, paths, recipes), {failed} failed")
