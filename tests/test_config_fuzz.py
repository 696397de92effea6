"""Every config key, walked with values outside its declaration: generated from the config model
(``config/model.py``, its fields described by ``key_ranges.key_of``: ``SCHEMA``'s leaves and the open sections'
models), not from a hand list, so a key is fuzzed the day it is declared.

Each out-of-range number and each value of the wrong type must stop the run in one line that names the key, the
value and the range: through ``validate_cfg``, or for the teacher's section (read only when distillation is on,
against a live server) through the reader ``validate_cfg`` calls."""

from __future__ import annotations

import copy

import pytest
from omegaconf import OmegaConf

from rlinf_search.config import ConfigError, validate_cfg
from rlinf_search.config.schema import DATACLASS_SECTIONS, declarations
from rlinf_search.distill.config import TeacherConfig
from rlinf_search.key_ranges import field_keys
from tests.conftest import HOTPOT_DIR
from tests.test_config import TINY

DECLARED = list(declarations().items())


def _base() -> dict:
    raw = OmegaConf.to_container(OmegaConf.load(TINY))
    raw["data"]["train_data_paths"] = raw["data"]["val_data_paths"] = [str(HOTPOT_DIR / "test.jsonl")]
    return raw


BASE = _base()


def _with(path: str, value) -> dict:
    raw = copy.deepcopy(BASE)
    node = raw
    for part in path.split(".")[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path.split(".")[-1]] = value
    return raw


def out_of_range(key) -> list[float]:
    """Values just outside each bound the key declares (the bound itself when it is open), and far outside."""
    step = 1 if key.kind == "int" else 0.5
    values = []
    if key.low is not None:
        values += [key.low] if key.low_open else []
        values += [key.low - step, key.low - 1000]
    if key.high is not None:
        values += [key.high] if key.high_open else []
        values += [key.high + step, key.high + 1000]
    return [int(v) if key.kind == "int" else v for v in values if not key.inside(v)]


WRONG_TYPE = {"int": ["four", 2.5, True], "float": ["half", False], "bool": ["false", 1], "str": [3, ["a"]],
              "list": [3, [1, 2], "train.jsonl"]}


def _refusal(path: str, value) -> str:
    """The one-line refusal of ``value`` at ``path``."""
    section = path.rpartition(".")[0]
    if section == "algorithm.distill.teacher":
        with pytest.raises(ValueError) as error:
            TeacherConfig.from_dict({"model": "teacher", path.rpartition(".")[2]: value})
    else:
        with pytest.raises(ConfigError) as error:
            validate_cfg(_with(path, value))
    return str(error.value)


def test_the_base_config_validates():
    validate_cfg(copy.deepcopy(BASE))


def test_every_number_declares_its_range_or_why_it_has_none():
    numbers = [(path, key) for path, key in DECLARED if key.numeric]
    assert len(numbers) > 50
    unbounded = [(path, key.unbounded) for path, key in numbers if not key.bounded]
    assert all(reason for _, reason in unbounded)
    print(f"\n{len(numbers)} numeric keys declared; unbounded, with the reason each: "
          + ("; ".join(f"{path} ({reason})" for path, reason in unbounded) or "none"))


@pytest.mark.parametrize("path, key", [(p, k) for p, k in DECLARED if k.numeric and k.bounded],
                         ids=[p for p, k in DECLARED if k.numeric and k.bounded])
def test_an_out_of_range_number_is_refused_in_one_line(path, key):
    values = out_of_range(key)
    assert values, f"{path}: no value outside {key.range_words()}"
    for value in values:
        message = _refusal(path, value)
        assert message.startswith(path) and repr(value) in message and key.range_words() in message, message
        assert "\n" not in message


@pytest.mark.parametrize("path, key", [(p, k) for p, k in DECLARED if k.kind in WRONG_TYPE],
                         ids=[p for p, k in DECLARED if k.kind in WRONG_TYPE])
def test_a_value_of_the_wrong_type_is_refused_in_one_line(path, key):
    for value in WRONG_TYPE[key.kind]:
        message = _refusal(path, value)
        assert message.startswith(path) and repr(value) in message and "\n" not in message, message


@pytest.mark.parametrize("cls", list(DATACLASS_SECTIONS.values()), ids=list(DATACLASS_SECTIONS))
def test_every_number_of_an_open_section_is_described(cls):
    described = dict(field_keys(cls))
    undescribed = [name for name, info in cls.model_fields.items()
                   if any(word in str(info.annotation) for word in ("int", "float")) and name not in described]
    assert not undescribed, f"{cls.__name__}: numeric fields without a type and range: {undescribed}"


@pytest.mark.parametrize("path, key", [(p, k) for p, k in DECLARED if k.choices],
                         ids=[p for p, k in DECLARED if k.choices])
def test_a_string_outside_its_choices_is_refused_in_one_line(path, key):
    message = _refusal(path, "no-such-choice")
    assert message.startswith(path) and "'no-such-choice'" in message and ", ".join(key.choices) in message, message
