"""A study: named arms (each a list of Hydra overrides) compared over seeds, with the published finding it is held
against.

A study is a YAML file; the ones this package ships (``rlinf_search/ablation/studies``) are the Search-R1 learning
plan's comparisons and are named by their file's stem (``rlinf-search ablate masking``)::

    title: Observation masking on vs off
    paper: >-
      Search-R1 (7B, PPO): 0.431 average EM with retrieved tokens masked out of the loss, 0.343 without.
    expect: {better: masked, worse: unmasked}     # the paper's direction on held-out EM (optional)
    indexes: [minilm]                             # retrievers the arms need beside the base's BM25 (optional)
    arms:
      masked: []
      unmasked: [algorithm.mask_observations=false]

``{base}`` in an override is replaced by the base folder (a finished demo's output), so an arm can point at the
base's data or indexes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rlinf_search.config.schema import ConfigError

STUDY_DIR = Path(__file__).resolve().parent / "studies"
"""The shipped studies (the Search-R1 learning plan's)."""
_ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Expectation:
    """The published finding's direction on held-out EM: arm ``better`` above arm ``worse``."""

    better: str
    """The arm the paper found better."""
    worse: str
    """The arm it found worse."""


@dataclass(frozen=True)
class Study:
    """Arms compared over seeds from one warm start."""

    name: str
    """The file's stem: the study's folder name and the name ``ablate`` takes."""
    title: str
    """One line for the table and the plot."""
    arms: dict[str, tuple[str, ...]]
    """Arm name -> its Hydra overrides (applied after the base's), in the file's order; the first is the reference
    the others are compared with."""
    paper: str = ""
    """The published finding this study is held against, with its source."""
    expect: Expectation | None = None
    """The finding's direction on held-out EM, where the paper states one."""
    indexes: tuple[str, ...] = ()
    """Retrievers (``build_index --retriever`` names) the arms search besides BM25, built into the base's index
    folder before the first cell when missing."""
    source: Path = field(default=Path(), compare=False)
    """The file it was read from."""

    def arm_overrides(self, arm: str, base: Path) -> list[str]:
        """``arm``'s overrides with ``{base}`` filled in."""
        return [item.replace("{base}", str(base)) for item in self.arms[arm]]


def study_names() -> list[str]:
    """The shipped studies' names."""
    return sorted(p.stem for p in STUDY_DIR.glob("*.yaml"))


def load_study(name_or_path: str) -> Study:
    """A shipped study by name, or a study file by path; a malformed one is a one-line ``ConfigError``."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = STUDY_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ConfigError(f"study {name_or_path!r}: not a YAML file and not a shipped study "
                              f"({', '.join(study_names())})")
    elif not path.is_file():
        raise ConfigError(f"study {name_or_path}: no such file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"study {path}: not YAML ({str(exc).splitlines()[0]})") from None
    return parse_study(raw, name=path.stem, source=path.resolve())


def parse_study(raw, *, name: str, source: Path = Path()) -> Study:
    """The study in ``raw`` (a YAML mapping), every problem a one-line ``ConfigError`` naming the key."""
    where = f"study {name}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with title and arms")
    unknown = sorted(set(raw) - {"title", "paper", "expect", "indexes", "arms"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; a study has title, paper, expect, "
                          "indexes and arms")
    arms = raw.get("arms")
    if not isinstance(arms, dict) or len(arms) < 2:
        raise ConfigError(f"{where}: arms must map at least two arm names to lists of overrides (key=value)")
    parsed = {}
    for arm, overrides in arms.items():
        arm = str(arm)
        if not _ARM_NAME.match(arm):
            raise ConfigError(f"{where}: arm name {arm!r}: use letters, digits, '_', '.' and '-' (it names a folder)")
        overrides = overrides or []
        if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
            raise ConfigError(f"{where}: arms.{arm} must be a list of key=value overrides, got {overrides!r}")
        parsed[arm] = tuple(overrides)
    expect = raw.get("expect")
    if expect is not None:
        if not isinstance(expect, dict) or set(expect) != {"better", "worse"}:
            raise ConfigError(f"{where}: expect must be {{better: ARM, worse: ARM}}, got {expect!r}")
        missing = [a for a in expect.values() if a not in parsed]
        if missing:
            raise ConfigError(f"{where}: expect names arm(s) {', '.join(map(str, missing))} not in arms "
                              f"({', '.join(parsed)})")
        expect = Expectation(better=expect["better"], worse=expect["worse"])
    indexes = raw.get("indexes") or []
    if not isinstance(indexes, list) or not all(isinstance(i, str) for i in indexes):
        raise ConfigError(f"{where}: indexes must be a list of retriever names, got {indexes!r}")
    return Study(name=name, title=str(raw.get("title") or name), arms=parsed, paper=str(raw.get("paper") or ""),
                 expect=expect, indexes=tuple(indexes), source=source)


def select_arms(study: Study, arms: list[str] | None) -> list[str]:
    """``arms`` (all of the study's when None or empty), each checked to be one of its arms."""
    if not arms:
        return list(study.arms)
    unknown = [a for a in arms if a not in study.arms]
    if unknown:
        raise ConfigError(f"study {study.name}: no arm(s) {', '.join(unknown)}; it has {', '.join(study.arms)}")
    return arms
