"""The retrieval benchmark's ceiling: the server's own retriever searched in-process, per batch size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_ceiling_times_the_servers_retriever_at_each_batch_size(hotpot_index_dir, hotpot_corpus, tmp_path):
    """Through the script's command line, as benchmarks/retrieval_qps.py runs it: the MiniLM index loaded as the
    server loads it, a cell per batch size and layout (one batch at a time, two at once) with a positive rate, the
    best of them named, and a bad batch size refused in one line."""
    out = tmp_path / "ceiling.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "encoder_ceiling.py"), "--index-dir", str(hotpot_index_dir),
               "--corpus", str(hotpot_corpus), "--retriever", "minilm", "--batch-sizes", "1,8", "--seconds", "0.3",
               "--json-out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert [(cell["streams"], cell["batch_size"]) for cell in result["cells"]] == [(1, 1), (1, 8), (2, 1), (2, 8)]
    assert all(cell["qps"] > 0 and cell["calls"] >= 1 for cell in result["cells"])
    assert result["best"] == max(result["cells"], key=lambda cell: cell["qps"])
    assert "<- ceiling" in done.stdout
    refused = subprocess.run(command[:-2] + ["--batch-sizes", "0"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and refused.stderr.strip().startswith("encoder_ceiling: --batch-sizes")
    refused = subprocess.run(command[:-2] + ["--streams", "0"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and refused.stderr.strip().startswith("encoder_ceiling: --streams")
