"""The JSON Schema editors read (``rlinf-search schema``) takes every recipe and refuses what start-up refuses.

Every recipe file of ``examples/searchr1/config``, as written (a defaults list, interpolations) and as composed,
validates against it with ``jsonschema``; every out-of-range number and wrong-type value the config fuzz test
generates from the declarations, and an unknown key anywhere, is refused at its path.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from rlinf_search.cli.configs import EXAMPLE_CONFIGS, compose
from rlinf_search.config.eval import EVAL_SCHEMA
from rlinf_search.config.json_schema import config_json_schema
from rlinf_search.config.schema import SCHEMA
from tests.test_config_fuzz import BASE, DECLARED, WRONG_TYPE, _with, out_of_range

ROOT = Path(__file__).resolve().parents[1]
TRAINING = config_json_schema(SCHEMA, title="training")
EVAL = config_json_schema(EVAL_SCHEMA, title="eval")
RECIPES = sorted(EXAMPLE_CONFIGS.glob("*.yaml"))
GROUP_FILES = sorted(EXAMPLE_CONFIGS.glob("*/*.yaml"))


def _errors(config: dict, schema: dict = TRAINING) -> list[str]:
    """Each error as ``path: message``, the path dotted as the config writes it."""
    validator = jsonschema.Draft202012Validator(schema)
    return [".".join(str(part) for part in error.absolute_path) + f": {error.message}"
            for error in validator.iter_errors(config)]


def _schema_for(path: Path) -> dict:
    return EVAL if path.stem.endswith("-eval") else TRAINING


def test_the_schema_is_a_valid_json_schema_and_the_cli_prints_it(tmp_path):
    jsonschema.Draft202012Validator.check_schema(TRAINING)
    jsonschema.Draft202012Validator.check_schema(EVAL)
    out = tmp_path / "schema.json"
    subprocess.run([sys.executable, "-m", "rlinf_search.cli", "schema", "--out", str(out)], check=True, cwd=ROOT,
                   capture_output=True)
    assert json.loads(out.read_text()) == json.loads(json.dumps(TRAINING | {"title": "rlinf-search training config"}))


@pytest.mark.parametrize("path", RECIPES + GROUP_FILES, ids=lambda p: str(p.relative_to(EXAMPLE_CONFIGS)))
def test_every_recipe_file_as_written_validates(path):
    # A group file (@package _global_) is a partial config of the same shape; eval groups are an eval's.
    schema = EVAL if "eval" in path.stem else TRAINING
    assert _errors(yaml.safe_load(path.read_text()) or {}, schema) == []


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_as_composed_validates(path):
    from omegaconf import OmegaConf

    composed = OmegaConf.to_container(compose(path.stem), resolve=True)
    assert _errors(composed, _schema_for(path)) == []


def test_the_base_config_validates_and_an_unknown_key_is_refused_at_its_path():
    assert _errors(BASE) == []
    assert _errors(_with("algorithm.clip_ratio_hgih", 0.3)) == [
        "algorithm: Additional properties are not allowed ('clip_ratio_hgih' was unexpected)"]
    assert _errors(_with("tools.search.topk", 0)) and _errors(_with("cluster.num_nodse", 1))


@pytest.mark.parametrize("path, key", [(p, k) for p, k in DECLARED if k.numeric and k.bounded],
                         ids=[p for p, k in DECLARED if k.numeric and k.bounded])
def test_an_out_of_range_number_is_refused_at_its_path(path, key):
    for value in out_of_range(key):
        assert any(error.startswith(f"{path}: ") for error in _errors(_with(path, value))), (path, value)


@pytest.mark.parametrize("path, key", [(p, k) for p, k in DECLARED if k.kind in WRONG_TYPE],
                         ids=[p for p, k in DECLARED if k.kind in WRONG_TYPE])
def test_a_value_of_the_wrong_type_is_refused_at_its_path(path, key):
    for value in WRONG_TYPE[key.kind]:
        assert any(error.startswith(f"{path}: ") for error in _errors(_with(path, value))), (path, value)


def test_a_registered_tools_section_takes_the_keys_of_its_settings_model():
    """``tools.access``: its settings model's keys with their ranges, beside ``class`` and ``enable``."""
    assert _errors({"tools": {"access": {"max_page_tokens": 200, "timeout_s": 5, "enable": True}}}) == []
    assert _errors({"tools": {"access": {"max_page_tokens": 0}}}) == [
        "tools.access.max_page_tokens: 0 is not valid under any of the given schemas"]
    assert _errors({"tools": {"access": {"pages": 3}}}) == [
        "tools.access: Additional properties are not allowed ('pages' was unexpected)"]
    assert _errors({"tools": {"my_tool": {"class": "my_package.tools:MyTool", "anything": 1}}}) == [], \
        "a tool named by dotted path keeps an open section: its model is not known before the run imports it"
    description = TRAINING["properties"]["tools"]["properties"]["access"]["properties"]["max_page_tokens"]
    assert "longer than this many tokens is cut" in description["description"]
