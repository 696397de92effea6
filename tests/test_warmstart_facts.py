"""The warm start's view by kind of fact: answer copy per kind, the draw that favours the kinds not yet copied, the
facts plot that reads the report lines, and the skill goal's floor per kind."""

from __future__ import annotations

import argparse
import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from toolkits.sft_training import SFTConfig, SFTStage, train_sft


def test_answer_copy_by_fact_counts_only_retrieved_answers():
    """Per kind: copied among questions whose gold answer was in the passages; a kind with none retrieved is
    absent rather than zero."""
    from toolkits.warmstart_probes import TrajectoryScores, answer_copy_by_fact

    def score(copied: bool) -> TrajectoryScores:
        return TrajectoryScores(answer_copied=copied, query_logprob=0.0, query_copied=True, search_chance=0.5)

    scores = [score(True), score(False), score(True), score(True), score(False)]
    found = [True, True, True, False, False]
    facts = ["born_in", "born_in", "country", "employer", "country"]
    assert answer_copy_by_fact(scores, found, facts) == {"born_in": 0.5, "country": 1.0}
    with pytest.raises(ValueError):
        answer_copy_by_fact(scores, found[:4], facts)


def test_fact_weights_favour_the_kinds_not_yet_copied():
    """Each kind's share of the draw is its floor plus what is not copied yet; a kind without a reading counts as
    not copied; all copied is the uniform draw."""
    from toolkits.sft_training import fact_weights
    from toolkits.warmstart_probes import ProbeReading

    facts = ("born_in", "born_in", "employer", "country", "country", "country")
    reading = ProbeReading(query_copy=1.0, answer_copy=0.5, search_mean=0.5, search_greedy=0.5,
                           answer_copy_by_fact={"born_in": 1.0, "employer": 0.0})
    weights = fact_weights(facts, reading)
    share = {fact: sum(w for w, f in zip(weights, facts) if f == fact) / sum(weights) for fact in set(facts)}
    assert share == pytest.approx({"born_in": 0.1 / 2.3, "employer": 1.1 / 2.3, "country": 1.1 / 2.3})
    everything = dataclasses.replace(reading, answer_copy_by_fact={"born_in": 1.0, "employer": 1.0, "country": 1.0})
    counts = Counter(facts)
    assert [w * counts[f] for w, f in zip(fact_weights(facts, everything), facts)] == pytest.approx([0.1] * 6)
    with pytest.raises(ValueError, match="has 2 facts for 3 trajectories"):
        train_sft(None, None, [SFTStage("skill", [None] * 3, 3, facts=("a", "b"))], SFTConfig())


def test_the_facts_plot_reads_the_lines_the_warm_start_prints():
    """examples/searchr1/warmstart_facts_plot.py parses the skill stage's report lines, as train_sft writes them
    from a ProbeReading; lines of other stages are skipped."""
    import importlib.util

    from toolkits.warmstart_probes import ProbeReading

    path = Path(__file__).resolve().parents[1] / "examples" / "searchr1" / "warmstart_facts_plot.py"
    spec = importlib.util.spec_from_file_location("warmstart_facts_plot", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readings = module.readings

    def line(stage: str, step: int, query: float, facts: dict[str, float]) -> str:
        reading = ProbeReading(query_copy=query, answer_copy=0.5, search_mean=0.2, search_greedy=0.0,
                               answer_copy_by_fact=facts)
        return f"sft {stage} step {step}: {reading}"

    log = "\n".join([line("reading", 300, 0.0, {"born_in": 0.1}),
                     line("skill", 50, 0.25, {"employer": 0.0, "born_in": 0.75}),
                     line("skill", 100, 0.5, {"employer": 1.0, "born_in": 1.0}) + " (goal met)"])
    assert readings(log) == ([50, 100], [0.25, 0.5], {"born_in": [0.75, 1.0], "employer": [0.0, 1.0]})


def test_the_fact_copy_floor_holds_back_a_mean_that_hides_one_kind():
    """With ``--fact-copy-floor`` the skill goal needs every kind of fact copied, not only the mean: toolcall seed
    2 met the mean with profession at 0.66 and then failed the mix stage's floor. Without it, the mean alone."""
    from toolkits.sft_warmstart import goals
    from toolkits.warmstart_probes import ProbeReading

    def args(floor: float) -> argparse.Namespace:
        return argparse.Namespace(val_data="val.jsonl", query_copy_goal=0.85, answer_copy_goal=0.9,
                                  fact_copy_floor=floor, search_band=(0.1, 0.4), max_greedy_search=0.05,
                                  mix_answer_copy_floor=0.8)

    seed2 = ProbeReading(query_copy=0.94, answer_copy=0.90, search_mean=0.0, search_greedy=0.0,
                         answer_copy_by_fact={"born_in": 1.0, "country": 1.0, "employer": 0.89, "profession": 0.66})
    assert seed2.least_fact_copy == 0.66
    assert goals(args(0.0))[0].met(seed2)
    skill = goals(args(0.85))[0]
    assert not skill.met(seed2) and "least fact copy >= 0.85" in str(skill)
    caught_up = dataclasses.replace(seed2, answer_copy_by_fact={**seed2.answer_copy_by_fact, "profession": 0.86})
    assert skill.met(caught_up)
    unknown_kinds = dataclasses.replace(seed2, answer_copy_by_fact={})
    assert unknown_kinds.least_fact_copy == seed2.answer_copy, "without kinds the floor reads the mean"
