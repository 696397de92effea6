"""Training and config-driven eval from a composed config, with the exit codes and one-line errors every entry
point shares (``rlinf-search train``/``eval``, ``examples/searchr1/main_searchr1*.py``): 2 for a config this
machine should not start, 1 for a run that stopped (its last checkpoint stands), 0 when it finished."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from omegaconf import DictConfig

from rlinf_search.config import ConfigError, validate_cfg
from rlinf_search.config.eval import validate_eval_cfg

LOG_NAME = "driver.log"
"""The driver's stdout and stderr, copied under ``runner.output_dir``."""


def train_from_cfg(cfg: DictConfig, *, log: bool = True) -> int:
    """Validate ``cfg`` and train; the exit code. ``log``: copy the terminal to ``output_dir/driver.log``."""
    from rlinf_search.distill.scorer import TeacherDown, TeacherVocabularyMismatch
    from rlinf_search.runners.preflight import PreflightFailed
    from rlinf_search.runners.train_main import RunStopped, train
    from rlinf_search.scheduler.cluster import ClusterError
    from rlinf_search.workers.actor.backends import BackendUnavailable

    try:
        config = validate_cfg(cfg)
        if log:
            copy_terminal_to(Path(config.runner.output_dir) / LOG_NAME)
        train(config)
    except (ConfigError, TeacherVocabularyMismatch) as exc:  # before any training (the teacher is asked first)
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except (BackendUnavailable, ClusterError, PreflightFailed) as exc:  # the config is sound; this machine or a
        # service it needs cannot run it now
        print(f"cannot start: {exc}", file=sys.stderr)
        return 2
    except (TeacherDown, RunStopped) as exc:  # the last checkpoint stands; resume once the cause is gone
        print(f"stopped: {exc}", file=sys.stderr)
        return 1
    return 0


def eval_from_cfg(cfg: DictConfig, *, log: bool = True) -> int:
    """Validate the eval ``cfg``, score its checkpoint on the cluster it declares, print the table; the exit code."""
    from rlinf_search.runners.eval_main import run_eval
    from rlinf_search.runners.eval_runner import format_table
    from rlinf_search.runners.infra_failures import RunStopped
    from rlinf_search.scheduler.cluster import ClusterError

    try:
        config = validate_eval_cfg(cfg)
        if log:
            copy_terminal_to(Path(config.output_dir) / LOG_NAME)
        report, path = run_eval(config)
    except ConfigError as exc:  # raised before any worker starts (the prompt limit is checked in run_eval)
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except ClusterError as exc:  # the config is sound; this machine cannot run it
        print(f"cannot start: {exc}", file=sys.stderr)
        return 2
    except RunStopped as exc:  # a service failed some questions: a score would be wrong
        print(f"stopped: {exc}", file=sys.stderr)
        return 1
    print(format_table(report))
    print(f"wrote {path}")
    return 0


def copy_terminal_to(path: Path) -> None:
    """From here on, everything this process and its children write to stdout and stderr also goes to ``path``
    (appended: a resumed run keeps one log), through one ``tee`` for each stream so that each still reaches its
    own terminal stream: the log holds what the terminal showed, Ray's worker lines included, and the current
    folder gets nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
        fd = stream.fileno()
        tee = subprocess.Popen(["tee", "-a", str(path)], stdin=subprocess.PIPE, stdout=os.dup(fd))
        os.dup2(tee.stdin.fileno(), fd)
        tee.stdin.close()  # the descriptor above now holds the pipe: tee ends when this process does
    print(f"log: {path}", flush=True)
