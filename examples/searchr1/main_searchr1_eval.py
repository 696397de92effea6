"""Score a converted checkpoint: ``python examples/searchr1/main_searchr1_eval.py --config-name qwen2.5-3b-tool-1node-eval``.

Any key can be overridden on the command line (``rollout.model.model_path=CKPT/hf_model``).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from rlinf_search.config import ConfigError, register_resolvers
from rlinf_search.config.eval import validate_eval_cfg
from rlinf_search.runners.eval_main import run_eval
from rlinf_search.runners.eval_runner import format_table
from rlinf_search.runners.infra_failures import RunStopped
from rlinf_search.scheduler.cluster import ClusterError

register_resolvers()


@hydra.main(version_base=None, config_path="config", config_name="qwen2.5-3b-tool-1node-eval")
def main(cfg: DictConfig) -> None:
    try:
        config = validate_eval_cfg(cfg)
        report, path = run_eval(config)
    except ConfigError as exc:  # raised before any worker starts (the prompt limit is checked in run_eval)
        print(f"config error: {exc}", file=sys.stderr)
        sys.exit(2)
    except ClusterError as exc:  # the config is sound; this machine cannot run it
        print(f"cannot start: {exc}", file=sys.stderr)
        sys.exit(2)
    except RunStopped as exc:  # a service failed some questions: a score would be wrong
        print(f"stopped: {exc}", file=sys.stderr)
        sys.exit(1)
    print(format_table(report))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
