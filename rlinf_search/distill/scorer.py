"""``TeacherScorer``: the driver's side of distillation. It sends each step's trajectories to the teacher
while the step goes on (rewards, log-probs), then turns the answers into the advantage term.

Requests run on one background event loop, so they overlap the worker groups' calls. A trajectory
the teacher fails on trains without the signal; when more than ``max_failed_fraction`` of the
trajectories of the last ``failure_window_steps`` steps got none, the run stops with one line.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from concurrent.futures import Future

import torch

from rlinf_search.data.batch import RolloutBatch
from rlinf_search.data.io_struct import QARecord, Trajectory
from rlinf_search.distill.alignment import (AlignedLogprobs, char_extents, from_shared_ids, from_teacher_tokens,
                                            teacher_per_token)
from rlinf_search.distill.config import DistillConfig
from rlinf_search.distill.signal import combine, distill_term, reverse_kl
from rlinf_search.distill.teacher import TeacherClient, TeacherFailed, TopK

log = logging.getLogger(__name__)

# Metrics that count things in a batch: a streamed step's are the sum over its mini-batches, not the mean.
_COUNTS = ("distill/unaligned_tokens", "distill/failed_trajectories")


class TeacherDown(RuntimeError):
    """Too many trajectories got no teacher signal: the run stops rather than train on GRPO alone."""


class TeacherVocabularyMismatch(ValueError):
    """``teacher.tokenizer: null`` but the teacher's tokenizer is not the student's."""


# Words, digits, accents, CJK and an emoji: two different vocabularies almost never agree on all of it.
VOCABULARY_PROBE = "Paris, 1889: Zoë's café — 東京 🗼 <answer>yes</answer>"


class TeacherScoring:
    """One step's requests in flight; ``result()`` waits for them."""

    def __init__(self, futures: list[Future]):
        self._futures = futures

    def result(self) -> list[tuple[AlignedLogprobs | None, float, str | None]]:
        """Per trajectory: (aligned log-probs or None, latency in s, failure line or None)."""
        return [future.result() for future in self._futures]


class TeacherScorer:
    """Owns the teacher client, its event loop thread, and the failure window."""

    def __init__(self, config: DistillConfig, *, student_tokenizer, teacher_tokenizer=None):
        # httpx logs every request at INFO, and the driver's log is at INFO: one line per trajectory per
        # step would bury the step lines. Failures are reported here, once per step.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        self.config = config
        self.student = student_tokenizer
        self.teacher_tokenizer = teacher_tokenizer
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="teacher-client", daemon=True)
        self._thread.start()
        self._client = asyncio.run_coroutine_threadsafe(self._make_client(), self._loop).result()
        self._window: deque[tuple[int, int]] = deque(maxlen=config.failure_window_steps)
        self._step_counts = (0, 0)  # (failed, total) of the step's mini-batches so far (a streamed step)

    async def _make_client(self) -> TeacherClient:
        return TeacherClient(self.config.teacher, temperature=self.config.temperature)

    def start(self, records: list[QARecord], trajectories: list[Trajectory]) -> TeacherScoring:
        """Send every trajectory to the teacher now; the answers are read by ``apply``."""
        by_uid = {record.uid: record for record in records}
        return TeacherScoring([asyncio.run_coroutine_threadsafe(self._score(by_uid[t.uid], t), self._loop)
                               for t in trajectories])

    async def _score(self, record: QARecord, trajectory: Trajectory) -> tuple[AlignedLogprobs | None, float, str | None]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            if self.teacher_tokenizer is None:  # same vocabulary: score the sampled ids as they are
                answer = await self._client.score(list(trajectory.prompt_ids) + list(trajectory.response_ids),
                                                  top_k=self.config.top_k)
                aligned = from_shared_ids(answer.logprobs, prompt_length=len(trajectory.prompt_ids),
                                          response_mask=trajectory.response_mask, top=answer.top)
            else:  # the teacher's own tokens of the same text, aligned on the cuts both tokenizations share
                prompt = self._teacher_prompt_ids(record)
                ids = list(trajectory.response_ids)
                text = self._student_text(ids)
                encoded = self.teacher_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
                answer = await self._client.score(prompt + list(encoded["input_ids"]))
                aligned = from_teacher_tokens(answer.logprobs[len(prompt):], list(encoded["offset_mapping"]),
                                              extents=char_extents(self._student_text, ids),
                                              response_mask=trajectory.response_mask)
        except TeacherFailed as exc:
            return None, loop.time() - started, str(exc)
        return aligned, loop.time() - started, None

    def _student_text(self, ids: list[int]) -> str:
        """The student's tokens as text, its special and control tokens left out (the teacher's chat template
        has its own; a student's ``<|im_end|>`` in the text would be read as the teacher's, or as words)."""
        return self.student.decode(ids, skip_special_tokens=True)

    def _teacher_prompt_ids(self, record: QARecord) -> list[int]:
        """The prompt as the teacher's tokenizer and chat template give it (a text prompt as its tokens)."""
        if isinstance(record.prompt, str):
            return list(self.teacher_tokenizer(record.prompt, add_special_tokens=False)["input_ids"])
        text = self.teacher_tokenizer.apply_chat_template(record.prompt, add_generation_prompt=True, tokenize=False)
        return list(self.teacher_tokenizer(text, add_special_tokens=False)["input_ids"])

    def check_shared_vocabulary(self) -> None:
        """Raise ``TeacherVocabularyMismatch`` when the teacher tokenizes ``VOCABULARY_PROBE`` into other ids than
        the student's tokenizer (set to share it, it would score wrong tokens); a teacher that does not answer
        yet is left to the failure window (a warning here)."""
        future = asyncio.run_coroutine_threadsafe(self._client.token_ids(VOCABULARY_PROBE), self._loop)
        try:
            theirs = future.result()
        except TeacherFailed as exc:
            log.warning("teacher: could not check its vocabulary at start-up (%s)", exc)
            return
        ours = list(self.student(VOCABULARY_PROBE, add_special_tokens=False)["input_ids"])
        if theirs[-len(ours):] != ours or len(theirs) > len(ours) + 1:  # a text prompt may get the teacher's BOS
            raise TeacherVocabularyMismatch(
                "algorithm.distill.teacher.tokenizer is null (shared with the student), but the teacher tokenizes "
                f"a probe text into other ids ({len(theirs)} tokens, {theirs[:6]}... against the student's "
                f"{len(ours)}, {ours[:6]}...); set teacher.tokenizer to the teacher's tokenizer")

    def apply(self, batch: RolloutBatch, scoring: TeacherScoring, *, ends_step: bool = True) -> dict[str, float]:
        """Add the term to ``batch.advantages`` (or replace them, ``mode: only``); return the metrics.
        ``ends_step`` false: ``batch`` is one of several mini-batches of a streamed step; its failures count
        toward the step's, which enter the failure window with the step's last mini-batch."""
        answers = scoring.result()
        shape = tuple(batch.response_mask.shape)
        teacher = torch.zeros(shape)
        scored = torch.zeros(shape, dtype=torch.bool)
        failures = [message for _, _, message in answers if message is not None]
        for row, (aligned, _, _) in enumerate(answers):
            if aligned is not None:
                width = len(aligned.values)
                teacher[row, :width] = torch.tensor(aligned.values)
                scored[row, :width] = torch.tensor(aligned.scored)
        self._check_failures(len(failures), len(answers), failures[:1], ends_step=ends_step)
        if any(aligned is not None and aligned.segment is not None for aligned, _, _ in answers):
            # Pieces of several student tokens (different tokenizers) share their KL once the student's are known.
            segment = torch.arange(shape[1]).repeat(shape[0], 1)  # each token its own piece, unless told otherwise
            for row, (aligned, _, _) in enumerate(answers):
                if aligned is not None and aligned.segment is not None:
                    segment[row, : len(aligned.segment)] = torch.tensor(aligned.segment)
            teacher = teacher_per_token(teacher, scored, segment, batch.old_logprobs.float())
        kl = reverse_kl(batch.old_logprobs.float(), teacher, scored)
        term = distill_term(kl, scored, batch.response_mask, self.config)
        batch.advantages = combine(batch.advantages, term, batch.response_mask, self.config)
        if self.config.top_k:
            batch.teacher_top_ids, batch.teacher_top_logprobs = top_k_tensors(
                [aligned.top if aligned is not None else None for aligned, _, _ in answers], shape, self.config.top_k)
            batch.teacher_top_weight = torch.where(scored, self.config.top_k_coef, 0.0)
        model_tokens = int(batch.response_mask.sum())
        count = max(int(scored.sum()), 1)
        latencies = [latency for _, latency, _ in answers]
        return {"distill/teacher_logprob_mean": float(teacher[scored].sum()) / count,
                "distill/reverse_kl": float(kl[scored].sum()) / count,
                "distill/scored_token_fraction": int(scored.sum()) / max(model_tokens, 1),
                "distill/unaligned_tokens": float(sum(a.unaligned for a, _, _ in answers if a is not None)),
                # Different tokenizers: scored tokens whose piece is not one token against one (a split character,
                # or the teacher's tokenizer cutting the text otherwise); their KL compares two tokenizations.
                "distill/retokenized_fraction": sum(a.retokenized for a, _, _ in answers if a is not None) / count,
                "distill/failed_trajectories": float(len(failures)),
                "distill/teacher_latency_s": sum(latencies) / len(latencies)}

    @staticmethod
    def merge_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
        """One step's metrics from its mini-batches' (a streamed step): counts add up, the rest are means."""
        keys = dict.fromkeys(key for part in parts for key in part)
        return {key: sum(part[key] for part in parts) / (1 if key in _COUNTS else len(parts)) for key in keys}

    def _check_failures(self, failed: int, total: int, examples: list[str], *, ends_step: bool) -> None:
        if failed:
            log.warning("teacher: %d of %d trajectories got no signal; e.g. %s", failed, total, examples[0])
        self._step_counts = (self._step_counts[0] + failed, self._step_counts[1] + total)
        if not ends_step:
            return
        (failed, total), self._step_counts = self._step_counts, (0, 0)
        self._window.append((failed, total))
        failed_sum, total_sum = sum(f for f, _ in self._window), sum(t for _, t in self._window)
        window_full = len(self._window) == self._window.maxlen
        if window_full and failed_sum > self.config.max_failed_fraction * total_sum:
            raise TeacherDown(f"algorithm.distill: the teacher gave no signal for {failed_sum} of {total_sum} "
                              f"trajectories over the last {len(self._window)} steps (more than max_failed_fraction "
                              f"{self.config.max_failed_fraction:g}); last error: {examples[0] if examples else '-'}")

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def top_k_tensors(tops: list[TopK | None], shape: tuple[int, int], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, T, k]`` ids and log-probs of the teacher's most likely tokens per response token, one copy per
    trajectory. A position with fewer than ``k`` (or none: not scored, or a trajectory the teacher failed
    on) is padded with id 0 at log-prob -inf, which weighs nothing."""
    ids = torch.zeros((*shape, k), dtype=torch.long)
    logprobs = torch.full((*shape, k), float("-inf"))
    for row, top in enumerate(tops):
        if top is not None:
            ids[row, : len(top)], logprobs[row, : len(top)] = top.ids, top.logprobs
    return ids, logprobs


def open_teacher(config: DistillConfig, *, student_model: str) -> TeacherScorer:
    """The scorer for a run whose policy starts from ``student_model`` (its tokenizer, and the teacher's
    when ``teacher.tokenizer`` names one). With ``teacher.tokenizer: null`` the teacher is asked how it
    tokenizes a probe text: another vocabulary stops the run here, in one line."""
    from transformers import AutoTokenizer

    student = AutoTokenizer.from_pretrained(student_model)
    teacher = AutoTokenizer.from_pretrained(config.teacher.tokenizer) if config.teacher.tokenizer else None
    if teacher is not None and not teacher.is_fast:
        raise ValueError(f"algorithm.distill.teacher.tokenizer {config.teacher.tokenizer!r} has no fast (Rust) "
                         "tokenizer: aligning two tokenizers needs its character offsets")
    scorer = TeacherScorer(config, student_tokenizer=student, teacher_tokenizer=teacher)
    if teacher is None:
        try:
            scorer.check_shared_vocabulary()
        except BaseException:
            scorer.close()
            raise
    return scorer
