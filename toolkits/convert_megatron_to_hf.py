"""Convert a Megatron checkpoint of a Qwen2 model (tensor/pipeline-parallel shards) to a Hugging Face model.

    python toolkits/convert_megatron_to_hf.py --ckpt-path results/run/actor/checkpoints \\
        --hf-model-path /models/Qwen2.5-3B-Instruct --save-path results/run/hf_step100
    python toolkits/convert_megatron_to_hf.py --config examples/searchr1/config/qwen2.5-3b-tool-1node.yaml \\
        --ckpt-path results/run/actor/checkpoints/iter_0000100

``--ckpt-path`` is a Megatron-LM ``torch``-format checkpoint: a folder with
``latest_checkpointed_iteration.txt`` and ``iter_NNNNNNN/``, one ``iter_NNNNNNN/`` folder, or a folder
of ``mp_rank_TT[_PPP]/model_optim_rng.pt`` shards. The shards are merged (any tensor/pipeline sizes),
mapped to HF names, and written as ``model.safetensors`` with the ``config.json`` and tokenizer of
``--hf-model-path`` (the model the run started from), so the result loads with ``from_pretrained``.
With ``--config``, ``actor.megatron.ckpt_convertor`` of a run config supplies the HF model, the save
path and the expected tensor/pipeline sizes. The conversion itself needs only torch.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

from rlinf_search.workers.actor.megatron.config import CheckpointConverterConfig
from rlinf_search.workers.actor.megatron.hf_io import read_hf_config, write_hf_model
from rlinf_search.workers.actor.megatron.weights import (
    QwenLayout,
    StateDict,
    megatron_to_hf,
    merge_pipeline_stages,
    merge_tensor_parallel,
    shard_tensor_parallel,
    split_pipeline_stages,
)

LATEST = "latest_checkpointed_iteration.txt"
SHARD_FILE = "model_optim_rng.pt"
_SHARD_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?$")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class ConversionError(ValueError):
    """A checkpoint or argument the converter cannot use; the message is one line."""


def find_iteration_dir(ckpt_path: Path, iteration: int | None = None) -> Path:
    """The folder holding the ``mp_rank_*`` shards of ``iteration`` (default: the latest)."""
    if not ckpt_path.is_dir():
        raise ConversionError(f"checkpoint folder not found: {ckpt_path}")
    if any(_SHARD_DIR.match(p.name) for p in ckpt_path.iterdir()):
        return ckpt_path
    if iteration is None:
        if not (ckpt_path / LATEST).is_file():
            raise ConversionError(f"{ckpt_path} has no mp_rank_* shards and no {LATEST}; point --ckpt-path at a "
                                  "Megatron checkpoint or give --iteration")
        latest = (ckpt_path / LATEST).read_text().strip()
        if not latest.isdigit():
            raise ConversionError(f"{ckpt_path / LATEST} says {latest!r}, not an iteration number")
        iteration = int(latest)
    folder = ckpt_path / f"iter_{iteration:07d}"
    if not folder.is_dir():
        raise ConversionError(f"iteration {iteration} not found: no {folder}")
    return folder


def find_shards(folder: Path) -> dict[tuple[int, int], Path]:
    """``(tensor rank, pipeline rank) -> shard file``, checked to form a full grid."""
    if any(folder.glob("*.distcp")) or (folder / "common.pt").is_file():
        raise ConversionError(f"{folder} is a torch_dist (distributed) checkpoint; save with ckpt_format: torch, "
                              "or convert it to torch format with Megatron-LM's checkpoint tools first")
    shards: dict[tuple[int, int], Path] = {}
    for sub in folder.iterdir():
        match = _SHARD_DIR.match(sub.name)
        if match:
            shards[(int(match.group(1)), int(match.group(2) or 0))] = sub / SHARD_FILE
    if not shards:
        raise ConversionError(f"no mp_rank_*/{SHARD_FILE} shards in {folder}")
    tp = 1 + max(t for t, _ in shards)
    pp = 1 + max(p for _, p in shards)
    missing = [(t, p) for t in range(tp) for p in range(pp) if not shards.get((t, p), folder / "-").is_file()]
    if missing:
        raise ConversionError(f"{folder} lacks shard(s) {missing[:3]} of a {tp} x {pp} (tensor x pipeline) grid")
    return shards


def _load_model_state(path: Path) -> StateDict:
    # Megatron checkpoints pickle their argparse args and RNG states next to the weights, so they do not
    # load with weights_only=True: convert only checkpoints you trust.
    blob = torch.load(path, map_location="cpu", weights_only=False)
    if "model" not in blob:
        keys = sorted(k for k in blob if str(k).startswith("model"))
        hint = " (virtual pipeline stages are not supported)" if keys else ""
        raise ConversionError(f"{path} has no 'model' entry{hint}; found {sorted(blob)[:5]}")
    return blob["model"]


def load_megatron_checkpoint(folder: Path) -> tuple[StateDict, int, int]:
    """The merged whole-model state dict of the shards in ``folder``, and its (tensor, pipeline) sizes."""
    shards = find_shards(folder)
    tp = 1 + max(t for t, _ in shards)
    pp = 1 + max(p for _, p in shards)
    stages = [merge_tensor_parallel([_load_model_state(shards[(t, p)]) for t in range(tp)]) for p in range(pp)]
    return merge_pipeline_stages(stages), tp, pp


def write_megatron_checkpoint(whole: StateDict, ckpt_path: Path, *, tensor_parallel: int = 1,
                              pipeline_parallel: int = 1, num_layers: int, iteration: int = 1) -> Path:
    """Write a whole-model state dict as Megatron-LM ``torch``-format shards (the layout read above)."""
    folder = ckpt_path / f"iter_{iteration:07d}"
    for p, stage in enumerate(split_pipeline_stages(whole, pipeline_parallel, num_layers)):
        for t, shard in enumerate(shard_tensor_parallel(stage, tensor_parallel)):
            name = f"mp_rank_{t:02d}" if pipeline_parallel == 1 else f"mp_rank_{t:02d}_{p:03d}"
            (folder / name).mkdir(parents=True, exist_ok=True)
            torch.save({"model": shard, "iteration": iteration, "checkpoint_version": 3.0}, folder / name / SHARD_FILE)
    (ckpt_path / LATEST).write_text(str(iteration))
    return folder


def convert(ckpt_path: Path, converter: CheckpointConverterConfig, save_path: Path, *, iteration: int | None = None,
            dtype: str | None = None, check_sizes: bool = False) -> Path:
    """Convert; with ``check_sizes`` the checkpoint's grid must match the converter config's sizes."""
    config = read_hf_config(converter.hf_model_path)
    layout = QwenLayout.from_hf_config(config)
    whole, tp, pp = load_megatron_checkpoint(find_iteration_dir(ckpt_path, iteration))
    expected = (converter.tensor_model_parallel_size, converter.pipeline_model_parallel_size)
    if check_sizes and (tp, pp) != expected:
        raise ConversionError(f"the checkpoint holds {tp} x {pp} (tensor x pipeline) shards but "
                              f"actor.megatron.ckpt_convertor says {expected[0]} x {expected[1]}")
    try:
        hf = megatron_to_hf(whole, layout)
    except KeyError as exc:
        raise ConversionError(f"the checkpoint lacks {exc.args[0]}: is it a Qwen2 GPTModel with "
                              f"{layout.num_layers} layers, like {converter.hf_model_path}?") from None
    except RuntimeError as exc:  # a reshape that does not fit: another model size
        raise ConversionError(f"the checkpoint's tensors do not fit {converter.hf_model_path}/config.json: "
                              f"{str(exc).splitlines()[0]}") from None
    rows = hf["model.embed_tokens.weight"].shape
    if rows != (layout.vocab_size, layout.hidden_size):
        raise ConversionError(f"embedding is {tuple(rows)}, but {converter.hf_model_path} expects "
                              f"({layout.vocab_size}, {layout.hidden_size})")
    if dtype is not None:
        hf = {name: tensor.to(DTYPES[dtype]) for name, tensor in hf.items()}
        for key in ("torch_dtype", "dtype"):  # transformers 4 and 5 spell it differently
            if key in config:
                config[key] = str(DTYPES[dtype]).removeprefix("torch.")
    return write_hf_model(hf, config, save_path, source_dir=converter.hf_model_path)


def converter_from_run_config(path: Path) -> CheckpointConverterConfig:
    """``actor.megatron.ckpt_convertor`` of a run config (default HF model: ``rollout.model.model_path``)."""
    from omegaconf import OmegaConf

    from rlinf_search.config import register_resolvers
    from rlinf_search.config.model_update import ActorSection
    from rlinf_search.config.training import megatron_config
    from rlinf_search.recipe_loader import compose_recipe
    from rlinf_search.section_model import parse_section

    register_resolvers()
    if not path.is_file():
        raise ConversionError(f"config not found: {path}")
    # A recipe's shared groups (its defaults list) hold keys its converter settings interpolate.
    raw = OmegaConf.to_container(compose_recipe(path), resolve=True)
    actor = raw.get("actor") or {}
    if actor.get("training_backend") != "megatron":
        raise ConversionError(f"{path}: actor.training_backend is not megatron, so it has no converter settings")
    default = ((raw.get("rollout") or {}).get("model") or {}).get("model_path", "")
    # The run's own start-up checks of the actor section, so a bad key fails here as it would there.
    try:
        section = parse_section(ActorSection, actor, path="actor")
        return megatron_config(section, default_hf_model_path=default).converter
    except ValueError as exc:
        raise ConversionError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt-path", required=True, help="Megatron checkpoint folder (root, iter_N, or shards)")
    parser.add_argument("--hf-model-path", help="HF model the run started from (config.json + tokenizer)")
    parser.add_argument("--save-path", help="output HF model folder")
    parser.add_argument("--config", help="run config whose actor.megatron.ckpt_convertor fills the other options")
    parser.add_argument("--iteration", type=int, help="iteration to convert (default: the latest)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="cast the weights (default: as saved)")
    args = parser.parse_args(argv)
    try:
        converter = converter_from_run_config(Path(args.config)) if args.config else None
        hf_model_path = args.hf_model_path or (converter.hf_model_path if converter else None)
        save_path = args.save_path or (converter.save_path if converter else None)
        if not hf_model_path or not save_path:
            raise ConversionError("give --hf-model-path and --save-path (or a --config that sets them)")
        settings = CheckpointConverterConfig(
            hf_model_path=hf_model_path, save_path=save_path,
            tensor_model_parallel_size=converter.tensor_model_parallel_size if converter else 1,
            pipeline_model_parallel_size=converter.pipeline_model_parallel_size if converter else 1)
        out = convert(Path(args.ckpt_path), settings, Path(save_path), iteration=args.iteration, dtype=args.dtype,
                      check_sizes=converter is not None)
    except (ConversionError, FileNotFoundError, ValueError) as exc:
        print(f"convert_megatron_to_hf: {exc}", file=sys.stderr)
        return 1
    print(f"wrote a Hugging Face model to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
