"""Warm-start scripts (behaviour shares, two-hop turns, plausible guesses) and the demo's helper CLIs."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from collections import Counter

import pytest

from rlinf_search.data.io_struct import Trajectory
from rlinf_search.data.prepare import prepare
from rlinf_search.retrieval.launch import (
    RetrievalServerProcess,
    ServerStartError,
    wait_for_address_file,
)
from toolkits.sft_scripts import BehaviourMix, SyntheticScripts, question_kind
from toolkits.sft_training import (
    GoalNotReached,
    SFTConfig,
    SFTStage,
    sft_batch,
    train_sft,
)
from toolkits.sft_warmstart import search_probabilities
from toolkits.synth_task import SynthSpec, write_task
from toolkits.warmstart_probes import (
    Bound,
    ProbeSet,
    StageGoal,
    decision_position,
    first_turn,
    last_turn,
    score_trajectories,
)


@pytest.fixture(scope="module")
def synth_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    paths = write_task(out, SynthSpec(people=300, seed=3))
    return prepare([paths["train"]], "flashrag", data_sources="synth", template="brief")


def _behaviour(turns: list[str], record) -> str:
    if len(turns) == 1:
        return "guess"
    return "search" if turns[0] == f"<search> {record.extra['subject']} </search>" else "bad_query"


def test_behaviour_shares_follow_the_mix(synth_records):
    scripts = SyntheticScripts(synth_records, BehaviourMix(search=0.3, bad_query=0.1))
    rng = random.Random(0)
    counts = Counter(_behaviour(scripts(record, rng), record) for record in synth_records * 10)
    total = sum(counts.values())
    assert abs(counts["search"] / total - 0.3) < 0.03
    assert abs(counts["bad_query"] / total - 0.1) < 0.03
    assert abs(counts["guess"] / total - 0.6) < 0.03


def test_good_search_copies_the_gold_and_hops_through_the_bridge(synth_records):
    scripts = SyntheticScripts(synth_records, BehaviourMix())
    two_hop = next(r for r in synth_records if r.extra.get("hops") == 2)
    assert scripts.good_search(two_hop) == [
        f"<search> {two_hop.extra['subject']} </search>", f"<search> {two_hop.extra['bridge']} </search>",
        f"<answer> {two_hop.golden_answers[0]} </answer>"]
    one_hop = next(r for r in synth_records if r.extra.get("hops") == 1)
    assert len(scripts.good_search(one_hop)) == 2


def test_guesses_are_answers_of_the_same_kind(synth_records):
    scripts = SyntheticScripts(synth_records, BehaviourMix(search=0.0, bad_query=0.0))
    rng = random.Random(1)
    for record in synth_records[:50]:
        guess = scripts(record, rng)[0].removeprefix("<answer> ").removesuffix(" </answer>")
        assert guess in scripts.answers_by_kind[question_kind(record)]


def test_bad_inputs_get_clear_errors(synth_records, tmp_path):
    with pytest.raises(ValueError, match="sum to <= 1"):
        BehaviourMix(search=0.8, bad_query=0.3)
    plain = dataclasses.replace(synth_records[0], extra={})
    with pytest.raises(ValueError, match="no extra.subject"):
        question_kind(plain)
    with pytest.raises(ValueError, match="stage 'skill' has no trajectories"):
        train_sft(None, None, [SFTStage("skill", [], 3)], SFTConfig())


def test_wait_for_address_file_finds_a_real_server(hotpot_index_dir, hotpot_corpus, tmp_path):
    with RetrievalServerProcess(["--index-dir", str(hotpot_index_dir), "--corpus", str(hotpot_corpus),
                                 "--retriever", "bm25"]) as server:
        server_file = tmp_path / "addr"
        server_file.write_text(server.address)
        assert wait_for_address_file(server_file, timeout_s=10) == server.address
    with pytest.raises(ServerStartError, match="no healthy retrieval server"):
        wait_for_address_file(tmp_path / "never-written", timeout_s=0.5)
    done = subprocess.run([sys.executable, "-m", "rlinf_search.retrieval.launch", "--wait-for",
                           str(tmp_path / "never-written"), "--timeout", "0.3"], capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "launch: no healthy" in done.stderr


def test_demo_summary_writes_the_comparison(tmp_path):
    for name, em in (("before", 0.05), ("after", 0.4)):
        (tmp_path / name).mkdir()
        scores = {"n": 10, "em": em, "subem": em, "f1": em, "searches": em * 2}
        (tmp_path / name / "eval_results.json").write_text(json.dumps({"overall": scores}))
    done = subprocess.run([sys.executable, "examples/searchr1/demo_summary.py", "--before",
                           str(tmp_path / "before/eval_results.json"), "--after", str(tmp_path / "after/eval_results.json"),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "held-out EM: warm-start 0.050 -> after RL 0.400"
    summary = json.loads((tmp_path / "out/eval_results.json").read_text())
    assert summary["gain"]["em"] == pytest.approx(0.35)
    assert (tmp_path / "out/eval_comparison.png").stat().st_size > 0


def _scripted(record, tokenizer, prompts, *, search: bool) -> Trajectory:
    """A trajectory as the agent loop writes one: model turns trained on, the observation not."""
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)
    if search:
        parts = [(encode(f"<search> {record.extra['subject']} </search>"), 1),
                 (encode(f"\n\n<information>Doc 1: {record.extra['subject']} ...</information>\n\n"), 0),
                 (encode(f"<answer> {record.golden_answers[0]} </answer>"), 1)]
    else:
        parts = [(encode("<answer> Paris </answer>"), 1)]
    ids = [i for part, _ in parts for i in part]
    mask = [m for part, m in parts for _ in part]
    return Trajectory(uid=record.uid, prompt_ids=prompts.ids(record), response_ids=ids, response_mask=mask,
                      rollout_logprobs=[0.0] * len(ids))


def test_only_the_mix_stage_decides_how_often_to_search(synth_records, tiny_model_dir):
    """Good searches alone (decision token left out) then a 40 % search mix: the warm-started model's
    chance of searching first is the mix's share, well under one half, so greedy decoding guesses on
    every prompt and sampling still searches often (what RL needs to have something to teach)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlinf_search.data.prompt_tokens import PromptTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompts = PromptTokenizer(tokenizer)
    train, probe = synth_records[:200], synth_records[200:260]
    position = decision_position(tokenizer)
    good = [_scripted(r, tokenizer, prompts, search=True) for r in train]
    ids, _, labels = sft_batch(good[:2], tokenizer.pad_token_id, untrained_position=position)
    first = len(good[0].prompt_ids) + position
    assert labels[0, first] == -100 and labels[0, first + 1] == ids[0, first + 1], "only the decision is left out"
    rng = random.Random(0)
    mixed = [_scripted(r, tokenizer, prompts, search=rng.random() < 0.4) for r in train]
    stages = [SFTStage("skill", good, 60, trains_decision=False), SFTStage("mix", mixed, 60)]
    train_sft(model, tokenizer, stages, SFTConfig(batch_size=16, warmup_steps=5, lr=3e-3))
    chances = search_probabilities(model, tokenizer, probe)
    mean = sum(chances) / len(chances)
    assert 0.25 < mean < 0.55 and max(chances) < 0.65, (mean, max(chances))
    assert sum(c > 0.5 for c in chances) <= len(chances) // 10, "greedy guesses on (nearly) every prompt"


def test_the_corpus_stage_trains_on_passages_alone(synth_records, tiny_model_dir):
    """``--corpus-steps``: language modelling on the observations, never on a model turn (the distillation
    benchmark's student reads the corpus but must not learn the task from its warm start)."""
    import torch
    from transformers import AutoTokenizer

    from rlinf_search.data.prompt_tokens import PromptTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    traj = _scripted(synth_records[0], tokenizer, PromptTokenizer(tokenizer), search=True)
    start, end = len(traj.prompt_ids), len(traj.prompt_ids) + len(traj.response_ids)
    mask = torch.tensor(traj.response_mask, dtype=torch.bool)
    _, _, corpus = sft_batch([traj], tokenizer.pad_token_id, train_on_observations=True, trains_model_turns=False)
    _, _, reading = sft_batch([traj], tokenizer.pad_token_id, train_on_observations=True)
    _, _, skill = sft_batch([traj], tokenizer.pad_token_id)
    trained = lambda labels: (labels[0, start:end] != -100)
    assert trained(corpus).tolist() == (~mask).tolist() and bool(trained(corpus).any())
    assert trained(reading).all() and trained(skill).tolist() == mask.tolist()
    assert (corpus[0, :start] == -100).all(), "the prompt is never trained on"


def test_the_comprehension_stage_trains_on_the_answer_turn_alone(synth_records, tiny_model_dir):
    """``--comprehension-steps``: the last model turn (the answer after the passages) is trained; the query turn,
    the passages and the prompt are not, so the student can copy a fact in front of it without being shown a
    query (the distillation benchmark's student)."""
    import torch
    from transformers import AutoTokenizer

    from rlinf_search.data.prompt_tokens import PromptTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    traj = _scripted(synth_records[0], tokenizer, PromptTokenizer(tokenizer), search=True)
    start = len(traj.prompt_ids)
    _, _, labels = sft_batch([traj], tokenizer.pad_token_id, trains_queries=False)
    trained = labels[0, start:start + len(traj.response_ids)] != -100
    answer_at = max(i for i, m in enumerate(traj.response_mask) if m == 0) + 1
    assert trained.tolist() == [i >= answer_at for i in range(len(traj.response_ids))]
    assert "<answer>" in tokenizer.decode(torch.tensor(traj.response_ids)[trained])
    assert "<search>" not in tokenizer.decode(torch.tensor(traj.response_ids)[trained])
    assert (labels[0, :start] == -100).all()
    assert last_turn([1, 1, 0, 0, 1, 1, 1]).tolist() == [False, False, False, False, True, True, True]
    assert last_turn([1, 1]).tolist() == [True, True]


def probe(model, trajectory):
    """The batched scorer on one trajectory."""
    from transformers import AutoTokenizer

    return score_trajectories(model, [trajectory], AutoTokenizer.from_pretrained(model.name_or_path))[0]


def test_answer_copy_probe_scores_the_answer_turn_teacher_forced(synth_records, tiny_model_dir):
    """``toolkits.answer_copy_probe``: copied iff every answer-turn token is the argmax after what precedes it. The
    answer here is the model's own greedy continuation (copied); one changed token makes it not copied."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlinf_search.data.prompt_tokens import PromptTokenizer
    from toolkits.warmstart_probes import gold_in_passages

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    record = synth_records[0]
    traj = _scripted(record, tokenizer, PromptTokenizer(tokenizer), search=True)
    answer_at = max(i for i, m in enumerate(traj.response_mask) if m == 0) + 1
    ids = traj.prompt_ids + traj.response_ids[:answer_at]
    for _ in range(4):  # the model's own greedy answer turn
        ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    greedy = ids[len(traj.prompt_ids):]
    own = dataclasses.replace(traj, response_ids=greedy, response_mask=traj.response_mask[:answer_at] + [1] * 4,
                              rollout_logprobs=[0.0] * len(greedy))
    assert probe(model, own).answer_copied
    changed = dataclasses.replace(own, response_ids=greedy[:-1] + [(greedy[-1] + 1) % len(tokenizer)])
    assert not probe(model, changed).answer_copied
    assert not gold_in_passages(traj, record, tokenizer), "the scripted passage does not hold the answer"
    holds = dataclasses.replace(record, golden_answers=[record.extra["subject"]])
    assert gold_in_passages(traj, holds, tokenizer)


def test_answer_copy_probe_scores_the_first_query_after_its_search_tag(synth_records, tiny_model_dir):
    """The query score skips the first turn's first token (the decision to search) and stops at the first
    observation: the model's own greedy query is copied and its log-prob is the hand sum; one changed token is not."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlinf_search.data.prompt_tokens import PromptTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    traj = _scripted(synth_records[0], tokenizer, PromptTokenizer(tokenizer), search=True)
    turn_end = traj.response_mask.index(0)
    ids = traj.prompt_ids + traj.response_ids[:1]
    hand = 0.0
    for _ in range(turn_end - 1):  # the model's own greedy query, as long as the scripted one
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), dim=-1)
        ids.append(int(logprobs.argmax()))
        hand += float(logprobs[ids[-1]])
    own_turn = ids[len(traj.prompt_ids):]
    own = dataclasses.replace(traj, response_ids=own_turn + traj.response_ids[turn_end:],
                              rollout_logprobs=[0.0] * len(traj.response_ids))
    scores = probe(model, own)
    assert scores.query_copied and scores.query_logprob == pytest.approx(hand, abs=1e-4)
    changed_turn = own_turn[:-1] + [(own_turn[-1] + 1) % len(tokenizer)]
    changed = dataclasses.replace(own, response_ids=changed_turn + traj.response_ids[turn_end:])
    assert not probe(model, changed).query_copied
    assert first_turn([1, 1, 0, 0, 1]).tolist() == [True, True, False, False, False]
    assert first_turn([1, 1]).tolist() == [True, True]


def test_probes_read_the_same_in_batches_as_one_at_a_time(synth_records, tiny_model_dir):
    """Right padding changes nothing a causal model reads: batched scores equal single-row ones, and the probes'
    first-turn chance of searching is the one ``search_probabilities`` computes from the prompt alone."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlinf_search.data.prompt_tokens import PromptTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    records = synth_records[:12]
    prompts = PromptTokenizer(tokenizer)
    trajectories = [_scripted(r, tokenizer, prompts, search=True) for r in records]
    assert len({len(t.prompt_ids) + len(t.response_ids) for t in trajectories}) > 1, "rows of several lengths"
    batched = score_trajectories(model, trajectories, tokenizer, batch_size=5, pad_id=tokenizer.pad_token_id)
    alone = [score_trajectories(model, [t], tokenizer)[0] for t in trajectories]
    for a, b in zip(batched, alone):
        assert (a.answer_copied, a.query_copied) == (b.answer_copied, b.query_copied)
        assert a.query_logprob == pytest.approx(b.query_logprob, abs=1e-3)
        assert a.search_chance == pytest.approx(b.search_chance, abs=1e-4)
    chances = search_probabilities(model, tokenizer, records)
    assert [s.search_chance for s in batched] == pytest.approx(chances, abs=1e-4)
    reading = ProbeSet(records, trajectories, tokenizer).read(model)
    assert reading.search_mean == pytest.approx(sum(chances) / len(chances), abs=1e-4)
    assert reading.answer_copy == 0.0, "no scripted passage holds the answer, so none counts"


def test_a_stage_with_a_goal_stops_when_it_holds_and_fails_at_its_cap(synth_records, tiny_model_dir):
    """A goal met at the first reading ends the stage there; one never met stops the warm start at the stage's
    step cap with one line naming the stage, its goal and the last reading."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlinf_search.data.prompt_tokens import PromptTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompts = PromptTokenizer(tokenizer)
    good = [_scripted(r, tokenizer, prompts, search=True) for r in synth_records[:64]]
    probes = ProbeSet(synth_records[64:80], [_scripted(r, tokenizer, prompts, search=True)
                                             for r in synth_records[64:80]], tokenizer)
    lines: list[str] = []
    easy = StageGoal((Bound("search_mean", ">=", 0.0),))
    log = train_sft(model, tokenizer, [SFTStage("skill", good, 40, goal=easy, check_every=4), SFTStage("mix", good, 3)],
                    SFTConfig(batch_size=4, warmup_steps=2), probes, report=lines.append)
    assert [(st.name, st.steps) for st in log.stages] == [("skill", 4), ("mix", 3)]
    assert len(log.losses) == 7 and lines[0].startswith("sft skill step 4: query copy") and "(goal met)" in lines[0]
    assert len(log.stages[1].readings) == 1, "a stage without a goal is read at its end too"
    never = StageGoal((Bound("query_copy", ">=", 1.5),))
    with pytest.raises(GoalNotReached, match=r"stage 'skill' did not reach its goal \(query copy >= 1.5\) in 6 steps"):
        train_sft(model, tokenizer, [SFTStage("skill", good, 6, goal=never, check_every=4)],
                  SFTConfig(batch_size=4), probes, report=lines.append)
    assert lines[-2].startswith("sft skill step 4") and lines[-1].startswith("sft skill step 6")
    with pytest.raises(ValueError, match="unknown probe 'copy'"):
        Bound("copy", ">=", 1)
    with pytest.raises(ValueError, match="has a goal but no probes"):
        train_sft(model, tokenizer, [SFTStage("skill", good, 6, goal=never)], SFTConfig())


def test_sft_loss_is_the_models_own_loss(synth_records, tiny_model_dir):
    """The LM head run on labelled positions alone gives the loss the model computes over every position."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlinf_search.data.prompt_tokens import PromptTokenizer
    from toolkits.sft_training import sft_loss

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompts = PromptTokenizer(tokenizer)
    rows = [_scripted(r, tokenizer, prompts, search=i % 2 == 0) for i, r in enumerate(synth_records[:6])]
    ids, attention, labels = sft_batch(rows, tokenizer.pad_token_id)
    with torch.no_grad():
        ours = sft_loss(model, ids, attention, labels)
        theirs = model(input_ids=ids, attention_mask=attention, labels=labels).loss
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5)


def test_induction_sequences_repeat_passage_tokens_and_train_the_second_copy(synth_records, tiny_model_dir):
    """The induction stage's rows: passage tokens (never a model-turn token), written twice, the second copy the only
    trained part; the same seed gives the same rows."""
    from transformers import AutoTokenizer

    from rlinf_search.data.prompt_tokens import PromptTokenizer
    from toolkits.sft_training import induction_sequences

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = PromptTokenizer(tokenizer)
    good = [_scripted(r, tokenizer, prompts, search=True) for r in synth_records[:20]]
    passage_tokens = {tok for t in good for tok, m in zip(t.response_ids, t.response_mask) if not m}
    rows = induction_sequences(good, 30, seed=4, min_length=8, max_length=12)
    assert [r.response_ids for r in rows] == [r.response_ids for r in induction_sequences(good, 30, seed=4,
                                                                                           min_length=8, max_length=12)]
    for row in rows:
        assert row.prompt_ids == row.response_ids and 8 <= len(row.response_ids) <= 12
        assert set(row.response_ids) <= passage_tokens and row.response_mask == [1] * len(row.response_ids)
    ids, _, labels = sft_batch(rows[:2], tokenizer.pad_token_id)
    n = len(rows[0].prompt_ids)
    assert (labels[0, :n] == -100).all() and labels[0, n: 2 * n].tolist() == rows[0].response_ids
    with pytest.raises(ValueError, match="observation tokens"):
        induction_sequences([rows[0]], 3)


def test_every_generated_question_names_its_kind_of_fact(synth_records):
    """The probes sort answer copy by kind of fact from the question text alone: every generated question
    maps to one of the four kinds, the two-hop ones to the country, and nothing else does."""
    from toolkits.synth_task import QUESTIONS, question_fact

    facts = Counter(question_fact(r.question) for r in synth_records)
    assert set(facts) == set(QUESTIONS), facts
    assert all((question_fact(r.question) == "country") == (r.extra["hops"] == 2) for r in synth_records)
    assert question_fact("Who founded Osmadel?") == "other"


def test_a_guess_trains_the_choice_to_answer_not_the_wrong_fact(synth_records, tiny_model_dir):
    """``--no-train-guessed-facts``: a trajectory whose answer is not the gold (a scripted guess) keeps the tokens up
    to the decision in the loss and loses the guessed fact; a good search keeps its whole answer. The guesses are
    found by exact match against each record's gold."""
    import torch
    from transformers import AutoTokenizer

    from rlinf_search.data.prompt_tokens import PromptTokenizer
    from toolkits.sft_warmstart import wrong_answers

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = PromptTokenizer(tokenizer)
    records = synth_records[:2]
    good, guess = (_scripted(records[0], tokenizer, prompts, search=True),
                   _scripted(records[1], tokenizer, prompts, search=False))
    for trajectory in (good, guess):
        trajectory.response_text = tokenizer.decode(trajectory.response_ids)
    assert records[1].golden_answers[0] != "Paris"
    assert wrong_answers([good, guess], records) == frozenset({1})
    assert wrong_answers([guess, good], records) == frozenset({0}), "found by uid, not by order"
    position = decision_position(tokenizer)
    _, _, whole = sft_batch([good, guess], tokenizer.pad_token_id)
    ids, _, labels = sft_batch([good, guess], tokenizer.pad_token_id, decision_only=[False, True], decision=position)
    assert torch.equal(labels[0], whole[0]), "a good search's answer is trained whole"
    start = len(guess.prompt_ids)
    trained = (labels[1] != -100).nonzero().flatten().tolist()
    assert trained == list(range(start, start + position + 1)), "the guess: its opening up to the decision only"
    assert (whole[1] != -100).sum() > len(trained)
