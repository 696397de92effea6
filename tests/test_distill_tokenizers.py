"""Distillation across tokenizers: the teacher's own tokens aligned on the cuts both tokenizations share,
on a hand-made case with exact values, then two really different BPEs end to end through
``python -m rlinf_search.serve`` on text with accents, CJK and emoji."""

from __future__ import annotations

import math

import pytest
import torch

from rlinf_search.data.io_struct import QARecord, Trajectory
from rlinf_search.distill.alignment import from_teacher_tokens, teacher_per_token
from rlinf_search.distill.config import DistillConfig, TeacherConfig
from rlinf_search.distill.scorer import TeacherScorer, TeacherVocabularyMismatch
from tests.test_distill_alignment import MIXED_TEXT
from tests.test_teacher_server import teacher  # noqa: F401 (fixture)


def test_pieces_between_shared_cuts_on_a_hand_made_case():
    # Response text "abcdé!" (é is 2 bytes). Student tokens: "ab" | "c" | "d" | é's first byte | é's second
    # byte | "!" | a special token (decodes to nothing). Teacher tokens: "a" | "bc" | "dé" | "!".
    extents = [(0, 2), (2, 3), (3, 4), None, (4, 5), (5, 6), (6, 6)]
    spans = [(0, 1), (1, 3), (3, 5), (5, 6)]
    logprobs = [-1.0, -2.0, -4.0, -0.5]
    aligned = from_teacher_tokens(logprobs, spans, extents=extents, response_mask=[1] * 7)
    # Shared cuts: 0, 3, 5, 6. Pieces: "abc" = (ab, c) | (a, bc); "dé" = (d, byte, byte) | (dé); "!" alone.
    assert aligned.scored == [True, True, True, True, True, True, False]
    assert aligned.values == [-3.0, -3.0, -4.0, -4.0, -4.0, -0.5, 0.0]
    assert aligned.segment == [0, 0, 1, 1, 1, 2, -1]
    assert aligned.unaligned == 1  # the special token: never scored
    assert aligned.retokenized == 5  # "abc" (2 against 2) and "dé" (3 against 1); "!" is one against one
    # Once the student's log-probs are known, a piece's KL is shared equally by its tokens.
    student = torch.tensor([[-1.0, -1.0, -2.0, -0.5, -0.5, -0.7, -0.1]])
    per_token = teacher_per_token(torch.tensor([aligned.values]), torch.tensor([aligned.scored]),
                                  torch.tensor([aligned.segment]), student)
    kl = (student - per_token)[0, :6]
    # "abc": student -2, teacher -3 -> KL 1, 0.5 each; "dé": -3 vs -4 -> 1/3 each; "!": -0.7 vs -0.5.
    torch.testing.assert_close(kl, torch.tensor([0.5, 0.5, 1 / 3, 1 / 3, 1 / 3, -0.2]), atol=1e-6, rtol=0)
    # An observation token inside a piece leaves the piece unscored; a piece only starts on a shared cut.
    masked = from_teacher_tokens(logprobs, spans, extents=extents, response_mask=[1, 0, 1, 1, 1, 1, 0])
    assert masked.scored == [False, False, True, True, True, True, False] and masked.unaligned == 1
    missing = from_teacher_tokens([-1.0, None, -4.0, -0.5], spans, extents=extents, response_mask=[1] * 7)
    assert missing.scored[:2] == [False, False] and missing.unaligned == 3


def _other_bpe(folder):
    """A byte-level BPE of 320 tokens trained here on other text, with its own special token: a vocabulary
    and merges unlike the tiny model's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = ["The quick brown fox jumps over the lazy dog.", "Zoë and Łódź, São Paulo, 東京, café", MIXED_TEXT,
              "answers are short; search when unsure"] * 20
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|end|>")
    fast.save_pretrained(folder)
    return fast


def _scorer(address: str, student, teacher_tokenizer) -> TeacherScorer:
    config = DistillConfig(teacher=TeacherConfig(base_url=f"http://{address}/v1", model="teacher", deadline_s=20.0,
                                                 tokenizer="teacher" if teacher_tokenizer is not None else None))
    return TeacherScorer(config, student_tokenizer=student, teacher_tokenizer=teacher_tokenizer)


def _teacher_logprobs(model, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return [math.nan] + torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def _score_one(scorer: TeacherScorer, prompt: str, response_ids: list[int], mask: list[int]):
    record = QARecord(uid="q", prompt=prompt, golden_answers=["x"], data_source="t")
    trajectory = Trajectory(uid="q", prompt_ids=[], response_ids=response_ids, response_mask=mask,
                            rollout_logprobs=[0.0] * len(response_ids))
    [(aligned, _, failure)] = scorer.start([record], [trajectory]).result()
    assert failure is None, failure
    return aligned


def test_two_different_bpes_align_through_the_server_with_exact_values(teacher, tiny_model_dir, tmp_path):  # noqa: F811
    """The student's BPE (320 tokens, trained here) against the tiny model's, both byte-level, on a response
    with accents, CJK, emoji, an observation and the student's end token. Every scored piece holds exactly the
    teacher's log-probs of its own tokens of that piece (checked against the model run here); the end token
    and the observation are never scored."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    student = _other_bpe(tmp_path / "student")
    teacher_tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = "Question: where is the café?\n"
    parts = [(" " + MIXED_TEXT, 1), ("<information>Łódź 東京</information>", 0), (" Ok, 🗼 done.", 1)]
    response_ids, mask = [], []
    for text, masked in parts:
        ids = student(text, add_special_tokens=False)["input_ids"]
        response_ids += ids
        mask += [masked] * len(ids)
    response_ids.append(student.eos_token_id)
    mask.append(1)
    assert len(set(response_ids) & set(teacher_tokenizer(MIXED_TEXT)["input_ids"])) < len(response_ids)
    scorer = _scorer(teacher, student, teacher_tokenizer)
    try:
        aligned = _score_one(scorer, prompt, response_ids, mask)
    finally:
        scorer.close()
    text = student.decode(response_ids, skip_special_tokens=True)
    prompt_ids = teacher_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    encoded = teacher_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    reference = _teacher_logprobs(model, prompt_ids + encoded["input_ids"])[len(prompt_ids):]
    assert not aligned.scored[-1]  # the student's end token decodes to nothing: the teacher never saw it
    assert not any(s for s, m in zip(aligned.scored, mask) if not m)
    scored = sum(aligned.scored)
    assert scored > 0.5 * sum(mask) and aligned.unaligned == sum(mask) - scored
    assert aligned.segment is not None and len(set(aligned.segment) - {-1}) < scored  # some pieces span tokens
    # Each piece's value: the sum of the teacher's log-probs of its own tokens that lie inside the piece.
    from rlinf_search.distill.alignment import char_extents

    extents = char_extents(lambda ids: student.decode(ids, skip_special_tokens=True), response_ids)
    pieces: dict[int, list[int]] = {}
    for index, piece in enumerate(aligned.segment):
        if piece >= 0:
            pieces.setdefault(piece, []).append(index)
    for members in pieces.values():
        begin = next(e[0] for e in (extents[m] for m in members) if e is not None)
        end = extents[members[-1]][1]
        inside = [value for (a, b), value in zip(encoded["offset_mapping"], reference) if a >= begin and b <= end]
        assert inside, (begin, end)
        for m in members:
            assert aligned.values[m] == pytest.approx(sum(inside), abs=2e-4)


@pytest.mark.parametrize("text", [" The answer is <answer>Paris</answer>.", " Zoë Saldaña vit à Besançon, près de Genève."],
                         ids=["ascii", "accents"])
def test_the_student_as_its_own_teacher_through_the_different_tokenizer_path_gives_zero_kl(teacher, tiny_model_dir,  # noqa: F811
                                                                                      text):
    """The tiny model's own tokenizer named as the teacher's: the path that re-tokenizes the text. On its
    canonical tokens the KL per scored token is 0 (below 1e-3): the old path gave 4.6 per token here."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = "Question: who lives there?\n"
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    scorer = _scorer(teacher, tokenizer, tokenizer)
    try:
        aligned = _score_one(scorer, prompt, response_ids, [1] * len(response_ids))
    finally:
        scorer.close()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    student = torch.tensor([_teacher_logprobs(model, prompt_ids + response_ids)[len(prompt_ids):]])
    segment = torch.tensor([aligned.segment]) if aligned.segment else torch.arange(len(response_ids))[None]
    per_token = teacher_per_token(torch.tensor([aligned.values]), torch.tensor([aligned.scored]), segment, student)
    scored = torch.tensor([aligned.scored])
    assert bool(scored.all())
    assert float((student - per_token)[scored].abs().max()) < 1e-3


def test_a_teacher_with_another_vocabulary_set_to_share_the_students_stops_at_start_up(teacher, tiny_model_dir,  # noqa: F811
                                                                                      tmp_path):
    from transformers import AutoTokenizer

    shared = _scorer(teacher, AutoTokenizer.from_pretrained(tiny_model_dir), None)
    try:
        shared.check_shared_vocabulary()  # the same tokenizer: passes
    finally:
        shared.close()
    other = _scorer(teacher, _other_bpe(tmp_path / "student"), None)
    try:
        with pytest.raises(TeacherVocabularyMismatch, match="set teacher.tokenizer to the teacher's tokenizer"):
            other.check_shared_vocabulary()
    finally:
        other.close()
