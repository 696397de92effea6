"""Train a policy to search with GRPO: ``python examples/searchr1/main_searchr1.py --config-name tiny-cpu``.

Any key can be overridden on the command line (``algorithm.kl_beta=0 runner.max_steps=10``). The same run as
``rlinf-search train tiny-cpu ...`` (``rlinf_search/cli``), kept for RLinf's ``--config-name`` spelling.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from rlinf_search.cli.runs import train_from_cfg
from rlinf_search.config import register_resolvers

register_resolvers()


@hydra.main(version_base=None, config_path="config", config_name="tiny-cpu")
def main(cfg: DictConfig) -> None:
    sys.exit(train_from_cfg(cfg))


if __name__ == "__main__":
    main()
