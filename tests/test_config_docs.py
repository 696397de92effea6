"""docs/config.md documents exactly the keys the code accepts: a new key without a row fails, and so
does a row for a key the code no longer takes.

A config-key row is a row of a table whose header starts with ``| key |``; its first cell is the full
dotted key in backticks, and it sits under the ``## `section` `` heading of its top-level section.
"""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import OmegaConf

from rlinf_search.agents.tools.access import AccessSettings
from rlinf_search.config import DEPRECATED_KEYS, REMOVED_KEYS, SCHEMA
from rlinf_search.distill.config import TeacherConfig
from rlinf_search.scheduler.config import ClusterConfig
from rlinf_search.tools.search.config import SearchToolConfig

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "config.md"
TINY = ROOT / "examples" / "searchr1" / "config" / "tiny-cpu.yaml"


def _names(config) -> list[str]:
    return list(config.model_fields)


# SCHEMA leaves these open ("*"); the dataclasses that check each one name its keys. ``tools`` holds the search
# client's section and a section per other tool (``tools.<name>``: its two keys of every tool, then the settings
# of each registered tool).
OPEN_SECTIONS = {"cluster": _names(ClusterConfig),
                 "tools": [f"search.{name}" for name in _names(SearchToolConfig)] + ["<name>.enable", "<name>.class"]
                 + [f"access.{name}" for name in AccessSettings.model_fields],
                 "algorithm.distill.teacher": _names(TeacherConfig)}
# Open sections whose content belongs to another tool (Hydra) or to a plugin's own settings model, documented as
# one key.
PASSED_THROUGH = {"hydra", "algorithm.policy_loss_settings", "algorithm.adv_settings", "reward.score_settings",
                  "rollout.engine_settings", "agent.protocol_settings"}


def accepted_keys(schema: dict = SCHEMA, prefix: str = "") -> list[str]:
    """Every dotted key validate_cfg accepts, in SCHEMA order."""
    keys = []
    for name, sub in schema.items():
        path = f"{prefix}{name}"
        if path in OPEN_SECTIONS:
            keys += [f"{path}.{name}" for name in OPEN_SECTIONS[path]]
        elif isinstance(sub, dict):
            keys += accepted_keys(sub, f"{path}.")
        else:
            keys.append(path)
    return keys


def documented_rows() -> list[tuple[str | None, str]]:
    """(section heading, key) of every config-key table row, in document order."""
    rows, section, in_key_table = [], None, False
    for number, line in enumerate(DOC.read_text(encoding="utf-8").splitlines(), start=1):
        heading = re.match(r"^## `([\w.<>]+)`(:.*)?$", line)
        if heading:
            section = heading.group(1)
        if re.match(r"^\|\s*key\s*\|", line):
            in_key_table = True
            continue
        if not line.startswith("|"):
            in_key_table = False
            continue
        if not in_key_table or re.match(r"^\|[\s|:-]+$", line):
            continue
        cell = line.split("|")[1].strip()
        key = re.fullmatch(r"`([\w.<>]+)`", cell)
        assert key, f"docs/config.md:{number}: a key table row must start with a `dotted.key`, got {cell!r}"
        rows.append((section, key.group(1)))
    return rows


def test_schema_walk_covers_every_open_section():
    stale = [path for path in OPEN_SECTIONS if _schema_node(path) != "*"]
    assert not stale, f"OPEN_SECTIONS names sections SCHEMA now spells out: {stale}"
    unnamed = [path for path in accepted_keys() if _schema_node(path) == "*" and path not in PASSED_THROUGH]
    assert not unnamed, f"open sections in SCHEMA whose keys this test cannot list (add to OPEN_SECTIONS): {unnamed}"


def _schema_node(path: str):
    node = SCHEMA
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def test_every_accepted_key_has_a_row():
    documented = {key for _, key in documented_rows()}
    missing = [key for key in accepted_keys() if key not in documented]
    assert not missing, f"keys validate_cfg accepts with no row in docs/config.md: {missing}"


def test_every_row_is_an_accepted_key():
    accepted = set(accepted_keys())
    stale = [key for _, key in documented_rows() if key not in accepted]
    assert not stale, f"rows in docs/config.md for keys validate_cfg does not accept: {stale}"


def test_rows_are_unique_and_under_their_section():
    rows = documented_rows()
    keys = [key for _, key in rows]
    assert len(keys) == len(set(keys)), f"keys with two rows: {sorted({k for k in keys if keys.count(k) > 1})}"
    misplaced = [(section, key) for section, key in rows  # tools.<name> holds every tool's section
                 if section is None or not re.fullmatch(re.escape(section).replace("<name>", r"[\w<>]+") + r"(\..+)?",
                                                        key)]
    assert not misplaced, f"rows under another section's heading: {misplaced}"


def test_sections_follow_the_tiny_cpu_yaml():
    headings = re.findall(r"^## `([\w.]+)`\s*$", DOC.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert [h.split(".")[0] for h in headings] == list(OmegaConf.load(TINY).keys())


def test_deprecated_keys_are_documented():
    text = DOC.read_text(encoding="utf-8")
    for old, new in DEPRECATED_KEYS.items():
        assert re.search(rf"\|\s*`{re.escape(old)}`\s*\|\s*`{re.escape(new)}`\s*\|", text), \
            f"docs/config.md: no deprecated-keys row for {old} -> {new}"


def test_removed_keys_are_documented():
    text = DOC.read_text(encoding="utf-8")
    for old in REMOVED_KEYS:
        assert re.search(rf"\|\s*`{re.escape(old)}`\s*\|\s*nothing\s*\|", text), \
            f"docs/config.md: no deprecated-keys row for the removed key {old}"


def test_a_default_cell_that_states_another_value_is_rewritten_from_the_declaration():
    from toolkits.config_docs import DOC, rewritten

    text = DOC.read_text(encoding="utf-8")
    row = next(line for line in text.split("\n") if line.startswith("| `runner.max_steps` |"))
    stale = row.replace("| 100 |", "| 7 |", 1)
    assert stale != row
    fixed, changed = rewritten(text.replace(row, stale))
    assert changed == ["runner.max_steps"] and fixed == text


def test_the_type_and_default_cells_are_the_declarations():
    from toolkits.config_docs import DOC, rewritten

    _, differ = rewritten(DOC.read_text(encoding="utf-8"))
    assert not differ, f"cells of docs/config.md that differ from the declarations (python -m " \
                       f"toolkits.config_docs rewrites them): {differ}"
