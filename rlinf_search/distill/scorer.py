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
from rlinf_search.distill.alignment import AlignedLogprobs, char_extents, from_shared_ids, from_text_offsets
from rlinf_search.distill.config import DistillConfig
from rlinf_search.distill.signal import combine, distill_term, reverse_kl
from rlinf_search.distill.teacher import TeacherClient, TeacherFailed, TopK

log = logging.getLogger(__name__)


class TeacherDown(RuntimeError):
    """Too many trajectories got no teacher signal: the run stops rather than train on GRPO alone."""


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
            else:
                prompt = self._teacher_prompt(record)
                response = self.student.decode(trajectory.response_ids)
                answer = await self._client.score(prompt + response)
                aligned = from_text_offsets(answer.logprobs, answer.offsets, text_length=len(prompt + response),
                                            response_start=len(prompt),
                                            extents=char_extents(self.student.decode, trajectory.response_ids),
                                            response_mask=trajectory.response_mask)
        except TeacherFailed as exc:
            return None, loop.time() - started, str(exc)
        return aligned, loop.time() - started, None

    def _teacher_prompt(self, record: QARecord) -> str:
        """The prompt as the teacher's chat template renders it (text prompts are sent as they are)."""
        if isinstance(record.prompt, str):
            return record.prompt
        return self.teacher_tokenizer.apply_chat_template(record.prompt, add_generation_prompt=True, tokenize=False)

    def apply(self, batch: RolloutBatch, scoring: TeacherScoring) -> dict[str, float]:
        """Add the term to ``batch.advantages`` (or replace them, ``mode: only``); return the metrics."""
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
        self._check_failures(len(failures), len(answers), failures[:1])
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
                "distill/failed_trajectories": float(len(failures)),
                "distill/teacher_latency_s": sum(latencies) / len(latencies)}

    def _check_failures(self, failed: int, total: int, examples: list[str]) -> None:
        if failed:
            log.warning("teacher: %d of %d trajectories got no signal this step; e.g. %s", failed, total, examples[0])
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
    when ``teacher.tokenizer`` names one)."""
    from transformers import AutoTokenizer

    student = AutoTokenizer.from_pretrained(student_model)
    teacher = AutoTokenizer.from_pretrained(config.teacher.tokenizer) if config.teacher.tokenizer else None
    return TeacherScorer(config, student_tokenizer=student, teacher_tokenizer=teacher)
