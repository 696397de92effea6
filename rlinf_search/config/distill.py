"""``algorithm.distill``: on-policy distillation settings, read once at start-up (``DistillConfig``)."""

from __future__ import annotations

from rlinf_search.config.readers import get, get_bool, get_section
from rlinf_search.config.schema import ConfigError
from rlinf_search.distill.config import DistillConfig
from rlinf_search.section_model import parse_section

# ``algorithm.distill.enable``: a run distils only when asked to.
DISTILL_BY_DEFAULT = False


def distill_config(raw: dict, *, temperature: float) -> DistillConfig | None:
    """The distillation settings when ``algorithm.distill.enable`` is true, else None (any other
    ``algorithm.distill`` key is then an error: it would do nothing)."""
    section = get(raw, "algorithm.distill", {})
    if not get_bool(raw, "algorithm.distill.enable", DISTILL_BY_DEFAULT):
        stray = sorted(key for key, value in section.items() if key != "enable" and value is not None)
        if stray:
            raise ConfigError(f"algorithm.distill.{stray[0]}: read only with algorithm.distill.enable: true")
        return None
    if temperature != 1.0:
        raise ConfigError(f"algorithm.distill: needs algorithm.sampling_params.temperature 1.0 (got {temperature:g}): "
                          "vLLM's echoed prompt log-probs are of the unscaled distribution whatever temperature a "
                          "request asks for, so teacher and student log-probs would be of different distributions")
    for key in ("top_k_coef", "top_k_divergence"):
        if get(raw, f"algorithm.distill.{key}") is not None and not get(raw, "algorithm.distill.top_k",
                                                                        DistillConfig.model_fields["top_k"].default):
            raise ConfigError(f"algorithm.distill.{key}: read only with algorithm.distill.top_k > 0")
    teacher = get(raw, "algorithm.distill.teacher", {})
    if not isinstance(teacher, dict):
        raise ConfigError(f"algorithm.distill.teacher: expected a section of keys, got {type(teacher).__name__}")
    # enable is read above and top_k_divergence by the loss (PolicyLossConfig); the rest is DistillConfig's.
    settings = {key: value for key, value in get_section(raw, "algorithm.distill").items()
                if key not in ("enable", "top_k_divergence")}
    try:
        return parse_section(DistillConfig, {**settings, "teacher": teacher, "temperature": temperature},
                             path="algorithm.distill")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
