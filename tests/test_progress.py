"""Progress in a log file: a line per tenth of the work, with rate and time left, never a wall of bars."""

from __future__ import annotations

import io
import subprocess
import sys

from rlinf_search.progress import LineProgress


def test_line_progress_prints_a_line_per_tenth_and_one_at_the_end():
    out = io.StringIO()
    for _ in (bar := LineProgress(range(100), desc="sft skill", unit="step", file=out)):
        bar.set_postfix(loss="0.500")
    lines = out.getvalue().splitlines()
    assert len(lines) == 10 and "\r" not in out.getvalue()
    assert lines[0].startswith("sft skill:  10% 10/100 steps") and "left" in lines[0] and "loss=0.500" in lines[0]
    assert lines[-1].startswith("sft skill: 100% 100/100 steps") and "left" not in lines[-1]


def test_resumed_bar_counts_from_its_start():
    out = io.StringIO()
    with LineProgress(total=40, initial=30, desc="train", unit="step", file=out) as bar:
        for _ in range(10):
            bar.update(1)
    assert out.getvalue().splitlines()[-1].startswith("train: 100% 40/40 steps")


def test_warm_start_log_has_no_carriage_returns(tmp_path):
    """The real entry point, its stderr a file as in ``demo.sh > log``."""
    code = ("from rlinf_search.progress import progress\n"
            "for _ in progress(range(50), desc='stage', unit='step'): pass\n")
    log = tmp_path / "log"
    with log.open("w") as stream:
        subprocess.run([sys.executable, "-c", code], stderr=stream, check=True)
    text = log.read_text()
    assert "\r" not in text and text.count("\n") == 10, text
