"""Every config key is declared once, on its field of the config model (``rlinf_search/config/model.py``), with its
default; and every key the model accepts is read by the code that builds the run (a key nothing reads would be a
setting that silently does nothing). docs/config.md's default column is checked against the same model by
``tests/test_config_docs.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rlinf_search.config as config_package
from rlinf_search.config.model import EvalConfigFile, TrainConfigFile
from rlinf_search.config.schema import SCHEMA, section_models
from rlinf_search.key_ranges import leaves
from rlinf_search.workers.actor.megatron.config import MegatronModelKeys

PACKAGE = Path(config_package.__file__).parent
# Where a section is read whole (``model_dump``) into a view: each of its keys is read there.
READ_WHOLE = {"actor.optim", "actor.lr_sched", "critic.optim", "critic.lr_sched", "actor.megatron.ckpt_convertor",
              "algorithm.distill", "monitors", "actor.megatron"}


def _attributes_read() -> set[str]:
    """Every attribute name read in ``rlinf_search/config/`` outside the model itself."""
    names = set()
    for path in PACKAGE.glob("*.py"):
        if path.name in ("model.py", "schema.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)  # a key named as a string: model_fields_set, getattr
    return names


def test_every_accepted_key_is_read():
    read = _attributes_read()
    megatron_model = {f"actor.model.{name}" for name in MegatronModelKeys.model_fields}  # read whole too
    unread = [path for path, key in leaves(SCHEMA)
              if path.rpartition(".")[2] not in read and path.rpartition(".")[0] not in READ_WHOLE
              and path not in megatron_model and len(key.choices) != 1]
    assert not unread, f"keys the model accepts that nothing in rlinf_search/config reads: {unread}"


def test_a_key_the_eval_reads_is_declared_once_for_both_runs():
    """The eval's sections are the training sections' bases (``EvalRunnerSection`` under ``RunnerSection``): a key
    both read has one field, so one default."""
    train = dict(section_models(TrainConfigFile))
    for path, eval_section in section_models(EvalConfigFile):
        if path:
            assert issubclass(train[path], eval_section), f"{path}: the eval's section is not the training one's base"
