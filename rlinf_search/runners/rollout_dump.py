"""Sample trajectories written to files a person can read (verl's ``rollout_data_dir`` idea).

``runner.rollout_dump: N`` writes N trajectories of every training step to
``OUTPUT/rollouts/step_K.jsonl`` and every trajectory a validation scored to
``OUTPUT/rollouts/val_step_K.jsonl``. One JSON object per line: the prompt, the response cut into the
model's spans and the observations, the queries, the reward, EM and why the rollout ended.
``LOG_PATH/batches.jsonl`` is the audit trail of every step: its prompt uids and a digest of each
sampled response.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlinf_search.data.io_struct import QARecord, RewardScore, Trajectory

ROLLOUTS_DIR = "rollouts"


@dataclass(frozen=True)
class DumpedTrajectory:
    """One line of a rollout file."""

    uid: str
    """The prompt's uid (the GRPO group)."""
    data_source: str
    """The prompt's data set."""
    question: str
    """The bare question."""
    prompt: list[dict] | str
    """The prompt as prepared (chat messages or templated text)."""
    golden_answers: list[str]
    """Accepted answers."""
    response: list[dict]
    """The response in order: ``{"kind": "model" | "information" | "correction", "text": ..., "version": ...}``;
    ``version``: the oldest policy version that sampled a model turn (null for observations); a model turn also
    has ``versions``, ``[[version, tokens], ...]`` in token order."""
    queries: list[str]
    """The search queries the model issued."""
    reward: float
    """The training reward (``reward.score``, scaled)."""
    em: float
    """Exact match of the last answer."""
    finish_reason: str
    """``answer``, ``eos``, ``max_turns``, ``max_response_tokens``, ``length`` or ``infra_error``."""
    num_turns: int
    """Generation calls."""
    advantage: float | None = None
    """The advantage its model tokens trained with (their mean: one value for GRPO); None: not trained (a
    validation trajectory)."""
    sample: int = 0
    """Its place in its prompt's group of samples."""


def dump_row(record: QARecord, traj: Trajectory, score: RewardScore, *, advantage: float | None = None,
             sample: int = 0, pieces: Callable[[list[int]], list[str]] | None = None) -> DumpedTrajectory:
    """``pieces``: each token id's text (the tokenizer's), so each span also lists its tokens (``tokens``)."""
    return DumpedTrajectory(
        uid=traj.uid, data_source=record.data_source, question=record.question, prompt=record.prompt,
        golden_answers=list(record.golden_answers), response=[_dumped_span(traj, s, pieces) for s in traj.spans],
        queries=list(traj.queries), reward=float(score.reward), em=float(score.em),
        finish_reason=traj.finish_reason, num_turns=traj.num_turns, advantage=advantage, sample=sample)


def _dumped_span(traj: Trajectory, span, pieces: Callable[[list[int]], list[str]] | None = None) -> dict:
    """A span as the dump writes it: kind, text and the oldest version; a model span whose tokens carry versions
    also gets ``versions``: [version, tokens] runs in order (two runs: the engines continued it across a swap);
    with ``pieces``, ``tokens``: each token's text, in order (the viewer colours them)."""
    row = {"kind": span.kind, "text": span.text, "version": span.weight_version}
    if pieces is not None:
        row["tokens"] = pieces(traj.response_ids[span.start: span.end])
    if span.kind == "model" and traj.token_versions:
        runs: list[list[int]] = []
        for version in traj.token_versions[span.start: span.end]:
            if runs and runs[-1][0] == version:
                runs[-1][1] += 1
            else:
                runs.append([version, 1])
        row["versions"] = runs
    return row


def spread(count: int, n: int) -> list[int]:
    """``n`` indices spread evenly over ``range(count)`` (every one when ``n >= count``): a step's
    trajectories come in groups of one prompt, and the first n would all be the same question."""
    if n >= count:
        return list(range(count))
    return [i * count // n for i in range(n)]


def write_dump(output_dir: str | Path, name: str, rows: list[DumpedTrajectory]) -> Path:
    """Write ``rows`` to ``OUTPUT/rollouts/{name}.jsonl`` (replacing a file a resumed run wrote before)."""
    folder = Path(output_dir) / ROLLOUTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.jsonl"
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row.__dict__, ensure_ascii=False) + "\n" for row in rows)
    tmp.replace(path)
    return path


def append_batch_audit(log_path: str | Path, step: int, records: list[QARecord],
                       trajectories: list[Trajectory], *, dropped: list[str] = ()) -> None:
    """Append the uids of the prompts the step trained and a digest of each trajectory's response ids to
    ``batches.jsonl``: the data order and what was sampled (a resumed run can be checked against an
    uninterrupted one). ``dropped``: uids of the groups left out for an infrastructure failure
    (``dropped_infra``, written when there are any)."""
    path = Path(log_path) / "batches.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    digests = [hashlib.sha256(json.dumps(t.response_ids).encode()).hexdigest()[:16] for t in trajectories]
    row = {"step": step, "uids": [r.uid for r in records], "responses": digests}
    if dropped:
        row["dropped_infra"] = list(dropped)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")


def append_minibatch_audit(log_path: str | Path, step: int, minibatches: list[list[int]]) -> None:
    """A streamed step's mini-batches (the prompt indices of each, in training order) to ``minibatches.jsonl``:
    which groups trained together, and that each was trained once."""
    path = Path(log_path) / "minibatches.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"step": step, "minibatches": minibatches}) + "\n")
