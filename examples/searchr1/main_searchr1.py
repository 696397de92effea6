"""Train a policy to search with GRPO: ``python examples/searchr1/main_searchr1.py --config-name tiny-cpu``.

Any key can be overridden on the command line (``algorithm.kl_beta=0 runner.max_steps=10``).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from rlinf_search.config import ConfigError, register_resolvers, validate_cfg
from rlinf_search.distill.scorer import TeacherDown, TeacherVocabularyMismatch
from rlinf_search.runners.preflight import PreflightFailed
from rlinf_search.runners.train_main import RunStopped, train
from rlinf_search.scheduler.cluster import ClusterError
from rlinf_search.workers.actor.backends import BackendUnavailable

register_resolvers()


@hydra.main(version_base=None, config_path="config", config_name="tiny-cpu")
def main(cfg: DictConfig) -> None:
    try:
        config = validate_cfg(cfg)
        train(config)
    except (ConfigError, TeacherVocabularyMismatch) as exc:  # before any training (the teacher is asked first)
        print(f"config error: {exc}", file=sys.stderr)
        sys.exit(2)
    except (BackendUnavailable, ClusterError, PreflightFailed) as exc:  # the config is sound; this machine or a
        # service it needs cannot run it now
        print(f"cannot start: {exc}", file=sys.stderr)
        sys.exit(2)
    except (TeacherDown, RunStopped) as exc:  # the last checkpoint stands; resume once the cause is gone
        print(f"stopped: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
