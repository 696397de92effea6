"""Score a checkpoint: greedy Search-R1 rollouts over eval data, EM / sub-EM / F1 per data source.

    python -m rlinf_search.runners.eval_runner --model RUN/checkpoints/global_step_N/hf_model --data test.jsonl \\
        --server-addr 127.0.0.1:8000 --out eval_dir

Works on any Hugging Face causal LM directory (a converted checkpoint, the tiny default, Qwen2.5). The retrieval
and protocol settings are the training run's (``runners/eval_settings.py``), so the model is scored as it was
trained.
Writes ``eval_results.json`` (the scores and every trajectory) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlinf_search.agents import AGENT_PROTOCOLS, build_agent_loop
from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.searchr1.metrics import rollout_metrics
from rlinf_search.agents.toolcall.loop import TemplateWithoutTools
from rlinf_search.config.schema import ConfigError
from rlinf_search.data.io_struct import QARecord, SamplingParams, Trajectory
from rlinf_search.data.prepare import load_records
from rlinf_search.rewards import compute_score, last_answer
from rlinf_search.runners.eval_settings import EvalOverrides, check_model_dir, eval_settings
from rlinf_search.runners.infra_failures import RunStopped, refuse_infra_failures
from rlinf_search.tools.search import SearchToolConfig, build_search_tool
from rlinf_search.workers.rollout.hf_engine import HFEngineConfig, HFGenerationEngine

EVAL_SCORES = ("em", "subem", "f1")


@dataclass
class EvalReport:
    """Scores per data source and overall, and every scored trajectory."""

    overall: dict[str, float]
    """Mean of each score (and searches per trajectory) over all questions."""
    per_source: dict[str, dict[str, float]]
    """The same means per data source, with ``n``."""
    trajectories: list[dict] = field(default_factory=list)
    """uid, source, question, golds, response text, extracted answer, scores, searches."""


def score_trajectories(records: list[QARecord], trajectories: list[Trajectory],
                       rewards: list[float] | None = None) -> EvalReport:
    """Score every trajectory with em, subem and f1 (and report ``rewards``, the training reward, when
    given: one per trajectory), and aggregate per data source."""
    rows = []
    for i, (record, traj) in enumerate(zip(records, trajectories)):
        scores = {name: compute_score(name, traj.graded_text, record.golden_answers) for name in EVAL_SCORES}
        if rewards is not None:
            scores["reward"] = rewards[i]
        rows.append({"uid": record.uid, "data_source": record.data_source, "question": record.question,
                     "golden_answers": record.golden_answers, "answer": last_answer(traj.graded_text),
                     "response": traj.response_text, "num_searches": traj.num_searches,
                     "finish_reason": traj.finish_reason, **scores})

    def summary(selected: list[dict]) -> dict[str, float]:
        n = len(selected)
        means = {name: sum(r[name] for r in selected) / n for name in (*EVAL_SCORES, "reward") if name in selected[0]}
        return {"n": n, **means, "searches": sum(r["num_searches"] for r in selected) / n}

    sources = sorted({r["data_source"] for r in rows})
    return EvalReport(overall=summary(rows),
                      per_source={s: summary([r for r in rows if r["data_source"] == s]) for s in sources},
                      trajectories=rows)


def format_table(report: EvalReport) -> str:
    lines = [f"{'data source':<24}{'n':>6}{'EM':>8}{'sub-EM':>8}{'F1':>8}{'searches':>10}"]
    for name, s in [*report.per_source.items(), ("overall", report.overall)]:
        lines.append(f"{name:<24}{s['n']:>6}{s['em']:>8.3f}{s['subem']:>8.3f}{s['f1']:>8.3f}{s['searches']:>10.2f}")
    return "\n".join(lines)


async def rollouts(model_path: str, records: list[QARecord], tool_config: SearchToolConfig,
                   loop_config: AgentLoopConfig, *, seed: int | None = None) -> list[Trajectory]:
    """One rollout of every record by a checkpoint on the HF engine, against the search tool, sampling
    as ``loop_config`` says (``seed``: trajectory i's turns sample with seeds derived from it)."""
    engine = HFGenerationEngine(HFEngineConfig(model_path))
    tool = build_search_tool(tool_config)
    loop = None
    try:
        loop = build_agent_loop(engine, tool, engine.tokenizer, loop_config)
        return await loop.run_batch(records, seed=seed)
    finally:
        if loop is not None:
            await loop.aclose()
        await tool.aclose()
        await engine.aclose()


async def evaluate(model_path: str, records: list[QARecord], tool_config: SearchToolConfig,
                   loop_config: AgentLoopConfig) -> tuple[EvalReport, dict[str, float]]:
    """Greedy rollouts of every record against the search tool; (report, rollout metrics)."""
    trajectories = await rollouts(model_path, records, tool_config, loop_config)
    refuse_infra_failures(trajectories, what="eval")
    return score_trajectories(records, trajectories), rollout_metrics(trajectories)


def write_report(report: EvalReport, out_dir: Path, *, model_path: str, settings: dict | None = None) -> Path:
    """``eval_results.json``: the model, the settings it was rolled out with (where given) and the report."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "eval_results.json"
    path.write_text(json.dumps({"model": model_path, **({"settings": settings} if settings else {}),
                                **asdict(report)}, indent=1))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlinf_search.runners.eval_runner",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="Hugging Face model directory (RUN/checkpoints/global_step_N/"
                        "hf_model for a training run's checkpoint)")
    parser.add_argument("--data", required=True, help="prepared jsonl (python -m rlinf_search.data.prepare)")
    parser.add_argument("--server-addr", default="127.0.0.1:8000", help="retrieval server host:port")
    parser.add_argument("--out", required=True, help="folder for eval_results.json")
    parser.add_argument("--max-samples", type=int, default=None)
    trained = parser.add_argument_group(
        "settings the model was trained with", "read from the training run's config.yaml (found from --model); a "
        "flag given here wins and says so when it differs; without a training config, the defaults shown")
    trained.add_argument("--protocol", default=None, help="agent.protocol: searchr1 (tags) or toolcall (function "
                         f"calling with the built-in search schema); default {AgentLoopConfig.protocol}")
    trained.add_argument("--max-turns", type=int, default=None, help=f"default {AgentLoopConfig.max_turns}")
    trained.add_argument("--topk", type=int, default=None,
                         help=f"passages per search; default {SearchToolConfig.model_fields['topk'].default}")
    trained.add_argument("--max-new-tokens", type=int, default=None,
                         help=f"most tokens per turn; default {SamplingParams.max_new_tokens}")
    args = parser.parse_args(argv)
    overrides = EvalOverrides(topk=args.topk, protocol=args.protocol, max_turns=args.max_turns,
                              max_new_tokens=args.max_new_tokens)
    try:
        model_dir = check_model_dir(args.model)
        records = load_records(args.data)[: args.max_samples]
        if args.protocol is not None:
            AGENT_PROTOCOLS.resolve(args.protocol, key="--protocol")
        settings = eval_settings(model_dir, args.server_addr, overrides)
    except (FileNotFoundError, ValueError, ConfigError) as exc:
        print(f"eval: {exc}", file=sys.stderr)
        return 1
    loop = settings.loop
    print(f"eval settings ({settings.source or 'no training config found beside the model: defaults'}): topk "
          f"{loop.topk}, protocol {loop.protocol}, max_turns {loop.max_turns}, max_new_tokens {loop.max_tokens_per_turn}")
    for note in settings.notes:
        print(f"eval: {note}", file=sys.stderr)
    try:
        report, _ = asyncio.run(evaluate(str(model_dir), records, settings.search, loop))
    except (TemplateWithoutTools, RunStopped) as exc:
        print(f"eval: {exc}", file=sys.stderr)
        return 1
    print(format_table(report))
    used = {"source": str(settings.source) if settings.source else None, "topk": loop.topk, "protocol": loop.protocol,
            "max_turns": loop.max_turns, "max_new_tokens": loop.max_tokens_per_turn}
    print(f"wrote {write_report(report, Path(args.out), model_path=args.model, settings=used)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
