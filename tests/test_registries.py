"""The contract every extension point keeps: one ``Registry`` class, the same verbs and errors everywhere.

Each registry is checked the same way: its built-ins resolve, a registered entry resolves and is listed,
a second registration needs ``overwrite``, an unknown name fails in one line that lists the known
names, and a dotted path to user code resolves where the registry takes one (and only there).
"""

from __future__ import annotations

import pytest

from rlinf_search.agents import AGENT_PROTOCOLS
from rlinf_search.algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    MISMATCH_CORRECTIONS,
    POLICY_LOSSES,
)
from rlinf_search.config import ConfigError
from rlinf_search.data.prompts import TEMPLATES, TemplateError
from rlinf_search.data.readers import READERS, PrepareError
from rlinf_search.registry import Registry
from rlinf_search.retrieval.encoders import ENCODER_SPECS, EncoderSpec
from rlinf_search.rewards import REWARDS
from rlinf_search.tools.search import SEARCH_BACKENDS
from rlinf_search.workers.actor.backends import TRAINING_BACKENDS, TrainingBackend
from rlinf_search.workers.rollout.base import ROLLOUT_ENGINES
from tests import registry_plugins

PLUGINS = "tests.registry_plugins"

# (registry, an entry to register, the name of a plugin function a dotted path may name, or None where
# the registry takes names only, the error it raises)
CASES = {
    "advantage": (ADVANTAGE_ESTIMATORS, registry_plugins.always_plus_one, "always_plus_one", ValueError),
    "kl": (KL_ESTIMATORS, registry_plugins.constant_kl, "constant_kl", ValueError),
    "loss_aggregation": (LOSS_AGGREGATIONS, registry_plugins.no_aggregation, "no_aggregation", ValueError),
    "mismatch": (MISMATCH_CORRECTIONS, registry_plugins.unit_weights, "unit_weights", ValueError),
    "policy_loss": (POLICY_LOSSES, registry_plugins.reinforce_loss, "reinforce_loss", ValueError),
    "reward": (REWARDS, registry_plugins.em_plus_quarter, "em_plus_quarter", ValueError),
    "reader": (READERS, registry_plugins.read_lines, "read_lines", PrepareError),
    "rollout_engine": (ROLLOUT_ENGINES, registry_plugins.build_nothing, "build_nothing", ValueError),
    "search_backend": (SEARCH_BACKENDS, registry_plugins.build_nothing, "build_nothing", ValueError),
    "template": (TEMPLATES, "Q: {question}", None, TemplateError),
    "encoder": (ENCODER_SPECS, lambda: EncoderSpec("m", "mean", "", "", 8), None, ValueError),
    "agent_protocol": (AGENT_PROTOCOLS, registry_plugins.ToolCallingEngine, "ToolCallingEngine", ValueError),
    "training_backend": (TRAINING_BACKENDS, TrainingBackend(trainer=f"{PLUGINS}:build_nothing"), "build_nothing",
                         ValueError),
}


def test_every_extension_point_is_a_registry():
    assert all(isinstance(case[0], Registry) for case in CASES.values())
    assert len({id(case[0]) for case in CASES.values()}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_builtins_resolve_to_what_the_mapping_holds(case):
    registry = CASES[case][0]
    assert registry.names() == sorted(registry) and registry.names()
    for name in registry.names():
        if registry is ROLLOUT_ENGINES and name == "vllm":
            continue  # resolving imports the vLLM engine module; test_vllm_engine_contract covers it
        assert registry.resolve(name) is registry[name]


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_register_resolve_overwrite_unregister(case):
    registry, entry, _, error = CASES[case]
    name = "contract_test_entry"
    registry.register(name, entry)
    try:
        assert name in registry and name in registry.names()
        assert registry.resolve(name) is entry
        with pytest.raises(error, match="already registered"):
            registry.register(name, entry)
        other = type(entry)(trainer="x:y") if isinstance(entry, TrainingBackend) else (
            "Other: {question}" if isinstance(entry, str) else (lambda *a, **k: None))
        registry.register(name, other, overwrite=True)
        assert registry.resolve(name) is other
    finally:
        registry.unregister(name)
    assert name not in registry


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_unknown_name_is_one_line_naming_the_known_ones(case):
    registry, _, _, error = CASES[case]
    with pytest.raises(error) as err:
        registry.resolve("no_such_entry")
    message = str(err.value)
    assert "\n" not in message and "no_such_entry" in message
    if registry is not TEMPLATES:  # a template name that is not registered is read as a file path
        assert "unknown" in message
    assert all(name in message for name in registry.names())


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_dotted_path_to_user_code(case):
    registry, _, plugin, error = CASES[case]
    if plugin is None:
        with pytest.raises(error):
            registry.resolve(f"{PLUGINS}:build_nothing")
        return
    assert registry.resolve(f"{PLUGINS}:{plugin}") is getattr(registry_plugins, plugin)
    assert registry.resolve(f"{PLUGINS}.{plugin}") is getattr(registry_plugins, plugin)
    with pytest.raises(error, match="cannot import"):
        registry.resolve(f"{PLUGINS}:no_such_function")
    with pytest.raises(error, match="not callable"):
        registry.resolve(f"{PLUGINS}:NOT_CALLABLE")


def test_a_config_key_starts_the_error_and_validation_stops_a_bad_path():
    with pytest.raises(ValueError, match=r"^algorithm.adv_type: unknown 'gpro'; choose one of gae, grpo"):
        ADVANTAGE_ESTIMATORS.resolve("gpro", key="algorithm.adv_type")
    with pytest.raises(ValueError, match="^rollout.rollout_backend: sglang is not available in this build"):
        ROLLOUT_ENGINES.resolve("sglang", key="rollout.rollout_backend")
    from rlinf_search.config.model import AlgorithmSection
    from rlinf_search.config.training import policy_loss

    # a name a registry resolves is resolved as the loss's view is built from its section
    section = AlgorithmSection(kl_penalty_type=f"{PLUGINS}:no_such_estimator")
    with pytest.raises(ConfigError, match="^algorithm.kl_penalty_type: cannot import KL penalty"):
        policy_loss(section, max_response_tokens=8, temperature=1.0)
    section = AlgorithmSection(kl_penalty_type=f"{PLUGINS}:constant_kl")
    assert policy_loss(section, max_response_tokens=8, temperature=1.0).kl_penalty_type == f"{PLUGINS}:constant_kl"


def test_a_lazy_builtin_is_imported_when_first_resolved():
    from rlinf_search.registry import Lazy

    registry: Registry = Registry("thing")
    registry.register("later", Lazy(f"{PLUGINS}:build_nothing"))
    assert registry.resolve("later") is registry_plugins.build_nothing


def test_a_trainer_class_by_dotted_path_is_a_training_backend_saying_what_it_needs():
    from rlinf_search.workers.actor.backends import training_backend

    assert training_backend("fsdp") is TRAINING_BACKENDS["fsdp"]
    backend = training_backend(f"{PLUGINS}:NeedsGpuTrainer")
    assert backend == TrainingBackend(trainer=f"{PLUGINS}:NeedsGpuTrainer", needs_cuda=True, requires=("no_such_mod",),
                                      install_hint="pip install no-such-mod")
    assert training_backend(f"{PLUGINS}:build_nothing").needs_cuda is False
    with pytest.raises(ValueError, match="^actor.training_backend: cannot import training backend"):
        training_backend(f"{PLUGINS}:NoSuchTrainer")
