"""Step time of the pipelines (lockstep, sync, overlap, stream, async) at the shape of RLinf's Search-R1 run,
with simulated service times, beside the ideal (the same GPU work perfectly packed).

    python benchmarks/pipeline.py [--devices 8] [--rollout-devices 2,3,4,5] [--prompts 512] [--group-size 5]
                                  [--max-turns 4] [--lockstep-turns 2,4] [--steps 3] [--seeds 0,1,2]
                                  [--modes lockstep,sync,overlap,stream,async] [--max-staleness 1,2,4]
                                  [--agent-loop-workers 0] [--set FIELD=VALUE ...]

Each mode is a real training run (``runners/train_main.train``: Ray worker groups, the Search-R1 agent
loops, the SearchTool group and its client, sharded reward ranks, the channel of finished groups, weight
sync) in which the engines, the trainer and the retriever sleep for what a Qwen2.5-3B run on H100s would
take (``benchmarks/pipeline_sim.py``: the throughput model and where its figures come from). ``--devices``
CPU slots stand for the GPUs; ``lockstep`` and ``sync`` put engines and actor on all of them (the engine steps
aside for training); ``overlap``, ``stream`` and ``async`` give each of ``--rollout-devices`` (a comma list: a
sweep) to the engines and the rest to the actor. ``lockstep`` is Search-R1's own loop: ``sync``'s placement,
a global barrier and one batched retrieval per turn, and its recipe's engine and trainer settings
(``benchmarks/pipeline_lockstep.py``: each with its source or marked an assumption). It runs as a range:
``--lockstep-turns`` (2 is Search-R1's ``train_grpo.sh``), each with generation stopped at the action tag and
without (Search-R1's loop decodes on and cuts the text), plus one row with the fitted 20 ms decode overhead,
shown apart. ``async`` runs once per ``--max-staleness``; every configuration once per ``--seeds``.

A weight sync costs what the real code makes it cost: the simulated trainer sends the modelled bucket count
(23), each engine loads each bucket in its modelled time before taking the next (so the sender waits), through
the real weight gate, which aborts the requests in flight (``async``) or waits for them; an aborted request
prefills its whole context again on the new weights, and every load resets the engines' prefix cache.

The table gives each configuration's mean step time after the first step over its seeds (and their standard
deviation), each group's idle share of those steps (from the busy intervals the simulated components log), the
trajectories' p99/median time and the mean staleness of the trained tokens; the ``ideal`` line is sync's GPU work
(every decode step counted as a share of a full batch, every actor pass) divided over the devices. ``--out`` gets
``results.json`` and ``timeline.png`` (one row per rank, busy vs idle, the first seed of each configuration).
A run that finished into the same ``--out`` with the same settings is reused (``<run>.summary.json``), so a
sweep that stopped goes on where it stopped; delete that file to run it again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from omegaconf import OmegaConf  # noqa: E402

from benchmarks.pipeline_lockstep import LOCKSTEP_FIT, LOCKSTEP_MODEL, LOCKSTEP_NO_STOP  # noqa: E402
from benchmarks.pipeline_report import GROUPS, lockstep_range, mean_over_seeds, plot_timeline, table  # noqa: E402
from benchmarks.pipeline_sim import SIM_BUCKET_BYTES  # noqa: E402
from benchmarks.service_model import SETTINGS_ENV, ServiceModel, Settings, write_settings  # noqa: E402
from toolkits.make_tiny_model import make_tiny_model  # noqa: E402
from toolkits.synth_task import SynthSpec, write_task  # noqa: E402

MODES = ("lockstep", "sync", "overlap", "stream", "async")
SPLIT_MODES = ("overlap", "stream", "async")
"""Modes on disjoint engine and actor devices: run once per ``--rollout-devices`` split."""
_TRAIN = ("import sys; from omegaconf import OmegaConf; from rlinf_search.config import validate_cfg; "
          "from rlinf_search.runners.train_main import train; train(validate_cfg(OmegaConf.load(sys.argv[1])))")
_SIM = "benchmarks.pipeline_sim"


def prepare(work: Path, prompts: int) -> dict[str, Path]:
    """Questions (the synthetic task; only their length matters here) and a tokenizer for the engines."""
    paths = write_task(work / "synth", SynthSpec(people=max(600, 2 * prompts), seed=0))
    subprocess.run([sys.executable, "-m", "rlinf_search.data.prepare", "--input", str(paths["train"]),
                    "--format", "flashrag", "--data-source", "synth", "--out", str(work / "train.prepared.jsonl")],
                   check=True, capture_output=True)
    return {"train": work / "train.prepared.jsonl", "model": make_tiny_model(work / "model", [paths["corpus"]])}


def placement(mode: str, devices: int, rollout_devices: int) -> dict[str, str]:
    # Two reward ranks on two slots past the GPUs' (CPU work on a real cluster): a reward rank on an engine's
    # device would make the placement hybrid, and overlap needs it disaggregated.
    reward = f"{devices}-{devices + 1}"
    if mode not in SPLIT_MODES:
        return {"actor,rollout": f"0-{devices - 1}", "reward": reward}
    return {"rollout": f"0-{rollout_devices - 1}", "actor": f"{rollout_devices}-{devices - 1}", "reward": reward}


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One configuration the benchmark runs (once per seed)."""

    mode: str
    """``lockstep``, ``sync``, ``overlap``, ``stream`` or ``async``."""
    name: str
    """Its row in the table (seeds are suffixed to the run folders)."""
    rollout_devices: int
    """Engines' devices (all of them in the shared modes)."""
    max_turns: int
    """``agentloop.max_turns``."""
    max_staleness: int = 1
    """``runner.max_staleness`` (``async``)."""
    model_changes: tuple = ()
    """(field, value) pairs of the ``ServiceModel`` this run changes (lockstep's own, its range and its fit)."""
    fitted: bool = False
    """Uses the one fitted figure (``LOCKSTEP_FIT``): shown apart, never a ratio's base."""


def run_config(spec: RunSpec, name: str, work: Path, paths: dict, args, seed: int) -> Path:
    mode, rollout_devices = spec.mode, spec.rollout_devices
    cfg = OmegaConf.load(ROOT / "examples/searchr1/config/tiny-cpu.yaml")
    del cfg["hydra"]
    out = work / name
    cfg.cluster.cpu_slots_per_node = args.devices + 2
    cfg.cluster.component_placement = placement(mode, args.devices, rollout_devices)
    cfg.runner.update(output_dir=str(out), max_steps=args.steps, save_interval=0, val_check_interval=0,
                      resume_dir=None, rollout_dump=0, pipeline="sync" if mode == "lockstep" else mode,
                      seq_length=4096)
    if mode == "async":
        cfg.runner.max_staleness = spec.max_staleness
    if mode == "lockstep":
        cfg.agent.protocol = "benchmarks.pipeline_lockstep:LockstepAgentLoop"
    cfg.runner.logger.logger_backends = ["jsonl"]
    cfg.rollout.rollout_backend = f"{_SIM}:build_engine"
    cfg.rollout.update_weights_bucket_megabytes = SIM_BUCKET_BYTES >> 20  # one small bucket per modelled one
    cfg.rollout.model.model_path = str(paths["model"])
    cfg.actor.training_backend = f"{_SIM}:SimulatedTrainer"
    cfg.data.update(train_data_paths=[str(paths["train"])], val_data_paths=[], rollout_batch_size=args.prompts,
                    max_prompt_length=512, seed=seed)
    # Search-R1's GRPO recipe: 5 samples, 2 mini-batches (ppo_mini_batch_size 256 of 512), 500 tokens a turn,
    # 500 of observation, top-3 passages. Old log-probs are recomputed by the actor (the reference pass folded
    # into that call: kl_beta 0 here); stream cannot recompute on the actor, so its update pays for both passes.
    cfg.algorithm.update(group_size=args.group_size, n_minibatches=args.minibatches,
                         recompute_logprobs=mode != "stream", kl_beta=0.0)
    cfg.algorithm.sampling_params.max_new_tokens = 500
    cfg.agentloop.update(max_turns=spec.max_turns, max_tool_response_length=500, max_passage_tokens=150)
    cfg.tools.search.update(backend=f"{_SIM}:build_search_backend", topk=3, num_workers=2)
    cfg.agentloop.num_workers = args.agent_loop_workers  # >= 1: engine servers behind the AgentLoop group's routers
    path = work / f"{name}.yaml"
    OmegaConf.save(cfg, path)
    return path


def run_mode(spec: RunSpec, name: str, work: Path, paths: dict, args, env: dict,
             seed: int) -> tuple[dict, list[dict]]:
    """The run's summary and its trace (every busy interval the simulated components logged)."""
    shutil.rmtree(work / name, ignore_errors=True)  # metrics.jsonl appends: a rerun starts clean
    config = run_config(spec, name, work, paths, args, seed)
    print(f"running {name} ({args.steps} steps)...", flush=True)
    with (work / f"{name}.log").open("w") as log:
        subprocess.run([sys.executable, "-c", _TRAIN, str(config)], check=True, cwd=ROOT, stdout=log,
                       stderr=subprocess.STDOUT, env=env)
    rows = [json.loads(line) for line in (work / name / "logs" / "metrics.jsonl").read_text().splitlines()]
    trace = read_trace(work / f"trace-{name}")
    return summarise(rows, trace, devices=args.devices), trace


def run_key(spec: RunSpec, model: ServiceModel, args, seed: int) -> dict:
    """Everything a run's figures depend on: a finished run with the same key is reused, not run again."""
    return {"spec": dataclasses.asdict(spec), "model": dataclasses.asdict(model), "seed": seed,
            **{k: getattr(args, k) for k in ("devices", "prompts", "group_size", "minibatches", "steps",
                                             "agent_loop_workers")}}


def finished_run(work: Path, name: str, key: dict) -> dict | None:
    """The summary of run ``name`` if it finished under ``key`` (so a sweep of several hours that stopped resumes
    at the first unfinished run, and seeds can be run in separate invocations into one ``--out``); else None."""
    path = work / f"{name}.summary.json"
    if not path.exists():
        return None
    saved = json.loads(path.read_text())
    return saved["summary"] if saved["key"] == json.loads(json.dumps(key)) else None


def read_trace(folder: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]


def busy_share(intervals: list[dict], start: float, end: float) -> float:
    """Mean share of [start, end] each process of ``intervals`` was busy (overlaps counted once)."""
    by_pid: dict[int, list[tuple[float, float]]] = {}
    for row in intervals:
        by_pid.setdefault(row["pid"], []).append((max(row["start"], start), min(row["end"], end)))
    shares = []
    for spans in by_pid.values():
        covered, reach = 0.0, start
        for lo, hi in sorted(spans):
            lo = max(lo, reach)
            if hi > lo:
                covered, reach = covered + hi - lo, hi
        shares.append(covered / (end - start))
    return sum(shares) / len(shares) if shares else 0.0


def summarise(rows: list[dict], trace: list[dict], *, devices: int) -> dict:
    """Steps after the first: their mean wall time, each group's idle share, the trajectory tail, the staleness
    of the trained tokens, and the steps' GPU work packed on ``devices`` (``ideal_step_s``)."""
    later = rows[1:]
    start, end = rows[0]["time"], rows[-1]["time"]
    out = {"step_s": (end - start) / len(later), "steps": len(later),
           "trajectory_p50_s": _mean(r["rollout/trajectory_s_p50"] for r in later),
           "trajectory_p99_s": _mean(r["rollout/trajectory_s_p99"] for r in later),
           "searches_per_trajectory": _mean(r["rollout/searches_per_trajectory"] for r in later),
           "response_tokens": _mean(r["rollout/response_length"] for r in later),
           "mean_lag": _mean(r.get("staleness/mean_lag", 0.0) for r in later),
           "ideal_step_s": gpu_work(trace, start, end) / devices / len(later),
           "window": [start, end]}
    for group in GROUPS:
        out[f"idle_{group}"] = 1.0 - busy_share([t for t in trace if t["group"] == group], start, end)
    return out


def gpu_work(trace: list[dict], start: float, end: float) -> float:
    """GPU-seconds of work in [start, end]: every actor pass as it ran (one GPU each), and the engines' decoding
    and prefill as if every step ran a full batch (``ideal_s``, shared out by each stretch's overlap with the
    window). Weight syncs and engine offloads are left out: the packed step would need them too, but not as work."""
    work = 0.0
    for row in trace:
        overlap = max(0.0, min(row["end"], end) - max(row["start"], start))
        if row["group"] == "actor":
            work += overlap
        elif row["group"] == "rollout" and row["what"] == "decode" and row["end"] > row["start"]:
            work += row["ideal_s"] * overlap / (row["end"] - row["start"])
    return work


def gpu_idle(mode: str, result: dict, devices: int, rollout_devices: int) -> float:
    """Share of the GPUs' time with nothing on them. ``lockstep`` and ``sync``: engine and actor share every GPU
    and take turns (the engine offloaded while the actor trains), so a GPU idles when neither works; otherwise
    each group's idle share weighted by its GPUs."""
    if mode not in SPLIT_MODES:
        return max(0.0, result["idle_rollout"] + result["idle_actor"] - 1.0)
    actor_devices = devices - rollout_devices
    return (rollout_devices * result["idle_rollout"] + actor_devices * result["idle_actor"]) / devices


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def service_model(overrides: list[str], parser: argparse.ArgumentParser) -> ServiceModel:
    """The default ``ServiceModel`` with each ``--set FIELD=VALUE`` applied (``time_scale=2``: twice as fast)."""
    fields = {f.name: f for f in dataclasses.fields(ServiceModel)}
    changes = {}
    for item in overrides:
        name, sep, value = item.partition("=")
        if not sep or name not in fields or name == "search_probability" and not value:
            parser.error(f"--set {item}: expected FIELD=VALUE with FIELD one of {', '.join(fields)}")
        default = getattr(ServiceModel, name) if name != "search_probability" else ()
        changes[name] = (tuple(float(v) for v in value.split(",")) if name == "search_probability"
                         else type(default)(value))
    return dataclasses.replace(ServiceModel(), **changes)


def runs(modes: list[str], splits: list[int], devices: int, *, max_turns: int, staleness: list[int],
         lockstep_turns: list[int], swept: tuple[str, ...] = SPLIT_MODES) -> list[RunSpec]:
    """Every configuration: a swept split mode once per split, another split mode at the first split only, the
    shared modes once; ``async`` once per ``staleness``; ``lockstep`` over its range (``lockstep_turns`` x stopped
    at the action tag or not) and once fitted (4 turns, stopped, ``LOCKSTEP_FIT``)."""
    out = []
    own = tuple(LOCKSTEP_MODEL.items())
    for mode in modes:
        if mode == "lockstep":
            for turns in lockstep_turns:
                out.append(RunSpec(mode, f"lockstep-t{turns}", devices, turns, model_changes=own))
                out.append(RunSpec(mode, f"lockstep-t{turns}-nostop", devices, turns,
                                   model_changes=own + tuple(LOCKSTEP_NO_STOP.items())))
            out.append(RunSpec(mode, "lockstep-fit", devices, 4, model_changes=own + tuple(LOCKSTEP_FIT.items()),
                               fitted=True))
            continue
        if mode not in SPLIT_MODES:
            out.append(RunSpec(mode, mode, devices, max_turns))
            continue
        for rollout_devices in (splits if mode in swept else splits[:1]):
            split = f"{rollout_devices}+{devices - rollout_devices}"
            if mode == "async":
                out += [RunSpec(mode, f"async-k{k}-{split}", rollout_devices, max_turns, max_staleness=k)
                        for k in staleness]
            else:
                out.append(RunSpec(mode, f"{mode}-{split}", rollout_devices, max_turns))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--rollout-devices", default="4",
                        help="engines' devices in overlap, stream and async; a comma list runs each (a sweep)")
    parser.add_argument("--sweep-modes", default="stream,async",
                        help="split modes run at every --rollout-devices value; the other split modes at its first")
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--group-size", type=int, default=5)
    parser.add_argument("--minibatches", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=4, help="agentloop.max_turns of every mode but lockstep")
    parser.add_argument("--lockstep-turns", default="2,4",
                        help="lockstep's range: its max_turns values, each with and without a stop at the action tag")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seeds", default="0", help="data.seed of each run: every configuration runs once per seed")
    parser.add_argument("--max-staleness", default="1", help="runner.max_staleness of the async runs (a comma list)")
    parser.add_argument("--agent-loop-workers", type=int, default=0,
                        help="agentloop.num_workers: 0 runs the agent loops inside the rollout ranks")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a ServiceModel field (benchmarks/pipeline_sim.py), e.g. max_running_requests=128")
    parser.add_argument("--out", default=None, help="folder for results.json and timeline.png")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    splits = [int(r) for r in args.rollout_devices.split(",") if r]
    swept = tuple(m for m in args.sweep_modes.split(",") if m)
    seeds = [int(x) for x in args.seeds.split(",") if x]
    unknown = [m for m in modes if m not in MODES] + [m for m in swept if m not in SPLIT_MODES]
    if unknown or not splits or not all(0 < r < args.devices for r in splits) or not seeds:
        parser.error(f"--modes from {', '.join(MODES)}, --sweep-modes from {', '.join(SPLIT_MODES)}; each of "
                     f"--rollout-devices between 1 and --devices - 1; at least one seed")
    model = service_model(args.set, parser)
    specs = runs(modes, splits, args.devices, max_turns=args.max_turns,
                 staleness=[int(k) for k in args.max_staleness.split(",") if k],
                 lockstep_turns=[int(t) for t in args.lockstep_turns.split(",") if t], swept=swept)
    work = Path(args.out or tempfile.mkdtemp(prefix="bench_pipeline_"))
    work.mkdir(parents=True, exist_ok=True)
    paths = prepare(work, args.prompts)
    results, traces = {}, {}
    for spec in specs:
        per_seed = []
        for seed in seeds:
            # One folder a seed, named by the seed (seed 0 keeps the plain name), so seeds run in separate
            # invocations into one --out never share a folder; the first seed's trace is the one drawn.
            name = spec.name if seed == 0 else f"{spec.name}-s{seed}"
            trace_dir = work / f"trace-{name}"
            run_model = dataclasses.replace(model, **dict(spec.model_changes))
            key = run_key(spec, run_model, args, seed)
            done = finished_run(work, name, key)
            if done is not None:
                print(f"{name}: finished earlier with the same settings, reused", flush=True)
                summary, trace = done, read_trace(trace_dir)
            else:
                trace_dir.mkdir(exist_ok=True)
                for old in trace_dir.glob("*.jsonl"):
                    old.unlink()
                settings = write_settings(work / "settings.json", Settings(model=run_model, trace_dir=str(trace_dir)))
                env = {**os.environ, SETTINGS_ENV: str(settings)}
                summary, trace = run_mode(spec, name, work, paths, args, env, seed)
                (work / f"{name}.summary.json").write_text(json.dumps({"key": key, "summary": summary}))
            per_seed.append(summary)
            if seed == seeds[0]:
                traces[spec.name] = trace
        result = mean_over_seeds(per_seed)
        result.update(mode=spec.mode, rollout_devices=spec.rollout_devices, max_turns=spec.max_turns,
                      max_staleness=spec.max_staleness, fitted=spec.fitted, model_changes=dict(spec.model_changes),
                      split=f"{spec.rollout_devices}+{args.devices - spec.rollout_devices}" if spec.mode in SPLIT_MODES
                      else f"{args.devices} shared",
                      idle_gpus=gpu_idle(spec.mode, result, args.devices, spec.rollout_devices))
        results[spec.name] = result
    if model.time_scale != 1:
        print("note: time_scale speeds the simulation up, but not the runtime's own CPU work: it then weighs more")
    print(f"\n{args.devices} devices, {args.prompts} prompts x {args.group_size}, up to {args.max_turns} tool turns "
          f"(lockstep: {args.lockstep_turns}), {args.minibatches} mini-batches, {args.agent_loop_workers} agent-loop "
          f"ranks, async max_staleness {args.max_staleness}, {args.steps} steps x seeds {args.seeds}, time scale "
          f"{model.time_scale:g} (the table is in simulated seconds); model changes: {args.set or 'none'}; "
          f"lockstep's own: {LOCKSTEP_MODEL}, without the stop: {LOCKSTEP_NO_STOP}, fitted: {LOCKSTEP_FIT}")
    timed = ("step_s", "step_s_sd", "ideal_step_s", "trajectory_p50_s", "trajectory_p99_s")
    scaled = {n: {**r, **{k: r[k] * model.time_scale for k in timed},
                  "seed_step_s": [x * model.time_scale for x in r["seed_step_s"]]} for n, r in results.items()}
    ideal = scaled["sync"]["ideal_step_s"] if "sync" in scaled else None
    print(table(scaled, ideal))
    best = {mode: min((r for r in scaled.values() if r["mode"] == mode), key=lambda r: r["step_s"])
            for mode in SPLIT_MODES if any(r["mode"] == mode for r in scaled.values())}
    best_names = {mode: next(n for n, r in scaled.items() if r is best[mode]) for mode in best}
    for mode, r in best.items():
        print(f"best {mode}: {best_names[mode]} at {r['step_s']:.1f} s")
    span = lockstep_range(scaled)
    if span:
        print(f"lockstep range: {span[0]:.1f} - {span[1]:.1f} s")
        for mode, r in best.items():
            print(f"best {mode}'s floor (its own GPU work packed on {args.devices} devices): {r['ideal_step_s']:.1f} s, "
                  f"{r['ideal_step_s'] / span[0]:.2f}x lockstep's low end")
    (work / "results.json").write_text(json.dumps({
        "args": vars(args), "lockstep_model": LOCKSTEP_MODEL, "lockstep_no_stop": LOCKSTEP_NO_STOP,
        "lockstep_fit": LOCKSTEP_FIT, "lockstep_range_s": span, "ideal_step_s": ideal, "results": scaled,
        "best": best_names}, indent=1))
    # The timeline shows the runs of the shared placement and each split mode's best configuration.
    shown = [n for n, r in scaled.items() if r["mode"] not in SPLIT_MODES or n in best_names.values()]
    plot_timeline({n: traces[n] for n in shown}, results, work / "timeline.png")
    print(f"results and timeline: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
