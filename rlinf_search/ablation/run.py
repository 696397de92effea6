"""``rlinf-search ablate``: check every arm, build the indexes the study needs, run the Hydra sweep, write the report.

Every arm's config is checked before the first cell starts (a misspelt override in the last arm fails in one line at
once, not after an hour of the others). The sweep runs in a process of its own (Hydra's multirun owns its process's
argument parsing and logging); the report is written after it from every finished cell, so a sweep stopped half way
still reports what it has, and a second call runs only what is missing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rlinf_search.ablation.cell import SweepSettings, base_overrides, cell_dir
from rlinf_search.ablation.report import write_report
from rlinf_search.ablation.study import Study
from rlinf_search.ablation.sweep import failed_cells, sweep_command
from rlinf_search.config.schema import ConfigError

BASE_FILES = ("model/sft/config.json", "data/train.prepared.jsonl", "data/val.prepared.jsonl",
              "data/test.prepared.jsonl", "data/corpus.jsonl", "index/bm25")
"""What a base folder (a finished ``scripts/demo.sh`` output) must hold."""


def check_base(base: Path) -> None:
    missing = [name for name in BASE_FILES if not (base / name).exists()]
    if missing:
        raise ConfigError(f"--base {base}: not a finished demo folder (missing {', '.join(missing)}); run "
                          "`bash scripts/demo.sh` (it writes outputs/demo) or pass another --base")


def build_indexes(study: Study, base: Path) -> None:
    """Each retriever the study names, built over the base's corpus into ``base/index`` when absent."""
    for name in study.indexes:
        if (base / "index" / name).is_dir():
            continue
        print(f"building the {name} index of {base / 'data' / 'corpus.jsonl'} (study {study.name} needs it)",
              flush=True)
        subprocess.run([sys.executable, "-m", "rlinf_search.retrieval.build_index", "--corpus",
                        str(base / "data" / "corpus.jsonl"), "--out", str(base / "index"), "--retriever", name],
                       check=True)


def check_arms(study: Study, arms: list[str], settings: SweepSettings, *, files: bool = True) -> list[str]:
    """One line per problem of any arm's config, as ``rlinf-search check`` finds them (``files``: open the files
    the config names too)."""
    from rlinf_search.cli.check import check

    problems = []
    for arm in arms:
        overrides = [*base_overrides(settings, 0, settings.out / "cells" / arm / "check"),
                     *study.arm_overrides(arm, settings.base)]
        problems += [f"arm {arm}: {line}"
                     for line in check(settings.config, overrides, files=files, kind="train").problems]
    return problems


def ablate(study: Study, arms: list[str], seeds: list[int], settings: SweepSettings) -> int:
    """Run the sweep and write its report; the exit code (1 when a cell failed or an arm's config is wrong)."""
    check_base(settings.base)
    build_indexes(study, settings.base)
    problems = check_arms(study, arms, settings)
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        return 2
    cells = len(arms) * len(seeds)
    print(f"study {study.name}: {len(arms)} arms x {len(seeds)} seeds = {cells} cells of {settings.steps} RL "
          f"steps and {settings.eval_n} held-out questions each, into {settings.out}", flush=True)
    for arm in arms:  # a cell that failed in an earlier call is tried again: its old failure is no longer news
        for seed in seeds:
            (cell_dir(settings, arm, seed) / "failed.txt").unlink(missing_ok=True)
    code = subprocess.run(sweep_command(str(study.source), arms, seeds, settings)).returncode
    _, text = write_report(study, settings, arms, seeds)
    print(f"\n{text}\n\nwrote {settings.out / 'results.json'}, {settings.out / 'table.md'}, "
          f"{settings.out / 'curves.png'}")
    failed = failed_cells(settings, arms, seeds)
    for line in failed:
        print(f"failed cell: {line}", file=sys.stderr)
    return 1 if code or failed else 0
