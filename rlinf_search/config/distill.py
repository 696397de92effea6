"""``algorithm.distill``: on-policy distillation settings, read once at start-up (``DistillConfig``)."""

from __future__ import annotations

from rlinf_search.config.model import DistillSection
from rlinf_search.config.schema import ConfigError
from rlinf_search.distill.config import DistillConfig
from rlinf_search.section_model import parse_section


def distill_config(section: DistillSection, *, temperature: float) -> DistillConfig | None:
    """The distillation settings when ``algorithm.distill.enable`` is true, else None (any other
    ``algorithm.distill`` key is then an error: it would do nothing)."""
    if not section.enable:
        stray = sorted(key for key in section.model_fields_set if key != "enable")
        if stray:
            raise ConfigError(f"algorithm.distill.{stray[0]}: read only with algorithm.distill.enable: true")
        return None
    if temperature != 1.0:
        raise ConfigError(f"algorithm.distill: needs algorithm.sampling_params.temperature 1.0 (got {temperature:g}): "
                          "vLLM's echoed prompt log-probs are of the unscaled distribution whatever temperature a "
                          "request asks for, so teacher and student log-probs would be of different distributions")
    for key in ("top_k_coef", "top_k_divergence"):
        if key in section.model_fields_set and not section.top_k:
            raise ConfigError(f"algorithm.distill.{key}: read only with algorithm.distill.top_k > 0")
    # enable is read above and top_k_divergence by the loss (PolicyLossConfig); the rest is DistillConfig's.
    settings = section.model_dump(exclude={"enable", "top_k_divergence", "teacher"})
    try:
        return parse_section(DistillConfig, {**settings, "teacher": section.teacher or {}, "temperature": temperature},
                             path="algorithm.distill")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
