"""Score a converted checkpoint: ``python examples/searchr1/main_searchr1_eval.py --config-name qwen2.5-3b-tool-1node-eval``.

Any key can be overridden on the command line (``rollout.model.model_path=CKPT/hf_model``). The same run as
``rlinf-search eval qwen2.5-3b-tool-1node-eval ...`` (``rlinf_search/cli``).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from rlinf_search.cli.runs import eval_from_cfg
from rlinf_search.config import register_resolvers

register_resolvers()


@hydra.main(version_base=None, config_path="config", config_name="qwen2.5-3b-tool-1node-eval")
def main(cfg: DictConfig) -> None:
    sys.exit(eval_from_cfg(cfg))


if __name__ == "__main__":
    main()
