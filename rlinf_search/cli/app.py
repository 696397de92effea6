"""``rlinf-search``: one command for the whole recipe, each step a subcommand with ``--help``.

    rlinf-search check CONFIG [key=value ...] [--no-files]   every check that needs no worker, GPU or data
    rlinf-search train CONFIG [key=value ...]                 a training run (Ray starts inside it)
    rlinf-search schema [--eval] [--out FILE]                 the config's keys as a JSON Schema, for YAML editors
    rlinf-search eval --model RUN/checkpoints/global_step_N/hf_model --data test.jsonl --server-addr H:P --out DIR
    rlinf-search eval CONFIG [key=value ...]                  a checkpoint scored on a cluster (an eval recipe)
    rlinf-search prepare / index build / index serve / serve / plot / demo

CONFIG is a YAML file or the name of a recipe in ``examples/searchr1/config`` (``tiny-cpu``,
``qwen2.5-3b-tool-fsdp-1node``); overrides are Hydra's ``key=value``. The commands that wrap a module's own
parser (``prepare``, ``index``, ``serve``, ``plot``, ``eval --model``) pass every argument to it, ``--help``
included, so they take exactly the flags ``python -m <module>`` takes.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import typer

from rlinf_search.cli.check import KINDS, check
from rlinf_search.cli.configs import compose
from rlinf_search.config.schema import ConfigError

app = typer.Typer(name="rlinf-search", no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  help="Train language models to search with RL (the Search-R1 recipe): check, train, eval, "
                       "build and serve indexes, serve a model, plot a run, run the CPU demo.")
index_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Build and serve retrieval indexes.")
app.add_typer(index_app, name="index")

_PASS_ON = {"context_settings": {"allow_extra_args": True, "ignore_unknown_options": True},
            "add_help_option": False}
"""A command whose arguments, ``--help`` too, go to the wrapped module's own parser."""
_CONFIG = typer.Argument(..., help="a YAML file, or a recipe name of examples/searchr1/config (tiny-cpu, ...)")
_OVERRIDES = typer.Argument(None, help="Hydra overrides: key=value, +new.key=value, ~key")
REPO = Path(__file__).resolve().parents[2]


@app.command("check")
def check_command(config: str = _CONFIG, overrides: Optional[list[str]] = _OVERRIDES,
                  no_files: bool = typer.Option(False, "--no-files", help="do not open the data, model and tool "
                                                "files the config names (a cluster's paths on a laptop); list them"),
                  kind: str = typer.Option("auto", help=f"{', '.join(KINDS)}: validate as a training run or an eval "
                                           "(auto: an eval recipe is named *-eval or has no actor and no training "
                                           "data)")) -> None:
    """Check a config as its run would before starting any worker: keys, values, cross-key rules, placement on
    the cluster shape it declares, its files. Exit 0, or 1 with one line per problem."""
    if kind not in KINDS:
        raise typer.BadParameter(f"{kind!r}: choose one of {', '.join(KINDS)}", param_hint="--kind")
    report = check(config, overrides or [], files=not no_files, kind=kind)
    for problem in report.problems:
        print(problem, file=sys.stderr)
    if report.problems:
        raise typer.Exit(1)
    print(f"{config}: ok ({report.summary})")
    for skipped in report.skipped:
        print(f"  not checked (--no-files): {skipped}")


@app.command("schema")
def schema_command(eval_config: bool = typer.Option(False, "--eval", help="the keys of an eval recipe, not a training "
                                                    "run's"),
                   out: Optional[Path] = typer.Option(None, "--out", help="write it here (default: print it)")) -> None:
    """The config's keys as a JSON Schema, for a YAML editor's completion and checks (docs/config.md, "Editor
    support"). Every key, its type and range; the rules between keys are rlinf-search check's."""
    import json

    from rlinf_search.config.eval import EVAL_SCHEMA
    from rlinf_search.config.json_schema import config_json_schema
    from rlinf_search.config.schema import SCHEMA

    schema = config_json_schema(EVAL_SCHEMA if eval_config else SCHEMA,
                                title=f"rlinf-search {'eval' if eval_config else 'training'} config")
    text = json.dumps(schema, indent=1) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)
        print(f"wrote {out}")


@app.command("train")
def train_command(config: str = _CONFIG, overrides: Optional[list[str]] = _OVERRIDES,
                  log: bool = typer.Option(True, help="copy the terminal to runner.output_dir/driver.log")) -> None:
    """Train: validate the config (one line and exit 2 on a problem, before any worker starts), then run it. A
    run that stops exits 1; runner.resume_dir=auto continues it from its newest checkpoint."""
    from rlinf_search.cli.runs import train_from_cfg

    raise typer.Exit(train_from_cfg(_composed(config, overrides), log=log))


@app.command("eval", **_PASS_ON)
def eval_command(ctx: typer.Context) -> None:
    """Score a checkpoint. With --model (see --help): greedy rollouts on this machine against a retrieval server,
    with the retrieval and protocol settings of the run that trained it. With CONFIG [key=value ...]: an eval
    recipe on the cluster it declares (e.g. qwen2.5-3b-tool-1node-eval)."""
    args = list(ctx.args)
    if args and not args[0].startswith("-"):
        from rlinf_search.cli.runs import eval_from_cfg

        raise typer.Exit(eval_from_cfg(_composed(args[0], args[1:])))
    from rlinf_search.runners.eval_runner import main

    raise typer.Exit(main(args))


@app.command("ablate")
def ablate_command(
        study: Optional[str] = typer.Argument(None, help="a shipped study (--list) or a study YAML file"),
        overrides: Optional[list[str]] = typer.Argument(None, help="Hydra overrides every arm gets (key=value), "
                                                        "before the arm's own"),
        base: Path = typer.Option(Path("outputs/demo"), help="a finished scripts/demo.sh folder: its warm start "
                                  "(model/sft), data and index are every cell's"),
        out: Optional[Path] = typer.Option(None, help="the sweep's folder (default outputs/ablate/STUDY)"),
        seeds: str = typer.Option("0,1,2", help="data.seed of each cell's GRPO run, comma-separated"),
        steps: int = typer.Option(30, min=1, help="GRPO steps a cell trains"),
        eval_n: int = typer.Option(300, min=1, help="held-out test questions a cell is scored on (greedy)"),
        arms: str = typer.Option("", help="run only these arms (comma-separated; default all)"),
        config: str = typer.Option("tiny-cpu", help="the recipe the arms override"),
        report_only: bool = typer.Option(False, "--report-only", help="write the report from finished cells; run "
                                         "nothing"),
        list_studies: bool = typer.Option(False, "--list", help="list the shipped studies and their arms")) -> None:
    """Run an ablation: every arm x seed from one warm start (GRPO, then the held-out eval with the training's
    retrieval settings), as a Hydra multirun; finished cells are kept, so a second call runs only what is missing.
    Writes results.json, table.md and curves.png (mean and spread over seeds) in the sweep's folder."""
    from rlinf_search.ablation.cell import SweepSettings
    from rlinf_search.ablation.report import write_report
    from rlinf_search.ablation.run import ablate
    from rlinf_search.ablation.study import load_study, select_arms, study_names

    if list_studies:
        for name in study_names():
            found = load_study(name)
            print(f"{name}: {found.title} (arms: {', '.join(found.arms)})")
        return
    if study is None:
        print("ablate: give a study (rlinf-search ablate --list shows the shipped ones) or a study YAML file",
              file=sys.stderr)
        raise typer.Exit(2)
    try:
        found = load_study(study)
        chosen = select_arms(found, [a for a in arms.split(",") if a])
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ConfigError as exc:
        print(f"ablate: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    except ValueError:
        print(f"ablate: --seeds {seeds!r}: expected comma-separated integers", file=sys.stderr)
        raise typer.Exit(2) from None
    settings = SweepSettings(base=base.resolve(), config=config, steps=steps, eval_n=eval_n,
                             out=(out or Path("outputs/ablate") / found.name).resolve(),
                             overrides=tuple(overrides or ()))
    if report_only:
        _, text = write_report(found, settings, chosen, seed_list)
        print(text)
        return
    try:
        raise typer.Exit(ablate(found, chosen, seed_list, settings))
    except ConfigError as exc:
        print(f"ablate: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None


MODULE_COMMANDS = {
    "prepare": ("rlinf_search.data.prepare",
                "Turn question files (FlashRAG, HotpotQA, NQ, Search-R1 parquet, ...) into prompts (see --help)."),
    "index build": ("rlinf_search.retrieval.build_index",
                    "Build retrieval indexes over a corpus: bm25, dense encoders, hybrid (see --help)."),
    "index serve": ("rlinf_search.retrieval.server", "Serve built indexes over HTTP with the Search-R1 API (see --help; "
                    "--port 0 and --save-address-to FILE)."),
    "serve": ("rlinf_search.serve.__main__", "Serve a Hugging Face model with an OpenAI-compatible API: completions "
              "and chat, streaming (see --help)."),
    "plot": ("rlinf_search.plot", "Draw a run's curves (reward, EM, searches, KL, ... per step) to a PNG (see --help)."),
    "view": ("rlinf_search.viewer.__main__", "Serve a run's trajectories and curves to the browser on loopback: turns, "
             "passages, trained and masked tokens by policy version, filters, monitors' firings (see --help)."),
    "monitors": ("rlinf_search.monitors.__main__", "Replay the collapse monitors over a run: which fired, at which "
                 "step, since when (see --help)."),
}
"""The subcommands that hand every argument to a module's own ``main(argv)``: (module, help)."""


def _module_command(module: str, doc: str):
    def command(ctx: typer.Context) -> None:
        raise typer.Exit(importlib.import_module(module).main(list(ctx.args)))

    command.__doc__ = doc
    return command


for _name, (_module, _doc) in MODULE_COMMANDS.items():
    (index_app if _name.startswith("index ") else app).command(_name.split()[-1], **_PASS_ON)(
        _module_command(_module, _doc))


@app.command("demo", **_PASS_ON)
def demo_command(ctx: typer.Context) -> None:
    """Run the CPU demo (scripts/demo.sh of this checkout): a tiny model learns to search with GRPO. Its settings
    are environment variables (DEMO_SEED, DEMO_RL_STEPS, DEMO_PIPELINE, ...: --help lists them)."""
    script = REPO / "scripts" / "demo.sh"
    if not script.is_file():
        print(f"demo: {script} not found: the demo runs from a clone of the repository", file=sys.stderr)
        raise typer.Exit(2)
    if ctx.args and ctx.args[0] in ("-h", "--help"):
        print(_script_header(script))
        raise typer.Exit(0)
    if ctx.args:
        print(f"demo: takes no arguments (got {' '.join(ctx.args)}); set DEMO_* variables instead", file=sys.stderr)
        raise typer.Exit(2)
    raise typer.Exit(subprocess.run(["bash", str(script)], env=os.environ.copy()).returncode)


def _composed(config: str, overrides):
    try:
        return compose(config, list(overrides or []))
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None


def _script_header(script: Path) -> str:
    """The comment block at the top of a script, without the ``#``s: its usage."""
    lines = []
    for line in script.read_text().splitlines()[1:]:
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return "\n".join(lines)


def main() -> None:
    """The console script."""
    app()
